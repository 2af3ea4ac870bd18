"""Task ``mqar``: multi-query associative recall as Zoology defines it (Arora, Eyuboglu et al., arXiv 2312.04927;
the generator ``multiquery_ar`` of HazyResearch/zoology, zoology/data/multiquery_ar.py, with one pass).

An example of L tokens (``task.seq_len``) lists P key-value pairs (``task.num_kv_pairs``: keys distinct, from
[1, V/2); values distinct, from [V/2, V); V = ``task.vocab_size``), then queries every key once more: key i
sits at position 2P + 2 g_i of the rest, the gaps g distinct, drawn without replacement with probability
proportional to a g^(a-1) over g = 1..(L - 2P)/2 (a = ``task.power_a``; Zoology draws index g - 1 with that
weight, as here).  The target at a query position is the value that followed its key; every other position is
unscored (:data:`study.tasks.IGNORE`); the remaining tokens are 0, or with ``task.random_non_queries`` uniform
ids of [0, V).  Zoology draws with ``np.random.choice(replace=False)``; here the same distributions come from
one ``numpy.random.Generator`` (keys and values: a uniform permutation's first P; gaps: Efraimidis-Spirakis
weighted sampling without replacement, the P largest u^(1/w)), vectorised over examples.

The test set (``task.test_examples``, from ``task.test_seed``) is generated once and kept with the data
(``study.config.task_data_dir``: test.npz and meta.json, its sha256 checked on every read); it is the validation
of every run.  The training set (``task.train_examples``) is a function of the data seed, read in the order of
:class:`study.data.loader.WindowSampler` (a permutation per epoch, resumable).  Loss (nats) and accuracy
(argmax = value) are means over the query positions.  Yardstick: chance among the values, ln(V - V/2) nats.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
import lightning.pytorch as pl

from study.config import embedding_rows, mqar_spec, task_data_dir  # noqa: F401 (task_data_dir: where check_data writes)
from study.data import DataError
from study.data.loader import ORDER_VERSION, WindowSampler
from study.tasks.common import IGNORE

CAUSAL = True
LABELLED = True
METRICS = ("val_loss", "val_accuracy")


def rng(key: str) -> np.random.Generator:
    """A numpy Generator seeded by sha256(``key``)."""
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))


def generate(n: int, seq_len: int, vocab: int, pairs: int, power_a: float, random_non_queries: bool,
             gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` MQAR examples: (inputs (n, seq_len) int64, targets (n, seq_len) int64, IGNORE off the queries)."""
    context = 2 * pairs
    half = vocab // 2
    keys = 1 + np.argsort(gen.random((n, half - 1)), axis=1)[:, :pairs]  # (n, P) distinct ids of [1, V/2)
    values = half + np.argsort(gen.random((n, vocab - half)), axis=1)[:, :pairs]  # (n, P) distinct of [V/2, V)
    kvs = np.zeros((n, context), dtype=np.int64)  # (n, 2P): k0 v0 k1 v1 ...
    kvs[:, 0::2], kvs[:, 1::2] = keys, values
    space = (seq_len - context) // 2
    w = power_a * np.arange(1, space + 1) ** (power_a - 1)  # (space,): Zoology's power law, unnormalised
    gaps = np.argsort(-np.log(gen.random((n, space))) / w, axis=1)[:, :pairs]  # (n, P): P largest u^(1/w)
    queries = np.zeros((n, seq_len - context + 1), dtype=np.int64)
    np.put_along_axis(queries, 2 * gaps, keys, axis=1)
    examples = np.concatenate([kvs, queries], axis=1)  # (n, seq_len + 1)
    labels = np.full((n, seq_len + 1), IGNORE, dtype=np.int64)
    np.put_along_axis(labels, 2 * gaps + context + 1, values, axis=1)
    inputs, targets = examples[:, :-1].copy(), labels[:, 1:].copy()  # (n, seq_len) each: the query key -> value
    if random_non_queries:
        filler = gen.integers(0, vocab, size=inputs.shape)
        inputs[inputs == 0] = filler[inputs == 0]
    return inputs, targets


def _from_spec(spec: dict, n: int, key: str) -> tuple[np.ndarray, np.ndarray]:
    return generate(n, spec["seq_len"], spec["vocab_size"], spec["num_kv_pairs"], spec["power_a"],
                    spec["random_non_queries"], rng(key))


def test_key(spec: dict) -> str:
    return f"mqar/test/{spec['test_seed']}"


def train_key(data_seed: int) -> str:
    return f"mqar/train/{data_seed}"


