"""The prepare stage's work: documents -> tokenizer -> litdata chunks -> meta.json (:func:`build`).

Writes ``data.dir`` (layout: ``study.prepare``) into a temporary folder beside it and moves it into
place only when complete and verified (:func:`study.data.records.check_prepared`: the chunks hold the
token counts of meta.json, every id within the vocabulary), so a killed or failed prepare never
leaves data that look finished.  No wall-clock value is written into ``data.dir`` (a DVC output):
the timing goes to ``DIR-timing.json`` beside it.

With ``data.source=hf`` the documents are the rows of ``data.hf_split`` in row order, held out by
the rule of the other sources on row indices (:func:`study.data.corpora.is_val_index`); they are
tokenised by ``data.num_proc`` processes into an arrow file under the temporary folder and the chunks
are streamed from it (:func:`_build_hf`): the dataset is never held in memory.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from study.data import DataError
from study.data.chunks import HF_ROWS_PER_INPUT, emit_hf_rows, release_hf_rows, write_chunks
from study.data.corpora import corpus_runs, is_val_index, read_documents, split_documents
from study.data.hf import hf_doc_id, hf_num_proc, hf_train_texts, load_hf_dataset, tokenize_hf
from study.data.records import check_prepared, chunks_sha256, prepared_keys, sha256_file
from study.data.tokenizers import make_tokenizer
from study.data.yardsticks import prepared_yardsticks

YARDSTICK_MAX_TOKENS = 50_000_000  # training tokens counted for the yardsticks (source hf: the first ones)


def _build_hf(cfg, ds, tmp: Path) -> tuple[object, dict, dict, np.ndarray]:
    """Tokenise the rows of ``ds`` in parallel and write the train/val chunks under ``tmp``; return
    (tokenizer, tokens per split, documents per split, the first training tokens (at most
    YARDSTICK_MAX_TOKENS) for the yardsticks)."""
    d = cfg.data
    n = len(ds)
    val = is_val_index(np.arange(n), d.val_every)
    if not val.any():
        raise DataError(f"no validation document: data.hf_dataset has {n} rows, too few for data.val_every="
                        f"{d.val_every}; lower val_every or raise data.max_docs_per_corpus")
    tok_path = tmp / "tokenizer.json"
    tok = make_tokenizer(d, hf_train_texts(ds, d) if d.tokenizer == "bpe" else None, tok_path)
    tokenized = tokenize_hf(ds, d, tok, tmp / "hf-tokens" / "tokens.arrow", tok_path)
    files = tuple(f["filename"] for f in tokenized.cache_files)
    if not files:
        raise DataError("the tokenised dataset has no arrow file on disk: set data.hf_cache_dir to a writable folder")
    lengths = tokenized.data.column("len").to_numpy().astype(np.int64)
    counts = {"train": int(lengths[~val].sum()), "val": int(lengths[val].sum())}
    train_rows = np.flatnonzero(~val)
    head = train_rows[: int(np.searchsorted(np.cumsum(lengths[train_rows]), YARDSTICK_MAX_TOKENS)) + 1]
    sample = tokenized.data.column("ids").take(head).combine_chunks().flatten().to_numpy().astype(np.int64)
    for split, rows in (("train", np.flatnonzero(~val)), ("val", np.flatnonzero(val))):
        blocks = np.split(rows, np.flatnonzero(np.diff(rows // HF_ROWS_PER_INPUT)) + 1)
        write_chunks([(files, b) for b in blocks], tmp / split, d.chunk_bytes, fn=emit_hf_rows)
    release_hf_rows()
    del tokenized
    shutil.rmtree(tmp / "hf-tokens", ignore_errors=True)
    return tok, counts, {"train": int((~val).sum()), "val": int(val.sum())}, sample


def check_replaceable(out: Path, root: Path, name: str) -> None:
    """Refuse an output folder that prepare must not replace: the project root or a folder above it,
    or an existing folder that holds anything but prepared data (no meta.json); nothing is touched.

    Raises:
        DataError: names data.dir and the fix.
    """
    where, project = out.resolve(), root.resolve()
    if where == project or where in project.parents:
        raise DataError(f"data.dir={name!r} is the project folder or above it: prepare replaces that folder; "
                        f"give a sub-folder such as data/tokens")
    if where.is_file() or (where.is_dir() and any(where.iterdir()) and not (where / "meta.json").is_file()):
        raise DataError(f"data.dir={name!r} ({where}) holds files that are not prepared data (no meta.json), which "
                        f"prepare would replace: give a new or empty folder")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tmp(out: Path) -> list[Path]:
    """Remove the temporary folders (``.NAME.tmp-PID`` beside ``out``) that prepares of the same target
    left behind when they died before their own clean-up (SIGKILL, power loss): those whose process is
    gone.  A live prepare's folder is left alone.  Returns the folders removed."""
    removed = []
    for tmp in out.parent.glob(f".{out.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if tmp.is_dir() and pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def _end_children() -> None:
    """Stop the worker processes this prepare started (litdata's optimize) before its temporary folder
    is removed, so that none writes into it afterwards."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
    for child in multiprocessing.active_children():
        child.join(timeout=10)


def build(cfg, root: Path) -> dict:
    """Build the token data for ``cfg.data`` under ``root / cfg.data.dir``; return meta.json's content.

    The work goes into ``.NAME.tmp-PID`` beside the output, removed whatever ends the build: an
    exception, Ctrl-C, SIGTERM (turned into an exit with status 143 for the duration); a folder left
    by a prepare that died without a word (SIGKILL) is removed by the next prepare of the same target.

    Raises:
        DataError / ConfigError: bad source files or settings (nothing is left at the output path).
    """
    return _build(cfg, root)


def _tokenize_hf(cfg, ds, src, tmp: Path) -> tuple:
    """A Hugging Face source tokenised into ``tmp`` (:func:`_build_hf`): (tokenizer, tokens per split, tokens per
    split and source, documents per split, validation document ids, source files, the yardsticks' training sample)."""
    tok, counts, documents, train_sample = _build_hf(cfg, ds, tmp)
    corpus_tokens = {split: [[cfg.data.hf_split, counts[split]]] for split in counts}
    n = len(ds)
    val_ids = [hf_doc_id(cfg.data.hf_split, i, n) for i in np.flatnonzero(is_val_index(np.arange(n),
                                                                                       cfg.data.val_every))]
    return tok, counts, corpus_tokens, documents, val_ids, [str(f) for f in src.files], train_sample


def _tokenize_documents(cfg, docs, train_docs, val_docs, tmp: Path) -> tuple:
    """Embedded or folder documents tokenised and written as chunks into ``tmp``; the tuple of :func:`_tokenize_hf`."""
    tok = make_tokenizer(cfg.data, [d.text for d in train_docs] if cfg.data.tokenizer == "bpe" else None,
                         tmp / "tokenizer.json")
    counts, corpus_tokens = {}, {}
    for split, split_docs in (("train", train_docs), ("val", val_docs)):
        arrays = tok.encode_documents([d.text for d in split_docs])
        counts[split] = int(sum(len(a) for a in arrays))
        corpus_tokens[split] = corpus_runs(split_docs, arrays)
        write_chunks(arrays, tmp / split, cfg.data.chunk_bytes)
        if split == "train":
            train_sample = np.concatenate(arrays).astype(np.int64)
        del arrays
    return (tok, counts, corpus_tokens, {"train": len(train_docs), "val": len(val_docs)}, [d.id for d in val_docs],
            sorted({str(d.source) for d in docs}), train_sample)


def _build(cfg, root: Path) -> dict:
    t0 = time.time()
    out = root / cfg.data.dir
    check_replaceable(out, root, cfg.data.dir)
    remove_stale_tmp(out)
    hf = cfg.data.source == "hf"
    if hf:  # read and checked before anything is written
        ds, src = load_hf_dataset(cfg.data)
    else:
        docs = read_documents(cfg.data)
        train_docs, val_docs = split_documents(docs, cfg.data.val_every)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if hf:
            tok, counts, corpus_tokens, documents, val_ids, sources, train_sample = _tokenize_hf(cfg, ds, src, tmp)
        else:
            tok, counts, corpus_tokens, documents, val_ids, sources, train_sample = _tokenize_documents(
                cfg, docs, train_docs, val_docs, tmp)
        meta = {
            "tokenizer": tok.name,
            "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id,
            "source": cfg.data.source,
            "corpora": list(cfg.data.corpora) if cfg.data.source == "embedded" else None,
            "tokens": counts,
            "corpus_tokens": corpus_tokens,
            "documents": documents,
            "val_documents": val_ids,
            "val_every": cfg.data.val_every,
            "sources_sha256": {"/".join(Path(s).parts[-3:]): sha256_file(Path(s)) for s in sources},
            "prepared_with": prepared_keys(cfg.data),  # every data.* key that shapes these files (check_prepared)
            "chunks_sha256": chunks_sha256(tmp),  # the chunks' bytes, checked at every train start
        }
        if hf:
            meta["hf"] = {"dataset": src.name, "kind": src.kind, "split": cfg.data.hf_split,
                          "text_field": cfg.data.hf_text_field, "rows": len(ds), "num_proc": hf_num_proc(cfg.data),
                          # a local copy's fingerprint follows its files' mtimes; their sha256 are above
                          "fingerprint": getattr(ds, "_fingerprint", None) if src.kind == "hub" else None}
        # no wall-clock value in data.dir (a DVC output): the timing goes to DIR-timing.json beside it
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        check_prepared(tmp, cfg)  # chunks hold what meta.json says, token ids within the vocabulary
        meta["yardsticks"] = prepared_yardsticks(cfg, tmp, meta, train_sample)
        del train_sample
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        _end_children()
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = round(time.time() - t0, 1)
    timing = out.parent / f"{out.name}-timing.json"
    timing.write_text(json.dumps({"data_dir": cfg.data.dir, "seconds": seconds, "tokens": meta["tokens"]}, indent=1))
    return {**meta, "seconds": seconds}
