"""What compare and the test_runs stage check of a test run before they count or reuse it: the arm's lr and recipe
(compare refuses a run re-trained without them), a printed re-train command that reproduces the run it names (its
resume key), and a reused run whose config.json is the run's key."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import env_for
from tests.synthetic_runs import write_run

LR = 0.03122


def study_params(project: Path, tmp: Path) -> Path:
    """params.yaml of a nano study whose verdict has two arms: ``nlqd`` (nonlinear_q, decay to zero, lr* in tuned.lr)
    and ``base`` (baseline, fixed lr); runs, store and tuning table under ``tmp``."""
    from study.config import composed_params

    data = yaml.safe_load(composed_params(project, [
        f"study.runs_dir={tmp / 'runs'}", f"study.reports_dir={tmp / 'reports'}", f"study.tracking_db={tmp / 'm.db'}",
        f"study.artifact_dir={tmp / 'mlartifacts'}", "study.seeds=[1,2,3,4,5]", f"tune.runs_dir={tmp / 'runs_tune'}",
        f"tune.table_dir={tmp / 'tuning'}", "train.tokens=8192", "trainer.progress_bar=false"]))
    data["arms"] = {"nlqd": {"variant": "nonlinear_q", "overrides": ["train.schedule=d2z"], "lr": None, "description": ""},
                    "base": {"variant": "baseline", "overrides": [], "lr": 3e-3, "description": ""}}
    data["tune"]["arms"] = []
    data["study"].update(arms=["nlqd", "base"], references=["base"], pairs=[], max_seeds=10)
    data["decomposition"]["rows"] = []
    data["tuned"] = {"lr": {"nlqd": LR}}
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _arm_run(cfg, root: Path, params: str, arm: str, seed: int, loss: float, drop=()) -> None:
    """One finished test run of ``arm`` with the config.json study.train records for the arm's overrides (but the
    overrides in ``drop``: a run re-trained by hand without them)."""
    from study.config import load_config, run_dir
    from study.config.naming import testing_group
    from study.runner.arms import run_overrides, tuned_lr
    from study.runfolder import recorded_config

    over = [o for o in run_overrides(cfg, arm, seed, tuned_lr(cfg, arm), testing_group(arm))
            if not o.startswith(tuple(drop))]
    run = load_config(over, root, params=params)
    lr = run.arm.lr if run.arm.lr is not None else run.train.lr
    d = run_dir(root, run, run.variant.name, seed, testing_group(arm))
    write_run(d, run.variant.name, seed, loss, lr=lr)
    (d / "config.json").write_text(json.dumps(recorded_config(run, "0123456789abcdef")))


def _five_seeds(cfg, root: Path, params: Path, tmp: Path) -> None:
    """Seeds 1-5 of both arms finished, with the plan that asks for them."""
    (tmp / "runs" / "test").mkdir(parents=True)
    (tmp / "runs" / "test" / "plan.json").write_text(json.dumps({"seeds": {"nlqd": [1, 2, 3, 4, 5],
                                                                           "base": [1, 2, 3, 4, 5]}}))
    for s in range(1, 6):
        _arm_run(cfg, root, str(params), "nlqd", s, 4.0 + 0.01 * s)
        _arm_run(cfg, root, str(params), "base", s, 4.05 + 0.01 * s)


def test_compare_refuses_a_test_run_without_its_arms_lr_or_recipe(nano_project, tmp_path, monkeypatch):
    """The issue's case: a test run re-trained without arm.lr (train.lr 3e-3 instead of the arm's 3.1e-2), or
    without the arm's train.schedule=d2z, pairs with the others (pairing ignores the variant's lr and the arms'
    override keys) but is not the arm's run: compare refuses it in one line with the command that re-trains it."""
    from study.analysis.runs import RunsError
    from study.analysis.verdict import tested_runs
    from study.config import load_config

    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")  # params.yaml holds values conf/ does not: inside `dvc exp run`
    params = study_params(nano_project, tmp_path)
    cfg = load_config([], nano_project, params=str(params))
    _five_seeds(cfg, nano_project, params, tmp_path)
    runs = tested_runs(cfg, nano_project)
    assert [runs["nlqd"][s]["lr"] for s in range(1, 6)] == [LR] * 5
    d = tmp_path / "runs/test/nlqd/nonlinear_q-s2"
    for drop, shown in ((["arm.lr="], "peak lr 0.003, but arm 'nlqd' trains at 0.03122"),
                        (["train.schedule="], "train.schedule 'cosine', but arm 'nlqd' trains at 'd2z'")):
        _arm_run(cfg, nano_project, str(params), "nlqd", 2, 4.5, drop=drop)
        with pytest.raises(RunsError) as e:
            tested_runs(cfg, nano_project)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"runs/test/nlqd/nonlinear_q-s2 was trained at {shown}: it is not "
                                                  f"the arm's run") or msg.startswith(f"{d} was trained at {shown}"), msg
        assert f"variant=nonlinear_q seed=2 " in msg and f"arm.lr={LR!r} train.schedule=d2z study.group=test/nlqd`" in msg
        _arm_run(cfg, nano_project, str(params), "nlqd", 2, 4.02)
        tested_runs(cfg, nano_project)


