"""The tasks a run can learn, one module each behind one small interface (as litgpt keeps one module per data
source); ``task.name`` (conf/task/NAME.yaml) picks one, ``study.config.get_task`` returns its module:

  lm.py    next-token prediction on the prepared corpus (the study's task): causal, every position scored
  mlm.py   masked language modelling on the same windows (BERT, arXiv 1810.04805): bidirectional, the chosen
           tokens scored
  mqar.py  multi-query associative recall (Zoology, arXiv 2312.04927): causal, the query positions scored

Each module holds (a new task is one more module, its conf/task/NAME.yaml and its row in docs/tasks.md;
``study.config.task.get_task`` finds it by name):

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

from study.config import get_task
from study.tasks.common import IGNORE, keyed_generator, scored  # noqa: F401 (the interface's helpers)


def configured_rows(cfg) -> int:
    """The embedding rows (tokens) a run of ``cfg`` has, from the config alone: the task's ``model_vocab`` of the
    ids its config names (``config_ids``).  A run builds its model from the prepared data's meta.json instead;
    the two agree unless a BPE learned fewer tokens than ``data.vocab_size`` asked (throughput benches, counts
    and tests build from this)."""
    task = get_task(cfg.task.name)
    return task.model_vocab(cfg, {"vocab_size": task.config_ids(cfg)})
