"""The report cannot mislead (issue 12): each fault found by a user is a test with the right value.

Synthetic run folders (tests/synthetic_runs.py) go through `python -m study.compare`'s main; the
expected numbers are computed here with scipy/numpy, independently of study.analysis.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tests.synthetic_runs import arm_run, arms_overrides, write_arms, write_run

SEEDS = (1, 2, 3, 4, 5)
BASE = {1: 4.00, 2: 4.10, 3: 3.95, 4: 4.05, 5: 3.98}


def _digest(meta_path: Path) -> str:
    """The prepared-data digest, computed here from its definition: sha256 of meta.json's parsed content
    (keys sorted, the legacy ``seconds`` left out), 16 hex digits."""
    meta = json.loads(meta_path.read_text())
    meta.pop("seconds", None)
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]


def _study(tmp_path: Path, arms=("baseline", "nonlinear_q"), seeds=SEEDS) -> list[str]:
    return arms_overrides(tmp_path, arms, seeds)


def _arms(tmp_path: Path, losses: dict, **kw) -> None:
    """The test runs of ``losses`` ({arm: {seed: loss}}) under tmp_path/runs."""
    write_arms(tmp_path / "runs", losses, **kw)


def _compare(nano_project, monkeypatch, args):
    from study.compare import main

    monkeypatch.chdir(nano_project)
    return main(args)


def _summary(tmp_path):
    return json.loads((tmp_path / "reports/summary.json").read_text())


# -- pairing ----------------------------------------------------------------------------------------
def test_an_adhoc_run_with_other_tokens_is_refused_by_name(nano_project, tmp_path, monkeypatch, capsys):
    """An arm's test run replaced by a run of other tokens and lr (README's one-run example): compare names it."""
    _arms(tmp_path, {"baseline": BASE, "nonlinear_q": {s: x - 0.03 for s, x in BASE.items()}}, tokens=20480)
    write_run(arm_run(tmp_path / "runs", "nonlinear_q", 1), "nonlinear_q", 1, 3.5, tokens=8192, train={"lr": 2e-3})
    assert _compare(nano_project, monkeypatch, _study(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert "test/nonlinear_q/nonlinear_q-s1 was trained at train.tokens 8192, but arm 'nonlinear_q' trains at 20480" in err


def test_seeds_of_one_arm_with_another_architecture_are_refused_by_name(nano_project, tmp_path, monkeypatch, capsys):
    """QA: `python -m study.train variant=baseline seed=2 variant.qk_norm=rms` (a recipe switch on the command line)
    wrote the baseline's seed 2, and compare averaged it with the plain baseline's other seeds as one arm."""
    base = {s: {"loss": x, "status": "ok" if s != 3 else "diverged"} for s, x in BASE.items()}  # a lost point
    _arms(tmp_path, {"baseline": base, "nonlinear_q": {s: x - 0.03 for s, x in BASE.items()}})
    assert _compare(nano_project, monkeypatch, _study(tmp_path)) == 0
    config = arm_run(tmp_path / "runs", "baseline", 2) / "config.json"
    config.write_text(config.read_text().replace('"variant": {', '"variant": {"qk_norm": "rms", '))
    capsys.readouterr()
    assert _compare(nano_project, monkeypatch, _study(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "baseline-s2 differs from" in err and "variant.qk_norm 'rms'" in err and len(err.strip().splitlines()) == 1


def test_block_size_mismatch_is_refused_and_the_header_states_recorded_settings(nano_project, tmp_path, monkeypatch,
                                                                                capsys):
    """Baselines at the study's block_size 64, nonlinear_q at 16: refused (it printed +0.03%, p = 0.615 before)."""
    nlq = {s: x + 0.001 * s for s, x in BASE.items()}
    _arms(tmp_path, {"baseline": BASE, "nonlinear_q": {s: {"loss": x, "model": {"block_size": 16}} for s, x in nlq.items()}})
    assert _compare(nano_project, monkeypatch, _study(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "nonlinear_q-s1 was trained at model.block_size 16, but arm 'nonlinear_q' trains at 64" in err
    # the same runs at one block size pair; the header states what they recorded, not conf/study.yaml's
    _arms(tmp_path, {"baseline": BASE, "nonlinear_q": nlq})
    assert _compare(nano_project, monkeypatch, _study(tmp_path)) == 0
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "block_size 64" in md and "20,480 tokens per run" in md and "`0123456789abcdef`" in md
    assert _summary(tmp_path)["settings"]["model.block_size"] == 64


def test_other_prepared_data_or_data_seed_do_not_pair(tmp_path):
    from study.analysis.pairing import PairingError, check
    from study.analysis.runs import RunsError, read_run

    runs = {v: {s: read_run(write_run(tmp_path / f"{v}-s{s}", v, s, 4.0)) for s in (1, 2)}
            for v in ("baseline", "nonlinear_q")}
    assert check(runs, "x")["train.tokens"] == 1000
    runs["nonlinear_q"][2] = read_run(write_run(tmp_path / "odd", "nonlinear_q", 2, 4.0, digest="ffffffffffffffff"))
    with pytest.raises(PairingError, match=r"odd differs in data_digest 'ffffffffffffffff' \(vs '0123456789abcdef'\)"):
        check(runs, "x")
    runs["nonlinear_q"][2] = read_run(write_run(tmp_path / "odd", "nonlinear_q", 2, 4.0, train={"data_seed": 7}))
    with pytest.raises(PairingError, match="at seed 2.*data seed"):
        check(runs, "x")
    # a run replaced by hand with train.overwrite=true computes the same thing: it pairs
    runs["nonlinear_q"][2] = read_run(write_run(tmp_path / "redone", "nonlinear_q", 2, 4.0, train={"overwrite": True}))
    assert check(runs, "x")["train.tokens"] == 1000
    runs["nonlinear_q"][2] = read_run(write_run(tmp_path / "odd", "nonlinear_q", 2, 4.0, train={"data_seed": 7}))
    # a run folder that recorded no settings is refused, not guessed
    (tmp_path / "odd/config.json").unlink()
    with pytest.raises(RunsError, match="no config.json"):
        read_run(tmp_path / "odd")


def test_lm_runs_recorded_under_other_defaults_of_another_task_still_pair(tmp_path):
    """An lm run's task fields other than lm's own (none) are not compared: mqar's defaults changed (8 -> 4 pairs)
    between two runs of one study; a run of another task does not pair with lm runs."""
    from study.analysis.pairing import PairingError, check
    from study.analysis.runs import read_run

    def run(name, variant, seed, task):
        d = write_run(tmp_path / name, variant, seed, 4.0)
        config = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**config, "task": task}))
        return read_run(d)

    old = {"name": "lm", "num_kv_pairs": 8, "train_examples": 100000, "mask_fraction": 0.15}
    new = {**old, "num_kv_pairs": 4, "train_examples": 20000}
    runs = {"baseline": {s: run(f"b{s}", "baseline", s, old) for s in (1, 2)},
            "nonlinear_q": {s: run(f"n{s}", "nonlinear_q", s, new) for s in (1, 2)}}
    shared = check(runs, "x")
    assert shared["train.tokens"] == 1000 and not [k for k in shared if k.startswith("task.")]
    runs["nonlinear_q"][2] = run("mq", "nonlinear_q", 2, {**new, "name": "mqar"})
    with pytest.raises(PairingError, match=r"mq differs in task.name 'mqar' \(vs None\), task.num_kv_pairs 4"):
        check(runs, "x")


