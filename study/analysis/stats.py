"""Paired statistics across seeds (scipy.stats): the one place where numbers become verdicts.

Seed s means the same initialisation seed and the same batches for every
variant, so variant and baseline losses are paired by seed.  Every interval here
holds at the study's small n: Student-t intervals (paired differences, means,
log-scale per-seed multipliers), never a percentile bootstrap over a handful of
seeds (with n seeds there are only C(2n-1, n) distinct resamples: 10 at n = 3,
and the percentile interval undercovers badly at such n).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

#: the paper's headline effect, percent change of the log-loss (arXiv 2603.13381, abstract)
PAPER_PCT_LOG_LOSS = -2.40
#: the paper's model size in non-embedding parameters: GPT-3 small, 84.95M (arXiv 2603.13381; conf/model/gpt3-small.yaml,
#: whose count by the model's accounting tests/test_stats.py checks against this one)
PAPER_NON_EMBEDDING_PARAMS = 84_953_856
#: power and two-sided level of the power statements
POWER, ALPHA = 0.80, 0.05
#: a fit of loss against size (parameters or compute) needs this many distinct sizes: two points
#: always lie on a line, so a two-point "frontier" carries no evidence of its shape
MIN_FIT_SIZES = 3
#: paired differences whose sd is below this (relative to the loss, nats/nats) are "zero variance":
#: losses written to metrics.json keep ~1e-16 of rounding, which would otherwise give p ~ 0
ZERO_SD_REL = 1e-9


def pct_log_loss(loss: float, base: float) -> float:
    """Percent change of the log-loss, 100 (L - L_base) / L_base (arXiv 2603.13381)."""
    return 100.0 * (loss - base) / base


def safe_exp(x: float) -> float:
    """exp(x), inf where it overflows a float (x above ~709.8) instead of raising OverflowError."""
    try:
        return math.exp(x)
    except OverflowError:
        return float("inf")


def pct_perplexity(loss: float, base: float) -> float:
    """Percent change of perplexity, 100 (exp(L - L_base) - 1) (arXiv 2603.13381)."""
    return 100.0 * (safe_exp(loss - base) - 1.0)


def mean_ci(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): Student-t interval of the mean; lo = hi = nan for fewer than 2 values or no spread."""
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if len(x) < 2 or np.ptp(x) == 0:  # no spread: the t interval is undefined (scipy would warn and give NaN)
        return m, float("nan"), float("nan")
    lo, hi = stats.t.interval(level, len(x) - 1, loc=m, scale=stats.sem(x))
    return m, float(lo), float(hi)


def zero_variance(diffs, scale: float) -> str | None:
    """Why a paired t-test is undefined for these differences (nats), or None when it is defined.

    Returns: "identical losses" (every difference 0), "constant shift across seeds" (all equal,
    not 0; sd below ``ZERO_SD_REL`` x ``scale``), "one pair" (n = 1), "no pairs", or None.
    """
    d = np.asarray(diffs, dtype=float)
    if len(d) == 0:
        return "no pairs"
    if len(d) == 1:
        return "one pair"
    if float(np.std(d, ddof=1)) <= ZERO_SD_REL * max(1.0, abs(scale)):
        return "identical losses" if float(np.max(np.abs(d))) <= ZERO_SD_REL * max(1.0, abs(scale)) \
            else "constant shift across seeds"
    return None


def power_paired(n: int, sd: float, effect: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test with n pairs against a true mean difference ``effect``
    (nats) when the differences have sd ``sd`` (nats): P(|T| > t_crit), T ~ noncentral t with
    n - 1 degrees of freedom and noncentrality effect sqrt(n) / sd (scipy.stats.nct)."""
    if n < 2 or not sd > 0:
        return float("nan")
    df, nc = n - 1, abs(effect) * math.sqrt(n) / sd
    t = stats.t.ppf(1 - alpha / 2, df)
    upper, lower = float(stats.nct.sf(t, df, nc)), float(stats.nct.cdf(-t, df, nc))
    # far in the tails scipy's nct gives NaN for what is 0 (lower tail) or 1 (upper tail, huge nc)
    upper = upper if math.isfinite(upper) else float(nc > t)
    lower = lower if math.isfinite(lower) else 0.0
    return min(1.0, upper + lower)


def min_detectable_effect(n: int, sd: float, power: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest |mean difference| (nats) the paired t-test with n pairs detects with ``power``,
    given the paired sd (nats); NaN for n < 2 or sd = 0."""
    if n < 2 or not sd > 0:
        return float("nan")
    hi = sd
    while power_paired(n, sd, hi, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda e: power_paired(n, sd, e, alpha) - power, 0.0, hi, xtol=1e-12 * sd))


