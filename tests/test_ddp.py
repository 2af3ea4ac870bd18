"""Multi-device training is the single-process training, split over ranks.

The end-to-end check runs Lightning's own DDP on CPU (``trainer.devices=2 trainer.strategy=ddp``,
gloo, 2 processes: Lightning re-launches ``python -m study.train`` for rank 1) against a
single-process run of the same global batch, and compares the training windows each rank read
(``STUDY_RECORD_WINDOWS``), the train loss and the val loss.  The other tests simulate ranks of the
data pipeline in-process (a StreamingDataset reads its rank from ``distributed_env``), and check the
FSDP gradient clipping at unit level: neither Lightning's FSDPStrategy nor torch's FSDP runs on CPUs.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import env_for
from study.runfolder import read_result  # metrics.json and record.json of a run folder

STEPS = 20
BATCH = 32  # windows per optimizer step: NANO_STUDY's train.batch_tokens=2048 / block_size 64


def _windows(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def _curve(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


@pytest.mark.slow  # ~100 s on the 2-core machine: 3 interpreters, 2 of them DDP ranks, and a new MLflow store
def test_ddp_trains_the_single_process_batches_to_the_same_losses(run_in, nano_project, tmp_path, monkeypatch):
    """2-process CPU DDP with micro-batch 8 x accumulation 2 per rank == 1 process with micro-batch 32:
    every step trains on the same 32 windows, each read by exactly one rank; same train and val loss."""
    import torch
    from mlflow import MlflowClient

    from study.data.loader import RECORD_ENV

    tokens = f"train.tokens={STEPS * BATCH * 64}"
    env = {k: v for k, v in env_for(nano_project).items() if k not in ("RANK", "LOCAL_RANK", "NODE_RANK",
                                                                        "WORLD_SIZE", "SLURM_PROCID")}
    env[RECORD_ENV] = str(tmp_path / "ddp-windows")
    cmd = [sys.executable, "-m", "study.train", tokens, "trainer.threads=1", "trainer.progress_bar=false",
           "trainer.devices=2", "trainer.strategy=ddp", "train.micro_batch_size=8",
           f"study.runs_dir={tmp_path / 'ddp'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
           f"study.artifact_dir={tmp_path / 'mlartifacts'}"]
    threads = torch.get_num_threads()
    with open(tmp_path / "ddp.out", "w") as out, open(tmp_path / "ddp.err", "w") as err:  # a full pipe would block
        # started first: its start-up (2 interpreters) overlaps the single-process run; one MLflow store for both
        proc = subprocess.Popen(cmd, cwd=nano_project, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            monkeypatch.setenv(RECORD_ENV, str(tmp_path / "single-windows"))
            single = run_in(tokens, "trainer.threads=1")  # in-process: no third interpreter start-up
            proc.wait(timeout=600)
        finally:
            torch.set_num_threads(threads)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # both ranks: Lightning's rank 1 is in rank 0's session
                proc.wait()
    out, err = (tmp_path / "ddp.out").read_text(), (tmp_path / "ddp.err").read_text()
    assert proc.returncode == 0, err[-3000:]
    assert out.count("baseline-s1: val_loss") == 1, out  # one report: rank 0's
    assert "sync_dist=True" not in err, err[-3000:]  # issue 25 item 5: no advice that does not apply
    ddp = read_result(tmp_path / "ddp/baseline-s1")

    # (a) each optimizer step: the single-process global batch, split into disjoint per-rank parts
    ref = _windows(tmp_path / "single-windows/train-windows-rank0.txt")
    ranks = [_windows(tmp_path / f"ddp-windows/train-windows-rank{i}.txt") for i in range(2)]
    assert len(ref) == STEPS * BATCH and [len(w) for w in ranks] == [STEPS * BATCH // 2] * 2
    per_rank = BATCH // 2
    for step in range(STEPS):
        a, b = (set(w[step * per_rank:(step + 1) * per_rank]) for w in ranks)
        assert len(a) == len(b) == per_rank and not a & b, step
        assert a | b == set(ref[step * BATCH:(step + 1) * BATCH]), step
    assert set(ranks[0]) | set(ranks[1]) == set(ref) and len(set(ref)) == STEPS * BATCH

    # (b) the same losses at every evaluation (steps 5, 10, 15, 20)
    assert single["steps"] == ddp["steps"] == STEPS
    rows_1 = _curve(tmp_path / "runs/baseline-s1/curve.csv")
    rows_2 = _curve(tmp_path / "ddp/baseline-s1/curve.csv")
    assert [r["step"] for r in rows_1] == [r["step"] for r in rows_2] == [5, 10, 15, 20]
    for r1, r2 in zip(rows_1, rows_2):
        assert abs(r1["train_loss"] - r2["train_loss"]) < 1e-4, (r1, r2)
        assert abs(r1["val_loss"] - r2["val_loss"]) < 1e-5, (r1, r2)  # val: same global windows on both
    assert abs(single["val_loss"] - ddp["val_loss"]) < 1e-5

    # (c) rank 0 alone tracked and wrote the run: one MLflow run per training, named in run.json
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(x.info.run_id for x in runs) == sorted([single["mlflow_run_id"], ddp["mlflow_run_id"]])
    assert all(x.info.status == "FINISHED" for x in runs)
    state = json.loads((tmp_path / "ddp/baseline-s1/checkpoints/run.json").read_text())
    assert state["mlflow_run_id"] == ddp["mlflow_run_id"] and state["completed"]


# -- the data pipeline on simulated ranks ---------------------------------------------------------------
def _sampler(nano_project: Path, world: int, rank: int, micro: int, start_step: int = 0, seed: int = 1):
    """The train batch sampler of rank ``rank`` of ``world`` (global batch BATCH windows)."""
    from study.data.loader import WindowSampler
    from study.data.windows import split_windows

    n = split_windows(nano_project / "data/tokens/train", 65)
    return WindowSampler(n, BATCH, micro, world, rank, seed, start_step=lambda: start_step)


def _steps(nano_project: Path, world: int, micro: int, n: int, start_step: int = 0) -> list[set]:
    """The window indices of the next n optimizer steps, read from every rank's sampler in micro-batches."""
    its = [iter(_sampler(nano_project, world, r, micro, start_step)) for r in range(world)]
    accum = BATCH // (world * micro)
    return [{w for it in its for _ in range(accum) for w in next(it)} for _ in range(n)]


