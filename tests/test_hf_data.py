"""data.source=hf: a Hugging Face dataset (OpenWebText's layout: one "text" column) read from a small
local copy that a fixture writes, tokenised with GPT-2 BPE by parallel processes.  Nothing is downloaded:
the hub case runs in offline mode."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from study.config import ConfigError, DataConfig, RunConfig, validate
from study.data import DataError
from study.data.corpora import read_sotu, split_documents
from study.data.hf import load_hf_dataset, read_hf_documents
from study.data.tokenizers import gpt2_tokenizer

ROOT = Path(__file__).resolve().parent.parent
N_DOCS = 300
VAL_EVERY = 10
# Edge cases among the paragraphs: an empty text (just <|endoftext|>), whitespace kept as it is,
# non-ASCII text, and the literal end-of-text string, which is ordinary text (encode_ordinary).
EDGE = ["", "  leading and trailing spaces, a newline\n", "Unicode: café, naïve, “quotes”, 日本語 — ok.",
        "A literal <|endoftext|> inside a document is text, not a separator."]

STUDY = """\
defaults: [run_config, {model: nano}, {variant: baseline}, {data: owt}, {trainer: cpu}, _self_]
study: {name: hf-test, seeds: [1], baseline: baseline}
model: {vocab_multiple: 64}
"""


def _documents() -> list[str]:
    """A few hundred short English documents: paragraphs of State of the Union addresses, and EDGE."""
    paragraphs = []
    for speech in read_sotu()[:30]:
        paragraphs += [p.strip() for p in speech.text.split("\n\n") if len(p.strip()) > 40]
    docs = paragraphs[: N_DOCS - len(EDGE)]
    for k, text in enumerate(EDGE):  # spread over train and val rows
        docs.insert(7 + 41 * k, text)
    assert len(docs) == N_DOCS
    return docs


@pytest.fixture(scope="module")
def owt_copy(tmp_path_factory) -> tuple[Path, list[str]]:
    """A local parquet copy of an OpenWebText-like dataset: columns text and url, three row groups."""
    folder = tmp_path_factory.mktemp("owt")
    docs = _documents()
    table = pa.table({"text": docs, "url": [f"https://example.org/{i}" for i in range(len(docs))],
                      "n": list(range(len(docs)))})
    pq.write_table(table, folder / "owt.parquet", row_group_size=128)
    return folder / "owt.parquet", docs


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project root whose study uses data=owt (conf/ copied, study.yaml replaced)."""
    root = tmp_path / "project"
    shutil.copytree(ROOT / "conf", root / "conf")
    (root / "conf" / "study.yaml").write_text(STUDY)
    monkeypatch.chdir(root)
    return root


def _split_tokens(split_dir: Path) -> np.ndarray:
    """All tokens of a litdata split, chunk after chunk, read from the chunk files themselves."""
    index = json.loads((split_dir / "index.json").read_text())
    assert index["config"]["item_loader"] == "TokensLoader"
    parts = []
    for chunk in index["chunks"]:
        raw = (split_dir / chunk["filename"]).read_bytes()
        header = 4 * (1 + chunk["chunk_size"] + 1)  # num_items, offsets (litdata's chunk layout)
        parts.append(np.frombuffer(raw[header:], dtype=np.uint16))
        assert len(parts[-1]) == chunk["dim"]
    return np.concatenate(parts)


def _expected(texts: list[str]) -> np.ndarray:
    """An independent encoding: tiktoken's GPT-2 BPE of each text, then <|endoftext|> (50256)."""
    enc = gpt2_tokenizer()
    return np.asarray([t for text in texts for t in enc.encode_ordinary(text) + [50256]], dtype=np.int64)