def test_runs_at_learned_positions_pair_and_a_rope_run_does_not(tmp_path):
    """Runs that record position 'learned' pair; a rotary run among them is named with the setting that differs."""
    from study.analysis.pairing import PairingError, check
    from study.analysis.runs import read_run

    old = {s: read_run(write_run(tmp_path / f"b{s}", "baseline", s, 4.0, model={"position": "learned"})) for s in (1, 2)}
    new = {s: read_run(write_run(tmp_path / f"n{s}", "nonlinear_q", s, 3.9, model={"position": "learned"}))
           for s in (1, 2)}
    assert check({"baseline": old, "nonlinear_q": new}, "x")["model.position"] == "learned"
    new[2] = read_run(write_run(tmp_path / "rope", "nonlinear_q", 2, 3.9, model={"position": "rope"}))
    with pytest.raises(PairingError, match=r"rope differs in model.position 'rope' \(vs 'learned'\)"):
        check({"baseline": old, "nonlinear_q": new}, "x")


# -- statistics at small n ----------------------------------------------------------------------------
def test_verdict_power_and_figures_against_scipy(nano_project, tmp_path, monkeypatch):
    var = {1: 3.97, 2: 4.02, 3: 3.94, 4: 4.06, 5: 3.95}
    corpora = lambda x: {"sotu": x + 0.2, "kjv": x - 0.5}  # noqa: E731
    _arms(tmp_path, {"baseline": {s: {"loss": x, "per_corpus": corpora(x)} for s, x in BASE.items()},
                     "nonlinear_q": {s: {"loss": x, "per_corpus": corpora(x)} for s, x in var.items()}})
    (tmp_path / "reports/figures").mkdir(parents=True)
    (tmp_path / "reports/figures/final_val_loss.png").write_bytes(b"\x89PNG an earlier report's figure")
    assert _compare(nano_project, monkeypatch, _study(tmp_path)) == 0
    summary = _summary(tmp_path)
    c = summary["verdict"]["comparisons"]["nonlinear_q vs baseline"]
    b, v = np.array([BASE[s] for s in SEEDS]), np.array([var[s] for s in SEEDS])
    d, n = v - b, len(SEEDS)
    assert c["p_value"] == pytest.approx(stats.ttest_rel(v, b).pvalue, rel=1e-9)
    half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
    assert c["ci95"] == pytest.approx([d.mean() - half, d.mean() + half])
    assert c["pct"]["mean"] == pytest.approx(100 * d.mean() / b.mean())
    # per corpus: each comparison paired by seed, with the power of its pairs (noncentral t, and by simulation)
    pc = summary["per_corpus"]["comparisons"]["nonlinear_q vs baseline"]["kjv"]
    kb, kv = b - 0.5, v - 0.5
    assert pc["pct_log_loss"] == pytest.approx(100 * (kv - kb).mean() / kb.mean())
    assert summary["per_corpus"]["arms"]["baseline"]["sotu"] == pytest.approx((b + 0.2).mean())
    pw, sd = pc["power"], d.std(ddof=1)
    mde = pw["min_detectable_diff"]
    tc = stats.t.ppf(0.975, n - 1)
    nc = mde * math.sqrt(n) / sd
    assert stats.nct.sf(tc, n - 1, nc) + stats.nct.cdf(-tc, n - 1, nc) == pytest.approx(0.80, abs=1e-6)
    rng = np.random.default_rng(0)
    sims = rng.normal(mde, sd, size=(200_000, n))
    t = sims.mean(1) / (sims.std(1, ddof=1) / math.sqrt(n))
    assert np.mean(np.abs(t) > tc) == pytest.approx(0.80, abs=0.005)
    assert pw["min_detectable_pct"] == pytest.approx(100 * mde / kb.mean())
    eff, need = 0.024 * kb.mean(), pw["seeds_for_paper"]  # seeds for the paper's -2.40%: the first n at 80% power

    def power(k):
        tc, nc = stats.t.ppf(0.975, k - 1), eff * math.sqrt(k) / sd
        return stats.nct.sf(tc, k - 1, nc) + stats.nct.cdf(-tc, k - 1, nc)
    assert power(need) >= 0.8 and (need == 2 or power(need - 1) < 0.8)
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "## Per corpus" in md and f"| kjv | {pc['pct_log_loss']:+.2f}% [" in md
    # figures: the verdict and per-corpus figures exist; the profiles' do not, nor an earlier report's
    figs = sorted(p.name for p in (tmp_path / "reports/figures").iterdir())
    assert figs == ["per_corpus.png", "train_loss_curves.png", "val_loss_curves.png", "verdict.png"]


