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
  model_vocab(cfg, meta)        rows of the embedding / output head
  datamodule(cfg, root, meta, micro, data_seed, n_val, val_micro, global_batch)   its LightningDataModule
  split(batch) -> (inputs, targets)   the objective's input: the model's loss is the cross-entropy of these
  yardsticks(cfg, root, meta)   what a count model or chance scores on the same validation targets

This layer sits between ``study.data`` (which it reads) and ``study.modeling`` (which calls it).
"""
from __future__ import annotations

from study.config import TASKS, ConfigError

#: the target of an unscored position (torch's cross_entropy ignore_index default)
IGNORE = -100


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


def scored(logits, targets):
    """Per-token cross-entropy (nats) and hits where ``targets`` is scored.

    Args:
        logits: (B, T, V); targets: (B, T) int64, :data:`IGNORE` at unscored positions.

    Returns:
        (losses (B, T) float32, 0 where unscored; scored (B, T) bool; correct (B, T) bool: argmax = target).
    """
    import torch.nn.functional as F

    # (B, T, V) -> (B, V, T) against (B, T)
    losses = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none", ignore_index=IGNORE)
    mask = targets != IGNORE
    return losses, mask, (logits.argmax(-1) == targets) & mask


def keyed_generator(key: str):
    """A CPU ``torch.Generator`` seeded by sha256(``key``): the same stream wherever the key is the same."""
    import hashlib

    import torch

    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1
    return torch.Generator().manual_seed(seed)


def val_count(cfg) -> int:
    """Validation examples of a run: the fixed windows of ``train.val_tokens`` (lm, mlm) or the MQAR test set."""
    if cfg.task.name == "mqar":
        return int(cfg.task.test_examples)
    return cfg.train.val_tokens // cfg.model.block_size
