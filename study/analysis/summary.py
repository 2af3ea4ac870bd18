"""The study's summary (summary.json): per-variant losses, the paired verdict with its power,
the parameter frontier, the yardsticks and per-corpus losses, and the profiles' parts.

Every number here comes from runs loaded (and checked to pair) by :mod:`study.analysis.runs`;
the statistics are :mod:`study.analysis.stats`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from study.analysis import scale_ladder
from study.analysis.pairing import comparable, shared_settings
from study.analysis.runs import final_losses, lost_points
from study.analysis.verdict import accuracy, verdict_report as decided
from study.analysis.stats import (MIN_FIT_SIZES, fit_power_law, mean_ci, not_fitted, paired, parameter_multiplier,
                                  safe_exp, vs_baseline)


def in_family(variant: str, base_name: str) -> bool:
    """The baseline family of the parameter frontier: the baseline and its MLP-width siblings."""
    return variant == base_name or variant.startswith(f"{base_name}_mlp")


def recorded_settings(runs: dict[str, dict[int, dict]]) -> dict:
    """The settings every run recorded alike (flat; {} when the runs carry none), for the header."""
    groups = [comparable(m["settings"]) for r in runs.values() for m in r.values() if "settings" in m]
    return shared_settings(groups)


def summarize(cfg, runs: dict[str, dict[int, dict]], root: Path, profiles_too: bool = True) -> dict:
    """The content of summary.json.

    Returns: {"study", "task" (task.name), "baseline", "seeds", "settings" (what the runs recorded alike),
    "variants": {v:
    {"n_seeds", "val_loss_mean", "val_loss_sd" (nats), "val_loss_ci95" (t interval of the mean, NaN
    below 2 seeds), "val_perplexity_mean", "lr", "min_lr" (peak and final lr the runs used),
    "non_embedding_params", "total_params", "flops_per_token", "tokens", "val_loss_per_corpus" {corpus:
    mean nats} or None, "attn_logit_max" (:func:`attn_logit_max`), the mlm and mqar tasks' accuracy
    (:func:`study.analysis.verdict.accuracy`: "val_accuracy_mean", "val_accuracy_sd", "val_accuracy_ci95"),
    "diverged" {seed: {"step", "reason"}} (the lost points: left out of every mean and test, listed in the
    report)}}, "vs_baseline" (:func:`study.analysis.stats.vs_baseline`: paired t, BH,
    power), "frontier" (:func:`frontier`), "yardsticks" (:func:`study_yardsticks`), "per_corpus"
    (:func:`per_corpus`), "scale_ladder" (the profile, read from its run folders; None
    while off or with ``profiles_too=False``), "verdict" (the decided verdict of study.arms,
    :func:`study.analysis.verdict.verdict_report`; None while study.arms is empty)}.
    """
    base_name = cfg.study.baseline
    ok = final_losses(runs)
    variants = {}
    for v, r in runs.items():
        losses = list(ok[v].values())
        # the settings and counts of a finished run where there is one (a diverged run saw fewer tokens)
        any_run = next((m for m in r.values() if m["status"] == "ok"), next(iter(r.values())))
        mean, lo, hi = mean_ci(losses) if losses else (float("nan"),) * 3
        sd = float(np.std(losses, ddof=1)) if len(losses) > 1 else float("nan")
        corpora = [m.get("val_loss_per_corpus") for m in r.values() if m["status"] == "ok"]
        per = ({c: float(np.mean([x[c] for x in corpora])) for c in corpora[0]}
               if corpora and all(corpora) else None)
        variants[v] = {"n_seeds": len(losses), "val_loss_mean": mean, "val_loss_sd": sd, "val_loss_ci95": [lo, hi],
                       "val_perplexity_mean": safe_exp(mean) if math.isfinite(mean) else float("nan"),
                       "lr": any_run.get("lr"), "min_lr": any_run.get("min_lr"),
                       "non_embedding_params": any_run["non_embedding_params"],
                       "total_params": any_run.get("total_params"), "flops_per_token": any_run["flops_per_token"],
                       "tokens": any_run["tokens"], "val_loss_per_corpus": per,
                       "attn_logit_max": attn_logit_max(r), **accuracy(r),
                       "diverged": lost_points(r)}
    settings = recorded_settings(runs)
    return {"study": cfg.study.name, "task": cfg.task.name, "baseline": base_name, "seeds": list(cfg.study.seeds),
            "settings": settings,
            "variants": variants, "vs_baseline": vs_baseline(ok, base_name) if base_name in ok else {},
            "frontier": frontier(base_name, ok, variants),
            "yardsticks": study_yardsticks(cfg, root, runs, settings),
            "per_corpus": per_corpus(runs, base_name),
            "scale_ladder": scale_ladder.ladder_report(cfg, root) if profiles_too else None,
            "verdict": decided(cfg, root) if profiles_too else None}


def attn_logit_max(runs: dict[int, dict]) -> list[float] | None:
    """Per layer, the mean over a variant's finished seeds of the final evaluation's largest attention
    logit (record.json ``attn_logit_max``: max |q.k| x scale, ``study.modeling.diagnostics.diagnostics``); None where a
    finished run lacks it (runs recorded before it existed) or the runs' layer counts differ."""
    lists = [m.get("attn_logit_max") for m in runs.values() if m["status"] == "ok"]
    if not lists or any(not x for x in lists) or len({len(x) for x in lists}) != 1:
        return None
    return [float(np.mean(layer)) for layer in zip(*lists)]


