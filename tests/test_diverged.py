"""A diverged run is data, not a crash.

Real diverging runs (a NaN loss, a finite but absurd loss, a NaN validation batch) go through the real
train and the real compare; the status and step they record are checked against the divergence rule
re-applied here to what the run logged (curve.csv, MLflow's train_loss history)."""
from __future__ import annotations

import json
import math

import pytest

import study.modeling.lit_module
from study.runfolder import read_result


def strict_json(path):
    """json.loads that refuses NaN/Infinity (what a strict reader such as DVC's or a browser's does)."""
    def refuse(name):
        raise AssertionError(f"{path} holds {name}")
    return json.loads(path.read_text(), parse_constant=refuse)


def rule(curve: list[dict], train_loss: dict[int, float], vocab: int, nats: float) -> int | None:
    """The step the divergence rule stops at, re-applied to a run's record: the first non-finite train loss
    (MLflow history, {step: loss}), a non-finite validation loss, or the second of two consecutive
    evaluations above best + nats (best from ln(vocab)); a final evaluation above it; None: no divergence."""
    best, above, stop = math.log(vocab), [], None
    for step in sorted(train_loss):
        if not math.isfinite(train_loss[step]):
            stop = step
            break
    for row in curve:
        step, v = int(row["step"]), float(row["val_loss"])
        if stop is not None and step >= stop:
            break
        if not math.isfinite(v):
            return step
        if v > best + nats:
            above.append(step)
            if len(above) >= 2:
                return step
        else:
            above, best = [], min(best, v)
    return stop if stop is not None else (above[-1] if above else None)


def _curve(path):
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))


def _history(db, run_id, key="train_loss"):
    from mlflow import MlflowClient

    return {m.step: m.value for m in MlflowClient(tracking_uri=f"sqlite:///{db}").get_metric_history(run_id, key)}


