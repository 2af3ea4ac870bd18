"""The MLflow store under failure: a run that fails, is killed or dies ends FAILED or KILLED (never RUNNING), a
resumed run logs each step once, two writers share the store, a store that cannot be used is refused before the
run starts, MLFLOW_TRACKING_URI is honoured."""
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

from study.runfolder import read_result
from conftest import env_for, one_line_error, start_until_checkpoint


def _cmd(runs: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "study.train", "variant=baseline", "seed=3", "train.tokens=102400",
            "train.log_every=1", "trainer.progress_bar=false", f"study.runs_dir={runs}", f"study.tracking_db={db}",
            "trainer.threads=1", *extra]  # one thread in the process and in-process alike: the same numerics, resumed


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


def test_failure_inside_a_run_marks_mlflow_failed(nano_project, tmp_path, monkeypatch, capsys):
    """A data error raised after the MLflow run has started: exit 2, run FAILED, no metrics.json.  A
    validation split too small for train.val_tokens is refused before anything starts."""
    from mlflow import MlflowClient

    import study.data.datamodule
    from study.data import DataError
    from study.train import main

    monkeypatch.chdir(nano_project)
    db = tmp_path / "m.db"
    args = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={db}", "trainer.progress_bar=false"]
    assert main([*args, "train.val_tokens=100000000"]) == 2
    assert "lower train.val_tokens to at most" in capsys.readouterr().err
    assert not db.exists() and not (tmp_path / "runs/baseline-s1/checkpoints").exists()

    def broken(*a, **k):
        raise DataError("the validation chunk is unreadable: re-run `python -m study.prepare`")

    monkeypatch.setattr(study.data.datamodule, "fixed_val_windows", broken)
    assert main(args) == 2 and "the validation chunk is unreadable" in capsys.readouterr().err
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"] and runs[0].info.end_time is not None
    assert not (tmp_path / "runs/baseline-s1/metrics.json").exists()


def test_a_failure_while_logging_the_run_settings_ends_the_mlflow_run_failed(nano_project, tmp_path, monkeypatch, capsys):
    """An exception between the MLflow run's creation and training (logging the params, config.yaml, run.json)
    ends that run FAILED with an end time, never RUNNING."""
    from mlflow import MlflowClient

    import study.train
    from study.config import StudyError

    def broken(*a, **k):
        raise StudyError("the artifact store is read-only: fix study.artifact_dir")

    monkeypatch.chdir(nano_project)
    monkeypatch.setattr(study.train, "log_text", broken, raising=False)
    import study.runner.tracking
    monkeypatch.setattr(study.runner.tracking, "log_text", broken)
    db = tmp_path / "m.db"
    assert study.train.main([f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={db}",
                             "trainer.progress_bar=false"]) == 2
    assert "the artifact store is read-only" in capsys.readouterr().err
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"] and runs[0].info.end_time is not None


@pytest.mark.slow  # training processes
def test_two_writers_share_the_store(nano_project, tmp_path):
    """Two trainings at once on one SQLite store lose no run and no metric."""
    from mlflow import MlflowClient

    db = tmp_path / "shared.db"
    procs = [subprocess.Popen([sys.executable, "-m", "study.train", f"variant={v}", "seed=1",
                               "trainer.progress_bar=false", f"study.runs_dir={tmp_path / 'runs'}",
                               f"study.tracking_db={db}", "train.log_every=1"],
                              cwd=nano_project, env=env_for(nano_project), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for v in ("baseline", "identity_q")]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()[-2000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.info.run_name for r in runs) == ["baseline-s1", "identity_q-s1"]
    for r in runs:
        assert r.info.status == "FINISHED"
        steps = read_result(tmp_path / f"runs/{r.info.run_name}")["steps"]
        assert len(client.get_metric_history(r.info.run_id, "train_loss")) == steps
        curve = (tmp_path / f"runs/{r.info.run_name}/curve.csv").read_text().splitlines()
        assert len(client.get_metric_history(r.info.run_id, "val_loss")) == len(curve) - 1


# -- study.tracking_db that cannot hold the store: refused before anything is written ------------------
@pytest.mark.parametrize("case", ["inside a file", "a folder", "not sqlite", "below a file"])
def test_unusable_tracking_db_is_refused_before_the_run_starts(nano_project, tmp_path, monkeypatch, capsys, case):
    from study.train import main

    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    db = {"inside a file": notes / "mlruns.db", "a folder": tmp_path,
          "not sqlite": notes, "below a file": notes / "a" / "b" / "mlruns.db"}[case]
    runs = tmp_path / "runs"
    finished = runs / "baseline-s1"
    finished.mkdir(parents=True)
    (finished / "metrics.json").write_text('{"val_loss": 4.0}')  # an earlier result in the run's folder
    monkeypatch.chdir(nano_project)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rc = main([f"study.runs_dir={runs}", f"study.tracking_db={db}", "variant=baseline", "seed=1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert f"study.tracking_db={db}" in err and "writable file path" in err, err
    assert notes.read_text() == "keep me" and notes.is_file()
    assert (finished / "metrics.json").read_text() == '{"val_loss": 4.0}'  # nothing lost
    assert sorted(p.name for p in finished.iterdir()) == ["metrics.json"]  # no lock, no checkpoint


# -- MLFLOW_TRACKING_URI --------------------------------------------------------------------------
def test_tracking_uri_honours_mlflow_stores_or_refuses(nano_project, tmp_path, monkeypatch, capsys):
    from study.config import ConfigError, load_config
    from study.runfolder.store import tracking_uri
    from study.train import main

    study = load_config([], nano_project).study
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert tracking_uri(nano_project, study) == f"sqlite:///{nano_project.resolve() / 'mlruns.db'}"
    for uri in (f"sqlite:///{tmp_path}/x.db", "postgresql://u@db/mlflow", "http://127.0.0.1:5000", "databricks"):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert tracking_uri(nano_project, study) == uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:./mlruns")
    with pytest.raises(ConfigError, match="MLFLOW_ALLOW_FILE_STORE=true"):
        tracking_uri(nano_project, study)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert tracking_uri(nano_project, study) == "file:./mlruns"
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    monkeypatch.chdir(nano_project)
    for uri, words in (("file:./mlruns", "file store"), ("foo://bar", "no tracking store")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert main([f"study.runs_dir={tmp_path / 'runs'}"]) == 2
        err = one_line_error(capsys)
        assert f"MLFLOW_TRACKING_URI={uri}" in err and words in err
    assert not (tmp_path / "runs").exists() and not (nano_project / "mlruns").exists()


def test_lightnings_sync_dist_advice_is_silenced_for_the_validation_metrics_only():
    """Issue 25 item 5: the exact warning Lightning formats (logger_connector/result.py) for the validation
    metrics, which every rank computes over all windows, is filtered; for any other metric it stays."""
    import warnings

    from lightning.pytorch.utilities.warnings import PossibleUserWarning

    from study.runner.logs import quiet_logs

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
