"""Stage ``python -m study.levers [--params params.yaml] [overrides]``: the measured table of choices for the default.

For each row of conf/levers.yaml (a name and the overrides of one lever: tokenizer, context length, width,
depth, tokens per run or per step; the command line's overrides go to every row, before its own), the token data are prepared once into ``data/levers/DATA`` (DATA named
by the tokenizer, its vocabulary and block_size), then :data:`VARIANTS` (the baseline and the no-context
yardstick, whose attention sees its own position only) train on one seed at one lr into
``runs/levers/ROW/VARIANT-sSEED`` (``study.jobs`` at once; finished runs are reused).  The table, printed and
written to ``reports/levers.md``, gives per row: tokens/s and minutes per run (wall time), the baseline's
val_loss (nats), the unigram and bigram yardsticks of the row's data, the no-context arm's loss, attention's
share (no-context minus baseline, nats) against the equivalence margin in nats (study.equivalence_margin %
of the baseline's loss), and the baseline's in-context gain (loss at positions 1-4 minus the last quarter).

One seed and one lr per row: a screen to choose a default by, not a verdict (the chosen default is then
tuned by one rule and tested on Stein's seeds).  Timings depend on the CPU and on what else runs: name both.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from study.analysis.runs import RunsError, read_run
from study.config import ConfigError, load_config, run_dir, run_stage
from study.config.stage import stage_args
from study.data import DataError
from study.data.records import check_prepared, prepared_keys
from study.orchestration.ensure import ensure_runs

#: the rows' file, beside the study's config
LEVERS = "conf/levers.yaml"
GROUP = "levers"
#: what each row trains: the baseline and the no-context yardstick, whose difference is attention's share
VARIANTS = ("baseline", "no_context")


def read_levers(root: Path) -> dict:
    """conf/levers.yaml, checked: ``seed`` (int), ``lr`` (> 0), ``rows`` {name: [overrides]}.

    Raises:
        ConfigError: the file is missing or a key is malformed (one line, the fix)."""
    path = root / LEVERS
    try:
        spec = OmegaConf.to_container(OmegaConf.load(path))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} cannot be read ({e}): restore it (`git checkout {LEVERS}`)") from None
    rows = spec.get("rows") if isinstance(spec, dict) else None
    if not isinstance(rows, dict) or not rows or not all(isinstance(v, list) for v in rows.values()):
        raise ConfigError(f"{path}: rows must map each row's name to a list of overrides (key=value), e.g. "
                          f"bytes-T256: [model.block_size=256]")
    if not isinstance(spec.get("seed"), int) or not isinstance(spec.get("lr"), (int, float)) or not spec["lr"] > 0:
        raise ConfigError(f"{path}: seed must be an integer and lr a number > 0 (got seed={spec.get('seed')!r}, "
                          f"lr={spec.get('lr')!r})")
    return spec


def data_dir_of(cfg) -> str:
    """``data/levers/DATA`` for a row's config: the tokenizer, its vocabulary, block_size and a digest of every
    setting the prepared data depend on (data.*, the validation windows), so rows of equal data share one."""
    key = json.dumps({**prepared_keys(cfg.data), "block_size": cfg.model.block_size,
                      "val_tokens": cfg.train.val_tokens}, sort_keys=True, default=str)
    vocab = cfg.data.vocab_size if cfg.data.tokenizer == "bpe" else ""
    return f"data/{GROUP}/{cfg.data.tokenizer}{vocab}-T{cfg.model.block_size}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def _prepare(overrides: list[str], root: Path, params: str | None) -> None:
    """Prepare a row's data unless its folder already holds data prepared with these settings."""
    from study.data.build import build
    from study.runner.signals import terminate_as_exception

    cfg = load_config(overrides, root, params=params)
    try:
        check_prepared(root / cfg.data.dir, cfg)
        return
    except DataError:
        pass
    print(f"levers: preparing {cfg.data.dir}", flush=True)
    with terminate_as_exception():  # SIGTERM: the build's temporary folder is removed
        build(cfg, root)


