"""Prepared data: prepare refuses bad chunks, corpora and settings in one line, leaves no temporary folder when it
fails or is signalled, never replaces the project; a run refuses data prepared with other settings, corrupt chunks
or metadata, and token ids out of range."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import env_for, one_line_error


def _copy_data(nano_project: Path, dest: Path) -> Path:
    shutil.copytree(nano_project / "data/tokens", dest)
    return dest


def test_prepare_refuses_a_bad_chunk_size_before_it_starts(nano_project, tmp_path, monkeypatch, capsys):
    """data.chunk_bytes is litdata's size string: a bad one stops prepare in one line before the tokenizer is
    trained, and the prepared data stay as they were."""
    from study.prepare import main

    data = _copy_data(nano_project, tmp_path / "tokens")
    before = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    monkeypatch.chdir(nano_project)
    t = time.perf_counter()
    assert main([f"data.dir={data}", "data.chunk_bytes=16XB"]) == 2
    assert time.perf_counter() - t < 5
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith("error: data.chunk_bytes='16XB' is not a size"), err
    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == before


def test_corrupt_chunk_is_refused(nano_project, tmp_path, monkeypatch, capsys):
    from study.train import main

    data = _copy_data(nano_project, tmp_path / "tokens")
    chunk = next((data / "train").glob("*.bin"))
    chunk.write_bytes(chunk.read_bytes()[:-100])
    monkeypatch.chdir(nano_project)
    assert main([f"data.dir={data}", f"study.runs_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert "corrupt or truncated" in err and chunk.name in err
    (data / "train" / chunk.name).unlink()
    assert main([f"data.dir={data}", f"study.runs_dir={tmp_path / 'runs'}"]) == 2
    assert "is missing" in capsys.readouterr().err


def test_zeroed_chunk_is_refused_by_its_checksum(nano_project, tmp_path, monkeypatch, capsys):
    """Zeroed token bytes keep the chunk's size, header and count, and id 0 is in the vocabulary: only
    the sha256 that prepare recorded in meta.json tells the chunk is not the one prepared."""
    import json

    from study.data.records import chunk_token_count, chunk_token_range
    from study.train import main

    data = _copy_data(nano_project, tmp_path / "tokens")
    chunk = next((data / "train").glob("*.bin"))
    raw = chunk.read_bytes()
    recorded = json.loads((data / "meta.json").read_text())["chunks_sha256"]
    assert recorded[f"train/{chunk.name}"] == hashlib.sha256(raw).hexdigest()
    half = len(raw) // 2
    chunk.write_bytes(raw[:half] + bytes(len(raw) - half))
    assert chunk_token_count(data / "train") > 0 and chunk_token_range(data / "train")[0] == 0  # still "valid"
    monkeypatch.chdir(nano_project)
    assert main([f"data.dir={data}", f"study.runs_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert str(chunk) in err and "sha256" in err and "python -m study.prepare" in err and "dvc repro prepare" in err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("metrics.json"))


@pytest.mark.parametrize("name,content,words", [("empty.txt", b"\n", "is empty"),
                                                ("latin.txt", "naïve".encode("latin-1"), "not UTF-8")])


def test_bad_user_corpus(nano_project, tmp_path, monkeypatch, capsys, name, content, words):
    from study.prepare import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "good.txt").write_text("Some real text. " * 50)
    (corpus / name).write_bytes(content)
    monkeypatch.chdir(nano_project)
    out = tmp_path / "tokens"
    assert main([f"data.source={corpus}", f"data.dir={out}"]) == 2
    err = capsys.readouterr().err
    assert words in err and name in err
    assert not out.exists() and not list(tmp_path.glob(".tokens.tmp*"))


def test_prepare_never_replaces_the_project_or_a_folder_of_other_files(tmp_path):
    """data.dir=. (or '', or a folder of other files) is refused before anything is written or removed."""
    from study.data import DataError
    from study.data.build import check_replaceable

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/notes.md").write_text("keep me")
    for name in (".", "", "..", "docs"):
        with pytest.raises(DataError, match="data.dir="):
            check_replaceable(tmp_path / name, tmp_path, name)
    assert (tmp_path / "docs/notes.md").read_text() == "keep me"
    (tmp_path / "data/tokens").mkdir(parents=True)
    check_replaceable(tmp_path / "data/tokens", tmp_path, "data/tokens")  # empty: fine
    (tmp_path / "data/tokens/meta.json").write_text("{}")
    check_replaceable(tmp_path / "data/tokens", tmp_path, "data/tokens")  # earlier prepared data: replaced
    check_replaceable(tmp_path / "new", tmp_path, "new")  # not there yet: fine


# -- corrupt meta.json / index.json: one line naming the file and the field -------------------------
def _edit_json(path: Path, edit) -> None:
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


CORRUPT_PREPARED = [  # (id, file under data.dir, edit of its JSON (or None: not JSON at all), the field named)
    ("meta vocab_size null", "meta.json", lambda m: m.update(vocab_size=None), "'vocab_size' is null"),
    ("meta tokens.val string", "meta.json", lambda m: m["tokens"].update(val="12"), "'tokens.val' is a string"),
    ("meta tokens missing", "meta.json", lambda m: m.pop("tokens"), "'tokens' is missing"),
    ("meta tokenizer number", "meta.json", lambda m: m.update(tokenizer=3), "'tokenizer' is a number"),
    ("meta corpus_tokens list", "meta.json", lambda m: m.update(corpus_tokens=[]), "'corpus_tokens' is a list"),
    ("meta corpus pair", "meta.json", lambda m: m["corpus_tokens"]["val"][0].__setitem__(1, None),
     "'corpus_tokens.val[0]'"),
    ("meta not JSON", "meta.json", None, "is not valid JSON"),
    ("index chunks null", "train/index.json", lambda i: i.update(chunks=None), "'chunks' is null"),
    ("index dim string", "val/index.json", lambda i: i["chunks"][0].update(dim="7"), "'chunks[0].dim' is a string"),
    ("index filename missing", "train/index.json", lambda i: i["chunks"][0].pop("filename"),
     "'chunks[0].filename' is missing"),
    ("index data_format", "val/index.json", lambda i: i["config"].update(data_format="x"), "'config.data_format'"),
    ("index not JSON", "train/index.json", None, "is not valid JSON"),
    # a wrong item count overflowed inside litdata's DataLoader after the run had started
    ("index chunk_size negative", "train/index.json", lambda i: i["chunks"][0].update(chunk_size=-5),
     "'chunks[0].chunk_size' is a number (-5), expected an integer >= 1"),
    ("index chunk_size huge", "train/index.json", lambda i: i["chunks"][0].update(chunk_size=10**9),
     "'chunks[0].chunk_size' is a number (1000000000)"),
    ("index chunk_size missing", "val/index.json", lambda i: i["chunks"][0].pop("chunk_size"),
     "'chunks[0].chunk_size' is missing"),
    ("index chunk_size off by one", "train/index.json", lambda i: i["chunks"][0].update(chunk_size=i["chunks"][0]
                                                                                      ["chunk_size"] + 1),
     "the item count in the header of"),
]


@pytest.mark.parametrize("case,name,edit,words", CORRUPT_PREPARED, ids=[c[0] for c in CORRUPT_PREPARED])
def test_corrupt_meta_or_index_is_refused_in_one_line(nano_project, tmp_path, monkeypatch, capsys, case, name, edit,
                                                      words):
    from study.train import main

    data = _copy_data(nano_project, tmp_path / "tokens")
    if edit is None:
        (data / name).write_text((data / name).read_text()[:-20])  # cut short: invalid JSON
    else:
        _edit_json(data / name, edit)
    monkeypatch.chdir(nano_project)
    runs = tmp_path / "runs"
    rc = main([f"data.dir={data}", f"study.runs_dir={runs}", f"study.tracking_db={tmp_path / 'm.db'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert str(data / name) in err and words in err and "python -m study.prepare" in err, err
    assert not runs.exists() or not list(runs.rglob("*.json"))  # refused before the run folder is written


def test_compare_refuses_a_corrupt_meta_json_in_one_line_and_keeps_the_reports(nano_project, tmp_path, monkeypatch,
                                                                                 capsys):
    from study.compare import main
    from tests.synthetic_runs import arms_overrides, write_arms

    data = _copy_data(nano_project, tmp_path / "tokens")
    write_arms(tmp_path / "runs", {a: {s: loss + 0.01 * s for s in (1, 2, 3, 4, 5)}
                                   for a, loss in (("baseline", 4.0), ("nonlinear_q", 3.9))})
    args = [f"data.dir={data}", *arms_overrides(tmp_path)]
    monkeypatch.chdir(nano_project)
    assert main(args) == 0
    before = (tmp_path / "reports/summary.json").read_text()
    _edit_json(data / "meta.json", lambda m: m.update(yardsticks="none"))
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert str(data / "meta.json") in err and "'yardsticks' is a string" in err and "study.prepare" in err
    assert (tmp_path / "reports/summary.json").read_text() == before


# -- a prepare that fails or is killed leaves no temporary folder ------------------------------------
def _tmp_folders(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.glob(".tokens.tmp-*"))


@pytest.mark.slow  # prepare processes
def test_failed_prepare_removes_its_tmp_and_a_stale_one(nano_project, tmp_path, monkeypatch):
    """An exception mid-way removes the prepare's own .tmp; a .tmp left by a dead prepare of the same target
    (SIGKILL: no clean-up ran) is removed by the next prepare before it builds."""
    import study.data.build as build_mod
    from study.config import load_config

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".tokens.tmp-{int(dead.stdout)}"  # the pid of a process that has ended
    (stale / "train").mkdir(parents=True)
    (stale / "train/chunk-0-0.bin").write_bytes(b"\0" * 64)
    seen = []

    def failing_tokenizer(d, texts, path):
        seen.append((_tmp_folders(tmp_path), path.parent.is_dir()))
        path.write_text("{}")  # something written into the .tmp before the failure
        raise RuntimeError("tokenizer blew up")

    monkeypatch.setattr(build_mod, "make_tokenizer", failing_tokenizer)
    cfg = load_config([f"data.dir={tmp_path / 'tokens'}"], nano_project)
    with pytest.raises(RuntimeError, match="tokenizer blew up"):
        build_mod.build(cfg, nano_project)
    assert seen == [([f".tokens.tmp-{os.getpid()}"], True)]  # the stale one was gone before building
    assert _tmp_folders(tmp_path) == [] and not (tmp_path / "tokens").exists()


@pytest.mark.slow  # ~25 s: two prepare processes, each signalled mid-way
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signalled_prepare_removes_its_tmp(nano_project, tmp_path, sig):
    out = tmp_path / "tokens"
    proc = subprocess.Popen([sys.executable, "-m", "study.prepare", f"data.dir={out}", "data.max_docs_per_corpus=null"],
                            cwd=nano_project, env=env_for(nano_project), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not _tmp_folders(tmp_path) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert _tmp_folders(tmp_path), "the prepare never made its .tmp folder"
    time.sleep(0.5)  # mid-way: building
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, "the prepare ended before the signal: the test did not interrupt it"
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
        assert err.strip().splitlines()[-1].startswith("error: prepare stopped (SIGTERM)"), err[-2000:]
    assert _tmp_folders(tmp_path) == [], err[-2000:]
    assert not (out / "meta.json").exists()


@pytest.mark.slow  # ~20 s: a prepare process interrupted while litdata writes its chunks
def test_ctrl_c_while_litdata_writes_chunks_exits_130_in_one_line_and_removes_the_tmp(nano_project, tmp_path):
    """litdata's SIGINT handler used to end the prepare with os._exit(0): status 0, no word, the .tmp left."""
    out = tmp_path / "tokens"
    proc = subprocess.Popen([sys.executable, "-m", "study.prepare", f"data.dir={out}", "data.max_docs_per_corpus=null"],
                            cwd=nano_project, env=env_for(nano_project), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob(".tokens.tmp-*/train")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)  # optimize creates the split's folder when it starts writing
    assert list(tmp_path.glob(".tokens.tmp-*/train")), "the prepare never started writing chunks"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 130, err[-2000:]
    assert lines == [err.strip().splitlines()[-1]] and "interrupted" in lines[0] and "study.prepare" in lines[0], err
    assert "Traceback" not in err, err[-2000:]
    assert _tmp_folders(tmp_path) == [] and not out.exists()


