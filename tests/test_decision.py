"""The decided verdict's statistics (study/analysis/decision.py) against values worked out independently: Stein's N
by hand and its coverage by simulation, TOST against the 90%-interval rule, BH, the words, the decomposition."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from study.analysis.decision import (compare_pair, decide, decomposition, seed_list, seeds_to_train, stein_exact_halfwidth,
                                     stein_n, tost)


def test_stein_n_by_hand():
    # n0 = 5, s0 = 0.026 nats (the README's paired sd at a shared lr), d = 0.012 nats (0.25% of 4.8):
    # t_{0.975,4} = 2.776445 (tables), t^2 = 7.708647; s0^2/d^2 = 0.000676/0.000144 = 4.694444;
    # product 36.1878 -> floor 36, + 1 = 37 pairs
    assert stein_n(0.026, 5, 0.012) == 37
    # tuned, s0 = 0.098: 7.708647 * 0.009604 / 0.000144 = 514.12 -> 515
    assert stein_n(0.098, 5, 0.012) == 515
    # a tiny sd: the first stage is enough, N = n0
    assert stein_n(0.001, 5, 0.012) == 5
    # n0 = 10, t_{0.975,9} = 2.262157: 5.117355 * 0.0004 / 0.0001 = 20.469 -> 21
    assert stein_n(0.02, 10, 0.01) == 21
    with pytest.raises(ValueError):
        stein_n(0.02, 1, 0.01)


def test_stein_intervals_have_their_coverage_by_simulation():
    """Stein's N from the first stage only: mean_N +- t s0/sqrt(N) covers the true mean with probability exactly 95%,
    and mean_N +- d (wider) with at least 95% (simulation: normal differences, 20,000 studies; MC sd 0.0015)."""
    rng = np.random.default_rng(26)
    mu, sigma, d, n0 = 0.01, 0.03, 0.015, 5
    exact, wide = [], []
    for _ in range(20_000):
        first = rng.normal(mu, sigma, n0)
        s0 = first.std(ddof=1)
        n = stein_n(s0, n0, d)
        allx = np.concatenate([first, rng.normal(mu, sigma, n - n0)])
        h = stein_exact_halfwidth(s0, n0, n)
        assert h <= d
        exact.append(abs(allx.mean() - mu) <= h)
        wide.append(abs(allx.mean() - mu) <= d)
    assert np.mean(exact) == pytest.approx(0.95, abs=0.005)
    assert np.mean(wide) >= 0.95


def test_tost_agrees_with_the_90_percent_interval_rule():
    """TOST at alpha 0.05 rejects non-equivalence exactly when the 90% paired t interval lies inside +-delta;
    its p is the larger one-sided p, computed here by hand from the t distribution."""
    rng = np.random.default_rng(3)
    delta = 0.02
    agree = 0
    for k in range(200):
        n = 5 + k % 6
        x = rng.normal(rng.uniform(-0.03, 0.03), rng.uniform(0.002, 0.03), n)
        r = tost(x.tolist(), delta)
        m, se = x.mean(), x.std(ddof=1) / math.sqrt(n)
        half = stats.t.ppf(0.95, n - 1) * se
        inside = -delta < m - half and m + half < delta
        assert (r["p_value"] < 0.05) == inside
        p_low = stats.t.sf((m + delta) / se, n - 1)
        p_up = stats.t.cdf((m - delta) / se, n - 1)
        assert r["p_value"] == pytest.approx(max(p_low, p_up), rel=1e-9)
        assert r["ci90"] == pytest.approx([m - half, m + half], rel=1e-9)
        agree += inside
    assert 20 < agree < 180  # both outcomes were exercised


def losses(base: float, shift: float, noise: list[float], own: list[float]) -> tuple[dict, dict]:
    """{seed: loss} of a reference and an arm: the arm = reference + shift + own noise."""
    ref = {s + 1: base + e for s, e in enumerate(noise)}
    arm = {s + 1: base + e + shift + o for s, (e, o) in enumerate(zip(noise, own))}
    return arm, ref


def test_words_better_worse_equivalent_undecided():
    noise = [0.05, -0.03, 0.01, 0.04, -0.02, 0.0]
    seeds = [1, 2, 3, 4, 5, 6]
    small = [0.001, -0.001, 0.0005, -0.0005, 0.0, 0.0002]
    big = [0.08, -0.06, 0.05, -0.07, 0.03, -0.02]
    comps = {
        "better": compare_pair(*losses(4.8, -0.10, noise, small), seeds, 5, 1.0, 0.5, 20),
        "worse": compare_pair(*losses(4.8, +0.10, noise, small), seeds, 5, 1.0, 0.5, 20),
        "equivalent": compare_pair(*losses(4.8, 0.002, noise, small), seeds, 5, 1.0, 0.5, 20),
        "undecided": compare_pair(*losses(4.8, 0.01, noise, big), seeds, 5, 1.0, 0.5, 20),
    }
    decide(comps)
    for name, c in comps.items():
        assert c["word"] == name, (name, c["verdict"])
    u = comps["undecided"]
    # Stein's N from the first 5 pairs only, by the formula (d = 0.5% of the reference's mean loss)
    d = 0.005 * np.mean([4.8 + e for e in noise])
    s0 = np.std(big[:5], ddof=1)
    want = max(5, math.floor(stats.t.ppf(0.975, 4) ** 2 * s0 ** 2 / d ** 2) + 1)
    assert u["stein"]["n_needed"] == want and want > 20 and u["stein"]["capped"]
    assert u["verdict"] == f"undecided ({want} seeds needed)"
    # each arm's sd is its own: arm and reference sd differ, neither is the paired sd
    assert u["arm_sd"] != pytest.approx(u["ref_sd"]) and u["sd_diff"] == pytest.approx(np.std(big, ddof=1))
    # BH over all comparisons, by hand for the paired t p-values
    ps = sorted((c["p_value"], k) for k, c in comps.items())
    m = len(ps)
    adj = [min(1.0, min(ps[j][0] * m / (j + 1) for j in range(i, m))) for i in range(m)]
    for (p, k), a in zip(ps, adj):
        assert comps[k]["p_value_bh"] == pytest.approx(a, rel=1e-9)
    assert comps["equivalent"]["verdict"] == "equivalent (within +-1%)"
    # the Stein interval is mean +- d, with its exact coverage at the pairs there are
    e = comps["better"]["stein"]
    assert e["interval"][1] - e["interval"][0] == pytest.approx(2 * e["halfwidth"])
    assert e["exact_halfwidth"] == pytest.approx(stats.t.ppf(0.975, 4) * e["s0"] / math.sqrt(6))


def test_seeds_to_train_and_the_seed_list():
    c = {"stein": {"n_total": 9}}
    assert seeds_to_train({"a": c, "b": {"stein": {"n_total": None}}}, 5, 20) == 9
    assert seeds_to_train({"a": {"stein": {"n_total": 40}}}, 5, 20) == 20
    assert seed_list([1, 2, 3, 4, 5], 8, [6, 101]) == [1, 2, 3, 4, 5, 7, 8, 9]
    assert seed_list([1, 2, 3, 4, 5], 3, []) == [1, 2, 3]


def test_decomposition_share_by_hand():
    means = {"today": {1: 5.0, 2: 5.2}, "base": {1: 4.9, 2: 5.1}, "lin": {1: 4.6, 2: 4.8}, "nlq": {1: 4.55, 2: 4.75}}
    r = decomposition(means, ["today", "base", "lin", "nlq"], "today", "nlq", "lin")
    # gap 5.1 - 4.65 = 0.45; the linear recipe closes 5.1 - 4.7 = 0.40: 0.40 / 0.45
    assert r["gap"] == pytest.approx(0.45) and r["share"] == pytest.approx(0.40 / 0.45)
    assert [x["arm"] for x in r["rows"]] == ["today", "base", "lin", "nlq"] and r["rows"][0]["mean"] == pytest.approx(5.1)
    assert decomposition(means, ["today"], "today", "nlq", "missing")["share"] is None
    # the gap's paired interval: differences 0.45 and 0.45 (sd 0) lie above zero; an end arm no better than the
    # start (differences +0.1 and -0.2: mean -0.05, t(0.975, 1) = 12.706, sd 0.2121 -> +-1.906) has no share
    assert r["gap_ci95"] == [pytest.approx(0.45), pytest.approx(0.45)] and r["note"] is None
    worse = {**means, "nlq": {1: 4.9, 2: 5.4}}
    w = decomposition(worse, ["today", "nlq", "lin"], "today", "nlq", "lin")
    sd = math.sqrt(((0.1 + 0.05) ** 2 + (-0.2 + 0.05) ** 2) / 1)
    half = 12.706204736 * sd / math.sqrt(2)
    assert w["gap"] == pytest.approx(-0.05) and w["share"] is None and "no share" in w["note"]
    assert w["gap_ci95"] == [pytest.approx(-0.05 - half, rel=1e-6), pytest.approx(-0.05 + half, rel=1e-6)]


def test_the_papers_claim_is_a_one_sided_paired_t_test_by_hand():
    """Reference 2.0 nats on five seeds; the arm 1% lower on each seed but for noise: the claim (-2.40% = -0.048
    nats) is excluded.  By hand: diffs -0.02, -0.018, -0.022, -0.019, -0.021 -> mean -0.02, sd 0.0015811;
    t = (-0.02 + 0.048) / (0.0015811 / sqrt 5) = 39.598, p = P(T_4 > 39.598) = 1.23e-6 (well below 0.05)."""
    from study.analysis.decision import PAPER_CLAIM_PCT, claim_test
    from study.analysis.verdict import claim_words

    ref = {s: 2.0 for s in range(1, 6)}
    arm = {1: 1.98, 2: 1.982, 3: 1.978, 4: 1.981, 5: 1.979}
    c = compare_pair(arm, ref, [1, 2, 3, 4, 5], 5, 1.0, 0.5, 10)
    assert PAPER_CLAIM_PCT == -2.40 and c["claim"]["nats"] == pytest.approx(-0.048)
    t = (-0.02 + 0.048) / (0.00158113883 / math.sqrt(5))
    assert t == pytest.approx(39.598, abs=1e-3)
    assert c["claim"]["p_value"] == pytest.approx(stats.t.sf(t, 4), rel=1e-6) and c["claim"]["p_value"] < 1e-5
    # an arm as good as the paper says (-2.5% on every seed, noisy): the claim stands, p near 1
    near = compare_pair({1: 1.95, 2: 1.948, 3: 1.952, 4: 1.949, 5: 1.951}, ref, [1, 2, 3, 4, 5], 5, 1.0, 0.5, 10)
    assert near["claim"]["p_value"] > 0.9
    decided = decide({"a vs r": c, "b vs r": near})
    assert decided["a vs r"]["claim"]["excluded"] is True and decided["b vs r"]["claim"]["excluded"] is False
    assert decided["a vs r"]["claim_p_bh"] == pytest.approx(2 * c["claim"]["p_value"])  # BH over two: the smaller x2
    assert claim_words(decided["a vs r"]).startswith("excluded (p ") and claim_words(decided["b vs r"]).startswith(
        "not excluded (p ")
    assert claim_test([0.01], -0.048)["p_value"] != claim_test([0.01], -0.048)["p_value"]  # one pair: NaN


def test_the_pilot_seeds_serve_no_other_purpose_and_the_report_says_which_seed_served_what(nano_project):
    """Seeds the default was chosen on never tune or test: the config refuses the overlap in one line, Stein's second
    stage skips them, and the verdict's table names the seeds of each purpose."""
    from study.analysis.verdict import all_seeds, seed_roles_line
    from study.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(["study.pilot_seeds=[5,201]", "study.seeds=[1,2,3,4,5]"],
                    nano_project)
    assert "\n" not in str(e.value) and "study.pilot_seeds=[5, 201] and study.seeds=[1, 2, 3, 4, 5] share [5]" in str(e.value)
    with pytest.raises(ConfigError, match=r"and tune.seeds=\[101, 102\] share \[101\]"):
        load_config(["study.pilot_seeds=[101]", "study.seeds=[1,2,3,4,5]",
                     "tune.seeds=[101,102]"], nano_project)
    cfg = load_config(["study.pilot_seeds=[6,7]", "study.seeds=[1,2,3,4,5]",
                       "tune.seeds=[8,9]", "study.max_seeds=8"], nano_project)
    assert all_seeds(cfg) == [1, 2, 3, 4, 5, 10, 11, 12]
    assert seed_roles_line({"seed_roles": {"tuning": [101, 102], "pilot": [201, 202], "test": [1, 2, 3]}}) == [
        "Seeds, each with one purpose: tuning 101, 102 (conf/tuning/); choosing the default 201, 202 "
        "(docs/history.md); testing 1, 2, 3.", ""]


