"""The report of a task other than lm (``python -m study.compare task=mlm|mqar``) speaks that task: each arm's mean
val_accuracy with its t interval beside the loss, the task's own yardstick as its runs recorded it (never the
prepared text's unigram and bigram), attention's share from the no-context arm, the verdict on the loss.

The test runs are fabricated (a fake ``study.runner.arms.TRAIN`` writes run folders as study.train does), so the
expected numbers are computed here from the same formulas, independently of study.analysis.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from scipy import stats

from tests.conftest import copy_project
from tests.synthetic_runs import write_run

ARMS = {"base": "baseline", "nlq": "nonlinear_q", "noctx": "no_context"}
SEEDS = [1, 2, 3, 4, 5]  # Stein's first stage: at least 5
#: mlm's recorded yardstick (the task computes it from prepared text: here a recorded value to read back)
MLM_UNIGRAM = 5.123456


def loss(arm: str, seed: int) -> float:
    own = {"base": 0.0, "nlq": 0.004 * seed, "noctx": 0.006 * (seed % 3)}[arm]
    return {"base": 2.0, "nlq": 1.95, "noctx": 4.8}[arm] + 0.01 * ((seed * 7) % 5) + own


def accuracy(arm: str, seed: int) -> float:
    return {"base": 0.40, "nlq": 0.45, "noctx": 0.01}[arm] + 0.013 * ((seed * 3) % 4) + (0.002 * seed if arm == "nlq" else 0)


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    m = float(np.mean(xs))
    h = stats.t.ppf(0.975, len(xs) - 1) * np.std(xs, ddof=1) / math.sqrt(len(xs))
    return m, m - h, m + h


@pytest.fixture
def task_study(tmp_path, monkeypatch):
    """(run the test stage and compare for a task; returns its reports folder and params)."""
    import study.runner.arms
    from study.config import composed_params, run_dir
    from study.tasks import get_task
    from study.runfolder import recorded_config

    project = copy_project(tmp_path / "project")
    monkeypatch.chdir(project)
    monkeypatch.setenv("DVC_EXP_NAME", "test")

    def train(cfg, root):
        arm = {v: a for a, v in ARMS.items()}[cfg.variant.name]
        # what study.train records for the task: mqar's chance from the task module, mlm's a fixed number
        y = (get_task("mqar").yardsticks(cfg, root, {}) if cfg.task.name == "mqar" else
             {"unigram": MLM_UNIGRAM, "masked_share": 0.8, "chosen_tokens": 1229, "k": 1.0, "method": "add-k counts"})
        d = run_dir(root, cfg, cfg.variant.name, cfg.seed)
        write_run(d, cfg.variant.name, cfg.seed, loss(arm, cfg.seed), lr=cfg.arm.lr, tokens=cfg.train.tokens,
                  results={"val_accuracy": accuracy(arm, cfg.seed), "task": cfg.task.name, "yardsticks": y})
        (d / "config.json").write_text(json.dumps(recorded_config(cfg, "0123456789abcdef")))
    monkeypatch.setattr(study.runner.arms, "TRAIN", train)

    def run(task: str):
        from study.compare import main as compare
        from study.test_runs import main as test_runs

        data = yaml.safe_load(composed_params(project, [
            f"task={task}", f"study.runs_dir={tmp_path / 'runs'}", f"study.reports_dir={tmp_path / 'reports'}",
            f"study.tracking_db={tmp_path / 'mlruns.db'}", f"study.artifact_dir={tmp_path / 'mlartifacts'}",
            f"study.seeds=[{','.join(map(str, SEEDS))}]", f"tune.runs_dir={tmp_path / 'runs_tune'}",
            f"tune.table_dir={tmp_path / 'tuning'}",
            "train.tokens=20480"]))
        data["arms"] = {a: {"variant": v, "overrides": [], "lr": 1e-2, "description": ""} for a, v in ARMS.items()}
        data["tune"]["arms"] = []
        data["study"].update(arms=list(ARMS), references=["base"], pairs=[["nlq", "base"]],
                             max_seeds=len(SEEDS), target_halfwidth=0.5)
        data["decomposition"] = {"rows": [], "start": "", "end": "", "linear": ""}
        params = tmp_path / f"params-{task}.yaml"
        params.write_text(yaml.safe_dump(data, sort_keys=False))
        assert test_runs(["--params", str(params)]) == 0
        assert compare(["--params", str(params)]) == 0
        return tmp_path / "reports" / task, data
    return run


def check_accuracy(out, md: str) -> None:
    """Every arm's row shows its mean val_accuracy and 95% t interval; metrics/ARM.json its mean."""
    summary = json.loads((out / "summary.json").read_text())
    for a in ARMS:
        m, lo, hi = t_interval([accuracy(a, s) for s in SEEDS])
        r = summary["verdict"]["arms"][a]
        assert r["val_accuracy_mean"] == pytest.approx(m, rel=1e-12) and r["val_accuracy_n"] == len(SEEDS)
        assert r["val_accuracy_ci95"] == pytest.approx([lo, hi], rel=1e-9)
        row = next(x for x in md.splitlines() if x.startswith(f"| {a} | {ARMS[a]} |"))
        assert row.endswith(f"| {m:.4f} | [{lo:.4f}, {hi:.4f}] |")
        assert json.loads((out / "metrics" / f"{a}.json").read_text())["val_accuracy"] == pytest.approx(m, rel=1e-12)
    assert "val accuracy mean | accuracy 95% CI |" in md and "in-context gain" not in md
    share = float(np.mean([loss("noctx", s) - loss("base", s) for s in SEEDS]))
    assert "## Attention's share" in md and f"| noctx | base | {len(SEEDS)} | {share:+.4f} |" in md
    assert "position_loss.png" not in md  # a labelled task records no per-position loss: no figure to link
    c = summary["verdict"]["comparisons"]["nlq vs base"]
    diff = float(np.mean([loss("nlq", s) - loss("base", s) for s in SEEDS]))
    assert c["mean_diff"] == pytest.approx(diff, rel=1e-9) and f"| nlq vs base | **{c['word']}**" in md


