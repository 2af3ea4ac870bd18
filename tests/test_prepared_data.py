"""Runs survive kills, bad input, divergence and concurrent writers, and lose nothing."""
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

import pytest

from conftest import env_for, start_until_checkpoint
from study.analysis.runs import read_result  # metrics.json and record.json of a run folder

# -- bad input: one table ---------------------------------------------------------------------------
# (id, command, overrides, expected words in the one-line error)
BAD_INPUT = [
    ("unknown variant", "study.train", ["variant=nope"], ["unknown variant 'nope'", "nonlinear_q"]),
    ("unknown model", "study.train", ["model=huge"], ["unknown model 'huge'", "gpt3-small"]),
    ("typo in a key", "study.train", ["train.lrr=1e-3"], ["unknown key 'train.lrr'", "did you mean train.lr?"]),
    ("'+' adds an unread key", "study.train", ["+train.lrr=1e-3"], ["+train.lrr=1e-3: unknown key 'train.lrr'",
                                                                   "did you mean train.lr?"]),
    ("n_embd % n_head", "study.train", ["model.n_head=3"], ["model.n_embd=32", "n_head=3"]),
    ("bottleneck", "study.train", ["variant=nonlinear_q", "variant.bottleneck=0.3"], ["variant.bottleneck=0.3"]),
    ("zero lr", "study.train", ["train.lr=0"], ["train.lr=0"]),
    ("negative lr", "study.train", ["train.lr=-1e-3"], ["train.lr=-0.001"]),
    ("zero budget", "study.train", ["train.tokens=0"], ["train.tokens=0"]),
    ("empty seed list", "study.compare", ["study.seeds=[]"], ["study.seeds is empty"]),
    ("missing data", "study.train", ["data.dir=data/nowhere"], ["data/nowhere/meta.json", "study.prepare"]),
    ("other tokenizer", "study.train", ["data.tokenizer=gpt2", "model.vocab_size=50304"],
     ["tokenizer 'bpe'", "data.tokenizer='gpt2'"]),
    ("block too long", "study.train", ["model.max_block_size=32"], ["model.block_size=64", "max_block_size=32"]),
    ("vocab too large", "study.train", ["model.vocab_size=256"], ["bpe_vocab_size=512", "vocab_size=256"]),
    ("no '=' in override", "study.train", ["variant"], ["variant", "key=value"]),
    ("baseline not studied", "study.compare", ["study.baseline=nope"], ["study.baseline='nope'", "study.variants"]),
    ("unknown study variant", "study.compare", ["study.variants=[baseline,nope]"], ["unknown ['nope']"]),
    ("min_lr above lr", "study.train", ["train.min_lr=1.0"], ["min_lr=1.0", "lr=0.003"]),
    ("beta2 = 1", "study.train", ["train.beta2=1.0"], ["train.beta2=1.0", "[0, 1)"]),
    ("zero devices", "study.train", ["trainer.devices=0"], ["trainer.devices=0"]),
    ("wrong type", "study.train", ["train.tokens=many"], ["train.tokens", "many"]),
    ("devices not a number", "study.train", ["trainer.devices=abc"], ["trainer.devices='abc'", "trainer.devices=1"]),
    ("device list on CPU", "study.train", ["trainer.devices=[0,1]"], ["trainer.devices=[0, 1]", "accelerator=cpu"]),
    ("-1 devices on CPU", "study.train", ["trainer.devices=-1"], ["trainer.devices=-1", "accelerator=cpu"]),
    ("repeated GPU index", "study.train", ["trainer.accelerator=gpu", "trainer.devices=[0,0]"],
     ["trainer.devices=[0, 0]", "distinct GPU indices"]),
    ("unknown strategy", "study.train", ["trainer.strategy=bogus"], ["trainer.strategy='bogus'", "ddp", "fsdp"]),
    ("unknown accelerator", "study.train", ["trainer.accelerator=tpux"], ["trainer.accelerator='tpux'", "'cuda'"]),
    ("chunk size unit", "study.prepare", ["data.chunk_bytes=16XB"], ["data.chunk_bytes='16XB'", "MB", "16MB"]),
    ("chunk size zero", "study.prepare", ["data.chunk_bytes=0KB"], ["data.chunk_bytes='0KB'", "positive number"]),
    ("interpolation of a missing key", "study.train", ["train.tokens=${train.nope}"],
     ["train.tokens=${train.nope}", "Interpolation key 'train.nope' not found", "write a value", "${...} reference"]),
    ("unset environment variable", "study.params", ["train.tokens=${oc.env:STUDY_TEST_UNSET}"],
     ["train.tokens=${oc.env:STUDY_TEST_UNSET}", "STUDY_TEST_UNSET", "not found", "write a value"]),
    ("recursive interpolation", "study.config.__main__", ["train.lr=${train.lr}"],
     ["train.lr=${train.lr}", "Recursive interpolation", "write a value"]),
    ("empty study name", "study.train", ["study.name="], ["study.name=''", "MLflow experiment name", "non-empty"]),
    ("study name with '/'", "study.compare", ["study.name=a/b"], ["study.name='a/b'", "'/'"]),
    ("artifact_dir is a file", "study.train", ["study.artifact_dir=params.yaml"],
     ["study.artifact_dir=params.yaml is a file", "choose a folder"]),
    ("artifact_dir below a file", "study.train", ["study.artifact_dir=params.yaml/x"],
     ["study.artifact_dir=params.yaml/x is below the file", "params.yaml", "choose a folder"]),
    ("reports_dir is a file", "study.compare", ["study.reports_dir=params.yaml"],
     ["study.reports_dir=params.yaml is a file", "for the reports", "choose a folder"]),
    ("runs_dir below a file", "study.train", ["study.runs_dir=params.yaml/runs"],
     ["study.runs_dir=params.yaml/runs is below the file", "for the run folders"]),
    ("--check with an option", "study.config.__main__", ["--check", "--foo"],
     ["--check takes nothing else", "'--foo'"]),
    ("--params a folder", "study.train", ["--params", "conf", "--cfg", "job"], ["conf is not a file (a folder or a device)"]),
    ("--params without its value", "study.train", ["--params", "--cfg", "job"], ["--params needs a value"]),
    ("fp16 on CPU", "study.train", ["trainer.precision=16-mixed"],
     ["trainer.precision=16-mixed with trainer.accelerator=cpu", "bf16", "32-true"]),
    ("batch not whole windows", "study.train", ["train.batch_tokens=1000"],
     ["train.batch_tokens=1000 is not a multiple of model.block_size=64", "such as 960 or 1024"]),
    ("batch below one window", "study.config.__main__", ["train.batch_tokens=32", "train.tokens=4096"],
     ["train.batch_tokens=32 is less than one window of model.block_size=64", "train.batch_tokens=64"]),
    ("divergence_nats nan (QA: a traceback from config.json)", "study.train", ["train.divergence_nats=nan"],
     ["train.divergence_nats=nan is not a finite number"]),
    ("lr inf", "study.train", ["train.lr=inf"], ["train.lr=inf is not a finite number"]),
    ("weight_decay nan", "study.config.__main__", ["train.weight_decay=nan"],
     ["train.weight_decay=nan is not a finite number"]),
    ("a nan in a list", "study.train", ["tune.seeds=[101,nan]"], ["tune.seeds[1]=nan is not a finite"]),
    ("two nodes, no launcher", "study.train", ["trainer.num_nodes=2"],
     ["trainer.num_nodes=2", "no multi-node launcher", "torchrun", "srun", "trainer.num_nodes=1"]),
]