def test_an_undecided_comparison_says_how_many_seeds_and_minutes_deciding_it_would_take():
    """Stein's N 12 with 5 pairs in: 7 more seeds per arm; the runs took 120 s on average (both arms), 2 at once:
    7 x 2 runs x 120 s / 2 / 60 = 14 minutes.  A decided comparison, or one whose N is in, needs nothing."""
    from study.analysis.verdict import more_seeds

    runs = {"a": {s: {"wall_time_s": 100.0} for s in range(1, 6)}, "r": {s: {"wall_time_s": 140.0} for s in range(1, 6)}}
    c = {"word": "undecided", "n_pairs": 5, "stein": {"n_needed": 12}, "arm": "a", "reference": "r"}
    assert more_seeds(c, runs, 2) == {"seeds": 7, "n_needed": 12, "minutes": pytest.approx(14.0)}
    assert more_seeds({**c, "word": "better"}, runs, 2) is None
    assert more_seeds({**c, "stein": {"n_needed": 5}}, runs, 2) is None
    assert more_seeds(c, {"a": {1: {}}, "r": {1: {"wall_time_s": None}}}, 2) == {"seeds": 7, "n_needed": 12,
                                                                             "minutes": None}


def test_the_seeds_hint_names_the_command_of_the_study_it_reports():
    """`make decide` runs the default study's seeds; a study in other folders (the nano path's, a task's) is told the
    study.max_seeds its test stage needs; a fraction of a minute is said so, not "about 0 min"."""
    from conftest import ROOT
    from study.analysis.verdict import decide_hint
    from study.config import load_config

    more = {"seeds": 7, "n_needed": 12, "minutes": 14.2}
    assert decide_hint(load_config([], ROOT), more) == ", about 14 min at study.jobs=2 (`make decide`)"
    nano = load_config(["study.runs_dir=runs/nano"], ROOT)
    assert decide_hint(nano, {**more, "minutes": 0.3}) == (
        ", under a minute at study.jobs=2 (the test stage again with study.max_seeds=12)")
    assert decide_hint(load_config(["task=mlm"], ROOT), {**more, "minutes": None}) == (
        " (the test stage again with study.max_seeds=12)")


