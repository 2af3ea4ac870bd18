"""The task of a run, resolved in one place: its module, its own settings, and where its runs, tracking and lr* live.

A task ``T`` is one module, ``study/tasks/T.py``, chosen by ``task.name`` (conf/task/T.yaml); the module is found by
that name (:func:`get_task`, a plug-in lookup as Hydra's ``_target_`` is) and holds the task's settings
(``Settings``, a dataclass), their checks (``check``), its data folder, loss, validation and report lines
(``study.tasks`` lists the interface).  The config section ``task`` is ``name`` and ``position`` (every task's) plus
the fields of the task's ``Settings``, typed by it (:func:`resolve_task`).

``task=lm`` (the default) changes nothing else.  Any other task ``T`` keeps its runs, tuning and verdict apart from
every other task's, never pooled:

=====================  =============================  ==========================================
key                    lm                             task T
=====================  =============================  ==========================================
study.runs_dir         runs                           runs/T
study.name             nonlinear-queries (MLflow)     nonlinear-queries-T (its own experiment)
study.reports_dir      reports                        reports/T (its verdict in its own words)
tune.runs_dir          runs_tune                      runs_tune/T
tune.table_dir         conf/tuning                    conf/tuning/T
tuned.lr, .recipe      tuned.lr, tuned.recipe         tuned.task.T.lr, tuned.task.T.recipe
model.position         task.position                  task.position, where it is None
=====================  =============================  ==========================================

``model.position`` left at None takes the task's ``task.position`` (conf/task/T.yaml); a run that names its own
(``model.position=learned``) keeps it.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from pathlib import Path

from omegaconf import OmegaConf, read_write
from omegaconf.errors import OmegaConfBaseException

from .schema import ConfigError, RunConfig

#: the fields every task has; a task's own are its module's ``Settings``
COMMON_FIELDS = ("name", "position")


def task_names() -> list[str]:
    """The tasks there are: the modules of ``study/tasks/`` other than its helpers, sorted."""
    folder = Path(__file__).resolve().parent.parent / "tasks"
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_") and p.stem != "common")


def get_task(name: str):
    """The module of task ``name``: ``study.tasks.NAME``.

    Raises:
        ConfigError: no such task (one line naming the choices).
    """
    if not isinstance(name, str) or not name.isidentifier() or name == "common" \
            or importlib.util.find_spec(f"study.tasks.{name}") is None:
        raise ConfigError(f"task.name={name!r} is not a task: choose one of {task_names()} (task=NAME; a new task is "
                          f"a module study/tasks/NAME.py and conf/task/NAME.yaml, docs/tasks.md)")
    return importlib.import_module(f"study.tasks.{name}")


def task_fields(name: str) -> tuple[str, ...] | None:
    """The ``task.*`` fields a run of task ``name`` reads, in its resume key and the settings runs pair on: ``name``
    and the fields of its ``Settings``, or none at all when it has no settings of its own (``lm``: the key of an lm
    run holds no task field, as before tasks existed).  None for an unknown task (every field counts)."""
    try:
        own = tuple(f.name for f in dataclasses.fields(get_task(name).Settings))
    except ConfigError:
        return None
    return ("name", *own) if own else ()


def own_settings(cfg: RunConfig) -> dict:
    """The task's own settings of ``cfg`` (the section ``task`` less :data:`COMMON_FIELDS`), typed by its module's
    ``Settings``: {field: value}.

    Raises:
        ConfigError: an unknown task; a field its ``Settings`` lacks, a value of the wrong type, or a field that
            conf/task/NAME.yaml leaves unset (one line naming the key).
    """
    module = get_task(cfg.task.name)
    given = {k: v for k, v in OmegaConf.to_container(cfg.task, resolve=True).items() if k not in COMMON_FIELDS}
    try:
        typed = OmegaConf.merge(OmegaConf.structured(module.Settings), given)
        return OmegaConf.to_container(typed, throw_on_missing=True)
    except OmegaConfBaseException as e:
        key = f"task.{getattr(e, 'key', None) or getattr(e, 'full_key', '?')}"
        fields = [f.name for f in dataclasses.fields(module.Settings)]
        raise ConfigError(f"{key}: {str(e).splitlines()[0]} (task {cfg.task.name} has settings {fields}, typed by "
                          f"study/tasks/{cfg.task.name}.py Settings; set them in conf/task/{cfg.task.name}.yaml)") from e


def resolve_task(cfg: RunConfig) -> RunConfig:
    """A copy of ``cfg`` with its task resolved (``cfg`` is unchanged): the task's settings typed, ``model.position``
    the task's where it is None, and for a task other than ``lm`` its own runs folder, MLflow experiment, tuning
    folders and lr* (the table above).  A config already resolved (a run's config.json) resolves to itself.

    Raises:
        ConfigError: an unknown task, its settings mistyped (:func:`own_settings`), ``task.position`` not
            ``learned`` or ``rope``; one line.
    """
    t = cfg.task.name
    own = own_settings(cfg)
    if cfg.task.position not in ("learned", "rope"):
        raise ConfigError(f"task.position={cfg.task.position!r}: choose 'learned' or 'rope' (a run may name its own "
                          f"with model.position)")
    derived: dict = {"task": own}
    if cfg.model.position is None:  # the task's positions, unless the run names its own (model.position=...)
        derived["model"] = {"position": cfg.task.position}
    if t != "lm":
        derived["study"] = {"runs_dir": _suffixed(cfg.study.runs_dir, f"/{t}"), "name": _suffixed(cfg.study.name, f"-{t}"),
                            "reports_dir": _suffixed(cfg.study.reports_dir, f"/{t}")}
        derived["tune"] = {"runs_dir": _suffixed(cfg.tune.runs_dir, f"/{t}"),
                           "table_dir": _suffixed(cfg.tune.table_dir, f"/{t}")}
        mine = cfg.tuned.task.get(t) or {}
        derived["tuned"] = {"lr": dict(mine.get("lr") or {}), "recipe": dict(mine.get("recipe") or {})}
    out = OmegaConf.merge(cfg, derived)
    if t != "lm":  # replaced, not merged into the lm task's: in the fresh copy, before anything reads it
        with read_write(out.tuned):
            out.tuned.lr, out.tuned.recipe = derived["tuned"]["lr"], derived["tuned"]["recipe"]
    return out  # type: ignore[return-value]


def _suffixed(value, suffix: str) -> str:
    """``value`` (a folder or a name) + ``suffix``, unless it already ends with it (a resolved config's)."""
    value = str(value).rstrip("/")
    return value if value.endswith(suffix) else value + suffix


def check_task(cfg: RunConfig) -> None:
    """The task's own checks (its module's ``check(cfg)``: fractions in [0, 1], sizes its generator accepts ...).

    Raises:
        ConfigError: one line naming the key and the fix.
    """
    get_task(cfg.task.name).check(cfg)


def task_data_dir(cfg: RunConfig, root) -> Path:
    """The folder of the data a run of this task reads, whose meta.json is in its resume key: the task module's
    ``data_dir(cfg, root)`` (lm, mlm: ``data.dir``, the prepared tokens; mqar: its kept test set)."""
    return Path(get_task(cfg.task.name).data_dir(cfg, Path(root)))


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
