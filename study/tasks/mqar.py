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
(:func:`data_dir`: test.npz and meta.json, its sha256 checked on every read); it is the validation
of every run.  The training set (``task.train_examples``) is a function of the data seed, read in the order of
:class:`study.data.loader.WindowSampler` (a permutation per epoch, resumable).  Loss (nats) and accuracy
(argmax = value) are means over the query positions.  Yardstick: chance among the values, ln(V - V/2) nats.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import lightning.pytorch as pl

from study.config import ConfigError, embedding_rows
from study.data import DataError
from study.data.loader import ORDER_VERSION, WindowSampler
from study.tasks.common import IGNORE, fmt, yardstick_paragraph

CAUSAL = True
LABELLED = True
METRICS = ("val_loss", "val_accuracy")
#: what the no-context arm (each position attends to itself only) can still do
NO_CONTEXT = "no value can be recalled: at best chance"
#: the generator's version: part of the data folder's name, so a changed generator never reuses a test set
GENERATOR = "zoology-mqar-v1"


@dataclass
class Settings:
    """Zoology's sizes (values in conf/task/mqar.yaml, chosen by measurement: docs/tasks.md)."""
    vocab_size: int  # token ids; keys from [1, V/2), values from [V/2, V); the model's vocabulary
    seq_len: Optional[int]  # tokens per example (None: model.block_size)
    num_kv_pairs: int  # key-value pairs per example, each key queried once
    power_a: float  # query gaps ~ a g^(a-1) (Zoology's power law)
    random_non_queries: bool  # the filler between queries is random tokens (Zoology's default)
    train_examples: int  # the training set, a function of the data seed
    test_examples: int  # the fixed test set (the validation of every run), kept with the data
    test_seed: int  # the test set's seed (its generator is keyed "test", the training set's "train")


def seq_len(cfg) -> int:
    """Tokens per example: ``task.seq_len``, or ``model.block_size`` when it is null."""
    return int(cfg.task.seq_len) if cfg.task.seq_len is not None else int(cfg.model.block_size)


def check(cfg) -> None:
    """Sizes Zoology's generator accepts.

    Raises:
        ConfigError: one line naming the key and the fix.
    """
    k, n = cfg.task, seq_len(cfg)
    if n > cfg.model.block_size or n % 2 or n <= 0:
        raise ConfigError(f"task.seq_len={n} must be even, positive and at most model.block_size="
                          f"{cfg.model.block_size}")
    if k.vocab_size <= n:
        raise ConfigError(f"task.vocab_size={k.vocab_size} must exceed the sequence length {n} (Zoology's rule)")
    if k.num_kv_pairs < 1 or 4 * k.num_kv_pairs > n:
        raise ConfigError(f"task.num_kv_pairs={k.num_kv_pairs}: 4 x pairs must fit the sequence length {n} "
                          f"(pairs, then as many query slots): choose 1..{n // 4}")
    if k.num_kv_pairs >= k.vocab_size // 2 - 1:
        raise ConfigError(f"task.num_kv_pairs={k.num_kv_pairs} needs more distinct keys than [1, "
                          f"{k.vocab_size // 2}) holds: raise task.vocab_size")
    if not k.power_a > 0:
        raise ConfigError(f"task.power_a={k.power_a} must be > 0 (1.0: uniform gaps)")
    for key in ("train_examples", "test_examples"):
        if k[key] < 1:
            raise ConfigError(f"task.{key}={k[key]} must be a positive integer")


def spec(cfg) -> dict:
    """What fixes the test set: its sizes, generator and seed (the training set adds the data seed)."""
    k = cfg.task
    return {"generator": GENERATOR, "vocab_size": int(k.vocab_size), "seq_len": seq_len(cfg),
            "num_kv_pairs": int(k.num_kv_pairs), "power_a": float(k.power_a),
            "random_non_queries": bool(k.random_non_queries), "test_examples": int(k.test_examples),
            "test_seed": int(k.test_seed)}


def data_dir(cfg, root: Path) -> Path:
    """``data/mqar/V{vocab}-L{len}-P{pairs}-{sha}`` beside ``data.dir``: where the fixed test set is kept
    (:func:`check_data` writes it once); its meta.json is in the resume key."""
    sp = spec(cfg)
    sha = hashlib.sha256(json.dumps(sp, sort_keys=True).encode()).hexdigest()[:12]
    name = f"V{sp['vocab_size']}-L{sp['seq_len']}-P{sp['num_kv_pairs']}-{sha}"
    return (Path(root) / cfg.data.dir).parent / "mqar" / name


def val_examples(cfg) -> int:
    """Validation examples of a run: the kept test set."""
    return int(cfg.task.test_examples)


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
    """The fixed test set of ``cfg``'s sizes, written once into :func:`data_dir` (test.npz and
    meta.json, atomically) and checked on every read against the sha256 in meta.json; returns meta.json.

    Raises:
        DataError: test.npz disagrees with its meta.json (corrupt: delete the folder to write it again).
    """
    folder, sp = data_dir(cfg, root), spec(cfg)
    if not (folder / "meta.json").is_file():
        inputs, targets = _from_spec(sp, sp["test_examples"], test_key(sp))
        tmp = folder.with_name(f".{folder.name}.{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        np.savez(tmp / "test.npz", inputs=inputs, targets=targets)
        meta = {"tokenizer": "mqar", "vocab_size": sp["vocab_size"], "spec": sp,
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
    return MQARDataModule(data_dir(cfg, root), spec(cfg), int(cfg.task.train_examples), micro, data_seed,
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


def report_text(settings: dict) -> dict:
    """comparison.md's words for this task (see :func:`study.tasks.lm.report_text`)."""
    s = settings
    return {"ids": f"task.vocab_size {s.get('task.vocab_size', 'n/a')}", "losses": "", "corpus_yardsticks": (),
            "lines": [f"Task `mqar` (multi-query associative recall): V {s.get('task.vocab_size')}, "
                      f"{s.get('task.num_kv_pairs')} key-value pairs in "
                      f"{s.get('task.seq_len') or s.get('model.block_size')} tokens; every run is scored on the same "
                      f"fixed test set of {s.get('task.test_examples')} examples "
                      f"(task.test_seed {s.get('task.test_seed')}), the losses (nats) at the query positions only; "
                      f"accuracy is the share of queries whose most likely token is the value "
                      f"(mean over seeds, Student-t 95% interval). The verdict is on the loss.", ""]}


def yardstick_lines(y: dict) -> list[str]:
    """The yardstick the runs recorded (summary.json "yardsticks") in one paragraph, or why none is shown."""
    return yardstick_paragraph(y, f"Yardstick: chance, a uniform guess among the V - V/2 values at each query, "
                                  f"{fmt(y.get('chance'))} nats and accuracy {fmt(y.get('chance_accuracy'))}: a model "
                                  f"below it in loss (above in accuracy) recalls values from its context.")
