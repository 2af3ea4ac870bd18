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

from study.config.naming import LADDER_GROUP, ladder_overrides
from study.orchestration.ensure import dry_run, ensure_runs
from study.orchestration.driver import driver_main

PLAN = "plan.json"


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
        StudyError: a training did not finish (one line naming each, study.orchestration.ensure.ensure_runs).
    """
    lad = cfg.scale_ladder
    runs = [[*base, *o] for o in ladder_runs(cfg)]
    if dry:
        if runs:
            dry_run(runs, root, params, LADDER_GROUP, cfg.study.jobs)
        else:
            print("scale_ladder.models is empty: no ladder, nothing to train")
        return []
    folder = root / cfg.study.runs_dir / LADDER_GROUP
    folder.mkdir(parents=True, exist_ok=True)
    if not runs:
        print("scale_ladder.models is empty: no ladder (docs/profiles.md)")
    done = ensure_runs(runs, root, params, cfg.study.jobs, label=LADDER_GROUP)
    plan = {"models": list(lad.models), "variants": list(lad.variants), "seeds": list(cfg.study.seeds)}
    (folder / PLAN).write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
    return [d for d, _ in done]


def main(argv: list[str] | None = None) -> int:
    return driver_main(argv, run_ladder, "scale ladder", "scale_ladder", "study.ladder_runs")


if __name__ == "__main__":
    sys.exit(main())