def check_data(cfg, root: Path) -> dict:
    """The fixed test set of ``cfg``'s sizes, written once into :func:`study.config.task_data_dir` (test.npz and
    meta.json, atomically) and checked on every read against the sha256 in meta.json; returns meta.json.

    Raises:
        DataError: test.npz disagrees with its meta.json (corrupt: delete the folder to write it again).
    """
    folder, spec = task_data_dir(cfg, root), mqar_spec(cfg)
    if not (folder / "meta.json").is_file():
        inputs, targets = _from_spec(spec, spec["test_examples"], test_key(spec))
        tmp = folder.with_name(f".{folder.name}.{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        np.savez(tmp / "test.npz", inputs=inputs, targets=targets)
        meta = {"tokenizer": "mqar", "vocab_size": spec["vocab_size"], "spec": spec,
                "test_sha256": hashlib.sha256((tmp / "test.npz").read_bytes()).hexdigest(),
                "query_positions": int((targets != IGNORE).sum())}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            tmp.rename(folder)  # atomic; another process that got there first wins
        except OSError:
            for p in tmp.iterdir():
                p.unlink()
            tmp.rmdir()
    meta = json.loads((folder / "meta.json").read_text())
    if hashlib.sha256((folder / "test.npz").read_bytes()).hexdigest() != meta.get("test_sha256"):
        raise DataError(f"{folder}/test.npz does not match the sha256 of its meta.json: delete {folder} "
                        f"(it is written again from task.test_seed)")
    return meta


def test_set(root_or_folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept test set: (inputs (n, L), targets (n, L)) int64."""
    with np.load(Path(root_or_folder) / "test.npz") as z:
        return torch.from_numpy(z["inputs"]), torch.from_numpy(z["targets"])


def config_ids(cfg) -> int:
    """``task.vocab_size``: the generator's ids."""
    return int(cfg.task.vocab_size)


def model_vocab(cfg, meta: dict) -> int:
    """``task.vocab_size`` (meta.json's): the model's embedding has exactly the task's ids (rounded up to a
    multiple of ``model.vocab_multiple``)."""
    return embedding_rows(meta["vocab_size"], cfg.model.vocab_multiple)


class MQARDataModule(pl.LightningDataModule):
    """Train batches [inputs (B, L), targets (B, L)] of the data seed's training set in :class:`WindowSampler`'s
    order; validation batches the same of the kept test set (every rank evaluates all of it)."""

    def __init__(self, folder: Path, spec: dict, train_examples: int, micro: int, data_seed: int,
                 val_micro: int, global_batch: int):
        super().__init__()
        self.folder, self.spec, self.train_examples = Path(folder), spec, train_examples
        self.micro, self.data_seed, self.val_micro, self.global_batch = micro, data_seed, val_micro, global_batch
        self.corpora = []
        self._train = self._val = None

    def train_dataloader(self):
        trainer = getattr(self, "trainer", None)
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if self._train is None:
            inputs, targets = _from_spec(self.spec, self.train_examples, train_key(self.data_seed))
            self._train = torch.utils.data.TensorDataset(torch.from_numpy(inputs), torch.from_numpy(targets))
        sampler = WindowSampler(self.train_examples, self.global_batch, self.micro, world, rank, self.data_seed,
                                start_step=lambda: trainer.global_step if trainer is not None else 0)
        return torch.utils.data.DataLoader(self._train, batch_sampler=sampler, num_workers=0)

    def val_dataloader(self):
        if self._val is None:
            self._val = torch.utils.data.TensorDataset(*test_set(self.folder))
        return torch.utils.data.DataLoader(self._val, batch_size=self.val_micro, shuffle=False)

    def state_dict(self) -> dict:
        return {"order": ORDER_VERSION, "data_seed": self.data_seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("order") != ORDER_VERSION or state.get("data_seed") != self.data_seed:
            raise DataError("the checkpoint was written with another training order: delete the run's checkpoints/")


def datamodule(cfg, root: Path, meta: dict, micro: int, data_seed: int, n_val: int, val_micro: int,
               global_batch: int) -> MQARDataModule:
    return MQARDataModule(task_data_dir(cfg, root), mqar_spec(cfg), int(cfg.task.train_examples), micro, data_seed,
                          val_micro, global_batch)


def split(batch):
    """[inputs (B, L), targets (B, L)] -> (inputs, targets) int64."""
    return batch[0].long(), batch[1].long()


def tokens(batch) -> int:
    """Positions of a batch: B x L."""
    return batch[0].numel()


def yardsticks(cfg, root: Path, meta: dict) -> dict:
    """Chance at a query: a uniform guess among the V - V/2 values, ln(V - V/2) nats and accuracy 1/(V - V/2)."""
    n = int(cfg.task.vocab_size) - int(cfg.task.vocab_size) // 2
    return {"chance": round(math.log(n), 6), "chance_accuracy": round(1.0 / n, 6),
            "method": "a uniform guess among the values at each query position"}
