"""The state of a run folder at a start, and how a run ended.

``python -m study.train`` (study.runner.run.train), holding the folder's lock (study.runfolder.lock), resumes
``checkpoints/last.ckpt`` only under the same resume key (:func:`open_run_folder`; the key:
study.runner.resume_key) and never replaces a finished run with other settings silently (:class:`Replaced`: the last
run's outputs set aside until this one succeeds); it ends its MLflow run FAILED or KILLED (:func:`end_status`;
SIGTERM becomes :class:`study.runner.signals.Killed`, :func:`study.runner.signals.terminate_as_exception`).
Lightning's loop state across a resume is study.runner.loop_state; the MLflow runs a dead process left RUNNING are
settled by study.runner.tracking.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from study.config import ConfigError, StudyError, diff_keys
from study.runner.signals import Killed
from study.runfolder import (CHECKPOINTS, METRICS_FILE, RECORD_FILE, REPLACED, RUN_JSON, RUN_OUTPUTS, LAST_CKPT,
                             read_result, recorded_settings)
from study.runner.resume_key import canonical_key, config_part, resume_record, run_digest, same_key


def ctrl_c(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C: a KeyboardInterrupt, or the ``SystemExit(1)`` Lightning raises after handling one
    during fit ("Detected KeyboardInterrupt, attempting graceful shutdown"), which would end the process with exit
    status 1 and no word of ours.  A SIGTERM (:class:`Killed`) is not."""
    e: BaseException | None = exc
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            return True
        if isinstance(e, Killed):
            return False
        e = e.__context__
    return False


def end_status(exc: BaseException) -> str:
    """MLflow status of a run ended by ``exc``: KILLED for a signal or Ctrl-C (also when Lightning turned
    it into a SystemExit), FAILED otherwise."""
    e: BaseException | None = exc
    while e is not None:
        if isinstance(e, (Killed, KeyboardInterrupt)) or type(e).__name__ == "SIGTERMException":
            return "KILLED"
        e = e.__context__
    return "FAILED"


class Replaced:
    """What :func:`open_run_folder` moved aside into ``out_dir/.replaced/``: put back by :meth:`restore`
    (the start failed before its Trainer was built: a rejected trainer setting loses nothing), dropped by
    :meth:`discard` (the Trainer exists: the run goes ahead and writes its own)."""

    def __init__(self, out_dir: Path, moved: list[str], owner: bool = True):
        self.out_dir, self.moved, self.owner = out_dir, list(moved), owner  # owner: global rank 0, which moved them

    @property
    def aside(self) -> Path:
        return self.out_dir / REPLACED

    def restore(self) -> None:
        """Put every moved file back, replacing what this start wrote in its place (run.json)."""
        if not self.owner:
            return
        for n in self.moved:
            target, kept = self.out_dir / n, self.aside / n
            if not kept.exists():
                continue
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
            kept.replace(target)
        self.moved = []
        shutil.rmtree(self.aside, ignore_errors=True)

    def drop_checkpoints(self) -> None:
        """The Trainer exists: the last run's checkpoints go (this run writes its own), its outputs stay aside until
        this run writes its own (:meth:`discard`) and come back (:meth:`restore`) if it stops before: an interrupted
        re-run never loses the finished result it was replacing."""
        if not self.owner or CHECKPOINTS not in self.moved:
            return
        self.moved.remove(CHECKPOINTS)
        gone = self.out_dir / f"{REPLACED}.discarded"
        shutil.rmtree(gone, ignore_errors=True)
        (self.aside / CHECKPOINTS).replace(gone)  # one step: a kill while deleting leaves nothing to put back
        shutil.rmtree(gone, ignore_errors=True)

    def discard(self) -> None:
        """Drop what was set aside: renamed first (one step), so that a process dying while it is deleted
        leaves nothing that a later start would take for a set-aside run and put back."""
        if not self.owner:
            return
        self.moved = []
        if self.aside.is_dir():
            gone = self.out_dir / f"{REPLACED}.discarded"
            shutil.rmtree(gone, ignore_errors=True)
            self.aside.replace(gone)
            shutil.rmtree(gone, ignore_errors=True)


def put_back_dead_start(out_dir: Path) -> None:
    """What a start that died before writing its own outputs had set aside (``out_dir/.replaced/``) goes back, and
    what one that died while dropping it had renamed goes (call with the folder's lock held, as global rank 0)."""
    if (out_dir / REPLACED).is_dir():
        Replaced(out_dir, [p.name for p in (out_dir / REPLACED).iterdir()]).restore()
    shutil.rmtree(out_dir / f"{REPLACED}.discarded", ignore_errors=True)


def finished_here(cfg, out_dir: Path, data_dir: Path) -> bool:
    """Whether ``out_dir`` holds a finished run of this very resume key (run.json completed under it, metrics.json
    there), which a hand-started run reuses instead of training it again: not with ``train.overwrite`` (train it
    again) nor as a DVC stage (:func:`dvc_stage`: DVC decides what it re-runs).  One process (world size 1) with the
    folder's lock held: a dead start's set-aside files are put back first (:func:`put_back_dead_start`)."""
    if cfg.train.overwrite or dvc_stage():
        return False
    put_back_dead_start(out_dir)
    if not (out_dir / METRICS_FILE).is_file():
        return False
    try:
        state = json.loads((out_dir / CHECKPOINTS / RUN_JSON).read_text())
    except (OSError, ValueError):
        state = None
    record = resume_record(cfg, data_dir)
    digest = run_digest(cfg, data_dir, record)
    if isinstance(state, dict) and state.get("completed") is True:
        this = state.get("config_hash") == digest or same_key(state.get("resume"), record)
    else:  # run.json is an interrupted re-run's (train.overwrite, SIGKILLed): the finished outputs are back beside
        # its checkpoints, and record.json's key says whose they are
        try:
            this = json.loads((out_dir / RECORD_FILE).read_text()).get("config_hash") == digest
        except (OSError, ValueError, AttributeError):
            this = False
    if not this:
        return False
    try:  # a damaged finished run (record.json gone, metrics.json cut short) is trained again, not reused
        read_result(out_dir)
    except StudyError as e:
        why = str(e).partition(": restore the file")[0]
        print(f"{out_dir.name}: the finished run there is damaged ({why}): training it again", flush=True)
        return False
    return True