def _row(cfg, root: Path, spec: dict, name: str) -> dict:
    """One row of the table from its run folders and its data's yardsticks."""
    seed = spec["seed"]
    out = {"row": name}
    for v in VARIANTS:
        d = run_dir(root, cfg, v, seed, f"{GROUP}/{name}")
        out[v] = read_run(d, root)
    y = json.loads((root / cfg.data.dir / "meta.json").read_text()).get("yardsticks") or {}
    out["unigram"] = (y.get("unigram") or {}).get("all")
    out["bigram"] = (y.get("bigram") or {}).get("all")
    return out


def table(rows: list[dict], margin_pct: float) -> list[str]:
    """The markdown table of :func:`_row` results (the :data:`VARIANTS` of each row)."""
    def f(x, spec=".4f"):
        return "n/a" if x is None else format(x, spec)

    lines = ["| row | tokens/s | min per run | val_loss | unigram | bigram | no-context | attention's share | "
             "share / margin | in-context gain |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, n = r.get("baseline"), r.get("no_context")
        loss = b["val_loss"] if b else None
        share = n["val_loss"] - loss if n and loss is not None and n["val_loss"] is not None else None
        ratio = share / (margin_pct / 100 * loss) if share is not None else None
        lines.append(f"| {r['row']} | {f(b and b['tokens_per_s'], ',.0f')} | {f(b and b['wall_time_s'] / 60, '.1f')} | "
                     f"{f(loss)} | {f(r['unigram'])} | {f(r['bigram'])} | {f(n and n['val_loss'])} | "
                     f"{f(share, '+.4f')} | {f(ratio, '.1f')} | {f(b and b['in_context_gain'])} |")
    return lines


def plan_rows(spec: dict, root: Path, params: str | None, base: list[str] = ()) -> list[tuple[str, list[str], list]]:
    """Each row of ``spec`` (:func:`read_levers`) as (name, its data overrides, the override lists of its
    :data:`VARIANTS`' runs): the stage's own overrides ``base`` first, then the row's, then the row's data folder.

    Raises:
        ConfigError: an override of the command line sets a key that a row sets too (the row would silently win)."""
    keys = {str(o).split("=", 1)[0].lstrip("+~") for o in base}
    out = []
    for name, over in spec["rows"].items():
        clash = sorted(keys & {str(o).split("=", 1)[0].lstrip("+~") for o in over})
        if clash:
            raise ConfigError(f"{', '.join(clash)} is set by row {name} of {LEVERS} and on the command line: drop it "
                              f"from the command line (or edit the row)")
        row_cfg = load_config([*base, *map(str, over)], root, params=params)
        data = [*base, *map(str, over), f"data.dir={data_dir_of(row_cfg)}"]
        runs = [[*data, f"variant={v}", f"seed={spec['seed']}", f"arm.lr={float(spec['lr'])!r}",
                 f"study.group={GROUP}/{name}", "trainer.progress_bar=false"] for v in VARIANTS]
        out.append((name, data, runs))
    return out


def _levers(cfg, root: Path, params: str | None, base: list[str] = ()) -> int:
    spec = read_levers(root)
    planned = plan_rows(spec, root, params, list(base))
    for _, data, _ in planned:
        _prepare(data, root, params)
    runs = [r for _, _, rr in planned for r in rr]
    rows = [(name, data) for name, data, _ in planned]
    ensure_runs(runs, root, params, jobs=cfg.study.jobs)
    try:
        results = [_row(load_config(data, root, params=params), root, spec, name) for name, data in rows]
    except RunsError as e:
        raise RunsError(f"levers: {e}") from None
    lines = [f"# The table of choices (conf/levers.yaml: seed {spec['seed']}, lr {spec['lr']:g})", "",
             f"Margin: +-{cfg.study.equivalence_margin:g}% of the baseline's val_loss.", "",
             *table(results, cfg.study.equivalence_margin)]
    out = root / cfg.study.reports_dir / "levers.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:]))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # --params FILE (DVC's params.yaml): every row's config starts from it, as the stage's does; the stage's own
    # overrides reach every row (and every run of it), before the row's own
    params, base = stage_args(argv)
    return run_stage(lambda cfg, root: _levers(cfg, root, params, base), argv)


if __name__ == "__main__":
    sys.exit(main())