def test_the_frontier_prices_an_arm_in_parameters_by_hand():
    """Each seed's family lies on its own exact power law L = c_s N^-0.1; the priced arm reaches, on seed 1, the loss
    of N = 300 and, on seed 2, of N = 360, at 200 parameters: per-seed multipliers 1.5 and 1.8."""
    from study.analysis.decision import frontier_worth
    from study.analysis.verdict import frontier_lines

    c = {1: 5.0, 2: 5.5}
    params = {"mlp3": 100, "base": 200, "mlp5": 400, "nlq": 200}
    means = {a: {s: c[s] * params[a] ** -0.1 for s in c} for a in ("mlp3", "base", "mlp5")}
    means["nlq"] = {1: c[1] * 300 ** -0.1, 2: c[2] * 360 ** -0.1}
    f = frontier_worth(means, params, ["mlp3", "base", "mlp5"], ["nlq"])
    assert f["fitted"] and f["slope"] == pytest.approx(-0.1) and f["intercept"] == pytest.approx(math.log(5.25))
    w = f["worth"]["nlq"]
    assert w["per_seed"] == {1: pytest.approx(1.5), 2: pytest.approx(1.8)}
    # the point estimate from the seed means: the family's mean frontier is 5.25 N^-0.1
    loss = (c[1] * 300 ** -0.1 + c[2] * 360 ** -0.1) / 2
    assert w["multiplier"] == pytest.approx((loss / 5.25) ** -10 / 200)
    logs = [math.log(1.5), math.log(1.8)]
    half = stats.t.ppf(0.975, 1) * np.std(logs, ddof=1) / math.sqrt(2)
    assert w["ci95"] == [pytest.approx(math.exp(np.mean(logs) - half)), pytest.approx(math.exp(np.mean(logs) + half))]
    assert [r["arm"] for r in f["family"]] == ["mlp3", "base", "mlp5"] and f["family"][1]["non_embedding_params"] == 200
    # an exact power law: no residual, so the slope's interval is the slope itself, and it falls; 300 and 360 lie
    # within 100-400: read off between the family's points
    assert f["slope_ci95"] == [pytest.approx(-0.1), pytest.approx(-0.1)] and f["falls"] and not w["extrapolated"]
    md = "\n".join(frontier_lines(f))
    assert "### The parameter frontier" in md and f"| nlq | 200 | {w['equivalent_params']:,.0f} | {w['multiplier']:.3f} |" in md
    # a flat family (noise, no trend): the slope's t interval (1 degree of freedom) holds zero, the report says no
    # worth can be read off it, and a worth beyond the family's sizes is marked extrapolated
    flat = {"mlp3": {1: 2.00, 2: 2.01}, "base": {1: 1.99, 2: 2.00}, "mlp5": {1: 2.005, 2: 2.005}, "nlq": {1: 1.9, 2: 1.9}}
    g = frontier_worth(flat, params, ["mlp3", "base", "mlp5"], ["nlq"])
    x, y = np.log([100, 200, 400]), np.log([2.005, 1.995, 2.005])
    fit = stats.linregress(x, y)
    half = stats.t.ppf(0.975, 1) * fit.stderr
    assert g["slope_ci95"] == [pytest.approx(fit.slope - half), pytest.approx(fit.slope + half)] and not g["falls"]
    assert g["worth"]["nlq"]["extrapolated"]
    flat_md = "\n".join(frontier_lines(g))
    assert "does not fall measurably" in flat_md and "(extrapolated: outside the family sizes)" in flat_md
    # two sizes say nothing of a power law's shape: not fitted, and the report says why
    two = frontier_worth(means, params, ["mlp3", "base"], ["nlq"])
    assert not two["fitted"] and two["worth"] == {} and "at least 3" in two["reason"]
    assert "Frontier not fitted: 2 size(s)" in "\n".join(frontier_lines(two))
