"""The runs of arms at given lrs and seeds, and the check that conf/tuned.yaml agrees with the tuning table: what the
tuning stage (study.tune) and the test stage (study.test_runs) both need.  :func:`arm_losses` sends every missing run
of a batch out on the launcher (:func:`study.orchestration.ensure.ensure_runs`) and reads each run's final loss through
the run folder's reader (study.runfolder.read_result)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from study.config import ConfigError
from study.config.task import tune_command
from study.orchestration.ensure import dry_run, ensure_runs
from study.runfolder import read_result
from study.runner.arms import plain_container, recipe_difference, run_overrides

#: the tuning table's JSON, in tune.table_dir (study.tune writes it)
TABLE_JSON = "table.json"


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


def check_tuned(cfg, root: Path) -> None:
    """conf/tuned.yaml (``tuned.lr``) agrees with the tuning table it came from (tune.table_dir/table.json).

    Raises:
        ConfigError: an arm's lr differs, or is in one and not the other (one line: re-run the task's tuning,
            `make tune` or `make tasks TASKS=T`).
    """
    p = root / cfg.tune.table_dir / TABLE_JSON
    table = json.loads(p.read_text()) if p.is_file() else {"arms": {}}
    want = {k: a["lr_star"] for k, a in table.get("arms", {}).items() if a.get("lr_star") is not None}
    have = {str(k): float(v) for k, v in cfg.tuned.lr.items()}
    have_at = dict(plain_container(cfg.tuned.recipe))
    want_at = {k: a["recipe"] for k, a in table.get("arms", {}).items() if k in want and a.get("recipe")}
    bad_at = sorted(k for k in set(want_at) | set(have_at) if recipe_difference(want_at.get(k, {}), have_at.get(k, {})))
    if bad_at and want == have:
        raise ConfigError(f"conf/tuned.yaml (tuned.recipe) disagrees with {p.name} on the settings {bad_at} were tuned at: "
                          f"re-run {tune_command(cfg)} (which writes both), or restore both from git")
    if want != have:
        bad = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        raise ConfigError(f"conf/tuned.yaml (tuned.lr) disagrees with {p.relative_to(root) if p.is_relative_to(root) else p} "
                          f"for {bad} ({ {k: have.get(k) for k in bad} } vs {{{', '.join(f'{k!r}: {want.get(k)}' for k in bad)}}}): "
                          f"re-run {tune_command(cfg)} (which writes both), or restore both from git")
