"""The test stage, ``python -m study.test_runs --params params.yaml [--dry-run]`` (DVC stage ``test_runs``): every arm of
``study.arms`` at its lr* on the test seeds, with seeds added until the verdict is decided (Stein's two-stage
procedure, study/analysis/decision.py).

1. Checks that conf/tuned.yaml agrees with the tuning table it came from (one line, re-run `make tune`).
2. Stage one: every arm on ``study.seeds`` (at least 5), in ``runs/test/ARM/VARIANT-sSEED``.
3. From each comparison's first-stage paired sd, Stein's N; each arm gets the largest N of its comparisons,
   capped at ``study.max_seeds`` (a comparison needing more is reported "undecided (N seeds needed)").
4. Stage two: the extra seeds (after max(study.seeds), skipping the tuning seeds and study.pilot_seeds).
5. Fails (one line) when params.yaml changed while it ran: DVC would record the new values in dvc.lock for runs
   trained at the old ones, and skip this stage from then on (:func:`check_params_unchanged`).
Every finished run of the same settings, code and data is reused, never retrained, so a re-run after a kill, or
after adding an arm, trains only what is missing.  Writes ``runs/test/plan.json`` (byte-stable): the seeds of
each arm and each comparison's first-stage sd and N; ``compare`` reads the runs and reports the verdict.

Why a driver stage rather than a DVC matrix: N is known only after the first stage, and a matrix must be known
when dvc.yaml is read; a matrix generated from a tracked file would need the pipeline to rewrite its own
definition between two `dvc repro` calls.  One stage that reuses every finished run gives the same caching
(runs/test persists) in one `dvc repro`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from study.analysis.decision import seed_list, seeds_to_train
from study.analysis.summary import finite_or_null
from study.analysis.verdict import PLAN, all_seeds, compare_all, comparisons_of, comparison_name
from study.config.naming import TEST_GROUP, testing_group
from study.runner.arms import arm_of, tuned_lr
from study.orchestration.losses import arm_losses
from study.orchestration.driver import driver_main
from study.tuning.tuned_file import check_tuned


def _losses(cfg, root: Path, seeds_of: dict[str, list[int]], lrs: dict[str, float], params: str | None,
            base: list[str] = (), dry: bool = False) -> dict[str, dict[int, float]]:
    """{arm: {seed: final val loss}} of the test runs of each arm of ``seeds_of`` that finished (diverged ones
    left out: lost points); the missing runs of all arms go out in one batch on the launcher."""
    got = arm_losses(cfg, root, [(a, lrs[a], testing_group(a), f"test {a}: ") for a in seeds_of], seeds_of, params, base,
                     stage="test", dry=dry)
    return {a: {s: v for s, v in losses.items() if v is not None} for a, losses in got.items()}


def run_tests(cfg, root: Path, params: str | None, base: list[str] = (), dry: bool = False) -> dict:
    """Train (or reuse) the test runs by Stein's two stages; write and return the plan.  ``dry``: print the first
    stage's array (runs, resources, GPU-hours) and the most the second may add; train and write nothing ({}).

    Args:
        params: the composed config the runs start from (params.yaml under DVC; None: conf/ composed).
        base: the stage's own overrides, given to every run before the run's own.
    """
    s = cfg.study
    folder = root / s.runs_dir / TEST_GROUP
    if not s.arms and dry:
        print("study.arms is empty: no test stage, nothing to submit")
        return {}
    if not dry:
        folder.mkdir(parents=True, exist_ok=True)
    if not s.arms:
        print("study.arms is empty: no test stage (docs/verdict.md)")
        (folder / PLAN).write_text(json.dumps({"arms": [], "seeds": {}}, indent=1, sort_keys=True) + "\n")
        return {}
    check_tuned(cfg, root)
    lrs = {a: tuned_lr(cfg, a, root) for a in s.arms}
    for a in s.arms:
        arm_of(cfg, a)
    n0 = len(s.seeds)
    first = list(s.seeds)
    if dry:
        _losses(cfg, root, {a: first for a in s.arms}, lrs, params, base, dry=True)
        print(f"test: then Stein's second stage: up to {max(0, s.max_seeds - n0)} more seed(s) per arm "
              f"(study.max_seeds={s.max_seeds}), in one more batch, as the first stage's spread asks")
        return {}
    ok = _losses(cfg, root, {a: first for a in s.arms}, lrs, params, base)
    stage_one = compare_all(cfg, ok)
    need = {a: n0 for a in s.arms}
    for (a, r) in comparisons_of(cfg):
        c = stage_one[comparison_name(a, r)]
        n = seeds_to_train({"c": c}, n0, s.max_seeds)
        need[a], need[r] = max(need[a], n), max(need[r], n)
    seeds = {a: seed_list(first, need[a], [*cfg.tune.seeds, *s.pilot_seeds]) for a in s.arms}
    extra = {a: [x for x in seeds[a] if x not in first] for a in s.arms}
    extra = {a: x for a, x in extra.items() if x}
    for a, x in extra.items():
        print(f"test {a}: Stein's second stage, {len(x)} more seed(s): {x}", flush=True)
    if extra:
        _losses(cfg, root, extra, lrs, params, base)
    plan = {"arms": list(s.arms), "n0": n0, "lr": lrs, "seeds": seeds, "all_seeds": all_seeds(cfg),
            "stage_one": {k: {"s0": c["stein"]["s0"], "n_needed": c["stein"]["n_needed"],
                              "capped": c["stein"]["capped"]} for k, c in stage_one.items()}}
    (folder / PLAN).write_text(json.dumps(finite_or_null(plan), indent=1, sort_keys=True) + "\n")
    return plan


def main(argv: list[str] | None = None) -> int:
    return driver_main(argv, run_tests, "test", "test_runs", "study.test_runs")


if __name__ == "__main__":
    sys.exit(main())
