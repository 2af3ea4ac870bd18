"""Yardsticks: what simple count models score on the study's fixed validation windows.

A transformer's validation loss means little alone; beside it the report shows the cross-entropy
(nats per token) of the same fixed validation windows under two count models fitted on the training
split: a unigram model P(b) and a bigram model P(b | a), both with add-k (Lidstone) smoothing,
P(b | a) = (c(a, b) + k) / (c(a) + k V) (Jurafsky & Martin, "Speech and Language Processing", ch. 3).
k is chosen from a small grid on the last 10% of the training tokens (counts from the first 90%),
then the counts are taken over the whole training split.  Like the models' val_loss, the cross-entropy
of a window (block_size + 1 tokens) is the mean over its block_size predicted tokens, and a corpus's
value is the mean over the windows that start in it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from study.data import DataError

K_GRID = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001)


def _unigram_logp(tokens: np.ndarray, vocab_size: int, k: float) -> np.ndarray:
    """log P(b) for every b: (vocab_size,) float64."""
    counts = np.bincount(tokens, minlength=vocab_size).astype(np.float64)
    return np.log((counts + k) / (counts.sum() + k * vocab_size))


class Bigram:
    """Bigram counts of a token stream (sparse: sorted pair codes a * V + b and their counts)."""

    def __init__(self, tokens: np.ndarray, vocab_size: int):
        tokens = np.asarray(tokens, dtype=np.int64)
        self.vocab_size = vocab_size
        self.codes, self.counts = np.unique(tokens[:-1] * vocab_size + tokens[1:], return_counts=True)
        self.row = np.bincount(tokens[:-1], minlength=vocab_size).astype(np.float64)

    def logp(self, prev: np.ndarray, nxt: np.ndarray, k: float) -> np.ndarray:
        """log P(nxt | prev) with add-k smoothing; arrays of equal shape."""
        code = prev.astype(np.int64) * self.vocab_size + nxt.astype(np.int64)
        pos = np.minimum(np.searchsorted(self.codes, code), len(self.codes) - 1)
        c = np.where(self.codes[pos] == code, self.counts[pos], 0).astype(np.float64)
        return np.log((c + k) / (self.row[prev] + k * self.vocab_size))


def _best_k(score) -> float:
    """The k of K_GRID with the lowest held-out cross-entropy ``score(k)``."""
    return min(K_GRID, key=score)


def ngram_yardsticks(train_tokens: np.ndarray, windows: np.ndarray, corpus: np.ndarray, corpora: list[str],
                     vocab_size: int) -> dict:
    """Cross-entropy (nats per token) of validation ``windows`` under unigram and bigram count models.

    Args:
        train_tokens: the training split's token ids in stream order, (N,).
        windows: the fixed validation windows, (n_val, block_size + 1) token ids.
        corpus: index into ``corpora`` of each window's corpus, (n_val,).
        corpora: corpus names.
        vocab_size: ids the tokenizer can emit (V of the smoothing).

    Returns:
        ``{"unigram": {"all": x, CORPUS: x, ...}, "bigram": {...}, "k": {"unigram": k, "bigram": k},
        "train_tokens": N, "method": str}``; a corpus without windows is left out.
    """
    train = np.asarray(train_tokens, dtype=np.int64)
    windows = np.asarray(windows, dtype=np.int64)
    corpus = np.asarray(corpus, dtype=np.int64)
    cut = int(len(train) * 0.9)
    fit, held = train[:cut], train[cut:]
    k_uni = _best_k(lambda k: -_unigram_logp(fit, vocab_size, k)[held].mean())
    bigram_fit = Bigram(fit, vocab_size)
    k_bi = _best_k(lambda k: -bigram_fit.logp(held[:-1], held[1:], k).mean())
    uni = -_unigram_logp(train, vocab_size, k_uni)[windows[:, 1:]].mean(axis=1)  # (n_val,)
    bi = -Bigram(train, vocab_size).logp(windows[:, :-1], windows[:, 1:], k_bi).mean(axis=1)  # (n_val,)
    out = {}
    for name, per_window in (("unigram", uni), ("bigram", bi)):
        d = {"all": round(float(per_window.mean()), 6)}
        for i, c in enumerate(corpora):
            if (corpus == i).any():
                d[c] = round(float(per_window[corpus == i].mean()), 6)
        out[name] = d
    out["k"] = {"unigram": k_uni, "bigram": k_bi}
    out["train_tokens"] = int(len(train))
    out["method"] = ("add-k smoothed unigram/bigram counts of the training split, k chosen on its last 10%; "
                     "mean cross-entropy (nats/token) of the fixed validation windows")
    return out


def prepared_yardsticks(cfg, data_dir: Path, meta: dict, train_tokens: np.ndarray) -> dict:
    """Unigram and bigram cross-entropy (nats/token) of the fixed validation windows that training
    evaluates (model.block_size, train.val_tokens), overall and per corpus (:func:`ngram_yardsticks`);
    ``{"skipped": reason}`` when the validation split is too small for those windows (training with
    these settings refuses the data too; other settings may fit)."""
    from study.data.loader import fixed_val_windows  # torch + litdata: only when there are data to read

    n_val = cfg.train.val_tokens // cfg.model.block_size
    try:
        windows, corpus = fixed_val_windows(data_dir, cfg.model.block_size, n_val, meta["corpus_tokens"]["val"])
    except DataError as e:
        return {"skipped": str(e), "block_size": cfg.model.block_size, "n_val_windows": n_val}
    out = ngram_yardsticks(train_tokens, windows.numpy(), corpus.numpy(),
                           [c for c, _ in meta["corpus_tokens"]["val"]], meta["vocab_size"])
    out.update(block_size=cfg.model.block_size, n_val_windows=n_val)
    return out
