"""The task of a run, resolved in one place: where its runs, tracking and lr* live, and which of its settings count.

A task ``T`` is one module, ``study/tasks/<T>.py`` (its settings typed by its ``Settings`` dataclass, their checks, its
data, loss, validation and report words: ``study.tasks``), and one file, ``conf/task/T.yaml``, that sets ``name``,
``position`` and a value for each of those settings.  The section ``task`` is what Hydra composes from the file;
:func:`task_fields` (the settings a run's key and pairing hold) are the file's keys; the task's module types and
checks them in every composition (``study.tasks.typed_task``, which ``load_config`` finds by name: the task modules
are plug-ins of the composition, as Hydra's ``_target_`` classes are).

``task=lm`` (the default) changes nothing else.  Any other task ``T`` keeps its runs, tuning and verdict apart from
every other task's, never pooled (:func:`resolve_task`):

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

import functools
from pathlib import Path

import yaml
from omegaconf import OmegaConf, read_write

from .schema import ConfigError, RunConfig

#: the fields every task has; the others of its conf/task file are its own settings
COMMON_FIELDS = ("name", "position")
#: the task files (the package's own project: every copy of the project has its conf/ beside study/)
TASK_DIR = Path(__file__).resolve().parent.parent.parent / "conf" / "task"


def task_names() -> list[str]:
    """The tasks there are, sorted: each file conf/task/NAME.yaml with its module study/tasks/<NAME>.py (NAME a Python
    name, not one of the package's own modules)."""
    modules = TASK_DIR.parent.parent / "study" / "tasks"
    return sorted(p.stem for p in TASK_DIR.glob("*.yaml") if p.stem.isidentifier()
                  and p.stem not in ("common", "__init__") and (modules / f"{p.stem}.py").is_file())


@functools.lru_cache(maxsize=None)
def _file_keys(path: Path, mtime_ns: int) -> tuple[str, ...]:  # mtime_ns: read again once the file changes
    data = yaml.safe_load(path.read_text()) or {}
    return tuple(data) if isinstance(data, dict) else ()


def task_fields(name: str) -> tuple[str, ...] | None:
    """The ``task.*`` fields a run of task ``name`` reads, in its resume key and the settings runs pair on: ``name``
    and the task's own settings (the other keys of conf/task/NAME.yaml), or none at all when it has no settings
    (``lm``: the key of an lm run holds no task field, as before tasks existed).  None for an unknown task (every
    field counts)."""
    path = TASK_DIR / f"{name}.yaml"
    if not isinstance(name, str) or not path.is_file():
        return None
    own = tuple(k for k in _file_keys(path, path.stat().st_mtime_ns) if k not in COMMON_FIELDS)
    return ("name", *own) if own else ()


def resolve_task(cfg: RunConfig) -> RunConfig:
    """A copy of ``cfg`` with its task resolved (``cfg`` is unchanged): ``model.position`` the task's where it is
    None, and for a task other than ``lm`` its own runs folder, MLflow experiment, tuning folders and lr* (the table
    above).  A config already resolved (a run's config.json) resolves to itself.

    Raises:
        ConfigError: ``task.name`` without a conf/task file, a conf/task file that states no ``position``,
            ``task.position`` not ``learned`` or ``rope``; one line.
    """
    t = cfg.task.name
    if task_fields(t) is None:
        raise ConfigError(f"task.name={t!r} is not a task: choose one of {task_names()} (task=NAME; a new task is a "
                          f"module study/tasks/<NAME>.py and conf/task/NAME.yaml, docs/tasks.md)")
    path = TASK_DIR / f"{t}.yaml"
    if "position" not in _file_keys(path, path.stat().st_mtime_ns):  # else the schema's default would stand silently
        raise ConfigError(f"conf/task/{t}.yaml states no position: write position: rope or position: learned (where "
                          f"the task's models take their positions, docs/tasks.md)")
    if cfg.task.position not in ("learned", "rope"):
        raise ConfigError(f"task.position={cfg.task.position!r}: choose 'learned' or 'rope' (a run may name its own "
                          f"with model.position)")
    derived: dict = {}
    if cfg.model.position is None:  # the task's positions, unless the run names its own (model.position=...)
        derived["model"] = {"position": cfg.task.position}
    if t != "lm":
        derived["study"] = {"runs_dir": _suffixed(cfg.study.runs_dir, f"/{t}"),
                            "name": _suffixed(cfg.study.name, f"-{t}"),
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
