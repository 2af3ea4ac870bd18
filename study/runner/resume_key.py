"""A run's resume key: the settings that change its numbers (study.config.resume_config), the numerics it computes
with, the training code (study.runfolder.digests.code_digests: the code, not its docstrings or layout) and the prepared data
(its digest).  A checkpoint resumes, and a finished run is reused, only under the same key, on any world size."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from study.config import resume_config, resume_part
from study.data.records import data_digest
from study.runfolder import CHECKPOINTS, RUN_JSON
from study.runfolder.digests import code_digests


def resume_record(cfg, data_dir: Path) -> dict:
    """What a checkpoint must match to be resumed, flat: :func:`study.config.resume_config` (the
    settings that change a run's numbers, not devices, strategy, threads, compile, logging), the numerics it computes
    under (``numerics:cpu_capability``, ``numerics:torch``, ``numerics:threads`` ...:
    :func:`study.config.numerics.run_numerics`), the digest of the code each training file computes (its syntax
    tree without docstrings: a docstring, comment or layout edit keeps the key; ``code:study/modeling/model.py``,
    ``code:study/data/loader.py`` ...: :func:`study.runfolder.digests.code_digests`)
    and ``data:meta.json`` (:func:`study.data.records.data_digest`)."""
    from study.config.numerics import run_numerics

    rec = dict(resume_config(cfg))
    rec.update({f"numerics:{k}": v for k, v in run_numerics(cfg.trainer).items()})  # the kernels, torch, threads
    rec.update({f"code:study/{n}": digest for n, digest in code_digests(cfg.task.name).items()})
    rec["data:meta.json"] = data_digest(data_dir)
    return json.loads(json.dumps(rec))  # as run.json will hold it (lists, floats)


def run_digest(cfg, data_dir: Path, record: dict | None = None) -> str:
    """The resume key: sha256 (16 hex digits) of :func:`resume_record` (``record``, when already built)."""
    record = resume_record(cfg, data_dir) if record is None else record
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def canonical_key(stored) -> dict | None:
    """A resume record as stored (checkpoints/run.json ``resume``) under today's rule of what the key holds: its
    settings filtered again by :func:`study.config.resume_part` (a rule that drops a key, such as another task's
    fields, leaves a run trained under the older rule reusable), its ``code:`` and ``data:`` digests as they are;
    None for anything but a JSON object."""
    if not isinstance(stored, dict):
        return None
    return {**resume_part(config_part(stored)), **{k: v for k, v in stored.items() if ":" in k}}


def same_key(stored, record: dict) -> bool:
    """Whether the resume record a run stored is ``record`` under today's rule (:func:`canonical_key`)."""
    return canonical_key(stored) == record


def stored_key(out_dir: Path) -> dict | None:
    """The resume record a run folder's checkpoints/run.json holds (None: absent or unreadable)."""
    try:
        state = json.loads((out_dir / CHECKPOINTS / RUN_JSON).read_text())
    except (OSError, ValueError):
        return None
    return state.get("resume") if isinstance(state, dict) else None


def config_part(record: dict) -> dict:
    """The settings of a resume record (:func:`resume_record`), without its ``code:`` and ``data:`` keys."""
    return {k: v for k, v in record.items() if ":" not in k}
