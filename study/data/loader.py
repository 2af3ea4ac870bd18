"""The streaming side of the training and validation windows (torch + litdata; no Lightning).

Windows of block_size + 1 tokens are read from the litdata chunks written by ``study.prepare``
(``TokensLoader``, random access).  The training order is a permutation of all windows of the split,
window by window (:func:`window_order`; keyed by the data seed and the epoch only), dealt to ranks by
:class:`WindowSampler` so that every optimizer step trains on the same windows on any world size, and
resumed from the optimizer step.  The validation windows are fixed (:func:`fixed_val_windows`).
``study.data.datamodule`` wraps them in a LightningDataModule.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch
from litdata import StreamingDataset, TokensLoader

from study.data import DataError
from study.data.windows import corpus_of_tokens, split_windows, val_window_indices, window_token_offsets

RECORD_ENV = "STUDY_RECORD_WINDOWS"
ORDER_VERSION = "window-permutation-v1"  # the training order's algorithm, saved in (and checked on) resume


def fixed_val_windows(data_dir: Path, block_size: int, n_val: int, corpus_tokens: list | None = None):
    """The fixed validation windows of a prepared split and the corpus of each.

    Returns:
        (windows (n_val, block_size + 1) int64 token ids, corpus index (n_val,) int64 into
        ``corpus_tokens`` (the corpus of each window's first token; all 0 when None)).
    """
    window = block_size + 1
    split = Path(data_dir) / "val"
    idx = val_window_indices(split_windows(split, window), n_val)
    ds = StreamingDataset(str(split), item_loader=TokensLoader(block_size=window), shuffle=False)
    windows = torch.stack([torch.as_tensor(np.asarray(ds[int(i)], dtype=np.int64)) for i in idx])
    corpus = (corpus_of_tokens(corpus_tokens, window_token_offsets(split, window, idx)) if corpus_tokens
              else np.zeros(n_val, dtype=np.int64))
    return windows, torch.as_tensor(corpus, dtype=torch.int64)


def window_order(n_windows: int, data_seed: int, epoch: int) -> torch.Tensor:
    """The training order of epoch ``epoch``: a permutation of all ``n_windows`` windows of the split,
    window by window (not blocks of windows, not chunk by chunk), drawn from a generator keyed by
    (data_seed, epoch) only: the same for every variant, world size and resume."""
    key = int.from_bytes(hashlib.sha256(f"order/{data_seed}/{epoch}".encode()).digest()[:8], "little") >> 1
    return torch.randperm(n_windows, generator=torch.Generator().manual_seed(key))


class WindowSampler(torch.utils.data.Sampler):
    """Batch sampler of one rank: micro-batches of window indices of the whole-split permutation.

    Each optimizer step trains on ``global_batch`` consecutive windows of :func:`window_order`; they are
    cut into micro-batches of ``micro_batch`` windows, dealt to ranks 0, 1, ..., W-1, 0, 1, ... (rank r
    reads micro-batches r, r + W, ...), so every step trains on the same windows on any world size.
    An epoch is ``n_windows // global_batch`` steps (the tail of the permutation is dropped); epoch e
    uses permutation e.  Where an iteration starts is a function of the optimizer step only
    (``start_step()``, the Trainer's global step): a resumed run continues with the windows an
    uninterrupted run would read, on any world size.

    Raises:
        DataError: fewer windows than one global batch, or a micro-batch x world size that does not
            divide the global batch.
    """

    def __init__(self, n_windows: int, global_batch: int, micro_batch: int, world_size: int = 1, rank: int = 0,
                 data_seed: int = 1, start_step=lambda: 0):
        if global_batch % (micro_batch * world_size):
            raise DataError(f"global batch {global_batch} windows is not a multiple of micro-batch {micro_batch} x "
                            f"world size {world_size}: the micro-batch must divide train.batch_tokens / "
                            f"(block_size * world size)")
        if n_windows < global_batch:
            raise DataError(f"the training split holds {n_windows} windows, fewer than one optimizer step of "
                            f"{global_batch}: lower train.batch_tokens or prepare more data")
        self.n_windows, self.global_batch, self.micro_batch = n_windows, global_batch, micro_batch
        self.world_size, self.rank, self.data_seed, self.start_step = world_size, rank, data_seed, start_step
        self.steps_per_epoch = n_windows // global_batch

    def __len__(self) -> int:
        """Micro-batches of this rank per epoch."""
        return self.steps_per_epoch * self.global_batch // (self.micro_batch * self.world_size)

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, first micro-batch of the epoch's order) where optimizer step ``step`` starts."""
        epoch, s = divmod(int(step), self.steps_per_epoch)
        return epoch, s * self.global_batch // self.micro_batch

    def __iter__(self):
        epoch, first = self.position(self.start_step())
        order = window_order(self.n_windows, self.data_seed, epoch)
        m, end = self.micro_batch, self.steps_per_epoch * self.global_batch // self.micro_batch
        for j in range(first + self.rank, end, self.world_size):
            yield order[j * m:(j + 1) * m].tolist()


class WindowDataset(torch.utils.data.Dataset):
    """Window ``i`` of a litdata token split: (window,) token ids (litdata's TokensLoader, random access).

    Debug hook: with the environment variable ``STUDY_RECORD_WINDOWS=DIR`` every rank appends the index
    of each window it reads (one per line, in reading order) to ``DIR/train-windows-rank{R}.txt``.
    """

    def __init__(self, split_dir: Path, window: int, rank: int = 0):
        self.split_dir, self.window, self.rank = Path(split_dir), window, rank
        self.n = split_windows(self.split_dir, window)
        self._ds = None
        self._record_dir = os.environ.get(RECORD_ENV)  # read once, not per window
        self._record = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self._ds is None:
            self._ds = StreamingDataset(str(self.split_dir), item_loader=TokensLoader(block_size=self.window),
                                        shuffle=False)
        if self._record_dir:
            if self._record is None:
                folder = Path(self._record_dir)
                folder.mkdir(parents=True, exist_ok=True)
                self._record = open(folder / f"train-windows-rank{self.rank}.txt", "a", buffering=1)
            self._record.write(f"{i}\n")
        return self._ds[int(i)]
