"""The scale ladder's analysis (summary.json "scale_ladder").

The profile itself (which runs exist) is conf/study.yaml's ``scale_ladder``; how a run derives its budget and lr is
:mod:`study.runner.spec`; this module only reads its finished runs, checks that they pair, and
computes its verdicts.
"""
from __future__ import annotations

import math
from pathlib import Path

from study.analysis.pairing import check
from study.analysis.runs import RunsError, final_losses, load_runs, lost_points
from study.analysis.stats import (PAPER_NON_EMBEDDING_PARAMS, adjust, effect_trend, fit_power_law, mean_ci, not_fitted,
                                  paired, parameter_multiplier)

LADDER = "scale_ladder"


def vs_baseline(ok: dict[str, dict[int, float]], base: str) -> dict[str, dict]:
    """Every variant of one size ({variant: {seed: val_loss}}) against ``base``, paired by seed
    (:func:`study.analysis.stats.paired`), with Benjamini-Hochberg adjusted p-values ("p_value_bh") over the variants."""
    out = {v: paired(ok[v], ok[base]) for v in ok if v != base}
    for v, p in adjust({v: c["p_value"] for v, c in out.items()}).items():
        out[v]["p_value_bh"] = p
    return out


def _trend(sizes: list[dict], variant: str, base: str) -> dict:
    pts = []
    for size in sizes:
        ok = size["_ok"]
        for s in sorted(set(ok.get(variant, {})) & set(ok.get(base, {}))):
            pts.append((math.log10(size["non_embedding_params"]), 100.0 * (ok[variant][s] - ok[base][s]) / ok[base][s]))
    return effect_trend(pts, at=math.log10(PAPER_NON_EMBEDDING_PARAMS))


def ladder_size(cfg, model: str, runs: dict[str, dict[int, dict]]) -> dict:
    """One size of the ladder: its shape, each variant's mean loss, interval, lr, size, compute and in-context gain,
    the paired verdicts against the baseline, and its final losses (``_ok``, popped by :func:`ladder_report`).

    Raises: RunsError where a variant's runs trained at an lr other than its lr* now.
    """
    la, base = cfg.scale_ladder, cfg.study.baseline
    ok = final_losses(runs)
    rec = next(iter(runs[base].values()))["settings"]
    size = {"model": model, "n_layer": rec["model.n_layer"], "n_head": rec["model.n_head"],
            "n_embd": rec["model.n_embd"], "variants": {}, "_ok": ok}
    for v, r in runs.items():
        one = next((m for m in r.values() if m["status"] == "ok"), next(iter(r.values())))
        mean, lo, hi = mean_ci(list(ok[v].values())) if ok[v] else (float("nan"),) * 3
        lrs = sorted({m.get("lr") for m in r.values() if m.get("lr") is not None})
        gains = [m["in_context_gain"] for m in r.values() if m["status"] == "ok" and m.get("in_context_gain") is not None]
        if la.lr_from_tuned:  # the lr study.runner.spec.run_spec gives a ladder run of v now
            from study.config.transfer import transferred_lr

            want = transferred_lr(cfg, v, model if la.lr_per_size else None)
            stale = [x for x in lrs if want is not None and not math.isclose(x, want, rel_tol=1e-9)]
            if stale:
                raise RunsError(f"the scale ladder's {v} runs at {model} trained at lr {stale}, but its lr* is "
                                f"now {want:.6g} (conf/tuned.yaml): re-run the ladder (`make scale-ladder`)")
        size["variants"][v] = {"n_seeds": len(ok[v]), "val_loss_mean": mean, "val_loss_ci95": [lo, hi], "lr": lrs,
                               "non_embedding_params": one["non_embedding_params"],
                               "flops_per_token": one["flops_per_token"], "tokens": one["tokens"],
                               "train_flops": float(one["flops_per_token"]) * one["tokens"],
                               "in_context_gain": sum(gains) / len(gains) if gains else float("nan"),
                               "diverged": lost_points(r)}
    size["non_embedding_params"] = size["variants"][base]["non_embedding_params"]
    size["tokens"] = size["variants"][base]["tokens"]
    size["vs_baseline"] = vs_baseline(ok, base)
    return size