# -- prepared data: every shaping key, token range ----------------------------------------------
@pytest.mark.parametrize("override,was,now", [
    ("data.val_every=20", "5", "20"),
    ("data.max_docs_per_corpus=100", "10", "100"),
    ("data.corpora=[sotu]", "['sotu', 'shakespeare', 'kjv']", "['sotu']"),
    ("data.vocab_size=300", "512", "300"),
    ("data.chunk_bytes=1MB", "'16MB'", "'1MB'"),
])


def test_data_prepared_with_other_settings_is_refused(nano_project, tmp_path, monkeypatch, capsys, override, was,
                                                      now):
    from study.train import main

    monkeypatch.chdir(nano_project)
    assert main([f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'm.db'}", override]) == 2
    err = one_line_error(capsys)
    key = override.split("=")[0]
    assert f"{key}={was} there, {now} here" in err and "study.prepare" in err, err
    assert err.count(" there, ") == 1  # only the key that differs
    assert f"re-run `python -m study.prepare {override} data.dir=" in err, err  # the command, as it is run


def test_two_stale_keys_are_named_together(nano_project, tmp_path, monkeypatch, capsys):
    from study.train import main

    monkeypatch.chdir(nano_project)
    assert main([f"study.runs_dir={tmp_path / 'runs'}", "data.val_every=20", "data.max_docs_per_corpus=100"]) == 2
    err = one_line_error(capsys)
    assert "data.val_every=5 there, 20 here" in err and "data.max_docs_per_corpus=10 there, 100 here" in err


def test_prepared_overrides_reproduce_the_settings_and_data_without_them_are_refused(
        nano_project, tmp_path):
    from study.config import load_config
    from study.data import DataError
    from study.data.records import check_prepared, prepared_overrides

    data = nano_project / "data/tokens"
    over = prepared_overrides(data)
    assert "data.val_every=5" in over and "data.max_docs_per_corpus=10" in over
    cfg = load_config(["data.val_every=20", "data.max_docs_per_corpus=100", "data.chunk_bytes=1MB", *over],
                      nano_project)
    assert check_prepared(data, cfg)["prepared_with"]["data.val_every"] == 5
    legacy = shutil.copytree(data, tmp_path / "tokens")  # meta.json of a prepare before prepared_with
    meta = json.loads((legacy / "meta.json").read_text())
    del meta["prepared_with"]
    (legacy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"lacks \['prepared_with'\]: re-run `python -m study.prepare`"):
        check_prepared(legacy, load_config([], nano_project))
    # GPT-2 tokens of a user folder: the keys that do not apply are left to the config
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "meta.json").write_text(json.dumps({"prepared_with": {
        "data.source": str(tmp_path), "data.corpora": None, "data.tokenizer": "gpt2", "data.vocab_size": None,
        "data.val_every": 8, "data.max_docs_per_corpus": None, "data.chunk_bytes": "16MB"}}))
    cfg = load_config(["data=gpt2", *prepared_overrides(gpt2)], nano_project)
    assert (cfg.data.source, cfg.data.val_every, cfg.data.max_docs_per_corpus) == (str(tmp_path), 8, None)


