"""Quiet, informative training logs: known noise filtered out, progress in optimizer steps of the total.

:func:`quiet_logs` drops what a run of this study cannot act on (Lightning's litlogger/litmodels tips,
"Checkpoint directory ... exists and is not empty" for the study's own checkpoint folder, known
deprecation warnings of the pinned libraries, MLflow's store set-up chatter).
:func:`progress_callback` shows ``step/max_steps`` (optimizer steps, whatever the gradient accumulation):
a tqdm bar on a terminal, and one plain line every tenth of the run where stderr is not a terminal
(``dvc repro``, CI logs), so every run's progress appears in those logs as it goes.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings

from lightning.pytorch.callbacks import Callback

# Messages (regular expressions, matched at the start) of warnings that are expected in this study.
KNOWN_WARNINGS = (
    r"Checkpoint directory .* exists and is not empty",  # ckpt dir holds run.json; resume is decided by its hash
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning 2.6 on torch 2.13
    r"Your `IterableDataset` has `__len__` defined",  # litdata's StreamingDataset, one loader worker per rank
    r"The '(train|val)_dataloader' does not have many workers",
    r".*LeafSpec.* is deprecated",
    # the loader's position is the optimizer step (WindowSampler, resumed from the checkpoint's global step):
    # resuming mid-epoch continues with the windows an uninterrupted run reads
    r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is\s+not resumable",
    # the validation metrics are logged with sync_dist=False on purpose: every rank evaluates all validation
    # windows (study.modeling.lit_module), so each rank's value is already the whole evaluation's
    r"It is recommended to use `self.log\('val_(loss|perplexity)(/[^']*)?', \.\.\., sync_dist=True\)`",
)
# Info lines (prefixes) of Lightning's rank-zero logger that carry nothing for this study.
DROPPED_INFO = ("💡 Tip", "GPU available", "TPU available", "HPU available", "`Trainer.fit` stopped",
                "`weights_only` was not set", "`Trainer(limit_val_batches=")


class _DropLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(DROPPED_INFO)


def quiet_logs() -> None:
    """Filter the known warnings and info lines above (idempotent; call before the Trainer exists)."""
    for pattern in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropLines) for f in log.filters):
            log.addFilter(_DropLines())
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # read when mlflow is imported
    for name in ("mlflow", "alembic"):  # "Creating initial MLflow database tables..." and the like
        logging.getLogger(name).setLevel(logging.WARNING)


def _fmt_eta(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


def progress_callback(label: str, max_steps: int, tokens_per_step: int, enabled: bool = True, stream=None):
    """The progress callback of one run, or None when ``enabled`` is false (``trainer.progress_bar``).

    On a terminal: a tqdm bar ``LABEL  step/max_steps`` with train_loss and val_loss; elsewhere a
    :class:`ProgressLines` callback.  Give the Trainer ``enable_progress_bar=isinstance(cb, ProgressBar)``.
    """
    if not enabled:
        return None
    stream = sys.stderr if stream is None else stream
    if getattr(stream, "isatty", lambda: False)():
        return step_progress_bar(label, max_steps)
    return ProgressLines(label, max_steps, tokens_per_step, stream=stream)


def step_progress_bar(label: str, max_steps: int):
    """Lightning's TQDMProgressBar counting optimizer steps of ``max_steps`` (not micro-batches of an
    endless epoch: no ``Epoch 0/-2``), described by the run's label, without Lightning's ``v_num``."""
    from lightning.pytorch.callbacks import TQDMProgressBar

    class StepProgressBar(TQDMProgressBar):
        def on_train_epoch_start(self, trainer, *_):
            bar = self.train_progress_bar
            bar.reset(total=max_steps)
            bar.n = bar.last_print_n = trainer.global_step
            bar.set_description(label)
            bar.refresh()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            n = trainer.global_step
            bar = self.train_progress_bar
            if n != bar.n and (n % self.refresh_rate == 0 or n == max_steps):
                bar.n = n
                bar.set_postfix(self.get_metrics(trainer, pl_module))
                bar.refresh()

        def get_metrics(self, trainer, pl_module):
            metrics = super().get_metrics(trainer, pl_module)
            metrics.pop("v_num", None)
            curve = getattr(pl_module, "curve", None)
            if curve:
                metrics["val_loss"] = f"{curve[-1]['val_loss']:.3f}"  # the latest evaluation (nats)
            return metrics

    return StepProgressBar()


class ProgressLines(Callback):
    """One line per tenth of the run (and at the end) for logs that are not a terminal::

        baseline-s1: step 64/256 (25%), 262,144 tokens, train_loss 5.123, val_loss 5.301, 14,210 tokens/s, eta 41 s

    ``every`` optimizer steps (default max_steps // 10, at least 1).  train_loss is curve.csv's quantity:
    the mean of the optimizer steps' losses since the previous evaluation, up to and including this step
    (nats; at a step that ends an evaluation, exactly that curve.csv row's train_loss); val_loss is the
    latest evaluation (nats), that of this very step when it ends one; tokens/s since the previous line.
    A line is printed once the step is complete: after the module has recorded the step's loss and after
    the evaluation that step triggers (in fit, or, for the last step, in the ``trainer.validate`` that
    follows), so the last line shows the run's final val_loss.
    """

    def __init__(self, label: str, max_steps: int, tokens_per_step: int, every: int | None = None, stream=None):
        super().__init__()
        self.label, self.max_steps, self.tokens_per_step = label, max_steps, tokens_per_step
        self.every = every or max(1, max_steps // 10)
        self.stream = stream
        self._last: tuple[float, int] | None = None
        self._pending: tuple[int, list[str], list[str]] | None = None  # (step, parts, after), not yet printed

    def on_train_start(self, trainer, pl_module) -> None:
        self._last = (time.perf_counter(), trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # runs before the module's own on_train_batch_end (the step's loss) and the step's evaluation:
        # the line is composed here (rate, eta) and printed by _flush once both have run
        step = trainer.global_step
        if trainer.global_rank != 0 or self._last is None or step == self._last[1]:
            return
        if step % self.every and step != self.max_steps:
            return
        now = time.perf_counter()
        t0, s0 = self._last
        rate = (step - s0) / (now - t0) if now > t0 else 0.0
        parts = [f"{self.label}: step {step}/{self.max_steps} ({100 * step / self.max_steps:.0f}%)",
                 f"{step * self.tokens_per_step:,} tokens"]
        after = []
        if rate > 0:
            after.append(f"{rate * self.tokens_per_step:,.0f} tokens/s")
            if step < self.max_steps:
                after.append(f"eta {_fmt_eta((self.max_steps - step) / rate)}")
        self._last = (now, step)
        self._flush(pl_module)  # an earlier line still waiting (none in a normal run)
        self._pending = (step, parts, after)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # the previous step is complete and was not evaluated (on_validation_end would have printed it)
        if self._pending is not None and self._pending[0] != self.max_steps:
            self._flush(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        curve = getattr(pl_module, "curve", None)
        if self._pending is not None and curve and curve[-1]["step"] == self._pending[0]:
            self._flush(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._pending is not None and self._pending[0] != self.max_steps:  # stopped early
            self._flush(pl_module)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._pending is not None and (getattr(pl_module, "diverged", None) or stage != "fit"):
            self._flush(pl_module)  # no final evaluation follows

    def _flush(self, pl_module) -> None:
        if self._pending is None:
            return
        (step, parts, after), self._pending = self._pending, None
        curve = getattr(pl_module, "curve", None) or []
        losses = getattr(pl_module, "_train_losses", None)
        if curve and curve[-1]["step"] == step:  # this step ended an evaluation: its curve.csv row
            train = curve[-1].get("train_loss")
        else:  # the mean since the previous evaluation, as curve.csv's next row will hold it
            train = sum(losses) / len(losses) if losses else None
        loss = [f"train_loss {train:.3f}"] if train is not None and math.isfinite(train) else []
        val = [f"val_loss {curve[-1]['val_loss']:.3f}"] if curve else []
        print(", ".join(parts + loss + val + after), file=self.stream or sys.stderr, flush=True)
