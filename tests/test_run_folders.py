"""A run folder has one writer and loses nothing: a second writer is refused, a start Lightning refuses keeps the
finished run, a DVC stage replaces its finished run where a hand-started run does not, a corrupt metrics.json
names the command that trains the run again."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from study.runfolder import read_result
from conftest import BIN, env_for, mlflow_runs, one_line_error, train_cmd


# -- one writer per run folder --------------------------------------------------------------------
@pytest.mark.slow  # a training process
def test_a_second_writer_is_refused_in_one_line(nano_project, tmp_path, monkeypatch, capsys):
    from filelock import FileLock

    from study.train import main

    runs = tmp_path / "runs"
    folder = runs / "baseline-s1"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints/run.json").write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); lock.acquire(); "
        "print('locked', flush=True); time.sleep(300)"), str(folder / ".lock")],
        stdout=subprocess.PIPE, text=True, env=env_for(nano_project))
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.chdir(nano_project)
        rc = main([f"study.runs_dir={runs}", f"study.tracking_db={tmp_path / 'm.db'}", "trainer.progress_bar=false"])
        err = one_line_error(capsys)
        assert rc == 2 and f"another process is writing {folder}" in err
        assert (folder / "checkpoints/run.json").read_text() == "{}"  # nothing of the other writer's touched
    finally:
        holder.kill()
        holder.wait()
    FileLock(str(folder / ".lock"), timeout=0).acquire()  # an OS lock: free once its holder died


@pytest.mark.slow  # ~60 s: two training processes at once
def test_the_same_command_twice_at_once(nano_project, tmp_path):
    """Issue 13's two writers: the second identical command refuses in one line, one MLflow run."""
    runs, db = tmp_path / "runs", tmp_path / "m.db"
    logs = [tmp_path / f"stderr{i}.txt" for i in range(2)]
    procs = [subprocess.Popen(train_cmd(runs, db), cwd=nano_project, env=env_for(nano_project),
                              stdout=subprocess.DEVNULL, stderr=open(log, "w")) for log in logs]
    codes = [p.wait(timeout=600) for p in procs]
    assert sorted(codes) == [0, 2], codes
    err = logs[codes.index(2)].read_text().strip().splitlines()
    assert err == [f"error: another process is writing {runs / 'identity_q-s4'} (it holds "
                   f"{runs / 'identity_q-s4/.lock'}): wait for it to end or stop it; a different run needs its own "
                   f"folder (study.group=NAME)"], err[-3:]
    _, in_store = mlflow_runs(db)
    assert [(r.info.run_name, r.info.status) for r in in_store] == [("identity_q-s4", "FINISHED")]
    assert read_result(runs / "identity_q-s4")["steps"] == 80


def _folder(run: Path) -> dict:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}


def _refused(main, args, run, before, capsys, *extra, words):
    """``study.train`` with ``extra`` exits 2 with one `error:` line holding ``words``; ``run`` is as it was."""
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert all(w in err for w in words), (words, err)
    assert _folder(run) == before and not (run / ".replaced").exists()


def _lightning_refuses(**kwargs):
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    raise MisconfigurationException("`devices` selected with `CPUAccelerator` should be an int > 0.\nmore")


def _refused_missing_packages(main, args, run, before, capsys):
    """Trainer settings whose package is not installed here (Lightning raises ModuleNotFoundError when the
    Trainer is built): each refused in one line, the run folder kept."""
    import importlib.util
    for extra, package in ((["trainer.accelerator=tpu", "train.overwrite=true"], "torch_xla"),
                           (["trainer.strategy=xla", "train.overwrite=true"], "torch_xla"),
                           (["trainer.precision=transformer-engine", "train.overwrite=true"], "transformer_engine")):
        if importlib.util.find_spec(package) is None:
            _refused(main, args, run, before, capsys, *extra,
                     words=[f"needs the package {package}, which is not installed", "install it", "conf/trainer"])