@pytest.mark.parametrize("shift, why", [(0.0, "identical losses"), (0.01, "constant shift across seeds")])
def test_zero_variance_is_flagged_not_p_nan_or_zero(nano_project, tmp_path, monkeypatch, shift, why):
    _arms(tmp_path, {"baseline": BASE, "nonlinear_q": {s: x + shift for s, x in BASE.items()}})
    assert _compare(nano_project, monkeypatch, _study(tmp_path)) == 0
    c = _summary(tmp_path)["verdict"]["comparisons"]["nonlinear_q vs baseline"]
    assert c["undefined"] == why and c["p_value"] is None and c["p_value_bh"] is None and c["ci95"] == [None, None]
    assert c["mean_diff"] == pytest.approx(shift, abs=1e-12)
    md = (tmp_path / "reports/comparison.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| nonlinear_q vs baseline |"))
    cells = [x.strip() for x in row.split("|")]
    assert "nan" not in row.lower() and cells[12] == "n/a"  # the paired t test's p: undefined, never 0


def test_frontier_needs_three_sizes(nano_project, tmp_path, monkeypatch):
    """The default study's two baseline sizes: 'not fitted' (it drew b = -0.30 through two points)."""
    _arms(tmp_path, {"baseline": {s: {"loss": x, "params": 1000} for s, x in BASE.items()},
                     "baseline_mlp4.75": {s: {"loss": x - 0.05, "params": 1125} for s, x in BASE.items()},
                     "identity_q": {s: {"loss": x - 0.1, "params": 900} for s, x in BASE.items()}})
    args = _study(tmp_path, ("baseline", "identity_q", "baseline_mlp4.75")) + [
        "decomposition.family=[baseline,baseline_mlp4.75]", "decomposition.worth=[identity_q]"]
    assert _compare(nano_project, monkeypatch, args) == 0
    f = _summary(tmp_path)["verdict"]["frontier"]
    assert f["fitted"] is False and "not fitted: 2 size(s)" in f["reason"]
    assert "Frontier not fitted: 2 size(s)" in (tmp_path / "reports/comparison.md").read_text()


def test_multiplier_interval_is_a_t_interval_over_seeds_not_a_bootstrap():
    """Three seeds: the interval is exp(mean +- t sd/sqrt(n)) of the per-seed log multipliers."""
    from study.analysis.stats import parameter_multiplier

    sizes = (1e5, 1.2e5, 1.6e5)
    noise = {1: (0.01, -0.02, 0.0, 0.03), 2: (0.0, 0.01, -0.01, -0.02), 3: (-0.02, 0.0, 0.02, 0.01)}
    family = {n: {s: 10 * n ** -0.1 + noise[s][k] for s in (1, 2, 3)} for k, n in enumerate(sizes)}
    variant = {s: 10 * 1.5e5 ** -0.1 + noise[s][3] for s in (1, 2, 3)}
    r = parameter_multiplier(family, variant, 100_000)
    logs = []
    for s in (1, 2, 3):  # each seed's own frontier, by numpy
        b, a = np.polyfit(np.log(sizes), np.log([family[n][s] for n in sizes]), 1)
        logs.append(math.log(math.exp((math.log(variant[s]) - a) / b) / 100_000))
    half = stats.t.ppf(0.975, 2) * np.std(logs, ddof=1) / math.sqrt(3)
    assert r["ci95"] == pytest.approx([math.exp(np.mean(logs) - half), math.exp(np.mean(logs) + half)], rel=1e-9)
    assert r["ci_note"] is None


