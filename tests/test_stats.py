"""Paired statistics, checked against values computed by hand."""
import math

import numpy as np
import pytest
from scipy import stats as ss

from study.analysis.stats import adjust, mean_ci, paired, pct_log_loss, pct_perplexity


def test_paper_percentages():
    # PAPER.md: baseline 2.956, nonlinear 2.919
    assert pct_log_loss(2.919, 2.956) == pytest.approx(-1.2517, abs=1e-4)
    assert pct_perplexity(2.919, 2.956) == pytest.approx(100 * (math.exp(-0.037) - 1))
    # the later abstract's back-solved figures: 2.94 -> 2.87 is about -2.4% / -6.8%
    assert pct_log_loss(2.87, 2.94) == pytest.approx(-2.38, abs=0.02)
    assert pct_perplexity(2.87, 2.94) == pytest.approx(-6.76, abs=0.05)


def test_paired_t_by_hand():
    base = {1: 3.00, 2: 3.10, 3: 2.95}
    var = {1: 2.97, 2: 3.06, 3: 2.93, 4: 9.9}  # seed 4 has no pair and is ignored
    r = paired(var, base)
    d = np.array([-0.03, -0.04, -0.02])
    se = d.std(ddof=1) / math.sqrt(3)
    t = d.mean() / se
    assert r["n_pairs"] == 3 and r["seeds"] == [1, 2, 3]
    assert r["mean_diff"] == pytest.approx(-0.03)
    assert r["p_value"] == pytest.approx(2 * ss.t.sf(abs(t), 2))
    half = ss.t.ppf(0.975, 2) * se
    assert r["ci95"] == pytest.approx([-0.03 - half, -0.03 + half])
    assert r["pct_log_loss"] == pytest.approx(100 * -0.03 / np.mean([3.0, 3.1, 2.95]))
    assert r["pct_perplexity"] == pytest.approx(100 * (math.exp(-0.03) - 1))


def test_single_pair_has_no_interval():
    r = paired({1: 2.0}, {1: 2.1})
    assert r["n_pairs"] == 1 and math.isnan(r["p_value"]) and math.isnan(r["ci95"][0])


def test_mean_ci_and_bh():
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(ss.t.ppf(0.975, 2) * 1 / math.sqrt(3))
    adj = adjust({"a": 0.01, "b": 0.04, "c": 0.03, "d": float("nan")})
    # BH by hand: sorted p 0.01, 0.03, 0.04 with m = 3 -> 0.03, 0.04, 0.04
    assert adj["a"] == pytest.approx(0.03) and adj["c"] == pytest.approx(0.04) and adj["b"] == pytest.approx(0.04)
    assert math.isnan(adj["d"])


def test_parameter_multiplier_on_an_exact_power_law():
    from study.analysis.stats import parameter_multiplier

    # L(N) = 10 N^-0.1 exactly, same for every seed but for a seed offset that cancels in the means
    law = lambda n: 10 * n ** -0.1  # noqa: E731
    family = {n: {s: law(n) + off for s, off in ((1, -0.01), (2, 0.0), (3, 0.01))} for n in (1e6, 2e6, 4e6)}
    # a variant with 1e6 parameters reaching the loss of a 3e6 baseline is worth 3x its size
    variant = {1: law(3e6) - 0.01, 2: law(3e6), 3: law(3e6) + 0.01}
    r = parameter_multiplier(family, variant, 1_000_000)
    assert r["slope"] == pytest.approx(-0.1, abs=2e-3)
    assert r["multiplier"] == pytest.approx(3.0, rel=0.02)
    assert r["ci95"][0] <= r["multiplier"] <= r["ci95"][1]
    worse = parameter_multiplier(family, {s: law(0.5e6) for s in (1, 2, 3)}, 1_000_000)
    assert worse["multiplier"] == pytest.approx(0.5, rel=0.02)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_power_by_simulation(n):
    """The detectable effect at 80% power, checked by simulating the paired t-test (n = 2: df = 1,
    where scipy's noncentral t gives NaN in the far tail)."""
    from study.analysis.stats import min_detectable_effect, power_paired, seeds_needed

    sd = 0.05
    mde = min_detectable_effect(n, sd)
    assert power_paired(n, sd, mde) == pytest.approx(0.80, abs=1e-9)
    sims = np.random.default_rng(n).normal(mde, sd, size=(200_000, n))
    t = sims.mean(1) / (sims.std(1, ddof=1) / math.sqrt(n))
    assert np.mean(np.abs(t) > ss.t.ppf(0.975, n - 1)) == pytest.approx(0.80, abs=0.005)
    need = seeds_needed(sd, mde)
    assert need == n  # the detectable effect at n needs exactly n seeds
    assert seeds_needed(sd, 1e-6) is None  # beyond 100,000 seeds: no number is printed


def test_the_trend_at_a_size_is_statsmodels_fitted_mean_with_its_interval():
    import statsmodels.api as sm

    from study.analysis.stats import effect_trend

    pts = [(4.69, 0.8), (4.69, -1.2), (5.05, -1.7), (5.05, 0.4), (5.29, 0.5), (5.29, -0.3), (5.29, 1.1)]
    x0 = math.log10(84_953_856)
    t = effect_trend(pts, at=x0)
    ols = sm.OLS([y for _, y in pts], sm.add_constant([x for x, _ in pts])).fit()
    pred = ols.get_prediction(np.array([[1.0, x0]])).summary_frame(alpha=0.05)
    assert t["slope_pct_per_decade"] == pytest.approx(ols.params[1])
    assert t["at"]["effect_pct"] == pytest.approx(pred["mean"].iloc[0])
    assert t["at"]["ci95"] == pytest.approx([pred["mean_ci_lower"].iloc[0], pred["mean_ci_upper"].iloc[0]])
    assert t["at"]["decades_beyond"] == pytest.approx(x0 - 5.29)
    # too few points: no line, so no value at the size either
    assert math.isnan(effect_trend(pts[:2], at=x0)["at"]["effect_pct"])


def test_the_papers_size_is_gpt3_smalls_non_embedding_parameters():
    from study.analysis.stats import PAPER_NON_EMBEDDING_PARAMS
    from study.config import load_config
    from study.modeling.accounting import describe

    from conftest import ROOT

    cfg = load_config(["model=gpt3-small", "variant=baseline"], ROOT)
    assert describe(cfg.model, cfg.variant, 50304)["non_embedding_params"] == PAPER_NON_EMBEDDING_PARAMS


def test_a_trend_over_a_non_finite_effect_says_why_it_has_none():
    from study.analysis.stats import effect_trend

    t = effect_trend([(4.7, 0.1), (5.0, float("nan")), (5.3, 0.2)], at=7.9)
    assert math.isnan(t["slope_pct_per_decade"]) and math.isnan(t["at"]["effect_pct"])
    assert t["note"] == "a non-finite effect or size"