@pytest.mark.parametrize("case,module,overrides,words", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_table(nano_project, tmp_path, monkeypatch, capsys, case, module, overrides, words):
    import importlib

    monkeypatch.chdir(nano_project)
    runs = tmp_path / "runs"
    main = importlib.import_module(module).main
    rc = main([f"study.runs_dir={runs}", f"study.tracking_db={tmp_path / 'm.db'}", *overrides])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    assert not list(runs.glob("*/metrics.json"))  # nothing that looks complete


@pytest.mark.parametrize("env,launcher", [
    ({}, None), ({"SLURM_JOB_ID": "7", "SLURM_NNODES": "1"}, None), ({"SLURM_NTASKS": "8", "SLURM_NNODES": "2"}, "SLURM"),
    ({"TORCHELASTIC_RUN_ID": "x"}, "torchrun"), ({"NODE_RANK": "1"}, None),
    ({"MASTER_ADDR": "h", "NODE_RANK": "1"}, "MASTER_ADDR/NODE_RANK"), ({"MASTER_ADDR": "h", "WORLD_SIZE": "4"},
                                                                        "MASTER_ADDR/NODE_RANK")])
def test_multi_node_needs_a_launcher(env, launcher):
    from study.runner.launch import multi_node_launcher

    assert multi_node_launcher(env) == launcher


def test_trainer_names_are_lightnings():
    """The accelerator and strategy names checked before Lightning is imported are Lightning's own."""
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    from study.config.validation import ACCELERATORS, STRATEGIES

    assert set(STRATEGIES) == {"auto", *StrategyRegistry.available_strategies()}
    assert set(ACCELERATORS) == {"auto", "gpu", *AcceleratorRegistry.available_accelerators()}
    for path in (Path(__file__).parent.parent / "conf/trainer").glob("*.yaml"):  # every conf/trainer file passes
        import yaml
        c = yaml.safe_load(path.read_text())
        assert c["strategy"] in STRATEGIES and c["accelerator"] in ACCELERATORS, path


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


def _folder(run: Path) -> dict:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}


