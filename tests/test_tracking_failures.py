"""Reliability, round three (issue 25 items 4 and 5): a dead run's MLflow run never stays RUNNING, a resumed
run logs each step once, and the smaller things a user meets."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import env_for, start_until_checkpoint


def _cmd(runs: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "study.train", "variant=baseline", "seed=3", "train.tokens=102400",
            "train.log_every=1", "trainer.progress_bar=false", f"study.runs_dir={runs}", f"study.tracking_db={db}",
            *extra]


def _sigkill_after(proc: subprocess.Popen, ready, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow  # ~90 s: two training processes SIGKILLed, two in-process runs
def test_a_resumed_run_logs_each_step_once_and_a_dead_run_never_stays_running(nano_project, tmp_path, monkeypatch,
                                                                             capsys):
    import torch
    from mlflow import MlflowClient

    from study.train import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(nano_project)
    runs, db = tmp_path / "runs", tmp_path / "m.db"
    folder = runs / "baseline-s3"
    ckpt, state = folder / "checkpoints/last.ckpt", folder / "checkpoints/run.json"
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")

    def logged(key="train_loss"):
        try:
            return [m.step for m in client.get_metric_history(json.loads(state.read_text())["mlflow_run_id"], key)]
        except Exception:  # noqa: BLE001  (the store or run.json not there yet)
            return []

    # item 5: killed after its checkpoint and a few more logged steps, then resumed by the same command
    proc = start_until_checkpoint(_cmd(runs, db), nano_project, ckpt)
    at = torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]
    _sigkill_after(proc, lambda: max(logged(), default=0) >= at + 3)
    at = torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]
    assert max(logged()) > at  # steps the resumed run will take again
    run_id = json.loads(state.read_text())["mlflow_run_id"]
    assert main(_cmd(runs, db)[3:]) == 0
    for key in ("train_loss", "lr", "tokens", "tokens_per_s", "val_loss", "non_embedding_params"):
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert steps and len(steps) == len(set(steps)), (key, sorted(steps))
    assert sorted(m.step for m in client.get_metric_history(run_id, "train_loss")) == list(range(1, 51))

    # item 4: SIGKILL, then the advice of an unreadable checkpoint (delete checkpoints/ to start afresh)
    shutil.rmtree(folder)
    proc = start_until_checkpoint(_cmd(runs, db), nano_project, ckpt)
    _sigkill_after(proc, lambda: True)
    dead = json.loads(state.read_text())["mlflow_run_id"]
    assert client.get_run(dead).info.status == "RUNNING"
    ckpt.write_bytes(b"damaged")
    capsys.readouterr()
    assert main(_cmd(runs, db)[3:]) == 2
    err = capsys.readouterr().err
    assert "is unreadable" in err and f"delete {folder / 'checkpoints'}" in err
    shutil.rmtree(folder / "checkpoints")  # the advice: run.json, the only record of `dead`, goes with it
    assert main(_cmd(runs, db, "train.tokens=4096")[3:]) == 0
    old = client.get_run(dead).info
    assert old.status == "KILLED" and old.end_time is not None
    assert [r.info.status for r in client.search_runs([old.experiment_id]) if r.info.status == "RUNNING"] == []


def test_data_dir_pointing_at_a_file_is_named(nano_project, tmp_path, monkeypatch, capsys):
    from study.train import main

    monkeypatch.chdir(nano_project)
    f = tmp_path / "tokens.bin"
    f.write_bytes(b"x")
    assert main([f"data.dir={f}", f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'm.db'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert f"data.dir={f} is a file" in err and "meta.json not found" not in err


def test_a_bad_override_is_named_alone(nano_project, tmp_path, monkeypatch, capsys):
    from study.train import main

    monkeypatch.chdir(nano_project)
    assert main(["seed=1", "train.lr=[1e-3", "variant=baseline", f"study.runs_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad override (train.lr=[1e-3)" in err and "seed=1" not in err and "variant=baseline" not in err


def test_a_corrupt_metrics_json_advises_the_command_with_its_overrides(nano_project, tmp_path, monkeypatch, capsys):
    """The re-run command of a corrupt metrics.json carries the overrides the run needs, as the 'no
    metrics.json' error's does."""
    from study.compare import main
    from tests.synthetic_runs import write_run

    monkeypatch.chdir(nano_project)
    runs = tmp_path / "runs"
    for s in (1, 2):
        write_run(runs / f"baseline-s{s}", "baseline", s, 4.0)
    (runs / "baseline-s2/metrics.json").write_text("{not json")
    args = [f"study.runs_dir={runs}", f"study.tracking_db={tmp_path / 'm.db'}", f"study.reports_dir={tmp_path / 'r'}",
            "study.variants=[baseline]", "study.seeds=[1,2]", "train.tokens=40960"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "metrics.json is not valid JSON" in err
    cmd = err[err.index("`python -m study.train"):].split("`")[1]
    assert "variant=baseline seed=2" in cmd and f"study.runs_dir={runs}" in cmd and "train.tokens=40960" in cmd


def test_lightnings_sync_dist_advice_is_silenced_for_the_validation_metrics_only():
    """Issue 25 item 5: the exact warning Lightning formats (logger_connector/result.py) for the validation
    metrics, which every rank computes over all windows, is filtered; for any other metric it stays."""
    import warnings

    from lightning.pytorch.utilities.warnings import PossibleUserWarning

    from study.runner.progress import quiet_logs

    def lightning_says(name):
        warnings.warn(f"It is recommended to use `self.log({name!r}, ..., sync_dist=True)` when logging on epoch "
                      f"level in distributed setting to accumulate the metric across devices.",
                      category=PossibleUserWarning)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_logs()
        for name in ("val_loss", "val_perplexity", "val_loss/sotu", "train_loss"):
            lightning_says(name)
    assert [str(w.message).split("'")[1] for w in seen] == ["train_loss"]
