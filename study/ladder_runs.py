"""The scale ladder's stage, ``python -m study.ladder_runs --params params.yaml [--dry-run]`` (DVC stage
``scale_ladder``): every variant of ``scale_ladder.variants`` at every size of ``scale_ladder.models`` on the
study's seeds, each run a compute-matched budget at the lr* tuned at its size (study.config.naming.ladder_overrides,
study.runner.spec), in ``runs/scale_ladder/MODEL/VARIANT-sSEED``.

The runs go out as the test stage's do (study.orchestration.ensure.ensure_runs): every finished run of the same
settings, code and data is reused, the missing ones train ``study.jobs`` at once here or as one SLURM job array.
Writes ``runs/scale_ladder/plan.json`` (byte-stable: the sizes, variants and seeds), also while the ladder is off
(``scale_ladder.models: []``); ``compare`` reads the runs and reports the ladder.  Fails (one line) when
params.yaml changed while it ran (study.orchestration.driver).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from study.config import ConfigError
from study.config.naming import LADDER_GROUP, ladder_overrides
from study.orchestration.ensure import dry_run, ensure_runs
from study.orchestration.driver import driver_main

PLAN = "plan.json"

#: the keys the ladder sets for each run (study.config.naming.ladder_overrides) -> where a user sets them instead
LADDER_SETS = {"model": "scale_ladder.models", "variant": "scale_ladder.variants", "seed": "study.seeds",
               "study.group": "study.runs_dir", "train.tokens": "scale_ladder.tokens_per_param",
               "train.tokens_per_param": "scale_ladder.tokens_per_param",
               "train.warmup_tokens": "scale_ladder.warmup_tokens",
               "train.lr_from_tuned": "scale_ladder.lr_from_tuned", "train.lr_per_size": "scale_ladder.lr_per_size"}


def check_base(base) -> None:
    """Refuse a stage override of what the ladder sets for each run (it would be overridden, silently).

    Raises:
        ConfigError: one line naming the override and the ladder's key to set instead.
    """
    for o in base:
        key = str(o).split("=", 1)[0].lstrip("+~")
        if key in LADDER_SETS:
            raise ConfigError(f"{o}: the scale ladder sets {key} for each of its runs, so this override would be "
                              f"ignored: set {LADDER_SETS[key]} instead")


def check_specs(runs: list[list[str]], root: Path, params: str | None, per: int) -> None:
    """Resolve the specification of the first run of every ``per`` runs (one size and variant: the seeds differ only
    by their seed) before any trains, so that a size the budget rule or the lr transfer refuses stops the stage
    before the sizes before it train.

    Raises:
        ConfigError: as study.runner.spec.run_spec (one line).
    """
    from study.config import load_config
    from study.runner.spec import run_spec

    for o in runs[::max(1, per)]:
        run_spec(load_config(o, root, params=params), root)


def ladder_runs(cfg) -> list[list[str]]:
    """The ``study.train`` overrides of every run of the ladder: size, then variant, then seed."""
    lad = cfg.scale_ladder
    return [[*ladder_overrides(cfg, m), f"variant={v}", f"seed={s}"]
            for m in lad.models for v in lad.variants for s in cfg.study.seeds]


def run_ladder(cfg, root: Path, params: str | None, base: list[str] = (), dry: bool = False) -> list[Path]:
    """Train (or reuse) every run of the ladder and write its plan.  ``base``: the stage's own overrides, given to
    every run before the run's own.  ``dry``: print the batch (runs, resources, hours) and train nothing.

    Returns: the run folders, in the order of :func:`ladder_runs` ([] when dry or off).

    Raises:
        ConfigError: a stage override of what the ladder sets, or a run's specification refused (one line, before
            any run trains).
        StudyError: a training did not finish (one line naming each, study.orchestration.ensure.ensure_runs).
    """
    lad = cfg.scale_ladder
    check_base(base)
    runs = [[*base, *o] for o in ladder_runs(cfg)]
    if dry:
        if runs:
            dry_run(runs, root, params, LADDER_GROUP, cfg.study.jobs)
        else:
            print("scale_ladder.models is empty: no ladder, nothing to train")
        return []
    check_specs(runs, root, params, len(cfg.study.seeds))
    folder = root / cfg.study.runs_dir / LADDER_GROUP
    folder.mkdir(parents=True, exist_ok=True)
    if not runs:
        print("scale_ladder.models is empty: no ladder (docs/profiles.md)")
    done = ensure_runs(runs, root, params, cfg.study.jobs, label=LADDER_GROUP)
    if done:
        reused = sum(r for _, r in done)
        print(f"{LADDER_GROUP}: {len(done)} run(s), {len(done) - reused} trained, {reused} reused", flush=True)
    plan = {"models": list(lad.models), "variants": list(lad.variants), "seeds": list(cfg.study.seeds)}
    (folder / PLAN).write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
    return [d for d, _ in done]


def main(argv: list[str] | None = None) -> int:
    return driver_main(argv, run_ladder, "scale ladder", "scale_ladder", "study.ladder_runs")


if __name__ == "__main__":
    sys.exit(main())