@pytest.mark.slow  # the compare stage's report and figures on the task's runs (~11 s)
def test_the_mqar_report_shows_accuracy_and_chance(task_study):
    out, data = task_study("mqar")
    md = (out / "comparison.md").read_text()
    check_accuracy(out, md)
    v = data["task"]["vocab_size"]
    chance, chance_acc = math.log(v - v // 2), 1 / (v - v // 2)  # a uniform guess among the values [V/2, V)
    y = json.loads((out / "summary.json").read_text())["yardsticks"]
    assert y["available"] and y["chance"] == pytest.approx(chance, abs=1e-6)
    assert y["chance_accuracy"] == pytest.approx(chance_acc, abs=1e-6)
    assert f"Yardstick: chance, a uniform guess among the V - V/2 values at each query, {chance:.4f} nats and " \
           f"accuracy {chance_acc:.4f}" in md
    assert "bigram" not in md and "unigram" not in md
    assert f"Task `mqar` (multi-query associative recall): V {v}, {data['task']['num_kv_pairs']} key-value pairs" in md


@pytest.mark.slow  # the compare stage's report and figures on the task's runs (~11 s)
def test_the_mlm_report_shows_accuracy_and_the_recorded_unigram(task_study):
    out, data = task_study("mlm")
    md = (out / "comparison.md").read_text()
    check_accuracy(out, md)
    y = json.loads((out / "summary.json").read_text())["yardsticks"]
    assert y["available"] and y["unigram"] == MLM_UNIGRAM and y["task"] == "mlm"
    assert f"Yardstick: the unigram cross-entropy of the chosen validation tokens, {MLM_UNIGRAM:.4f} nats" in md
    assert "bigram" not in md and "Task `mlm` (masked language modelling" in md


def test_runs_that_disagree_on_their_yardstick_show_none():
    from study.analysis.summary import task_yardsticks

    runs = {"a": {1: {"status": "ok", "yardsticks": {"chance": 4.85}}, 2: {"status": "ok", "yardsticks": {"chance": 4.0}}}}
    y = task_yardsticks("mqar", runs)
    assert not y["available"] and "different yardsticks" in y["note"]
    runs["a"][2]["yardsticks"] = {"chance": 4.85}
    assert task_yardsticks("mqar", runs) == {"available": True, "task": "mqar", "note": None, "chance": 4.85}
    assert not task_yardsticks("mqar", {"a": {1: {"status": "ok"}}})["available"]