# -- yardsticks, curves ----------------------------------------------------------------------------
def test_yardsticks_shown_only_for_the_runs_own_data(nano_project, tmp_path, monkeypatch):
    data = tmp_path / "tokens"
    data.mkdir()
    meta = {"tokenizer": "bpe", "yardsticks": {"unigram": {"all": 6.1, "sotu": 6.0, "kjv": 5.9},
                                               "bigram": {"all": 4.9, "sotu": 4.8, "kjv": 4.7}, "method": "test"}}
    (data / "meta.json").write_text(json.dumps(meta))
    digest = _digest(data / "meta.json")
    _arms(tmp_path, {v: {s: {"loss": BASE[s] + off(s), "per_corpus": {"sotu": BASE[s] + off(s), "kjv": BASE[s] + off(s) - 0.3}}
                         for s in SEEDS} for v, off in (("baseline", lambda s: 0.0), ("nonlinear_q", lambda s: -0.02 * s))},
          digest=digest)
    args = _study(tmp_path) + [f"data.dir={data}"]
    assert _compare(nano_project, monkeypatch, args) == 0
    y = _summary(tmp_path)["yardsticks"]
    assert y["available"] and y["unigram"]["all"] == 6.1 and y["bigram"]["kjv"] == 4.7
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "Yardsticks on the same validation windows: unigram 6.1000 nats, bigram 4.9000 nats" in md
    assert "| kjv | " in md and " | 5.9000 | 4.7000 |" in md  # the corpus's row: each arm's loss, then the yardsticks
    (data / "meta.json").write_text(json.dumps({**meta, "yardsticks": {**meta["yardsticks"], "block_size": 128}}))
    write_digest = _digest(data / "meta.json")
    for s in SEEDS:  # the runs evaluated windows of 64 tokens (synthetic_runs), the yardsticks 128
        for v in ("baseline", "nonlinear_q"):
            config = arm_run(tmp_path / "runs", v, s) / "config.json"
            config.write_text(json.dumps({**json.loads(config.read_text()), "data_digest": write_digest}))
    assert _compare(nano_project, monkeypatch, args) == 0
    assert "the runs evaluated 128 windows of 64" in _summary(tmp_path)["yardsticks"]["note"]
    (data / "meta.json").write_text(json.dumps({**meta, "tokenizer": "gpt2"}))  # re-prepared since the runs
    assert _compare(nano_project, monkeypatch, args) == 0
    y = _summary(tmp_path)["yardsticks"]
    assert not y["available"] and "not the data the runs trained on" in y["note"]


