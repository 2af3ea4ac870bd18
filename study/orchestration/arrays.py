"""The SLURM job arrays a stage submitted, recorded where its runs are, and SLURM's queue as the stage reads it.

Right after submitting, the stage writes ``.slurm-arrays/ARRAY.json`` beside its runs (in the folder above every
run folder of the batch): the array's id, submitit's log folder, the params file's digest and, per run, its folder,
its task (``ARRAY_TASK``) and its overrides.  A stage that ended without cancelling its array (SIGKILL, a lost
login node) leaves the array queued and its record in place; the next start of a stage finds the record
(:func:`earlier_tasks`), waits for every task still queued or running that trains one of its runs with the same
overrides, cancels one that trains it with others (:func:`cancel_and_wait`), and never queues a run twice.  A
record is deleted once none of its tasks is queued or running.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from study.config import StudyError

#: the folder of the records, beside the batch's run folders
RECORDS = ".slurm-arrays"
#: SLURM states of a task that has not ended (it may still run, or run again after a requeue)
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
#: the SLURM commands a stage on ``launcher=slurm`` calls
COMMANDS = ("sbatch", "squeue", "scancel", "srun")
#: an override that only says "replace the finished run there": not a difference of settings
OVERWRITE = "train.overwrite=true"


def check_commands() -> None:
    """Raises:
        StudyError: a SLURM command the launcher calls is not on PATH (one line: the fix)."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        raise StudyError(f"launcher=slurm needs SLURM's {', '.join(missing)} on PATH and this machine has none: run "
                         f"the stage on the cluster's login node (or put SLURM's bin folder on PATH), or train on "
                         f"this machine with launcher=local")


def squeue_tasks(array_id: str) -> dict[str, tuple[str, str]] | None:
    """{task id "ARRAY_TASK": (state, reason)} of every task of the array SLURM still knows (any state; reason
    "None" when SLURM gives none), {} for an array SLURM no longer knows, None when squeue fails."""
    try:
        got = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", str(array_id), "-o", "%i|%T|%r"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if got.returncode:
        return None if "Invalid job id" not in got.stderr else {}
    rows = [x.split("|", 2) for x in got.stdout.splitlines()]
    return {r[0].strip(): (r[1].strip(), r[2].strip()) for r in rows if len(r) == 3}


def params_digest(params: str | None) -> str | None:
    """sha256 of the params file's text (None without one, or unreadable)."""
    try:
        return hashlib.sha256(Path(params).read_bytes()).hexdigest() if params else None
    except OSError:
        return None


def record_path(folders: list[Path], array: str) -> Path:
    """Where the record of ``array`` goes: ``.slurm-arrays/ARRAY.json`` in the folder above every run folder."""
    parents = [str(Path(d).resolve().parent) for d in folders]
    return Path(os.path.commonpath(parents)) / RECORDS / f"{array}.json"


def write_record(todo: list[tuple[Path, list[str]]], jobs: list[str], array: str, log_folder: Path,
                 params: str | None) -> Path:
    """Record a submitted array (see the module docstring); returns the record's path."""
    path = record_path([d for d, _ in todo], array)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"array": str(array), "log_folder": str(Path(log_folder).resolve()), "params": params,
            "params_digest": params_digest(params), "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "tasks": [{"folder": str(Path(d).resolve()), "job": j, "overrides": list(o)}
                      for (d, o), j in zip(todo, jobs)]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1))
    tmp.replace(path)
    return path


def _records_above(folders: list[Path]) -> list[Path]:
    """Every record in a records folder at or above the folders (each read once)."""
    seen, out = set(), []
    for d in folders:
        for a in Path(d).resolve().parents:
            if a in seen:
                continue
            seen.add(a)
            if (a / RECORDS).is_dir():
                out += sorted((a / RECORDS).glob("*.json"))
    return out


def earlier_tasks(folders: list[Path], params: str | None) -> dict[Path, dict]:
    """The tasks of earlier arrays still queued or running (squeue) that train one of ``folders``: {folder: {"job",
    "overrides", "same_params", "state", "log_folder", "record"}}; records none of whose tasks is active are deleted.
    An array squeue cannot be asked about is kept and left out."""
    want = {Path(d).resolve(): Path(d) for d in folders}
    digest, out = params_digest(params), {}
    for rec in _records_above(list(want.values())):
        try:
            body = json.loads(rec.read_text())
            tasks = body["tasks"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        states = squeue_tasks(str(body.get("array")))
        if states is None:
            continue
        active = [t for t in tasks if states.get(t.get("job"), ("GONE", ""))[0] in ACTIVE]
        if not active:
            rec.unlink(missing_ok=True)  # every task has ended: nothing left to wait for
            continue
        for t in active:
            d = want.get(Path(t["folder"]))
            if d is not None:
                out[d] = {"job": t["job"], "overrides": list(t.get("overrides") or []), "record": rec,
                          "same_params": body.get("params_digest") == digest, "state": states[t["job"]][0],
                          "log_folder": Path(body.get("log_folder") or ".")}
    return out


def drop_if_ended(record: Path) -> None:
    """Delete an array's record once none of its tasks is queued or running (kept when squeue cannot tell)."""
    try:
        body = json.loads(record.read_text())
        jobs = [t["job"] for t in body["tasks"]]
    except (OSError, ValueError, KeyError, TypeError):
        return
    states = squeue_tasks(str(body.get("array")))
    if states is not None and not any(states.get(j, ("GONE", ""))[0] in ACTIVE for j in jobs):
        record.unlink(missing_ok=True)


def same_run(task: dict, overrides: list[str]) -> bool:
    """Whether an earlier task trains its run exactly as ``overrides`` would (the params file's text included)."""
    def plain(o):
        return [x for x in o if x != OVERWRITE]
    return task["same_params"] and plain(task["overrides"]) == plain(overrides)


def cancel_and_wait(jobs: list[str], poll_s: float = 2.0, timeout_s: float = 600) -> None:
    """scancel ``jobs`` (ARRAY_TASK ids) and wait until none is queued or running.

    Raises:
        StudyError: scancel failed, or a job is still active after ``timeout_s`` (one line: the fix)."""
    if not jobs:
        return
    got = subprocess.run(["scancel", *jobs], capture_output=True, text=True)
    if got.returncode:
        raise StudyError(f"scancel {' '.join(jobs)} failed ({(got.stderr or got.stdout).strip()[:200]}): cancel "
                         f"them by hand, then run the same command again")
    deadline = time.time() + timeout_s
    arrays = sorted({j.split("_")[0] for j in jobs})
    while time.time() < deadline:
        states = {}
        for a in arrays:
            states.update(squeue_tasks(a) or {})
        if not any(states.get(j, ("GONE", ""))[0] in ACTIVE for j in jobs):
            return
        time.sleep(poll_s)
    raise StudyError(f"SLURM jobs {' '.join(jobs)} are still running {timeout_s:.0f} s after scancel: wait for them "
                     f"to end (squeue), then run the same command again")
