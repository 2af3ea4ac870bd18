"""The runs of arms at given lrs and seeds, and the check that conf/tuned.yaml agrees with the tuning table: what the
tuning stage (study.tune) and the test stage (study.test_runs) both need.  :func:`arm_losses` sends every missing run
of a batch out on the launcher (:func:`study.orchestration.ensure.ensure_runs`) and reads each run's final loss through
the run folder's reader (study.runfolder.read_result)."""
from __future__ import annotations

import math
from pathlib import Path

from study.orchestration.ensure import dry_run, ensure_runs
from study.runfolder import read_result
from study.runner.arms import run_overrides

def finite_or_none(x):
    """``x`` when it is a finite number (a loss), else None (a diverged or missing one: JSON null)."""
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def seed_losses(cfg, root: Path, name: str, lr: float, seeds, group: str, params: str | None, base=(),
                runs_dir: str | None = None, extra=(), label: str = "") -> dict[int, float | None]:
    """Train (or reuse, :func:`study.orchestration.ensure.ensure_runs`) arm ``name`` at peak ``lr`` on each of ``seeds``
    in run group ``group``, ``study.jobs`` at once; the tuning and the test stage both use it.

    Returns: {seed: final validation loss (nats), None for a diverged run (a lost point)}; prints one line per
    seed, ``label`` first.
    """
    got = arm_losses(cfg, root, [(name, lr, group, label)], seeds_of={name: list(seeds)}, params=params, base=base,
                     runs_dir=runs_dir, extra=extra)
    return got[name]


def arm_losses(cfg, root: Path, arms: list[tuple[str, float, str, str]], seeds_of: dict[str, list[int]],
               params: str | None, base=(), runs_dir: str | None = None, extra=(), stage: str = "",
               dry: bool = False) -> dict[str, dict[int, float | None]]:
    """:func:`seed_losses` for several arms at once: ``arms`` = [(name, lr, group, label)], each on
    ``seeds_of[name]``; every missing run of all of them goes out in one batch on the launcher (``study.jobs``
    trainings at once here, or one SLURM job array), ``stage`` naming it on the live line.  ``dry``: print the batch
    (study.orchestration.ensure.dry_run) and train nothing ({} returned).

    Returns: {name: {seed: final validation loss (nats), None for a diverged run}}.
    """
    todo = [(name, lr, group, label, int(seed)) for name, lr, group, label in arms for seed in seeds_of[name]]
    runs = [[*base, *run_overrides(cfg, n, seed, lr, g, runs_dir), *extra] for n, lr, g, _, seed in todo]
    stage = stage or (arms[0][3].strip() if len(arms) == 1 else "runs")
    if dry:
        dry_run(runs, root, params, stage, cfg.study.jobs)
        return {}
    done = ensure_runs(runs, root, params, cfg.study.jobs, label=stage)
    out: dict[str, dict[int, float | None]] = {name: {} for name, *_ in arms}
    for (name, _, _, label, seed), (d, reused) in zip(todo, done):
        r = read_result(d)
        out[name][seed] = r["val_loss"] if r["status"] == "ok" else None
        print(f"{label}seed {seed}: {'diverged' if out[name][seed] is None else format(out[name][seed], '.4f')}"
              f"{' (reused)' if reused else ''}", flush=True)
    return out
