"""Stage 2, ``python -m study.train variant=NAME seed=N [model=NAME] [key=value ...]``.

Trains one (variant, seed) run on the prepared token data and writes
``runs/VARIANT-sSEED/``:
  metrics.json     the DVC metric, numbers only (:data:`study.runfolder.METRICS`): final val_loss (nats),
                   val_perplexity, tokens seen, throughput (tokens/s); a key without a value
                   (a diverged run's loss: a lost point has none) is left out
  record.json      the rest of the run's result: variant, seed, status ("ok"/"diverged"), reason and
                   diverged_step (the optimizer step the divergence was found at, null when ok; the rule:
                   :class:`study.modeling.lit_module.GPTModule`), per-corpus val_loss, steps, lr, parameter and FLOP counts, wall time
                   (s, every segment of a resumed run), tokenizer, model, group, config_hash, mlflow_run_id,
                   attn_logit_max (per layer, at the last evaluation; null for a non-finite value)
  curve.csv        step, tokens, train_loss, val_loss, lr, in_context_gain, val_loss/CORPUS, attn_logit_max/L{i}
                   (one row per evaluation)
  positions.csv    position, val_loss: the per-position validation loss of the final evaluation (nats, the
                   mean over the fixed windows at positions 1..block_size; its mean is val_loss)
  config.json      the resolved config it trained with and the prepared data's digest (compare
                   pairs only runs that agree on everything but the variant)
  checkpoints/     last.ckpt (resumable) and run.json (resume key and the settings it covers,
                   MLflow run id)
  .lock            held by the one process that writes this folder (filelock)
  .replaced/       only while a start builds its Trainer: the last run's files it replaces, put back
                   if Lightning refuses the trainer settings (study.runner.run_state.Replaced)
(``runs/GROUP/VARIANT-sSEED/`` with ``study.group=GROUP``, as the test stage and
the scale ladder do, see study/runner/arms.py and study/runner/spec.py)
and one MLflow run (experiment = study.name, run name = [GROUP/]VARIANT-sSEED) in the
project's SQLite store.

Running the same command again after a kill resumes from checkpoints/last.ckpt
(same resume key: the settings that change the numbers, the training code and the
data, on any world size) and continues the same MLflow run; otherwise it starts
afresh and prints the keys that differ.  metrics.json, record.json and curve.csv appear
only when the run has ended (finished or diverged; metrics.json last).  A run that dies ends FAILED
(exception) or KILLED (SIGTERM, Ctrl-C; a SIGKILLed run is marked KILLED by the next
start in its folder) in MLflow, with an end time.  A second process on the same run
folder, or a hand-started run whose settings differ from the finished run in its
folder, is refused in one line (``train.overwrite=true`` replaces it).

The run itself, in steps (plan, open the run, build, fit, record), is study.runner.run.train; the run folder's files,
their names and their writers and readers are study.runfolder; the folder's lock, resume key and MLflow ending are
study.runner.run_state.  This module is the command line: it composes the config and reports the run in one line.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from study.config import run_label, run_stage
from study.runner.world import die_with_parent, launch_rank
from study.runner.run import train


def _report(cfg, root: Path) -> int:
    metrics = train(cfg, root)
    if launch_rank(cfg.trainer) != 0:
        return 0  # one report, from global rank 0
    name = run_label(cfg)
    if metrics["status"] != "ok":
        print(f"{name}: DIVERGED at step {metrics['diverged_step']}: {metrics['reason']}", file=sys.stderr)
        return 0  # a diverged run is a result, reported by compare
    acc = f", val_accuracy {metrics['val_accuracy']:.4f}" if metrics.get("val_accuracy") is not None else ""
    print(f"{name}: val_loss {metrics['val_loss']:.4f} nats{acc} after {metrics['tokens']:,} tokens "
          f"in {metrics['wall_time_s']:.0f} s ({metrics['tokens_per_s']:,.0f} tokens/s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # started by a stage's local launcher: end with it
    return run_stage(_report, argv, interruptible="study.train")  # Ctrl-C: the run was marked KILLED, its lock released


if __name__ == "__main__":
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    sys.exit(main())
