"""A stage's job array on a real SLURM (tests/slurm_cluster.py, one node, started for this module), the stage itself
stopped or misled: killed by SIGKILL, its restart waits for the array it left queued and queues no run twice; closed
by SIGHUP (its terminal gone), it cancels its array; a drained node's reason is on the live line; SLURM missing or
refusing the array is one line naming the fix."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import slurm_cluster
from conftest import env_for, mlflow_runs

pytestmark = pytest.mark.slow

#: a stage in a process of its own: ensure_runs of three nano runs through launcher=slurm, one at a time
DRIVER = """
import signal
import sys
from pathlib import Path
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a stage at a terminal, even when the suite runs under nohup
from study.config import StudyError
from study.orchestration.ensure import ensure_runs

tmp, label, n, extra = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
runs = [[f"study.runs_dir={tmp / 'runs'}", f"study.tracking_db={tmp / 'm.db'}", f"study.artifact_dir={tmp / 'art'}",
         "trainer.threads=1", "variant=baseline", f"seed={s}", "arm.lr=0.003", "study.group=test/x",
         "train.tokens=40960", "train.eval_every=5", "launcher=slurm", "launcher.cpus_per_task=1",
         "launcher.array_parallelism=1", "launcher.poll_s=1", f"launcher.log_dir={tmp / 'logs'}", *extra]
        for s in range(1, n + 1)]
try:
    ensure_runs(runs, Path.cwd(), None, jobs=1, label=label)
except StudyError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
"""


slurm = pytest.fixture(scope="module")(slurm_cluster.started_cluster)  # a one-node SLURM for this module


def _driver(project: Path, tmp: Path, label: str, n: int = 3, *extra: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp), label, str(n), *extra], cwd=project,
                            env=env_for(project), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _record(tmp: Path, timeout: float = 120) -> Path:
    """The array's record beside the runs, once the stage has written it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = list((tmp / "runs").rglob(".slurm-arrays/*.json"))
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError("no .slurm-arrays record was written")


def _active(array: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-r", "-j", array, "-o", "%i %T"], capture_output=True, text=True).stdout
    return [x for x in out.splitlines() if x.strip()]


def test_a_stage_killed_by_sigkill_is_restarted_without_queueing_a_run_twice(slurm, nano_project, tmp_path):
    first = _driver(nano_project, tmp_path, "kill")
    rec = _record(tmp_path)
    array = json.loads(rec.read_text())["array"]
    first.send_signal(signal.SIGKILL)  # no handler runs: the array stays queued
    first.wait(timeout=60)
    assert len(_active(array)) == 3
    again = _driver(nano_project, tmp_path, "kill")
    out, err = again.communicate(timeout=1200)
    assert again.returncode == 0, err[-3000:]
    assert f"kill: waiting for SLURM job array {array}, submitted earlier: 3 of its runs" in out
    assert "submitted SLURM job array" not in out
    jobs = [x for x in slurm.jobcomp_lines() if "Name=study-kill" in x]
    assert len(jobs) == 3 and all("JobState=COMPLETED" in x for x in jobs), jobs  # one array, one job per run
    finished = [r for r in mlflow_runs(tmp_path / "m.db")[1] if r.info.status == "FINISHED"]
    assert len(finished) == 3  # each run trained once
    for s in (1, 2, 3):
        assert (tmp_path / f"runs/test/x/baseline-s{s}/metrics.json").is_file()
    assert not rec.exists()  # the array has ended: its record is gone


def test_sighup_cancels_the_stages_array(slurm, nano_project, tmp_path):
    stage = _driver(nano_project, tmp_path, "hup")
    rec = _record(tmp_path)
    array = json.loads(rec.read_text())["array"]
    time.sleep(1)
    stage.send_signal(signal.SIGHUP)  # the terminal closed
    out, err = stage.communicate(timeout=120)
    assert stage.returncode == 128 + signal.SIGHUP, err[-2000:]
    assert f"hup: cancelled SLURM job array {array}" in out
    deadline = time.time() + 60
    while _active(array) and time.time() < deadline:
        time.sleep(0.5)
    assert not _active(array) and not rec.exists()
    assert not any((tmp_path / "runs/test/x").glob("*/metrics.json"))


def test_a_drained_nodes_reason_is_on_the_live_line(slurm, nano_project, tmp_path):
    host = slurm.host
    subprocess.run(["scontrol", "update", f"NodeName={host}", "State=DRAIN", "Reason=maintenance"], check=True)
    try:
        stage = _driver(nano_project, tmp_path, "drain", 1)
        array = json.loads(_record(tmp_path).read_text())["array"]
        reason, deadline = "", time.time() + 60
        while time.time() < deadline:
            got = subprocess.run(["squeue", "-h", "-j", array, "-o", "%r"], capture_output=True, text=True).stdout
            reason = got.strip()
            if reason and reason not in ("None", "(null)"):
                break
            time.sleep(0.5)
        time.sleep(3)  # a few looks at the queue (launcher.poll_s=1)
        stage.send_signal(signal.SIGTERM)
        _, err = stage.communicate(timeout=120)
    finally:
        subprocess.run(["scontrol", "update", f"NodeName={host}", "State=RESUME"], check=True)
    assert "ReqNodeNotAvail" in reason or "DRAIN" in reason.upper() or reason == "Resources", reason
    assert f"| slurm array {array}: 1 pending ({reason})" in err, err[-2000:]


def test_sbatch_refusing_the_array_is_one_line(slurm, nano_project, tmp_path):
    stage = _driver(nano_project, tmp_path, "refused", 1, "launcher.partition=nosuch")
    out, err = stage.communicate(timeout=300)
    assert stage.returncode == 2 and err.count("\n") == 1, err[-3000:]
    assert err.startswith("error: SLURM refused the job array: sbatch: error: ") and "nosuch" in err.lower()
    assert err.rstrip().endswith("or train on this machine with launcher=local")
    assert not list((tmp_path / "runs").rglob(".slurm-arrays/*.json"))


def test_no_sbatch_on_path_is_one_line(nano_project, tmp_path):
    """SLURM not installed here (no sbatch on PATH): the test stage says so in one line, before anything is written."""
    import yaml

    from tests.test_compare_checks import study_params

    params = study_params(nano_project, tmp_path)
    data = yaml.safe_load(params.read_text())
    data["arms"]["nlqd"]["lr"], data["tuned"] = 0.003, {"lr": {}}
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "sbatch").exists())
    got = subprocess.run([sys.executable, "-m", "study.test_runs", "--params", str(params), "launcher=slurm",
                          f"launcher.log_dir={tmp_path / 'logs'}"], cwd=nano_project,
                         env={**env_for(nano_project), "PATH": path, "DVC_EXP_NAME": "test"}, capture_output=True,
                         text=True, timeout=600)
    assert got.returncode == 2, got.stderr[-3000:]
    assert got.stderr == ("error: launcher=slurm needs SLURM's sbatch, squeue, scancel, srun on PATH and this machine "
                          "has none: run the stage on the cluster's login node (or put SLURM's bin folder on PATH), or "
                          "train on this machine with launcher=local\n")
    assert not list((tmp_path / "runs").rglob("*-s*")) and not (tmp_path / "logs").exists()  # no run folder, no log
