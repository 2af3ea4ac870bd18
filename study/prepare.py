"""Stage 1, ``python -m study.prepare [overrides]``: corpus -> tokenizer -> litdata chunks.

Writes ``data.dir`` (default data/tokens/):
  train/, val/     litdata chunks (``litdata.optimize`` + ``TokensLoader``), one
                   end-of-text token after every document
  tokenizer.json   the trained byte-level BPE (tokenizer ``bpe`` only)
  meta.json        tokenizer, vocab_size, eot_id, tokens and documents per split,
                   sha256 of every source file, the validation document ids

The output is written to a temporary folder and moved into place only when
complete and verified (the chunks hold the token counts of meta.json), so a
killed or failed prepare never leaves data that look finished.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from study.config import ConfigError, run_stage
from study.data import (check_prepared, make_tokenizer, read_documents, sha256_file,
                        split_documents)


def _emit(tokens):
    """litdata worker function: yield one document's token array (must be importable)."""
    yield tokens


def _optimize(arrays, out_dir: Path, chunk_bytes: str) -> None:
    from litdata import TokensLoader, optimize

    optimize(fn=_emit, inputs=arrays, output_dir=str(out_dir), chunk_bytes=chunk_bytes,
             item_loader=TokensLoader(), num_workers=1, mode="overwrite")


def prepare(cfg, root: Path) -> dict:
    """Build the token data for ``cfg.data`` under ``root / cfg.data.dir``; return meta.json's content.

    Raises:
        DataError / ConfigError: bad source files or settings (nothing is left at the output path).
    """
    t0 = time.time()
    out = root / cfg.data.dir
    docs = read_documents(cfg.data)
    train_docs, val_docs = split_documents(docs, cfg.data.val_every)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tok = make_tokenizer(cfg.data, [d.text for d in train_docs] if cfg.data.tokenizer == "bpe" else None,
                             tmp / "tokenizer.json")
        if tok.vocab_size > cfg.model.vocab_size:
            raise ConfigError(f"the {tok.name} tokenizer has {tok.vocab_size} tokens, more than "
                              f"model.vocab_size={cfg.model.vocab_size}: raise vocab_size or lower bpe_vocab_size")
        counts = {}
        for split, split_docs in (("train", train_docs), ("val", val_docs)):
            arrays = tok.encode_documents([d.text for d in split_docs])
            counts[split] = int(sum(len(a) for a in arrays))
            _optimize(arrays, tmp / split, cfg.data.chunk_bytes)
        sources = sorted({str(d.source) for d in docs})
        meta = {
            "tokenizer": tok.name,
            "vocab_size": tok.vocab_size,
            "bpe_vocab_size": cfg.data.bpe_vocab_size if tok.name == "bpe" else None,
            "eot_id": tok.eot_id,
            "source": cfg.data.source,
            "corpora": list(cfg.data.corpora) if cfg.data.source == "embedded" else None,
            "tokens": counts,
            "documents": {"train": len(train_docs), "val": len(val_docs)},
            "val_documents": [d.id for d in val_docs],
            "val_every": cfg.data.val_every,
            "sources_sha256": {"/".join(Path(s).parts[-3:]): sha256_file(Path(s)) for s in sources},
            "seconds": round(time.time() - t0, 1),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        check_prepared(tmp, cfg)  # chunks hold what meta.json says
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


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
