"""Stage 1, ``python -m study.prepare [overrides]``: corpus -> tokenizer -> litdata chunks.

Writes ``data.dir`` (default data/tokens/):
  train/, val/     litdata chunks (``litdata.optimize`` + ``TokensLoader``), one
                   end-of-text token after every document
  tokenizer.json   the trained byte-level BPE (tokenizer ``bpe`` only)
  meta.json        tokenizer, vocab_size, eot_id, tokens and documents per split,
                   sha256 of every source file, the validation document ids, the data.*
                   settings that shaped them (``prepared_with``, checked by every run)
and, beside it, ``DIR-timing.json`` (seconds; outside the DVC output, so identical inputs give
byte-identical data: no wall-clock value is written into data.dir, litdata's index.json included).

The output is written to a temporary folder and moved into place only when
complete and verified (the chunks hold the token counts of meta.json), so a
killed or failed prepare never leaves data that look finished.

With ``data.source=hf`` (a Hugging Face dataset such as OpenWebText) the
documents are the rows of ``data.hf_split`` in row order; row i is held out for
validation when i % val_every == val_every // 2 (the rule of the other sources,
on row indices, so no shuffle and no hashing is needed and the split is the same
on every machine).  The rows are tokenised by ``data.num_proc`` processes
(``Dataset.map``) into an arrow file under the temporary folder, and the chunks
are streamed from it: the dataset is never held in memory.  The chunks and
meta.json have the layout of the other sources, so training is unchanged.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from study.config import ConfigError, run_stage

# study.data (which imports Lightning) is imported inside the functions: litdata's optimize spawns
# a worker process that imports this module for _emit / _emit_hf_rows, and should not pay for it.
HF_ROWS_PER_INPUT = 4096  # rows of the tokenised dataset per litdata input (source hf)
YARDSTICK_MAX_TOKENS = 50_000_000  # training tokens counted for the yardsticks (source hf: the first ones)


def _emit(tokens):
    """litdata worker function: yield one document's token array (must be importable)."""
    yield tokens


def _optimize(arrays, out_dir: Path, chunk_bytes: str, fn=_emit) -> None:
    from litdata import TokensLoader, optimize

    optimize(fn=fn, inputs=arrays, output_dir=str(out_dir), chunk_bytes=chunk_bytes,
             item_loader=TokensLoader(), num_workers=1, mode="overwrite", verbose=False)
    stable_index(out_dir)


def stable_index(split_dir: Path) -> None:
    """Make litdata's ``index.json`` a function of the data alone: litdata writes the wall-clock time
    of ``optimize`` as ``updated_at`` (its cache key for remote copies), which would give identical
    chunks a new DVC hash on every prepare; it becomes a digest of the chunk list and config instead
    (litdata only compares it for equality).  Same format as litdata's (``json.dump``, sorted keys)."""
    import hashlib

    path = split_dir / "index.json"
    index = json.loads(path.read_text())
    body = {k: v for k, v in index.items() if k != "updated_at"}
    index["updated_at"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(index, sort_keys=True))
    tmp.replace(path)


_TOKEN_COLUMNS: dict = {}


def _emit_hf_rows(spec):
    """litdata worker function (importable: litdata spawns its worker): ``spec`` = (arrow files of the
    tokenised dataset, sorted row indices of one block); yield each row's token array, one item per
    document, in row order.  The files are memory-mapped once per process."""
    import pyarrow as pa

    files, rows = spec
    column = _TOKEN_COLUMNS.get(files)
    if column is None:
        column = _TOKEN_COLUMNS[files] = pa.concat_tables(
            [pa.ipc.open_stream(pa.memory_map(f)).read_all() for f in files]).column("ids")
    start = int(rows[0])
    block = column.slice(start, int(rows[-1]) + 1 - start).combine_chunks()
    offsets, values = block.offsets.to_numpy(), block.values.to_numpy()
    for r in rows:
        j = int(r) - start
        yield values[offsets[j]:offsets[j + 1]]


def _prepare_hf(cfg, ds, tmp: Path) -> tuple[object, dict, dict, np.ndarray]:
    """Tokenise the rows of ``ds`` in parallel and write the train/val chunks under ``tmp``; return
    (tokenizer, tokens per split, documents per split, the first training tokens (at most
    YARDSTICK_MAX_TOKENS) for the yardsticks)."""
    from study.data import DataError, hf_train_texts, is_val_index, make_tokenizer, tokenize_hf

    d = cfg.data
    n = len(ds)
    val = is_val_index(np.arange(n), d.val_every)
    if not val.any():
        raise DataError(f"no validation document: data.hf_dataset has {n} rows, too few for data.val_every="
                        f"{d.val_every}; lower val_every or raise data.max_docs_per_corpus")
    tok_path = tmp / "tokenizer.json"
    tok = make_tokenizer(d, hf_train_texts(ds, d) if d.tokenizer == "bpe" else None, tok_path)
    check_vocab(cfg, tok)
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
        _optimize([(files, b) for b in blocks], tmp / split, d.chunk_bytes, fn=_emit_hf_rows)
    _TOKEN_COLUMNS.clear()
    del tokenized
    shutil.rmtree(tmp / "hf-tokens", ignore_errors=True)
    return tok, counts, {"train": int((~val).sum()), "val": int(val.sum())}, sample