def test_a_trainer_lightning_refuses_keeps_the_finished_run(nano_project, tmp_path, monkeypatch, capsys):
    """Re-running a finished run with trainer settings that are refused (up front, or by Lightning when the
    Trainer is built; with train.overwrite=true, which replaces it) exits 2
    with one `error:` line and leaves the finished run's files as they were: what a start replaces is only
    set aside (the run folder's .replaced/) until its Trainer exists, and put back when it does not.  The
    finished run is written here as train writes one (its resume record, completed); the slow test below
    trains it."""
    import lightning.pytorch

    from study.config import load_config
    from study.runner.resume_key import resume_record, run_digest
    from study.runfolder import write_json
    from study.train import main

    monkeypatch.chdir(nano_project)
    args = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
            f"study.artifact_dir={tmp_path / 'mlartifacts'}", "trainer.progress_bar=false"]
    cfg = load_config(args, nano_project)
    record = resume_record(cfg, nano_project / cfg.data.dir)
    run = tmp_path / "runs/baseline-s1"
    (run / "checkpoints").mkdir(parents=True)
    write_json(run / "checkpoints/run.json", {"config_hash": run_digest(cfg, nano_project / cfg.data.dir, record),
                                              "mlflow_run_id": None, "completed": True, "seconds": 1.0,
                                              "resume": record})
    (run / "checkpoints/last.ckpt").write_bytes(b"the finished run's weights")
    write_json(run / "metrics.json", {"val_loss": 5.0, "val_perplexity": 148.4, "tokens": 20480})
    write_json(run / "record.json", {"variant": "baseline", "seed": 1, "status": "ok"})
    (run / "curve.csv").write_text("step,tokens,train_loss,val_loss,lr\n10,20480,5.1,5.0,0.0003\n")
    write_json(run / "config.json", {"data_digest": "d"})
    before = _folder(run)

    _refused(main, args, run, before, capsys, "trainer.strategy=bogus", words=["trainer.strategy='bogus'"])
    _refused(main, args, run, before, capsys, "trainer.devices=[0,1]", "train.overwrite=true",
             words=["trainer.devices=[0, 1]"])
    _refused(main, args, run, before, capsys, "trainer.devices=abc", words=["trainer.devices='abc'"])
    for key in ("SLURM_NTASKS", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    _refused(main, args, run, before, capsys, "trainer.num_nodes=2", "train.overwrite=true",
             words=["trainer.num_nodes=2", "no multi-node launcher"])
    if sys.platform != "darwin":  # passes the checks; Lightning refuses it when the Trainer is built
        _refused(main, args, run, before, capsys, "trainer.accelerator=mps", "train.overwrite=true",
                 words=["Lightning refused the trainer settings", "accelerator='mps'", "MPSAccelerator"])
    _refused_missing_packages(main, args, run, before, capsys)
    monkeypatch.setattr(lightning.pytorch, "Trainer", _lightning_refuses)
    _refused(main, args, run, before, capsys, "train.overwrite=true", words=["Lightning refused the trainer settings",
                                                                             "should be an int > 0", "conf/trainer"])
    _refused(main, args, run, before, capsys, "train.overwrite=true", "train.lr=1e-3", words=["Lightning refused"])
    # a start that died with the outputs set aside (SIGKILL before its Trainer existed): the next start puts
    # them back before it decides anything
    (run / ".replaced").mkdir()
    for name in ("metrics.json", "record.json", "checkpoints"):
        (run / name).replace(run / ".replaced" / name)
    (run / "checkpoints").mkdir()
    (run / "checkpoints/run.json").write_text("{}")  # what the dead start had begun to write
    _refused(main, args, run, before, capsys, "train.overwrite=true", words=["Lightning refused"])


@pytest.mark.slow
def test_a_trained_run_survives_a_rerun_lightning_refuses(run_in, tmp_path, monkeypatch, capsys):
    """The same with a run trained here: a refused re-run keeps every file of it."""
    import lightning.pytorch

    from study.train import main

    tiny = ["train.tokens=4096", "train.warmup_tokens=0"]
    run_in(*tiny)
    run = tmp_path / "runs/baseline-s1"
    before = _folder(run)
    assert {"metrics.json", "record.json", "curve.csv", "config.json", "checkpoints/run.json",
            "checkpoints/last.ckpt"} <= set(before)
    args = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
            f"study.artifact_dir={tmp_path / 'mlartifacts'}", "trainer.progress_bar=false", *tiny]
    _refused(main, args, run, before, capsys, "trainer.strategy=bogus", words=["trainer.strategy='bogus'"])
    if sys.platform != "darwin":
        _refused(main, args, run, before, capsys, "trainer.accelerator=mps", "train.overwrite=true",
                 words=["Lightning refused the trainer settings"])
    _refused_missing_packages(main, args, run, before, capsys)
    monkeypatch.setattr(lightning.pytorch, "Trainer", _lightning_refuses)
    _refused(main, args, run, before, capsys, "train.overwrite=true", words=["Lightning refused"])