def seeds_needed(sd: float, effect: float, power: float = POWER, alpha: float = ALPHA,
                 max_n: int = 100_000) -> int | None:
    """The fewest seed pairs (>= 2) for which the paired t-test detects ``effect`` (nats) with
    ``power``, given the paired sd (nats); None when sd is 0 or undefined, or above max_n."""
    if not (sd > 0 and effect != 0):
        return None
    lo, hi = 2, 2
    while power_paired(hi, sd, effect, alpha) < power:
        if hi >= max_n:
            return None
        lo, hi = hi, min(2 * hi, max_n)
    while lo < hi:  # power grows with n: the first n that reaches it
        mid = (lo + hi) // 2
        if power_paired(mid, sd, effect, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def paired(variant: dict[int, float], baseline: dict[int, float], level: float = 0.95) -> dict:
    """Compare a variant's final val losses (nats) with the baseline's, paired by seed.

    Args:
        variant, baseline: {seed: val_loss}; only seeds present in both are used.

    Returns:
        {"n_pairs", "seeds", "diffs" (per seed, nats, variant - baseline), "pct_diffs" (per seed,
        100 d_s / mean baseline loss), "mean_diff" (nats), "sd_diff" (nats, ddof 1), "ci95" [lo, hi]
        of the mean difference (paired t), "p_value" (two-sided paired t-test), "undefined" (why the
        test is undefined: "one pair", "identical losses", "constant shift across seeds"; None when
        it is defined; then ci95 and p_value are NaN, never 0), "pct_log_loss", "pct_log_loss_ci95",
        "pct_perplexity", "pct_perplexity_ci95", "power": :func:`power_summary`}.
    """
    seeds = sorted(set(variant) & set(baseline))
    v = np.array([variant[s] for s in seeds], dtype=float)
    b = np.array([baseline[s] for s in seeds], dtype=float)
    n, nan = len(seeds), float("nan")
    out = {"n_pairs": n, "seeds": seeds}
    if n == 0:
        return {**out, "diffs": [], "pct_diffs": [], "mean_diff": nan, "sd_diff": nan, "ci95": [nan, nan],
                "p_value": nan, "undefined": "no pairs", "pct_log_loss": nan, "pct_log_loss_ci95": [nan, nan],
                "pct_perplexity": nan, "pct_perplexity_ci95": [nan, nan], "power": power_summary(0, nan, nan)}
    d = v - b
    diff, base = float(d.mean()), float(b.mean())
    sd = float(np.std(d, ddof=1)) if n > 1 else nan
    why = zero_variance(d, base)
    if why is None:
        res = stats.ttest_rel(v, b)
        ci = res.confidence_interval(level)
        lo, hi, p = float(ci.low), float(ci.high), float(res.pvalue)
    else:
        lo = hi = p = nan
    return {**out, "diffs": d.tolist(), "pct_diffs": (100.0 * d / base).tolist(), "mean_diff": diff,
            "sd_diff": sd, "ci95": [lo, hi], "p_value": p, "undefined": why,
            "pct_log_loss": 100.0 * diff / base,
            "pct_log_loss_ci95": [100.0 * lo / base, 100.0 * hi / base],
            "pct_perplexity": pct_perplexity(base + diff, base),
            "pct_perplexity_ci95": [100.0 * (safe_exp(lo) - 1) if math.isfinite(lo) else nan,
                                    100.0 * (safe_exp(hi) - 1) if math.isfinite(hi) else nan],
            "power": power_summary(n, sd if why is None else nan, base)}


def power_summary(n: int, sd: float, base: float) -> dict:
    """What the study could detect: {"n_pairs", "sd_diff" (nats), "power", "alpha",
    "min_detectable_diff" (nats) and "min_detectable_pct" (percent log-loss, of ``base``): the
    smallest effect the two-sided paired t-test detects with 80% power at these n and sd;
    "paper_pct": -2.40, "seeds_for_paper" (pairs needed to detect the paper's effect at this sd;
    None when undefined or above 100,000), "note" (why a value is missing, else None)}."""
    mde = min_detectable_effect(n, sd)
    paper = PAPER_PCT_LOG_LOSS / 100.0 * base if math.isfinite(base) else float("nan")
    need = seeds_needed(sd, paper) if math.isfinite(paper) else None
    note = None
    if n < 2:
        note = "fewer than two seed pairs: no paired sd"
    elif not sd > 0:
        note = "zero-variance differences: the paired sd is 0 or undefined"
    elif need is None:
        note = "more than 100,000 seeds would be needed"
    return {"n_pairs": n, "sd_diff": sd, "power": POWER, "alpha": ALPHA, "min_detectable_diff": mde,
            "min_detectable_pct": 100.0 * mde / base if math.isfinite(mde) and base else float("nan"),
            "paper_pct": PAPER_PCT_LOG_LOSS, "seeds_for_paper": need, "note": note}


def adjust(p_values: dict[str, float]) -> dict[str, float]:
    """Benjamini-Hochberg adjusted p-values (scipy.stats.false_discovery_control); NaN stays NaN."""
    names = [k for k, p in p_values.items() if math.isfinite(p)]
    out = {k: float("nan") for k in p_values}
    if names:
        adj = stats.false_discovery_control([p_values[k] for k in names], method="bh")
        out.update({k: float(a) for k, a in zip(names, adj)})
    return out


# -- the parameter (or compute) frontier ----------------------------------------------------------
def fit_power_law(params, losses) -> tuple[float, float]:
    """Least-squares fit of log L = intercept + slope log N (N: non-embedding parameters or FLOPs).

    Returns: (slope, intercept); slope < 0 when more parameters give lower loss.
    Raises: ValueError with fewer than two distinct sizes.
    """
    x, y = np.log(np.asarray(params, float)), np.log(np.asarray(losses, float))
    if len(set(x.tolist())) < 2:
        raise ValueError("the frontier needs at least two model sizes")
    fit = stats.linregress(x, y)
    return float(fit.slope), float(fit.intercept)


def slope_interval(params, losses, level: float = 0.95) -> tuple[float, float]:
    """The Student-t interval of the slope of log L = intercept + slope log N (scipy.stats.linregress's standard
    error, n - 2 degrees of freedom); (NaN, NaN) with fewer than three distinct sizes (no residual freedom)."""
    x, y = np.log(np.asarray(params, float)), np.log(np.asarray(losses, float))
    if len(set(x.tolist())) < 3:
        return float("nan"), float("nan")
    fit = stats.linregress(x, y)
    half = float(stats.t.ppf(0.5 + level / 2, len(x) - 2)) * float(fit.stderr)
    return float(fit.slope) - half, float(fit.slope) + half


def equivalent_params(loss: float, slope: float, intercept: float) -> float:
    """The size N on the fitted frontier whose loss is ``loss``: exp((log L - intercept) / slope)."""
    return float(safe_exp((math.log(loss) - intercept) / slope)) if slope < 0 else float("nan")


def not_fitted(n_sizes: int) -> str | None:
    """Why a frontier over ``n_sizes`` distinct sizes is not fitted (None when it is)."""
    if n_sizes >= MIN_FIT_SIZES:
        return None
    return (f"not fitted: {n_sizes} size(s) of the baseline family; a power law needs at least "
            f"{MIN_FIT_SIZES} (two points always lie on a line, so they say nothing of its shape)")


def parameter_multiplier(family: dict[int, dict[int, float]], variant: dict[int, float], variant_params: int,
                         level: float = 0.95) -> dict:
    """How many parameters (or FLOPs) a variant is worth, on the frontier of a model family.

    Args:
        family: {size: {seed: val_loss}} for the baseline family (>= ``MIN_FIT_SIZES`` sizes).
        variant: {seed: val_loss} of the variant; ``variant_params`` its size.

    Returns:
        {"multiplier": N_equivalent / N_variant from the seed means, "ci95": [lo, hi]: Student-t
        interval of the mean of log per-seed multipliers (each seed's own frontier and loss),
        exponentiated; NaN with fewer than 2 seeds or when a seed's own frontier does not fall
        with size ("ci_note" says which), "per_seed": {seed: multiplier}, "equivalent_params",
        "slope", "intercept", "seeds", "ci_note"}.  Values above 1 mean the variant reaches the
        loss of a larger baseline.

    Raises:
        ValueError: fewer than two distinct sizes.
    """
    seeds = sorted(set(variant).intersection(*[set(s) for s in family.values()]))
    sizes = sorted(family)
    slope, intercept = fit_power_law(sizes, [np.mean([family[n][s] for s in seeds]) for n in sizes])
    point = equivalent_params(float(np.mean([variant[s] for s in seeds])), slope, intercept) / variant_params
    nan = float("nan")
    out = {"multiplier": point, "ci95": [nan, nan], "equivalent_params": point * variant_params,
           "slope": slope, "intercept": intercept, "seeds": seeds, "per_seed": {}, "ci_note": None}
    for s in seeds:
        sl, ic = fit_power_law(sizes, [family[n][s] for n in sizes])
        out["per_seed"][s] = equivalent_params(variant[s], sl, ic) / variant_params
    logs = [math.log(m) for m in out["per_seed"].values() if math.isfinite(m) and m > 0]
    if len(seeds) < 2:
        out["ci_note"] = "one seed: no interval"
    elif len(logs) < len(seeds):
        bad = [s for s, m in out["per_seed"].items() if not (math.isfinite(m) and m > 0)]
        out["ci_note"] = f"no interval: the frontier of seed(s) {bad} alone does not fall with size"
    else:
        _, lo, hi = mean_ci(logs, level)
        out["ci95"] = [safe_exp(lo), safe_exp(hi)] if math.isfinite(lo) else [nan, nan]
        if not math.isfinite(lo):
            out["ci_note"] = "identical per-seed multipliers: no spread to build an interval from"
    return out


def effect_trend(points: list[tuple[float, float]], at: float | None = None) -> dict:
    """Trend of an effect with scale: least-squares slope of per-seed effects y (percent log-loss
    change) against x = log10 of the size, with its 95% t interval (scipy.stats.linregress; n - 2
    degrees of freedom, valid at small n under normal errors).

    Returns: {"slope_pct_per_decade", "ci95", "p_value", "n_points", "note"} (NaN, with the reason
    in "note", with fewer than 3 points or 2 distinct sizes); with ``at`` (a log10 size) also "at": {"x": at,
    "decades_beyond" (at minus the largest size's x), "effect_pct", "ci95"}: the line's mean effect there with the
    95% t interval of a fitted mean, s sqrt(1/n + (at - mean x)^2 / Sxx) (an extrapolation when at lies beyond the
    sizes: valid only if the effect stays linear in log size that far)."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    nan = float("nan")
    finite = all(math.isfinite(v) for v in (*xs, *ys))
    if len(xs) < 3 or len(set(xs)) < 2 or not finite:
        out = {"slope_pct_per_decade": nan, "ci95": [nan, nan], "p_value": nan, "n_points": len(xs),
               "note": "fewer than 3 seed pairs or 2 sizes: no trend" if finite else "a non-finite effect or size"}
        return out if at is None else {**out, "at": {"x": at, "decades_beyond": nan, "effect_pct": nan,
                                                     "ci95": [nan, nan]}}
    fit = stats.linregress(xs, ys)
    t = stats.t.ppf(0.975, len(xs) - 2)
    out = {"slope_pct_per_decade": float(fit.slope), "ci95": [float(fit.slope - t * fit.stderr),
           float(fit.slope + t * fit.stderr)], "p_value": float(fit.pvalue), "n_points": len(xs), "note": None}
    if at is not None:
        x = np.asarray(xs, dtype=float)
        resid = np.asarray(ys, dtype=float) - (fit.intercept + fit.slope * x)
        s = math.sqrt(float(resid @ resid) / (len(xs) - 2))
        se = s * math.sqrt(1 / len(xs) + (at - x.mean()) ** 2 / float(((x - x.mean()) ** 2).sum()))
        y0 = float(fit.intercept + fit.slope * at)
        out["at"] = {"x": at, "decades_beyond": at - float(x.max()), "effect_pct": y0,
                     "ci95": [float(y0 - t * se), float(y0 + t * se)]}
    return out