@pytest.mark.slow  # prepare with two workers
def test_prepare_reads_a_local_parquet_copy_with_parallel_workers(project, owt_copy, tmp_path, capsys):
    from study.prepare import main

    path, docs = owt_copy
    out = tmp_path / "tokens"
    assert main([f"data.hf_dataset={path}", "data.num_proc=2", f"data.val_every={VAL_EVERY}", f"data.dir={out}",
                 f"data.hf_cache_dir={tmp_path / 'hf-cache'}"]) == 0
    assert "prepared" in capsys.readouterr().out
    val_rows = list(range(VAL_EVERY // 2, N_DOCS, VAL_EVERY))  # rows 5, 15, 25, ...
    train = [d for i, d in enumerate(docs) if i not in val_rows]
    val = [docs[i] for i in val_rows]
    want = {"train": _expected(train), "val": _expected(val)}
    meta = json.loads((out / "meta.json").read_text())
    for split in ("train", "val"):
        got = _split_tokens(out / split)
        assert np.array_equal(got, want[split]), split
        assert meta["tokens"][split] == len(got)
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257 and meta["eot_id"] == 50256
    assert meta["documents"] == {"train": N_DOCS - len(val_rows), "val": len(val_rows)}
    assert meta["val_documents"] == [f"train/{i:09d}" for i in val_rows]
    assert meta["source"] == "hf" and meta["hf"]["num_proc"] == 2 and meta["hf"]["rows"] == N_DOCS
    assert list(meta["sources_sha256"]) == ["/".join(path.parts[-3:])]
    # the same documents and split through read_hf_documents + split_documents (the in-memory path)
    train_docs, val_docs = split_documents(read_hf_documents(OmegaConf.structured(
        DataConfig(source="hf", hf_dataset=str(path), hf_cache_dir=str(tmp_path / "hf-cache")))), VAL_EVERY)
    assert [d.text for d in train_docs] == train and [d.id for d in val_docs] == meta["val_documents"]
    assert not list(tmp_path.glob(".tokens.tmp*"))  # the tokenised arrow files went with the temporary folder
    # training reads it unchanged: windows of block_size + 1 tokens
    from study.data.datamodule import TokenDataModule
    dm = TokenDataModule(out, 64, 4, data_seed=1, n_val_windows=8, val_micro_batch_size=4)
    assert next(iter(dm.train_dataloader())).shape == (4, 65)
    assert int(dm.val_windows()[0].max()) == 50256


def _cfg(tmp_path, **data) -> DataConfig:
    data.setdefault("source", "hf")
    return OmegaConf.structured(DataConfig(hf_cache_dir=str(tmp_path / "hf-cache"), **data))


def test_local_layouts_read_the_same_documents(owt_copy, tmp_path):
    """A save_to_disk folder (with its splits), its .arrow files, a folder of parquet shards named like a hub
    snapshot, and a cap on the rows all read the rows of the parquet copy, in order."""
    import datasets

    path, docs = owt_copy
    ds = datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "hf-cache"))
    datasets.DatasetDict({"train": ds, "validation": ds.select(range(20))}).save_to_disk(str(tmp_path / "disk"))
    snapshot = tmp_path / "snapshot" / "plain_text"
    snapshot.mkdir(parents=True)
    for k in range(2):
        pq.write_table(pa.table({"text": docs[k * 150:(k + 1) * 150]}), snapshot / f"train-0000{k}-of-00002.parquet")

    def texts(**kw):
        ds, _ = load_hf_dataset(_cfg(tmp_path, **kw))
        return list(ds["text"])

    assert texts(hf_dataset=str(tmp_path / "disk")) == docs
    assert texts(hf_dataset=str(tmp_path / "disk"), hf_split="validation") == docs[:20]
    assert texts(hf_dataset=str(tmp_path / "disk" / "train" / "*.arrow")) == docs
    assert texts(hf_dataset=str(tmp_path / "snapshot")) == docs
    assert texts(hf_dataset=str(path), max_docs_per_corpus=25) == docs[:25]
    with pytest.raises(DataError, match=r"holds the splits \['train', 'validation'\]"):
        load_hf_dataset(_cfg(tmp_path, hf_dataset=str(tmp_path / "disk"), hf_split="test"))


