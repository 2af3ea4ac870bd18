"""Corpora, cleaning, the held-out split, tokenizers and the prepared chunks."""
from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from study.config import DataConfig
from study.data import DataError
from study.data.corpora import read_folder, read_kjv, read_shakespeare, read_sotu, split_documents
from study.data.records import chunk_token_count
from study.data.tokenizers import gpt2_tokenizer, make_tokenizer


def test_gpt2_tokenizer_offline():
    enc = gpt2_tokenizer()
    assert enc.encode("Hello world<|endoftext|>", allowed_special="all") == [15496, 995, 50256]
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.decode(enc.encode_ordinary("Fellow-Citizens of the Senate")) == "Fellow-Citizens of the Senate"


def test_embedded_corpora_are_clean_documents():
    sotu, plays, kjv = read_sotu(), read_shakespeare(), read_kjv()
    assert len(sotu) == 249 and len(plays) == 38 and len(kjv) == 66
    assert kjv[0].text.startswith("In the beginning God created the heaven and the earth.")
    assert kjv[-1].text.endswith("The grace of our Lord Jesus Christ be with you all. Amen.")
    assert not any(ch in d.text for d in kjv for ch in "[]")
    assert "2. And the earth" not in kjv[0].text  # verse numbers stripped
    hamlet = next(d for d in plays if d.id == "shakespeare/hamlet").text
    assert "**" not in hamlet and "\n#" not in hamlet and not hamlet.startswith("#")
    assert "To be, or not to be" in hamlet
    assert sotu[0].text.startswith("Fellow-Citizens of the Senate and House of Representatives")


def test_split_holds_out_whole_documents_disjoint_and_fixed():
    docs = read_sotu() + read_kjv()
    train, val = split_documents(docs, 20)
    ids_t, ids_v = {d.id for d in train}, {d.id for d in val}
    assert not ids_t & ids_v and len(ids_t) + len(ids_v) == len(docs)
    assert {d.id.split("/")[0] for d in val} == {"sotu", "kjv"}
    assert len(val) == 12 + 3  # positions 10, 30, ... of 249 speeches (12) and of 66 books (3)
    assert [d.id for d in split_documents(list(reversed(docs)), 20)[1]] == [d.id for d in val]


def test_user_folder_txt_and_jsonl(tmp_path):
    (tmp_path / "a.txt").write_text("First document.\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "Second."}) + "\n\n" + json.dumps({"text": "Third."}) + "\n")
    docs = read_folder(tmp_path)
    assert [d.text for d in docs] == ["First document.", "Second.", "Third."]


@pytest.mark.parametrize("name,content,match", [
    ("empty.txt", b"  \n", "empty"),
    ("latin1.txt", "café".encode("latin-1"), "not UTF-8"),
    ("bad.jsonl", b"{not json}\n", "JSON"),
    ("notext.jsonl", b'{"body": "x"}\n', '"text"'),
])
def test_user_folder_bad_files(tmp_path, name, content, match):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=match):
        read_folder(tmp_path)


def test_bpe_tokenizer_trains_with_eot(tmp_path):
    cfg = OmegaConf.structured(DataConfig(tokenizer="bpe", vocab_size=300))
    texts = [d.text for d in read_kjv()[:3]]
    tok = make_tokenizer(cfg, texts, tmp_path / "tok.json")
    assert tok.vocab_size == 300 and tok.eot_id == 0
    arrays = tok.encode_documents(texts[:2])
    assert arrays[0].dtype == np.uint16 and arrays[0][-1] == 0 and 0 not in arrays[0][:-1]
    again = make_tokenizer(cfg, None, tmp_path / "tok.json")
    assert again.encode("In the beginning") == tok.encode("In the beginning")


def test_bytes_tokenizer_is_one_token_per_byte_without_a_corpus(tmp_path):
    """data.tokenizer=bytes: 257 ids (256 bytes + end of text), one token per UTF-8 byte, a bijection on the
    bytes, built without a corpus and the same ids as a byte-level BPE trained to 257 tokens on real text."""
    cfg = OmegaConf.structured(DataConfig())
    assert (cfg.tokenizer, cfg.vocab_size) == ("bytes", None)
    tok = make_tokenizer(cfg, None, tmp_path / "bytes.json")
    assert (tok.name, tok.vocab_size, tok.eot_id) == ("bytes", 257, 0)
    text = "Unicode: café, 日本語 — ok.\n"
    assert len(tok.encode(text)) == len(text.encode("utf-8"))
    every = bytes(range(256)).decode("latin-1")  # 256 characters, 384 UTF-8 bytes
    ids = [tok.encode(bytes([b]).decode("latin-1"))[0] for b in range(128)]  # the ASCII bytes: one id each
    assert len(set(ids)) == 128 and 0 not in ids and max(tok.encode(every)) <= 256
    trained = make_tokenizer(OmegaConf.structured(DataConfig(tokenizer="bpe", vocab_size=257)),
                             [d.text for d in read_kjv()[:3]], tmp_path / "bpe257.json")
    assert trained.encode(text) == tok.encode(text) and trained.vocab_size == 257
    assert (tmp_path / "bytes.json").read_bytes() == (tmp_path / "bpe257.json").read_bytes()
    again = make_tokenizer(cfg, None, tmp_path / "bytes.json")  # loaded from the saved file
    assert again.encode(text) == tok.encode(text)


def test_prepared_chunks_match_meta(nano_project):
    meta = json.loads((nano_project / "data/tokens/meta.json").read_text())
    assert meta["tokenizer"] == "bpe" and meta["vocab_size"] == 512
    for split in ("train", "val"):
        assert chunk_token_count(nano_project / "data/tokens" / split) == meta["tokens"][split]
    assert meta["documents"]["train"] > meta["documents"]["val"] > 0
    assert len(meta["sources_sha256"]) > 3 and all(len(h) == 64 for h in meta["sources_sha256"].values())
    # the tokens decode back to the source text
    from litdata import StreamingDataset, TokensLoader
    from tokenizers import Tokenizer
    ds = StreamingDataset(str(nano_project / "data/tokens/val"), item_loader=TokensLoader(block_size=200))
    text = Tokenizer.from_file(str(nano_project / "data/tokens/tokenizer.json")).decode(ds[0].tolist())
    assert text.split()[0].isalpha()


def test_seed_fixes_the_batches_for_every_variant(nano_project):
    """The DataModule takes no variant: seed s gives the same batches, whatever the model."""
    import torch

    from study.data.datamodule import TokenDataModule

    def first_batches(seed, n=3):
        dm = TokenDataModule(nano_project / "data/tokens", 64, 8, seed, n_val_windows=16, val_micro_batch_size=8)
        it = iter(dm.train_dataloader())
        return [next(it).clone() for _ in range(n)], dm.val_windows()[0]

    a, val_a = first_batches(1)
    b, val_b = first_batches(1)
    c, val_c = first_batches(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == (8, 65)
    assert torch.equal(val_a, val_c) and val_a.shape == (16, 65)  # validation does not depend on the seed


def test_too_few_documents_for_the_held_out_rule_name_the_cap():
    """A corpus cut below val_every // 2 + 1 documents holds none out: the error names the cap and both fixes."""
    from study.data import DataError
    from study.data.corpora import split_documents

    docs = read_kjv()[:5]
    train, val = split_documents(docs, 5)  # documents 0-4: index 2 held out
    assert len(val) == 1 and len(train) == 4
    with pytest.raises(DataError, match=r"every corpus has fewer than 11 documents, too few for data.val_every=20 "
                                        r"\(data.max_docs_per_corpus caps them\): lower val_every, or raise"):
        split_documents(docs, 20)