def dvc_stage() -> str | None:
    """The DVC stage this process runs as (``DVC_STAGE``, which ``dvc repro`` / ``dvc exp run`` set for every
    stage command), or None for a hand-started run.  DVC re-runs a train stage only when its code, data or
    params changed, and leaves its outputs in place until then (``persist: true`` in dvc.yaml: nothing is
    deleted before the command, docs/failures.md), so a DVC stage's run replaces the finished run of its
    folder as ``train.overwrite=true`` does (set aside until its Trainer exists, :class:`Replaced`)."""
    return os.environ.get("DVC_STAGE") or None


def open_run_folder(cfg, name: str, out_dir: Path, data_dir: Path, rank: int) -> tuple:
    """Decide, from ``out_dir/checkpoints/run.json``, whether this start resumes, and set aside what it replaces.

    A checkpoint is resumed only under the same resume key (:func:`run_digest`) and when its run has not
    finished; otherwise rank 0 prints the keys that differ (``NAME: starting afresh, ...``) and moves
    the checkpoints aside.  Rank 0 moves the outputs of the folder's last run (metrics.json, curve.csv,
    config.json ...) aside, into ``out_dir/.replaced/``; they appear again when this run ends.  The caller
    calls the returned :class:`Replaced`'s ``drop_checkpoints()`` once its Trainer is built, ``discard()`` when it
    writes its own outputs and ``restore()`` if it stops before that; a ``.replaced/`` left by a process that died
    in between is restored here (the outputs of the last finished run come back beside this run's checkpoints).

    Returns:
        (resume record, resume key, run.json's state (empty when starting afresh), the MLflow run id of
        the folder's last process or None, the checkpoint to resume or None, the :class:`Replaced`).

    Raises:
        ConfigError: the folder holds a finished run with other settings, ``train.overwrite`` is off and
            the run is not a DVC stage's (:func:`dvc_stage`).
    """
    ckpt_dir = out_dir / CHECKPOINTS
    if rank == 0:  # a start that died before it wrote its own outputs
        put_back_dead_start(out_dir)
    record = resume_record(cfg, data_dir)
    digest = run_digest(cfg, data_dir, record)
    state_path = ckpt_dir / RUN_JSON
    try:
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    except ValueError:
        state = {}
    if not isinstance(state, dict):
        raise StudyError(f"{state_path} holds {type(state).__name__} {json.dumps(state)[:40]}, not a JSON object "
                         f"(it was edited or damaged): delete {ckpt_dir} to start the run afresh")
    stored = canonical_key(state.get("resume"))  # the stored record under today's rule of what the key holds
    if (out_dir / METRICS_FILE).is_file() and not cfg.train.overwrite and not dvc_stage():  # a finished run:
        refuse_other_settings(out_dir, state, stored, record)  # never replaced silently by a hand-started run
    previous_run_id = state.get("mlflow_run_id")
    resume = ckpt_dir / LAST_CKPT
    same = state.get("config_hash") == digest or stored == record
    if same and state.get("config_hash") != digest:  # stored under an older rule: run.json takes today's key
        state = {**state, "config_hash": digest, "resume": record}
    if not (resume.is_file() and same and not state.get("completed")):
        if rank == 0 and resume.is_file() and not state.get("completed"):
            differ = diff_keys(stored, record) if stored is not None else ["(not recorded)"]
            print(f"{name}: starting afresh, the checkpoint in {ckpt_dir} was written with other settings: "
                  f"{'; '.join(differ)}", flush=True)
        resume, state = None, {}
        replaced = [CHECKPOINTS, *RUN_OUTPUTS]
    else:
        replaced = list(RUN_OUTPUTS)
    moved = set_aside(out_dir, replaced) if rank == 0 else []
    return record, digest, state, previous_run_id, resume, Replaced(out_dir, moved, owner=rank == 0)


def refuse_other_settings(out_dir: Path, state: dict, stored: dict | None, record: dict) -> None:
    """Refuse a hand-started run whose settings differ from the finished run in ``out_dir``: the finished run's
    settings are run.json's when it finished, else config.json's (run.json is then an interrupted re-run's, killed
    under train.overwrite, beside the finished outputs put back).

    Raises:
        ConfigError: one line naming the keys that differ and the two ways on.
    """
    old = config_part(stored) if stored is not None and state.get("completed") is not False \
        else recorded_settings(out_dir)
    differ = diff_keys(old, config_part(record)) if old is not None else ["(not recorded)"]
    if differ:
        raise ConfigError(f"{out_dir} holds a finished run with other settings ({'; '.join(differ)}): give this "
                          f"run its own folder with study.group=NAME, or replace the finished run with "
                          f"train.overwrite=true")


def set_aside(out_dir: Path, names: list[str]) -> list[str]:
    """Move ``names`` of ``out_dir`` that exist into ``out_dir/.replaced/`` (global rank 0); return those moved.  The
    checkpoints folder is made afresh for this start."""
    moved = []
    (out_dir / REPLACED).mkdir(parents=True, exist_ok=True)
    for n in names:
        if (out_dir / n).exists():
            (out_dir / n).replace(out_dir / REPLACED / n)
            moved.append(n)
    (out_dir / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
    return moved
