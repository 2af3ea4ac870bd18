"""The report in one call: load the study's runs, check that they pair, summarise, write
comparison.md, summary.json and the figures (``study.compare`` is its command line)."""
from __future__ import annotations

import json
from pathlib import Path

from study.analysis import figures, tables
from study.analysis.runs import load_runs
from study.analysis.summary import finite_or_null, summarize

#: where the figures go, under study.reports_dir (one DVC plots folder: only existing figures are plots)
FIGURES = "figures"


def write_report(cfg, root: Path) -> dict:
    """Write ``study.reports_dir``/{comparison.md, summary.json, figures/*.png}; return the summary.

    Raises:
        RunsError: a run is missing or unreadable.
        PairingError: runs that would be compared differ in a setting other than the variant.
    """
    runs = load_runs(cfg, root)
    out = root / cfg.study.reports_dir
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(cfg, runs, root)
    summary["figures"] = figures.write_all(summary, runs, out / FIGURES)
    (out / "comparison.md").write_text(tables.markdown(summary, summary["figures"]))
    (out / "summary.json").write_text(json.dumps(finite_or_null(summary), indent=1))
    return summary


def verdict_lines(summary: dict) -> list[str]:
    """One line per variant for the terminal: percent change, p (or why undefined), pairs."""
    out = []
    for v, c in summary["vs_baseline"].items():
        p = f"undefined: {c['undefined']}" if c.get("undefined") else f"p={c['p_value']:.3g}"
        out.append(f"{v:>20s}: {tables.fmt(c['pct_log_loss'], '+.2f')}% log-loss, "
                   f"{tables.fmt(c['pct_perplexity'], '+.2f')}% perplexity vs {summary['baseline']} "
                   f"({p}, n={c['n_pairs']})")
    return out
