"""MLflow settings in one place: the project's SQLite store and artifact folder.

MLflow 3 refuses the plain file store by default, so every caller uses an
SQLite tracking URI (``sqlite:///<root>/mlruns.db``) and an explicit artifact
location, with telemetry off.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from study.config import StudyConfig

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")


def tracking_uri(root: Path, study: StudyConfig) -> str:
    """``sqlite:///ABSOLUTE/PATH/mlruns.db`` for the project at ``root``."""
    return f"sqlite:///{(root / study.tracking_db).resolve()}"


def artifact_location(root: Path, study: StudyConfig) -> str:
    """``file:///ABSOLUTE/PATH/mlartifacts`` for the project at ``root``."""
    return (root / study.artifact_dir).resolve().as_uri()


def git_commit(root: Path) -> str:
    """The commit of the working tree (``+dirty`` when it has changes), or ``unknown``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("+dirty" if dirty else "")) if sha else "unknown"


def store_lock(root: Path, study: StudyConfig):
    """An inter-process lock (filelock) held while a run creates the SQLite store, experiment or run."""
    from filelock import FileLock

    db = (root / study.tracking_db).resolve()
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock", timeout=600)
