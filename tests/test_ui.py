"""`make ui` / `make ui-check` (study/ui.py): the MLflow UI on a study's store, checked in a real headless browser.

Needs Debian's chromium-headless-shell (`make ui-check` installs it) and playwright (dev extra); skipped without.
"""
from __future__ import annotations

import shutil
import subprocess
import urllib.request

import pytest

from study.mlflow_ui import browser_check
from study.mlflow_ui import server as ui


def test_runs_url_opens_the_test_runs_table_with_val_loss():
    url = ui.runs_url("http://127.0.0.1:5000", "7")
    assert url == "http://127.0.0.1:5000/#/experiments/7/runs?viewStateShareKey=runs"
    state = ui.view_state()
    assert state["orderByKey"] == "metrics.`val_loss`" and "metrics.`val_loss`" in state["selectedColumns"]
    assert state["searchFilter"] == "tags.role = 'test'"
    assert ui.runs_url("http://h:1", None) == "http://h:1/#/experiments"


def test_run_tags_name_the_role_and_arm_the_view_filters_on():
    """Test runs (test/ARM) have role test, tuning runs (ARM/lrLR) role tune; each knows its arm."""
    from study.config.naming import run_arm, run_role

    assert [run_role(g) for g in ("test/baseline_qknorm", "nonlinear_q/lr0.005", "baseline/lr1e-05", "",
                                   "scale_ladder/ladder-64", "levers/x")] == [
        "test", "tune", "tune", "main", "scale_ladder", "levers"]
    assert run_arm("test/baseline_today", "baseline") == "baseline_today"
    assert run_arm("nonlinear_q_ph/lr0.01", "nonlinear_q_ph") == "nonlinear_q_ph"
    assert run_arm("scale_ladder/ladder-64", "nonlinear_q") == "nonlinear_q"
    assert run_arm("", "baseline") == "baseline"