def test_curves_are_in_millions_of_tokens_from_zero(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from study.analysis.figures import curves
    from study.analysis.runs import read_run

    runs = {"baseline": {1: read_run(write_run(tmp_path / "b", "baseline", 1, 4.0, tokens=3_000_000))}}
    fig, ax = plt.subplots()
    curves(runs, "val_loss", ax)
    fig.canvas.draw()
    assert ax.get_xlim()[0] == 0
    assert list(ax.lines[0].get_xdata()) == pytest.approx([1.0, 2.0, 3.0])
    assert ax.xaxis.get_offset_text().get_text() == "" and "millions" in ax.get_xlabel()
    plt.close(fig)


# -- the record a run leaves -------------------------------------------------------------------------
@pytest.mark.slow  # one nano training
def test_a_run_records_its_settings_and_data_digest(run_in, tmp_path, nano_project):
    from study.analysis.runs import read_run

    m = run_in("variant=nonlinear_q", "seed=1", "train.tokens=4096", "train.eval_every=1")
    d = tmp_path / "runs/nonlinear_q-s1"
    config = json.loads((d / "config.json").read_text())
    assert not {"study", "scale_ladder", "defaults", "arms", "tune", "tuned", "decomposition"} & set(config)
    assert config["train"]["tokens"] == 4096 and config["variant"]["name"] == "nonlinear_q" and config["seed"] == 1
    meta = nano_project / "data/tokens/meta.json"
    assert config["data_digest"] == _digest(meta)
    run = read_run(d)
    assert run["settings"]["model.block_size"] == config["model"]["block_size"] and run["val_loss"] == m["val_loss"]
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    assert client.get_run(m["mlflow_run_id"]).data.tags["data_digest"] == config["data_digest"]


def test_mlflow_reader_pairs_and_counts_only_finished_runs(nano_project, tmp_path):
    """The notebook's reader: KILLED runs are ignored; a finished run at other settings is refused by name."""
    from mlflow import MlflowClient

    from study.analysis.pairing import PairingError
    from study.analysis.runs import load_mlflow
    from study.config import load_config

    db = tmp_path / "m.db"
    cfg = load_config([f"study.tracking_db={db}", "study.name=nb", f"study.artifact_dir={tmp_path / 'art'}"],
                      nano_project)
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.create_experiment("nb", artifact_location=(tmp_path / "art").as_uri())

    started = []

    def run(variant, seed, loss, tokens="20480", status="FINISHED"):
        started.append(1_700_000_000_000 + 1000 * len(started))  # ordered start times: the newest is known
        r = client.create_run(exp, start_time=started[-1], run_name=f"{variant}-s{seed}", tags={"variant": variant, "seed": str(seed),
                                                                        "group": "main", "data_digest": "abc"})
        for k, v in {"train.tokens": tokens, "train.batch_tokens": "2048", "model.block_size": "64",
                     "variant.name": variant, "seed": str(seed), "study.name": "nb"}.items():
            client.log_param(r.info.run_id, k, v)
        for step, x in ((5, loss + 0.5), (10, loss)):
            client.log_metric(r.info.run_id, "val_loss", x, step=step)
            client.log_metric(r.info.run_id, "train_loss", x + 0.1, step=step)
        client.log_metric(r.info.run_id, "final_val_loss", loss)
        client.log_metric(r.info.run_id, "non_embedding_params", 1000)
        client.set_terminated(r.info.run_id, status)

    for s in (1, 2):
        run("baseline", s, 4.0 + 0.1 * s)
        run("nonlinear_q", s, 3.9 + 0.1 * s)
    run("nonlinear_q", 1, 3.0, tokens="8192", status="KILLED")  # a killed ad-hoc run: not counted
    runs = load_mlflow(cfg, nano_project)
    assert runs["nonlinear_q"][1]["val_loss"] == pytest.approx(4.0)
    assert [r["tokens"] for r in runs["nonlinear_q"][1]["curve"]] == [10240.0, 20480.0]
    run("nonlinear_q", 1, 3.0, tokens="8192")  # the same, finished: the newest stands for the run, and is refused
    with pytest.raises(PairingError, match=r"nonlinear_q-s1 differs in train.tokens '8192' \(vs '20480'\)"):
        load_mlflow(cfg, nano_project)


# -- the profiles through the same checks ------------------------------------------------------------
def test_two_ladder_sizes_are_not_fitted_and_a_size_at_another_lr_is_refused(nano_project, tmp_path, monkeypatch,
                                                                          capsys):
    runs = tmp_path / "runs"
    for s in SEEDS:
        for v in ("baseline", "nonlinear_q"):
            for model, n in (("ladder-64", 64), ("ladder-96", 96)):
                write_run(runs / f"scale_ladder/{model}/{v}-s{s}", v, s, BASE[s] - n / 1000 - 0.002 * s * (v != "baseline"),
                          tokens=100 * n, params=1000 * n, fpt=6000 * n,
                          model={"name": model, "n_layer": 4, "n_head": 4, "n_embd": n},
                          results={"in_context_gain": n / 100 + 0.01 * s + 0.05 * (v != "baseline")})
    args = _study(tmp_path) + ["study.arms=[]", "scale_ladder.models=[ladder-64,ladder-96]",
                               "scale_ladder.lr_from_tuned=false"]
    assert _compare(nano_project, monkeypatch, args) == 0
    la = _summary(tmp_path)["scale_ladder"]
    assert la["fits"] == {} and "not fitted: 2 size(s)" in la["fit_note"]
    assert all(s["compute_multiplier"] == {} and "baseline_fit" not in s for s in la["sizes"])
    b = np.array([BASE[s] - 0.064 for s in SEEDS])
    v = b - 0.002 * np.array(SEEDS)
    assert la["sizes"][0]["vs_baseline"]["nonlinear_q"]["p_value"] == pytest.approx(stats.ttest_rel(v, b).pvalue)
    md = (tmp_path / "reports/comparison.md").read_text()
    assert "| ladder-64 | 4 x 64 |" in md and "n/a (not fitted: 2 size(s)" in md
    # the in-context gain of each size: the mean over its seeds (0.64 + 0.01 x mean seed, +0.05 for the variant)
    gains = {v: la["sizes"][0]["variants"][v]["in_context_gain"] for v in ("baseline", "nonlinear_q")}
    assert gains == pytest.approx({"baseline": 0.64 + 0.01 * np.mean(SEEDS), "nonlinear_q": 0.69 + 0.01 * np.mean(SEEDS)})
    assert f"| {gains['nonlinear_q']:.3f} vs {gains['baseline']:.3f} |" in md
    assert (tmp_path / "reports/figures/scale_ladder.png").exists()
    assert not (tmp_path / "reports/figures/frontier.png").exists()  # a figure is written only where it applies
    # one ladder size trained at another lr than the other: the sizes do not pair
    write_run(runs / "scale_ladder/ladder-96/nonlinear_q-s2", "nonlinear_q", 2, 3.9, tokens=9600, params=96000,
              fpt=576000, model={"name": "ladder-96", "n_layer": 4, "n_head": 4, "n_embd": 96}, train={"lr": 1e-3})
    capsys.readouterr()
    assert _compare(nano_project, monkeypatch, args) == 2
    err = capsys.readouterr().err
    assert "scale_ladder/ladder-96/nonlinear_q-s2 differs in train.lr 0.001 (vs 0.003)" in err


# -- hand-edited run files: one line naming the file, the key and the fix; the reports kept ---------------
HAND_EDITED = [  # (id, file of runs/test/nonlinear_q/nonlinear_q-s2, new content, words of the error)
    ("val_loss a string", "metrics.json", {"val_loss": "3.9", "tokens": 1000}, ["'val_loss' is a string"]),
    ("val_loss missing", "metrics.json", {"tokens": 1000}, ["'val_loss' is missing"]),
    ("val_loss null", "metrics.json", {"val_loss": None, "tokens": 1000}, ["'val_loss' is null"]),
    ("metrics not JSON", "metrics.json", "{\"val_loss\": 3.", ["is not valid JSON"]),
    ("metrics a list", "metrics.json", [3.9], ["not a JSON object"]),
    ("record not JSON", "record.json", "{\"status\": ", ["is not valid JSON"]),
    ("status unknown", "record.json", {"status": "great", "variant": "nonlinear_q", "seed": 2}, ["'status' is a string"]),
    ("params a string", "record.json", {"status": "ok", "variant": "nonlinear_q", "seed": 2,
                                        "non_embedding_params": "1k"}, ["'non_embedding_params' is a string"]),
    # another run's files, or a hand-edited variant/seed: the folder's name says which run it holds
    ("record of another variant", "record.json", {"status": "ok", "variant": "baseline", "seed": 2},
     ['records variant "baseline" seed 2', "is nonlinear_q-s2", "runs/test/nonlinear_q/baseline-s2"]),
    ("record of another seed", "record.json", {"status": "ok", "variant": "nonlinear_q", "seed": 1},
     ['records variant "nonlinear_q" seed 1', "runs/test/nonlinear_q/nonlinear_q-s1"]),
    ("record without seed", "record.json", {"status": "ok", "variant": "nonlinear_q"}, ["seed missing"]),
    ("config of another variant", "config.json", lambda t: t.replace('"name": "nonlinear_q"', '"name": "baseline"'),
     ['records variant "baseline" seed 2']),
    ("config of another seed", "config.json", lambda t: t.replace('"seed": 2', '"seed": 3'),
     ['records variant "nonlinear_q" seed 3']),
    ("config a list", "config.json", [1], ["holds a list, not a JSON object"]),
    # losses no trained language model has (and exp() of which overflows)
    ("val_loss 800", "metrics.json", {"val_loss": 800, "tokens": 1000}, ["'val_loss' is a number (800)", "(0, 100]"]),
    ("val_loss 1e308", "metrics.json", {"val_loss": 1e308, "tokens": 1000}, ["'val_loss' is a number", "(0, 100]"]),
    ("val_loss negative", "metrics.json", {"val_loss": -0.5, "tokens": 1000}, ["'val_loss' is a number (-0.5)"]),
    ("val_loss zero", "metrics.json", {"val_loss": 0, "tokens": 1000}, ["'val_loss' is a number (0)"]),
    # curve.csv: every row every column, a number
    ("curve short row", "curve.csv", lambda t: t + "6,1,2\n", ["line 5 has 3 value(s) for 5 column(s)"]),
    ("curve text cell", "curve.csv", lambda t: t + "6,1,2,x,3\n", ["line 5: val_loss is 'x', not a number"]),
    ("curve empty", "curve.csv", "", ["is empty"]),
    ("curve header only", "curve.csv", "step,tokens,train_loss,val_loss,lr\n", ["has no rows"]),
    ("curve lacks a column", "curve.csv", "step,tokens,train_loss,lr\n1,2,3,4\n", ["lacks the column(s) val_loss"]),
]


@pytest.fixture(scope="module")
def reported(nano_project, tmp_path_factory):
    """A study of two arms compared once: (its folder, compare's arguments, its report files with their bytes and
    mtimes).  Each case below edits one file, compares, and restores the file, so the report is written once."""
    root = tmp_path_factory.mktemp("reported")
    _arms(root, {"baseline": BASE, "nonlinear_q": {s: x - 0.03 for s, x in BASE.items()}})
    args = _study(root)
    with pytest.MonkeyPatch.context() as mp:
        assert _compare(nano_project, mp, args) == 0
    reports = sorted(p for p in (root / "reports").rglob("*") if p.is_file())
    return root, args, {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in reports}


@pytest.mark.parametrize("case,name,content,words", HAND_EDITED, ids=[c[0] for c in HAND_EDITED])
def test_hand_edited_run_files_are_refused_in_one_line_and_the_reports_kept(nano_project, reported, monkeypatch,
                                                                            capsys, case, name, content, words):
    root, args, before = reported
    path = arm_run(root / "runs", "nonlinear_q", 2) / name
    original = path.read_bytes()
    path.write_text(content(path.read_text()) if callable(content)
                    else content if isinstance(content, str) else json.dumps(content))
    capsys.readouterr()
    try:
        assert _compare(nano_project, monkeypatch, args) == 2
    finally:
        path.write_bytes(original)
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert str(path) in err and "python -m study.train variant=nonlinear_q seed=2" in err and "restore" in err, err
    for w in words:
        assert w in err, (w, err)
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in before} == before  # nothing overwritten
    assert sorted(p for p in (root / "reports").rglob("*") if p.is_file()) == sorted(before)


