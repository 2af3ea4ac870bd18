"""The peak lr a plain variant takes outside the test stage (train.lr_from_tuned, the scale ladder): the lr* tuned
at its size (tuned.size, with the recipe it was tuned at in tuned.size_recipe) or the default size's, and the
checks that it exists, is a number and applies."""
from __future__ import annotations

import math
from collections.abc import Mapping

from .naming import RECIPE
from .schema import ConfigError, RunConfig
from .task import retune_hint

#: how a ladder (or a ladder size's run) trains at the positions an lr* was tuned at: choose the model files of those
POSITION_FIX = ("train sizes whose model files name model.position={was} (rope-N: rope, bytes-N: learned; a size "
                "without one takes task.position), without a model.position override")
#: the ladder's keys whose value a ladder run takes from the scale_ladder section (its budget rule and warmup)
LADDER_KEYS = {"train.tokens_per_param": "scale_ladder.tokens_per_param",
               "train.warmup_tokens": "scale_ladder.warmup_tokens"}


def recipe_value(r: dict, key: str):
    """The value of flat ``key`` ("model.position") in a recipe record (None where it has none)."""
    sec, k = key.split(".", 1)
    return (r.get(sec) or {}).get(k)


def recipe_difference(tuned_at: dict, now: dict) -> list[str]:
    """``SECTION.KEY`` of every setting in which two recipe records differ (sorted)."""
    keys = {f"{sec}.{k}" for r in (tuned_at, now) for sec in r for k in r[sec]}
    return sorted(k for k in keys if recipe_value(tuned_at, k) != recipe_value(now, k))


def size_lr(cfg: RunConfig, size: str, v: str) -> float | None:
    """``tuned.size[size][v]`` as a float, None where the size or the variant has none.

    Raises:
        ConfigError: the entry is not a mapping, or the variant's value is not an lr* (null, not a number, not > 0);
            one line naming the entry and the fix.
    """
    fix = (f"re-tune that size (`python -m study.tune --ladder {size}`, or `make ladder-tune`) or restore "
           f"conf/tuned.yaml (`git checkout conf/tuned.yaml`)")
    entry = cfg.tuned.size.get(size)
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise ConfigError(f"tuned.size.{size}={entry!r} in conf/tuned.yaml is not a mapping of variant to lr*: {fix}")
    if v not in entry:
        return None
    lr = entry[v]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or not lr > 0:
        raise ConfigError(f"tuned.size.{size}.{v}={'null' if lr is None else repr(lr)} in conf/tuned.yaml is not an "
                          f"lr* (a number > 0): {fix}")
    return float(lr)


def transferred_lr(cfg: RunConfig, v: str, model: str | None = None) -> float | None:
    """The peak lr a run of plain variant ``v`` takes outside the test stage (train.lr_from_tuned, the scale
    ladder): at size ``model`` (default: cfg.model.name when train.lr_per_size), ``tuned.size[model][v]``, the lr*
    tuned at that size (`make ladder-tune`); else the arm of its name's fixed lr, else tuned.lr[v] (tuned at the
    default size, transferred unchanged).  None without one.

    Raises:
        ConfigError: a tuned.size entry that is not an lr* (:func:`size_lr`).
    """
    if model is None and cfg.train.lr_per_size:
        model = cfg.model.name
    if model is not None:
        return size_lr(cfg, model, v)
    arm = cfg.arms.get(v)
    if arm is None:
        return None
    lr = arm.lr if arm.lr is not None else cfg.tuned.lr.get(v)
    return None if lr is None else float(lr)


def size_recipe_now(cfg: RunConfig, size: str, ladder: bool, tokens: int | None = None,
                    position: str | None = None) -> dict:
    """The settings a run of size ``size`` trains at, as a recipe record plus ``train.tokens_per_param`` (what
    tuned.size_recipe records): a scale ladder run of this config (``ladder``: its model file's shape and its
    tokens are not known here, only its name, its positions (``position``, the model file's own, else the task's),
    budget rule and warmup), or this run itself (its model section, and ``tokens`` once resolved, or train.tokens
    without a budget rule)."""
    out = {sec: {k: cfg[sec][k] for k in keys} for sec, keys in RECIPE.items()}
    out["train"]["tokens_per_param"] = cfg.train.tokens_per_param
    if ladder:
        out["model"] = {"name": size, "position": position or cfg.task.position}
        out["train"].update(tokens_per_param=cfg.scale_ladder.tokens_per_param,
                            warmup_tokens=cfg.scale_ladder.warmup_tokens)
    if tokens is None and (ladder or cfg.train.tokens_per_param is not None):
        del out["train"]["tokens"]  # resolved from the budget rule when the run starts (check_size_recipe again)
    elif tokens is not None:
        out["train"]["tokens"] = int(tokens)
    return out


