"""The prepared data on disk (``data.dir``): meta.json, its digest, the chunks, the checks.

:func:`check_prepared` refuses prepared data that do not match a run's config (settings,
vocabulary, token counts and ids of the chunks themselves); :func:`data_digest` is the data's
identity in the resume key and each run's config.json.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from study.config import DataConfig
from study.data import DataError


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
    meta = dict(read_meta(Path(data_dir), check=False))  # identity only: train checks the fields first
    meta.pop("seconds", None)  # wall-clock time of older prepares
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]


PREPARE_FIX = "re-run `python -m study.prepare` (or `dvc repro prepare`)"


def json_kind(v) -> str:
    """How a JSON value reads in an error: null, a string, a list, an object, a number, true/false (a NaN or
    infinity: a non-finite number)."""
    if v is None:
        return "null"
    if isinstance(v, float) and not math.isfinite(v):
        return "a non-finite number"
    return {bool: "true/false", str: "a string", list: "a list", dict: "an object"}.get(type(v), "a number")


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def corrupt_field(path: Path, field: str, v, want: str) -> DataError:
    """The one-line error for field ``field`` of a prepared-data file holding ``v`` where ``want`` belongs."""
    got = "missing" if v is MISSING else f"{json_kind(v)} ({json.dumps(v)[:40]})"
    return DataError(f"{path}: field {field!r} is {got}, expected {want}: the prepared data are corrupt; "
                     f"{PREPARE_FIX}")


MISSING = object()


def _check_meta(path: Path, meta) -> dict:
    """Refuse a meta.json whose fields that training and compare read have the wrong type (DataError
    naming the file and the field): tokenizer (string), vocab_size (count > 0), tokens.train/val
    (counts), and where present corpus_tokens ({split: [[name, count], ...]}), prepared_with,
    chunks_sha256 and yardsticks (objects)."""
    if not isinstance(meta, dict):
        raise DataError(f"{path} holds {json_kind(meta)}, not a JSON object: the prepared data are corrupt; {PREPARE_FIX}")
    tokenizer = meta.get("tokenizer", MISSING)
    if not isinstance(tokenizer, str):
        raise corrupt_field(path, "tokenizer", tokenizer, "the tokenizer's name")
    vocab = meta.get("vocab_size", MISSING)
    if not (_is_count(vocab) and vocab > 0):
        raise corrupt_field(path, "vocab_size", vocab, "a positive integer")
    tokens = meta.get("tokens", MISSING)
    if not isinstance(tokens, dict):
        raise corrupt_field(path, "tokens", tokens, "an object {\"train\": N, \"val\": N}")
    for split in ("train", "val"):
        if not _is_count(tokens.get(split, MISSING)):
            raise corrupt_field(path, f"tokens.{split}", tokens.get(split, MISSING), "a token count (integer >= 0)")
    for key in ("corpus_tokens", "prepared_with", "chunks_sha256", "yardsticks"):
        if key in meta and not isinstance(meta[key], dict):
            raise corrupt_field(path, key, meta[key], "an object")
    for split, runs in meta.get("corpus_tokens", {}).items():
        if not isinstance(runs, list):
            raise corrupt_field(path, f"corpus_tokens.{split}", runs, "a list of [corpus, tokens] pairs")
        for i, run in enumerate(runs):
            if not (isinstance(run, list) and len(run) == 2 and isinstance(run[0], str) and _is_count(run[1])):
                raise corrupt_field(path, f"corpus_tokens.{split}[{i}]", run, "a [corpus, tokens] pair")
    for name, digest in meta.get("chunks_sha256", {}).items():
        if not isinstance(digest, str):
            raise corrupt_field(path, f"chunks_sha256.{name}", digest, "a sha256 hex string")
    return meta


def read_meta(data_dir: Path, check: bool = True) -> dict:
    """data/tokens/meta.json, checked (:func:`_check_meta`; ``check=False``: only that it is a JSON object),
    or a DataError that names the file (and the field) and says to run the prepare stage."""
    path = Path(data_dir) / "meta.json"
    above = Path(data_dir)
    while not above.exists() and above != above.parent:
        above = above.parent
    if above.exists() and not above.is_dir():  # data.dir (or a folder above it) is a file
        raise DataError(f"data.dir={data_dir} is {'a file' if above == Path(data_dir) else 'below the file ' + str(above)}"
                        f", not the folder of prepared data: point data.dir at the folder `python -m study.prepare` "
                        f"writes (data/tokens)")
    if not path.is_file():
        raise DataError(f"{path} not found: prepare the data first with `python -m study.prepare "
                        f"data.dir={data_dir}` and this run's other data.* settings (or `dvc repro prepare`)")
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}): the prepared data are corrupt; {PREPARE_FIX}") from e
    if not check and not isinstance(meta, dict):
        raise DataError(f"{path} holds {json_kind(meta)}, not a JSON object: the prepared data are corrupt; {PREPARE_FIX}")
    return _check_meta(path, meta) if check else meta


def read_index(split_dir: Path) -> dict:
    """A litdata split's index.json, checked: ``chunks`` a list of objects with ``filename`` (string),
    ``chunk_bytes`` and ``dim`` (counts).

    Raises:
        DataError: missing, not JSON, or a field of the wrong type (names the file and the field).
    """
    index_path = Path(split_dir) / "index.json"
    if not index_path.is_file():
        raise DataError(f"{index_path} not found: {PREPARE_FIX}")
    try:
        index = json.loads(index_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{index_path} is not valid JSON ({e}): the prepared data are corrupt; {PREPARE_FIX}") from e
    if not isinstance(index, dict):
        raise DataError(f"{index_path} holds {json_kind(index)}, not a JSON object: the prepared data are corrupt; "
                        f"{PREPARE_FIX}")
    chunks = index.get("chunks", MISSING)
    if not isinstance(chunks, list):
        raise corrupt_field(index_path, "chunks", chunks, "a list of chunk entries")
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict):
            raise corrupt_field(index_path, f"chunks[{i}]", chunk, "an object")
        if not isinstance(chunk.get("filename", MISSING), str):
            raise corrupt_field(index_path, f"chunks[{i}].filename", chunk.get("filename", MISSING), "a file name")
        for key in ("chunk_bytes", "dim"):
            if not _is_count(chunk.get(key, MISSING)):
                raise corrupt_field(index_path, f"chunks[{i}].{key}", chunk.get(key, MISSING), "an integer >= 0")
        # chunk_size: the items in the chunk, whose header (a count and chunk_size + 1 offsets, uint32)
        # litdata's TokensLoader skips by it; a wrong one overflows inside the DataLoader mid-run
        size = chunk.get("chunk_size", MISSING)
        if not (_is_count(size) and size >= 1 and (size + 2) * 4 <= chunk["chunk_bytes"]):
            raise corrupt_field(index_path, f"chunks[{i}].chunk_size", size,
                                f"an integer >= 1 whose header, {'(chunk_size + 2) * 4'} bytes, fits the chunk's "
                                f"chunk_bytes {chunk['chunk_bytes']}")
    return index


def chunk_token_count(split_dir: Path) -> int:
    """Tokens in a litdata split, read from the chunk files themselves (not from index.json).

    Raises:
        DataError: missing index, missing chunk, or a chunk whose size disagrees with its index entry.
    """
    total = 0
    for chunk in read_index(split_dir)["chunks"]:
        path = split_dir / chunk["filename"]
        if not path.is_file():
            raise DataError(f"{path} is missing: re-run `python -m study.prepare`")
        size = path.stat().st_size
        if size != chunk["chunk_bytes"]:
            raise DataError(f"{path} is corrupt or truncated ({size} bytes, index says "
                            f"{chunk['chunk_bytes']}): re-run `python -m study.prepare`")
        total += chunk["dim"]
    return total


def token_dtype(split_dir: Path, index: dict) -> np.dtype:
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
    config = index.get("config")
    raise DataError(f"{split_dir}/index.json: field 'config.data_format' is "
                    f"{json.dumps(config.get('data_format') if isinstance(config, dict) else None)[:40]}, not a token "
                    f"split's: the prepared data are corrupt; {PREPARE_FIX}")


def chunk_token_range(split_dir: Path) -> tuple[int, int]:
    """(smallest, largest) token id over all chunk files of a litdata token split.

    Each chunk is read as an ``np.memmap`` of its token array (after litdata's header: a uint32
    item count n and n + 1 uint32 byte offsets, the first of which is where the tokens start), and
    reduced with numpy's vectorised min/max: about one pass over the bytes, no Python loop per token.

    Raises:
        DataError: missing or corrupt index, missing chunk, or a header that does not fit the file.
    """
    index = read_index(split_dir)
    dtype = token_dtype(split_dir, index)
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
        if int(header[0]) != chunk["chunk_size"] or start != (chunk["chunk_size"] + 2) * 4:
            raise corrupt_field(Path(split_dir) / "index.json", f"chunks[{index['chunks'].index(chunk)}].chunk_size",
                                chunk["chunk_size"], f"{int(header[0])}, the item count in the header of {path}")
        if n == 0:
            continue
        tokens = np.memmap(path, dtype=dtype, mode="r", offset=start, shape=(n,))
        a, b = int(tokens.min()), int(tokens.max())
        lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
        del tokens
    return (lo or 0, hi or 0) if lo is not None else (0, -1)


def prepared_keys(d: DataConfig) -> dict:
    """The ``data.*`` settings that shape prepared data, as meta.json records them (``prepared_with``):
    source, corpora, tokenizer, vocab_size (bpe's), val_every, max_docs_per_corpus, chunk_bytes and, for
    ``source=hf``, hf_dataset, hf_split, hf_text_field.  Not data.num_proc, hf_cache_dir, dir: they
    change how and where prepare runs, not what it writes."""
    keys = {"source": d.source,
            "corpora": list(d.corpora) if d.source == "embedded" else None,
            "tokenizer": d.tokenizer,
            "vocab_size": d.vocab_size if d.tokenizer == "bpe" else None,
            "val_every": d.val_every,
            "max_docs_per_corpus": d.max_docs_per_corpus,
            "chunk_bytes": d.chunk_bytes}
    if d.source == "hf":
        keys.update(hf_dataset=d.hf_dataset, hf_split=d.hf_split, hf_text_field=d.hf_text_field)
    return {f"data.{k}": v for k, v in keys.items()}


def override_value(v) -> str:
    """A setting's value as a command-line override writes it: ``null``, ``[a,b]``, else ``str(v)``."""
    if v is None:
        return "null"
    if isinstance(v, list):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def prepared_overrides(data_dir: Path) -> list[str]:
    """Command-line overrides (``["data.val_every=8", ...]``) that give a run the ``data.*`` settings the
    data in ``data_dir`` were prepared with (meta.json ``prepared_with``; empty for older meta.json)."""
    not_applicable = ("data.corpora",)  # None there: another source
    meta = read_meta(Path(data_dir), check=False)  # only prepared_with is read here
    was = meta.get("prepared_with", {})
    if not isinstance(was, dict):
        raise corrupt_field(Path(data_dir) / "meta.json", "prepared_with", was, "an object")
    renamed(Path(data_dir), was)
    return [f"{k}={override_value(v)}" for k, v in was.items() if v is not None or k not in not_applicable]


def renamed(data_dir: Path, prepared_with: dict) -> None:
    """Refuse data prepared when the vocabulary was ``data.bpe_vocab_size`` (``bpe`` at 257 is now ``bytes``).

    Raises:
        DataError: one line, the fix (prepare again: the same tokens, under the new names).
    """
    if "data.bpe_vocab_size" in prepared_with:
        raise DataError(f"{data_dir} was prepared when the vocabulary was data.bpe_vocab_size (now data.tokenizer=bytes "
                        f"for 257, data.tokenizer=bpe data.vocab_size=N otherwise): re-run `python -m study.prepare` "
                        f"with this config's data settings (data.dir={data_dir}); `dvc repro prepare` does it")


def _same_source(a, b) -> bool:
    if a == b or a in ("embedded", "hf") or b in ("embedded", "hf") or not a or not b:
        return a == b
    return Path(str(a)).expanduser().resolve() == Path(str(b)).expanduser().resolve()  # a folder, however written


def check_prepared(data_dir: Path, cfg) -> dict:
    """Refuse prepared data that does not match a run's config; return meta.json.

    Checks: meta.json exists; every ``data.*`` key that shapes the data (:func:`prepared_keys`) has the
    value it was prepared with; each split's chunks hold the token count written in meta.json, and every token id is below the tokenizer's vocabulary
    (:func:`chunk_token_range`).

    Raises:
        DataError: with the file, the keys that differ, and the fix.
    """
    meta = read_meta(data_dir)
    missing = {"tokenizer", "vocab_size", "tokens", "prepared_with"} - set(meta)
    if missing:
        raise DataError(f"{data_dir}/meta.json lacks {sorted(missing)}: re-run `python -m study.prepare`")
    renamed(data_dir, meta["prepared_with"])
    want = cfg.data.tokenizer
    if meta.get("tokenizer") != want:
        vocab = f" data.vocab_size={cfg.data.vocab_size}" if want == "bpe" else ""
        raise DataError(f"{data_dir}/meta.json was prepared with tokenizer {meta.get('tokenizer')!r} but "
                        f"the config asks for data.tokenizer={want!r}: re-run `python -m study.prepare "
                        f"data.tokenizer={want}{vocab} data.dir={data_dir}` or change data.tokenizer")
    now, was = prepared_keys(cfg.data), meta["prepared_with"]
    differ = [k for k in sorted(set(was) | set(now)) if not (
        _same_source(was.get(k), now.get(k)) if k == "data.source" else was.get(k) == now.get(k))]
    if differ:
        diff = ", ".join(f"{k}={was.get(k)!r} there, {now.get(k)!r} here" for k in differ)
        again = " ".join(f"{k}={override_value(now.get(k))}" for k in differ)
        raise DataError(f"{data_dir} was prepared with other data settings ({diff}): re-run `python -m "
                        f"study.prepare {again} data.dir={data_dir}` (with this config), or give each data set its "
                        f"own data.dir")
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
        for chunk in read_index(Path(data_dir) / split)["chunks"]:
            name = f"{split}/{chunk['filename']}"
            got[name] = sha256_file(Path(data_dir) / name)
            if want is not None and want.get(name) != got[name]:
                raise DataError(f"{Path(data_dir) / name} is not the chunk prepared (its sha256 differs from "
                                f"meta.json's chunks_sha256): the data are corrupt; re-run `python -m study.prepare` "
                                f"(or `dvc repro prepare`)")
    return got

