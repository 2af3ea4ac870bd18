"""A Hugging Face dataset as the corpus (``data.source=hf``).

OpenWebText, the paper's corpus, by hub name on a connected machine, or a local parquet/arrow
copy: ``data.source=hf data.hf_dataset=NAME_OR_PATH`` (:func:`load_hf_dataset`).  Its rows are the
documents, in row order; they are tokenised by ``data.num_proc`` processes with ``Dataset.map``
(:func:`tokenize_hf`) and never held in memory as a whole.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from study.config import DataConfig
from study.data import DataError
from study.data.corpora import Document, is_val_index
from study.data.tokenizers import Tokenizer, make_tokenizer

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


def read_hf_documents(cfg: DataConfig) -> list[Document]:
    """Every row of the configured Hugging Face split as a Document (id :func:`hf_doc_id`), in row order.

    Small datasets only: every text is held in memory (``prepare`` streams instead).
    """
    ds, src = load_hf_dataset(cfg)
    return [Document(hf_doc_id(cfg.hf_split, i, len(ds)), text or "", Path(src.name))
            for i, text in enumerate(ds[cfg.hf_text_field])]


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
    tokenizer once (``gpt2``: tiktoken, offline; ``bytes``, ``bpe``: the tokenizer.json at ``tokenizer_path``)."""
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
                             "tokenizer_path": str(tokenizer_path) if tok.name != "gpt2" else None},
                  cache_file_name=str(cache_file), desc=f"tokenizing ({tok.name}, {n} processes)")