def _refused(main, args, run, before, capsys, *extra, words):
    """``study.train`` with ``extra`` exits 2 with one `error:` line holding ``words``; ``run`` is as it was."""
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert all(w in err for w in words), (words, err)
    assert _folder(run) == before and not (run / ".replaced").exists()


def _lightning_refuses(**kwargs):
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    raise MisconfigurationException("`devices` selected with `CPUAccelerator` should be an int > 0.\nmore")


def _refused_missing_packages(main, args, run, before, capsys):
    """Trainer settings whose package is not installed here (Lightning raises ModuleNotFoundError when the
    Trainer is built): each refused in one line, the run folder kept."""
    import importlib.util
    for extra, package in ((["trainer.accelerator=tpu", "train.overwrite=true"], "torch_xla"),
                           (["trainer.strategy=xla"], "torch_xla"),
                           (["trainer.precision=transformer-engine", "train.overwrite=true"], "transformer_engine")):
        if importlib.util.find_spec(package) is None:
            _refused(main, args, run, before, capsys, *extra,
                     words=[f"needs the package {package}, which is not installed", "install it", "conf/trainer"])


def test_a_trainer_lightning_refuses_keeps_the_finished_run(nano_project, tmp_path, monkeypatch, capsys):
    """Re-running a finished run with trainer settings that are refused (up front, or by Lightning when the
    Trainer is built; with train.overwrite=true or with the same resume key, which both replace it) exits 2
    with one `error:` line and leaves the finished run's files as they were: what a start replaces is only
    set aside (the run folder's .replaced/) until its Trainer exists, and put back when it does not.  The
    finished run is written here as train writes one (its resume record, completed); the slow test below
    trains it."""
    import lightning.pytorch

    from study.config import load_config
    from study.runner.run_state import resume_record, run_digest
    from study.train import main, write_json

    monkeypatch.chdir(nano_project)
    args = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
            f"study.artifact_dir={tmp_path / 'mlartifacts'}", "trainer.progress_bar=false"]
    cfg = load_config(args, nano_project)
    record = resume_record(cfg, nano_project / cfg.data.dir)
    run = tmp_path / "runs/baseline-s1"
    (run / "checkpoints").mkdir(parents=True)
    write_json(run / "checkpoints/run.json", {"config_hash": run_digest(cfg, nano_project / cfg.data.dir, record),
                                              "mlflow_run_id": None, "completed": True, "seconds": 1.0,
                                              "resume": record})
    (run / "checkpoints/last.ckpt").write_bytes(b"the finished run's weights")
    write_json(run / "metrics.json", {"val_loss": 5.0, "val_perplexity": 148.4, "tokens": 20480})
    write_json(run / "record.json", {"variant": "baseline", "seed": 1, "status": "ok"})
    (run / "curve.csv").write_text("step,tokens,train_loss,val_loss,lr\n10,20480,5.1,5.0,0.0003\n")
    write_json(run / "config.json", {"data_digest": "d"})
    before = _folder(run)

    _refused(main, args, run, before, capsys, "trainer.strategy=bogus", words=["trainer.strategy='bogus'"])
    _refused(main, args, run, before, capsys, "trainer.devices=[0,1]", "train.overwrite=true",
             words=["trainer.devices=[0, 1]"])
    _refused(main, args, run, before, capsys, "trainer.devices=abc", words=["trainer.devices='abc'"])
    for key in ("SLURM_NTASKS", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    _refused(main, args, run, before, capsys, "trainer.num_nodes=2", "train.overwrite=true",
             words=["trainer.num_nodes=2", "no multi-node launcher"])
    if sys.platform != "darwin":  # passes the checks; Lightning refuses it when the Trainer is built
        _refused(main, args, run, before, capsys, "trainer.accelerator=mps", "train.overwrite=true",
                 words=["Lightning refused the trainer settings", "accelerator='mps'", "MPSAccelerator"])
    _refused_missing_packages(main, args, run, before, capsys)
    monkeypatch.setattr(lightning.pytorch, "Trainer", _lightning_refuses)
    _refused(main, args, run, before, capsys, words=["Lightning refused the trainer settings",
                                                     "should be an int > 0", "conf/trainer"])
    _refused(main, args, run, before, capsys, "train.overwrite=true", "train.lr=1e-3", words=["Lightning refused"])
    # a start that died with the outputs set aside (SIGKILL before its Trainer existed): the next start puts
    # them back before it decides anything
    (run / ".replaced").mkdir()
    for name in ("metrics.json", "record.json", "checkpoints"):
        (run / name).replace(run / ".replaced" / name)
    (run / "checkpoints").mkdir()
    (run / "checkpoints/run.json").write_text("{}")  # what the dead start had begun to write
    _refused(main, args, run, before, capsys, words=["Lightning refused"])


@pytest.mark.slow
def test_a_trained_run_survives_a_rerun_lightning_refuses(run_in, tmp_path, monkeypatch, capsys):
    """The same with a run trained here: a refused re-run keeps every file of it."""
    import lightning.pytorch

    from study.train import main

    tiny = ["train.tokens=4096", "train.warmup_tokens=0"]
    run_in(*tiny)
    run = tmp_path / "runs/baseline-s1"
    before = _folder(run)
    assert {"metrics.json", "record.json", "curve.csv", "config.json", "checkpoints/run.json",
            "checkpoints/last.ckpt"} <= set(before)
    args = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
            f"study.artifact_dir={tmp_path / 'mlartifacts'}", "trainer.progress_bar=false", *tiny]
    _refused(main, args, run, before, capsys, "trainer.strategy=bogus", words=["trainer.strategy='bogus'"])
    if sys.platform != "darwin":
        _refused(main, args, run, before, capsys, "trainer.accelerator=mps", "train.overwrite=true",
                 words=["Lightning refused the trainer settings"])
    _refused_missing_packages(main, args, run, before, capsys)
    monkeypatch.setattr(lightning.pytorch, "Trainer", _lightning_refuses)
    _refused(main, args, run, before, capsys, "train.overwrite=true", words=["Lightning refused"])


