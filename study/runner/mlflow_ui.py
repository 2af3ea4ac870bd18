"""The MLflow UI on the project's own store: the server, the study's runs view, a headless-browser check.

:func:`start` serves the store (``mlflow server``, one worker, 127.0.0.1, artifacts proxied from
``<root>/mlartifacts``) and waits until it answers; :func:`runs_url` is the study's runs table in a
shared view (:func:`view_state`: the verdict's test runs, sorted by val_loss, with the arm, seed, group and
status columns); :func:`check` loads that table in Debian's headless Chromium through Playwright and compares it
with the store.  The command
line is ``python -m study.ui`` (``study.ui``).
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
from study.config.store import tracking_uri
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


def start(port: int, root: Path, study, timeout: float = 120.0, **popen) -> subprocess.Popen:
    """Start the server (its own process group) and wait until it answers.

    Raises:
        RuntimeError: it exited or did not answer within ``timeout`` seconds (stopped first).
    """
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
    env.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # the server's start-up chatter
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning,ignore:starlette.middleware.wsgi is deprecated")
    proc = subprocess.Popen(command(port, root, study), env=env, start_new_session=True, **popen)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the MLflow server exited with code {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2):
                    return proc
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the MLflow server did not answer on port {port} within {timeout:.0f} s")
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


CHROMIUM = "chromium-headless-shell"  # Debian's package and command (Playwright's own download is not used)


def chromium(install: bool = False) -> str | None:
    """Path of Debian's headless Chromium, or None.  With ``install``, a missing one is installed with
    ``apt-get install chromium-headless-shell`` (as root, else through ``sudo -n``)."""
    import shutil

    path = shutil.which(CHROMIUM)
    if path or not install or not shutil.which("apt-get"):
        return path
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if prefix is None:
        return None
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print(f"installing {CHROMIUM} (apt-get) ...", file=sys.stderr, flush=True)
    for cmd in (["apt-get", "install", "-y", "-qq", "--no-install-recommends", CHROMIUM],
                ["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", CHROMIUM]):
        subprocess.run(prefix + cmd, env=env, stdout=subprocess.DEVNULL, check=False)
        if shutil.which(CHROMIUM):
            break
    return shutil.which(CHROMIUM)


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


def row_problems(page, run: dict) -> list[str]:
    """What the loaded runs table (a Playwright page) gets wrong about one test run of :func:`study_runs`: not listed,
    no run name, or a val_loss other than the store's (1e-6 relative; "-" for a run without one)."""
    row = page.locator(f'.ag-row[row-id="{run["run_id"]}"]')
    if row.count() == 0:
        return [f"{run['name']}: not listed"]
    out = []
    if run["name"] not in " ".join(row.all_inner_texts()):  # pinned name column + the rest
        out.append(f"{run['name']}: row {run['run_id']} does not show the run name")
    cell = page.locator(f'.ag-row[row-id="{run["run_id"]}"] [col-id="metrics.`val_loss`"]')
    shown = cell.first.inner_text().strip() if cell.count() else None
    if run["val_loss"] is None:
        return out + ([f"{run['name']}: val_loss shown as {shown!r}, none in the store"] if shown not in ("-", "")
                      else [])
    try:
        ok = abs(float(shown) - run["val_loss"]) <= 1e-6 * abs(run["val_loss"])
    except (TypeError, ValueError):
        ok = False
    return out + ([] if ok else [f"{run['name']}: val_loss shown as {shown!r}, {run['val_loss']!r} in the store"])


def page_problems(page, runs: list[dict]) -> list[str]:
    """What the loaded runs table gets wrong: a test run wrong (:func:`row_problems`), another run listed (the
    default view shows the test runs alone), or a column of :data:`VIEW_TAGS` not shown."""
    out = [p for r in runs if r["role"] == "test" for p in row_problems(page, r)]
    out += [f"{r['name']}: listed, but the default view shows the test runs alone ({VIEW_FILTER})"
            for r in runs if r["role"] != "test" and page.locator(f'.ag-row[row-id="{r["run_id"]}"]').count()]
    out += [f"column {t!r} not shown" for t in VIEW_TAGS
            if page.locator(f'.ag-header-cell[col-id="tags.`{t}`"]').count() == 0]
    return out


def load_page(browser: str, url: str, first: str, shot: Path, timeout: float, runs: list[dict]) -> list[str]:
    """Open ``url`` in headless Chromium (``browser``: its executable), wait for the row of run id ``first``, check
    the table (:func:`page_problems`) and save a full-page screenshot to ``shot``; the problems found."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=browser)
        try:
            page = b.new_page(viewport={"width": 2400, "height": max(720, 400 + 44 * len(runs))})
            page.goto(url)
            page.locator(f'.ag-row[row-id="{first}"]').first.wait_for(timeout=timeout * 1000)
            close = page.get_by_role("button", name="Close")  # the MLflow Assistant side panel
            if close.count() == 1:
                close.click()
            page.wait_for_timeout(1000)
            problems = page_problems(page, runs)
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
            return problems
        finally:
            b.close()


def check(root: Path, study, screenshot: Path, browser: str, timeout: float = 120.0, base_url: str | None = None
          ) -> list[str]:
    """Load the study's runs table in headless Chromium (``browser``: its executable) through Playwright
    and compare it with the store: by default it lists the test runs alone (tag ``role=test``), each (found by run
    id) with its name and its last val_loss, and shows the arm, seed, group and status columns
    (:func:`page_problems`).  Saves a full-page screenshot to ``screenshot``.  Starts its own server unless
    ``base_url`` names a running one.  Returns the problems found (empty: the check holds).

    Raises:
        RuntimeError: no test runs in the store, or the server does not start.
    """
    runs = study_runs(root, study)
    tests = [r for r in runs if r["role"] == "test"]
    if not tests:
        raise RuntimeError(f"no test runs of experiment {study.name!r} in {tracking_uri(root, study)}: "
                           f"run the study first (make study)")
    proc = None
    if base_url is None:
        port = free_port()
        proc = start(port, root, study, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base_url = f"http://{HOST}:{port}"
    try:
        url = runs_url(base_url, experiment_id(root, study))
        return load_page(browser, url, tests[0]["run_id"], screenshot, timeout, runs)
    finally:
        if proc is not None:
            stop(proc)
