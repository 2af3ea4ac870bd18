"""Tuning by one rule, ``make tune``: every arm of ``tune.arms`` on the same x2 lr grid, on the tuning seeds.

    python -m study.tune --arm NAME [--params params.yaml] [overrides]   tune one arm (DVC stage tune@NAME)
    python -m study.tune --arm NAME --dry-run [...]                      print its first array (runs, GPU-hours); train nothing
    python -m study.tune --write [--params params.yaml] [overrides]      the table, figure and conf/tuned.yaml
    python -m study.tune --targets [--params params.yaml]                the DVC stages of tune.arms, one a line
    python -m study.tune --ladder MODEL [--params params.yaml]            the scale ladder's lr transfer, checked

``--arm NAME`` trains (or reuses: a finished run of the same settings, code and data is never retrained)
each (lr, tuning seed) of the arm's grid in ``tune.runs_dir/NAME/lrLR/VARIANT-sSEED`` (study.train: in this
process, or ``study.jobs`` processes at once), extends the grid by x2 at the edge holding the best mean until
the optimum is bracketed or
``tune.max_points`` is reached (study/tuning/rule.py has the rule), and writes
``tune.runs_dir/NAME/tuning.json``: every point's per-seed losses (nats; null = diverged), its mean (null =
lost), the grid's status, the quadratic (A, B, C, vertex, cost of a x2 miss) and lr* with its source.

``--write`` gathers the arms' tuning.json into ``tune.table_dir`` (table.json, table.md, tuning.png: loss
against lr per arm, the fitted parabola, lr* marked) and writes each arm's lr* to conf/tuned.yaml, which the
study's composition reads (``tuned.lr``); both are tracked, so a fresh ``make study`` does not tune again.
``--ladder MODEL`` checks the scale ladder's transfer rule (each variant at the lr* of its arm in conf/tuned.yaml,
tuned at the default size, unchanged at every size): it tunes every arm of ``scale_ladder.variants`` by the same
rule at size MODEL on the ladder's budget (tokens_per_param, warmup_tokens), runs in
``tune.runs_dir/ladder/MODEL``, and writes the table, figure and ``transfer.md``/``transfer.json`` (the transferred
lr against that size's lr*, their ratio, the quadratic's predicted cost of the miss in nats and the measured loss at
the grid point nearest the transferred lr) under ``tune.table_dir/MODEL``, and each variant's lr* at that size to
conf/tuned.yaml (``tuned.size.MODEL``: what the ladder trains at with ``scale_ladder.lr_per_size``; the default
size's ``tuned.lr`` and ``tuned.recipe`` are left as they are).
Every output is byte-stable (no times, no ids).
"""
from __future__ import annotations

import sys
from pathlib import Path

from study.config import ConfigError, run_stage
from study.config.stage import StageParser, stage_args
from study.tuning.ladder import tune_ladder
from study.tuning.search import tune_one
from study.tuning.table import TUNED_FILE, write_table


def targets(cfg) -> list[str]:
    """The DVC stages of tune.arms: ``tune@ARM``."""
    return [f"tune@{a}" for a in cfg.tune.arms]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    parser = StageParser("python -m study.tune")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--arm", metavar="NAME")
    modes.add_argument("--ladder", metavar="MODEL")
    modes.add_argument("--write", action="store_true")
    modes.add_argument("--targets", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    needs = {"--arm": "--arm needs an arm name, e.g. --arm baseline",
             "--ladder": "--ladder needs a model size of conf/model, e.g. --ladder ladder-128"}
    try:
        for i, a in enumerate(argv):  # `--arm --dry-run`: the name is missing, not an arm called --dry-run
            if a in needs and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
                parser.error(needs[a])
        args, rest = parser.parse_known_args(argv)
        mode = next((m for m in ("arm", "ladder", "write", "targets") if getattr(args, m) not in (None, False)), None)
        if mode is None:
            parser.error("name what to do: --arm NAME, --write, --targets or --ladder MODEL")
        if args.dry_run and mode != "arm":
            parser.error("--dry-run goes with --arm NAME (the arrays that arm's tuning would submit)")
        arm = args.arm or args.ladder
        if not arm and mode in ("arm", "ladder"):
            parser.error(needs[f"--{mode}"])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    params, base = stage_args(rest)
    dry = args.dry_run

    def body(cfg, root: Path) -> int:
        if mode == "arm":
            tune_one(cfg, root, arm, params, base, dry=dry)
        elif mode == "ladder":
            tune_ladder(cfg, root, arm, params, base)
        elif mode == "write":
            if not cfg.tune.arms:  # an empty table would erase the tracked lr* of every arm tuned before
                print(f"tune.arms is empty: {TUNED_FILE} and {cfg.tune.table_dir} left as they are")
                return 0
            write_table(cfg, root)
        else:
            print("\n".join(targets(cfg)))
        return 0
    return run_stage(body, rest, interruptible="study.tune",  # Ctrl-C: each training stopped, marked KILLED
                     own=("--arm NAME", "--write", "--targets", "--ladder MODEL", "--dry-run"))


if __name__ == "__main__":
    sys.exit(main())
