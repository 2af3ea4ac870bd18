"""Paired statistics across seeds (scipy.stats).

Seed s means the same initialisation seed and the same batches for every
variant, so variant and baseline losses are paired by seed.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats


def pct_log_loss(loss: float, base: float) -> float:
    """Percent change of the log-loss, 100 (L - L_base) / L_base (arXiv 2603.13381)."""
    return 100.0 * (loss - base) / base


def pct_perplexity(loss: float, base: float) -> float:
    """Percent change of perplexity, 100 (exp(L - L_base) - 1) (arXiv 2603.13381)."""
    return 100.0 * (math.exp(loss - base) - 1.0)


def mean_ci(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): Student-t interval of the mean; lo = hi = nan for fewer than 2 values."""
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    lo, hi = stats.t.interval(level, len(x) - 1, loc=m, scale=stats.sem(x))
    return m, float(lo), float(hi)


def paired(variant: dict[int, float], baseline: dict[int, float], level: float = 0.95) -> dict:
    """Compare a variant's final val losses (nats) with the baseline's, paired by seed.

    Args:
        variant, baseline: {seed: val_loss}; only seeds present in both are used.

    Returns:
        {"n_pairs", "seeds", "mean_diff" (nats, variant - baseline), "ci95" [lo, hi] of the mean
        difference (paired t), "p_value" (two-sided paired t-test), "pct_log_loss",
        "pct_log_loss_ci95", "pct_perplexity", "pct_perplexity_ci95"}.  With fewer than two
        pairs the interval and p-value are NaN.
    """
    seeds = sorted(set(variant) & set(baseline))
    v = np.array([variant[s] for s in seeds], dtype=float)
    b = np.array([baseline[s] for s in seeds], dtype=float)
    n = len(seeds)
    out = {"n_pairs": n, "seeds": seeds}
    if n == 0:
        return {**out, "mean_diff": float("nan"), "ci95": [float("nan")] * 2, "p_value": float("nan"),
                "pct_log_loss": float("nan"), "pct_log_loss_ci95": [float("nan")] * 2,
                "pct_perplexity": float("nan"), "pct_perplexity_ci95": [float("nan")] * 2}
    diff = float((v - b).mean())
    base = float(b.mean())
    if n >= 2 and np.ptp(v - b) > 0:
        res = stats.ttest_rel(v, b)
        ci = res.confidence_interval(level)
        lo, hi, p = float(ci.low), float(ci.high), float(res.pvalue)
    else:  # one pair, or identical differences (zero variance): the t-test is undefined
        lo = hi = p = float("nan")
    return {**out, "mean_diff": diff, "ci95": [lo, hi], "p_value": p,
            "pct_log_loss": 100.0 * diff / base,
            "pct_log_loss_ci95": [100.0 * lo / base, 100.0 * hi / base],
            "pct_perplexity": pct_perplexity(base + diff, base),
            "pct_perplexity_ci95": [100.0 * (math.exp(lo) - 1) if math.isfinite(lo) else float("nan"),
                                    100.0 * (math.exp(hi) - 1) if math.isfinite(hi) else float("nan")]}


def adjust(p_values: dict[str, float]) -> dict[str, float]:
    """Benjamini-Hochberg adjusted p-values (scipy.stats.false_discovery_control); NaN stays NaN."""
    names = [k for k, p in p_values.items() if math.isfinite(p)]
    out = {k: float("nan") for k in p_values}
    if names:
        adj = stats.false_discovery_control([p_values[k] for k in names], method="bh")
        out.update({k: float(a) for k, a in zip(names, adj)})
    return out


# -- the parameter frontier ------------------------------------------------------------------------
def fit_power_law(params, losses) -> tuple[float, float]:
    """Least-squares fit of log L = intercept + slope log N (N: non-embedding parameters).

    Returns: (slope, intercept); slope < 0 when more parameters give lower loss.
    Raises: ValueError with fewer than two distinct sizes.
    """
    x, y = np.log(np.asarray(params, float)), np.log(np.asarray(losses, float))
    if len(set(x.tolist())) < 2:
        raise ValueError("the frontier needs at least two model sizes")
    fit = stats.linregress(x, y)
    return float(fit.slope), float(fit.intercept)


def equivalent_params(loss: float, slope: float, intercept: float) -> float:
    """The size N on the fitted frontier whose loss is ``loss``: exp((log L - intercept) / slope)."""
    return float(math.exp((math.log(loss) - intercept) / slope)) if slope < 0 else float("nan")


def parameter_multiplier(family: dict[int, dict[int, float]], variant: dict[int, float], variant_params: int,
                         n_resamples: int = 2000) -> dict:
    """How many parameters a variant is worth, on the frontier of a model family.

    Args:
        family: {non_embedding_params: {seed: val_loss}} for the baseline family (several MLP widths).
        variant: {seed: val_loss} of the variant; ``variant_params`` its non-embedding parameters.

    Returns:
        {"multiplier": N_equivalent / N_variant from the seed means, "ci95": [lo, hi] (percentile
        bootstrap over seeds, resampled jointly since seed s is shared by every run; NaN when the
        frontier is undefined in more than 10% of resamples), "bootstrap_defined" (that fraction),
        "equivalent_params", "slope", "intercept", "seeds"}.  Values above 1 mean the variant
        reaches the loss of a larger baseline.
    """
    seeds = sorted(set(variant).intersection(*[set(s) for s in family.values()]))
    sizes = sorted(family)
    slope, intercept = fit_power_law(sizes, [np.mean([family[n][s] for s in seeds]) for n in sizes])
    point = equivalent_params(float(np.mean([variant[s] for s in seeds])), slope, intercept) / variant_params
    out = {"multiplier": point, "ci95": [float("nan"), float("nan")], "equivalent_params": point * variant_params,
           "slope": slope, "intercept": intercept, "seeds": seeds}
    if len(seeds) >= 2:
        # percentile bootstrap, seeds resampled jointly (seed s is shared by every run); scipy.stats.bootstrap
        # cannot skip resamples where the frontier is undefined (flat or rising), so it is written out here
        rng = np.random.default_rng(0)
        fam = np.array([[family[n][s] for s in seeds] for n in sizes])  # (n_sizes, n_seeds)
        var = np.array([variant[s] for s in seeds])
        draws = []
        for _ in range(n_resamples):
            idx = rng.integers(0, len(seeds), len(seeds))
            f_means = fam[:, idx].mean(1)
            sl, ic = fit_power_law(sizes, f_means)
            draws.append(equivalent_params(float(var[idx].mean()), sl, ic) / variant_params)
        draws = np.array(draws)
        ok = np.isfinite(draws)
        out["bootstrap_defined"] = float(ok.mean())
        if ok.mean() >= 0.9:
            out["ci95"] = [float(np.percentile(draws[ok], 2.5)), float(np.percentile(draws[ok], 97.5))]
    return out