def test_parallel_tokenising_with_a_trained_bpe(owt_copy, tmp_path):
    """tokenizer=bpe: trained on the training rows only, then loaded from tokenizer.json by each worker."""
    from study.data.hf import hf_train_texts, tokenize_hf
    from study.data.tokenizers import make_tokenizer

    path, docs = owt_copy
    cfg = _cfg(tmp_path, hf_dataset=str(path), tokenizer="bpe", vocab_size=400, num_proc=2, val_every=VAL_EVERY)
    ds, _ = load_hf_dataset(cfg)
    batches = list(hf_train_texts(ds, cfg, batch=64))
    assert [t for b in batches for t in b] == [d for i, d in enumerate(docs) if i % VAL_EVERY != VAL_EVERY // 2]
    tok = make_tokenizer(cfg, iter(batches), tmp_path / "tokenizer.json")
    tokenized = tokenize_hf(ds, cfg, tok, tmp_path / "tokens" / "t.arrow", tmp_path / "tokenizer.json")
    assert len(tokenized.cache_files) == 2  # one arrow file per process
    want = tok.encode_documents(docs)
    assert [list(ids) for ids in tokenized["ids"]] == [a.tolist() for a in want]
    assert list(tokenized["len"]) == [len(a) for a in want] and want[0][-1] == tok.eot_id == 0


def test_hf_errors_name_the_key_and_the_fix(owt_copy, tmp_path, monkeypatch):
    path, _ = owt_copy
    with pytest.raises(DataError, match=r"hf_text_field='body' is not a column .* \['text', 'url', 'n'\]"):
        load_hf_dataset(_cfg(tmp_path, hf_dataset=str(path), hf_text_field="body"))
    with pytest.raises(DataError, match="hf_text_field='n' is a column of .* not of text"):
        load_hf_dataset(_cfg(tmp_path, hf_dataset=str(path), hf_text_field="n"))
    with pytest.raises(DataError, match="no such file or folder"):
        load_hf_dataset(_cfg(tmp_path, hf_dataset=str(tmp_path / "missing" / "owt.parquet")))
    with pytest.raises(DataError, match="matches no file"):
        load_hf_dataset(_cfg(tmp_path, hf_dataset=str(tmp_path / "missing" / "*.parquet")))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("not a dataset")
    with pytest.raises(DataError, match="no .parquet/.arrow files"):
        load_hf_dataset(_cfg(tmp_path, hf_dataset=str(tmp_path / "notes")))
    # a hub name on a machine without internet: offline mode, so nothing is even tried
    import datasets
    import huggingface_hub
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match="could not load it from the Hugging Face hub .* pass a local copy"):
        load_hf_dataset(_cfg(tmp_path, hf_dataset="Skylion007/openwebtext"))


def test_hf_config_checks():
    def check(**data):
        validate(OmegaConf.structured(RunConfig(data=DataConfig(**data))))

    with pytest.raises(ConfigError, match="data.source=hf needs data.hf_dataset"):
        check(source="hf")
    with pytest.raises(ConfigError, match="set data.source=hf"):
        check(hf_dataset="Skylion007/openwebtext")
    with pytest.raises(ConfigError, match="data.num_proc=0 must be >= 1"):
        check(source="hf", hf_dataset="x", num_proc=0)
    with pytest.raises(ConfigError, match="data.hf_text_field is empty"):
        check(source="hf", hf_dataset="x", hf_text_field=" ")


def test_cli_error_is_one_line_and_writes_nothing(project, tmp_path, capsys):
    from study.prepare import main

    out = tmp_path / "tokens"
    assert main([f"data.hf_dataset={tmp_path / 'nowhere.parquet'}", f"data.dir={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: data.hf_dataset=") and "no such file" in err and "\n" not in err
    assert not out.exists() and not list(tmp_path.glob(".tokens.tmp*"))