def frontier(base_name: str, ok: dict[str, dict[int, float]], variants: dict) -> dict:
    """The parameter frontier: log L = intercept + slope log N over the baseline family's sizes, and
    every other variant's equivalent parameter multiplier (:func:`stats.parameter_multiplier`).

    Returns: {"fitted": bool, "reason" (why not fitted: fewer than ``MIN_FIT_SIZES`` sizes), "family",
    "sizes" (distinct sizes), and when fitted "slope", "intercept", "multipliers": {v: ...}}.
    """
    family = {variants[v]["non_embedding_params"]: ok[v] for v in ok if in_family(v, base_name) and ok[v]}
    out = {"family": sorted(v for v in ok if in_family(v, base_name)), "sizes": len(family),
           "min_sizes": MIN_FIT_SIZES, "fitted": False, "reason": not_fitted(len(family))}
    if out["reason"]:
        return out
    sizes = sorted(family)
    slope, intercept = fit_power_law(sizes, [float(np.mean(list(family[n].values()))) for n in sizes])
    out.update(fitted=True, slope=slope, intercept=intercept, multipliers={})
    for v in ok:
        if not in_family(v, base_name) and ok[v]:
            out["multipliers"][v] = parameter_multiplier(family, ok[v], variants[v]["non_embedding_params"])
    return out


