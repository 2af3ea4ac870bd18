"""A decided verdict (pure statistics, no I/O): Stein's two-stage seed count, the paired t test beside
two one-sided tests of equivalence (TOST), Benjamini-Hochberg over every comparison, one word per
comparison, the recipe decomposition and the arms' worth in parameters on the baseline family's frontier.

Units: losses and differences in nats; margins and half-widths in percent log-loss, turned into
nats with the reference arm's mean loss (``pct / 100 * L_ref``), as the paper's percent log-loss
change is 100 (L - L_ref) / L_ref (arXiv 2603.13381).

* Stein's two-stage procedure (C. Stein, Ann. Math. Statist. 16 (1945) 243-258): from the
  first n0 >= 5 paired differences with sd s0, N = max(n0, floor(t^2_{1-alpha/2, n0-1} s0^2 / d^2) + 1)
  pairs in all.  Because N depends on the first stage only, (mean_N - mu) sqrt(N) / s0 is exactly Student t
  with n0 - 1 degrees of freedom, whatever the unknown sd: the interval mean_N +- t_{1-alpha/2, n0-1} s0 / sqrt(N)
  has coverage exactly 1 - alpha, and its half-width is below d by the choice of N, so mean_N +- d covers
  with probability >= 1 - alpha (tests/test_decision.py checks both by simulation).
* Equivalence within +-delta: two one-sided paired t tests (statsmodels.stats.weightstats.ttost_paired),
  the same decision as the 90% paired t interval lying inside (-delta, +delta) (Schuirmann 1987).
* Benjamini-Hochberg (scipy.stats.false_discovery_control) over all comparisons, once for the
  difference tests and once for the equivalence tests.
* The paper's claim (-2.40% log-loss, :data:`PAPER_CLAIM_PCT`): a one-sided paired t test of "the effect is at
  least as large as claimed" (:func:`claim_test`), Benjamini-Hochberg over the comparisons; p < alpha excludes it.
* The word: "equivalent" when the adjusted TOST p < alpha (a real difference smaller than the margin
  is still "equivalent": the margin says what matters); else "better"/"worse" when the adjusted
  paired-t p < alpha (the sign of the mean difference; lower loss is better); else "undecided", with
  Stein's N (the seeds that would make the interval as narrow as the target half-width).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from study.analysis.stats import (adjust, fit_power_law, mean_ci, not_fitted, parameter_multiplier, slope_interval,
                                  zero_variance)

ALPHA = 0.05


def stein_n(s0: float, n0: int, d: float, alpha: float = ALPHA) -> int:
    """Stein's total number of pairs N = max(n0, floor(t^2_{1-alpha/2, n0-1} s0^2 / d^2) + 1).

    Args:
        s0: sd (ddof 1) of the first ``n0`` paired differences (nats); d: the wanted half-width (nats).

    Raises:
        ValueError: n0 < 2 or d <= 0.
    """
    if n0 < 2 or not d > 0:
        raise ValueError(f"Stein's N needs n0 >= 2 and d > 0 (got n0={n0}, d={d})")
    t = stats.t.ppf(1 - alpha / 2, n0 - 1)
    return max(n0, math.floor(t * t * s0 * s0 / (d * d)) + 1)


def stein_exact_halfwidth(s0: float, n0: int, n: int, alpha: float = ALPHA) -> float:
    """The half-width t_{1-alpha/2, n0-1} s0 / sqrt(n) (nats) of Stein's exact 1 - alpha interval around the mean of
    n pairs, n fixed by the first stage (n0 pairs, sd s0): at Stein's N it is at most d."""
    return float(stats.t.ppf(1 - alpha / 2, n0 - 1) * s0 / math.sqrt(n))


def tost(diffs: list[float], delta: float) -> dict:
    """Two one-sided paired t tests of |mean difference| < delta (nats) on the differences
    (statsmodels' ttost_paired of (x, 0): the paired test of x - 0).

    Returns: {"p_value" (the larger of the two one-sided p), "p_lower", "p_upper", "ci90" [lo, hi]
    (the 90% paired t interval: inside (-delta, delta) exactly when p_value < 0.05), "undefined"}.
    """
    from statsmodels.stats.weightstats import ttost_paired

    d = np.asarray(diffs, dtype=float)
    nan = float("nan")
    why = zero_variance(d, 1.0)
    if why is not None:
        inside = why == "identical losses" or (why == "constant shift across seeds" and abs(float(d[0])) < delta)
        p = 0.0 if inside and len(d) > 1 else nan
        return {"p_value": p, "p_lower": p, "p_upper": p, "ci90": [nan, nan], "undefined": why}
    p, lower, upper = ttost_paired(d, np.zeros_like(d), -delta, delta)
    _, lo, hi = mean_ci(d, 0.90)
    return {"p_value": float(p), "p_lower": float(lower[1]), "p_upper": float(upper[1]), "ci90": [lo, hi],
            "undefined": None}