def test_a_run_folder_copied_onto_another_runs_name_is_refused(nano_project, tmp_path, monkeypatch, capsys):
    """`cp -a` of the baseline's seed-2 folder onto nonlinear_q's used to compare the baseline with itself (-0.00%)."""
    import shutil

    _arms(tmp_path, {"baseline": BASE, "nonlinear_q": {s: x - 0.03 for s, x in BASE.items()}})
    copied = arm_run(tmp_path / "runs", "nonlinear_q", 2)
    shutil.rmtree(copied)
    shutil.copytree(arm_run(tmp_path / "runs", "baseline", 2), copied)
    assert _compare(nano_project, monkeypatch, _study(tmp_path)) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert f"{copied / 'record.json'} records variant \"baseline\" seed 2" in err, err
    assert "move the folder back to" in err and "baseline-s2" in err, err
    assert "python -m study.train variant=nonlinear_q seed=2" in err and "-0.00%" not in cap.out
    assert not (tmp_path / "reports").exists()


def test_missing_run_hint_keeps_the_overrides_when_the_picks_alone_fail_validation(tmp_path, monkeypatch, capsys):
    """The project's own conf/ with data.tokenizer=bpe, which fails validation without its data.vocab_size, so the
    hint used to drop every override; run as printed, it must train that run."""
    import re
    import shlex

    from study.compare import main
    from study.config import ConfigError, load_config, run_dir

    root = Path(__file__).resolve().parent.parent
    with pytest.raises(ConfigError):
        load_config(["model=nano", "data.tokenizer=bpe"], root)  # the premise: one override alone fails
    runs = tmp_path / "runs"
    (runs / "test").mkdir(parents=True)
    (runs / "test/plan.json").write_text(json.dumps({"seeds": {"baseline": list(SEEDS), "nonlinear_q": list(SEEDS)}}))
    given = ["model=nano", "data.tokenizer=bpe", "data.vocab_size=512", "train.tokens=20480", "train.warmup_tokens=4096"]
    monkeypatch.chdir(root)
    assert main([f"study.runs_dir={runs}", f"study.reports_dir={tmp_path / 'reports'}", "study.arms=[baseline,nonlinear_q]",
                 "study.references=[baseline]", "study.pairs=[]",
                 *given]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    cmds = re.findall(r"`python -m study\.train ([^`]*)`", err)
    assert len(cmds) == 3, err  # the first three of the baseline's five
    overrides = shlex.split(cmds[1])
    assert overrides[:2] == ["variant=baseline", "seed=2"] and set(given) <= set(overrides), overrides
    cfg = load_config(overrides, root)  # the printed command composes and validates ...
    assert (cfg.model.name, cfg.data.vocab_size, cfg.train.tokens) == ("nano", 512, 20480)
    assert run_dir(root, cfg, cfg.variant.name, cfg.seed, cfg.study.group) == runs / "test/baseline/baseline-s2"  # ... here
    assert cfg.arm.lr == load_config([], root).tuned.lr["baseline"]  # at the arm's lr*
    assert not (tmp_path / "reports").exists()


def test_missing_run_set_aside_by_a_killed_start_is_named(nano_project, tmp_path):
    """A start killed after it set the last run's files aside (RUN/.replaced/) and before its Trainer existed
    leaves the run without metrics.json: compare names the folder that holds it and that the run's train
    command puts it back, instead of only asking to train it again."""
    from study.analysis.runs import RunsError, load_runs
    from study.config import load_config

    cfg = load_config([f"study.runs_dir={tmp_path / 'runs'}"], nano_project)
    for v in ("baseline", "nonlinear_q"):
        write_run(tmp_path / f"runs/{v}-s1", v, 1, 4.0)
    aside = tmp_path / "runs/nonlinear_q-s1/.replaced"
    aside.mkdir()
    for name in ("metrics.json", "record.json"):
        (aside.parent / name).replace(aside / name)
    with pytest.raises(RunsError) as e:
        load_runs(cfg, nano_project, ["baseline", "nonlinear_q"], [1], "")
    msg = str(e.value)
    assert msg.startswith("1 run(s) of the study have no metrics.json (1 of them finished before: ") and \
        f"{aside} holds what a re-run killed" in msg and "variant=nonlinear_q seed=1" in msg, msg
    (aside / "metrics.json").unlink()  # nothing finished set aside: an ordinary missing run, no such words
    with pytest.raises(RunsError) as e:
        load_runs(cfg, nano_project, ["baseline", "nonlinear_q"], [1], "")
    assert "finished before" not in str(e.value) and "variant=nonlinear_q seed=1" in str(e.value), str(e.value)


def test_compare_without_arms_or_ladder_refuses_in_one_line(nano_project, tmp_path, monkeypatch, capsys):
    """Nothing to compare (study.arms empty, the scale ladder off): one line naming the fix; nothing written."""
    assert _compare(nano_project, monkeypatch, _study(tmp_path) + ["study.arms=[]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: study.arms is empty and the scale ladder is off: nothing to compare") and \
        len(err.splitlines()) == 1, err
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("plan, words", [
    ("[]", "is not the test stage's plan"),
    ('{"seeds": null}', "is not the test stage's plan"),
    ('{"seeds": {"baseline": "12345", "nonlinear_q": [1, 2, 3, 4, 5]}}', "is not the test stage's plan"),
    ('{"seeds": {"baseline": [1, 2, 3, 4, 5, 201], "nonlinear_q": [1, 2, 3, 4, 5]}}',
     "plans seeds [1, 2, 3, 4, 5, 201] for arm 'baseline', but this study tests study.seeds=[1, 2, 3, 4, 5] first"),
    ('{"seeds": {"baseline": [1], "nonlinear_q": [1, 2, 3, 4, 5]}}', "plans seeds [1] for arm 'baseline'"),
])
def test_a_plan_that_is_not_this_studys_is_refused_in_one_line(nano_project, tmp_path, monkeypatch, capsys, plan,
                                                                words):
    """A hand-edited or stale runs/test/plan.json (another study's seeds, a pilot seed, one seed) used to be reported
    from (or end in a traceback): one line naming the plan and the stage that writes it; no report written."""
    _arms(tmp_path, {"baseline": {**BASE, 201: 4.0}, "nonlinear_q": BASE})
    (tmp_path / "runs/test/plan.json").write_text(plan)
    assert _compare(nano_project, monkeypatch, _study(tmp_path) + ["study.pilot_seeds=[201]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path / 'runs/test/plan.json'}") and len(err.splitlines()) == 1, err
    assert words in err and "test stage" in err, err
    assert not (tmp_path / "reports").exists()


def test_the_plan_of_other_study_seeds_is_refused(nano_project, tmp_path, monkeypatch, capsys):
    """Runs and plan on seeds 1-5, the study now at seeds 6-10: refused, not reported as 'n=0' over seeds 1-5."""
    _arms(tmp_path, {"baseline": BASE, "nonlinear_q": BASE})
    assert _compare(nano_project, monkeypatch, _study(tmp_path, seeds=(6, 7, 8, 9, 10))) == 2
    err = capsys.readouterr().err.strip()
    assert "plans seeds [1, 2, 3, 4, 5] for arm 'baseline', but this study tests study.seeds=[6, 7, 8, 9, 10]" in err


def test_a_run_without_a_corpus_the_others_have_is_named_not_dropped(nano_project, tmp_path, monkeypatch):
    """One run's record lacks a corpus: the per-corpus section says which run (it used to take the corpora of the
    first run, or pair the rest on fewer seeds without a word)."""
    both = {"sotu": 4.0, "kjv": 3.5}
    _arms(tmp_path, {"baseline": {s: {"loss": x, "per_corpus": both} for s, x in BASE.items()},
                     "nonlinear_q": {s: {"loss": x, "per_corpus": both if s != 3 else {"sotu": 4.0}}
                                     for s, x in BASE.items()}})
    assert _compare(nano_project, monkeypatch, _study(tmp_path)) == 0
    pc = _summary(tmp_path)["per_corpus"]
    assert pc["corpora"] == ["kjv", "sotu"] and pc["arms"] == {} and pc["comparisons"] == {}
    assert pc["note"] == f"{arm_run(tmp_path / 'runs', 'nonlinear_q', 3)} records no loss on ['kjv'] (re-run it)"
    md = (tmp_path / "reports/comparison.md").read_text()
    assert f"Not shown: {pc['note']}." in md and not (tmp_path / "reports/figures/per_corpus.png").exists()


def test_family_arms_of_one_size_are_not_a_frontier(nano_project, tmp_path, monkeypatch):
    """Two family arms with the same non-embedding parameters: not fitted, saying which (one used to replace the
    other's losses in the fit)."""
    arms = {"baseline": 1000, "identity_q": 1000, "baseline_mlp5": 1250, "nonlinear_q": 1000}
    _arms(tmp_path, {a: {s: {"loss": x - n / 1e4, "params": n} for s, x in BASE.items()} for a, n in arms.items()})
    args = _study(tmp_path, tuple(arms)) + ["decomposition.family=[baseline,identity_q,baseline_mlp5]",
                                            "decomposition.worth=[nonlinear_q]"]
    assert _compare(nano_project, monkeypatch, args) == 0
    f = _summary(tmp_path)["verdict"]["frontier"]
    assert not f["fitted"] and f["worth"] == {}
    assert f["reason"] == ("not fitted: the family arms ['baseline', 'identity_q'] share one size (1,000 non-embedding "
                           "parameters); list one arm per size in decomposition.family")