def check_size_recipe(cfg: RunConfig, v: str, size: str, now: dict, what: str, off: str) -> None:
    """Variant ``v``'s lr* at ``size`` was tuned at the settings ``now`` (:func:`size_recipe_now`) holds, where
    tuned.size_recipe records them (an lr* without a record is taken as it is).

    Raises:
        ConfigError: one line naming the settings that differ and the tuning command that fixes it.
    """
    at = (cfg.tuned.size_recipe.get(size) or {}).get(v)
    if at is None:
        return
    at = {sec: dict(at[sec]) for sec in at}
    diff = [k for k in recipe_difference(at, now) if k.split(".", 1)[1] in (now.get(k.split(".", 1)[0]) or {})]
    if not diff:
        return
    show = (lambda r: ", ".join(f"{k}={recipe_value(r, k)}" for k in diff))  # noqa: E731
    if "model.position" in diff:  # a size's positions are its model file's: re-tuning it there would not move them
        raise ConfigError(f"{what} {v!r} at size {size}: its lr* (conf/tuned.yaml tuned.size.{size}) was tuned at "
                          f"{show(at)}, but this run trains at {show(now)}: "
                          f"{POSITION_FIX.format(was=recipe_value(at, 'model.position'))}, or {off}")
    sets = " ".join(f"{LADDER_KEYS.get(k, k)}={recipe_value(now, k)}" for k in diff
                    if not k.startswith("model.") and k != "train.tokens")
    raise ConfigError(f"{what} {v!r} at size {size}: its lr* (conf/tuned.yaml tuned.size.{size}) was tuned at "
                      f"{show(at)}, but this run trains at {show(now)}: re-tune that size at these settings "
                      f"(`python -m study.tune --ladder {size}{' ' + sets if sets else ''}`) or set those back, "
                      f"or {off}")


def check_transferable(cfg: RunConfig, v: str, what: str, off: str, model: str | None = None,
                       position: str | None = None) -> None:
    """Variant ``v`` may train at its arm's lr outside the test stage: the arm of its name is the plain variant (no
    recipe overrides, which a run of the variant would not apply) and has an lr* in conf/tuned.yaml (or a fixed lr);
    at size ``model`` (a scale ladder's size) or with train.lr_per_size (this run's size), the lr* tuned at that size
    (tuned.size), tuned at the settings the run trains at (tuned.size_recipe; ``position``: the size's model file's
    own positions, None where it takes the task's).

    Raises:
        ConfigError: one line naming what is missing or differs and the command that tunes it.
    """
    arm = cfg.arms.get(v)
    if arm is None:
        raise ConfigError(f"{what} {v!r} has no arm of its name to take an lr* from: define arms.{v} "
                          f"({{variant: {v}}}) in conf/study.yaml and tune it ({retune_hint(cfg, v)}), or {off}")
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
        check_size_recipe(cfg, v, size, size_recipe_now(cfg, size, ladder=model is not None, position=position),
                           what, off)
        return
    if arm.lr is None and v not in cfg.tuned.lr:
        raise ConfigError(f"{what} {v!r} has no lr* in conf/tuned.yaml (tuned.lr has {sorted(cfg.tuned.lr)}): tune "
                          f"it ({retune_hint(cfg, v)}), or {off}")
    tuned_at = (cfg.tuned.recipe or {}).get(v)
    now = position or cfg.model.position
    if arm.lr is None and tuned_at is not None:  # the positions an lr* was tuned at
        was = (tuned_at.get("model") or {}).get("position")
        back = POSITION_FIX.format(was=was) if position else f"set model.position={was}"
        if was != now:
            raise ConfigError(f"{what} {v!r}: its lr* was tuned at model.position={was}, but this run trains at "
                              f"model.position={now}: re-tune it ({retune_hint(cfg, v)}) or {back}, or {off}")