def corpus_runs(docs, arrays) -> list[list]:
    """[[corpus, tokens], ...]: the corpora of a split's token stream in order (documents are grouped by
    corpus, the part of a document id before its first '/')."""
    runs: list[list] = []
    for d, a in zip(docs, arrays):
        name = d.id.split("/", 1)[0]
        if runs and runs[-1][0] == name:
            runs[-1][1] += int(len(a))
        else:
            runs.append([name, int(len(a))])
    return runs


def yardsticks(cfg, data_dir: Path, meta: dict, train_tokens: np.ndarray) -> dict:
    """Unigram and bigram cross-entropy (nats/token) of the fixed validation windows that training
    evaluates (model.block_size, train.val_tokens), overall and per corpus (study.yardsticks);
    ``{"skipped": reason}`` when the validation split is too small for those windows (training with
    these settings refuses the data too; other settings may fit)."""
    from study.data import DataError
    from study.datamodule import fixed_val_windows
    from study.yardsticks import ngram_yardsticks

    n_val = cfg.train.val_tokens // cfg.model.block_size
    try:
        windows, corpus = fixed_val_windows(data_dir, cfg.model.block_size, n_val, meta["corpus_tokens"]["val"])
    except DataError as e:
        return {"skipped": str(e), "block_size": cfg.model.block_size, "n_val_windows": n_val}
    out = ngram_yardsticks(train_tokens, windows.numpy(), corpus.numpy(),
                           [c for c, _ in meta["corpus_tokens"]["val"]], meta["vocab_size"])
    out.update(block_size=cfg.model.block_size, n_val_windows=n_val)
    return out


def check_vocab(cfg, tok) -> None:
    if tok.vocab_size > cfg.model.vocab_size:
        raise ConfigError(f"the {tok.name} tokenizer has {tok.vocab_size} tokens, more than "
                          f"model.vocab_size={cfg.model.vocab_size}: raise vocab_size or lower bpe_vocab_size")


def prepare(cfg, root: Path) -> dict:
    """Build the token data for ``cfg.data`` under ``root / cfg.data.dir``; return meta.json's content.

    Raises:
        DataError / ConfigError: bad source files or settings (nothing is left at the output path).
    """
    from study.data import (check_prepared, hf_doc_id, hf_num_proc, is_val_index, load_hf_dataset, make_tokenizer,
                            prepared_keys, read_documents, sha256_file, split_documents, chunks_sha256)

    t0 = time.time()
    out = root / cfg.data.dir
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
            tok, counts, documents, train_sample = _prepare_hf(cfg, ds, tmp)
            corpus_tokens = {split: [[cfg.data.hf_split, counts[split]]] for split in counts}
            n = len(ds)
            val_ids = [hf_doc_id(cfg.data.hf_split, i, n) for i in np.flatnonzero(is_val_index(np.arange(n),
                                                                                               cfg.data.val_every))]
            sources = [str(f) for f in src.files]
        else:
            tok = make_tokenizer(cfg.data, [d.text for d in train_docs] if cfg.data.tokenizer == "bpe" else None,
                                 tmp / "tokenizer.json")
            check_vocab(cfg, tok)
            counts, corpus_tokens = {}, {}
            for split, split_docs in (("train", train_docs), ("val", val_docs)):
                arrays = tok.encode_documents([d.text for d in split_docs])
                counts[split] = int(sum(len(a) for a in arrays))
                corpus_tokens[split] = corpus_runs(split_docs, arrays)
                _optimize(arrays, tmp / split, cfg.data.chunk_bytes)
                if split == "train":
                    train_sample = np.concatenate(arrays).astype(np.int64)
                del arrays
            documents = {"train": len(train_docs), "val": len(val_docs)}
            val_ids = [d.id for d in val_docs]
            sources = sorted({str(d.source) for d in docs})
        meta = {
            "tokenizer": tok.name,
            "vocab_size": tok.vocab_size,
            "bpe_vocab_size": cfg.data.bpe_vocab_size if tok.name == "bpe" else None,
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
        meta["yardsticks"] = yardsticks(cfg, tmp, meta, train_sample)
        del train_sample
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = round(time.time() - t0, 1)
    timing = out.parent / f"{out.name}-timing.json"
    timing.write_text(json.dumps({"data_dir": cfg.data.dir, "seconds": seconds, "tokens": meta["tokens"]}, indent=1))
    return {**meta, "seconds": seconds}


def _report(cfg, root: Path) -> int:
    meta = prepare(cfg, root)
    print(f"prepared {meta['tokens']['train']:,} train and {meta['tokens']['val']:,} val tokens "
          f"({meta['documents']['train']} + {meta['documents']['val']} documents, tokenizer {meta['tokenizer']}, "
          f"vocab {meta['vocab_size']}) in {meta['seconds']} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_stage(_report, argv)


if __name__ == "__main__":
    sys.exit(main())