def test_every_world_size_reads_the_single_process_order(nano_project):
    """W ranks x accumulation read, step by step, exactly the global batches of one process: consecutive
    BATCH windows of the seed's permutation of the whole split."""
    from study.data.loader import window_order
    from study.data.windows import split_windows

    n = split_windows(nano_project / "data/tokens/train", 65)
    order = window_order(n, 1, 0).tolist()
    ref = [set(order[i * BATCH:(i + 1) * BATCH]) for i in range(6)]
    assert _steps(nano_project, 1, BATCH, 6) == ref
    for world, micro in ((2, 16), (2, 8), (4, 8), (4, 2), (1, 8)):
        assert _steps(nano_project, world, micro, 6) == ref, (world, micro)
    assert sorted(order) == list(range(n))  # a permutation of every window of the split


def test_order_resumes_from_the_step_on_any_world_size(nano_project):
    """Where a rank starts is a function of the optimizer step only: 1 -> 2 ranks, 2 -> 4 ranks, and across
    the epoch boundary (epoch e+1 uses a new permutation) all continue with the next global batch."""
    from study.data.loader import window_order
    from study.data.windows import split_windows

    per_epoch = split_windows(nano_project / "data/tokens/train", 65) // BATCH
    whole = _steps(nano_project, 1, BATCH, 12)
    assert _steps(nano_project, 2, 8, 4, start_step=3) == whole[3:7]
    assert _steps(nano_project, 4, 8, 3, start_step=9) == whole[9:12]
    n = split_windows(nano_project / "data/tokens/train", 65)
    second = window_order(n, 1, 1).tolist()
    assert _steps(nano_project, 2, 8, 1, start_step=per_epoch + 2) == [set(second[2 * BATCH:3 * BATCH])]
    assert second != window_order(n, 1, 0).tolist() and second != window_order(n, 2, 1).tolist()


def test_checkpoint_of_another_order_is_refused(nano_project):
    from study.data import DataError
    from study.data.datamodule import TokenDataModule

    dm = TokenDataModule(nano_project / "data/tokens", 64, 8, 1, n_val_windows=16, val_micro_batch_size=8)
    dm.load_state_dict(dm.state_dict())
    with pytest.raises(DataError, match="delete the run's checkpoints"):
        dm.load_state_dict({"train_loader": {"epoch": 1, "windows_done": 64}})
    with pytest.raises(DataError, match="delete the run's checkpoints"):
        dm.load_state_dict({**dm.state_dict(), "data_seed": 2})


