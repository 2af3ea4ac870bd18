"""Task ``mlm``: masked language modelling on the prepared windows, the same GPT blocks with bidirectional
attention (BERT, arXiv 1810.04805, section 3.1 and appendix A.1).

Of each window's first block_size tokens, round(``task.mask_fraction`` x block_size) are chosen (BERT's
create_pretraining_data: a fixed count, positions uniform without replacement); each chosen token is replaced by
the mask token with probability ``task.mask_token_fraction`` (0.8), by a uniform random token of the tokenizer's
vocabulary with ``task.random_token_fraction`` (0.1), else kept (0.1).  The loss (nats) is the cross-entropy of
the chosen tokens only, their mean over all chosen tokens of a batch; the mask token is the id after the
tokenizer's vocabulary (meta.json ``vocab_size``), so the embedding has V + 1 rows (rounded up to
``model.vocab_multiple``).

Masks are static, as BERT's: a training window's mask is drawn from a generator keyed by (data seed, the window's
index in the split), so every arm of a seed reads the same masked windows in the same order, on any world size
and after a resume; a validation window's mask is keyed by its place in the fixed validation set alone, so every
arm and seed is scored on identical masks.  Yardstick: the unigram cross-entropy (add-k counts of the training
split) of the chosen validation tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from study.config import ConfigError, embedding_rows
from study.data.datamodule import TokenDataModule
from study.tasks.common import IGNORE, fmt, keyed_generator, yardstick_paragraph
from study.tasks import lm

CAUSAL = False
LABELLED = True
METRICS = ("val_loss", "val_accuracy")
#: what the no-context arm (each position attends to itself only) can still do
NO_CONTEXT = ("a chosen token sees only itself: the mask token (80%), else its own token or a random one, which it "
              "can copy: below the unigram yardstick without context")
check_data, config_ids, data_dir, val_examples = lm.check_data, lm.config_ids, lm.data_dir, lm.val_examples


@dataclass
class Settings:
    """BERT's masking (arXiv 1810.04805, appendix A.1: 0.15, 0.8, 0.1), values in conf/task/mlm.yaml."""
    mask_fraction: float  # tokens chosen per window: round(fraction x block_size) of them
    mask_token_fraction: float  # of the chosen, replaced by the mask token
    random_token_fraction: float  # of the chosen, replaced by a uniform random token (the rest kept)


def check(cfg) -> None:
    """Fractions in [0, 1], the mask and random shares at most 1 together, at least one token chosen per window.

    Raises:
        ConfigError: one line naming the key and the fix.
    """
    k = cfg.task
    for key in ("mask_fraction", "mask_token_fraction", "random_token_fraction"):
        if not 0.0 <= k[key] <= 1.0:
            raise ConfigError(f"task.{key}={k[key]} must lie in [0, 1]")
    if k.mask_token_fraction + k.random_token_fraction > 1.0:
        raise ConfigError(f"task.mask_token_fraction + task.random_token_fraction = "
                          f"{k.mask_token_fraction + k.random_token_fraction:g} > 1: lower one (BERT: 0.8 + 0.1)")
    if round(k.mask_fraction * cfg.model.block_size) < 1:
        raise ConfigError(f"task.mask_fraction={k.mask_fraction} chooses no token of a window of "
                          f"model.block_size={cfg.model.block_size}: raise it")


def mask_id(meta: dict) -> int:
    """The mask token: the first id after the tokenizer's vocabulary."""
    return int(meta["vocab_size"])


def model_vocab(cfg, meta: dict) -> int:
    """Rows of the embedding: the tokenizer's vocabulary + 1 (room for the mask token) rounded up to a multiple of
    ``model.vocab_multiple``."""
    return embedding_rows(mask_id(meta) + 1, cfg.model.vocab_multiple)


