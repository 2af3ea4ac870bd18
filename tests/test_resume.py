"""Reliability, round two (issue 13): no hang on small data, resume where the numbers allow, honest
run states, stale or corrupt data refused, one writer per run folder, byte-stable prepare outputs,
MLFLOW_TRACKING_URI, and hand-started runs that never overwrite a finished run silently."""
from __future__ import annotations

import filecmp
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

from conftest import BIN, env_for, run_cli, start_until_checkpoint
from study.analysis.runs import read_result  # metrics.json and record.json of a run folder


def _store(db: Path):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    return client, client.search_runs([e.experiment_id for e in client.search_experiments()])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


# -- 1. no optimizer step: refused before Lightning starts -----------------------------------------
@pytest.mark.parametrize("block_size", [64, 32])
def test_a_loader_without_one_step_is_refused_at_once(nano_project, tmp_path, monkeypatch, capsys, block_size):
    from study.train import main

    chunks = json.loads((nano_project / "data/tokens/train/index.json").read_text())["chunks"]
    have = sum(c["dim"] // (block_size + 1) for c in chunks)  # TokensLoader: whole windows per chunk
    batch = (have + 1) * block_size  # one window more than the split holds
    monkeypatch.chdir(nano_project)
    t0 = time.time()
    rc = main([f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'm.db'}",
               f"model.block_size={block_size}", f"train.batch_tokens={batch}", f"train.tokens={batch}",
               "train.micro_batch_size=25", "trainer.progress_bar=false"])
    err = _one_line_error(capsys)
    assert rc == 2 and time.time() - t0 < 60
    assert f"holds {have} windows of {block_size + 1} tokens" in err and f"({have + 1} windows)" in err, err
    assert f"at most {have * block_size}" in err
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "runs").exists()  # no MLflow run, no folder


# -- 2. the resume key ------------------------------------------------------------------------------
NOT_NUMBERS = ["trainer.devices=2", "trainer.num_nodes=2", "trainer.strategy=ddp", "trainer.threads=1",
               "trainer.compile=true", "trainer.progress_bar=false", "train.micro_batch_size=8", "train.log_every=7",
               "train.val_micro_batch_size=8", "study.name=other", "study.group=g", "study.seeds=[5]",
               "study.runs_dir=elsewhere", "scale_ladder.tokens_per_param=2.0",
               "data.num_proc=3", "data.hf_cache_dir=/tmp/hf", "data.dir=data/copy", "train.overwrite=true"]
NUMBERS = ["train.lr=1e-3", "seed=2", "model.n_layer=3", "trainer.precision=bf16-mixed", "train.batch_tokens=4096",
           "train.eval_every=7", "train.val_tokens=4096", "variant=nonlinear_q", "data.val_every=7",
           "trainer.accelerator=gpu", "model.dropout=0.1", "data.chunk_bytes=1MB"]


def test_resume_key_covers_exactly_what_changes_the_numbers(nano_project):
    from study.config import config_hash, load_config

    base = config_hash(load_config([], nano_project))
    for o in NOT_NUMBERS:
        assert config_hash(load_config([o], nano_project)) == base, o
    hashes = {o: config_hash(load_config([o], nano_project)) for o in NUMBERS}
    assert base not in hashes.values() and len(set(hashes.values())) == len(NUMBERS)
    # one GPU, DDP over a node, FSDP: the same run (bf16, same batches), so one checkpoint serves all three
    assert len({config_hash(load_config([f"trainer={t}"], nano_project)) for t in ("gpu", "ddp", "fsdp")}) == 1
    # where the peak lr came from is not a setting: the lr it resolves to (variant.lr) is, so runs finished before
    # train.lr_from_tuned existed keep their key
    from study.config import resume_config
    key = resume_config(load_config([], nano_project))
    assert "train.lr_from_tuned" not in key and "variant.lr" in key