def test_compare_refuses_a_run_trained_at_other_positions(nano_project, tmp_path, monkeypatch):
    """A run that trained with learned positions is not the arm's run under a rotary study, and compare says so
    rather than count it."""
    from study.analysis.runs import RunsError
    from study.analysis.verdict import tested_runs
    from study.config import load_config

    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")
    params = study_params(nano_project, tmp_path)
    data = yaml.safe_load(params.read_text())
    data["model"]["position"] = "rope"
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config([], nano_project, params=str(params))
    _five_seeds(cfg, nano_project, params, tmp_path)
    assert sorted(tested_runs(cfg, nano_project)["nlqd"]) == [1, 2, 3, 4, 5]  # rotary runs: counted
    path = tmp_path / "runs/test/nlqd/nonlinear_q-s2/config.json"
    old = json.loads(path.read_text())
    assert old["model"]["position"] == "rope"
    old["model"]["position"] = "learned"
    path.write_text(json.dumps(old))
    with pytest.raises(RunsError) as e:
        tested_runs(cfg, nano_project)
    assert "\n" not in str(e.value) and "was trained at model.position 'learned', but arm 'nlqd' trains at 'rope'" in str(e.value)


@pytest.mark.slow  # two nano trainings of 8,192 tokens (~1 min on 2 cores)
def test_the_printed_command_re_trains_the_run_it_names(nano_project, tmp_path, monkeypatch):
    """A test run whose metrics.json was lost: compare prints a command; run as printed, it trains the same run
    (the same resume key as the lost one), the arm's tuned lr and recipe included."""
    from study.analysis.runs import RunsError
    from study.analysis.verdict import tested_runs
    from study.config import load_config
    from study.config.naming import testing_group
    from study.runner.arms import ensure_run, run_overrides, tuned_lr

    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")  # params.yaml holds values conf/ does not: inside `dvc exp run`
    params = str(study_params(nano_project, tmp_path))
    cfg = load_config([], nano_project, params=params)
    d, reused = ensure_run(run_overrides(cfg, "nlqd", 2, tuned_lr(cfg, "nlqd"), testing_group("nlqd")), nano_project,
                           params)
    assert not reused and d == tmp_path / "runs/test/nlqd/nonlinear_q-s2"
    key = json.loads((d / "record.json").read_text())["config_hash"]
    first = json.loads((d / "record.json").read_text())
    assert (first["lr"], first["lr_source"], first["arm"]) == (LR, "arm.lr", "nlqd")  # the run's frozen specification
    (d / "metrics.json").unlink()
    (tmp_path / "runs/test/plan.json").write_text(json.dumps({"seeds": {"nlqd": [2], "base": [2]}}))
    with pytest.raises(RunsError) as e:
        tested_runs(cfg, nano_project)
    cmd = next(c for c in str(e.value).split("`") if c.startswith("python -m study.train"))
    assert cmd.startswith("python -m study.train variant=nonlinear_q seed=2 ") and f"arm.lr={LR!r}" in cmd, cmd
    argv = shlex.split(cmd)
    r = subprocess.run([sys.executable, *argv[1:]], cwd=nano_project, env=env_for(nano_project), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((d / "record.json").read_text())
    assert rec["config_hash"] == key and rec["lr"] == LR
    assert json.loads((d / "config.json").read_text())["train"]["schedule"] == "d2z"


@pytest.mark.slow  # two nano trainings of 8,192 tokens (~1 min on 2 cores)
def test_a_run_whose_config_json_was_edited_is_not_reused(nano_project, tmp_path, monkeypatch, capsys):
    """record.json's key alone would reuse it, and compare would then refuse it ("re-run the odd run"): the verdict
    stage checks config.json against the key, as compare checks it, and trains the run again."""
    from study.config import load_config
    from study.config.naming import testing_group
    from study.runner.arms import ensure_run, reusable, run_overrides

    monkeypatch.chdir(nano_project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")  # params.yaml holds values conf/ does not: inside `dvc exp run`
    params = str(study_params(nano_project, tmp_path))
    cfg = load_config([], nano_project, params=params)
    over = run_overrides(cfg, "base", 1, 3e-3, testing_group("base"))
    d, reused = ensure_run(over, nano_project, params)
    assert not reused and ensure_run(over, nano_project, params) == (d, True)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "train": {**config["train"], "tokens": 4096}}))
    assert not reusable(load_config(over, nano_project, params=params), nano_project, d)
    assert ensure_run(over, nano_project, params) == (d, False)
    assert "the finished run there was trained under other settings, code or data: replacing it" in capsys.readouterr().out
    assert json.loads((d / "config.json").read_text())["train"]["tokens"] == 8192
    assert ensure_run(over, nano_project, params) == (d, True)


def test_compare_refuses_a_run_trained_at_other_task_settings():
    """A task's own settings are part of the arm's run: an mqar run trained at another key-value power law is not
    the arm's run at the study's task settings, and compare says which setting differs."""
    from conftest import ROOT
    from study.analysis.runs import RunsError
    from study.analysis.verdict import arm_settings, check_arm_run
    from study.config import load_config

    cfg = load_config(["task=mqar", "task.power_a=0.5"], ROOT)
    want = arm_settings(cfg, "baseline")
    assert want["task.power_a"] == 0.5 and want["task.num_kv_pairs"] == cfg.task.num_kv_pairs
    assert "task.mask_fraction" not in want  # mlm's setting: not this task's
    run = {"name": "runs/mqar/test/baseline/baseline-s1", "lr": want["lr"],
           "settings": {"task.name": "mqar", "task.power_a": 0.01, "task.num_kv_pairs": cfg.task.num_kv_pairs}}
    with pytest.raises(RunsError) as e:
        check_arm_run(cfg, ROOT, "baseline", 1, run)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("runs/mqar/test/baseline/baseline-s1 was trained at task.power_a 0.01, but arm "
                                   "'baseline' trains at 0.5: it is not the arm's run")
    check_arm_run(cfg, ROOT, "baseline", 1, {**run, "settings": {**run["settings"], "task.power_a": 0.5}})
