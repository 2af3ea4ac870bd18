"""What compare refuses or notes of the run folders it reads, each in one line and with nothing already written lost:
a task metric that is not a share, runs of another task than the one asked for, runs trained at other values than
params.yaml's (and a test stage whose params.yaml changed under it), a missing or truncated positions.csv.

The runs are synthetic (tests/synthetic_runs.py) with the config.json study.train records for their settings.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.synthetic_runs import write_run

ROOT = Path(__file__).resolve().parent.parent


def _dirs(tmp: Path) -> list[str]:
    return [f"study.runs_dir={tmp / 'runs'}", f"study.reports_dir={tmp / 'reports'}",
            f"study.tracking_db={tmp / 'm.db'}", f"study.artifact_dir={tmp / 'mlartifacts'}"]


def _task_runs(tmp: Path, task: str, seeds=(1, 2, 3), accuracy=None, group: str = "", lr=None) -> list[Path]:
    """Finished runs of baseline and nonlinear_q of ``task`` (config.json as study.train records it); ``accuracy``:
    {(variant, seed): value} written into metrics.json as is."""
    from study.config import load_config, run_dir
    from study.runfolder import recorded_config

    out = []
    for v in ("baseline", "nonlinear_q"):
        for s in seeds:
            cfg = load_config([f"task={task}", f"variant={v}", f"seed={s}", *_dirs(tmp),
                               *([f"variant.lr={lr}"] if lr else []), *([f"study.group={group}"] if group else [])],
                              ROOT)
            d = run_dir(ROOT, cfg, v, s, group)
            write_run(d, v, s, 2.0 + 0.01 * s + (0.02 if v == "nonlinear_q" else 0), lr=lr or 3e-3,
                      results={"val_accuracy": 0.4 + 0.01 * s, "task": task})
            (d / "config.json").write_text(json.dumps(recorded_config(cfg, "0123456789abcdef")))
            if (v, s) in (accuracy or {}):
                m = json.loads((d / "metrics.json").read_text())
                (d / "metrics.json").write_text(json.dumps({**m, "val_accuracy": accuracy[(v, s)]}))
            out.append(d)
    return out


def _compare(monkeypatch, args: list[str]) -> int:
    from study.compare import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return main([*args, "study.variants=[baseline,nonlinear_q]", "study.seeds=[1,2,3]", "study.arms=[]"])


def _files(folder: Path) -> dict:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("bad, shown", [(7.5, "7.5"), ("abc", '"abc"'), (-0.1, "-0.1"), (True, "true")])
def test_a_val_accuracy_that_is_not_a_share_is_refused_naming_the_file(tmp_path, monkeypatch, capsys, bad, shown):
    """7.5 in an mlm run's metrics.json used to be reported as a mean accuracy of 2.78 (rc 0); "abc" ended in a
    traceback.  Now one line names the file, the value and the range, and the last report stays as it was."""
    _task_runs(tmp_path, "mlm")
    args = [*_dirs(tmp_path), "task=mlm"]
    assert _compare(monkeypatch, args) == 0
    md = (tmp_path / "reports/mlm/comparison.md").read_text()
    assert "| baseline |" in md and "| 0.4200 |" in md  # the mean of 0.41, 0.42, 0.43
    before = _files(tmp_path / "reports")
    (d,) = _task_runs(tmp_path, "mlm", seeds=(2,), accuracy={("baseline", 2): bad})[:1]
    capsys.readouterr()
    assert _compare(monkeypatch, args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert f"{d / 'metrics.json'}: 'val_accuracy' is {shown}, expected a share in [0, 1]" in err, err
    assert "`python -m study.train variant=baseline seed=2 task=mlm" in err, err  # the re-train command keeps the task
    assert _files(tmp_path / "reports") == before


def test_compare_for_lm_refuses_mlm_runs_naming_both_tasks_and_the_command(tmp_path, monkeypatch, capsys):
    """compare for task lm pointed at mlm runs used to write an lm-worded report of masked-LM losses (rc 0)."""
    _task_runs(tmp_path, "mlm")
    assert _compare(monkeypatch, [*_dirs(tmp_path), f"study.runs_dir={tmp_path / 'runs/mlm'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert f"{tmp_path / 'runs/mlm/baseline-s1'} is a run of task 'mlm', but compare was asked for task 'lm'" in err
    assert "`python -m study.compare --params params.yaml task=mlm`" in err, err
    assert not (tmp_path / "reports").exists()


def test_the_test_runs_of_another_task_are_refused_by_task_not_by_position(tmp_path):
    """mlm's test runs (rotary positions) read by an lm compare were refused for model.position with a re-train
    command that would have put an lm run into the mlm folder: the task is checked first."""
    from study.analysis.runs import RunsError
    from study.analysis.verdict import tested_runs
    from study.config import load_config

    _task_runs(tmp_path, "mlm", seeds=(1,), group="test/baseline_today", lr=3e-3)
    (tmp_path / "runs/mlm/test/plan.json").write_text(json.dumps({"seeds": {"baseline_today": [1]}}))
    cfg = load_config([*_dirs(tmp_path), f"study.runs_dir={tmp_path / 'runs/mlm'}", "study.arms=[baseline_today]",
                       "study.references=[baseline_today]", "study.pairs=[]"], ROOT)
    assert cfg.task.name == "lm" and cfg.model.position == "learned"
    with pytest.raises(RunsError) as e:
        tested_runs(cfg, ROOT)
    msg = str(e.value)
    assert "\n" not in msg and "is a run of task 'mlm', but compare was asked for task 'lm'" in msg, msg
    assert "model.position" not in msg and "study.train" not in msg, msg
    assert "`python -m study.compare --params params.yaml task=mlm`" in msg, msg