#: the paper's claim (arXiv 2603.13381, the abstract's later version): the nonlinear query lowers validation
#: log-loss by 2.40% (% log-loss change of the arm against its reference)
PAPER_CLAIM_PCT = -2.40


def claim_test(diffs, claim: float) -> dict:
    """The paper's claim put to a test: a one-sided paired t test of H0 "the mean difference is at most ``claim``"
    (nats: the effect is as large as claimed, or larger) against H1 "it is above" (a smaller effect, none, or a
    loss).  A p below alpha (after Benjamini-Hochberg over the comparisons, :func:`decide`) excludes the claim.

    Returns: {"pct" (:data:`PAPER_CLAIM_PCT`), "nats" (``claim``), "p_value"} (NaN p for fewer than two pairs or
    zero variance)."""
    d = np.asarray(diffs, dtype=float)
    p = float("nan")
    if len(d) > 1 and math.isfinite(claim) and zero_variance(d, 1.0) is None:
        p = float(stats.ttest_1samp(d, claim, alternative="greater").pvalue)
    return {"pct": PAPER_CLAIM_PCT, "nats": claim, "p_value": p}


def compare_pair(arm: dict[int, float], ref: dict[int, float], seeds: list[int], n0: int, margin_pct: float,
                 halfwidth_pct: float, max_seeds: int, alpha: float = ALPHA) -> dict:
    """One comparison arm - reference, paired by seed, before the BH adjustment (:func:`decide`).

    Args:
        arm, ref: {seed: final val loss (nats)} of finished runs.
        seeds: the test seeds in order; the first ``n0`` are Stein's first stage.
        margin_pct, halfwidth_pct: equivalence margin (% log-loss of the reference's mean over the pairs) and
            target half-width d (% log-loss of the reference's mean over the first stage: d is fixed with N).

    Returns: {"n_pairs", "seeds", "diffs", "mean_diff", "sd_diff" (nats), "arm_sd", "ref_sd" (each arm's
    own seed sd, nats: never pooled), "ref_mean", "ci95" (paired t), "p_value" (paired t), "delta" (nats),
    "tost": :func:`tost`, "stein": {"n0", "s0", "n_needed", "n_total" (min(N, max_seeds)), "capped",
    "halfwidth" (d), "interval" [mean - d, mean + d], "coverage_min" (0.95 once N pairs are in; NaN before),
    "exact_halfwidth", "exact_interval" (mean +- t s0 / sqrt(n): coverage exactly "exact_coverage", 0.95)},
    "claim": :func:`claim_test` against the paper's -2.40%, "pct": the mean and both intervals in % log-loss}.
    """
    both = [s for s in seeds if s in arm and s in ref]
    a = np.array([arm[s] for s in both], dtype=float)
    r = np.array([ref[s] for s in both], dtype=float)
    nan = float("nan")
    base = float(r.mean()) if len(r) else nan
    diffs = a - r
    n = len(both)
    delta, d = margin_pct / 100 * base, nan
    out = {"n_pairs": n, "seeds": both, "diffs": diffs.tolist(), "mean_diff": float(diffs.mean()) if n else nan,
           "sd_diff": float(np.std(diffs, ddof=1)) if n > 1 else nan,
           "arm_sd": float(np.std(a, ddof=1)) if n > 1 else nan, "ref_sd": float(np.std(r, ddof=1)) if n > 1 else nan,
           "ref_mean": base, "delta": delta, "ci95": [nan, nan], "p_value": nan, "undefined": None}
    why = zero_variance(diffs, base)
    out["undefined"] = why
    if why is None:
        res = stats.ttest_rel(a, r)
        ci = res.confidence_interval(0.95)
        out.update(ci95=[float(ci.low), float(ci.high)], p_value=float(res.pvalue))
    out["tost"] = tost(diffs, delta) if n > 1 else {"p_value": nan, "p_lower": nan, "p_upper": nan,
                                                      "ci90": [nan, nan], "undefined": "one pair or none"}
    first = [s for s in seeds[:n0] if s in both]
    stein = {"n0": n0, "s0": nan, "n_needed": None, "n_total": None, "capped": False, "halfwidth": d,
             "interval": [nan, nan], "coverage_min": 1 - alpha, "exact_halfwidth": nan, "exact_interval": [nan, nan],
             "exact_coverage": 1 - alpha}
    if len(first) == n0 and n0 >= 2 and halfwidth_pct > 0:
        d = halfwidth_pct / 100 * float(np.mean([ref[s] for s in first]))  # fixed by the first stage, as N is
        s0 = float(np.std([arm[s] - ref[s] for s in first], ddof=1))
        need = stein_n(s0, n0, d, alpha)
        m, h = out["mean_diff"], stein_exact_halfwidth(s0, n0, n, alpha)
        stein.update(s0=s0, n_needed=need, n_total=min(need, max_seeds), capped=need > max_seeds,
                     halfwidth=d, interval=[m - d, m + d], exact_halfwidth=h, exact_interval=[m - h, m + h],
                     coverage_min=(1 - alpha) if n >= need else nan)
    out["stein"] = stein
    out["claim"] = claim_test(diffs, PAPER_CLAIM_PCT / 100 * base)
    pct = (lambda x: 100 * x / base if math.isfinite(x) else nan)  # noqa: E731
    out["pct"] = {"mean": pct(out["mean_diff"]), "ci95": [pct(x) for x in out["ci95"]],
                  "ci90": [pct(x) for x in out["tost"]["ci90"]], "stein": [pct(x) for x in stein["interval"]],
                  "stein_exact": [pct(x) for x in stein["exact_interval"]],
                  "margin": margin_pct, "halfwidth": halfwidth_pct}
    return out


