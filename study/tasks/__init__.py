"""The tasks a run can learn, one module each behind one small interface (as litgpt keeps one module per data
source); ``task.name`` (conf/task/NAME.yaml) picks one, :func:`get_task` returns its module:

  lm.py    next-token prediction on the prepared corpus (the study's task): causal, every position scored
  mlm.py   masked language modelling on the same windows (BERT, arXiv 1810.04805): bidirectional, the chosen
           tokens scored
  mqar.py  multi-query associative recall (Zoology, arXiv 2312.04927): causal, the query positions scored

Each module holds (a new task is one more module, its conf/task/NAME.yaml and its row in docs/tasks.md;
:func:`get_task` finds it by name):

  Settings                      a dataclass of the task's own settings (conf/task/NAME.yaml sets them; they type the
                                section ``task`` beside ``name`` and ``position``, and are its part of the resume key)
  check(cfg)                    their checks beyond types (ConfigError, one line)
  data_dir(cfg, root)           the folder of the data a run reads (its meta.json is in the resume key)
  CAUSAL                        the attention mask of the model (``study.modeling.model.GPT(causal=...)``)
  LABELLED                      False: batches are windows (B, T + 1), the targets the inputs shifted by one;
                                True: batches are (inputs (B, T), targets (B, T)[, corpus (B,)]) with
                                :data:`IGNORE` where nothing is scored
  METRICS                       what a validation reports: val_loss (nats per scored token), val_accuracy
  check_data(cfg, root) -> meta the data a run needs, checked (or, mqar, built once and kept with the data)
  model_vocab(cfg, meta)        rows of the embedding / output head, from the data's vocabulary (meta.json)
  config_ids(cfg)               the ids the config names before data exist (lm, mlm: data.tokenizer's vocabulary;
                                mqar: task.vocab_size): :func:`configured_rows` builds a meta of them
  val_examples(cfg)             the validation examples of a run
  datamodule(cfg, root, meta, micro, data_seed, n_val, val_micro, global_batch)   its LightningDataModule
  split(batch) -> (inputs, targets)   the objective's input: the model's loss is the cross-entropy of these
  tokens(batch)                 the positions a batch reads (throughput)
  yardsticks(cfg, root, meta)   what a count model or chance scores on the same validation targets
  NO_CONTEXT, report_text(settings), yardstick_lines(y)   comparison.md's words for the task

Every composition (``study.config.load_config``) hands its config to :func:`typed_task`, which types the task's settings
by its ``Settings`` and runs its ``check``.  ``common.py`` holds what the tasks share (the unscored target, the
per-token scoring, keyed generators, report numbers).
This layer sits between ``study.data`` (which it reads) and ``study.modeling`` (which calls it).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from study.config import ConfigError, task_fields, task_names
from study.config.task import COMMON_FIELDS
from study.tasks.common import IGNORE, keyed_generator, scored  # noqa: F401 (the interface's helpers)


#: what every task module defines (the interface above); a module without one of them is refused by name
INTERFACE = ("Settings", "check", "data_dir", "CAUSAL", "LABELLED", "METRICS", "check_data", "model_vocab",
             "config_ids", "val_examples", "datamodule", "split", "tokens", "yardsticks", "NO_CONTEXT", "report_text",
             "yardstick_lines")


def get_task(name: str):
    """The module of task ``name``: ``study.tasks.<NAME>``, found by name.

    Raises:
        ConfigError: ``name`` is no task (one line naming the tasks), or its module cannot be imported or lacks a
            name of :data:`INTERFACE` (one line naming the module and the fix).
    """
    if not isinstance(name, str) or name not in task_names():
        why = ("is the package's own module, not a task" if name in ("common", "__init__") else
               "is not a Python name (letters, digits, _)" if isinstance(name, str) and not name.isidentifier() else
               "is not a task")
        raise ConfigError(f"task.name={name!r} {why}: choose one of {task_names()} (a new task is a module "
                          f"study/tasks/<NAME>.py and conf/task/NAME.yaml, docs/tasks.md)")
    try:
        module = importlib.import_module(f"study.tasks.{name}")
    except Exception as e:  # noqa: BLE001  (a broken task module: one line, not its traceback)
        where = f" line {e.lineno}" if isinstance(e, SyntaxError) and e.lineno else ""
        raise ConfigError(f"study/tasks/{name}.py{where} cannot be imported ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}): fix the module") from None
    lacks = [n for n in INTERFACE if not hasattr(module, n)]
    if lacks:
        raise ConfigError(f"study/tasks/{name}.py lacks {lacks}: a task module defines the interface of "
                          f"study/tasks/__init__.py (tests/test_new_task.py has a small one)")
    return module


def typed_task(cfg):
    """``cfg`` with its task's own settings (the section ``task`` less ``name`` and ``position``) typed by the task
    module's ``Settings`` and checked by its ``check(cfg)`` (fractions in [0, 1], sizes its generator accepts ...): a
    copy, ``cfg`` unchanged.  Every composition passes through here (``study.config.load_config``).

    Raises:
        ConfigError: an unknown or broken task; conf/task/NAME.yaml without a value for a field of ``Settings``, or
            with a key ``Settings`` lacks; a value of the wrong type; a value ``check`` refuses (one line naming the
            key and the fix).
    """
    module, name = get_task(cfg.task.name), cfg.task.name
    fields = [f.name for f in dataclasses.fields(module.Settings)]
    listed = list(task_fields(name) or ())[1:]
    if sorted(listed) != sorted(fields):
        raise ConfigError(f"conf/task/{name}.yaml sets {listed} but study/tasks/{name}.py Settings has {fields}: "
                          f"give every field of Settings its value in the file, and nothing else")
    given = {k: v for k, v in OmegaConf.to_container(cfg.task, resolve=True).items() if k not in COMMON_FIELDS}
    try:
        typed = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(module.Settings), given),
                                       throw_on_missing=True)
    except OmegaConfBaseException as e:
        key = f"task.{getattr(e, 'key', None) or getattr(e, 'full_key', '?')}"
        raise ConfigError(f"{key}: {str(e).splitlines()[0]} (task {name} has settings {fields}, typed by "
                          f"study/tasks/{name}.py Settings; their values are conf/task/{name}.yaml's)") from None
    out = OmegaConf.merge(cfg, {"task": typed}) if typed else cfg  # lm has no settings: nothing to type
    module.check(out)
    return out


def task_data_dir(cfg, root) -> Path:
    """The folder of the data a run of this task reads, whose meta.json is in its resume key: the task module's
    ``data_dir(cfg, root)`` (lm, mlm: ``data.dir``, the prepared tokens; mqar: its kept test set)."""
    return Path(get_task(cfg.task.name).data_dir(cfg, Path(root)))


def configured_rows(cfg) -> int:
    """The embedding rows (tokens) a run of ``cfg`` has, from the config alone: the task's ``model_vocab`` of the
    ids its config names (``config_ids``).  A run builds its model from the prepared data's meta.json instead;
    the two agree unless a BPE learned fewer tokens than ``data.vocab_size`` asked (throughput benches, counts
    and tests build from this)."""
    task = get_task(cfg.task.name)
    return task.model_vocab(cfg, {"vocab_size": task.config_ids(cfg)})
