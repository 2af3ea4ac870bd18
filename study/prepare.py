"""Stage 1, ``python -m study.prepare [overrides]``: corpus -> tokenizer -> litdata chunks.

Writes ``data.dir`` (default data/tokens/):
  train/, val/     litdata chunks (``litdata.optimize`` + ``TokensLoader``), one
                   end-of-text token after every document
  tokenizer.json   the byte-level tokenizer (``bytes``: no merges; ``bpe``: trained; not for ``gpt2``)
  meta.json        tokenizer, vocab_size, eot_id, tokens and documents per split,
                   sha256 of every source file, the validation document ids, the data.*
                   settings that shaped them (``prepared_with``, checked by every run)
and, beside it, ``DIR-timing.json`` (seconds; outside the DVC output, so identical inputs give
byte-identical data: no wall-clock value is written into data.dir, litdata's index.json included).

The output is written to a temporary folder and moved into place only when
complete and verified (the chunks hold the token counts of meta.json), so a
killed or failed prepare never leaves data that look finished.  The work is
:func:`study.data.build.build`; this module parses the overrides and reports.

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

import os
import sys
from pathlib import Path

from study.config import run_stage
from study.data.build import build
from study.runner.signals import Killed, terminate_as_exception


def _report(cfg, root: Path) -> int:
    with terminate_as_exception():  # SIGTERM: the build's temporary folder is removed, the data before are kept
        meta = build(cfg, root)
    print(f"prepared {meta['tokens']['train']:,} train and {meta['tokens']['val']:,} val tokens "
          f"({meta['documents']['train']} + {meta['documents']['val']} documents, tokenizer {meta['tokenizer']}, "
          f"vocab {meta['vocab_size']}) in {meta['seconds']} s")
    if cfg.data.tokenizer == "bpe" and meta["vocab_size"] < cfg.data.vocab_size:
        print(f"note: the BPE learned {meta['vocab_size']:,} of the {cfg.data.vocab_size:,} tokens asked (too little "
              f"text for more merges); the model's rows follow the {meta['vocab_size']:,}", file=sys.stderr)
    return 0


#: litdata's writer processes hold a semaphore; when Ctrl-C ends them, multiprocessing's resource tracker (a process of
#: its own, started later with this environment) frees it and warns on stderr after the stage's one-line error
QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


def main(argv: list[str] | None = None) -> int:
    rules = [x for x in os.environ.get("PYTHONWARNINGS", "").split(",") if x]
    os.environ["PYTHONWARNINGS"] = ",".join(rules + [QUIET_TRACKER] * (QUIET_TRACKER not in rules))
    try:
        return run_stage(_report, argv)
    except KeyboardInterrupt:  # the build removed its temporary folder; the data there before are kept
        print("error: prepare interrupted (Ctrl-C): the data folder is as it was before; run "
              "`python -m study.prepare` again to prepare it", file=sys.stderr)
        return 130
    except Killed as e:  # SIGTERM, likewise
        print("error: prepare stopped (SIGTERM): the data folder is as it was before; run "
              "`python -m study.prepare` again to prepare it", file=sys.stderr)
        return int(e.code)


if __name__ == "__main__":
    sys.exit(main())
