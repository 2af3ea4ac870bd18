"""The stages on a real SLURM: a one-node cluster on this machine (tests/slurm_cluster.py: Debian's slurm-wlm and
munge, no cgroups), started for this module and stopped after; skipped with a one-line reason where it cannot run.

On the nano model: the tuning and the test stage through ``launcher=slurm`` give run folders whose losses equal the
local launcher's to the last digit, as job arrays SLURM itself lists (squeue while they run, the job completion log
after); a job cancelled mid-run and submitted again, and a job requeued by submitit's preemption signal (USR2), end
identical to an uninterrupted run; a job that fails is named by its SLURM job id and log."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

import slurm_cluster
from conftest import env_for

pytestmark = pytest.mark.slow


slurm = pytest.fixture(scope="module")(slurm_cluster.started_cluster)  # a one-node SLURM for this module


def _params(project: Path, tmp: Path) -> Path:
    """The nano study of tests/test_compare_checks.py with both arms at a fixed lr, and a tuning of ``tb`` (the
    baseline, lr tuned) on one batch of 3 lrs x 2 seeds."""
    from tests.test_compare_checks import study_params

    params = study_params(project, tmp)
    data = yaml.safe_load(params.read_text())
    data["arms"]["nlqd"]["lr"], data["tuned"] = 0.003, {"lr": {}}
    data["study"].update(max_seeds=5, jobs=2)
    data["trainer"]["threads"] = 1
    data["arms"]["tb"] = {"variant": "baseline", "overrides": [], "lr": None, "description": ""}
    data["tune"].update(arms=["tb"], points=3, max_points=3, centre=0.003)
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    return params


SLURM = ["launcher=slurm", "launcher.cpus_per_task=1", "launcher.array_parallelism=2", "launcher.poll_s=1"]


def _stage(project: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    """A stage on its own params.yaml (not conf/ composed: as inside `dvc exp run`)."""
    return subprocess.run([sys.executable, "-m", *args], cwd=project, env={**env_for(project), "DVC_EXP_NAME": "test"},
                          capture_output=True, text=True, timeout=timeout)


def _losses(folder: Path) -> dict[str, float | None]:
    return {str(p.parent.relative_to(folder)): json.loads(p.read_text()).get("val_loss")
            for p in sorted(folder.rglob("metrics.json"))}


def _watch_queue(seen: list, stop: threading.Event, env: dict) -> None:
    while not stop.is_set():
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %j %T"], env=env, capture_output=True, text=True).stdout
        seen += [x.split() for x in out.splitlines() if x.strip()]
        time.sleep(0.5)


def test_tuning_and_test_stage_on_slurm_equal_the_local_launcher(slurm, nano_project, tmp_path):
    local, cluster = tmp_path / "local", tmp_path / "slurm"
    for d in (local, cluster):
        d.mkdir()
    p_local, p_slurm = _params(nano_project, local), _params(nano_project, cluster)
    seen, stop = [], threading.Event()
    watcher = threading.Thread(target=_watch_queue, args=(seen, stop, slurm.env), daemon=True)
    watcher.start()
    try:
        tune = _stage(nano_project, "study.tune", "--arm", "tb", "--params", str(p_slurm), *SLURM,
                      f"launcher.log_dir={cluster / 'logs'}")
        test = _stage(nano_project, "study.test_runs", "--params", str(p_slurm), *SLURM, f"launcher.log_dir={cluster / 'logs'}")
    finally:
        stop.set()
        watcher.join()
    assert tune.returncode == 0 and test.returncode == 0, (tune.stderr + test.stderr)[-3000:]
    for stage in ("study.tune", "study.test_runs"):
        args = ["--arm", "tb"] if stage == "study.tune" else []
        here = _stage(nano_project, stage, *args, "--params", str(p_local), f"launcher.log_dir={local / 'logs'}")
        assert here.returncode == 0, here.stderr[-3000:]
    for runs in ("runs_tune", "runs/test"):
        got, want = _losses(cluster / runs), _losses(local / runs)
        assert len(got) == (6 if runs == "runs_tune" else 10) and got == want, (got, want)
    assert (json.loads((cluster / "runs_tune/tb/tuning.json").read_text())["points"]
            == json.loads((local / "runs_tune/tb/tuning.json").read_text())["points"])
    # SLURM itself listed the arrays while they ran, and its job completion log has every job, COMPLETED
    arrays = {x[0].split("_")[0] for x in seen if x[1].startswith("study-")}
    assert len(arrays) == 2 and {x[1] for x in seen} >= {"study-tune-tb", "study-test"}, seen[:20]
    done = [x for x in slurm.jobcomp_lines() if "Name=study-" in x]
    assert len(done) == 16 and all("JobState=COMPLETED" in x and "ExitCode=0:0" in x for x in done), done[-3:]
    # one live line for the stage; each training's own lines in its log
    assert "test: 10/10 runs (0 lost)" in test.stderr and "| slurm array " in test.stderr
    assert "val_loss" not in test.stdout.replace("seed", "")  # per-run lines are in the logs, not the stage's output
    logs = sorted((cluster / "logs").glob("*_0_log.out"))
    assert len(logs) == 16 and any("val_loss" in p.read_text() for p in logs)


def _one_run(tmp: Path, tokens: int = 40960) -> list[str]:
    return [f"study.runs_dir={tmp / 'runs'}", f"study.tracking_db={tmp / 'm.db'}", f"study.artifact_dir={tmp / 'art'}",
            "trainer.threads=1", "variant=baseline", "seed=3", "arm.lr=0.003", "study.group=test/x",
            f"train.tokens={tokens}", "train.eval_every=5"]


def _launch_one(project: Path, over: list[str], extra: list[str], interrupt=None):
    """ensure_runs of one run on the slurm launcher, in this process; ``interrupt(job_id)`` runs in a thread once the
    run has written its first checkpoint."""
    from study.orchestration.ensure import ensure_runs

    over = [*over, *SLURM, *extra]
    d = project / "unused"
    if interrupt is not None:
        from study.config import load_config, run_dir

        cfg = load_config(over, project)
        d = run_dir(project, cfg, cfg.variant.name, cfg.seed)

        def watch():
            ckpt = d / "checkpoints" / "last.ckpt"
            while not ckpt.exists():
                time.sleep(0.2)
            out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True).stdout.split()
            interrupt(out[0])
        threading.Thread(target=watch, daemon=True).start()
    return ensure_runs([over], project, None, jobs=1, label="one")


def test_a_job_cancelled_mid_run_and_submitted_again_ends_identical(slurm, nano_project, tmp_path, monkeypatch):
    from study.config import StudyError
    from study.orchestration.ensure import ensure_runs

    monkeypatch.chdir(nano_project)
    whole = ensure_runs([_one_run(tmp_path / "whole")], nano_project, None, jobs=2, label="whole")  # local, uninterrupted
    over = _one_run(tmp_path / "cut")
    logs = [f"launcher.log_dir={tmp_path / 'logs'}"]
    with pytest.raises(StudyError, match=r"1 run\(s\) failed: .*baseline-s3 \(SLURM job \d+, CANCELLED"):
        _launch_one(nano_project, over, logs, interrupt=lambda job: subprocess.run(["scancel", job]))
    d = tmp_path / "cut/runs/test/x/baseline-s3"
    assert (d / "checkpoints/last.ckpt").is_file() and not (d / "metrics.json").exists()
    (again,) = ensure_runs([[*over, *SLURM, *logs]], nano_project, None, label="again")  # submitted again: resumes
    assert again == (d, False)
    log = max((tmp_path / "logs").glob("*_0_log.out"), key=lambda p: p.stat().st_mtime).read_text()
    assert "resuming from step" in log
    assert (json.loads((d / "metrics.json").read_text())["val_loss"]
            == json.loads((whole[0][0] / "metrics.json").read_text())["val_loss"])


def test_submitit_requeues_a_preempted_job_and_it_ends_identical(slurm, nano_project, tmp_path, monkeypatch):
    """The one requeue is submitit's (USR2): Lightning's SLURM environment is on (ranks) without its auto-requeue, so no
    hpc checkpoint is written and the requeued job resumes from the run's own checkpoint."""
    from study.orchestration.ensure import ensure_runs

    monkeypatch.chdir(nano_project)
    whole = ensure_runs([_one_run(tmp_path / "whole")], nano_project, None, jobs=2, label="whole")

    def preempt(job):
        subprocess.run(["scancel", "--signal=USR2", job], check=True)  # what SLURM sends 90 s before the limit
        for _ in range(300):  # SLURM holds a requeued job 2 minutes (BeginTime): release it now
            state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True).stdout
            if "BeginTime" in state:
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
                return
            time.sleep(0.2)
    logs = [f"launcher.log_dir={tmp_path / 'logs'}"]
    (got,) = _launch_one(nano_project, _one_run(tmp_path / "pre"), logs, interrupt=preempt)
    d = tmp_path / "pre/runs/test/x/baseline-s3"
    assert got == (d, False)
    err = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*_0_log.err")))
    out = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*_0_log.out")))
    assert "Caught signal SIGUSR2" in err + out and "resuming from step" in out, err[-2000:]
    assert "SLURM auto-requeueing enabled" not in err + out and not list(d.rglob("hpc_ckpt_*"))
    assert (json.loads((d / "metrics.json").read_text())["val_loss"]
            == json.loads((whole[0][0] / "metrics.json").read_text())["val_loss"])
    completed = [x for x in slurm.jobcomp_lines() if "Name=study-one" in x]
    assert completed and "JobState=COMPLETED" in completed[-1]


def test_a_failed_job_is_named_by_its_slurm_id_and_log(slurm, nano_project, tmp_path, monkeypatch):
    from study.config import StudyError

    monkeypatch.chdir(nano_project)
    over = [*_one_run(tmp_path, tokens=8192), f"launcher.log_dir={tmp_path / 'logs'}",
            "launcher.setup=['echo no such module: cuda/99 >&2', 'exit 3']"]
    with pytest.raises(StudyError) as e:
        _launch_one(nano_project, over, [])
    msg = str(e.value)
    job = msg.split("SLURM job ")[1].split(",")[0]
    assert msg == (f"1 run(s) failed: {tmp_path}/runs/test/x/baseline-s3 (SLURM job {job}, FAILED, log "
                   f"{tmp_path}/logs/{job}_0_log.err: no such module: cuda/99): fix the cause and re-run (finished "
                   f"runs are reused)")
    assert any(f"JobId={job} " in x and "JobState=FAILED" in x and "ExitCode=3:0" in x for x in slurm.jobcomp_lines())