def word(c: dict, alpha: float = ALPHA) -> tuple[str, str]:
    """(word, text) of one comparison after :func:`decide` set "p_value_bh" and "tost_p_bh": see the module
    docstring for the rule; text is the word with its reason, e.g. ``undecided (19 seeds needed)``."""
    st = c["stein"]
    if math.isfinite(c.get("tost_p_bh", float("nan"))) and c["tost_p_bh"] < alpha:
        return "equivalent", f"equivalent (within +-{c['pct']['margin']:g}%)"
    if math.isfinite(c.get("p_value_bh", float("nan"))) and c["p_value_bh"] < alpha:
        w = "better" if c["mean_diff"] < 0 else "worse"
        return w, w
    if st["n_needed"] is None:
        return "undecided", f"undecided (Stein's N undefined: fewer than {st['n0']} first-stage pairs)"
    if st["n_needed"] > c["n_pairs"]:
        return "undecided", f"undecided ({st['n_needed']} seeds needed)"
    return "undecided", (f"undecided (the interval is within the target half-width at {c['n_pairs']} seeds but "
                         f"straddles a margin or zero)")


def decide(comparisons: dict[str, dict], alpha: float = ALPHA) -> dict[str, dict]:
    """Benjamini-Hochberg over all comparisons (paired t p -> "p_value_bh"; TOST p -> "tost_p_bh"; the paper's claim
    -> "claim_p_bh" and "claim"["excluded"]), then each comparison's "word" and "verdict" (:func:`word`).  Changes and
    returns ``comparisons``."""
    for key, name in (("p_value", "p_value_bh"), ("tost", "tost_p_bh"), ("claim", "claim_p_bh")):
        ps = {k: (c[key]["p_value"] if key in ("tost", "claim") else c[key]) for k, c in comparisons.items()}
        for k, p in adjust(ps).items():
            comparisons[k][name] = p
    for c in comparisons.values():  # the paper's claim excluded (True), not excluded (False), or untestable (None)
        p = c["claim_p_bh"]
        c["claim"]["excluded"] = bool(p < alpha) if math.isfinite(p) else None
    for c in comparisons.values():
        c["word"], c["verdict"] = word(c, alpha)
    return comparisons


def seeds_to_train(first_stage: dict[str, dict], n0: int, max_seeds: int) -> int:
    """How many test seeds the arms need in all: the largest Stein N over ``first_stage``'s comparisons
    (each a :func:`compare_pair` on the first n0 seeds), capped at ``max_seeds``; n0 when none is defined."""
    ns = [c["stein"]["n_total"] for c in first_stage.values() if c["stein"]["n_total"] is not None]
    return min(max_seeds, max([n0, *ns]))


def seed_list(seeds: list[int], n: int, exclude: list[int]) -> list[int]:
    """The first ``n`` test seeds: ``seeds`` (study.seeds) in order, then max(seeds)+1, +2 ... skipping ``exclude``
    (the tuning seeds)."""
    out = list(seeds[:n])
    nxt = max(list(seeds) + [0]) + 1
    while len(out) < n:
        if nxt not in exclude and nxt not in out:
            out.append(nxt)
        nxt += 1
    return out


