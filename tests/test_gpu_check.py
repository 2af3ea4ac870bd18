"""The GPU check (``python -m study.gpu_check``): its CPU rehearsal end to end at nano size, so that the
script is known to work before any GPU time is spent, and the pieces that decide what travels."""
from __future__ import annotations

import csv
import json
import math
import sqlite3
from pathlib import Path

import pytest

from conftest import run_cli
from study.runfolder import read_result  # metrics.json and record.json of a run folder


def _windows(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


@pytest.mark.slow
def test_gpu_check_cpu_runs_every_phase(nano_project, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    r = run_cli(nano_project, "study.gpu_check", "--cpu", "--tokens", str(nano_project / "data" / "tokens"),
                "--out", str(out), "--work", str(work), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == {"results.json", "results.md", "log.txt"}
    res = json.loads((out / "results.json").read_text())
    assert res["phases"]["train"]["status"] == "ok" and res["phases"]["eval"]["status"] == "ok"

    # bench: one eager fp32 row per variant; MFU = tokens/s x FLOPs per token / peak
    rows = {r["variant"]: r for r in res["bench"]}
    assert set(rows) == {"baseline", "nonlinear_q"}
    for row in rows.values():
        assert row["mode"] == "eager" and row["precision"] == "32-true"
        assert row["plain_tokens_per_s"] > 0 and row["lightning_tokens_per_s"] > 0
        assert row["mfu_lightning"] == pytest.approx(row["lightning_tokens_per_s"] * row["flops_per_token"]
                                                     / row["peak_flops"])
    # nano: 2 layers, n_embd 32, block 64, vocab 512 (tied head counted once): 6 N + 12 L C T
    n_linear = 512 * 32 + 2 * (32 * 96 + 32 * 32 + 2 * 32 * 128)
    assert rows["baseline"]["flops_per_token"] == 6 * n_linear + 12 * 2 * 32 * 64
    assert "| baseline | 32-true | eager |" in (out / "results.md").read_text()

    # the training run, read from its own files: 60 steps, the loss fell below its first evaluation and ln(vocab)
    run = work / "runs" / "baseline-s1"
    metrics = read_result(run)
    assert metrics["status"] == "ok" and metrics["steps"] == 60
    with open(run / "curve.csv") as f:
        curve = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    assert [int(c["step"]) for c in curve] == [10, 20, 30, 40, 50, 60]
    assert curve[-1]["val_loss"] < curve[0]["val_loss"] < math.log(512)
    assert curve[-1]["train_loss"] < curve[0]["train_loss"]

    # killed after a checkpoint, resumed from it: the resumed process read only the steps after the
    # checkpoint (32 windows per step, at most 2 steps ahead), in the killed process's order
    s = res["train"]["checkpoint_step"]
    assert s in (10, 20, 30, 40, 50)
    first = _windows(work / "windows-first" / "train-windows-rank0.txt")
    resumed = _windows(work / "windows-resumed" / "train-windows-rank0.txt")
    assert (60 - s) * 32 <= len(resumed) <= (62 - s) * 32
    assert len(first) > s * 32 and first[s * 32:] == resumed[:len(first) - s * 32]
    assert first[:32] != resumed[:32]  # not a restart from step 0
    # one MLflow run, continued by the resumed process and finished
    with sqlite3.connect(work / "mlruns.db") as con:
        runs = con.execute("SELECT run_uuid, name, status FROM runs").fetchall()
    assert runs == [(metrics["mlflow_run_id"], "baseline-s1", "FINISHED")]

    # the final checkpoint at two validation micro-batch sizes: the same loss, the training run's own
    ev = res["eval"]
    assert ev["checkpoint_step"] == 60
    losses = [ev["val_loss"]["32"], ev["val_loss"]["8"]]
    assert abs(losses[0] - losses[1]) < 1e-4
    assert losses[0] == pytest.approx(metrics["val_loss"], abs=1e-4)
    assert res["checks"] == {"mlflow_run_continued": True, "train_finished": True, "loss_fell": True,
                             "resumed_from_checkpoint": True, "curve_spans_the_kill": True,
                             "val_loss_agrees_across_batch_sizes": True}


@pytest.mark.slow  # an interpreter started
def test_gpu_check_without_tokens_says_how_to_prepare(tmp_path):
    r = run_cli(Path(__file__).resolve().parent.parent, "study.gpu_check", "--cpu", "--tokens",
                str(tmp_path / "none"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: no prepared tokens in ")
    assert "make gpu-prep" in r.stderr


def test_split_wheels_carries_only_what_the_image_lacks():
    from study.gpu_check import GpuCheckError, split_wheels

    names = ["PyYAML-6.0.4-cp312-cp312-manylinux2014_x86_64.whl", "sqlalchemy-2.1.9-cp312-cp312-manylinux_2_28_x86_64.whl",
             "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl", "nvidia_cublas-13.0-py3-none-manylinux_2_27_x86_64.whl",
             "mlflow_skinny-3.17.2-py3-none-any.whl", "typing_extensions-4.16.0-py3-none-any.whl",
             "antlr4_python3_runtime-4.9.3-py3-none-any.whl", "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl"]
    keep, drop = split_wheels([Path(n) for n in names])
    assert [p.name.split("-")[0] for p in keep] == ["sqlalchemy", "mlflow_skinny", "antlr4_python3_runtime", "protobuf"]
    assert [p.name.split("-")[0] for p in drop] == ["PyYAML", "torch", "nvidia_cublas", "typing_extensions"]
    with pytest.raises(GpuCheckError, match=r"two versions of \['litdata'\]"):
        split_wheels([Path("litdata-0.2.76-py3-none-any.whl"), Path("litdata-0.2.75-py3-none-any.whl")])


def test_image_blocklist_blocks_what_neither_the_image_nor_the_wheels_hold():
    from study.gpu_check import image_blocklist

    none_carried = image_blocklist(set())
    assert {"omegaconf", "litdata", "dvc", "sqlalchemy"} <= none_carried
    assert not {"torch", "lightning", "numpy", "yaml", "study"} & none_carried
    carried = image_blocklist({"omegaconf", "antlr4-python3-runtime", "litdata", "mlflow-skinny", "sqlalchemy"})
    assert not {"omegaconf", "antlr4", "litdata", "mlflow", "sqlalchemy"} & carried
    assert "dvc" in carried
