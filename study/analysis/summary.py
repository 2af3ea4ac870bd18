"""The study's summary (summary.json): the decided verdict of the arms' test runs, the yardsticks, per-corpus losses
and attention logits, and the scale ladder's part.

Every number here comes from runs loaded (and checked to pair) by :mod:`study.analysis.runs`;
the statistics are :mod:`study.analysis.stats`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from study.analysis import scale_ladder
from study.analysis.pairing import comparable, shared_settings
from study.analysis.runs import lost_points
from study.analysis.verdict import comparison_name, comparisons_of, verdict_report as decided
from study.analysis.stats import paired


def recorded_settings(runs: dict[str, dict[int, dict]]) -> dict:
    """The settings every run recorded alike (flat; {} when the runs carry none), for the header."""
    groups = [comparable(m["settings"]) for r in runs.values() for m in r.values() if "settings" in m]
    return shared_settings(groups)


def summarize(cfg, root: Path, runs: dict[str, dict[int, dict]]) -> dict:
    """The content of summary.json over the test runs of study.arms (``runs``: {arm: {seed: run}},
    :func:`study.analysis.verdict.tested_runs`; {} while study.arms is empty).

    Returns: {"study", "task" (task.name), "baseline", "seeds", "settings" (what the runs recorded alike),
    "yardsticks" (:func:`study_yardsticks`), "per_corpus" (:func:`per_corpus`), "attn_logit_max" {arm:
    :func:`attn_logit_max`}, "diverged" {arm: {seed: {"step", "reason"}}} (the lost points: left out of every mean
    and test, listed in the report), "scale_ladder" (the profile, read from its run folders; None while off),
    "verdict" (the decided verdict of study.arms, :func:`study.analysis.verdict.verdict_report`; None while
    study.arms is empty)}.
    """
    settings = recorded_settings(runs)
    logits = {a: attn_logit_max(r) for a, r in runs.items()}
    return {"study": cfg.study.name, "task": cfg.task.name, "baseline": cfg.study.baseline,
            "seeds": list(cfg.study.seeds), "settings": settings,
            "yardsticks": study_yardsticks(cfg, root, runs, settings),
            "per_corpus": per_corpus(runs, comparisons_of(cfg)) if runs else None,
            "attn_logit_max": {a: x for a, x in logits.items() if x},
            "diverged": {a: lost_points(r) for a, r in runs.items()},
            "scale_ladder": scale_ladder.ladder_report(cfg, root),
            "verdict": decided(cfg, root, runs) if runs else None}


def attn_logit_max(runs: dict[int, dict]) -> list[float] | None:
    """Per layer, the mean over an arm's finished seeds of the final evaluation's largest attention
    logit (record.json ``attn_logit_max``: max |q.k| x scale, ``study.modeling.diagnostics.diagnostics``); None where a
    finished run lacks it (runs recorded before it existed) or the runs' layer counts differ."""
    lists = [m.get("attn_logit_max") for m in runs.values() if m["status"] == "ok"]
    if not lists or any(not x for x in lists) or len({len(x) for x in lists}) != 1:
        return None
    return [float(np.mean(layer)) for layer in zip(*lists)]


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


def per_corpus(runs: dict[str, dict[int, dict]], pairs: list[tuple[str, str]]) -> dict | None:
    """Per-corpus final validation loss (record.json "val_loss_per_corpus", nats) of the finished runs.

    Args:
        runs: {arm: {seed: run}}.
        pairs: the verdict's comparisons, (arm, reference) (:func:`study.analysis.verdict.comparisons_of`).

    Returns: None where no finished run recorded any; else {"corpora": [...], "note" (why no table: a finished run
    without a corpus the others have, or an arm without a finished seed; None when shown), "arms": {arm: {corpus:
    mean over its finished seeds}}, "comparisons": {"ARM vs REF": {corpus: :func:`study.analysis.stats.paired`}}}."""
    per = {a: {s: m.get("val_loss_per_corpus") or {} for s, m in r.items() if m["status"] == "ok"}
           for a, r in runs.items()}
    corpora = sorted({c for r in per.values() for x in r.values() for c in x})
    if not corpora:
        return None
    out = {"corpora": corpora, "note": None, "arms": {}, "comparisons": {}}
    short = next(((a, s, [c for c in corpora if c not in x]) for a, r in per.items() for s, x in r.items()
                  if set(x) != set(corpora)), None)
    lost = [a for a, r in per.items() if not r]
    if short or lost:
        out["note"] = (f"{runs[short[0]][short[1]].get('name', f'{short[0]} seed {short[1]}')} records no loss on "
                       f"{short[2]} (re-run it)" if short else f"no seed of {lost} finished")
        return out
    at = {c: {a: {s: x[c] for s, x in r.items()} for a, r in per.items()} for c in corpora}
    out["arms"] = {a: {c: float(np.mean(list(at[c][a].values()))) for c in corpora} for a in per}
    out["comparisons"] = {comparison_name(a, ref): {c: paired(at[c][a], at[c][ref]) for c in corpora}
                          for a, ref in pairs if a in per and ref in per}
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
