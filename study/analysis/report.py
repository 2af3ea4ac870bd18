"""The report in one call: load the test runs of the study's arms, check that they pair, summarise, write
comparison.md, summary.json, the DVC metrics (metrics/ARM.json), the DVC plot data (curves.csv)
and the figures (``study.compare`` is its command line)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from study.analysis import figures, tables
from study.analysis.summary import finite_or_null, summarize
from study.analysis.verdict import tested_runs

#: where the figures go, under study.reports_dir (one DVC plots folder: only existing figures are plots)
FIGURES = "figures"
#: the DVC metric of compare, under study.reports_dir: one numbers-only file per arm
METRICS = "metrics"
#: the DVC plot of compare, under study.reports_dir: every run's validation curve, one row per evaluation
CURVES = "curves.csv"


def write_report(cfg, root: Path) -> dict:
    """Write study.reports_dir/{comparison.md, summary.json, metrics/ARM.json, curves.csv, figures/*.png} over the
    test runs of study.arms (:func:`study.analysis.verdict.tested_runs`; none while it is empty); return the summary.

    Raises:
        RunsError: the test stage's plan, or a run it names, is missing or unreadable.
        PairingError: test runs differ in a setting other than the variant, its lr and the arms' own overrides.
    """
    runs = tested_runs(cfg, root) if cfg.study.arms else {}
    out = root / cfg.study.reports_dir
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(cfg, root, runs)
    summary["figures"] = figures.write_all(summary, runs, out / FIGURES)
    (out / "comparison.md").write_text(tables.markdown(summary, summary["figures"]))
    (out / "summary.json").write_text(json.dumps(finite_or_null(summary), indent=1, allow_nan=False))
    write_metrics(summary, out / METRICS)
    write_curves(runs, out / CURVES)
    return summary


def arm_metrics(summary: dict) -> dict[str, dict]:
    """{arm: the numbers of metrics/ARM.json}: ``val_loss`` (mean final val loss over its finished seeds, nats),
    ``n`` (seeds) and, for the mlm and mqar tasks, ``val_accuracy`` (its mean, in [0, 1]); for every comparison of
    the arm with a reference, ``vs_REF``: {``pct_log_loss`` (mean paired difference, % log-loss of the reference),
    ``ci_low``/``ci_high`` (its 95% t interval, %), ``p`` (paired t-test, Benjamini-Hochberg adjusted), ``n``
    (pairs)}.  Undefined values (one pair, no finished seed) are left out, so every value is a finite number
    (``dvc metrics show`` shows a missing one as '-')."""
    v = summary.get("verdict") or {}
    out = {}
    for a, r in (v.get("arms") or {}).items():
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
    """metrics/ARM.json for every arm of the study (:func:`arm_metrics`); files of arms no longer in the study
    are removed.  ``dvc metrics show`` lists them one row each beside the runs'."""
    folder.mkdir(parents=True, exist_ok=True)
    numbers = arm_metrics(summary)
    for old in folder.glob("*.json"):
        if old.stem not in numbers:
            old.unlink()
    for v, m in numbers.items():
        (folder / f"{v}.json").write_text(json.dumps(m, indent=1, allow_nan=False) + "\n")


def write_curves(runs: dict[str, dict[int, dict]], path: Path) -> None:
    """curves.csv: ``run,arm,seed,step,tokens,val_loss,train_loss``, one row per evaluation of every run
    (nats; non-finite rows of a diverged run left out): the data of the DVC plot ``val_loss`` (dvc.yaml,
    template .dvc/plots/runs.json: one line per run, validation loss against tokens)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["run", "arm", "seed", "step", "tokens", "val_loss", "train_loss"])
        for v, r in runs.items():
            for seed, m in r.items():
                for row in m["curve"]:
                    if math.isfinite(row.get("val_loss", float("nan"))):
                        w.writerow([f"{v}-s{seed}", v, seed, int(row["step"]), int(row["tokens"]),
                                    f"{row['val_loss']:.6f}", f"{row.get('train_loss', float('nan')):.6f}"])


def verdict_lines(summary: dict) -> list[str]:
    """One line per comparison of the decided verdict for the terminal: its word, percent change and pairs."""
    out = []
    for k, c in ((summary.get("verdict") or {}).get("comparisons") or {}).items():
        claim = {True: "; the paper's -2.40% excluded", False: "; the paper's -2.40% not excluded"}.get(
            (c.get("claim") or {}).get("excluded"), "")
        out.append(f"{k:>20s}: {c['verdict']} ({tables.fmt(c['pct']['mean'], '+.2f')}% log-loss, n={c['n_pairs']}"
                   f"{claim})")
    return out