def _copy_data(nano_project: Path, dest: Path) -> Path:
    shutil.copytree(nano_project / "data/tokens", dest)
    return dest


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


def test_failure_inside_a_run_marks_mlflow_failed(nano_project, tmp_path, monkeypatch, capsys):
    """A data error raised after the MLflow run has started: exit 2, run FAILED, no metrics.json.  A
    validation split too small for train.val_tokens is refused before anything starts."""
    from mlflow import MlflowClient

    import study.data.datamodule
    from study.data import DataError
    from study.train import main

    monkeypatch.chdir(nano_project)
    db = tmp_path / "m.db"
    args = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={db}", "trainer.progress_bar=false"]
    assert main([*args, "train.val_tokens=100000000"]) == 2
    assert "lower train.val_tokens to at most" in capsys.readouterr().err
    assert not db.exists() and not (tmp_path / "runs/baseline-s1/checkpoints").exists()

    def broken(*a, **k):
        raise DataError("the validation chunk is unreadable: re-run `python -m study.prepare`")

    monkeypatch.setattr(study.data.datamodule, "fixed_val_windows", broken)
    assert main(args) == 2 and "the validation chunk is unreadable" in capsys.readouterr().err
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"] and runs[0].info.end_time is not None
    assert not (tmp_path / "runs/baseline-s1/metrics.json").exists()



