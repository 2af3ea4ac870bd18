"""Which runs a stage trains, and their launch: :func:`ensure_runs` reuses every finished run trained under the same
resume key (study.runner.arms) and trains the rest through the study's launcher (study.orchestration.launch), one live
line for the whole batch (under SLURM, never a run that an earlier array of a killed stage still trains:
:func:`earlier_runs`); :func:`dry_run` prints the array a batch would be, with its resources and estimated
GPU-hours (CPU-hours for a CPU trainer), and trains nothing."""
from __future__ import annotations

import json
from pathlib import Path

from study.config import StudyError
from study.config.launcher import resolve_launcher
from study.orchestration.arrays import cancel_and_wait, check_commands, earlier_tasks, same_run
from study.orchestration.launch import launch
from study.orchestration.live_line import StageLine
from study.runfolder import METRICS_FILE
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
            log, in one line; under slurm, SLURM's commands are missing or sbatch refused the array (one line).
    """
    if not runs:
        return []
    first = pending(runs[0], root, params, wait=False)[2]
    executor = resolve_launcher(first)["executor"]
    if executor == "local" and jobs <= 1 and first.trainer.accelerator not in ("gpu", "cuda"):
        return [ensure_run(o, root, params) for o in runs]  # a GPU trainer goes to the launcher: its GPU slots
    rows = [pending(o, root, params, wait=False) for o in runs] if executor == "slurm" else []
    earlier = earlier_runs(rows, params, first) if executor == "slurm" else {}
    todo_all = [rows[i] if i in earlier else pending(o, root, params) for i, o in enumerate(runs)]
    todo = [(d, o) for d, o, _ in todo_all if o is not None]
    if todo:
        line = StageLine(label, [d for d, _, _ in todo_all], reused=len(todo_all) - len(todo), launched=[d for d, _ in todo])
        taken = {todo_all[i][0]: t for i, t in earlier.items() if todo_all[i][1] is not None}
        failed = launch(todo, root, params, first, line, jobs=jobs, earlier=taken)
        if failed:
            raise StudyError(f"{len(failed)} run(s) failed: {', '.join(failed)}: fix the cause and re-run "
                             f"(finished runs are reused)")
    return [(d, o is None) for d, o, _ in todo_all]


def earlier_runs(rows: list[tuple], params: str | None, cfg) -> dict[int, dict]:
    """The runs (by index in ``rows``, :func:`study.runner.arms.pending`'s rows) that a task of an earlier SLURM array (a stage killed without cancelling it)
    still trains with the same overrides: {index: task} (study.orchestration.arrays.earlier_tasks), waited for, not
    submitted again.  An earlier task that trains a run with other settings is cancelled (and waited out) first.

    Raises:
        StudyError: SLURM's commands are missing, or a task would not end after scancel (one line each).
    """
    check_commands()
    found = earlier_tasks([d for d, o, _ in rows if o is not None], params)
    keep, stale = {}, []
    for i, (d, o, _) in enumerate(rows):
        task = found.get(d) if o is not None else None
        if task is not None and same_run(task, o):
            keep[i] = task
        elif task is not None:
            print(f"{d}: SLURM job {task['job']}, submitted earlier, trains it with other settings: cancelling it",
                  flush=True)
            stale.append(task["job"])
    cancel_and_wait(stale, poll_s=float(resolve_launcher(cfg)["poll_s"]))
    return keep


def _flops(cfg, root: Path, cache: dict) -> tuple[int, int]:
    """(FLOPs per token of training (forward + backward), training tokens) of one run's config, after the profiles'
    derived settings (compute-matched tokens)."""
    from study.config import max_steps
    from study.runner.spec import run_spec
    from study.tasks import configured_rows

    cfg = run_spec(cfg, root).cfg
    rows = configured_rows(cfg)
    key = json.dumps([dict(cfg.model), dict(cfg.variant), rows], sort_keys=True, default=str)
    if key not in cache:
        from study.modeling.accounting import describe  # built on the meta device: no weights allocated
        cache[key] = describe(cfg.model, cfg.variant, rows)["flops_per_token"]
    fpt, steps = cache[key], max_steps(cfg)
    evals = steps // max(1, int(cfg.train.eval_every)) + 1  # forward only: a third of a training token's FLOPs
    return fpt, int(steps * cfg.train.batch_tokens + evals * cfg.train.val_tokens / 3)


#: the achieved fp32 FLOP/s of one CPU core that a CPU trainer's --dry-run assumes (GFLOP/s): the default model
#: (1.67 MFLOP per token) at 17,093 tokens/s in one thread of an AMD EPYC (docs/profiles.md, the table of choices)
CPU_GFLOPS_PER_CORE = 28.0


def gpu_hours(flops: float, res: dict) -> float:
    """GPU-hours of ``flops`` at ``launcher.mfu`` of ``launcher.peak_tflops`` (per GPU)."""
    return flops / (res["peak_tflops"] * 1e12 * res["mfu"]) / 3600


def cpu_hours(flops: float) -> float:
    """CPU-hours (core-hours) of ``flops`` at :data:`CPU_GFLOPS_PER_CORE` per core (the same on any core count)."""
    return flops / (CPU_GFLOPS_PER_CORE * 1e9) / 3600


def on_gpus(cfg, res: dict) -> bool:
    """Whether a run of ``cfg`` trains on GPUs (priced in GPU-hours) or on CPU cores (in CPU-hours)."""
    acc = str(cfg.trainer.accelerator)
    return acc in ("gpu", "cuda") or (acc == "auto" and int(res["gpus_per_node"]) > 0)


def dry_run(runs: list[list[str]], root: Path, params: str | None, label: str, jobs: int = 1) -> dict:
    """Print what :func:`ensure_runs` would launch for ``runs`` and launch nothing: the missing runs (the finished
    ones reused), the array's resources and each run's FLOPs and what they cost: GPU-hours at the assumed MFU for a
    GPU trainer, CPU-hours (core-hours) at :data:`CPU_GFLOPS_PER_CORE` for a CPU one.

    Returns: {"runs": missing run folders, "reused": how many are reused, "flops": total FLOPs, "gpu_hours",
    "cpu_hours"} (the hours of the other kind 0).
    """
    if not runs:
        return {"runs": [], "reused": 0, "flops": 0.0, "gpu_hours": 0.0, "cpu_hours": 0.0}
    rows = [pending(o, root, params, wait=False) for o in runs]
    todo = [(d, c) for d, o, c in rows if o is not None]
    replaced = sum((d / METRICS_FILE).is_file() for d, _ in todo)  # finished under other settings, code or data
    also = f"; {replaced} of them replace a finished run of other settings" if replaced else ""
    res = resolve_launcher(rows[0][2])
    gpu = on_gpus(rows[0][2], res)
    cache: dict = {}
    flops = []
    for d, c in todo:
        fpt, tokens = _flops(c, root, cache)
        flops.append((d, fpt, tokens))
    total = float(sum(f * t for _, f, t in flops))
    hours, unit = (gpu_hours(total, res), "GPU-h") if gpu else (cpu_hours(total), "CPU-h")
    if res["executor"] == "slurm":
        where = ", ".join(f"{k} {res[k]}" for k in ("partition", "account", "qos", "constraint") if res[k])
        print(f"{label}: would submit 1 SLURM job array of {len(todo)} run(s) ({len(rows) - len(todo)} finished, "
              f"reused{also}){': ' + where if where else ''}; each job {res['nodes']} node(s) x {res['tasks_per_node']} "
              f"task(s), {res['gpus_per_node']} GPU(s)/node, {res['cpus_per_task']} CPU(s)/task, "
              f"{str(res['mem_gb']) + ' GB' if res['mem_gb'] else 'default memory'}, {res['timeout_min']} min, "
              f"{res['array_parallelism']} at once")
    else:
        print(f"{label}: would train {len(todo)} run(s) on this machine, {max(1, jobs)} at once "
              f"({len(rows) - len(todo)} finished, reused{also})")
    for d, fpt, tokens in flops:
        each = gpu_hours(fpt * tokens, res) if gpu else cpu_hours(fpt * tokens)
        print(f"  {d}: {fpt:.3g} FLOP/token x {tokens:,} tokens = {fpt * tokens:.3g} FLOP, {each:.3g} {unit}")
    if gpu:
        print(f"{label}: {total:.3g} FLOP in all = {hours:.3g} GPU-hours at {res['mfu']:.0%} MFU of "
              f"{res['peak_tflops']:g} TFLOP/s per GPU")
    else:
        print(f"{label}: {total:.3g} FLOP in all = {hours:.3g} CPU-hours (core-hours) at {CPU_GFLOPS_PER_CORE:g} "
              f"GFLOP/s per core (a CPU trainer: trainer.accelerator={rows[0][2].trainer.accelerator})")
    return {"runs": [d for d, _ in todo], "reused": len(rows) - len(todo), "flops": total,
            "gpu_hours": hours if gpu else 0.0, "cpu_hours": 0.0 if gpu else hours}