def mask_window(tokens: torch.Tensor, key: str, vocab: int, mask: int, fraction: float = 0.15,
                to_mask: float = 0.8, to_random: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking of one window, from a generator keyed by ``key`` (the same key, the same mask).

    Args:
        tokens: (T,) int64 token ids.  vocab: ids of the tokenizer (random replacements from [0, vocab)).
        mask: the mask token's id.  fraction: share of the T tokens chosen (round(fraction x T) of them).
        to_mask, to_random: of the chosen, the probability of the mask token and of a random token (else kept).

    Returns:
        (inputs (T,) int64: the window with the chosen tokens replaced; targets (T,) int64: the original token at
        chosen positions, :data:`study.tasks.IGNORE` elsewhere).
    """
    g = keyed_generator(key)
    T = tokens.numel()
    chosen = torch.randperm(T, generator=g)[:round(fraction * T)]  # (n,) positions
    u = torch.rand(chosen.numel(), generator=g)  # (n,): < to_mask -> mask, < to_mask + to_random -> random
    rnd = torch.randint(vocab, (chosen.numel(),), generator=g)  # (n,)
    original = tokens[chosen]
    replaced = torch.where(u < to_mask, torch.full_like(original, mask),
                           torch.where(u < to_mask + to_random, rnd, original))
    inputs, targets = tokens.clone(), torch.full_like(tokens, IGNORE)
    inputs[chosen], targets[chosen] = replaced, original
    return inputs, targets


def _masker(cfg, meta: dict):
    k = cfg.task
    return lambda tokens, key: mask_window(tokens, key, int(meta["vocab_size"]), mask_id(meta), k.mask_fraction,
                                           k.mask_token_fraction, k.random_token_fraction)


def val_key(j: int) -> str:
    """The mask key of the j-th fixed validation window: no seed, so identical for every arm and seed."""
    return f"mlm/val/{j}"


def train_key(data_seed: int, i: int) -> str:
    """The mask key of training window ``i`` (its index in the split) under ``data_seed``."""
    return f"mlm/train/{data_seed}/{i}"


def masked_val(windows: torch.Tensor, masker) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed validation windows (n_val, T + 1) masked once: (inputs (n_val, T), targets (n_val, T))."""
    pairs = [masker(w[:-1].long(), val_key(j)) for j, w in enumerate(windows)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


class MaskedWindows(torch.utils.data.Dataset):
    """Training window ``i`` of a :class:`study.data.loader.WindowDataset`, its first T tokens masked:
    (inputs (T,), targets (T,)) int64, the mask keyed by (data seed, i)."""

    def __init__(self, windows, masker, data_seed: int):
        self.windows, self.masker, self.data_seed = windows, masker, data_seed

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int):
        tokens = torch.as_tensor(np.asarray(self.windows[i]), dtype=torch.int64)[:-1]  # (T + 1,) -> (T,)
        return self.masker(tokens, train_key(self.data_seed, int(i)))


class MaskedDataModule(TokenDataModule):
    """:class:`TokenDataModule` with BERT's masks: train batches [inputs (B, T), targets (B, T)], validation
    batches [inputs, targets, corpus index (B,)] on the fixed windows, masked once."""

    def __init__(self, *args, masker=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.masker = masker

    def train_dataloader(self):
        plain = super().train_dataloader()  # the same windows in the same order as lm
        return torch.utils.data.DataLoader(MaskedWindows(plain.dataset, self.masker, self.data_seed),
                                           batch_sampler=plain.batch_sampler, num_workers=0)

    def val_dataloader(self):
        if self._val is None:
            windows, corpus = self.val_windows()
            self._val = torch.utils.data.TensorDataset(*masked_val(windows, self.masker), corpus)
        return torch.utils.data.DataLoader(self._val, batch_size=self.val_micro_batch_size, shuffle=False)


def datamodule(cfg, root: Path, meta: dict, micro: int, data_seed: int, n_val: int, val_micro: int,
               global_batch: int) -> MaskedDataModule:
    return MaskedDataModule(root / cfg.data.dir, cfg.model.block_size, micro, data_seed, n_val, val_micro,
                            global_batch=global_batch, masker=_masker(cfg, meta))


def split(batch):
    """[inputs (B, T), targets (B, T), (corpus (B,))] -> (inputs, targets) int64."""
    return batch[0].long(), batch[1].long()


def tokens(batch) -> int:
    """Positions of a batch: B x T (all of them are read; the chosen ones are scored)."""
    return batch[0].numel()


def split_unigram_counts(split_dir: Path, vocab: int) -> np.ndarray:
    """Token counts (vocab,) int64 of a litdata token split, every chunk read as a memmap (after litdata's header:
    a uint32 item count n and n + 1 uint32 offsets, the first where the tokens start)."""
    from study.data.records import token_dtype, read_index

    index = read_index(split_dir)
    dtype, counts = token_dtype(split_dir, index), np.zeros(vocab, dtype=np.int64)
    for chunk in index["chunks"]:
        path = split_dir / chunk["filename"]
        start = int(np.fromfile(path, dtype=np.uint32, count=2)[1])
        counts += np.bincount(np.memmap(path, dtype=dtype, mode="r", offset=start, shape=(chunk["dim"],)),
                              minlength=vocab)[:vocab]
    return counts


def yardsticks(cfg, root: Path, meta: dict) -> dict:
    """``{"unigram": nats}``: the cross-entropy of the chosen validation tokens under the add-k unigram model of the
    training split (k: the one the prepare stage chose for the lm yardstick, else 1), and the share of those
    tokens the mask token replaced."""
    from study.data.loader import fixed_val_windows

    data_dir = root / cfg.data.dir
    vocab = int(meta["vocab_size"])
    k = float(((meta.get("yardsticks") or {}).get("k") or {}).get("unigram", 1.0))
    counts = split_unigram_counts(data_dir / "train", vocab).astype(np.float64)
    logp = np.log((counts + k) / (counts.sum() + k * vocab))
    windows, _ = fixed_val_windows(data_dir, cfg.model.block_size, cfg.train.val_tokens // cfg.model.block_size)
    inputs, targets = masked_val(windows, _masker(cfg, meta))
    chosen = targets != IGNORE
    return {"unigram": round(float(-logp[targets[chosen].numpy()].mean()), 6),
            "masked_share": round(float((inputs[chosen] == mask_id(meta)).float().mean()), 6),
            "chosen_tokens": int(chosen.sum()), "k": k,
            "method": "add-k unigram counts of the training split; mean cross-entropy of the chosen validation tokens"}


def report_text(settings: dict) -> dict:
    """comparison.md's words for this task (see :func:`study.tasks.lm.report_text`)."""
    return {**lm.report_text(settings), "losses": "", "corpus_yardsticks": (), "lines": [
        f"Task `mlm` (masked language modelling, bidirectional attention): the losses are the cross-entropy of the "
        f"chosen tokens only, in nats (task.mask_fraction {settings.get('task.mask_fraction')} of each of the same "
        f"fixed validation windows, the same masks for every run and seed); accuracy is the share of them whose most "
        f"likely token is the original (mean over seeds, Student-t 95% interval). The verdict is on the loss.", ""]}


def yardstick_lines(y: dict) -> list[str]:
    """The yardstick the runs recorded (summary.json "yardsticks") in one paragraph, or why none is shown."""
    return yardstick_paragraph(y, f"Yardstick: the unigram cross-entropy of the chosen validation tokens, "
                                  f"{fmt(y.get('unigram'))} nats ({y.get('method')}; {y.get('chosen_tokens')} tokens, "
                                  f"{fmt(y.get('masked_share'), '.3f')} of them replaced by the mask token): a model "
                                  f"below it uses the context around each chosen token.")