def compute_fits(sizes: list[dict], variants: list[str], base: str) -> tuple[dict, str | None]:
    """({variant: {"slope", "intercept"}} of log L = intercept + slope log C over the sizes' training FLOPs, why no
    fit (None when fitted)); each size also gets "baseline_fit" (the fit's loss there and the baseline's residual)."""
    fits = {}
    fit_note = not_fitted(len({s["variants"][base]["train_flops"] for s in sizes}))
    if fit_note is None:
        for v in variants:
            pts = [(s["variants"][v]["train_flops"], s["variants"][v]["val_loss_mean"]) for s in sizes
                   if math.isfinite(s["variants"][v]["val_loss_mean"])]
            if not_fitted(len({c for c, _ in pts})) is None:
                slope, intercept = fit_power_law([c for c, _ in pts], [x for _, x in pts])
                fits[v] = {"slope": slope, "intercept": intercept}
    for s in sizes:  # how far the baseline's own mean lies off its fit: a multiplier is only as good as the fit
        b = s["variants"][base]
        if base in fits and math.isfinite(b["val_loss_mean"]):
            fitted = math.exp(fits[base]["intercept"] + fits[base]["slope"] * math.log(b["train_flops"]))
            s["baseline_fit"] = {"fitted": fitted, "residual": b["val_loss_mean"] - fitted}
    return fits, fit_note


def compute_multipliers(sizes: list[dict], variants: list[str], base: str) -> None:
    """Each size's "compute_multiplier": {v: C_base(L_v) / C_v with its interval}, read off the baseline family."""
    family = {s["variants"][base]["train_flops"]: s["_ok"][base] for s in sizes if s["_ok"][base]}
    for s in sizes:
        s["compute_multiplier"] = {}
        for v in variants:
            if v == base or not s["_ok"][v] or not_fitted(len(family)):
                continue
            mlt = parameter_multiplier(family, s["_ok"][v], s["variants"][v]["train_flops"])
            s["compute_multiplier"][v] = {"multiplier": mlt["multiplier"], "ci95": mlt["ci95"],
                                          "equivalent_flops": mlt["equivalent_params"], "ci_note": mlt["ci_note"]}


def ladder_report(cfg, root: Path) -> dict | None:
    """The scale-ladder profile's part of summary.json (None while the profile is off).

    Returns: {"tokens_per_param", "sizes": [{"model", "n_layer", "n_head", "n_embd", "non_embedding_params"
    (the baseline's), "tokens", "variants": {v: {"n_seeds", "val_loss_mean", "val_loss_ci95",
    "non_embedding_params", "flops_per_token", "train_flops" (= flops_per_token x tokens), "in_context_gain" (mean
    over its finished seeds, nats: whether attention does the work at this size)}},
    "vs_baseline": paired verdicts with power, "compute_multiplier": {v: ...}}], "fits": {v: {"slope",
    "intercept"}} of log L = intercept + slope log C (C: training FLOPs; only over >= 3 sizes),
    "fit_note" (why no fit), "trend": {v: effect_trend, with "at": the line's effect at the paper's size,
    :data:`study.analysis.stats.PAPER_NON_EMBEDDING_PARAMS`}}; with a baseline fit each size also has "baseline_fit":
    {"fitted": the fit's loss at the size's compute, "residual": the baseline's mean minus it (nats)}.  The compute multiplier of v at one size is
    C_base(L_v) / C_v, C_base(L) read off the baseline's fit over all sizes, with a t interval over
    per-seed multipliers (:func:`study.analysis.stats.parameter_multiplier`, compute in place of
    parameters).  Model shapes are read from the runs' recorded settings.

    Raises:
        RunsError: a ladder run is missing.
        PairingError: the runs of one size do not pair, or sizes differ in a setting other than the
            model and its token budget.
    """
    la, base = cfg.scale_ladder, cfg.study.baseline
    if not la.models:
        return None
    sizes, groups = [], {}
    for model in la.models:
        runs = load_runs(cfg, root, list(la.variants), list(cfg.study.seeds), f"{LADDER}/{model}")
        groups.update({f"{v} ({model})": r for v, r in runs.items()})
        sizes.append(ladder_size(cfg, model, runs))
    # sizes differ in shape and budget only (model.position or vocab_size must agree across the ladder)
    check(groups, "the scale ladder's sizes", ignore=("model.name", "model.n_layer", "model.n_head", "model.n_embd",
                                                     "train.tokens"))
    fits, fit_note = compute_fits(sizes, list(la.variants), base)
    compute_multipliers(sizes, list(la.variants), base)
    trend = {v: _trend(sizes, v, base) for v in la.variants if v != base}
    for s in sizes:
        s.pop("_ok")
    return {"tokens_per_param": la.tokens_per_param, "lr_from_tuned": la.lr_from_tuned, "lr_per_size": la.lr_per_size,
            "sizes": sizes, "fits": fits,
            "fit_note": fit_note, "trend": trend}