def test_run_digest_ignores_volatile_bytes(nano_project, tmp_path):
    from study.config import load_config
    from study.runner.run_state import run_digest

    cfg = load_config([], nano_project)
    copy = shutil.copytree(nano_project / "data/tokens", tmp_path / "tokens")
    meta = json.loads((copy / "meta.json").read_text())
    (copy / "meta.json").write_text(json.dumps({**meta, "seconds": 12.3}, indent=4))  # older prepares' timing
    assert run_digest(cfg, copy) == run_digest(cfg, nano_project / "data/tokens")
    (copy / "meta.json").write_text(json.dumps({**meta, "val_documents": meta["val_documents"][1:]}))
    assert run_digest(cfg, copy) != run_digest(cfg, nano_project / "data/tokens")


def _fail_at(monkeypatch, step: int):
    from study.modeling.lm import GPTModule

    original = GPTModule.on_train_batch_end

    def failing(self, outputs, batch, batch_idx):
        original(self, outputs, batch, batch_idx)
        if self.trainer.global_step >= step:
            raise RuntimeError(f"injected failure at step {self.trainer.global_step}")
    monkeypatch.setattr(GPTModule, "on_train_batch_end", failing)
    return original


def test_failed_run_resumes_on_other_settings_and_a_finished_run_is_not_overwritten(
        run_in, nano_project, tmp_path, monkeypatch, capsys):
    """Exception -> FAILED with an end time; the same run with other devices/threads/logging resumes it
    (one MLflow run, honouring MLFLOW_TRACKING_URI); a hand-started run with another lr is refused while
    the finished run is there, and replaces it only with train.overwrite=true."""
    from study.modeling.lm import GPTModule
    from study.train import main

    env_db = tmp_path / "env.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{env_db}")
    original = _fail_at(monkeypatch, 7)
    with pytest.raises(RuntimeError, match="injected failure at step 7"):
        run_in()
    client, runs = _store(env_db)
    assert [(r.info.status, r.info.end_time is not None) for r in runs] == [("FAILED", True)]
    failed_id = runs[0].info.run_id
    run = tmp_path / "runs/baseline-s1"
    state = json.loads((run / "checkpoints/run.json").read_text())
    assert state["mlflow_run_id"] == failed_id and state["resume"]["train.lr"] == 0.003
    assert not (run / "metrics.json").exists()

    monkeypatch.setattr(GPTModule, "on_train_batch_end", original)
    capsys.readouterr()
    m = run_in("trainer.threads=1", "train.log_every=3", "train.val_micro_batch_size=16", "trainer.name=other")
    assert "baseline-s1: resuming from step 5" in capsys.readouterr().out
    client, runs = _store(env_db)
    assert [(r.info.run_id, r.info.status) for r in runs] == [(failed_id, "FINISHED")] == [(m["mlflow_run_id"],
                                                                                           "FINISHED")]
    assert m["steps"] == 10 and [int(r.split(",")[0]) for r in (run / "curve.csv").read_text().splitlines()[1:]] \
        == [5, 10]
    assert not (tmp_path / "mlruns.db").exists()  # the env store, not study.tracking_db
    assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{env_db}"

    finished = (run / "metrics.json").read_bytes()
    rc = main([f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
               "trainer.progress_bar=false", "train.lr=1e-3"])
    err = _one_line_error(capsys)
    assert rc == 2 and "holds a finished run" in err and "train.lr: 0.003 -> 0.001" in err
    assert "study.group=NAME" in err and "train.overwrite=true" in err
    assert (run / "metrics.json").read_bytes() == finished and len(_store(env_db)[1]) == 1

    again = run_in("train.lr=1e-3", "train.overwrite=true")
    assert again["lr"] == 1e-3 and again["mlflow_run_id"] != failed_id
    assert sorted(r.info.status for r in _store(env_db)[1]) == ["FINISHED", "FINISHED"]


