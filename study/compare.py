"""Stage 3, ``python -m study.compare [overrides]``: statistics and report over the test runs of study.arms.

Reads ``runs/test/ARM/VARIANT-sSEED/{metrics.json,record.json,curve.csv,config.json}`` for the seeds the test stage
planned (``runs/test/plan.json``; the ``test_runs`` stage), checks that they pair (the same recorded settings but the
arm's variant, lr and overrides), and writes to ``study.reports_dir`` (default reports/):
  summary.json    the decided verdict (docs/verdict.md): per arm n_seeds, val_loss mean/sd/95% t interval (nats),
                  lr and its source; per comparison the paired differences, 95% t interval, Stein's N, TOST, the
                  one word; attention's share; the decomposition and frontier when asked; the yardsticks,
                  per-corpus losses and attention logits; the scale ladder (its profile); for a task other than lm
                  (task=mlm|mqar, written to reports/TASK/) each arm's val_accuracy and the task's own yardstick
  comparison.md   the same as tables, headed by the settings the runs recorded
  metrics/        the DVC metric, numbers only: ARM.json per arm, {val_loss (mean, nats), n, val_accuracy (mlm,
                  mqar); vs_REF per comparison: pct_log_loss, ci_low, ci_high (95% t interval, %), p (BH), n}
  curves.csv      the DVC plot: run, arm, seed, step, tokens, val_loss, train_loss (every run's evaluations;
                  `dvc plots show` draws one line per run)
  figures/        val and train loss curves, the verdict, loss by position and (when they apply) per corpus and
                  the scale ladder
A shared-lr comparison is arms at one fixed lr (``arms.NAME.lr``: `make study-nano` is one).  The verdict is also
logged to the MLflow run "compare".  Diverged runs are reported as such and left out of the statistics.  The work is
:func:`study.analysis.report.write_report`.
"""
from __future__ import annotations

import sys
from pathlib import Path

from study.analysis.report import verdict_lines, write_report
from study.config import ConfigError, run_stage
from study.runfolder.store import tracking_uri
from study.runner.tracking import log_verdict


def _report(cfg, root: Path) -> int:
    if cfg.study.group:
        raise ConfigError(f"study.group={cfg.study.group} names the folder of one training run (study.train); compare "
                          f"reports the test runs of study.arms (runs/test/ARM/): drop study.group")
    if not cfg.study.arms and not cfg.scale_ladder.models:
        raise ConfigError("study.arms is empty and the scale ladder is off: nothing to compare; list the arms, e.g. "
                          "'study.arms=[baseline,nonlinear_q]' (a shared-lr comparison: arms at one fixed "
                          "arms.NAME.lr)")
    tracking_uri(root, cfg.study)  # an unusable store is refused before the reports are written
    summary = write_report(cfg, root)
    for line in verdict_lines(summary):
        print(line)
    out = root / cfg.study.reports_dir
    print(f"wrote {out / 'comparison.md'}")
    log_verdict(root, cfg, out)  # the verdict in MLflow: run "compare" (tag kind=verdict)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_stage(_report, argv)


if __name__ == "__main__":
    sys.exit(main())
