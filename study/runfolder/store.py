"""Where the project's MLflow store is: ``MLFLOW_TRACKING_URI`` or the SQLite file ``study.tracking_db``, checked
before anything is written.  With the run folder's contract, below both the runner (which writes the store) and
analysis (which reads finished runs from it, study.analysis.runs.load_mlflow), so that they name it the same way."""
from __future__ import annotations

import os
from pathlib import Path

from study.config.schema import StudyConfig


def tracking_uri(root: Path, study: StudyConfig) -> str:
    """The tracking store: ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///ABSOLUTE/PATH/mlruns.db``
    for the project at ``root`` (``study.tracking_db``).

    Raises:
        ConfigError: ``MLFLOW_TRACKING_URI`` names a store MLflow does not support, or the file store
            without ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow 3 refuses it by default); ``study.tracking_db``
            cannot hold the SQLite store (:func:`check_tracking_db`).
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not uri:
        return f"sqlite:///{check_tracking_db(root, study)}"
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


SQLITE_HEADER = b"SQLite format 3\x00"


def check_tracking_db(root: Path, study: StudyConfig) -> Path:
    """The SQLite store's path (``root / study.tracking_db``, absolute), checked before anything is written:
    not a folder, not an existing file other than an SQLite database, and its folder a folder that exists
    or can be made (made here) and is writable.

    Raises:
        ConfigError: one line naming study.tracking_db, what is wrong and the fix.
    """
    from study.config import ConfigError

    db = (root / study.tracking_db).resolve()
    fix = "give study.tracking_db a writable file path such as mlruns.db (or set MLFLOW_TRACKING_URI)"

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"study.tracking_db={study.tracking_db}: {why}: {fix}")

    if not str(study.tracking_db).strip():
        raise refuse("empty")
    if db.is_dir():
        raise refuse(f"{db} is a folder, not the SQLite store's file")
    above = db.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise refuse(f"{db} would be inside {above}, which is a file")
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise refuse(f"its folder {db.parent} cannot be made ({e.strerror or e})") from None
    if not os.access(db.parent, os.W_OK | os.X_OK):
        raise refuse(f"its folder {db.parent} is not writable")
    if db.exists():
        if not db.is_file() or not os.access(db, os.R_OK | os.W_OK):
            raise refuse(f"{db} is not a readable and writable file")
        with open(db, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
        if head and head != SQLITE_HEADER:
            raise refuse(f"{db} is not an SQLite database (another file would be overwritten)")
    return db
