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

``common.py`` holds what they share (the unscored target, the per-token scoring, keyed generators).
This layer sits between ``study.data`` (which it reads) and ``study.modeling`` (which calls it).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from study.config import ConfigError, task_names
from study.config.task import COMMON_FIELDS
from study.tasks.common import IGNORE, keyed_generator, scored  # noqa: F401 (the interface's helpers)


def get_task(name: str):
    """The module of task ``name``: ``study.tasks.<NAME>``, found by name.

    Raises:
        ConfigError: no such module (one line naming the tasks).
    """
    if not isinstance(name, str) or not name.isidentifier() or name == "common" \
            or importlib.util.find_spec(f"study.tasks.{name}") is None:
        raise ConfigError(f"task.name={name!r} has no module study/tasks/{name}.py: choose one of {task_names()} "
                          f"(a new task is a module study/tasks/<NAME>.py and conf/task/NAME.yaml, docs/tasks.md)")
    return importlib.import_module(f"study.tasks.{name}")


def task_settings(cfg) -> dict:
    """The task's own settings of ``cfg`` (the section ``task`` less ``name`` and ``position``), typed by its module's
    ``Settings``: {field: value}.

    Raises:
        ConfigError: an unknown task; a setting its ``Settings`` lacks, a value of the wrong type, or a field of
            ``Settings`` that conf/task/NAME.yaml leaves unset (one line naming the key).
    """
    module, name = get_task(cfg.task.name), cfg.task.name
    given = {k: v for k, v in OmegaConf.to_container(cfg.task, resolve=True).items() if k not in COMMON_FIELDS}
    try:
        typed = OmegaConf.merge(OmegaConf.structured(module.Settings), given)
        return OmegaConf.to_container(typed, throw_on_missing=True)
    except OmegaConfBaseException as e:
        key = f"task.{getattr(e, 'key', None) or getattr(e, 'full_key', '?')}"
        fields = [f.name for f in dataclasses.fields(module.Settings)]
        raise ConfigError(f"{key}: {str(e).splitlines()[0]} (task {name} has settings {fields}, typed by "
                          f"study/tasks/{name}.py Settings; their values are conf/task/{name}.yaml's)") from e


def check_task(cfg) -> None:
    """The task's settings typed (:func:`task_settings`) and checked by its module (``check(cfg)``: fractions in
    [0, 1], sizes its generator accepts ...); run when a run is specified (``study.runner.spec.run_spec``).

    Raises:
        ConfigError: one line naming the key and the fix.
    """
    task_settings(cfg)
    get_task(cfg.task.name).check(cfg)


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
