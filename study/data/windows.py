"""Windows of a prepared split: index.json arithmetic, no reading of tokens.

A window is ``block_size + 1`` tokens; litdata's ``TokensLoader`` cuts each chunk of ``dim`` tokens
into ``dim // window`` of them, in chunk order.  From that follow how many windows a split holds,
where each starts in the token stream, which are the fixed validation windows, and whether a
config's batch fits the split (:func:`check_train_windows`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from study.data import DataError


def split_chunks(split_dir: Path) -> list[dict]:
    """The chunk entries of a litdata split's index.json (each has ``dim``, its tokens).

    Raises:
        DataError: index.json missing or corrupt.
    """
    from study.data.records import read_index

    return read_index(split_dir)["chunks"]


def split_windows(split_dir: Path, window: int) -> int:
    """Windows of ``window`` tokens in a litdata split, counted from its index.json: the same on
    every rank and world size (``len(StreamingDataset)`` is this rank's share under DDP).

    TokensLoader cuts each chunk of ``dim`` tokens into ``dim // window`` windows; window i of the
    split is the i-th of them in chunk order (litdata's global item index).
    """
    return sum(c["dim"] // window for c in split_chunks(split_dir))


def window_token_offsets(split_dir: Path, window: int, indices) -> np.ndarray:
    """Token offset, within the split's token stream, of the first token of each window ``indices``
    (litdata's global item indices of windows of ``window`` tokens; a chunk's tail shorter than a
    window is never read).  Returns int64 (len(indices),)."""
    chunks = split_chunks(split_dir)
    n_win = np.array([c["dim"] // window for c in chunks], dtype=np.int64)
    first_win = np.concatenate([[0], np.cumsum(n_win)])
    first_tok = np.concatenate([[0], np.cumsum([c["dim"] for c in chunks])]).astype(np.int64)
    idx = np.asarray(indices, dtype=np.int64)
    c = np.searchsorted(first_win, idx, side="right") - 1
    return first_tok[c] + (idx - first_win[c]) * window


def corpus_of_tokens(corpus_tokens: list, offsets: np.ndarray) -> np.ndarray:
    """Index into ``corpus_tokens`` ([[name, tokens], ...] in stream order, meta.json) of the corpus
    holding each token offset (int64 (n,))."""
    ends = np.cumsum([int(n) for _, n in corpus_tokens])
    return np.minimum(np.searchsorted(ends, offsets, side="right"), len(ends) - 1)


def val_window_indices(n_windows: int, n_val: int) -> np.ndarray:
    """The fixed validation set: ``n_val`` window indices spread evenly over the ``n_windows`` of the
    validation split (i * n_windows // n_val), so that every held-out document contributes.

    Raises:
        DataError: fewer windows than asked for.
    """
    if n_windows < n_val:
        raise DataError(f"the validation split holds {n_windows} windows, fewer than the {n_val} asked for: "
                        f"lower train.val_tokens")
    return np.arange(n_val, dtype=np.int64) * n_windows // n_val


def check_train_windows(data_dir: Path, cfg) -> int:
    """Refuse a run whose training loader would yield no optimizer step; return the training windows.

    One optimizer step takes train.batch_tokens / block_size windows of block_size + 1 tokens (over all
    devices and accumulation); the training split holds :func:`split_windows` of them.

    Raises:
        DataError: fewer windows than one step, with both counts and the fix.
    """
    need = cfg.train.batch_tokens // cfg.model.block_size
    have = split_windows(data_dir / "train", cfg.model.block_size + 1)
    if have < need:
        raise DataError(f"training split too small: {data_dir / 'train'} holds {have} windows of "
                        f"{cfg.model.block_size + 1} tokens, fewer than one optimizer step of train.batch_tokens="
                        f"{cfg.train.batch_tokens} ({need} windows): lower train.batch_tokens to at most "
                        f"{have * cfg.model.block_size} or prepare more data")
    n_val = cfg.train.val_tokens // cfg.model.block_size
    val = split_windows(data_dir / "val", cfg.model.block_size + 1)
    if val < n_val:  # checked here, before a checkpoint could be touched
        raise DataError(f"the validation split of {data_dir} holds {val} windows of {cfg.model.block_size + 1} "
                        f"tokens, fewer than the {n_val} of train.val_tokens={cfg.train.val_tokens}: lower "
                        f"train.val_tokens to at most {val * cfg.model.block_size}")
    return have
