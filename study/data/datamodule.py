"""The DataModule: the training and validation windows every variant shares, for Lightning.

Train batches follow :class:`~study.data.loader.WindowSampler` (the same windows per optimizer step on
any world size, resumed from the Trainer's global step); validation batches are the fixed windows of
:func:`~study.data.loader.fixed_val_windows`.  This is the one module of ``study.data`` that imports
Lightning; the others report configuration and data errors before it loads.
"""
from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch

from study.data import DataError
from study.data.loader import ORDER_VERSION, WindowDataset, WindowSampler, fixed_val_windows
from study.data.records import read_meta


class TokenDataModule(pl.LightningDataModule):
    """Windows of (block_size + 1) tokens from litdata chunks; the same for every variant and world size.

    Train batches are (B, block_size + 1) uint16/int32 token tensors, B = ``micro_batch_size`` windows
    per rank, in the order of :class:`WindowSampler`: a permutation of all windows of the training split,
    window by window, fixed by ``data_seed`` (the same batches for every variant), each optimizer step
    training on the same ``global_batch`` windows (= micro_batch_size x accumulation x world size) on 1
    or N devices, resumed from the Trainer's global step.
    Validation batches are (tokens (B, block_size + 1), corpus index (B,)): ``n_val_windows`` windows
    spread evenly over the validation split, read once; the same at every evaluation of every run, every
    rank evaluates all of them.  ``corpora`` names the corpus indices (meta.json ``corpus_tokens``).
    """

    def __init__(self, data_dir: str | Path, block_size: int, micro_batch_size: int, data_seed: int,
                 n_val_windows: int, val_micro_batch_size: int, global_batch: int | None = None):
        super().__init__()
        self.data_dir = Path(data_dir)
        self.block_size, self.micro_batch_size, self.data_seed = block_size, micro_batch_size, data_seed
        self.global_batch = global_batch or micro_batch_size
        self.n_val_windows, self.val_micro_batch_size = n_val_windows, val_micro_batch_size
        meta = read_meta(self.data_dir)
        self.corpus_tokens = meta.get("corpus_tokens", {}).get("val") or [["all", meta["tokens"]["val"]]]
        self.corpora = [name for name, _ in self.corpus_tokens]
        self._val = None

    def _global_step(self) -> int:
        trainer = getattr(self, "trainer", None)
        return trainer.global_step if trainer is not None else 0

    def train_dataloader(self):
        trainer = getattr(self, "trainer", None)
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        window = self.block_size + 1
        dataset = WindowDataset(self.data_dir / "train", window, rank)
        sampler = WindowSampler(len(dataset), self.global_batch, self.micro_batch_size, world, rank, self.data_seed,
                                start_step=self._global_step)
        return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=0)

    def val_windows(self):
        """The fixed validation set: (windows (n_val, block_size + 1), corpus index (n_val,))."""
        return fixed_val_windows(self.data_dir, self.block_size, self.n_val_windows, self.corpus_tokens)

    def val_dataloader(self):
        """Every rank evaluates all windows (the Trainer runs with use_distributed_sampler=False)."""
        if self._val is None:
            self._val = torch.utils.data.TensorDataset(*self.val_windows())
        return torch.utils.data.DataLoader(self._val, batch_size=self.val_micro_batch_size, shuffle=False)

    def state_dict(self) -> dict:
        return {"order": ORDER_VERSION, "data_seed": self.data_seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("order") != ORDER_VERSION or state.get("data_seed") != self.data_seed:
            raise DataError("the checkpoint was written with another training-data order (study/data/loader.py or "
                            "train.data_seed changed): delete the run's checkpoints/ folder to start the run afresh")
