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


ARMS = ("baseline", "nonlinear_q")
SEEDS = (1, 2, 3, 4, 5)


def _task_runs(tmp: Path, task: str, seeds=SEEDS, accuracy=None, arms=ARMS, runs_dir: str = "") -> list[Path]:
    """Finished test runs of the arms baseline and nonlinear_q (their variants, lr 3e-3) of ``task`` (config.json as
    study.train records it) and the test stage's plan.json; ``accuracy``: {(arm, seed): value} written into
    metrics.json as is; ``runs_dir``: study.runs_dir (default: the task's own)."""
    from study.config import load_config, run_dir
    from study.runfolder import recorded_config

    out = []
    for a in arms:
        v = load_config([f"task={task}"], ROOT).arms[a].variant
        for s in seeds:
            cfg = load_config([f"task={task}", f"variant={v}", f"seed={s}", *_dirs(tmp), "arm.lr=0.003",
                               f"study.group=test/{a}", *([f"study.runs_dir={runs_dir}"] if runs_dir else [])], ROOT)
            d = run_dir(ROOT, cfg, v, s, cfg.study.group)
            write_run(d, v, s, 2.0 + 0.01 * s + (0.02 if a == "nonlinear_q" else 0), lr=3e-3,
                      results={"val_accuracy": 0.4 + 0.01 * s, "task": task})
            (d / "config.json").write_text(json.dumps(recorded_config(cfg, "0123456789abcdef")))
            if (a, s) in (accuracy or {}):
                m = json.loads((d / "metrics.json").read_text())
                (d / "metrics.json").write_text(json.dumps({**m, "val_accuracy": accuracy[(a, s)]}))
            out.append(d)
        plan = d.parent.parent / "plan.json"
        seeds_of = json.loads(plan.read_text())["seeds"] if plan.is_file() else {}
        plan.write_text(json.dumps({"seeds": {**seeds_of, a: sorted({*seeds_of.get(a, []), *seeds})}}))
    return out


def _compare(monkeypatch, args: list[str]) -> int:
    from study.compare import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return main([*args, "study.arms=[baseline,nonlinear_q]", "study.references=[baseline]", "study.pairs=[]",
                 "arms.baseline.lr=0.003", "arms.nonlinear_q.lr=0.003", "tune.arms=[]"])


