"""Stage 3, ``python -m study.compare [overrides]``: statistics and report over every run.

Reads ``runs/VARIANT-sSEED/{metrics.json,record.json,curve.csv,config.json}`` for the variants x seeds of
conf/study.yaml (and the profiles' runs), checks that they pair (the same recorded settings but the
variant), and writes to ``study.reports_dir`` (default reports/); with ``study.group=GROUP`` it compares
the runs of runs/GROUP/ (trained with the same ``study.group``) and writes to reports/GROUP/ instead:
  summary.json    per variant: n_seeds, val_loss_mean/sd (nats), parameters, lr; vs the baseline,
                  paired by seed: per-seed differences, mean difference, 95% t interval, paired
                  t-test p (and Benjamini-Hochberg adjusted) or why it is undefined, percent
                  log-loss and perplexity change (arXiv 2603.13381), power; the frontier;
                  yardsticks and per-corpus losses; the profiles; for a task other than lm (task=mlm|mqar,
                  written to reports/TASK/) each arm's val_accuracy (mean, 95% t interval) and the task's own
                  yardstick as its runs recorded it
  comparison.md   the same as tables, headed by the settings the runs recorded
  metrics/        the DVC metric, numbers only: VARIANT.json per variant, {val_loss (mean, nats),
                  n, val_accuracy (mlm, mqar); against the baseline: pct_log_loss, ci_low, ci_high (95% t
                  interval, %), p}
  curves.csv      the DVC plot: run, variant, seed, step, tokens, val_loss, train_loss (every run's
                  evaluations; `dvc plots show` draws one line per run)
  figures/        val and train loss curves, final losses per seed, paired differences, and (when
                  they apply) per corpus, frontier, lr sweep, scale ladder
With ``study.arms`` set, the decided verdict of the test runs (runs/test/, the ``test_runs`` stage) is added to
summary.json ("verdict"), comparison.md and the MLflow run "compare": every comparison in one word, with its
numbers (docs/verdict.md).
Diverged runs are reported as such and left out of the statistics.  The work is
:func:`study.analysis.report.write_report`.
"""
from __future__ import annotations

import sys
from pathlib import Path

from study.analysis.report import report_dir, verdict_lines, write_report
from study.config import run_stage
from study.config.store import tracking_uri
from study.runner.tracking import log_verdict


def _report(cfg, root: Path) -> int:
    tracking_uri(root, cfg.study)  # an unusable store is refused before the reports are written
    summary = write_report(cfg, root)
    for line in verdict_lines(summary):
        print(line)
    out = report_dir(cfg, root)
    print(f"wrote {out / 'comparison.md'}")
    log_verdict(root, cfg, out)  # the verdict in MLflow: run "compare" (tag kind=verdict)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_stage(_report, argv)


if __name__ == "__main__":
    sys.exit(main())
