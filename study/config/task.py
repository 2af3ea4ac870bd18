"""The task of a run, resolved in one place: where its runs, tracking and lr* live, and its own checks.

``task=lm`` (the default) changes nothing.  Any other task ``T`` keeps its runs, tuning and verdict apart
from every other task's, never pooled (:func:`apply_task`, idempotent):

=====================  =============================  ==========================================
key                    lm                             task T
=====================  =============================  ==========================================
study.runs_dir         runs                           runs/T
study.name             nonlinear-queries (MLflow)     nonlinear-queries-T (its own experiment)
study.reports_dir      reports                        reports/T (its verdict in its own words)
tune.runs_dir          runs_tune                      runs_tune/T
tune.table_dir         conf/tuning                    conf/tuning/T
tuned.lr, .recipe      tuned.lr, tuned.recipe         tuned.task.T.lr, tuned.task.T.recipe
model.position         learned (task.position)        task.position (mlm: rope), where it is None
=====================  =============================  ==========================================

``model.position`` left at None takes the task's ``task.position`` (conf/task/T.yaml); a run that names its own
(``model.position=learned``) keeps it.
"""
from __future__ import annotations

from .schema import TASKS, ConfigError, RunConfig


def _suffixed(value: str, suffix: str) -> str:
    """``value`` + ``suffix``, unless it already ends with it (so that applying twice is applying once)."""
    return value if value.endswith(suffix) else value + suffix


def apply_task(cfg: RunConfig) -> RunConfig:
    """Give a task other than ``lm`` its own runs folder, MLflow experiment, tuning folders and lr*, and every task
    its positions where ``model.position`` is None (in place).

    Raises:
        ConfigError: an unknown ``task.name`` (one line naming the choices).
    """
    t = cfg.task.name
    if t not in TASKS:
        raise ConfigError(f"task.name={t!r} is not a task: choose one of {list(TASKS)} (task=NAME)")
    if cfg.model.position is None:  # the task's positions, unless the run names its own (model.position=...)
        cfg.model.position = cfg.task.position
    if t == "lm":
        return cfg
    cfg.study.runs_dir = _suffixed(str(cfg.study.runs_dir).rstrip("/"), f"/{t}")
    cfg.study.name = _suffixed(cfg.study.name, f"-{t}")
    cfg.study.reports_dir = _suffixed(str(cfg.study.reports_dir).rstrip("/"), f"/{t}")
    cfg.tune.runs_dir = _suffixed(str(cfg.tune.runs_dir).rstrip("/"), f"/{t}")
    cfg.tune.table_dir = _suffixed(str(cfg.tune.table_dir).rstrip("/"), f"/{t}")
    own = cfg.tuned.task.get(t) or {}
    cfg.tuned.lr = dict(own.get("lr") or {})
    cfg.tuned.recipe = dict(own.get("recipe") or {})
    return cfg


def tune_command(cfg: RunConfig) -> str:
    """The command that tunes every arm of this config's task: ``make tune`` (lm), ``make tasks TASKS=T`` (T)."""
    return "`make tune`" if cfg.task.name == "lm" else f"`make tasks TASKS={cfg.task.name}`"


def tuned_where(cfg: RunConfig) -> str:
    """Where this config's task keeps its lr* in conf/tuned.yaml: ``tuned.lr`` (lm), ``tuned.task.T.lr`` (T)."""
    return "tuned.lr" if cfg.task.name == "lm" else f"tuned.task.{cfg.task.name}.lr"


def retune_hint(cfg: RunConfig, arm: str) -> str:
    """The command that tunes ``arm`` again under this config's task, for a one-line refusal (``make tune`` tunes
    lm's arms only; another task's are tuned by ``study.tune`` with ``task=T``, or all at once by ``make tasks``)."""
    t = cfg.task.name
    if t == "lm":
        return f"`make tune` with {arm} in tune.arms"
    return (f"`python -m study.tune --arm {arm} task={t}`, then `python -m study.tune --write task={t}`, with the "
            f"run's own overrides; `make tasks TASKS={t}` tunes every arm")