# -- dvc repro is not an ad-hoc run: DVC leaves a stage's outputs in place, the stage's run replaces them ----
@pytest.mark.slow  # dvc processes
def test_dvc_keeps_persisted_outputs_when_a_stage_command_fails(tmp_path):
    """What DVC does with a training stage's declaration (persist: true, cache: false): the output is not deleted
    before the command, so a command that refuses leaves it as it was (issue 25 item 3)."""
    import yaml

    root = Path(__file__).resolve().parent.parent
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    # the stages that train: each declares its runs as one folder output (runs_tune/ARM, runs/test, runs/scale_ladder)
    train_like = {name: s for name, s in stages.items() if "study/runner/run.py" in s.get("deps", [])}
    assert set(train_like) == {"tune", "test_runs", "scale_ladder"}
    for s in train_like.values():
        [out] = s["outs"]
        [(path, opts)] = out.items()
        assert path.startswith(("runs", "${tune.runs_dir}")) and opts == {"persist": True, "cache": False}
    (tmp_path / "dep.txt").write_text("1")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: python -c \"import os, sys; open('log.txt', 'a').write(str(os.path.exists("
        "'r/metrics.json')) + chr(10)); d = open('dep.txt').read(); d == 'bad' and sys.exit(2); "
        "os.makedirs('r/checkpoints', exist_ok=True); open('r/metrics.json', 'w').write(d)\"\n"
        "    deps: [dep.txt]\n    outs:\n      - r/checkpoints:\n          persist: true\n          cache: false\n"
        "    metrics:\n      - r/metrics.json:\n          persist: true\n          cache: false\n")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    dvc = [str(BIN / "dvc")]
    for cmd in (["init", "--no-scm", "-q"], ["repro", "-q"]):
        subprocess.run(dvc + cmd, cwd=tmp_path, env=env, check=True, capture_output=True)
    (tmp_path / "dep.txt").write_text("bad")
    assert subprocess.run(dvc + ["repro", "-q"], cwd=tmp_path, env=env, capture_output=True).returncode != 0
    assert (tmp_path / "r/metrics.json").read_text() == "1"  # the command refused: the output is as it was
    (tmp_path / "dep.txt").write_text("2")
    subprocess.run(dvc + ["repro", "-q"], cwd=tmp_path, env=env, check=True, capture_output=True)
    assert (tmp_path / "log.txt").read_text().split() == ["False", "True", "True"]
    assert (tmp_path / "r/metrics.json").read_text() == "2"


@pytest.mark.slow  # one nano training
def test_a_dvc_stage_replaces_its_finished_run_a_hand_run_does_not(run_in, tmp_path, monkeypatch):
    """With the outputs persisted, a train stage that DVC re-runs (DVC_STAGE set) finds the finished run of its
    folder and replaces it, as `train.overwrite=true` does; a hand-started run is still refused."""
    from study.config import ConfigError

    monkeypatch.delenv("DVC_STAGE", raising=False)
    run_in("variant=baseline", "seed=1", "train.tokens=4096")
    with pytest.raises(ConfigError, match="holds a finished run with other settings"):
        run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.lr=1e-3")
    monkeypatch.setenv("DVC_STAGE", "train@baseline-1")
    m = run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.lr=1e-3")
    assert m["status"] == "ok" and read_result(tmp_path / "runs/baseline-s1")["lr"] == 1e-3


