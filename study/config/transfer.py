"""The peak lr a plain variant takes outside the test stage (train.lr_from_tuned, the scale ladder): the lr* tuned
at its size (tuned.size) or the default size's, and the checks that it exists and applies."""
from __future__ import annotations

from .naming import RECORDED_DEFAULTS
from .schema import ConfigError, RunConfig
from .task import retune_hint


def transferred_lr(cfg: RunConfig, v: str, model: str | None = None) -> float | None:
    """The peak lr a run of plain variant ``v`` takes outside the test stage (train.lr_from_tuned, the scale
    ladder): at size ``model`` (default: cfg.model.name when train.lr_per_size), ``tuned.size[model][v]``, the lr*
    tuned at that size (`make ladder-tune`); else the arm of its name's fixed lr, else tuned.lr[v] (tuned at the
    default size, transferred unchanged).  None without one."""
    if model is None and cfg.train.lr_per_size:
        model = cfg.model.name
    if model is not None:
        lr = (cfg.tuned.size.get(model) or {}).get(v)
        return None if lr is None else float(lr)
    arm = cfg.arms.get(v)
    if arm is None:
        return None
    lr = arm.lr if arm.lr is not None else cfg.tuned.lr.get(v)
    return None if lr is None else float(lr)


def check_transferable(cfg: RunConfig, v: str, what: str, off: str, model: str | None = None) -> None:
    """Variant ``v`` may train at its arm's lr outside the test stage: the arm of its name is the plain variant (no
    recipe overrides, which a run of the variant would not apply) and has an lr* in conf/tuned.yaml (or a fixed lr);
    at size ``model`` (or with train.lr_per_size), the lr* tuned at that size (tuned.size)."""
    arm = cfg.arms.get(v)
    if arm is None:
        raise ConfigError(f"{what} {v!r} has no arm of its name to take an lr* from: define arms.{v} ({{variant: {v}}}) "
                          f"in conf/study.yaml, add it to tune.arms and run `make tune`, or {off}")
    if arm.variant != v or list(arm.overrides):
        raise ConfigError(f"{what} {v!r}: its lr* was tuned as arms.{v} = variant {arm.variant!r} with overrides "
                          f"{[str(o) for o in arm.overrides]}, which a run of the plain variant does not apply: choose "
                          f"variants whose arm is the plain variant, or {off}")
    size = model if model is not None else (cfg.model.name if cfg.train.lr_per_size else None)
    if size is not None and cfg.task.name != "lm":
        raise ConfigError(f"{what} {v!r} at size {size}: the lr* of tuned.size were tuned on the lm task, not on "
                          f"task={cfg.task.name}: run the scale ladder with task=lm, or {off}")
    if size is not None and transferred_lr(cfg, v, size) is None:
        raise ConfigError(f"{what} {v!r} has no lr* tuned at size {size} (tuned.size.{size} in conf/tuned.yaml has "
                          f"{sorted(cfg.tuned.size.get(size) or {})}): tune that size (`make ladder-tune`, or "
                          f"`python -m study.tune --ladder {size}`), or {off}")
    if size is not None:
        return
    if arm.lr is None and v not in cfg.tuned.lr:
        raise ConfigError(f"{what} {v!r} has no lr* in conf/tuned.yaml (tuned.lr has {sorted(cfg.tuned.lr)}): add "
                          f"arms.{v} to tune.arms and run `make tune`, or {off}")
    tuned_at = (cfg.tuned.recipe or {}).get(v)
    if arm.lr is None and tuned_at is not None:  # the positions an lr* was tuned at (a record without: learned)
        was = (tuned_at.get("model") or {}).get("position", RECORDED_DEFAULTS["model.position"])
        if was != cfg.model.position:
            raise ConfigError(f"{what} {v!r}: its lr* was tuned at model.position={was}, but this run trains at "
                              f"model.position={cfg.model.position}: re-tune it ({retune_hint(cfg, v)}) or "
                              f"set model.position={was}, or {off}")