@pytest.mark.slow  # nano trainings
@pytest.mark.parametrize("lr,kind", [("1e30", "nan"), ("10", "finite")])
def test_a_diverged_run_goes_through_the_real_compare_as_a_lost_point(run_in, nano_project, tmp_path, monkeypatch,
                                                                      capsys, lr, kind):
    """Issue 25 item 1: lr 1e30 (NaN) and lr 10 (a finite, absurd loss: 407 nats, then 87) beside a normal seed; the variant's
    own lr (``arm.lr``, as the lr sweep sets it), so that the two seeds still pair."""
    from mlflow import MlflowClient

    from study.analysis.runs import load_mlflow, read_run
    from study.analysis.summary import finite_or_null, summarize
    from study.analysis.tables import markdown
    from study.config import load_config

    ok = run_in("variant=baseline", "seed=1")
    bad = run_in("variant=baseline", "seed=2", f"arm.lr={lr}")
    d = tmp_path / "runs/baseline-s2"
    record, metrics = strict_json(d / "record.json"), strict_json(d / "metrics.json")  # valid JSON, no NaN
    curve, db = _curve(d / "curve.csv"), tmp_path / "mlruns.db"
    expected = rule(curve, _history(db, bad["mlflow_run_id"]), 512, 2.0)
    assert expected is not None
    assert record["status"] == "diverged" and record["diverged_step"] == expected == bad["diverged_step"]
    assert record["steps"] == expected and str(expected) in record["reason"]
    assert "val_loss" not in metrics and "val_perplexity" not in metrics and record["val_loss_per_corpus"] is None
    if kind == "finite":  # a finite loss: the evaluation rule, not a NaN, stopped it
        assert all(math.isfinite(float(r["val_loss"])) for r in curve) and "two consecutive" in record["reason"]
    run = MlflowClient(tracking_uri=f"sqlite:///{db}").get_run(bad["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "diverged"
    assert run.data.tags["diverged_step"] == str(expected) and run.data.tags["diverged"] == record["reason"]

    # the report's summary over the two runs as one arm's: one finished seed, the other a lost point
    runs = {"baseline": {1: read_run(tmp_path / "runs/baseline-s1"), 2: read_run(d)}}
    summary = finite_or_null(summarize(load_config([], nano_project), nano_project, runs))
    assert json.loads(json.dumps(summary, allow_nan=False))["diverged"] == {
        "baseline": {"2": {"step": expected, "reason": record["reason"]}}}
    assert summary["yardsticks"]["available"] and summary["verdict"] is None  # no arms: no verdict
    assert f"- baseline seed 2: diverged at step {expected}: " in markdown(summary)
    # the notebook's reader (the MLflow store) lists it as a lost point too
    cfg = load_config([f"study.tracking_db={db}", "study.seeds=[1,2]"], nano_project)
    runs = load_mlflow(cfg, nano_project)
    assert runs["baseline"][2]["status"] == "diverged" and runs["baseline"][2]["val_loss"] is None
    assert runs["baseline"][2]["diverged_step"] == expected and runs["baseline"][1]["val_loss"] == ok["val_loss"]


@pytest.mark.slow  # one nano training
def test_a_nan_validation_batch_is_a_divergence_not_dropped(run_in, tmp_path, monkeypatch):
    """Issue 25 item 2: one NaN window in the second evaluation makes it NaN (torchmetrics' default
    MeanMetric would average the finite rest), and the run stops there as diverged."""
    real = study.modeling.lit_module.GPTModule._token_losses
    calls = {"n": 0}

    def one_nan(self, batch):
        losses = real(self, batch)
        if self.trainer.global_step == 10 and not calls["n"]:  # the evaluation at step 10, its first batch
            calls["n"] += 1
            losses = losses.clone()
            losses[0, 0] = float("nan")
        return losses

    monkeypatch.setattr(study.modeling.lit_module.GPTModule, "_token_losses", one_nan)
    m = run_in("variant=baseline", "seed=1", "train.tokens=40960", "train.eval_every=5")
    assert calls["n"] == 1
    assert m["status"] == "diverged" and m["diverged_step"] == 10 and m["steps"] == 10
    assert "non-finite validation loss" in m["reason"] and m["val_loss"] is None
    curve = _curve(tmp_path / "runs/baseline-s1/curve.csv")
    assert [r["step"] for r in curve] == ["5", "10"] and curve[1]["val_loss"] == "nan"
    assert math.isfinite(float(curve[0]["val_loss"]))
    strict_json(tmp_path / "runs/baseline-s1/record.json")


def test_the_validation_mean_keeps_nan():
    """The metric itself: losses (2.0, nan, 4.0) average to NaN, not 3.0."""
    import torch

    from study.config import load_config
    from conftest import ROOT

    module = study.modeling.lit_module.GPTModule(load_config(["model=nano", "data.tokenizer=bpe", "data.vocab_size=512"], ROOT))
    for x in (2.0, float("nan"), 4.0):
        module.val_loss.update(torch.tensor(x), weight=1)
    assert math.isnan(module.val_loss.compute().item())


def test_an_old_diverged_run_with_nan_or_an_absurd_loss_is_read_as_a_lost_point(tmp_path):
    """Run folders written before: a bare NaN in val_loss_per_corpus, a val_loss of 2.9e8 beside status diverged."""
    from tests.synthetic_runs import write_run

    d = write_run(tmp_path / "baseline-s2", "baseline", 2, 4.0, status="diverged")
    (d / "record.json").write_text((d / "record.json").read_text()[:-1] + ', "val_loss_per_corpus": {"sotu": NaN}}')
    (d / "metrics.json").write_text('{"val_loss": 291316672.0, "tokens": 1000}')
    r = read_result(d)
    assert r["status"] == "diverged" and r["val_loss"] is None and r["val_loss_per_corpus"] is None
    assert r["tokens"] == 1000 and r["diverged_step"] is None


def test_every_baseline_seed_diverged_is_still_a_report(nano_project, tmp_path, monkeypatch):
    """QA: with per-corpus losses recorded and every baseline seed diverged (arm.lr=1e3 at every seed),
    compare stopped on a StopIteration in summary.per_corpus; it must write the report with the lost points."""
    from study.compare import main
    from tests.synthetic_runs import arms_overrides, write_arms

    corpora = {"sotu": 4.1, "shakespeare": 4.2, "kjv": 4.0}
    seeds = (1, 2, 3, 4, 5)
    write_arms(tmp_path / "runs", {"baseline": {s: {"loss": 4.0, "status": "diverged"} for s in seeds},
                                   "nonlinear_q": {s: {"loss": 4.0 + 0.01 * s, "per_corpus": corpora} for s in seeds}})
    monkeypatch.chdir(nano_project)
    assert main(arms_overrides(tmp_path)) == 0
    summary = strict_json(tmp_path / "reports/summary.json")
    assert summary["per_corpus"]["note"] == "no seed of ['baseline'] finished"
    assert set(summary["diverged"]["baseline"]) == {str(s) for s in seeds}
    assert summary["verdict"]["arms"]["baseline"]["n_seeds"] == 0
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "- baseline seed 1: diverged" in md and "Not shown: no seed of ['baseline'] finished." in md


@pytest.mark.slow  # two nano trainings
def test_divergence_stops_the_run_and_compare_reports_it(run_in, tmp_path, nano_project, monkeypatch):
    from mlflow import MlflowClient

    from study.analysis.summary import summarize
    from study.config import load_config

    m = run_in("variant=baseline", "seed=1", "train.lr=30", "train.min_lr=30", "train.warmup_tokens=0",
               "train.tokens=40960", "train.divergence_nats=0.5")
    assert m["status"] == "diverged" and m["steps"] == m["diverged_step"] <= 20
    assert "non-finite" in m["reason"] or "consecutive" in m["reason"] or "final" in m["reason"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = client.get_run(m["mlflow_run_id"])  # a result, not a crash (issue 25): FINISHED, tagged
    assert run.info.status == "FINISHED" and run.data.tags["diverged"] == m["reason"]
    assert run.data.tags["status"] == "diverged" and run.data.tags["diverged_step"] == str(m["diverged_step"])
    ok = run_in("variant=baseline", "seed=2")
    cfg = load_config(["study.seeds=[1,2]"], nano_project)
    runs = {"baseline": {1: {**m, "curve": []}, 2: {**ok, "curve": []}}}
    s = summarize(cfg, nano_project, runs)
    assert s["diverged"]["baseline"] == {"1": {"step": m["diverged_step"], "reason": m["reason"]}}