def _files(folder: Path) -> dict:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_val_accuracy_that_is_not_a_share_is_refused_naming_the_file(tmp_path, monkeypatch, capsys):
    """7.5 in an mlm run's metrics.json used to be reported as a mean accuracy of 2.78 (rc 0); "abc" ended in a
    traceback.  Now one line names the file, the value and the range, and the last report stays as it was."""
    _task_runs(tmp_path, "mlm")
    args = [*_dirs(tmp_path), "task=mlm"]
    assert _compare(monkeypatch, args) == 0
    md = (tmp_path / "reports/mlm/comparison.md").read_text()
    assert "| baseline |" in md and "| 0.4300 |" in md  # the mean of 0.41 ... 0.45
    before = _files(tmp_path / "reports")
    for bad, shown in [(7.5, "7.5"), ("abc", '"abc"'), (-0.1, "-0.1"), (True, "true")]:
        (d,) = _task_runs(tmp_path, "mlm", seeds=(2,), accuracy={("baseline", 2): bad}, arms=("baseline",))
        capsys.readouterr()
        assert _compare(monkeypatch, args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and len(err.splitlines()) == 1, err
        assert f"{d / 'metrics.json'}: 'val_accuracy' is {shown}, expected a share in [0, 1]" in err, err
        assert "`python -m study.train variant=baseline seed=2 task=mlm" in err, err  # the re-train command keeps the task
        assert "arm.lr=0.003 study.group=test/baseline`" in err, err  # ... and the arm's lr and folder
        assert _files(tmp_path / "reports") == before


def test_compare_for_lm_refuses_mlm_runs_naming_both_tasks_and_the_command(tmp_path, monkeypatch, capsys):
    """compare for task lm pointed at mlm runs used to write an lm-worded report of masked-LM losses (rc 0)."""
    _task_runs(tmp_path, "mlm")
    assert _compare(monkeypatch, [*_dirs(tmp_path), f"study.runs_dir={tmp_path / 'runs/mlm'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert f"{tmp_path / 'runs/mlm/test/baseline/baseline-s1'} is a run of task 'mlm', but compare was asked for task " \
           "'lm'" in err
    assert "`python -m study.compare --params params.yaml task=mlm`" in err, err
    assert not (tmp_path / "reports").exists()


def test_the_test_runs_of_another_task_are_refused_by_task_not_by_position(tmp_path):
    """mlm's test runs (rotary positions) read by an lm compare were refused for model.position with a re-train
    command that would have put an lm run into the mlm folder: the task is checked first."""
    from study.analysis.runs import RunsError
    from study.analysis.verdict import tested_runs
    from study.config import load_config

    _task_runs(tmp_path, "mlm", seeds=(1,), arms=("baseline_today",))
    cfg = load_config([*_dirs(tmp_path), f"study.runs_dir={tmp_path / 'runs/mlm'}", "study.arms=[baseline_today]",
                       "study.references=[baseline_today]", "study.pairs=[]", "model.position=learned"], ROOT)
    assert cfg.task.name == "lm" and cfg.model.position == "learned"
    with pytest.raises(RunsError) as e:
        tested_runs(cfg, ROOT)
    msg = str(e.value)
    assert "\n" not in msg and "is a run of task 'mlm', but compare was asked for task 'lm'" in msg, msg
    assert "model.position" not in msg and "study.train" not in msg, msg
    assert "`python -m study.compare --params params.yaml task=mlm`" in msg, msg


@pytest.mark.slow  # the test stage twice and compare twice, on faked trainings (~50 s)
def test_params_changed_while_the_test_stage_ran_fails_it_and_compare_names_the_way_out(tmp_path, monkeypatch, capsys):
    """conf/ edited and `make params` run while the test stage trained: the stage used to end well, so dvc.lock
    recorded the new values for runs trained at the old ones and every later `dvc repro` skipped it, while compare
    advised a `dvc repro` that changed nothing.  Now the stage fails in one line (dvc.lock keeps its old entry) and
    compare's refusal names `dvc repro -f test_runs`, which, run, trains at the new values and compare then reports."""
    import yaml

    import study.runner.arms
    from study.compare import main as compare
    from study.config import composed_params, run_dir
    from study.runfolder import recorded_config
    from study.test_runs import main as test_runs

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("DVC_EXP_NAME", "test")  # params.yaml holds values conf/ does not: inside `dvc exp run`
    data = yaml.safe_load(composed_params(ROOT, [*_dirs(tmp_path), "study.seeds=[1,2,3,4,5]", "train.tokens=20480", "train.warmup_tokens=4096",
                                                 f"tune.runs_dir={tmp_path / 'runs_tune'}"]))
    data["arms"] = {"base": {"variant": "baseline", "overrides": [], "lr": 1e-2, "description": ""},
                    "nlq": {"variant": "nonlinear_q", "overrides": [], "lr": 1e-2, "description": ""}}
    data["tune"]["arms"] = []
    data["study"].update(arms=["base", "nlq"], references=["base"], pairs=[["nlq", "base"]], max_seeds=5, jobs=1)
    data["decomposition"]["rows"] = []
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data, sort_keys=False))
    trained = []

    def train(cfg, root):  # what study.train writes; the first training's params.yaml is rewritten under it
        if not trained:
            params.write_text(yaml.safe_dump({**data, "train": {**data["train"], "tokens": 40960}}, sort_keys=False))
        trained.append(cfg.train.tokens)
        d = run_dir(root, cfg, cfg.variant.name, cfg.seed, cfg.study.group)
        write_run(d, cfg.variant.name, cfg.seed, 2.0 + 0.01 * cfg.seed + 0.001 * len(trained), lr=cfg.arm.lr,
                  tokens=cfg.train.tokens)
        (d / "config.json").write_text(json.dumps(recorded_config(cfg, "0123456789abcdef")))
    monkeypatch.setattr(study.runner.arms, "TRAIN", train)

    assert test_runs(["--params", str(params)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {params} changed while the test stage ran (train: ") and \
        "`dvc repro -f test_runs`" in err, err
    assert trained == [20480] + [40960] * 9  # each run reads params.yaml as it starts: the first one is stale
    assert compare(["--params", str(params)]) == 2  # what a later `dvc repro` reached: a run at params' old values
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "was trained at train.tokens 20480, but arm " in err and \
        "trains at 40960: it is not the arm's run at params.yaml's values" in err, err
    assert "`dvc repro -f test_runs`" in err, err
    assert test_runs(["--params", str(params)]) == 0  # the way out: the runs again at the new values
    assert trained[10:] and set(trained[10:]) == {40960}  # (the fake runs record no resume key: none is reused)
    assert compare(["--params", str(params)]) == 0


def _pos_run(name: str, curve, block: int = 8) -> dict:
    return {"status": "ok", "val_loss": 2.0, "name": name, "in_context_gain": 0.5, "position_loss": curve,
            "settings": {"model.block_size": block, "variant.context": "causal"}}


def test_a_missing_or_truncated_positions_csv_is_named_not_dropped_or_plotted(tmp_path, monkeypatch):
    """One missing positions.csv used to drop the reference arm's curve without a word, and a truncated one (fewer
    positions than the block) was averaged and drawn: the arm's curve is left out and the report and the figure's
    legend name the run and the file."""
    from study.analysis import figures
    from study.analysis.attention_report import attention_lines
    from study.analysis.verdict import context_use

    whole = [4.0, 3.5, 3.0, 2.8, 2.6, 2.5, 2.4, 2.3]
    base = {1: _pos_run("runs/test/base/baseline-s1", whole), 2: _pos_run("runs/test/base/baseline-s2", None)}
    nlq = {1: _pos_run("runs/test/nlq/nonlinear_q-s1", whole),
           2: _pos_run("runs/test/nlq/nonlinear_q-s2", [x - 0.2 for x in whole])}
    cut = {1: _pos_run("runs/test/cut/nonlinear_q-s1", whole), 2: _pos_run("runs/test/cut/nonlinear_q-s2", whole[:5])}
    u = {"base": context_use(base), "nlq": context_use(nlq), "cut": context_use(cut)}
    assert u["nlq"]["position_loss"] == pytest.approx([x - 0.1 for x in whole]) and u["nlq"]["position_note"] is None
    assert u["base"]["position_loss"] is None and u["base"]["position_left_out"] == 1
    assert u["base"]["position_note"] == "runs/test/base/baseline-s2/positions.csv is missing"
    assert u["cut"]["position_loss"] is None and u["cut"]["position_note"] == (
        "runs/test/cut/nonlinear_q-s2/positions.csv holds 5 positions, not the run's model.block_size 8 (truncated?)")
    short = context_use({s: _pos_run(f"runs/test/short/baseline-s{s}", whole[:5]) for s in (1, 2)})
    assert short["position_loss"] is None and short["position_left_out"] == 2  # truncated alike: still not drawn
    assert short["position_note"].startswith("runs/test/short/baseline-s1/positions.csv holds 5 positions, not the "
                                             "run's model.block_size 8 (truncated?); runs/test/short/baseline-s2/")
    arm = {"variant": "v", "overrides": [], "lr": 1e-2, "lr_from": "tuned", "tuning": "bracketed", "n_seeds": 2,
           "val_loss_mean": 2.0, "val_loss_sd": 0.01, "val_loss_ci95": [1.9, 2.1], "diverged": {}}
    verdict = {"arms": {a: {**arm, **x} for a, x in u.items()}, "comparisons": {}, "margin_pct": 1.0,
               "halfwidth_pct": 0.5, "max_seeds": 5, "n0": 2, "decomposition": None,
               "attention": [{"arm": "nlq", "reference": "base", "n_pairs": 2, "share": 0.1, "ci95": [0.0, 0.2],
                              "margin_nats": 0.02, "ratio": 5.0}]}
    lines = attention_lines(verdict)
    assert "![loss by position](figures/position_loss.png)" in lines
    assert "base's curve is not drawn: runs/test/base/baseline-s2/positions.csv is missing: restore the file(s), or " \
           "re-run the run(s)." in lines
    assert any(x.startswith("cut's curve is not drawn: runs/test/cut/nonlinear_q-s2/positions.csv holds 5 positions")
               for x in lines), lines
    assert not any(x.startswith("nlq's curve") for x in lines)
    import matplotlib.axes

    labels, real = [], matplotlib.axes.Axes.legend

    def legend(ax, *a, **k):  # the legend's entries, as drawn
        labels.extend(ax.get_legend_handles_labels()[1])
        return real(ax, *a, **k)
    monkeypatch.setattr(matplotlib.axes.Axes, "legend", legend)
    figures.position_loss({"verdict": verdict, "yardsticks": {}}, tmp_path)
    assert (tmp_path / "position_loss.png").stat().st_size > 10_000
    assert "base: not drawn (1 run(s)' positions.csv missing or truncated)" in labels, labels
    assert "cut: not drawn (1 run(s)' positions.csv missing or truncated)" in labels and \
        "nlq (in-context gain 0.500)" in labels, labels


@pytest.mark.parametrize("text, words", [("position,val_loss\n1,2.0\n2,abc\n", "line 3: val_loss is 'abc'"),
                                         ("position,val_loss\n1,2.0\n3,1.9\n", "the positions are not 1..2 in order"),
                                         ("position,val_loss\n1,2.0\n2\n", "line 3 has 1 value(s) for 2 column(s)")])
def test_a_malformed_positions_csv_is_refused_in_one_line_naming_it(tmp_path, text, words):
    from study.analysis.runs import RunsError, read_run

    d = write_run(tmp_path / "runs/baseline-s1", "baseline", 1, 2.0)
    (d / "positions.csv").write_text(text)
    with pytest.raises(RunsError) as e:
        read_run(d, tmp_path)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{d / 'positions.csv'}") and words in str(e.value)


def test_the_report_warns_where_attention_carries_under_ten_margins():
    """Attention's share under ten equivalence margins (the nano study's runs: none at all) makes the query's verdict
    uninformative, and the attention section says so, naming the ratio; at ten margins or more it says nothing."""
    from study.analysis.attention_report import WEAK_SHARE, attention_lines

    def lines(*ratios):
        rows = [{"arm": "noctx", "reference": f"ref{i}", "n_pairs": 5, "share": r * 0.02, "ci95": [0.0, 1.0],
                 "margin_nats": 0.02, "ratio": r} for i, r in enumerate(ratios)]
        return attention_lines({"arms": {}, "attention": rows})

    assert WEAK_SHARE == 10
    weak = [x for x in lines(-13.0, 56.0) if x.startswith("**Attention carries little here**")]
    assert len(weak) == 1 and "(share / margin -13.0, under 10)" in weak[0], weak
    assert not any("carries little" in x for x in lines(10.0, 56.0))
    assert any("share / margin nan" in x or "share / margin n/a" in x for x in lines(float("nan")))