def decomposition(means: dict[str, dict], rows: list[str], start: str, end: str, linear: str) -> dict:
    """The recipe decomposition: each row arm's mean loss and interval, and the share of the gap
    L(start) - L(end) (e.g. the baseline at today's recipe -> tuned nonlinear_q) that ``linear`` (the linear
    recipe alone) closes: (L(start) - L(linear)) / (L(start) - L(end)) (the follow-up measured 88%).

    Args:
        means: {arm: {seed: val loss}}.

    Returns: {"rows": [{"arm", "n_seeds", "mean", "sd", "ci95"}], "start", "end", "linear", "gap" (nats),
    "gap_ci95" (the 95% t interval of the start - end differences paired by seed, nats), "share" (None where an arm
    has no runs, or where that interval does not lie above zero: no gap to share), "note" (why no share)}.
    """
    out_rows = []
    mean_of = {}
    for a in rows:
        xs = list((means.get(a) or {}).values())
        if xs:
            m, lo, hi = mean_ci(xs)
            mean_of[a] = m
            out_rows.append({"arm": a, "n_seeds": len(xs), "mean": m,
                             "sd": float(np.std(xs, ddof=1)) if len(xs) > 1 else float("nan"), "ci95": [lo, hi]})
        else:
            out_rows.append({"arm": a, "n_seeds": 0, "mean": float("nan"), "sd": float("nan"),
                             "ci95": [float("nan")] * 2})
    gap = share = note = None
    gap_ci = [None, None]
    if all(a in mean_of for a in (start, end, linear)):
        gap = mean_of[start] - mean_of[end]
        common = sorted(set(means[start]) & set(means[end]))
        diffs = [means[start][s] - means[end][s] for s in common]
        if len(diffs) > 1:
            _, lo, hi = mean_ci(diffs)
            if not (math.isfinite(lo) and math.isfinite(hi)) and np.std(diffs) == 0:  # identical differences
                lo = hi = float(np.mean(diffs))
            gap_ci = [lo, hi]
        if gap_ci[0] is not None and gap_ci[0] > 0:
            share = (mean_of[start] - mean_of[linear]) / gap
        else:
            note = (f"no share: {end} is not shown below {start} (the gap's paired interval does not lie above "
                    f"zero), so there is no gap for the linear recipe to close")
    else:
        note = f"no share: {start}, {end} or {linear} has no finished runs"
    return {"rows": out_rows, "start": start, "end": end, "linear": linear, "gap": gap, "gap_ci95": gap_ci,
            "share": share, "note": note}


def frontier_worth(means: dict[str, dict[int, float]], params: dict[str, int], family: list[str],
                   worth: list[str]) -> dict:
    """What each arm of ``worth`` is worth in non-embedding parameters, on the power-law frontier
    log L = intercept + slope log N of the baseline family's arms (MLP widths, each at its own lr*), as the
    paper prices its nonlinear query against a baseline with 12.5% more parameters (arXiv 2603.13381).

    Args:
        means: {arm: {seed: val loss (nats)}}; params: {arm: non-embedding parameters}.
        family: the frontier's arms (distinct sizes); worth: the arms to price on it.

    Returns: {"family": [{"arm", "non_embedding_params", "n_seeds", "mean"}], "fitted", "reason" (why not: fewer
    than 3 sizes with runs), "slope", "intercept" (over the seeds every size has), "slope_ci95" (Student t, sizes - 2
    degrees of freedom), "falls" (that interval below zero: the family's loss falls with size beyond its noise;
    otherwise no worth can be read off it), "worth": {arm: :func:`stats.parameter_multiplier` (multiplier
    N_equivalent / N_arm, its 95% interval over the seeds' own frontiers) + "non_embedding_params", "extrapolated"
    (N_equivalent outside the family's sizes: read off the line beyond its points)}}.
    """
    fam = {params[a]: means[a] for a in family if means.get(a) and a in params}
    rows = [{"arm": a, "non_embedding_params": params.get(a), "n_seeds": len(means.get(a) or {}),
             "mean": float(np.mean(list(means[a].values()))) if means.get(a) else float("nan")} for a in family]
    same = sorted({n for n in fam if sum(params.get(a) == n for a in family if means.get(a)) > 1})
    reason = (f"not fitted: the family arms {[a for a in family if params.get(a) == same[0]]} share one size "
              f"({same[0]:,} non-embedding parameters); list one arm per size in decomposition.family" if same
              else not_fitted(len(fam)))
    out = {"family": rows, "fitted": False, "reason": reason, "slope": None, "intercept": None, "worth": {}}
    if out["reason"] is not None:
        return out
    sizes = sorted(fam)
    common = sorted(set.intersection(*[set(fam[n]) for n in sizes]))  # the seeds every size has (a second stage may add)
    losses = [float(np.mean([fam[n][s] for s in common])) for n in sizes]
    slope, intercept = fit_power_law(sizes, losses)
    lo, hi = slope_interval(sizes, losses)
    out.update(fitted=True, slope=slope, intercept=intercept, slope_ci95=[lo, hi],
               falls=bool(math.isfinite(hi) and hi < 0))  # the family's loss falls with size, beyond its noise
    for a in worth:
        if means.get(a) and a in params:
            w = parameter_multiplier(fam, means[a], params[a])
            n = w["equivalent_params"]
            out["worth"][a] = {**w, "non_embedding_params": params[a],
                               "extrapolated": not (math.isfinite(n) and sizes[0] <= n <= sizes[-1])}
    return out
