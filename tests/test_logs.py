"""Quiet, informative logs (study/runner/logs.py): a non-terminal log (as under `dvc repro`) shows each run's
optimizer steps of the total, and none of the known noise of Lightning, litdata and MLflow."""
from __future__ import annotations

import csv
import json
import re

import pytest

from conftest import run_cli

NOISE = ("Tip:", "litlogger", "Create an account", "Checkpoint directory", "exists and is not empty", "Epoch 0/-2",
         "LeafSpec", "deprecated", "weights_only", "Creating initial MLflow database tables", "v_num",
         "GPU available", "`Trainer.fit` stopped")


@pytest.mark.slow  # a training process
def test_training_log_shows_steps_of_the_total_and_no_noise(nano_project, tmp_path):
    args = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
            f"study.artifact_dir={tmp_path / 'mlartifacts'}", "variant=baseline", "seed=3", "trainer.threads=1",
            "train.log_every=1"]  # every step's train_loss in MLflow, to check the progress lines against
    r = run_cli(nano_project, "study.train", *args)  # stdout/stderr are pipes, not a terminal
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    for noise in NOISE:
        assert noise not in log, f"{noise!r} in the log:\n{log[-3000:]}"
    steps = [(int(a), int(b), int(c), int(d.replace(",", ""))) for a, b, c, d in
             re.findall(r"^baseline-s3: step (\d+)/(\d+) \((\d+)%\), ([\d,]+) tokens", log, re.M)]
    # nano study: 20,480 tokens in steps of 2,048 = 10 optimizer steps, one line per tenth of the run
    assert steps == [(s, 10, 10 * s, 2048 * s) for s in range(1, 11)], log[-3000:]
    # the last line shows the final evaluation's val_loss (it waited for it), not the previous one
    final = json.loads((tmp_path / "runs/baseline-s3/metrics.json").read_text())["val_loss"]
    last = re.findall(r"^baseline-s3: step 10/10 \(100%\).*$", log, re.M)
    assert len(last) == 1 and f"val_loss {final:.3f}," in last[0], (final, last)
    before = re.findall(r"^baseline-s3: step 9/10 .*val_loss (\d\.\d{3})", log, re.M)
    assert before and before[0] != f"{final:.3f}"  # the previous evaluation's value differs: the test can fail
    assert "baseline-s3: val_loss" in r.stdout  # the run's one-line result
    # each line's train_loss is curve.csv's quantity (the mean of the steps' losses since the previous
    # evaluation), and a step that ends an evaluation shows that evaluation on its own line
    from mlflow import MlflowClient

    with open(tmp_path / "runs/baseline-s3/curve.csv") as f:
        curve = {int(row["step"]): row for row in csv.DictReader(f)}
    assert sorted(curve) == [5, 10]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    run_id = json.loads((tmp_path / "runs/baseline-s3/record.json").read_text())["mlflow_run_id"]
    per_step = {m.step: m.value for m in client.get_metric_history(run_id, "train_loss")}
    assert sorted(per_step) == list(range(1, 11))
    shown = {int(s): (t, v) for s, t, v in re.findall(
        r"^baseline-s3: step (\d+)/10 [^\n]*?train_loss (\d+\.\d{3})(?:, val_loss (\d+\.\d{3}))?", log, re.M)}
    assert sorted(shown) == list(range(1, 11)), log[-3000:]
    for step, (train, val) in shown.items():
        last_eval = max([s for s in curve if s < step], default=0)
        mean = sum(per_step[s] for s in range(last_eval + 1, step + 1)) / (step - last_eval)
        assert train == f"{mean:.3f}", (step, train, mean)
        if step in curve:
            assert train == f"{float(curve[step]['train_loss']):.3f}", (step, train, curve[step])
        evaluated = max([s for s in curve if s <= step], default=None)  # the latest evaluation at that step
        assert val == (f"{float(curve[evaluated]['val_loss']):.3f}" if evaluated else ""), (step, val)


@pytest.mark.slow  # a prepare process
def test_prepare_log_has_no_account_prompt(nano_project, tmp_path):
    r = run_cli(nano_project, "study.prepare", f"data.dir={tmp_path / 'tokens'}")
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert "Create an account" not in log and "lightning.ai" not in log
    assert re.search(r"^prepared [\d,]+ train and [\d,]+ val tokens", r.stdout, re.M)


@pytest.mark.slow  # ~45-80 s: a nano run killed after its first checkpoint, then resumed
def test_a_resumed_run_counts_every_segment_and_does_not_warn_its_loader_is_not_resumable(nano_project, tmp_path):
    """The study's loader resumes from the checkpoint's optimizer step (WindowSampler), so Lightning's
    "dataloader is not resumable" warning is noise; wall_time_s counts the killed segment too."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import torch

    from conftest import env_for, start_until_checkpoint
    from study.runner.loop_state import WALL_CLOCK_KEY

    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "study.train", "variant=baseline", "seed=5", "train.tokens=163840",
           "trainer.progress_bar=false", f"study.runs_dir={runs}", f"study.tracking_db={tmp_path / 'm.db'}",
           f"study.artifact_dir={tmp_path / 'mlartifacts'}"]
    ckpt = runs / "baseline-s5/checkpoints/last.ckpt"
    t_start = time.time()
    proc = start_until_checkpoint(cmd, nano_project, ckpt)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    outer = time.time() - t_start  # segment 1 from outside: interpreter start to the kill
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    killed_at, first = saved["global_step"], saved[WALL_CLOCK_KEY]
    assert 0 < killed_at < 80 and 0 < first < outer, (killed_at, first, outer)
    r = subprocess.run(cmd, cwd=nano_project, env=env_for(nano_project), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming from step {killed_at}" in r.stdout
    log = r.stdout + r.stderr
    assert "not resumable" not in log and "resuming from a checkpoint that ended before the epoch" not in log, log[-3000:]
    record = json.loads((runs / "baseline-s5/record.json").read_text())
    metrics = json.loads((runs / "baseline-s5/metrics.json").read_text())
    last = (80 - killed_at) * 2048 / metrics["tokens_per_s"]  # the resumed segment's own time
    assert record["wall_time_s"] >= first + last - 0.05, (record["wall_time_s"], first, last)
    assert record["wall_time_s"] <= first + last + 0.05  # and nothing else