@pytest.mark.slow  # one nano training
def test_a_finished_run_without_its_checkpoints_is_judged_by_its_config_json(run_in, tmp_path, monkeypatch):
    """QA: with a finished run's checkpoints/ deleted (its run.json held the settings), the very same command was
    refused as "a finished run with other settings ((not recorded))"; config.json records them: the same settings
    run, other settings are named."""
    import shutil

    from study.config import ConfigError

    monkeypatch.delenv("DVC_STAGE", raising=False)
    run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.schedule=d2z")
    shutil.rmtree(tmp_path / "runs/baseline-s1/checkpoints")
    with pytest.raises(ConfigError, match=r"other settings \(train.z_loss: 0.0 -> 0.001\)"):
        run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.schedule=d2z", "train.z_loss=1e-3")
    assert not (tmp_path / "runs/baseline-s1/checkpoints").exists()  # refused before anything was written
    m = run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.schedule=d2z", "trainer.threads=1")
    assert m["status"] == "ok"


def test_a_corrupt_metrics_json_advises_the_command_with_its_overrides(nano_project, tmp_path, monkeypatch, capsys):
    """The re-run command of a corrupt metrics.json carries the overrides the run needs, as the 'no
    metrics.json' error's does."""
    from study.compare import main
    from tests.synthetic_runs import arm_run, arms_overrides, write_arms

    monkeypatch.chdir(nano_project)
    runs = tmp_path / "runs"
    write_arms(runs, {a: {s: 4.0 for s in (1, 2, 3, 4, 5)} for a in ("baseline", "nonlinear_q")}, tokens=40960)
    (arm_run(runs, "baseline", 2) / "metrics.json").write_text("{not json")
    assert main([*arms_overrides(tmp_path), "train.tokens=40960"]) == 2
    err = capsys.readouterr().err
    assert "metrics.json is not valid JSON" in err
    cmd = err[err.index("`python -m study.train"):].split("`")[1]
    assert "variant=baseline seed=2" in cmd and f"study.runs_dir={runs}" in cmd and "train.tokens=40960" in cmd
    assert "arm.lr=0.003" in cmd and "study.group=test/baseline" in cmd


# -- a finished run is a result: started again by hand it is reused, re-trained only on request -------------
@pytest.mark.slow  # one nano training
def test_a_finished_run_started_again_by_hand_is_reused_not_retrained(run_in, tmp_path, monkeypatch, capsys):
    """The same command twice: the second start trains nothing, rewrites nothing and opens no MLflow run; it says
    so in one line and returns the finished result."""
    monkeypatch.delenv("DVC_STAGE", raising=False)
    tiny = ["train.tokens=4096", "train.warmup_tokens=0"]
    first = run_in(*tiny)
    run = tmp_path / "runs/baseline-s1"
    before = _folder(run)
    capsys.readouterr()
    again = run_in(*tiny)
    out = capsys.readouterr().out
    assert "baseline-s1: " in out and "holds this run finished (same settings, code, data and numerics): reused" in out
    assert again["val_loss"] == first["val_loss"] and again["mlflow_run_id"] == first["mlflow_run_id"]
    assert _folder(run) == before
    assert [r.info.status for r in mlflow_runs(tmp_path / "mlruns.db")[1]] == ["FINISHED"]


