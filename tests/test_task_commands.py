"""Each task is sent to its own tuning command (`make tasks TASKS=T`, `python -m study.tune --arm A task=T`), never to
`make tune` (lm's); `make tasks` checks TASKS before anything runs; the DVC pipeline (lm's) refuses a params.yaml
composed with another task before any stage starts."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import ROOT, copy_project
from study.config import ConfigError, StudyError, composed_params, load_config


@pytest.fixture(scope="module")
def mlm():
    return load_config(["task=mlm"], ROOT)


def refused(fn, *args, error=ConfigError) -> str:
    with pytest.raises(error) as e:
        fn(*args)
    assert "\n" not in str(e.value) and "`make tune`" not in str(e.value)
    return str(e.value)


def test_a_task_without_an_lr_star_names_its_own_tuning_command(mlm, tmp_path):
    import copy

    from study.tuning.tuned_file import check_tuned
    from study.runner.arms import tuned_lr
    from study.tuning.table import read_results

    from omegaconf import OmegaConf

    cfg = copy.deepcopy(mlm)
    OmegaConf.set_readonly(cfg, False)  # a composition is read-only: this copy is changed to make each case
    cfg.tuned.lr = {}
    own = "`python -m study.tune --arm baseline task=mlm`"
    msg = refused(tuned_lr, cfg, "baseline", tmp_path)  # in tune.arms, not tuned yet
    assert "(tuned.task.mlm.lr) yet: tune it (" + own in msg and "`make tasks TASKS=mlm` tunes every arm" in msg
    cfg.tune.arms = ["nonlinear_q"]
    msg = refused(tuned_lr, cfg, "baseline", tmp_path)  # not in tune.arms
    assert msg.startswith("arm 'baseline' has no tuned lr in conf/tuned.yaml (tuned.task.mlm.lr)") and own in msg
    cfg.tune.arms = ["baseline"]  # every point of its grid diverged
    table = tmp_path / cfg.tune.table_dir / "table.json"
    table.parent.mkdir(parents=True)
    table.write_text(json.dumps({"arms": {"baseline": {"lr_star": None, "points": [{"lr": 0.01, "mean": None}]}}}))
    assert "tune.centre=0.0025 and `make tasks TASKS=mlm`)" in refused(tuned_lr, cfg, "baseline", tmp_path)
    msg = refused(read_results, cfg, tmp_path, error=StudyError)
    assert msg.endswith("tune the arm first (`make tasks TASKS=mlm`, or `python -m study.tune --arm baseline "
                        "--params params.yaml task=mlm`)")
    assert "re-run `make tasks TASKS=mlm` (which writes both)" in refused(check_tuned, cfg, tmp_path)
    # a run at a task's lr* (train.lr_from_tuned) of an arm the task never tuned
    msg = refused(load_config, ["task=mlm", "variant=baseline_mlp4.75", "train.lr_from_tuned=true"], ROOT)
    assert "has no lr* in conf/tuned.yaml" in msg and "`python -m study.tune --arm baseline_mlp4.75 task=mlm`" in msg
    # lm's own arms are still sent to `make tune`
    with pytest.raises(ConfigError, match=r"tune it \(`make tune` with baseline_mlp4.5 in tune.arms\)"):
        load_config(["variant=baseline_mlp4.5", "train.lr_from_tuned=true"], ROOT)


@pytest.mark.parametrize("tasks, bad", [("bogus", "bogus"), ("mlm bogus lm", "bogus lm")])
def test_make_tasks_refuses_an_unknown_task_before_anything_runs(tasks, bad):
    r = subprocess.run(["make", "--no-print-directory", "-n", "tasks", f"TASKS={tasks}"], cwd=ROOT,
                       capture_output=True, text=True)  # under `make test` a nested make would name its folder
    assert r.returncode == 2 and r.stdout == ""  # nothing would run: not `make study`, not one tuning
    assert len(r.stderr.strip().splitlines()) == 1
    assert f"TASKS={tasks} names {bad}, which make tasks does not run: choose among mlm mqar" in r.stderr
    ok = subprocess.run(["make", "--no-print-directory", "-n", "tasks", "TASKS=mqar"], cwd=ROOT, capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "task=$t" in ok.stdout


def test_the_dvc_pipeline_refuses_params_composed_with_another_task(tmp_path, monkeypatch, capsys):
    from study.compare import main as compare
    from study.train import main as train

    project = copy_project(tmp_path / "project")
    monkeypatch.chdir(project)
    report = project / "reports" / "comparison.md"
    report.parent.mkdir(exist_ok=True)
    report.write_text("lm's report\n")
    params = project / "params.yaml"
    params.write_text(composed_params(project, ["task=mqar"]))  # what `dvc exp run -S task=mqar` composes
    for stage, argv in ((train, ["--params", "params.yaml", "variant=baseline", "seed=1"]),
                        (compare, ["--params", "params.yaml"])):
        assert stage(argv) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "params.yaml composes task=mqar, but the DVC pipeline" in err
        assert "are made by `make tasks TASKS=mqar`; drop -S task=mqar and restore params.yaml (`make params`)" in err
    assert report.read_text() == "lm's report\n" and not (project / "runs").exists()
    # `make tasks`' own path: lm's params.yaml with the task chosen on the command line
    params.write_text(composed_params(project, []))
    assert load_config(["task=mqar"], project, params=params).task.name == "mqar"
