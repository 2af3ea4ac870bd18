"""The launcher group without a cluster: the slurm launcher resolved against the trainer (one task per device under
ddp, refused in one line when they disagree), submitit's parameters, the stage's live line, and --dry-run (the
arrays a stage would submit, with GPU-hours, and nothing trained)."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from conftest import ROOT, env_for
from study.config import ConfigError, load_config


def test_the_local_launcher_is_the_default_and_keeps_study_jobs(monkeypatch):
    from study.config.launcher import resolve_launcher

    monkeypatch.chdir(ROOT)
    cfg = load_config([], ROOT)
    res = resolve_launcher(cfg)
    assert (cfg.launcher.name, res["executor"], res["tasks_per_node"], cfg.study.jobs) == ("local", "local", 1, 2)


def test_ddp_on_slurm_gives_one_task_per_gpu(monkeypatch):
    from study.config.launcher import resolve_launcher
    from study.orchestration.launch import slurm_parameters

    monkeypatch.chdir(ROOT)
    cfg = load_config(["launcher=slurm", "trainer=ddp", "launcher.gpus_per_node=8", "launcher.partition=gpu",
                       "launcher.mem_gb=64", "launcher.setup=[module load cuda]"], ROOT)
    res = resolve_launcher(cfg)
    assert (res["tasks_per_node"], res["gpus_per_node"], res["devices"], res["nodes"]) == (8, 8, 8, 1)
    p = slurm_parameters(res, ROOT, "study-test")
    assert (p["ntasks_per_node"], p["gpus_per_node"], p["partition"], p["mem"], p["time"]) == (8, 8, "gpu", "65536M", 60)
    assert p["setup"][0] == f"cd {ROOT}" and p["setup"][-1] == "module load cuda"
    two_nodes = resolve_launcher(load_config(["launcher=slurm", "trainer=ddp", "launcher.gpus_per_node=4",
                                              "trainer.num_nodes=2"], ROOT))
    assert (two_nodes["nodes"], two_nodes["tasks_per_node"]) == (2, 4)


@pytest.mark.parametrize("over, message", [
    (["trainer=ddp", "launcher.gpus_per_node=8", "launcher.tasks_per_node=4"],
     r"^launcher.tasks_per_node=4 disagrees with trainer.devices=-1 \(strategy ddp\): Lightning's SLURM environment "
     r"runs one task per device under ddp: set launcher.tasks_per_node=8 \(or null\)$"),
    (["trainer=ddp"], r"^trainer.devices=-1 \(every GPU\) under launcher=slurm needs the GPUs of one job: set "
                      r"launcher.gpus_per_node"),
    (["trainer=ddp", "trainer.devices=4", "launcher.gpus_per_node=8"],
     r"^launcher.gpus_per_node=8 disagrees with trainer.devices=4: 4 GPU\(s\) per job would idle"),
    (["trainer=gpu", "launcher.gpus_per_node=0"], r"needs launcher.gpus_per_node >= 1, got 0"),
    (["trainer=ddp", "launcher.gpus_per_node=8", "launcher.nodes=2"], r"^launcher.nodes=2 disagrees with trainer.num_nodes=1"),
    (["launcher.timeout_min=0"], r"^launcher.timeout_min=0 must be >= 1$"),
    (["launcher.mfu=1.5"], r"^launcher.mfu=1.5 must be in \(0, 1\]"),
    (["launcher.executor=pbs"], r"^launcher.executor='pbs': choose one of \['local', 'slurm'\]"),
    (["trainer.threads=4", "launcher.cpus_per_task=2"], r"^trainer.threads=4 is more than launcher.cpus_per_task=2"),
])
def test_a_launcher_that_disagrees_with_its_trainer_is_refused_in_one_line(monkeypatch, over, message):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match=message) as e:
        load_config(["launcher=slurm", *over], ROOT)
    assert "\n" not in str(e.value)


def test_the_launcher_is_no_setting_of_a_run(monkeypatch):
    """Same resume key and config.json on either launcher: a run trained here is reused on the cluster."""
    from study.config import resume_config
    from study.runfolder import recorded_config

    monkeypatch.chdir(ROOT)
    here, there = load_config([], ROOT), load_config(["launcher=slurm", "launcher.partition=gpu"], ROOT)
    assert resume_config(here) == resume_config(there)
    assert recorded_config(here, "d") == recorded_config(there, "d") and "launcher" not in recorded_config(here, "d")


def test_the_live_line_counts_runs_lost_points_and_time_left(tmp_path):
    from study.orchestration.live_line import StageLine

    runs = [tmp_path / f"r{i}" for i in range(4)]
    for d, status in zip(runs[:3], ("ok", "diverged", "ok")):
        d.mkdir()
        (d / "metrics.json").write_text("{}")
        (d / "record.json").write_text(json.dumps({"status": status}))
    out = io.StringIO()
    line = StageLine("test", runs, reused=1, stream=out, tty=False)
    line.t0 -= 100  # 100 s ago; two runs finished since: 50 s each, one left
    text = line.update("slurm array 7: 1 running")
    assert text.startswith("test: 3/4 runs (1 lost), 01:40 elapsed, ~00:50 left | slurm array 7: 1 running"), text
    assert out.getvalue().strip() == text
    tty = io.StringIO()
    StageLine("test", runs, reused=3, stream=tty, tty=True).update("local: 1 running")
    assert tty.getvalue().startswith("\r\033[Ktest: 3/4 runs (1 lost), 00:00 elapsed, ~? left | local: 1 running")


def test_the_live_line_does_not_count_a_launched_runs_old_result(tmp_path):
    """A run re-trained under new settings still holds its old metrics.json until its training replaces it: the
    line counts it as finished only once that file is newer than the launch."""
    import os
    import time

    from study.orchestration.live_line import StageLine

    runs = [tmp_path / f"r{i}" for i in range(3)]
    for d in runs:
        d.mkdir()
        (d / "metrics.json").write_text("{}")
        os.utime(d / "metrics.json", (time.time() - 3600, time.time() - 3600))  # written an hour ago
    line = StageLine("test", runs, reused=1, stream=io.StringIO(), tty=False, launched=runs[1:])
    assert line.text().startswith("test: 1/3 runs (0 lost)")
    (runs[1] / "metrics.json").write_text("{}")  # r1's new result
    os.utime(runs[1] / "metrics.json", (line.t0 + 1, line.t0 + 1))
    assert line.text().startswith("test: 2/3 runs (0 lost)")
    (runs[2] / "metrics.json").unlink()  # r2's training started: its old result is gone
    assert line.text().startswith("test: 2/3 runs (0 lost)")


@pytest.mark.slow  # three stages' dry runs, each a process (~20 s)
def test_dry_run_prints_the_array_and_its_gpu_hours_and_trains_nothing(nano_project, tmp_path):
    from tests.test_compare_checks import study_params

    import yaml

    params = study_params(nano_project, tmp_path)
    data = yaml.safe_load(params.read_text())
    data["arms"]["nlqd"]["lr"], data["tuned"] = 0.003, {"lr": {}}
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    got = subprocess.run([sys.executable, "-m", "study.test_runs", "--params", str(params), "--dry-run",
                          "launcher=slurm", "launcher.partition=gpu", "launcher.cpus_per_task=1", "study.max_seeds=7"],
                         cwd=nano_project, env={**env_for(nano_project), "DVC_EXP_NAME": "test"}, capture_output=True,
                         text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    lines = got.stdout.splitlines()
    assert lines[0].startswith("test: would submit 1 SLURM job array of 10 run(s) (0 finished, reused): partition gpu; "
                               "each job 1 node(s) x 1 task(s), 0 GPU(s)/node, 1 CPU(s)/task, default memory, 60 min"), lines
    runs = [x for x in lines if x.startswith("  ")]
    assert len(runs) == 10 and all(" FLOP/token x 10,922 tokens = " in x for x in runs), runs  # 4 steps of 2,048 + 8,192 / 3
    total = [x for x in lines if " FLOP in all = " in x][0]  # a CPU trainer: priced in core-hours, not GPU-hours
    flop, hours = float(total.split(": ", 1)[1].split(" FLOP")[0]), float(total.split(" = ")[1].split(" ")[0])
    assert total == (f"test: {flop:.3g} FLOP in all = {hours:.3g} CPU-hours (core-hours) at 28 GFLOP/s per "
                     f"core (a CPU trainer: trainer.accelerator=cpu)"), total
    assert hours == pytest.approx(flop / 28e9 / 3600, rel=0.01)
    assert all(x.endswith(" CPU-h") for x in runs) and "GPU" not in total
    assert lines[-1] == ("test: then Stein's second stage: up to 2 more seed(s) per arm (study.max_seeds=7), in one "
                         "more batch, as the first stage's spread asks")
    assert not (tmp_path / "runs").exists()
    gpu = subprocess.run([sys.executable, "-m", "study.test_runs", "--params", str(params), "--dry-run", "launcher=slurm",
                          "trainer=gpu", "launcher.gpus_per_node=1", "launcher.cpus_per_task=1"], cwd=nano_project,
                         env={**env_for(nano_project), "DVC_EXP_NAME": "test"}, capture_output=True, text=True, timeout=600)
    assert gpu.returncode == 0, gpu.stderr[-2000:]
    total = [x for x in gpu.stdout.splitlines() if " FLOP in all = " in x][0]  # a GPU trainer: GPU-hours
    flop, hours = float(total.split(": ", 1)[1].split(" FLOP")[0]), float(total.split(" = ")[1].split(" ")[0])
    assert total == f"test: {flop:.3g} FLOP in all = {hours:.3g} GPU-hours at 40% MFU of 989.4 TFLOP/s per GPU"
    assert hours == pytest.approx(flop / (0.4 * 989.4e12) / 3600, rel=0.01)


def test_a_gpu_trainer_gets_every_gpu_one_slot_each_and_jobs_per_gpu_share_one(monkeypatch):
    """On a GPU machine the local launcher runs one training per GPU (each its own CUDA_VISIBLE_DEVICES), or
    launcher.jobs_per_gpu per GPU, whatever study.jobs says; a DDP training of 2 devices takes 2 GPUs; no GPU is one
    line; a CPU trainer has no slots."""
    from study.config.launcher import gpu_slots

    gpu = ["trainer=gpu", "trainer.precision=bf16-mixed"]
    assert gpu_slots(load_config(["trainer=cpu"], ROOT), ["0", "1"]) is None
    assert gpu_slots(load_config(gpu, ROOT), ["0", "1", "2"]) == ["0", "1", "2"]
    assert gpu_slots(load_config([*gpu, "launcher.jobs_per_gpu=3"], ROOT), ["4", "7"]) == ["4", "7"] * 3
    two = load_config([*gpu, "trainer.devices=2", "trainer.strategy=ddp"], ROOT)
    assert gpu_slots(two, ["0", "1", "2", "3", "4"]) == ["0,1", "2,3"]
    with pytest.raises(ConfigError, match=r"shows no GPU .*use trainer=cpu"):
        gpu_slots(load_config(gpu, ROOT), [])
    with pytest.raises(ConfigError, match=r"trainer.devices=2 GPUs but this machine shows 1 \(0\)"):
        gpu_slots(two, ["0"])
    with pytest.raises(ConfigError, match="launcher.jobs_per_gpu=0 must be >= 1"):
        gpu_slots(load_config([*gpu, "launcher.jobs_per_gpu=0"], ROOT), ["0"])


def test_the_local_launcher_gives_each_training_its_gpu_slot(tmp_path, monkeypatch):
    """The real launcher with a stand-in training (a process that records its CUDA_VISIBLE_DEVICES and sleeps):
    two GPUs at two trainings each run four at once, each GPU never holding more than two."""
    import study.orchestration.launch as launch_module
    from study.orchestration.live_line import StageLine

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    cfg = load_config(["trainer=gpu", "trainer.precision=bf16-mixed", "launcher.jobs_per_gpu=2",
                       f"launcher.log_dir={tmp_path / 'logs'}"], ROOT)
    probe = ("import os, sys, time; d = sys.argv[1]; os.makedirs(d, exist_ok=True); "
             "open(os.path.join(d, 'gpu'), 'w').write(os.environ['CUDA_VISIBLE_DEVICES'] + ' ' + str(time.time())); "
             "time.sleep(1.5); open(os.path.join(d, 'end'), 'w').write(str(time.time()))")
    monkeypatch.setattr(launch_module, "train_argv", lambda params, overrides: [sys.executable, "-c", probe,
                                                                                     overrides[0]])
    runs = [tmp_path / f"run{i}" for i in range(6)]
    todo = [(d, [str(d)]) for d in runs]
    failed = launch_module.launch(todo, tmp_path, None, cfg, StageLine("test", runs, reused=0, launched=runs))
    got = [(d / "gpu").read_text().split() for d in runs]
    assert failed == [] and sorted({g for g, _ in got}) == ["3", "5"]
    spans = [(g, float(t0), float((d / "end").read_text())) for d, (g, t0) in zip(runs, got)]
    for g, t0, _ in spans:  # at any training's start, at most 2 trainings of its GPU run (itself included)
        assert sum(1 for h, a, b in spans if h == g and a <= t0 < b) <= 2
