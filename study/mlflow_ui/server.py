"""The MLflow UI on the project's own store: the server and the study's runs view.

:func:`start` serves the store (``mlflow server``, one worker, 127.0.0.1, artifacts proxied from
``<root>/mlartifacts``) and waits until it answers; :func:`runs_url` is the study's runs table in a
shared view (:func:`view_state`: the verdict's test runs, sorted by val_loss, with the arm, seed, group and
status columns); :func:`study_runs` is what the store holds, for the browser check
(:mod:`study.mlflow_ui.browser_check`).  The command line is ``python -m study.ui``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from study.config import load_config, project_root
from study.runfolder.store import tracking_uri
from study.runner.tracking import artifact_root

HOST = "127.0.0.1"


def command(port: int, root: Path | None = None, study=None) -> list[str]:
    """The ``mlflow server`` command line for the project at ``root`` (default: this project)."""
    root = project_root() if root is None else root
    study = load_config([], root).study if study is None else study
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri(root, study),
            "--default-artifact-root", "mlflow-artifacts:/", "--artifacts-destination",
            str(artifact_root(root, study)), "--host", HOST, "--port", str(port), "--workers", "1",
            "--uvicorn-opts", "--no-access-log"]


VIEW_KEY = "runs"  # the shared view's key: experiment tag mlflow.sharedViewState.runs
VIEW_FILTER = "tags.role = 'test'"  # the verdict's test runs (study.config.naming.run_role); "" lists every run
VIEW_METRICS = ("val_loss", "val_perplexity")
# status: "ok" or "diverged" (a diverged run's last val_loss is no result; study.train sets it); arm, seed, group:
# which comparison, seed and folder a row is (study.runner.run.open_run tags each run)
VIEW_TAGS = ("status", "arm", "seed", "group")
VIEW_PARAMS = ("variant.name", "model.name", "train.lr", "arm.lr", "train.tokens")  # arm.lr: a tuned arm's


def view_columns() -> list[str]:
    """The runs table's column keys, in order (MLflow's ``metrics.`name```, ``tags.`name```, ``params.`name```):
    :data:`VIEW_METRICS`, :data:`VIEW_TAGS`, :data:`VIEW_PARAMS`."""
    return ([f"metrics.`{m}`" for m in VIEW_METRICS] + [f"tags.`{t}`" for t in VIEW_TAGS]
            + [f"params.`{p}`" for p in VIEW_PARAMS])


def view_state() -> dict:
    """The runs table's view (the MLflow UI's shared-view JSON): the test runs alone (search filter
    :data:`VIEW_FILTER`), sorted by val_loss ascending, the columns of :func:`view_columns` shown."""
    return {"searchFilter": VIEW_FILTER, "orderByKey": "metrics.`val_loss`", "orderByAsc": True,
            "selectedColumns": view_columns()}


def share_view(client, experiment_id: str) -> None:
    """Store :func:`view_state` in the experiment (tag ``mlflow.sharedViewState.runs``)."""
    import json

    client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}", json.dumps(view_state()))


def runs_url(base: str, experiment_id: str | None) -> str:
    """The MLflow 3 UI address of an experiment's runs table in the shared view :func:`view_state`
    (``#/experiments/ID/runs?viewStateShareKey=runs``); the experiment list where none exists yet."""
    if experiment_id is None:
        return f"{base}/#/experiments"
    return f"{base}/#/experiments/{experiment_id}/runs?" + urllib.parse.urlencode({"viewStateShareKey": VIEW_KEY})


def experiment_id(root: Path, study) -> str | None:
    """The id of the study's experiment in the store (its shared runs view set, :func:`share_view`),
    or None (no store or no experiment yet)."""
    uri = tracking_uri(root, study)  # MLFLOW_TRACKING_URI's store, else study.tracking_db
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        return None
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(study.name)
    if exp is None:
        return None
    share_view(client, exp.experiment_id)
    return exp.experiment_id


def start(port: int, root: Path, study, timeout: float = 120.0) -> subprocess.Popen:
    """Start the server (its own process group; its output to a log file) and wait until it answers.

    Raises:
        RuntimeError: it exited (one line with the last line of its output and the log's path) or did not answer
            within ``timeout`` seconds (stopped first).
    """
    import tempfile

    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
    env.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # the server's start-up chatter
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning,ignore:starlette.middleware.wsgi is deprecated")
    log = Path(tempfile.gettempdir()) / f"mlflow-ui-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command(port, root, study), env=env, start_new_session=True, stdout=out,
                                stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
                raise RuntimeError(f"the MLflow server exited with code {proc.returncode}"
                                   f"{': ' + lines[-1] if lines else ''} (its output: {log})")
            try:
                with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2):
                    return proc
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the MLflow server did not answer on port {port} within {timeout:.0f} s (its output: "
                           f"{log})")
    except BaseException:  # not answering, or interrupted while waiting: leave no server behind
        stop(proc)
        raise


def stop(proc: subprocess.Popen) -> None:
    """Stop a server started by :func:`start` (its process group) and wait for it."""
    import signal

    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def study_runs(root: Path, study) -> list[dict]:
    """The study's training runs in the store (active, not compare's verdict run): run_id, name, role (tag ``role``:
    ``"test"`` for the verdict's test runs, "" where the run has none) and the last val_loss (nats, None where the run
    logged none)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri(root, study))
    exp = client.get_experiment_by_name(study.name)
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    return [{"run_id": r.info.run_id, "name": r.info.run_name, "role": r.data.tags.get("role", ""),
             "val_loss": r.data.metrics.get("val_loss")} for r in runs if r.data.tags.get("kind") != "verdict"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]
