"""Quantities derived from a run's configuration: seeds, the micro-batch split, the step budget and the peak lr
(the schedule itself, per step, is training code: study.modeling.lr_schedule)."""
from __future__ import annotations

from .schema import ConfigError, RunConfig


def run_seeds(cfg: RunConfig) -> tuple[int, int]:
    """(data_seed, init_seed) of a run: ``train.data_seed`` / ``train.init_seed``, each defaulting to
    ``seed``.  The data seed alone fixes the order of the training windows, the init seed alone the
    initial weights (keyed by parameter name, study.modeling.model.GPT.init_parameters): runs of two variants
    with one seed see the same windows and share the initial values of every module they have in common."""
    t = cfg.train
    return (cfg.seed if t.data_seed is None else t.data_seed,
            cfg.seed if t.init_seed is None else t.init_seed)


def batch_tokens_message(batch_tokens: int, unit: int, what: str) -> str:
    """Why ``train.batch_tokens`` is not a whole number of windows (``unit`` tokens each, ``what`` names
    it), and the nearest values that are."""
    if batch_tokens < unit:
        return (f"train.batch_tokens={batch_tokens} is less than one window of {what} tokens: raise it to a "
                f"multiple of {unit}, e.g. train.batch_tokens={unit} (or lower model.block_size)")
    low = batch_tokens // unit * unit
    return (f"train.batch_tokens={batch_tokens} is not a multiple of {what}: use a multiple of {unit} "
            f"such as {low} or {low + unit} (whole windows per step)")


def micro_batches(cfg: RunConfig, world_size: int = 1) -> tuple[int, int]:
    """Derive (micro_batch_size, gradient accumulation) from the global batch in tokens.

    The optimisation is the same on 1 or N devices: tokens per optimizer step =
    micro_batch_size * block_size * world_size * accumulation = train.batch_tokens.

    Raises:
        ConfigError: batch_tokens is not a multiple of block_size * world_size.
    """
    unit = cfg.model.block_size * world_size
    seq_per_step, rem = divmod(cfg.train.batch_tokens, unit)
    if rem or seq_per_step == 0:
        what = f"model.block_size*world_size={cfg.model.block_size}*{world_size}" if world_size > 1 \
            else f"model.block_size={cfg.model.block_size}"
        raise ConfigError(batch_tokens_message(cfg.train.batch_tokens, unit, what))
    micro = min(cfg.train.micro_batch_size, seq_per_step)
    while seq_per_step % micro:
        micro -= 1
    return micro, seq_per_step // micro


def max_steps(cfg: RunConfig) -> int:
    """Optimizer steps that spend the token budget ``train.tokens`` (rounded down)."""
    return cfg.train.tokens // cfg.train.batch_tokens


def peak_lr(cfg: RunConfig) -> tuple[float, float]:
    """(lr, min_lr) for this run: its arm's values (``arm.lr``, ``arm.min_lr``) where given, else train's.

    An arm lr without its own min_lr keeps the schedule's ratio train.min_lr / train.lr,
    so a swept or tuned lr scales the whole cosine schedule.  The schedules that decay to zero
    (``train.schedule`` d2z, wsd) end at min_lr = 0."""
    lr = cfg.arm.lr if cfg.arm.lr is not None else cfg.train.lr
    if cfg.train.schedule in ("d2z", "wsd"):
        min_lr = 0.0
    elif cfg.arm.min_lr is not None:
        min_lr = cfg.arm.min_lr
    else:
        min_lr = cfg.train.min_lr * (lr / cfg.train.lr)
    return lr, min_lr


def wsd_decay_steps(total: int, decay_fraction: float) -> int:
    """The decay steps of :func:`wsd_lr`: max(1, round(decay_fraction x total))."""
    return max(1, round(decay_fraction * total))
