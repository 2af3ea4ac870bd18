"""Quiet, informative logs (study/progress.py): a non-terminal log (as under `dvc repro`) shows each run's
optimizer steps of the total, and none of the known noise of Lightning, litdata and MLflow."""
from __future__ import annotations

import json
import re

from conftest import run_cli

NOISE = ("Tip:", "litlogger", "Create an account", "Checkpoint directory", "exists and is not empty", "Epoch 0/-2",
         "LeafSpec", "deprecated", "weights_only", "Creating initial MLflow database tables", "v_num",
         "GPU available", "`Trainer.fit` stopped")


def test_training_log_shows_steps_of_the_total_and_no_noise(nano_project, tmp_path):
    args = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
            f"study.artifact_dir={tmp_path / 'mlartifacts'}", "variant=baseline", "seed=3", "trainer.threads=1"]
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


def test_prepare_log_has_no_account_prompt(nano_project, tmp_path):
    r = run_cli(nano_project, "study.prepare", f"data.dir={tmp_path / 'tokens'}")
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert "Create an account" not in log and "lightning.ai" not in log
    assert re.search(r"^prepared [\d,]+ train and [\d,]+ val tokens", r.stdout, re.M)
