"""``python -m study.params model=NAME [--json]``: parameters and FLOPs of every registered variant.

Prints, for each conf/variant/*.yaml at the chosen model size: total and
non-embedding parameters (token and position embeddings excluded), the change
of non-embedding parameters against the baseline, and training FLOPs per token
(forward + backward, attention included: 6 N + 12 n_layer n_embd block_size,
PaLM arXiv 2204.02311 App. B; see ``study.modeling.accounting.flops_per_token``).  Nothing is
allocated: the models are built on the meta device.  With ``--json``:
{VARIANT: {"non_embedding_params", "total_params", "flops_per_token"}}.
"""
from __future__ import annotations

import json
import sys

from study.config import ConfigError, available, load_config, project_root, run_stage
from study.modeling.accounting import describe
from study.tasks import configured_rows


def table(overrides: list[str]) -> dict[str, dict[str, int]]:
    """{variant: describe(...)} for every variant file, at the model chosen by ``overrides``."""
    root = project_root()
    out = {}
    load_config(list(overrides), root)  # the overrides themselves (a model that does not exist, ...)
    for name in available(root, "variant"):
        try:
            cfg = load_config([*overrides, f"variant={name}"], root)
        except ConfigError as e:  # an override every variant takes may break one of them: name it
            raise ConfigError(f"conf/variant/{name}.yaml{' with ' + ' '.join(overrides) if overrides else ''}: "
                              f"{e}") from None
        out[name] = describe(cfg.model, cfg.variant, configured_rows(cfg))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") or a.startswith("--cfg") for a in argv):  # the stage runner's --help / --cfg job
        return run_stage(lambda cfg, root: 0, [a for a in argv if a != "--json"], own=("--json",))
    as_json = "--json" in argv
    try:
        rows = table([a for a in argv if a != "--json"])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    base = rows.get("baseline", next(iter(rows.values())))["non_embedding_params"]
    print(f"{'variant':<20s} {'non-embedding':>14s} {'vs baseline':>12s} {'total':>14s} {'FLOPs/token':>14s}")
    for name, r in rows.items():
        print(f"{name:<20s} {r['non_embedding_params']:>14,d} {100 * (r['non_embedding_params'] / base - 1):>+11.2f}% "
              f"{r['total_params']:>14,d} {r['flops_per_token']:>14,d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
