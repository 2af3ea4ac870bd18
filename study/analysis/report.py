"""The report in one call: load the study's runs, check that they pair, summarise, write
comparison.md, summary.json, the DVC metrics (metrics/VARIANT.json), the DVC plot data (curves.csv)
and the figures (``study.compare`` is its command line)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from study.analysis import figures, tables
from study.analysis.runs import load_runs
from study.analysis.summary import finite_or_null, recorded_settings, study_yardsticks, summarize

#: where the figures go, under study.reports_dir (one DVC plots folder: only existing figures are plots)
FIGURES = "figures"
#: the DVC metric of compare, under study.reports_dir: one numbers-only file per variant
METRICS = "metrics"
#: the DVC plot of compare, under study.reports_dir: every run's validation curve, one row per evaluation
CURVES = "curves.csv"


def report_dir(cfg, root: Path) -> Path:
    """Where compare writes: ``study.reports_dir`` for the study's runs (DVC's outputs), and
    ``study.reports_dir/GROUP`` for the runs of ``study.group=GROUP`` (runs/GROUP/), which leaves the study's
    report alone."""
    group = str(cfg.study.group or "")
    return root / cfg.study.reports_dir / group if group else root / cfg.study.reports_dir


def write_report(cfg, root: Path) -> dict:
    """Write :func:`report_dir`/{comparison.md, summary.json, figures/*.png} over the runs of ``study.group``
    (the study's own runs when it is empty); return the summary.

    Raises:
        RunsError: a run is missing or unreadable.
        PairingError: runs that would be compared differ in a setting other than the variant.
    """
    runs = load_runs(cfg, root, group=str(cfg.study.group or "")) if cfg.study.variants else {}
    out = report_dir(cfg, root)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(cfg, runs, root)
    if not runs and summary.get("verdict"):  # the decided verdict alone: its test runs are the curves
        from study.analysis.verdict import tested_runs

        runs = tested_runs(cfg, root)
        summary["settings"] = recorded_settings(runs)
        summary["yardsticks"] = study_yardsticks(cfg, root, runs, summary["settings"])
    summary["figures"] = figures.write_all(summary, runs, out / FIGURES)
    (out / "comparison.md").write_text(tables.markdown(summary, summary["figures"]))
    (out / "summary.json").write_text(json.dumps(finite_or_null(summary), indent=1, allow_nan=False))
    write_metrics(summary, out / METRICS)
    write_curves(runs, out / CURVES)
    return summary


def variant_metrics(summary: dict) -> dict[str, dict]:
    """{variant: the numbers of metrics/VARIANT.json}: ``val_loss`` (mean final val loss over its finished
    seeds, nats), ``n`` (seeds) and, for the mlm and mqar tasks, ``val_accuracy`` (its mean, in [0, 1]); for every
    variant compared with the baseline, paired by seed:
    ``pct_log_loss`` (mean difference in % log-loss), ``ci_low``/``ci_high`` (its 95% t interval, %),
    ``p`` (paired t-test) and ``n`` (pairs).  Undefined values (one pair, no finished seed) are left out,
    so every value is a finite number (``dvc metrics show`` shows a missing one as '-')."""
    out = {}
    for v, s in summary["variants"].items():
        m = {"val_loss": s["val_loss_mean"], "n": s["n_seeds"], "val_accuracy": s.get("val_accuracy_mean")}
        c = summary["vs_baseline"].get(v) if v != summary["baseline"] else None
        if c:
            lo, hi = c.get("pct_log_loss_ci95") or (None, None)
            m.update(pct_log_loss=c.get("pct_log_loss"), ci_low=lo, ci_high=hi, p=c.get("p_value"), n=c["n_pairs"])
        out[v] = _numbers(m)
    v = summary.get("verdict") or {}
    if not summary["variants"] and v:  # the decided verdict alone: one file per arm, vs_REF per comparison
        for a, r in v["arms"].items():
            m = {"val_loss": r["val_loss_mean"], "n": r["n_seeds"], "val_accuracy": r.get("val_accuracy_mean")}
            for c in v["comparisons"].values():
                if c["arm"] == a:
                    m[f"vs_{c['reference']}"] = _numbers({"pct_log_loss": c["pct"]["mean"], "ci_low": c["pct"]["ci95"][0],
                                                         "ci_high": c["pct"]["ci95"][1], "p": c["p_value_bh"],
                                                         "n": c["n_pairs"]})
            out[a] = _numbers(m)
    return out


def _numbers(m: dict) -> dict:
    """``m`` without its undefined values: only finite numbers and mappings of them."""
    return {k: x for k, x in m.items() if isinstance(x, dict)
            or (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x))}


def write_metrics(summary: dict, folder: Path) -> None:
    """metrics/VARIANT.json for every variant of the study (:func:`variant_metrics`); files of variants
    no longer in the study are removed.  ``dvc metrics show`` lists them one row each beside the runs'."""
    folder.mkdir(parents=True, exist_ok=True)
    numbers = variant_metrics(summary)
    for old in folder.glob("*.json"):
        if old.stem not in numbers:
            old.unlink()
    for v, m in numbers.items():
        (folder / f"{v}.json").write_text(json.dumps(m, indent=1, allow_nan=False) + "\n")


def write_curves(runs: dict[str, dict[int, dict]], path: Path) -> None:
    """curves.csv: ``run,variant,seed,step,tokens,val_loss,train_loss``, one row per evaluation of every run
    (nats; non-finite rows of a diverged run left out): the data of the DVC plot ``val_loss`` (dvc.yaml,
    template .dvc/plots/runs.json: one line per run, validation loss against tokens)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["run", "variant", "seed", "step", "tokens", "val_loss", "train_loss"])
        for v, r in runs.items():
            for seed, m in r.items():
                for row in m["curve"]:
                    if math.isfinite(row.get("val_loss", float("nan"))):
                        w.writerow([f"{v}-s{seed}", v, seed, int(row["step"]), int(row["tokens"]),
                                    f"{row['val_loss']:.6f}", f"{row.get('train_loss', float('nan')):.6f}"])


def verdict_lines(summary: dict) -> list[str]:
    """One line per variant for the terminal: percent change, p (or why undefined), pairs."""
    out = []
    for v, c in summary["vs_baseline"].items():
        p = f"undefined: {c['undefined']}" if c.get("undefined") else f"p={c['p_value']:.3g}"
        out.append(f"{v:>20s}: {tables.fmt(c['pct_log_loss'], '+.2f')}% log-loss, "
                   f"{tables.fmt(c['pct_perplexity'], '+.2f')}% perplexity vs {summary['baseline']} "
                   f"({p}, n={c['n_pairs']})")
    for k, c in ((summary.get("verdict") or {}).get("comparisons") or {}).items():  # the decided verdict: one word
        claim = {True: "; the paper's -2.40% excluded", False: "; the paper's -2.40% not excluded"}.get(
            (c.get("claim") or {}).get("excluded"), "")
        out.append(f"{k:>20s}: {c['verdict']} ({tables.fmt(c['pct']['mean'], '+.2f')}% log-loss, n={c['n_pairs']}"
                   f"{claim})")
    return out