def test_token_ids_are_range_checked(nano_project, tmp_path, monkeypatch, capsys):
    from study.data.records import chunk_token_range
    from study.train import main

    assert chunk_token_range(nano_project / "data/tokens/train")[0] == 0  # <|endoftext|> is BPE id 0
    assert chunk_token_range(nano_project / "data/tokens/train")[1] < 512
    data = shutil.copytree(nano_project / "data/tokens", tmp_path / "tokens")
    chunk = next((data / "val").glob("*.bin"))
    raw = bytearray(chunk.read_bytes())
    start = int(np.frombuffer(raw, np.uint32, count=2)[1])  # litdata header: n items, n + 1 offsets
    pos = start + 2 * 1000  # token 1000 (uint16: vocab < 65536)
    raw[pos:pos + 2] = np.uint16(600).tobytes()
    chunk.write_bytes(bytes(raw))  # same size: the size check passes
    assert chunk_token_range(data / "val")[1] == 600
    monkeypatch.chdir(nano_project)
    assert main([f"data.dir={data}", f"study.runs_dir={tmp_path / 'runs'}",
                 f"study.tracking_db={tmp_path / 'm.db'}"]) == 2
    err = one_line_error(capsys)
    assert "token id 600" in err and "vocabulary of 512" in err and "val" in err


