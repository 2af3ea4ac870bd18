"""MLflow settings in one place: the project's SQLite store and artifact folder.

MLflow 3 refuses the plain file store by default, so every caller uses an
SQLite tracking URI (``sqlite:///<root>/mlruns.db``) and an explicit artifact
location, with telemetry off.  ``MLFLOW_TRACKING_URI``, when set, replaces the
SQLite store: any store MLflow supports (``sqlite:///``, ``postgresql://``,
``mysql://``, ``mssql://``, a tracking server ``http(s)://``, ``databricks``;
the file store ``file:PATH`` only with ``MLFLOW_ALLOW_FILE_STORE=true``, MLflow
3's own opt-in); anything else is refused in one line.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from study.config import StudyConfig

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")


def tracking_uri(root: Path, study: StudyConfig) -> str:
    """The tracking store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///ABSOLUTE/PATH/mlruns.db``
    for the project at ``root`` (``study.tracking_db``).

    Raises:
        ConfigError: ``MLFLOW_TRACKING_URI`` names a store MLflow does not support, or the file store
            without ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow 3 refuses it by default).
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not uri:
        return f"sqlite:///{(root / study.tracking_db).resolve()}"
    from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry as registry

    from study.config import ConfigError

    try:
        builder = registry.get_store_builder(uri)  # MLflow's own scheme -> store table
    except Exception:  # noqa: BLE001  (MLflow's Unsupported...URIException)
        schemes = sorted(s + ":" for s in registry._registry if s)
        raise ConfigError(f"MLFLOW_TRACKING_URI={uri}: MLflow has no tracking store for it; use one of {schemes} "
                          f"(e.g. sqlite:///mlruns.db or http://HOST:5000), or unset it for the project's "
                          f"{study.tracking_db}") from None
    if builder is registry._registry.get("file") and not MLFLOW_ALLOW_FILE_STORE.get():
        raise ConfigError(f"MLFLOW_TRACKING_URI={uri} is MLflow's file store, which MLflow 3 refuses by default: "
                          f"use sqlite:///PATH.db or a tracking server, or set MLFLOW_ALLOW_FILE_STORE=true to use it "
                          f"anyway")
    return uri


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
