"""The learning-rate schedule of a run, per optimizer step: linear warmup, then ``train.schedule`` (cosine decay to
min_lr, linear decay to zero, or warmup-stable-decay).  Training code: part of a run's resume key
(study.runfolder.digests.code_files), so a change here retrains every finished run."""
from __future__ import annotations

import math
from typing import Callable

from study.config import ConfigError, RunConfig, peak_lr
from study.config.schedule import wsd_decay_steps


def cosine_lr(step: int, warmup: int, total: int, lr: float, min_lr: float, decay_fraction: float = 0.0) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr`` at ``total``
    (``decay_fraction`` unused: the signature of :data:`SCHEDULE_FUNCTIONS`)."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def d2z_lr(step: int, warmup: int, total: int, lr: float, min_lr: float = 0.0, decay_fraction: float = 0.0) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps (as :func:`cosine_lr`), then linear decay to zero:
    lr (total - step) / (total - warmup), exactly 0 at step ``total`` (the end of the budget, the
    step curve.csv's last row records; the last update, step total - 1, uses lr / (total - warmup)).
    Linear decay to zero, "D2Z" (arXiv 2502.15938).  ``min_lr`` and ``decay_fraction`` are unused."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= total:
        return 0.0
    return lr * (total - step) / max(1, total - warmup)


def wsd_lr(step: int, warmup: int, total: int, lr: float, min_lr: float = 0.0, decay_fraction: float = 0.2) -> float:
    """Warmup-stable-decay: linear warmup to ``lr`` over ``warmup`` steps (as :func:`cosine_lr`), ``lr``
    held, then linear decay to exactly 0 at step ``total`` over its last D = max(1, round(decay_fraction
    x total)) steps: lr (total - step) / D from step total - D on (WSD: arXiv 2404.06395; a linear
    cool-down to zero: arXiv 2405.18392, 2502.15938).  ``min_lr`` is unused."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= total:
        return 0.0
    decay = wsd_decay_steps(total, decay_fraction)
    return lr if step < total - decay else lr * (total - step) / decay


#: ``train.schedule`` -> the schedule, each f(step, warmup, total, lr, min_lr, decay_fraction) -> lr
SCHEDULE_FUNCTIONS = {"cosine": cosine_lr, "d2z": d2z_lr, "wsd": wsd_lr}


def schedule_of(cfg: RunConfig, lr: float | None = None, min_lr: float | None = None) -> Callable[[int], float]:
    """The learning rate per optimizer step under ``train.schedule`` (the one place a schedule's name is resolved),
    as a function of the step with the run's numbers read once: warmup ``train.warmup_tokens // batch_tokens``
    steps, total ``train.tokens // batch_tokens`` steps; ``lr``/``min_lr`` default to :func:`peak_lr`.  (The
    LightningModule's scheduler calls it every step: reading the config there cost ~0.8 ms a step on a CPU.)

    Raises:
        ConfigError: unknown schedule.
    """
    t = cfg.train
    if t.schedule not in SCHEDULE_FUNCTIONS:
        raise ConfigError(f"train.schedule={t.schedule!r}: choose one of {list(SCHEDULE_FUNCTIONS)}")
    if lr is None or min_lr is None:
        lr, min_lr = peak_lr(cfg)
    fn, decay_fraction = SCHEDULE_FUNCTIONS[t.schedule], t.decay_fraction
    warmup, total = t.warmup_tokens // t.batch_tokens, t.tokens // t.batch_tokens

    def lr_of(step: int) -> float:
        return fn(step, warmup, total, lr, min_lr, decay_fraction)
    return lr_of