def test_data_prepared_under_the_old_vocabulary_key_are_refused_in_one_line(nano_project, tmp_path, monkeypatch,
                                                                            capsys):
    """A data folder whose meta.json records data.bpe_vocab_size (prepared before data.tokenizer=bytes and
    data.vocab_size) is refused by the run and by prepared_overrides, in one line naming prepare; nothing is trained
    and the folder is kept."""
    from study.data import DataError
    from study.data.records import prepared_overrides
    from study.train import main

    old = shutil.copytree(nano_project / "data/tokens", tmp_path / "old")
    meta = json.loads((old / "meta.json").read_text())
    was = meta["prepared_with"]
    meta["prepared_with"] = {**{k: v for k, v in was.items() if k != "data.vocab_size"},
                             "data.bpe_vocab_size": was["data.vocab_size"]}
    (old / "meta.json").write_text(json.dumps(meta))
    before = sorted((p.name, p.stat().st_size) for p in old.rglob("*"))
    monkeypatch.chdir(nano_project)
    assert main([f"study.runs_dir={tmp_path / 'runs'}", f"data.dir={old}"]) == 2
    err = one_line_error(capsys)
    assert f"{old} was prepared when the vocabulary was data.bpe_vocab_size" in err and "study.prepare" in err, err
    assert not (tmp_path / "runs").exists() and sorted((p.name, p.stat().st_size) for p in old.rglob("*")) == before
    with pytest.raises(DataError, match="was prepared when the vocabulary was data.bpe_vocab_size"):
        prepared_overrides(old)