@pytest.mark.slow  # two trainings, an MLflow server and a browser: ~1.5 min on 2 cores
@pytest.mark.skipif(shutil.which(browser_check.CHROMIUM) is None, reason=f"{browser_check.CHROMIUM} is not installed (make ui-check)")
def test_browser_lists_every_run_with_its_val_loss_from_a_moved_store(run_in, nano_project, tmp_path, monkeypatch):
    pytest.importorskip("playwright")
    from study.config import load_config

    # a test run of arm baseline and a run outside the verdict (no group): the default view lists the first alone
    runs = [run_in("variant=baseline", "seed=1", "study.group=test/baseline"), run_in("variant=nonlinear_q", "seed=1")]
    moved = tmp_path / "moved"  # the store and its artifacts moved together, as a project folder moves
    moved.mkdir()
    shutil.move(tmp_path / "mlruns.db", moved / "mlruns.db")
    shutil.move(tmp_path / "mlartifacts", moved / "mlartifacts")
    study = load_config([f"study.tracking_db={moved / 'mlruns.db'}", f"study.artifact_dir={moved / 'mlartifacts'}"],
                        nano_project).study
    port = ui.free_port()
    proc = ui.start(port, nano_project, study, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    name = "test/baseline/baseline-s1"
    try:
        base = f"http://127.0.0.1:{port}"
        # artifacts are served from the folder's new place
        run_id = runs[0]["mlflow_run_id"]
        with urllib.request.urlopen(f"{base}/get-artifact?path=curve.csv&run_uuid={run_id}", timeout=30) as r:
            assert r.read() == (tmp_path / "runs" / "test" / "baseline" / "baseline-s1" / "curve.csv").read_bytes()
        shot = tmp_path / "reports" / "ui_runs.png"
        problems = browser_check.check(nano_project, study, shot, shutil.which(browser_check.CHROMIUM), base_url=base)
        # the check compares the page with the store: a store value the page does not show is reported, and so is
        # a column the view lacks and a run listed outside the test runs (here: the view without its filter)
        real = ui.study_runs(nano_project, study)
        wrong = [dict(r, val_loss=r["val_loss"] + 0.01) if r["name"] == name else r for r in real]
        monkeypatch.setattr(ui, "study_runs", lambda root, study: wrong)
        monkeypatch.setattr(ui, "VIEW_FILTER", "")
        monkeypatch.setattr(ui, "VIEW_TAGS", ("status", "arm", "seed", "group", "absent"))
        caught = browser_check.check(nano_project, study, tmp_path / "wrong.png", shutil.which(browser_check.CHROMIUM), base_url=base)
        monkeypatch.undo()
    finally:
        ui.stop(proc)
    assert problems == [], problems
    assert len(caught) == 3, caught
    assert caught[0].startswith(f"{name}: val_loss shown as"), caught
    assert caught[1].startswith("nonlinear_q-s1: listed, but the default view shows the test runs alone"), caught
    assert caught[2] == "column 'absent' not shown", caught
    assert {(r["name"], r["role"]) for r in ui.study_runs(nano_project, study)} == {(name, "test"),
                                                                                  ("nonlinear_q-s1", "main")}
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_the_runs_table_shows_each_runs_status():
    """A diverged run's last val_loss is no result: the status tag (ok / diverged) is a column of the shared view,
    beside the arm, seed and group that say which comparison and folder a row is."""
    assert ui.view_state()["selectedColumns"][:6] == ["metrics.`val_loss`", "metrics.`val_perplexity`", "tags.`status`",
                                                      "tags.`arm`", "tags.`seed`", "tags.`group`"]


def test_another_store_opens_its_own_experiment(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI names another store: its experiment is found (not only .../#/experiments)."""
    from mlflow import MlflowClient

    from conftest import ROOT
    from study.config import load_config

    uri = f"sqlite:///{tmp_path / 'other.db'}"
    study = load_config([f"study.tracking_db={tmp_path / 'absent.db'}"], ROOT).study
    exp = MlflowClient(tracking_uri=uri).create_experiment(study.name)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert ui.experiment_id(ROOT, study) == exp


@pytest.mark.slow  # one training, the UI server started by `python -m study.ui` (~1 min on 2 cores)
def test_study_ui_takes_the_store_and_artifacts_the_overrides_name(run_in, nano_project, tmp_path):
    import sys
    import time

    from conftest import env_for

    run = run_in("variant=baseline", "seed=1")
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(tmp_path / "mlruns.db", moved / "mlruns.db")
    shutil.move(tmp_path / "mlartifacts", moved / "mlartifacts")
    port = ui.free_port()
    out = tmp_path / "ui.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "study.ui", "--no-open", "--port", str(port),
                                 f"study.tracking_db={moved / 'mlruns.db'}", f"study.artifact_dir={moved / 'mlartifacts'}"],
                                cwd=nano_project, env=env_for(nano_project), stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 180
        while "MLflow UI:" not in out.read_text() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        text = out.read_text()
        assert f"http://127.0.0.1:{port}/#/experiments/" in text and "/runs?viewStateShareKey=runs" in text, text
        url = f"http://127.0.0.1:{port}/get-artifact?path=curve.csv&run_uuid={run['mlflow_run_id']}"
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.read() == (tmp_path / "runs" / "baseline-s1" / "curve.csv").read_bytes()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_filters_docs_tracking_gives_select_what_they_say(tmp_path):
    """docs/tracking.md's three search filters (test runs, tuning runs, one arm), run against a store: each selects
    exactly the runs it names; the first is the view's default."""
    import re

    from mlflow import MlflowClient

    from conftest import ROOT

    text = (ROOT / "docs" / "tracking.md").read_text()
    filters = dict(re.findall(r"^- (the test runs|the tuning runs|one arm)[^`]*`([^`]+)`", text, re.M))
    assert filters["the test runs"] == ui.VIEW_FILTER
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    exp = client.create_experiment("x")
    tags = {"test/nonlinear_q/nonlinear_q-s1": ("test", "nonlinear_q"), "test/baseline/baseline-s1": ("test", "baseline"),
            "nonlinear_q/lr0.01/nonlinear_q-s101": ("tune", "nonlinear_q"), "baseline-s1": ("main", "baseline")}
    for name, (role, arm) in tags.items():
        client.create_run(exp, run_name=name, tags={"role": role, "arm": arm})

    def names(f):
        return sorted(r.info.run_name for r in client.search_runs([exp], filter_string=f))
    assert names(filters["the test runs"]) == ["test/baseline/baseline-s1", "test/nonlinear_q/nonlinear_q-s1"]
    assert names(filters["the tuning runs"]) == ["nonlinear_q/lr0.01/nonlinear_q-s101"]
    assert names(filters["one arm"]) == ["nonlinear_q/lr0.01/nonlinear_q-s101", "test/nonlinear_q/nonlinear_q-s1"]
    assert names(filters["one arm"] + " and tags.role = 'test'") == ["test/nonlinear_q/nonlinear_q-s1"]


@pytest.mark.slow  # starts an MLflow server (~10 s)
def test_a_server_that_cannot_bind_its_port_is_one_line_naming_its_output(nano_project, tmp_path, capsys, monkeypatch):
    """A port already taken: the server exits; `python -m study.ui` says so in one line, with the last line of the
    server's own output and where the rest is, instead of the server's traceback above a guess."""
    import socket

    from study.ui import main

    monkeypatch.chdir(nano_project)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc = main(["--port", str(port), "--no-open", f"study.tracking_db={tmp_path / 'm.db'}",
                   f"study.artifact_dir={tmp_path / 'art'}"])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == "", cap.out
    err = cap.err.strip()
    assert err.startswith("error: the MLflow server exited with code ") and len(err.splitlines()) == 1, err
    log = err.split("(its output: ")[1].split(")")[0]
    assert "address already in use" in open(log).read().lower(), err
    assert f"is port {port} in use?" in err, err
