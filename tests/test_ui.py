"""`make ui` / `make ui-check` (study/ui.py): the MLflow UI on a study's store, checked in a real headless browser.

Needs Debian's chromium-headless-shell (`make ui-check` installs it) and playwright (dev extra); skipped without.
"""
from __future__ import annotations

import shutil
import subprocess
import urllib.request

import pytest

from study.runner import mlflow_ui as ui


def test_runs_url_opens_the_runs_table_with_val_loss():
    url = ui.runs_url("http://127.0.0.1:5000", "7")
    assert url == "http://127.0.0.1:5000/#/experiments/7/runs?viewStateShareKey=runs"
    state = ui.view_state()
    assert state["orderByKey"] == "metrics.`val_loss`" and "metrics.`val_loss`" in state["selectedColumns"]
    assert ui.runs_url("http://h:1", None) == "http://h:1/#/experiments"


@pytest.mark.slow  # two trainings, an MLflow server and a browser: ~1.5 min on 2 cores
@pytest.mark.skipif(shutil.which(ui.CHROMIUM) is None, reason=f"{ui.CHROMIUM} is not installed (make ui-check)")
def test_browser_lists_every_run_with_its_val_loss_from_a_moved_store(run_in, nano_project, tmp_path, monkeypatch):
    pytest.importorskip("playwright")
    from study.config import load_config

    runs = [run_in("variant=baseline", "seed=1"), run_in("variant=nonlinear_q", "seed=1")]
    moved = tmp_path / "moved"  # the store and its artifacts moved together, as a project folder moves
    moved.mkdir()
    shutil.move(tmp_path / "mlruns.db", moved / "mlruns.db")
    shutil.move(tmp_path / "mlartifacts", moved / "mlartifacts")
    study = load_config([f"study.tracking_db={moved / 'mlruns.db'}", f"study.artifact_dir={moved / 'mlartifacts'}"],
                        nano_project).study
    port = ui.free_port()
    proc = ui.start(port, nano_project, study, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        # artifacts are served from the folder's new place
        run_id = runs[0]["mlflow_run_id"]
        with urllib.request.urlopen(f"{base}/get-artifact?path=curve.csv&run_uuid={run_id}", timeout=30) as r:
            assert r.read() == (tmp_path / "runs" / "baseline-s1" / "curve.csv").read_bytes()
        shot = tmp_path / "reports" / "ui_runs.png"
        problems = ui.check(nano_project, study, shot, shutil.which(ui.CHROMIUM), base_url=base)
        # the check compares the page with the store: a store value the page does not show is reported
        real = ui.study_runs(nano_project, study)
        wrong = [dict(r, val_loss=r["val_loss"] + 0.01) if r["name"] == "baseline-s1" else r for r in real]
        monkeypatch.setattr(ui, "study_runs", lambda root, study: wrong)
        caught = ui.check(nano_project, study, tmp_path / "wrong.png", shutil.which(ui.CHROMIUM), base_url=base)
        monkeypatch.undo()
    finally:
        ui.stop(proc)
    assert problems == []
    assert len(caught) == 1 and caught[0].startswith("baseline-s1: val_loss shown as"), caught
    assert {r["name"] for r in ui.study_runs(nano_project, study)} == {"baseline-s1", "nonlinear_q-s1"}
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