@pytest.mark.slow  # two nano trainings
def test_an_interrupted_overwrite_keeps_the_finished_run(run_in, tmp_path, monkeypatch):
    """train.overwrite=true stopped by Ctrl-C while it trains: the finished run's files (metrics, record, curve,
    config, positions) are back as they were and nothing is left aside."""
    import study.runner.run as run_module

    monkeypatch.delenv("DVC_STAGE", raising=False)
    tiny = ["train.tokens=4096", "train.warmup_tokens=0"]
    run_in(*tiny)
    run = tmp_path / "runs/baseline-s1"
    outputs = {n: (run / n).read_bytes() for n in ("metrics.json", "record.json", "curve.csv", "config.json",
                                                    "positions.csv")}
    def interrupted(plan, run_, module, dm, trainer, clock):  # Ctrl-C once the Trainer exists
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "fit_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_in(*tiny, "train.lr=1e-3", "train.overwrite=true")
    assert {n: (run / n).read_bytes() for n in outputs} == outputs
    assert not (run / ".replaced").exists() and not (run / ".replaced.discarded").exists()


@pytest.mark.slow  # two nano trainings
def test_after_an_interrupted_overwrite_the_finished_run_is_still_reused(run_in, tmp_path, monkeypatch, capsys):
    """QA: an interrupted train.overwrite left its own run.json (not completed, other settings) beside the finished
    run's files put back; the finished run's own command was then refused as "a finished run with other settings
    (train.lr: 0.001 -> 0.003)", naming the killed re-run's settings.  It is reused (record.json's key is its key),
    and the re-run's command without train.overwrite is refused naming the finished run's settings."""
    import study.runner.run as run_module
    from study.config import ConfigError

    monkeypatch.delenv("DVC_STAGE", raising=False)
    tiny = ["train.tokens=4096", "train.warmup_tokens=0"]
    first = run_in(*tiny)
    run = tmp_path / "runs/baseline-s1"
    outputs = {n: (run / n).read_bytes() for n in ("metrics.json", "record.json", "curve.csv", "config.json",
                                                    "positions.csv")}
    fit_run = run_module.fit_run

    def interrupted(plan, run_, module, dm, trainer, clock):  # Ctrl-C once the Trainer exists
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "fit_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_in(*tiny, "train.lr=1e-3", "train.overwrite=true")
    monkeypatch.setattr(run_module, "fit_run", fit_run)
    client, runs = mlflow_runs(tmp_path / "mlruns.db")
    (dead,) = [r.info.run_id for r in runs if r.info.run_id != first["mlflow_run_id"]]
    client.update_run(dead, status="RUNNING")  # as a SIGKILL leaves it
    capsys.readouterr()
    again = run_in(*tiny)
    assert "holds this run finished (same settings, code, data and numerics): reused" in capsys.readouterr().out
    assert client.get_run(dead).info.status == "KILLED"  # the reusing start ends what the dead re-run left RUNNING
    assert again["val_loss"] == first["val_loss"] and again["mlflow_run_id"] == first["mlflow_run_id"]
    assert {n: (run / n).read_bytes() for n in outputs} == outputs
    with pytest.raises(ConfigError, match=r"other settings \(train.lr: 0.003 -> 0.001\)"):
        run_in(*tiny, "train.lr=1e-3")
    assert {n: (run / n).read_bytes() for n in outputs} == outputs


@pytest.mark.slow  # two nano trainings
def test_a_damaged_finished_run_started_again_by_hand_is_trained_again(run_in, tmp_path, monkeypatch, capsys):
    """QA: a finished run whose metrics.json was cut short, started again by hand, was "reused" and then refused
    in one line advising the very command that had just reused it (so it looped); it is trained again."""
    monkeypatch.delenv("DVC_STAGE", raising=False)
    tiny = ["train.tokens=4096", "train.warmup_tokens=0"]
    first = run_in(*tiny)
    run = tmp_path / "runs/baseline-s1"
    (run / "metrics.json").write_text('{"val_loss": ')
    capsys.readouterr()
    again = run_in(*tiny)
    out = capsys.readouterr().out
    assert "the finished run there is damaged" in out and "reused" not in out
    assert again["val_loss"] == first["val_loss"]
    assert read_result(run)["val_loss"] == first["val_loss"]