def test_an_unreadable_checkpoint_or_run_json_is_refused_in_one_line_and_kept(
        run_in, nano_project, tmp_path, monkeypatch, capsys):
    """A checkpoint cut short (SIGKILL while saving, a full disk) used to raise `PytorchStreamReader failed
    reading zip archive` on every start; a run.json that is not an object, an AttributeError."""
    from study.train import main

    db = tmp_path / "mlruns.db"
    original = _fail_at(monkeypatch, 7)
    with pytest.raises(RuntimeError, match="injected failure at step 7"):
        run_in()
    monkeypatch.setattr(__import__("study.modeling.lm", fromlist=["GPTModule"]).GPTModule, "on_train_batch_end", original)
    ckpts = tmp_path / "runs/baseline-s1/checkpoints"
    before = [(r.info.run_id, r.info.status) for r in _store(db)[1]]
    argv = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={db}",
            f"study.artifact_dir={tmp_path / 'mlartifacts'}", "trainer.progress_bar=false"]
    with open(ckpts / "last.ckpt", "r+b") as f:
        f.truncate(1000)
    capsys.readouterr()
    for _ in range(2):  # every start says so; nothing is deleted or changed
        assert main(argv) == 2
        err = _one_line_error(capsys)
        assert f"{ckpts / 'last.ckpt'} is unreadable (" in err and f"delete {ckpts} to start the run afresh" in err
        assert (ckpts / "last.ckpt").stat().st_size == 1000 and (ckpts / "run.json").is_file()
        assert [(r.info.run_id, r.info.status) for r in _store(db)[1]] == before
        assert sorted(p.name for p in ckpts.parent.iterdir() if p.name != ".lock") == ["checkpoints"]
    state = (ckpts / "run.json").read_text()
    (ckpts / "run.json").write_text("[1]")
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert f"{ckpts / 'run.json'} holds list [1], not a JSON object" in err and f"delete {ckpts}" in err
    (ckpts / "run.json").write_text(state)
    shutil.rmtree(ckpts)  # as the message says: the run starts afresh and finishes
    assert run_in()["steps"] == 10