def yardsticks(meta_path: Path, settings: dict) -> dict:
    """The prepared data's yardsticks (cross-entropy, nats, of simple models on the same fixed
    validation windows: unigram, bigram; meta.json "yardsticks"), when they belong to the runs' data
    (``settings["data_digest"]``) and windows (model.block_size, train.val_tokens // block_size).

    Returns: {"available": bool, "note" (why not), "method", "unigram": {"all": nats, corpus: nats ...},
    "bigram": {...}}.
    """
    if not meta_path.is_file():
        return {"available": False, "note": f"{meta_path} not found"}
    from study.data.records import corrupt_field, data_digest, read_meta

    y = read_meta(meta_path.parent, check=False).get("yardsticks")  # not JSON: DataError, one line
    if y is not None and not isinstance(y, dict):
        raise corrupt_field(meta_path, "yardsticks", y, "an object")
    digest = data_digest(meta_path.parent)
    runs_digest = settings.get("data_digest")
    if not y:
        return {"available": False, "note": "the prepared data records no yardsticks (re-run `python -m study.prepare`)"}
    if y.get("skipped"):
        return {"available": False, "note": f"prepare skipped them: {y['skipped']}"}
    block, val = (_int(settings.get(k)) for k in ("model.block_size", "train.val_tokens"))  # str from MLflow
    windows = val // block if block and val else None
    if block and y.get("block_size") not in (None, block) or windows and y.get("n_val_windows") not in (None, windows):
        return {"available": False, "note": f"they were computed on windows of {y.get('block_size')} tokens "
                                            f"({y.get('n_val_windows')} windows); the runs evaluated {windows} windows "
                                            f"of {block}: re-run `python -m study.prepare` with the runs' settings"}
    if runs_digest and digest != runs_digest:
        return {"available": False, "note": f"the prepared data ({digest}) is not the data the runs trained on "
                                            f"({runs_digest}): re-run the study (`dvc repro`)"}
    return {"available": True, "note": None, **y}


def study_yardsticks(cfg, root: Path, runs: dict[str, dict[int, dict]], settings: dict) -> dict:
    """The yardsticks of the runs' task: lm's are the prepared data's (:func:`yardsticks`); any other task's are what
    its runs recorded (:func:`task_yardsticks`), never the prepared text's unigram and bigram."""
    if cfg.task.name == "lm":
        return yardsticks(root / cfg.data.dir / "meta.json", settings)
    return task_yardsticks(cfg.task.name, runs)


def task_yardsticks(task: str, runs: dict[str, dict[int, dict]]) -> dict:
    """The yardsticks every finished run of a task other than lm recorded (record.json "yardsticks", written by the
    task's module: :func:`study.tasks.mlm.yardsticks` {"unigram" (nats of the chosen validation tokens),
    "masked_share", ...}, :func:`study.tasks.mqar.yardsticks` {"chance" (nats, ln(V - V/2)), "chance_accuracy"
    (1 / (V - V/2)), ...}).

    Returns: {"available": bool, "task", "note" (why not: no run recorded them, or runs disagree), and the
    recorded fields}.
    """
    found = [m.get("yardsticks") for r in runs.values() for m in r.values() if m["status"] == "ok"]
    if not found or any(not isinstance(y, dict) for y in found):
        return {"available": False, "task": task, "note": f"a finished {task} run records none in its record.json "
                                                        f"(runs trained before tasks recorded them: re-run them)"}
    if any(y != found[0] for y in found):
        return {"available": False, "task": task, "note": "the runs recorded different yardsticks (different data or "
                                                        "sizes): they do not share one validation set"}
    return {"available": True, "task": task, "note": None, **found[0]}


def _int(x) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def per_corpus(runs: dict[str, dict[int, dict]], base: str) -> dict | None:
    """Per-corpus final validation loss (metrics.json "val_loss_per_corpus"), when every finished run has it.

    Returns: {"corpora": [...], "vs_baseline": {corpus: {variant: paired(...)}}} or None."""
    per = {v: {s: m.get("val_loss_per_corpus") for s, m in r.items() if m["status"] == "ok"} for v, r in runs.items()}
    if not per or not all(x for r in per.values() for x in r.values()) or not per.get(base):
        return None  # also when no baseline run finished (every seed diverged): nothing to pair against
    corpora = sorted(next(iter(per[base].values())))
    out = {"corpora": corpora, "vs_baseline": {}}
    for c in corpora:
        ok = {v: {s: x[c] for s, x in r.items() if c in x} for v, r in per.items()}
        out["vs_baseline"][c] = {v: paired(ok[v], ok[base]) for v in ok if v != base}
    return out


def finite_or_null(obj):
    """NaN/inf -> None, recursively (dict keys to str): summary.json stays strict JSON for `dvc metrics show`."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj
