"""End to end: the real DVC pipeline (prepare -> train matrix -> compare) on the nano model.

Runs `dvc repro` in a temporary copy of the project and checks the report's
figures against statistics recomputed here from the runs' metrics.json files.
"""
from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from scipy import stats

from conftest import BIN, copy_project, env_for
from study.runfolder import read_result  # metrics.json and record.json of a run folder

pytestmark = pytest.mark.slow


ARMS, SEEDS = ("baseline", "nonlinear_q"), (1, 2, 3, 4, 5)
RUNS = [f"test/{a}/{a}-s{s}" for a in ARMS for s in SEEDS]  # the test runs' names (their folders under runs/)


def dvc(project, *args, timeout=1500):
    return subprocess.run([str(BIN / "dvc"), *args], cwd=project, env=env_for(project), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    project = copy_project(tmp_path_factory.mktemp("pipeline"), name="e2e", arms=ARMS, seeds=SEEDS, tokens=20480)
    r = dvc(project, "repro")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (project / "repro.log").write_text(r.stdout + r.stderr)  # untracked: kept for test_repro_log_shows_each_runs_progress
    return project


def test_repro_log_shows_each_runs_progress(study):
    """Not a terminal: every run prints its optimizer steps of the total as it goes, without Lightning's noise."""
    import re

    log = (study / "repro.log").read_text()
    for run in RUNS:
        steps = [int(s) for s in re.findall(rf"^{run}: step (\d+)/10 \(", log, re.M)]
        assert steps == list(range(1, 11)), (run, log[-3000:])
    assert "Epoch 0/-2" not in log and "Tip:" not in log and "Create an account" not in log


def test_report_figures_match_the_runs(study):
    summary = json.loads((study / "reports/summary.json").read_text())
    runs = {(a, s): read_result(study / f"runs/test/{a}/{a}-s{s}") for a in ARMS for s in SEEDS}
    assert all(m["status"] == "ok" and m["tokens"] == 20480 for m in runs.values())
    for a in ARMS:
        losses = [runs[a, s]["val_loss"] for s in SEEDS]
        got = summary["verdict"]["arms"][a]
        assert got["n_seeds"] == 5 and got["lr"] == 3e-3
        assert got["val_loss_mean"] == pytest.approx(np.mean(losses))
        assert got["val_loss_sd"] == pytest.approx(np.std(losses, ddof=1))
        assert 3.0 < got["val_loss_mean"] < math.log(512) + 0.1  # trained below the uniform loss, real text
    b = [runs["baseline", s]["val_loss"] for s in SEEDS]
    n = [runs["nonlinear_q", s]["val_loss"] for s in SEEDS]
    c = summary["verdict"]["comparisons"]["nonlinear_q vs baseline"]
    assert c["pct"]["mean"] == pytest.approx(100 * (np.mean(n) - np.mean(b)) / np.mean(b))
    assert c["p_value"] == pytest.approx(stats.ttest_rel(n, b).pvalue)
    assert c["ci95"][0] < c["mean_diff"] < c["ci95"][1]
    md = (study / "reports/comparison.md").read_text()
    assert f"| {c['pct']['mean']:+.2f} |" in md and "nonlinear_q vs baseline" in md
    for png in ("val_loss_curves.png", "verdict.png"):
        data = (study / "reports/figures" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    # every run sees the same fixed validation windows and the same number of evaluations
    curves = [(study / f"runs/test/{a}/{a}-s{s}/curve.csv").read_text().splitlines() for a, s in runs]
    assert len({len(c) for c in curves}) == 1
    assert curves[0][0] == ("step,tokens,train_loss,val_loss,lr,in_context_gain,val_loss/kjv,val_loss/shakespeare,val_loss/sotu,"
                            "attn_logit_max/L0,attn_logit_max/L1")


def test_runs_are_tracked_in_mlflow(study):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{study / 'mlruns.db'}")
    exp = client.get_experiment_by_name("e2e")
    runs = client.search_runs([exp.experiment_id])
    verdict = [r for r in runs if r.data.tags.get("kind") == "verdict"]
    assert [v.info.run_name for v in verdict] == ["compare"]  # compare's report, findable in the UI
    runs = [r for r in runs if r not in verdict]
    assert sorted(r.info.run_name for r in runs) == RUNS
    for r in runs:
        assert r.info.status == "FINISHED"
        assert r.data.params["variant.query"] in ("linear", "nonlinear")
        assert r.data.params["train.tokens"] == "20480"
        assert {"val_loss", "val_perplexity", "train_loss", "tokens_per_s", "lr"} <= set(r.data.metrics)
        assert not {"mfu", "peak_flops", "train/device/mfu"} & set(r.data.metrics)  # no MFU on CPUs
        assert r.data.tags["variant"] in ("baseline", "nonlinear_q") and len(r.data.tags["git_commit"]) >= 40
        metrics = json.loads((study / f"runs/{r.info.run_name}/metrics.json").read_text())
        assert r.data.metrics["val_loss"] == pytest.approx(metrics["val_loss"], rel=1e-6)


def test_repro_is_idempotent_and_selective(study):
    r = dvc(study, "repro")
    assert r.returncode == 0 and "Running stage" not in r.stdout, r.stdout
    assert dvc(study, "metrics", "show", "--json").returncode == 0
    r = dvc(study, "plots", "show", "-o", str(study / "plots_html"))
    assert r.returncode == 0, r.stderr
    # editing one variant re-runs the test stage (it depends on conf/variant/, since an arm may use any variant;
    # its driver reuses every run whose settings did not change, and trains that variant's arm again) and the
    # comparison
    path = study / "conf/variant/nonlinear_q.yaml"
    path.write_text(path.read_text() + "scale_factor: 0.4\n")  # a setting of the variant (its lr is its arm's)
    r = dvc(study, "repro")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    ran = sorted(line.split("'")[1] for line in r.stdout.splitlines() if line.startswith("Running stage"))
    # the stages that read conf/variant (the ladder's too: off here, it trains nothing) and compare; never prepare
    assert ran == ["compare", "scale_ladder", "test_runs"], r.stdout
    assert "scale_ladder.models is empty: no ladder" in r.stdout
    log = r.stdout + r.stderr
    assert log.count("test/nonlinear_q/nonlinear_q-s1: step 10/10") == 1, log  # the variant's arm trained again
    assert "test/baseline/baseline-s1: step" not in log, log  # the baseline's runs reused


def test_mlflow_ui_serves_the_runs(study):
    """`make ui` = `python -m study.ui`: start it, ask the REST API for the study's runs, stop it by pid."""
    import os
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(BIN / "python"), "-m", "study.ui", "--port", str(port)], cwd=study,
                            env=env_for(study), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline, exp = time.time() + 120, None
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=e2e",
                                            timeout=5) as r:
                    exp = json.loads(r.read())["experiment"]
                    break
            except OSError:
                time.sleep(1)
        assert exp is not None, "the MLflow UI did not answer"
        req = urllib.request.Request(f"{url}/api/2.0/mlflow/runs/search", method="POST",
                                     data=json.dumps({"experiment_ids": [exp["experiment_id"]]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            runs = json.loads(r.read())["runs"]
        assert {r["info"]["run_name"] for r in runs} == {*RUNS, "compare"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_notebook_says_a_study_without_arms_has_no_test_runs(study, monkeypatch):
    """The study with study.arms=[] (STUDY_OVERRIDES): the notebook (whose subject is the test runs of study.arms:
    tests/test_notebook.py) runs through and says so, every section without a table."""
    from test_notebook import execute, tables

    monkeypatch.setenv("STUDY_OVERRIDES", "study.arms=[]")
    nb = execute(study, study / "notebooks")
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "study.arms is empty: the study has no test runs to show" in text
    assert "study.arms is empty: no comparisons" in text and tables(nb) == {}