@pytest.mark.slow  # ~120 s: a DDP run (2 interpreters) and two in-process runs
def test_a_checkpoint_resumes_on_another_world_size_in_the_same_mlflow_run(run_in, nano_project, tmp_path,
                                                                           monkeypatch):
    """Fail a 1-process run after its step-5 checkpoint; the same run on 2 DDP processes resumes it (one
    MLflow run, FINISHED) and ends where an uninterrupted 1-process run ends."""
    import torch

    from study.modeling.lm import GPTModule

    tokens, threads = f"train.tokens={20 * 32 * 64}", torch.get_num_threads()
    ref = run_in(tokens, "trainer.threads=1", f"study.runs_dir={tmp_path / 'ref'}")
    original = _fail_at(monkeypatch, 7)
    with pytest.raises(RuntimeError):
        run_in(tokens, "trainer.threads=1")
    monkeypatch.setattr(GPTModule, "on_train_batch_end", original)
    torch.set_num_threads(threads)
    env = {k: v for k, v in env_for(nano_project).items() if k not in ("RANK", "LOCAL_RANK", "NODE_RANK",
                                                                        "WORLD_SIZE", "SLURM_PROCID")}
    cmd = [sys.executable, "-m", "study.train", tokens, "trainer.threads=1", "trainer.progress_bar=false",
           "trainer.devices=2", "trainer.strategy=ddp", "train.micro_batch_size=8",
           f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
           f"study.artifact_dir={tmp_path / 'mlartifacts'}"]
    with open(tmp_path / "ddp.out", "w") as out, open(tmp_path / "ddp.err", "w") as err:
        proc = subprocess.Popen(cmd, cwd=nano_project, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, (tmp_path / "ddp.err").read_text()[-3000:]
    assert (tmp_path / "ddp.out").read_text().count("baseline-s1: resuming from step 5") == 1
    got = read_result(tmp_path / "runs/baseline-s1")
    assert got["steps"] == ref["steps"] == 20
    # steps and evaluations where the uninterrupted run had them (Lightning's loop counters re-expressed in
    # the new micro-batches), the same losses: every step trained on the same global batch
    rows, ref_rows = ([[float(x) for x in line.split(",")] for line in path.read_text().split()[1:]]
                      for path in (tmp_path / "runs/baseline-s1/curve.csv", tmp_path / "ref/baseline-s1/curve.csv"))
    assert [r[0] for r in rows] == [r[0] for r in ref_rows] == [5, 10, 15, 20]
    for r, q in zip(rows, ref_rows):
        assert abs(r[2] - q[2]) < 1e-4 and abs(r[3] - q[3]) < 1e-5, (r, q)
    _, runs = _store(tmp_path / "mlruns.db")
    mine = [r for r in runs if r.info.run_id != ref["mlflow_run_id"]]
    assert [(r.info.run_id, r.info.status) for r in mine] == [(got["mlflow_run_id"], "FINISHED")]


def test_loop_state_is_rescaled_to_the_new_accumulation():
    """Step 5 of a run with 1 micro-batch per step, resumed with 2 (and back): Lightning's micro-batch
    counters become steps x accumulation, so the next step and evaluation fall where they did."""
    from study.runner.run_state import rescale_loop_state

    def ckpt(total, current, steps):
        return {"global_step": steps, "loops": {"fit_loop": {"epoch_loop.batch_progress": {
            "total": dict.fromkeys(("ready", "completed", "started", "processed"), total),
            "current": dict.fromkeys(("ready", "completed", "started", "processed"), current)}}}}

    c = ckpt(5, 5, 5)
    rescale_loop_state(c, 2)
    bp = c["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert set(bp["total"].values()) == {10} and set(bp["current"].values()) == {10}
    c = ckpt(36, 12, 9)  # accumulation 4; 3 steps in this epoch -> accumulation 1
    rescale_loop_state(c, 1)
    bp = c["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert set(bp["total"].values()) == {9} and set(bp["current"].values()) == {3}
    c = ckpt(36, 12, 9)
    rescale_loop_state(c, 4)
    assert c == ckpt(36, 12, 9)  # same accumulation: untouched


# -- 3. signals: SIGTERM -> KILLED, SIGKILL found by the next start --------------------------------
def _train_cmd(runs: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "study.train", "variant=identity_q", "seed=4", "train.tokens=163840",
            "trainer.progress_bar=false", f"study.runs_dir={runs}", f"study.tracking_db={db}", *extra]


@pytest.mark.slow  # ~75 s: two training processes killed, one run in-process
def test_killed_runs_end_killed_never_running(nano_project, tmp_path, monkeypatch, capsys):
    from filelock import FileLock

    from study.train import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runs, db = tmp_path / "runs", tmp_path / "m.db"
    folder = runs / "identity_q-s4"
    ckpt = folder / "checkpoints/last.ckpt"
    proc = start_until_checkpoint(_train_cmd(runs, db), nano_project, ckpt)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    client, killed = _store(db)
    assert [(r.info.status, r.info.end_time is not None) for r in killed] == [("KILLED", True)]
    assert not (folder / "metrics.json").exists()
    FileLock(str(folder / ".lock"), timeout=0).acquire()  # released by the dead process (raises if not)

    # the same command resumes the KILLED run (RUNNING again); SIGKILL leaves it RUNNING ...
    proc = subprocess.Popen(_train_cmd(runs, db), cwd=nano_project, env=env_for(nano_project),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert "identity_q-s4: resuming from step" in line, line
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert client.get_run(killed[0].info.run_id).info.status == "RUNNING"
    # ... until the next start in that folder, here with other settings: it starts afresh and says why
    monkeypatch.chdir(nano_project)
    capsys.readouterr()
    assert main(_train_cmd(runs, db, "train.lr=1e-3", "train.tokens=20480")[3:]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "starting afresh" in x)
    assert "train.lr: 0.003 -> 0.001" in line and "train.tokens: 163840 -> 20480" in line
    assert "trainer" not in line and "code:" not in line  # only what differs
    assert "MLFLOW_TRACKING_URI" not in os.environ  # MLflow exported it during the run; not left behind
    old = client.get_run(killed[0].info.run_id).info
    assert old.status == "KILLED" and old.end_time is not None
    assert sorted(r.info.status for r in _store(db)[1]) == ["FINISHED", "KILLED"]


# -- 4. one writer per run folder --------------------------------------------------------------------
def test_a_second_writer_is_refused_in_one_line(nano_project, tmp_path, monkeypatch, capsys):
    from filelock import FileLock

    from study.train import main

    runs = tmp_path / "runs"
    folder = runs / "baseline-s1"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints/run.json").write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); lock.acquire(); "
        "print('locked', flush=True); time.sleep(300)"), str(folder / ".lock")],
        stdout=subprocess.PIPE, text=True, env=env_for(nano_project))
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.chdir(nano_project)
        rc = main([f"study.runs_dir={runs}", f"study.tracking_db={tmp_path / 'm.db'}", "trainer.progress_bar=false"])
        err = _one_line_error(capsys)
        assert rc == 2 and f"another process is writing {folder}" in err
        assert (folder / "checkpoints/run.json").read_text() == "{}"  # nothing of the other writer's touched
    finally:
        holder.kill()
        holder.wait()
    FileLock(str(folder / ".lock"), timeout=0).acquire()  # an OS lock: free once its holder died


@pytest.mark.slow  # ~60 s: two training processes at once
def test_the_same_command_twice_at_once(nano_project, tmp_path):
    """Issue 13's two writers: the second identical command refuses in one line, one MLflow run."""
    runs, db = tmp_path / "runs", tmp_path / "m.db"
    logs = [tmp_path / f"stderr{i}.txt" for i in range(2)]
    procs = [subprocess.Popen(_train_cmd(runs, db), cwd=nano_project, env=env_for(nano_project),
                              stdout=subprocess.DEVNULL, stderr=open(log, "w")) for log in logs]
    codes = [p.wait(timeout=600) for p in procs]
    assert sorted(codes) == [0, 2], codes
    err = logs[codes.index(2)].read_text().strip().splitlines()
    assert err == [f"error: another process is writing {runs / 'identity_q-s4'} (it holds "
                   f"{runs / 'identity_q-s4/.lock'}): wait for it to end or stop it; a different run needs its own "
                   f"folder (study.group=NAME)"], err[-3:]
    _, in_store = _store(db)
    assert [(r.info.run_name, r.info.status) for r in in_store] == [("identity_q-s4", "FINISHED")]
    assert read_result(runs / "identity_q-s4")["steps"] == 80


# -- 5. prepared data: every shaping key, token range ----------------------------------------------
@pytest.mark.parametrize("override,was,now", [
    ("data.val_every=20", "5", "20"),
    ("data.max_docs_per_corpus=100", "10", "100"),
    ("data.corpora=[sotu]", "['sotu', 'shakespeare', 'kjv']", "['sotu']"),
    ("data.bpe_vocab_size=300", "512", "300"),
    ("data.chunk_bytes=1MB", "'16MB'", "'1MB'"),
])
def test_data_prepared_with_other_settings_is_refused(nano_project, tmp_path, monkeypatch, capsys, override, was,
                                                      now):
    from study.train import main

    monkeypatch.chdir(nano_project)
    assert main([f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'm.db'}", override]) == 2
    err = _one_line_error(capsys)
    key = override.split("=")[0]
    assert f"{key}={was} there, {now} here" in err and "study.prepare" in err, err
    assert err.count(" there, ") == 1  # only the key that differs


def test_two_stale_keys_are_named_together(nano_project, tmp_path, monkeypatch, capsys):
    from study.train import main

    monkeypatch.chdir(nano_project)
    assert main([f"study.runs_dir={tmp_path / 'runs'}", "data.val_every=20", "data.max_docs_per_corpus=100"]) == 2
    err = _one_line_error(capsys)
    assert "data.val_every=5 there, 20 here" in err and "data.max_docs_per_corpus=10 there, 100 here" in err


def test_prepared_overrides_reproduce_the_settings_and_legacy_data_are_checked_on_what_they_record(
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
    with pytest.raises(DataError, match="data.val_every=5 there, 20 here"):
        check_prepared(legacy, load_config(["data.val_every=20"], nano_project))
    check_prepared(legacy, load_config([], nano_project))
    # GPT-2 tokens of a user folder: the keys that do not apply are left to the config
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "meta.json").write_text(json.dumps({"prepared_with": {
        "data.source": str(tmp_path), "data.corpora": None, "data.tokenizer": "gpt2", "data.bpe_vocab_size": None,
        "data.val_every": 8, "data.max_docs_per_corpus": None, "data.chunk_bytes": "16MB"}}))
    cfg = load_config(["data=gpt2", "model.vocab_size=50304", *prepared_overrides(gpt2)], nano_project)
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
    err = _one_line_error(capsys)
    assert "token id 600" in err and "vocabulary of 512" in err and "val" in err


# -- 6. byte-identical prepare outputs ---------------------------------------------------------------
def test_prepare_twice_gives_byte_identical_data(nano_project, tmp_path):
    from study.config import load_config
    from study.runner.run_state import run_digest

    small = ["model=nano", "data.corpora=[sotu]", "data.max_docs_per_corpus=7", "data.val_every=3",
             "data.bpe_vocab_size=300"]
    for name in ("a", "b"):
        r = run_cli(nano_project, "study.prepare", *small, f"data.dir={tmp_path / name}", timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    a, b = tmp_path / "a", tmp_path / "b"
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert {str(f) for f in files} >= {"meta.json", "tokenizer.json", "train/index.json", "val/index.json"}
    assert sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) == files
    _, mismatch, errors = filecmp.cmpfiles(a, b, [str(f) for f in files], shallow=False)
    assert mismatch == [] and errors == []
    assert "seconds" not in json.loads((a / "meta.json").read_text())
    assert json.loads((tmp_path / "a-timing.json").read_text())["seconds"] > 0  # timing beside, not inside
    cfg = load_config(small, nano_project)
    assert run_digest(cfg, a) == run_digest(cfg, b)


def test_compare_twice_gives_byte_identical_reports(nano_project, tmp_path, monkeypatch):
    """The same runs give the same report, summary and figures, byte for byte (no dates, no timings)."""
    from study.compare import main

    from tests.synthetic_runs import write_run

    runs = tmp_path / "runs"
    for seed, off in ((1, -0.01), (2, 0.0), (3, 0.013)):
        for v, n in {"baseline": 1.2e5, "baseline_mlp5": 1.6e5, "nonlinear_q": 1.0e5}.items():
            write_run(runs / f"{v}-s{seed}", v, seed, 10 * n ** -0.1 + off * (1 + len(v) / 10), params=int(n),
                      fpt=6 * int(n), per_corpus={"sotu": 4.0 + off, "kjv": 3.0 - off})
    monkeypatch.chdir(nano_project)
    for out in ("a", "b"):
        assert main([f"study.runs_dir={runs}", f"study.reports_dir={tmp_path / out}", "study.seeds=[1,2,3]",
                     "study.variants=[baseline,baseline_mlp5,nonlinear_q]"]) == 0
    files = sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert {"comparison.md", "summary.json"} <= set(files) and sum(f.endswith(".png") for f in files) >= 2
    assert sorted(str(p.relative_to(tmp_path / "b")) for p in (tmp_path / "b").rglob("*") if p.is_file()) == files
    assert filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", files, shallow=False)[1:] == ([], [])


# -- 7. MLFLOW_TRACKING_URI --------------------------------------------------------------------------
def test_tracking_uri_honours_mlflow_stores_or_refuses(nano_project, tmp_path, monkeypatch, capsys):
    from study.config import ConfigError, load_config
    from study.runner.tracking import tracking_uri
    from study.train import main

    study = load_config([], nano_project).study
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert tracking_uri(nano_project, study) == f"sqlite:///{nano_project.resolve() / 'mlruns.db'}"
    for uri in (f"sqlite:///{tmp_path}/x.db", "postgresql://u@db/mlflow", "http://127.0.0.1:5000", "databricks"):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert tracking_uri(nano_project, study) == uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:./mlruns")
    with pytest.raises(ConfigError, match="MLFLOW_ALLOW_FILE_STORE=true"):
        tracking_uri(nano_project, study)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert tracking_uri(nano_project, study) == "file:./mlruns"
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    monkeypatch.chdir(nano_project)
    for uri, words in (("file:./mlruns", "file store"), ("foo://bar", "no tracking store")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert main([f"study.runs_dir={tmp_path / 'runs'}"]) == 2
        err = _one_line_error(capsys)
        assert f"MLFLOW_TRACKING_URI={uri}" in err and words in err
    assert not (tmp_path / "runs").exists() and not (nano_project / "mlruns").exists()


# -- 8. dvc repro is not an ad-hoc run: DVC leaves a stage's outputs in place, the stage's run replaces them ----
def test_dvc_keeps_persisted_outputs_when_a_stage_command_fails(tmp_path):
    """What DVC does with a train stage's declaration (persist: true, cache: false): the output is not deleted
    before the command, so a command that refuses leaves it as it was (issue 25 item 3)."""
    import yaml

    root = Path(__file__).resolve().parent.parent
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    train_like = [s for s in stages.values() if "study.train" in s["cmd"]]
    assert len(train_like) >= 4
    for s in train_like:
        [metrics] = s["metrics"]
        [(path, opts)] = metrics.items()
        assert path.endswith("metrics.json") and opts == {"persist": True, "cache": False}
    (tmp_path / "dep.txt").write_text("1")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: python -c \"import os, sys; open('log.txt', 'a').write(str(os.path.exists("
        "'r/metrics.json')) + chr(10)); d = open('dep.txt').read(); d == 'bad' and sys.exit(2); "
        "os.makedirs('r/checkpoints', exist_ok=True); open('r/metrics.json', 'w').write(d)\"\n"
        "    deps: [dep.txt]\n    outs:\n      - r/checkpoints:\n          persist: true\n          cache: false\n"
        "    metrics:\n      - r/metrics.json:\n          persist: true\n          cache: false\n")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    dvc = [str(BIN / "dvc")]
    for cmd in (["init", "--no-scm", "-q"], ["repro", "-q"]):
        subprocess.run(dvc + cmd, cwd=tmp_path, env=env, check=True, capture_output=True)
    (tmp_path / "dep.txt").write_text("bad")
    assert subprocess.run(dvc + ["repro", "-q"], cwd=tmp_path, env=env, capture_output=True).returncode != 0
    assert (tmp_path / "r/metrics.json").read_text() == "1"  # the command refused: the output is as it was
    (tmp_path / "dep.txt").write_text("2")
    subprocess.run(dvc + ["repro", "-q"], cwd=tmp_path, env=env, check=True, capture_output=True)
    assert (tmp_path / "log.txt").read_text().split() == ["False", "True", "True"]
    assert (tmp_path / "r/metrics.json").read_text() == "2"


def test_a_dvc_stage_replaces_its_finished_run_a_hand_run_does_not(run_in, tmp_path, monkeypatch):
    """With the outputs persisted, a train stage that DVC re-runs (DVC_STAGE set) finds the finished run of its
    folder and replaces it, as `train.overwrite=true` does; a hand-started run is still refused."""
    from study.config import ConfigError

    monkeypatch.delenv("DVC_STAGE", raising=False)
    run_in("variant=baseline", "seed=1", "train.tokens=4096")
    with pytest.raises(ConfigError, match="holds a finished run with other settings"):
        run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.lr=1e-3")
    monkeypatch.setenv("DVC_STAGE", "train@baseline-1")
    m = run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.lr=1e-3")
    assert m["status"] == "ok" and read_result(tmp_path / "runs/baseline-s1")["lr"] == 1e-3


def test_a_finished_run_without_its_checkpoints_is_judged_by_its_config_json(run_in, tmp_path, monkeypatch):
    """QA: with a finished run's checkpoints/ deleted (its run.json held the settings), the very same command was
    refused as "a finished run with other settings ((not recorded))"; config.json records them: the same settings
    run, other settings are named."""
    import shutil

    from study.config import ConfigError

    monkeypatch.delenv("DVC_STAGE", raising=False)
    run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.schedule=d2z")
    shutil.rmtree(tmp_path / "runs/baseline-s1/checkpoints")
    with pytest.raises(ConfigError, match=r"other settings \(train.z_loss: 0.0 -> 0.001\)"):
        run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.schedule=d2z", "train.z_loss=1e-3")
    assert not (tmp_path / "runs/baseline-s1/checkpoints").exists()  # refused before anything was written
    m = run_in("variant=baseline", "seed=1", "train.tokens=4096", "train.schedule=d2z", "trainer.threads=1")
    assert m["status"] == "ok"
