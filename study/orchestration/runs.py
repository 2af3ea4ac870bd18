"""Which runs a stage trains, and their launch: :func:`ensure_runs` reuses every finished run trained under the same
resume key (study.runner.arms) and trains the rest through the study's launcher (study.orchestration.launch), one live
line for the whole batch; :func:`dry_run` prints the array a batch would be, with its resources and estimated
GPU-hours, and trains nothing."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from study.config import StudyError
from study.config.launcher import resolve_launcher
from study.orchestration.launch import launch
from study.orchestration.progress import StageLine
from study.runner.arms import ensure_run, pending


def ensure_runs(runs: list[list[str]], root: Path, params: str | None, jobs: int = 1,
                label: str = "runs") -> list[tuple[Path, bool]]:
    """:func:`study.runner.arms.ensure_run` for each override list of ``runs``, on the runs' launcher
    (``launcher`` section of their config): ``local`` trains ``jobs`` at once (1: one after the other in this process,
    its progress on the terminal), ``slurm`` submits the missing runs as one job array.  Each training is
    ``python -m study.train`` with the run's overrides, so the same numbers on either launcher.  A run that fails does
    not stop the others; once all have ended, the failures are raised together (finished runs are kept and reused by
    the next start).

    Returns: [(run folder, whether it was reused)], in the order of ``runs``.

    Raises:
        StudyError: a training did not finish: each named with its job (exit status, or SLURM job id and state) and
            log, in one line.
    """
    if not runs:
        return []
    first = pending(runs[0], root, params, wait=False)[2]
    executor = resolve_launcher(first)["executor"]
    if executor == "local" and jobs <= 1:
        return [ensure_run(o, root, params) for o in runs]
    todo_all = [pending(o, root, params) for o in runs]
    todo = [(d, o) for d, o, _ in todo_all if o is not None]
    if todo:
        line = StageLine(label, [d for d, _, _ in todo_all], reused=len(todo_all) - len(todo), launched=[d for d, _ in todo])
        failed = launch(todo, root, params, first, line, jobs=jobs)
        if failed:
            raise StudyError(f"{len(failed)} run(s) failed: {', '.join(failed)}: fix the cause and re-run "
                             f"(finished runs are reused)")
    return [(d, o is None) for d, o, _ in todo_all]


def _flops(cfg, root: Path, cache: dict) -> tuple[int, int]:
    """(FLOPs per token of training (forward + backward), training tokens) of one run's config, after the profiles'
    derived settings (compute-matched tokens)."""
    from study.config import max_steps
    from study.runner.profiles import resolve

    cfg = resolve(copy.deepcopy(cfg), root)
    key = json.dumps([dict(cfg.model), dict(cfg.variant)], sort_keys=True, default=str)
    if key not in cache:
        from study.modeling.accounting import describe  # built on the meta device: no weights allocated
        cache[key] = describe(cfg.model, cfg.variant)["flops_per_token"]
    fpt, steps = cache[key], max_steps(cfg)
    evals = steps // max(1, int(cfg.train.eval_every)) + 1  # forward only: a third of a training token's FLOPs
    return fpt, int(steps * cfg.train.batch_tokens + evals * cfg.train.val_tokens / 3)


def gpu_hours(flops: float, res: dict) -> float:
    """GPU-hours of ``flops`` at ``launcher.mfu`` of ``launcher.peak_tflops`` (per GPU)."""
    return flops / (res["peak_tflops"] * 1e12 * res["mfu"]) / 3600


def dry_run(runs: list[list[str]], root: Path, params: str | None, label: str, jobs: int = 1) -> dict:
    """Print what :func:`ensure_runs` would launch for ``runs`` and launch nothing: the missing runs (the finished
    ones reused), the array's resources and each run's FLOPs and the GPU-hours they take at the assumed MFU.

    Returns: {"runs": missing run folders, "reused": how many are reused, "flops": total FLOPs, "gpu_hours"}.
    """
    if not runs:
        return {"runs": [], "reused": 0, "flops": 0.0, "gpu_hours": 0.0}
    rows = [pending(o, root, params, wait=False) for o in runs]
    todo = [(d, c) for d, o, c in rows if o is not None]
    res = resolve_launcher(rows[0][2])
    cache: dict = {}
    flops = []
    for d, c in todo:
        fpt, tokens = _flops(c, root, cache)
        flops.append((d, fpt, tokens))
    total = float(sum(f * t for _, f, t in flops))
    hours = gpu_hours(total, res)
    if res["executor"] == "slurm":
        where = ", ".join(f"{k} {res[k]}" for k in ("partition", "account", "qos", "constraint") if res[k])
        print(f"{label}: would submit 1 SLURM job array of {len(todo)} run(s) ({len(rows) - len(todo)} finished, "
              f"reused){': ' + where if where else ''}; each job {res['nodes']} node(s) x {res['tasks_per_node']} "
              f"task(s), {res['gpus_per_node']} GPU(s)/node, {res['cpus_per_task']} CPU(s)/task, "
              f"{str(res['mem_gb']) + ' GB' if res['mem_gb'] else 'default memory'}, {res['timeout_min']} min, "
              f"{res['array_parallelism']} at once")
    else:
        print(f"{label}: would train {len(todo)} run(s) on this machine, {max(1, jobs)} at once "
              f"({len(rows) - len(todo)} finished, reused)")
    for d, fpt, tokens in flops:
        print(f"  {d}: {fpt:.3g} FLOP/token x {tokens:,} tokens = {fpt * tokens:.3g} FLOP, "
              f"{gpu_hours(fpt * tokens, res):.3g} GPU-h")
    print(f"{label}: {total:.3g} FLOP in all = {hours:.3g} GPU-hours at {res['mfu']:.0%} MFU of "
          f"{res['peak_tflops']:g} TFLOP/s per GPU")
    return {"runs": [d for d, _ in todo], "reused": len(rows) - len(todo), "flops": total, "gpu_hours": hours}