def validate_task(cfg: RunConfig) -> None:
    """The task's own settings: fractions in [0, 1], MQAR sizes Zoology's generator accepts.

    Raises:
        ConfigError: one line naming the key and the fix.
    """
    k = cfg.task
    if k.name not in TASKS:
        raise ConfigError(f"task.name={k.name!r} is not a task: choose one of {list(TASKS)} (task=NAME)")
    if k.position not in ("learned", "rope"):
        raise ConfigError(f"task.position={k.position!r}: choose 'learned' or 'rope' (a run may name its own with "
                          f"model.position)")
    if k.name == "mlm":
        for key in ("mask_fraction", "mask_token_fraction", "random_token_fraction"):
            if not 0.0 <= getattr(k, key) <= 1.0:
                raise ConfigError(f"task.{key}={getattr(k, key)} must lie in [0, 1]")
        if k.mask_token_fraction + k.random_token_fraction > 1.0:
            raise ConfigError(f"task.mask_token_fraction + task.random_token_fraction = "
                              f"{k.mask_token_fraction + k.random_token_fraction:g} > 1: lower one (BERT: 0.8 + 0.1)")
        if round(k.mask_fraction * cfg.model.block_size) < 1:
            raise ConfigError(f"task.mask_fraction={k.mask_fraction} chooses no token of a window of "
                              f"model.block_size={cfg.model.block_size}: raise it")
    if k.name == "mqar":
        n = mqar_seq_len(cfg)
        if n > cfg.model.block_size or n % 2 or n <= 0:
            raise ConfigError(f"task.seq_len={n} must be even, positive and at most model.block_size="
                              f"{cfg.model.block_size}")
        if k.vocab_size <= n:
            raise ConfigError(f"task.vocab_size={k.vocab_size} must exceed the sequence length {n} (Zoology's rule)")
        if k.num_kv_pairs < 1 or 4 * k.num_kv_pairs > n:
            raise ConfigError(f"task.num_kv_pairs={k.num_kv_pairs}: 4 x pairs must fit the sequence length {n} "
                              f"(pairs, then as many query slots): choose 1..{n // 4}")
        if k.num_kv_pairs >= k.vocab_size // 2 - 1:
            raise ConfigError(f"task.num_kv_pairs={k.num_kv_pairs} needs more distinct keys than [1, "
                              f"{k.vocab_size // 2}) holds: raise task.vocab_size")
        if not k.power_a > 0:
            raise ConfigError(f"task.power_a={k.power_a} must be > 0 (1.0: uniform gaps)")
        for key in ("train_examples", "test_examples"):
            if getattr(k, key) < 1:
                raise ConfigError(f"task.{key}={getattr(k, key)} must be a positive integer")


def mqar_seq_len(cfg: RunConfig) -> int:
    """Tokens per MQAR example: ``task.seq_len``, or ``model.block_size`` when it is null."""
    return int(cfg.task.seq_len) if cfg.task.seq_len is not None else int(cfg.model.block_size)


#: the MQAR generator's version: part of its data folder's name, so a changed generator never reuses a test set
MQAR_GENERATOR = "zoology-mqar-v1"


def mqar_spec(cfg: RunConfig) -> dict:
    """What fixes the MQAR test set: its sizes, generator and seed (the training set adds the data seed)."""
    k = cfg.task
    return {"generator": MQAR_GENERATOR, "vocab_size": int(k.vocab_size), "seq_len": mqar_seq_len(cfg),
            "num_kv_pairs": int(k.num_kv_pairs), "power_a": float(k.power_a),
            "random_non_queries": bool(k.random_non_queries), "test_examples": int(k.test_examples),
            "test_seed": int(k.test_seed)}


def task_data_dir(cfg: RunConfig, root):
    """The folder of the data a run of this task reads, whose meta.json is in its resume key: ``data.dir`` (lm,
    mlm: the prepared tokens), or, for mqar, ``data/mqar/V{vocab}-L{len}-P{pairs}-{sha}`` beside it, where the fixed
    test set is kept (``study.tasks.mqar.check_data`` writes it once)."""
    import hashlib
    import json
    from pathlib import Path

    base = Path(root) / cfg.data.dir
    if cfg.task.name != "mqar":
        return base
    spec = mqar_spec(cfg)
    sha = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return base.parent / "mqar" / f"V{spec['vocab_size']}-L{spec['seq_len']}-P{spec['num_kv_pairs']}-{sha}"
