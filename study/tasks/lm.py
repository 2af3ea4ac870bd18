"""Task ``lm``: next-token prediction on the prepared corpus, the study's task (its numbers are the ones the
study had before tasks existed: the same data, ops and random numbers).

Batches are windows (B, block_size + 1) of token ids; inputs the first block_size, targets the last block_size;
every position is scored.  Yardsticks: unigram and bigram cross-entropy of the fixed validation windows
(``study.data.yardsticks``, computed by the prepare stage into meta.json).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from study.config import FIXED_VOCAB, embedding_rows, tokenizer_vocab
from study.tasks.common import fmt

CAUSAL = True
LABELLED = False
METRICS = ("val_loss",)
#: what the no-context arm (each position attends to itself only) can still do
NO_CONTEXT = "a learned bigram with the baseline's parameters"


@dataclass
class Settings:
    """lm has no settings of its own: its data are ``data.*``, its windows ``model.block_size``."""


def check(cfg) -> None:
    """Nothing beyond the checks of every task."""


def data_dir(cfg, root: Path) -> Path:
    """The prepared tokens, ``data.dir``."""
    return Path(root) / cfg.data.dir


def check_data(cfg, root: Path) -> dict:
    """The prepared token data checked against ``cfg`` (``study.data.records.check_prepared``) and one optimizer
    step's windows (``check_train_windows``); returns meta.json.  Raises: DataError."""
    from study.data.records import check_prepared
    from study.data.windows import check_train_windows

    data_dir = root / cfg.data.dir
    meta = check_prepared(data_dir, cfg)
    check_train_windows(data_dir, cfg)
    return meta


def val_examples(cfg) -> int:
    """Validation examples of a run: the first ``train.val_tokens // model.block_size`` fixed windows."""
    return cfg.train.val_tokens // cfg.model.block_size


def config_ids(cfg) -> int:
    """The tokenizer's ids as the config names them (``data.tokenizer``, ``data.vocab_size``)."""
    return tokenizer_vocab(cfg.data)


def model_vocab(cfg, meta: dict) -> int:
    """Rows of the embedding: the prepared data's vocabulary (meta.json ``vocab_size``) rounded up to a multiple
    of ``model.vocab_multiple``."""
    return embedding_rows(meta["vocab_size"], cfg.model.vocab_multiple)


def datamodule(cfg, root: Path, meta: dict, micro: int, data_seed: int, n_val: int, val_micro: int,
               global_batch: int):
    """:class:`study.data.datamodule.TokenDataModule` of the prepared windows."""
    from study.data.datamodule import TokenDataModule

    return TokenDataModule(root / cfg.data.dir, cfg.model.block_size, micro, data_seed, n_val, val_micro,
                           global_batch=global_batch)


def split(batch):
    """(B, T + 1) windows -> (inputs (B, T), targets (B, T)) int64: the targets are the inputs shifted by one."""
    batch = batch.long()  # (B, block_size + 1)
    return batch[:, :-1], batch[:, 1:]


def tokens(batch) -> int:
    """Predicted tokens of a batch: B x T."""
    return batch.shape[0] * (batch.shape[1] - 1)


def yardsticks(cfg, root: Path, meta: dict) -> dict:
    """The prepare stage's unigram and bigram cross-entropy (nats/token) of the fixed validation windows."""
    return dict(meta.get("yardsticks") or {})


def report_text(settings: dict) -> dict:
    """comparison.md's words for this task, from the runs' recorded settings (flat keys): ``ids`` (the vocabulary),
    ``losses`` (what a loss is), ``lines`` (a paragraph of its own), ``corpus_yardsticks`` (per-corpus columns)."""
    ids = FIXED_VOCAB.get(settings.get("data.tokenizer"), settings.get("data.vocab_size"))
    val = settings.get("train.val_tokens")
    return {"ids": f"{'n/a' if ids is None else ids} ids", "lines": [], "corpus_yardsticks": ("unigram", "bigram"),
            "losses": f"Losses are final validation cross-entropy in nats on the same "
                      f"{'n/a' if val is None else format(val, ',')} fixed validation tokens for every run. "}


def yardstick_lines(y: dict) -> list[str]:
    """The yardsticks (summary.json "yardsticks": the prepared data's count models) in one paragraph."""
    if not y:
        return []
    if not y.get("available"):
        return [f"Yardsticks: not shown ({y.get('note')})."]
    shown = [f"{k} {fmt(y[k].get('all'))} nats" for k in ("unigram", "bigram") if k in y]
    return [f"Yardsticks on the same validation windows: {', '.join(shown)} (count models of the training tokens: "
            f"{y.get('method', 'see meta.json')}); a model below the bigram uses its context."]