def test_too_few_windows_for_one_step_is_refused_before_training(nano_project):
    from study.data import DataError
    from study.data.loader import WindowSampler

    with pytest.raises(DataError, match="fewer than one optimizer step of 400: lower train.batch_tokens"):
        WindowSampler(399, 400, 25)


def test_validation_windows_do_not_depend_on_the_rank(nano_project):
    """litdata's len() is this rank's share under DDP; the fixed validation set counts the whole split."""
    from litdata import StreamingDataset, TokensLoader
    from litdata.utilities.env import _DistributedEnv

    from study.data.windows import split_windows

    val = nano_project / "data/tokens/val"
    ds = StreamingDataset(str(val), item_loader=TokensLoader(block_size=65))
    n = len(ds)
    assert split_windows(val, 65) == n
    ds = StreamingDataset(str(val), item_loader=TokensLoader(block_size=65))
    ds.distributed_env = _DistributedEnv(2, 1, 1)
    assert len(ds) < n  # what val_windows used to count under DDP


# -- launch, FSDP --------------------------------------------------------------------------------------
@pytest.mark.parametrize("env,rank", [({}, 0), ({"LOCAL_RANK": "1"}, 1), ({"RANK": "5", "LOCAL_RANK": "1"}, 5),
                                      ({"NODE_RANK": "1", "LOCAL_RANK": "1"}, 3), ({"NODE_RANK": "1"}, 2),
                                      ({"SLURM_PROCID": "3"}, 3), ({"LOCAL_RANK": "0", "SLURM_PROCID": "3"}, 0)])
def test_launch_rank_before_the_trainer(monkeypatch, nano_project, env, rank):
    from study.config import load_config
    from study.runner.world import launch_rank

    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = load_config(["trainer.devices=2", "trainer.num_nodes=2", "trainer.strategy=ddp"], nano_project)
    assert launch_rank(cfg.trainer) == rank


class _FakeFSDPRoot:
    """Stands in for the root FullyShardedDataParallel module (torch's FSDP needs a GPU)."""

    def __init__(self):
        self.calls = []

    def clip_grad_norm_(self, max_norm):
        self.calls.append(max_norm)


def test_fsdp_clips_the_global_norm_with_the_root_module(nano_project):
    """Lightning's FSDP precision plugin refuses norm clipping; GPTModule clips through the root FSDP module's
    clip_grad_norm_ (the norm over all shards), and keeps Lightning's clipping on every other strategy."""
    import torch
    from lightning.pytorch.plugins.precision import FSDPPrecision, Precision
    from lightning.pytorch.strategies import FSDPStrategy, SingleDeviceStrategy
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from study.config import load_config
    from study.modeling.lit_module import GPTModule

    with pytest.raises(MisconfigurationException, match="norm"):
        FSDPPrecision("32-true").clip_grad_by_norm(None, 1.0)  # the hole GPTModule works around

    module = GPTModule(load_config(["model=nano"], nano_project))
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    strategy, root = FSDPStrategy(), _FakeFSDPRoot()
    strategy.model = root
    module.trainer = type("Trainer", (), {"strategy": strategy, "gradient_clip_val": 0.5,
                                          "gradient_clip_algorithm": None})()
    module.configure_gradient_clipping(opt, 0.5, "norm")
    module.configure_gradient_clipping(opt, 0.0, None)  # train.grad_clip=0: no clipping
    assert root.calls == [0.5]
    with pytest.raises(ValueError, match="only 'norm'"):
        module.configure_gradient_clipping(opt, 0.5, "value")

    x = torch.randint(0, 512, (2, 65))
    module.model(x[:, :-1], x[:, 1:])[1].backward()
    precision = Precision()
    module.trainer = type("Trainer", (), {"strategy": SingleDeviceStrategy("cpu"), "gradient_clip_val": 0.5,
                                          "gradient_clip_algorithm": None, "precision_plugin": precision})()
    module.configure_gradient_clipping(opt, 0.5, None)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters() if p.grad is not None]))
    assert norm == pytest.approx(0.5, rel=1e-4)


def test_fsdp_on_cpu_is_refused_with_the_fix(nano_project):
    from study.config import ConfigError, load_config
    from study.runner.world import make_strategy

    cfg = load_config(["trainer.strategy=fsdp", "trainer.devices=2"], nano_project)
    with pytest.raises(ConfigError, match="trainer.strategy=fsdp needs GPUs.*trainer.strategy=ddp on CPUs"):
        make_strategy(cfg.trainer)