def test_a_failure_while_logging_the_run_settings_ends_the_mlflow_run_failed(nano_project, tmp_path, monkeypatch, capsys):
    """An exception between the MLflow run's creation and training (logging the params, config.yaml, run.json)
    ends that run FAILED with an end time, never RUNNING."""
    from mlflow import MlflowClient

    import study.train
    from study.config import StudyError

    def broken(*a, **k):
        raise StudyError("the artifact store is read-only: fix study.artifact_dir")

    monkeypatch.chdir(nano_project)
    monkeypatch.setattr(study.train, "log_text", broken, raising=False)
    import study.runner.tracking
    monkeypatch.setattr(study.runner.tracking, "log_text", broken)
    db = tmp_path / "m.db"
    assert study.train.main([f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={db}",
                             "trainer.progress_bar=false"]) == 2
    assert "the artifact store is read-only" in capsys.readouterr().err
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"] and runs[0].info.end_time is not None

# -- determinism, divergence ------------------------------------------------------------------------
def test_same_seed_gives_identical_curves(run_in, tmp_path):
    a = run_in("variant=nonlinear_q", "seed=3", f"study.runs_dir={tmp_path / 'a'}")
    b = run_in("variant=nonlinear_q", "seed=3", f"study.runs_dir={tmp_path / 'b'}")
    assert (tmp_path / "a/nonlinear_q-s3/curve.csv").read_text() == (tmp_path / "b/nonlinear_q-s3/curve.csv").read_text()
    assert a["val_loss"] == b["val_loss"]
    c = run_in("variant=nonlinear_q", "seed=4", f"study.runs_dir={tmp_path / 'c'}")
    assert c["val_loss"] != a["val_loss"]  # the seed matters


