"""The tasks a run can learn, one module each behind one small interface (as litgpt keeps one module per data
source); ``task.name`` (conf/task/NAME.yaml) picks one, :func:`get_task` returns its module:

  lm.py    next-token prediction on the prepared corpus (the study's task): causal, every position scored
  mlm.py   masked language modelling on the same windows (BERT, arXiv 1810.04805): bidirectional, the chosen
           tokens scored
  mqar.py  multi-query associative recall (Zoology, arXiv 2312.04927): causal, the query positions scored

Each module holds:

  CAUSAL                        the attention mask of the model (``study.modeling.model.GPT(causal=...)``)
  LABELLED                      False: batches are windows (B, T + 1), the targets the inputs shifted by one;
                                True: batches are (inputs (B, T), targets (B, T)[, corpus (B,)]) with
                                :data:`IGNORE` where nothing is scored
  METRICS                       what a validation reports: val_loss (nats per scored token), val_accuracy
  check_data(cfg, root) -> meta the data a run needs, checked (or, mqar, built once and kept with the data)
  model_vocab(cfg, meta)        rows of the embedding / output head, from the data's vocabulary (meta.json)
  config_ids(cfg)               the ids the config names before data exist (lm, mlm: data.tokenizer's vocabulary;
                                mqar: task.vocab_size): :func:`configured_rows` builds a meta of them
  datamodule(cfg, root, meta, micro, data_seed, n_val, val_micro, global_batch)   its LightningDataModule
  split(batch) -> (inputs, targets)   the objective's input: the model's loss is the cross-entropy of these
  yardsticks(cfg, root, meta)   what a count model or chance scores on the same validation targets

``common.py`` holds what they share (the unscored target, the per-token scoring, keyed generators).
This layer sits between ``study.data`` (which it reads) and ``study.modeling`` (which calls it).
"""
from __future__ import annotations

from study.config import TASKS, ConfigError
from study.tasks.common import IGNORE, keyed_generator, scored, val_count  # noqa: F401 (the interface's helpers)


def get_task(name: str):
    """The module of task ``name``.

    Raises:
        ConfigError: an unknown task (one line naming the choices).
    """
    from study.tasks import lm, mlm, mqar

    modules = {"lm": lm, "mlm": mlm, "mqar": mqar}
    if name not in modules:
        raise ConfigError(f"task.name={name!r} is not a task: choose one of {list(TASKS)} (task=NAME)")
    return modules[name]


def configured_rows(cfg) -> int:
    """The embedding rows (tokens) a run of ``cfg`` has, from the config alone: the task's ``model_vocab`` of the
    ids its config names (``config_ids``).  A run builds its model from the prepared data's meta.json instead;
    the two agree unless a BPE learned fewer tokens than ``data.vocab_size`` asked (throughput benches, counts
    and tests build from this)."""
    task = get_task(cfg.task.name)
    return task.model_vocab(cfg, {"vocab_size": task.config_ids(cfg)})
