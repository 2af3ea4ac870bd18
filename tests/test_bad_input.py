"""Bad input is refused in one line before anything runs: config values, overrides, command-line numbers, a
data folder that is a file, a loader without one optimizer step, multi-node settings without a launcher."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import one_line_error


# -- no optimizer step: refused before Lightning starts -----------------------------------------
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
    err = one_line_error(capsys)
    assert rc == 2 and time.time() - t0 < 60
    assert f"holds {have} windows of {block_size + 1} tokens" in err and f"({have + 1} windows)" in err, err
    assert f"at most {have * block_size}" in err
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "runs").exists()  # no MLflow run, no folder


def test_data_dir_pointing_at_a_file_is_named(nano_project, tmp_path, monkeypatch, capsys):
    from study.train import main

    monkeypatch.chdir(nano_project)
    f = tmp_path / "tokens.bin"
    f.write_bytes(b"x")
    assert main([f"data.dir={f}", f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'm.db'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert f"data.dir={f} is a file" in err and "meta.json not found" not in err


def test_a_bad_override_is_named_alone(nano_project, tmp_path, monkeypatch, capsys):
    from study.train import main

    monkeypatch.chdir(nano_project)
    assert main(["seed=1", "train.lr=[1e-3", "variant=baseline", f"study.runs_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad override (train.lr=[1e-3)" in err and "seed=1" not in err and "variant=baseline" not in err


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
    ("other tokenizer", "study.train", ["data.tokenizer=gpt2", "data.vocab_size=null"],
     ["tokenizer 'bpe'", "data.tokenizer='gpt2'"]),
    ("block too long", "study.train", ["model.max_block_size=32"], ["model.block_size=64", "max_block_size=32"]),
    ("bytes given a size", "study.train", ["data.tokenizer=bytes", "data.vocab_size=300"],
     ["data.vocab_size=300", "data.tokenizer=bytes has its own 257 ids", "data.vocab_size=null"]),
    ("bytes given its own size", "study.train", ["data.tokenizer=bytes", "data.vocab_size=257"],
     ["data.vocab_size=257", "has its own 257 ids"]),
    ("a BPE beyond any in use", "study.train", ["data.vocab_size=100000000"], ["from 257", "1,048,576, not 100000000"]),
    ("the old vocabulary key", "study.train", ["data.bpe_vocab_size=512"],
     ["unknown key 'data.bpe_vocab_size'", "it was removed", "data.tokenizer=bpe data.vocab_size=N"]),
    ("the old model vocabulary", "study.train", ["model.vocab_size=512"],
     ["unknown key 'model.vocab_size'", "it was removed", "model.vocab_multiple"]),
    ("bpe without a size", "study.train", ["data.vocab_size=null"], ["data.tokenizer=bpe needs data.vocab_size"]),
    ("no '=' in override", "study.train", ["variant"], ["variant", "key=value"]),
    ("the old shared-lr list", "study.compare", ["study.variants=[baseline,nonlinear_q]"],
     ["unknown key 'study.variants'", "it was removed", "study.arms"]),
    ("nothing to compare", "study.compare", [], ["study.arms is empty and the scale ladder is off"]),
    ("unknown study arm", "study.compare", ["study.arms=[baseline,nope]"], ["nope"]),
    ("an arm name with a slash", "study.compare", ["study.arms=[baseline,x/y]"], ["arm name 'x/y' is not one folder"]),
    ("compare given a run's group", "study.compare", ["study.group=adhoc"], ["study.group=adhoc", "drop study.group"]),
    ("a misspelt test-stage option", "study.test_runs", ["--dry"],
     ["unknown option --dry", "--params FILE, --dry-run;"]),
    ("a misspelt tune option", "study.tune", ["--write", "--wirte"],
     ["unknown option --wirte", "--arm NAME, --write, --targets, --ladder MODEL, --dry-run;"]),
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
    from study.runner.world import multi_node_launcher

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


@pytest.mark.slow  # three interpreters started
def test_cli_numbers_out_of_range_are_refused_before_anything_runs(module, args, words):
    """A count of 0 (or below) for the benchmark, or a port outside 1-65535, is refused by argparse (exit 2,
    its error line last), before torch times anything or a server starts."""
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "error:" in last and all(w in last for w in words), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("module,args,words", [
    ("study.tune", [], ["name what to do: --arm NAME, --write, --targets or --ladder MODEL"]),
    ("study.tune", ["--arm", "--dry-run"], ["--arm needs an arm name"]),
    ("study.tune", ["--arm", "baseline", "--targets"], ["--targets: not allowed with argument --arm"]),
    ("study.tune", ["--targets", "--write"], ["--write: not allowed with argument --targets"]),
    ("study.tune", ["--write", "--dry-run"], ["--dry-run goes with --arm NAME"]),
    ("study.ui", ["--screenshot", "x.png", "--no-open"], ["--screenshot goes with --check", "add --check"]),
    ("study.ui", ["--install"], ["--install goes with --check"]),
    ("study.ui", ["--port", "0"], ["--port", "0 is not a TCP port"]),
    ("study.ui", ["foo"], ["unrecognized arguments: foo"]),
])
def test_a_stages_own_options_misused_are_one_line_before_anything_runs(module, args, words, capsys, monkeypatch):
    """Two modes at once used to run the last one named (`--arm X --targets` printed the targets, exit 0), an option
    the command ignores started the server, and argparse printed its usage block: now one `error:` line, exit 2."""
    import importlib

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert importlib.import_module(module).main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and all(w in err for w in words), err


def test_a_bad_ui_port_in_the_environment_is_one_line(capsys, monkeypatch):
    """UI_PORT=abc used to end in a traceback (the default was int()'d before argparse saw it)."""
    from study.ui import main

    monkeypatch.setenv("UI_PORT", "abc")
    assert main(["--no-open"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: argument --port: 'abc' is not a port number") and "UI_PORT" in err, err