def test_divergence_stops_the_run_and_compare_reports_it(run_in, tmp_path, nano_project, monkeypatch):
    from mlflow import MlflowClient

    from study.analysis.summary import summarize
    from study.config import load_config

    m = run_in("variant=baseline", "seed=1", "train.lr=30", "train.min_lr=30", "train.warmup_tokens=0",
               "train.tokens=40960", "train.divergence_nats=0.5")
    assert m["status"] == "diverged" and m["steps"] == m["diverged_step"] <= 20
    assert "non-finite" in m["reason"] or "consecutive" in m["reason"] or "final" in m["reason"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = client.get_run(m["mlflow_run_id"])  # a result, not a crash (issue 25): FINISHED, tagged
    assert run.info.status == "FINISHED" and run.data.tags["diverged"] == m["reason"]
    assert run.data.tags["status"] == "diverged" and run.data.tags["diverged_step"] == str(m["diverged_step"])
    ok = run_in("variant=baseline", "seed=2")
    cfg = load_config(["study.seeds=[1,2]", "study.variants=[baseline]"], nano_project)
    runs = {"baseline": {1: {**m, "curve": []}, 2: {**ok, "curve": []}}}
    s = summarize(cfg, runs, nano_project)["variants"]["baseline"]
    assert s["n_seeds"] == 1 and s["val_loss_mean"] == ok["val_loss"]
    assert s["diverged"] == {"1": {"step": m["diverged_step"], "reason": m["reason"]}}


# -- kill and resume --------------------------------------------------------------------------------
def _train_cmd(runs: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "study.train", "variant=nonlinear_q", "seed=2", "train.tokens=163840",
            "trainer.progress_bar=false", f"study.runs_dir={runs}", f"study.tracking_db={db}", *extra]


def test_killed_run_resumes_exactly(nano_project, tmp_path):
    """SIGKILL a real training process mid-run; the same command resumes to the uninterrupted result."""
    from mlflow import MlflowClient

    ref = subprocess.run(_train_cmd(tmp_path / "ref", tmp_path / "ref.db"), cwd=nano_project,
                         env=env_for(nano_project), capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    runs, db = tmp_path / "runs", tmp_path / "m.db"
    ckpt = runs / "nonlinear_q-s2/checkpoints/last.ckpt"
    proc = start_until_checkpoint(_train_cmd(runs, db), nano_project, ckpt)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt.exists(), "no checkpoint before the kill"
    import torch
    killed_at = torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]
    assert 0 < killed_at < 80, killed_at  # really mid-run (80 steps in all)
    assert not (runs / "nonlinear_q-s2/metrics.json").exists()
    again = subprocess.run(_train_cmd(runs, db), cwd=nano_project, env=env_for(nano_project),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    ref_m = read_result(tmp_path / "ref/nonlinear_q-s2")
    got_m = read_result(runs / "nonlinear_q-s2")
    assert got_m["steps"] == ref_m["steps"] == 80
    assert abs(got_m["val_loss"] - ref_m["val_loss"]) < 1e-6
    ref_rows = (tmp_path / "ref/nonlinear_q-s2/curve.csv").read_text().splitlines()
    got_rows = (runs / "nonlinear_q-s2/curve.csv").read_text().splitlines()
    assert len(got_rows) == len(ref_rows) == 1 + 80 // 5
    for r, g in zip(ref_rows[1:], got_rows[1:]):
        rv, gv = [float(x) for x in r.split(",")], [float(x) for x in g.split(",")]
        assert all(abs(a - b) < 1e-6 for a, b in zip(rv, gv)), (r, g)
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs_in_store = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs_in_store) == 1 and runs_in_store[0].info.status == "FINISHED"  # continued, not a second run
    assert runs_in_store[0].info.run_id == got_m["mlflow_run_id"]


def test_two_writers_share_the_store(nano_project, tmp_path):
    """Two trainings at once on one SQLite store lose no run and no metric."""
    from mlflow import MlflowClient

    db = tmp_path / "shared.db"
    procs = [subprocess.Popen([sys.executable, "-m", "study.train", f"variant={v}", "seed=1",
                               "trainer.progress_bar=false", f"study.runs_dir={tmp_path / 'runs'}",
                               f"study.tracking_db={db}", "train.log_every=1"],
                              cwd=nano_project, env=env_for(nano_project), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for v in ("baseline", "identity_q")]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()[-2000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.info.run_name for r in runs) == ["baseline-s1", "identity_q-s1"]
    for r in runs:
        assert r.info.status == "FINISHED"
        steps = read_result(tmp_path / f"runs/{r.info.run_name}")["steps"]
        assert len(client.get_metric_history(r.info.run_id, "train_loss")) == steps
        curve = (tmp_path / f"runs/{r.info.run_name}/curve.csv").read_text().splitlines()
        assert len(client.get_metric_history(r.info.run_id, "val_loss")) == len(curve) - 1


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
    from tests.synthetic_runs import write_run

    data = _copy_data(nano_project, tmp_path / "tokens")
    for v, loss in (("baseline", 4.0), ("nonlinear_q", 3.9)):
        for s in (1, 2):
            write_run(tmp_path / f"runs/{v}-s{s}", v, s, loss + 0.01 * s)
    args = [f"data.dir={data}", f"study.runs_dir={tmp_path / 'runs'}", f"study.reports_dir={tmp_path / 'reports'}",
            "study.seeds=[1,2]", "study.variants=[baseline,nonlinear_q]", f"study.tracking_db={tmp_path / 'm.db'}"]
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


# -- study.tracking_db that cannot hold the store: refused before anything is written ------------------
@pytest.mark.parametrize("case", ["inside a file", "a folder", "not sqlite", "below a file"])
def test_unusable_tracking_db_is_refused_before_the_run_starts(nano_project, tmp_path, monkeypatch, capsys, case):
    from study.train import main

    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    db = {"inside a file": notes / "mlruns.db", "a folder": tmp_path,
          "not sqlite": notes, "below a file": notes / "a" / "b" / "mlruns.db"}[case]
    runs = tmp_path / "runs"
    finished = runs / "baseline-s1"
    finished.mkdir(parents=True)
    (finished / "metrics.json").write_text('{"val_loss": 4.0}')  # an earlier result in the run's folder
    monkeypatch.chdir(nano_project)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rc = main([f"study.runs_dir={runs}", f"study.tracking_db={db}", "variant=baseline", "seed=1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert f"study.tracking_db={db}" in err and "writable file path" in err, err
    assert notes.read_text() == "keep me" and notes.is_file()
    assert (finished / "metrics.json").read_text() == '{"val_loss": 4.0}'  # nothing lost
    assert sorted(p.name for p in finished.iterdir()) == ["metrics.json"]  # no lock, no checkpoint


# -- a prepare that fails or is killed leaves no temporary folder ------------------------------------
def _tmp_folders(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.glob(".tokens.tmp-*"))


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


def test_batch_tokens_on_several_processes_names_the_world_size(nano_project):
    """What validate cannot know (the world size) is checked when the run starts, in the same words."""
    from study.config import ConfigError, load_config
    from study.config.schedule import micro_batches

    cfg = load_config(["train.batch_tokens=4096"], nano_project)
    assert micro_batches(cfg, 2) == (min(cfg.train.micro_batch_size, 32), 32 // min(cfg.train.micro_batch_size, 32))
    with pytest.raises(ConfigError, match=r"train.batch_tokens=4096 is not a multiple of "
                                          r"model.block_size\*world_size=64\*3: use a multiple of 192 such as 4032 or 4224"):
        micro_batches(cfg, 3)


@pytest.mark.parametrize("module,args,words", [
    ("study.bench", ["--steps", "-1"], ["--steps", "-1 must be >= 1"]),
    ("study.bench", ["--repeats", "0"], ["--repeats", "0 must be >= 1"]),
    ("study.ui", ["--port", "99999", "--no-open"], ["--port", "99999 is not a TCP port"]),
])
def test_cli_numbers_out_of_range_are_refused_before_anything_runs(module, args, words):
    """A count of 0 (or below) for the benchmark, or a port outside 1-65535, is refused by argparse (exit 2,
    its error line last), before torch times anything or a server starts."""
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "error:" in last and all(w in last for w in words), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
