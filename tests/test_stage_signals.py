"""Signals a stage and its trainings meet: Ctrl-C ends study.train, and a tuning or test stage at any study.jobs, with
exit status 130 and one line; a stage killed by SIGKILL takes its trainings with it; a restart waits for a run that
another process still trains, then reuses it."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import env_for
from study.config.stage import INTERRUPTED


def _study(tmp: Path, tokens: int = 409600) -> list[str]:
    return [f"study.runs_dir={tmp / 'runs'}", f"study.tracking_db={tmp / 'm.db'}", f"study.artifact_dir={tmp / 'art'}",
            "trainer.progress_bar=false", "trainer.threads=1", f"train.tokens={tokens}"]


def _arm(seed: int) -> list[str]:
    return ["variant=baseline", f"seed={seed}", "arm.lr=0.003", "study.group=test/x"]


def _until(ready, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not ready() and time.time() < deadline:
        time.sleep(0.1)
    assert ready(), "timed out"


def _ctrl_c(cmd: list[str], project: Path, ckpt: Path, tmp: Path) -> tuple[int, str]:
    err = tmp / "stderr.txt"
    with open(err, "w") as e:
        proc = subprocess.Popen(cmd, cwd=project, env=env_for(project), stdout=subprocess.DEVNULL, stderr=e)
        try:
            _until(lambda: ckpt.is_file() or proc.poll() is not None)
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    return rc, err.read_text()


@pytest.mark.slow  # one nano training stopped after its first checkpoint (~30 s)
def test_ctrl_c_of_study_train_ends_with_130_and_one_line(nano_project, tmp_path):
    cmd = [sys.executable, "-m", "study.train", *_study(tmp_path), *_arm(1)]
    rc, err = _ctrl_c(cmd, nano_project, tmp_path / "runs/test/x/baseline-s1/checkpoints/last.ckpt", tmp_path)
    assert rc == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == INTERRUPTED.format(stage="study.train")


@pytest.mark.slow  # the test stage at study.jobs=1, stopped in its first training (~40 s)
def test_ctrl_c_of_the_verdict_stage_at_one_job_ends_as_at_two(nano_project, tmp_path, monkeypatch):
    from tests.test_compare_checks import study_params

    import yaml

    params = study_params(nano_project, tmp_path)
    data = yaml.safe_load(params.read_text())  # both arms at a fixed lr: no tuning table needed
    data["arms"]["nlqd"]["lr"], data["tuned"] = 0.003, {"lr": {}}
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    cmd = [sys.executable, "-m", "study.test_runs", "--params", str(params), "study.jobs=1", "train.tokens=409600",
           ]
    monkeypatch.setenv("DVC_EXP_NAME", "test")
    rc, err = _ctrl_c(cmd, nano_project, tmp_path / "runs/test/nlqd/nonlinear_q-s1/checkpoints/last.ckpt", tmp_path)
    assert rc == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == INTERRUPTED.format(stage="study.test_runs")


@pytest.mark.slow  # two nano trainings started, their stage SIGKILLed (~40 s)
def test_a_stage_killed_by_sigkill_takes_its_trainings_with_it(nano_project, tmp_path):
    import psutil
    from mlflow import MlflowClient

    runs = [tmp_path / f"runs/test/x/baseline-s{s}" for s in (1, 2)]
    todo = [(d, [*_study(tmp_path), *_arm(s)]) for d, s in zip(runs, (1, 2))]
    script = ("from pathlib import Path; from study.config import load_config\n"
              "from study.orchestration.launch import LocalLauncher; from study.orchestration.live_line import StageLine\n"
              "from study.config.launcher import resolve_launcher\n"
              f"todo = [(Path(d), o) for d, o in {[(str(d), o) for d, o in todo]!r}]\n"
              "res = resolve_launcher(load_config(todo[0][1], Path.cwd()))\n"
              "LocalLauncher(res, Path.cwd(), None, 2).run(todo, StageLine('test', [d for d, _ in todo], 0))\n")
    stage = subprocess.Popen([sys.executable, "-c", script], cwd=nano_project, env=env_for(nano_project),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = []
    try:
        # both inside their training (a first checkpoint written), where SIGTERM ends the MLflow run KILLED; run.json
        # alone comes earlier, before the handler is in place, and a busy machine can stretch that gap
        _until(lambda: all((d / "checkpoints/last.ckpt").is_file() for d in runs) or stage.poll() is not None)
        children = psutil.Process(stage.pid).children()
        assert len(children) == 2
        stage.kill()
        stage.wait()
        gone, alive = psutil.wait_procs(children, timeout=90)
        assert alive == [], "trainings left running after their stage died"
    finally:
        for p in children:
            if p.is_running():
                p.kill()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    ids = [json.loads((d / "checkpoints/run.json").read_text())["mlflow_run_id"] for d in runs]
    assert [client.get_run(i).info.status for i in ids] == ["KILLED", "KILLED"]


@pytest.mark.slow  # one nano training of 8,192 tokens (~30 s)
def test_a_restart_waits_for_a_run_still_being_trained_and_reuses_it(nano_project, tmp_path, monkeypatch, capsys):
    from mlflow import MlflowClient

    from study.config import load_config
    from study.runner.arms import ensure_run

    monkeypatch.chdir(nano_project)
    over = [*_study(tmp_path, tokens=8192), *_arm(3)]
    d = tmp_path / "runs/test/x/baseline-s3"
    left = subprocess.Popen([sys.executable, "-m", "study.train", *over], cwd=nano_project, env=env_for(nano_project),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # a training left running
    try:
        _until(lambda: (d / "checkpoints").is_dir() or left.poll() is not None)
        assert left.poll() is None
        assert ensure_run(over, nano_project, None) == (d, True)
    finally:
        left.wait(timeout=300)
    assert left.returncode == 0
    assert f"{d}: another process is still training this run" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    exp = client.get_experiment_by_name(load_config(over, nano_project).study.name)
    finished = client.search_runs([exp.experiment_id], filter_string="attributes.status = 'FINISHED'")
    assert len([r for r in finished if r.info.run_name == "test/x/baseline-s3"]) == 1


def test_a_sigterm_inside_the_tracking_store_is_raised_once_the_store_code_has_left():
    """Raised inside MLflow/SQLAlchemy code, Killed would leave the SQLite store locked for every other training (two
    trainings killed together then waited minutes on each other): it is delivered again after that code returns."""
    import os

    from study.runner.signals import REDELIVER_S, Killed, terminate_as_exception

    shielded = {"__name__": "sqlalchemy.engine.fake", "time": time, "os": os, "signal": signal}  # a shielded frame
    exec("def busy(s):\n    os.kill(os.getpid(), signal.SIGTERM)\n    t = time.time()\n"
         "    while time.time() - t < s:\n        pass\n    return time.time()\n", shielded)
    left = None
    with pytest.raises(Killed) as got:
        with terminate_as_exception():
            left = shielded["busy"](3 * REDELIVER_S)  # not interrupted inside the store's code
            while time.time() - left < 10:  # then raised outside it, within a redelivery
                pass
    assert left is not None, "Killed raised inside the shielded code"
    assert got.value.code == 128 + signal.SIGTERM
    assert time.time() - left < 10 * REDELIVER_S


def test_a_held_back_sigterm_is_raised_as_the_block_ends_and_nothing_outlives_the_block():
    """A SIGTERM held back by store code that runs to the block's very end is raised as the block ends (not lost,
    not delivered later under the default action); after Killed, a second SIGTERM is ignored inside the block."""
    import os

    from study.runner.signals import REDELIVER_S, Killed, terminate_as_exception

    shielded = {"__name__": "mlflow.fake", "os": os, "signal": signal}
    exec("def term():\n    os.kill(os.getpid(), signal.SIGTERM)\n", shielded)
    with pytest.raises(Killed):
        with terminate_as_exception():
            shielded["term"]()  # the block ends at once, well within REDELIVER_S
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no check left armed
    time.sleep(3 * REDELIVER_S)  # and nothing arrives later: this process is still here

    cleaned = []
    with pytest.raises(Killed):
        with terminate_as_exception():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # the launcher's second SIGTERM, during the clean-up
                time.sleep(REDELIVER_S)
                cleaned.append(True)
    assert cleaned == [True]
