"""Resume: the resume key covers exactly what changes the numbers, a killed or failed run resumes to the
uninterrupted result (on another world size too), a finished run is never overwritten silently, an unreadable
checkpoint is refused and kept."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from study.config import ConfigError

from study.runfolder import read_result
from conftest import env_for, mlflow_runs, one_line_error, start_until_checkpoint, train_cmd


# -- the resume key ------------------------------------------------------------------------------
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
    # where the peak lr came from is not a setting: the lr it resolves to (arm.lr) is, so runs finished before
    # train.lr_from_tuned existed keep their key
    from study.config import resume_config
    key = resume_config(load_config([], nano_project))
    assert "train.lr_from_tuned" not in key and "arm.lr" in key


def test_a_runs_key_holds_its_own_tasks_fields_only(nano_project):
    """A task field the run's task does not read is not in its key: mqar's or mlm's defaults may change without
    turning a finished lm run into one "trained under other settings" (an lm key has no task field at all)."""
    from study.config import config_hash, load_config, resume_config

    lm = resume_config(load_config([], nano_project))
    assert not [k for k in lm if k.startswith("task.")]
    for o in ("task.num_kv_pairs=8", "task.mask_fraction=0.3"):  # another task's setting: refused, naming its task
        with pytest.raises(ConfigError, match=r"^unknown key 'task\.\w+' .*: it is a setting of task m\w+ \(task=m"):
            load_config([o], nano_project)
    mqar = resume_config(load_config(["task=mqar"], nano_project))
    assert mqar["task.name"] == "mqar" and mqar["task.num_kv_pairs"] == 4 and "task.mask_fraction" not in mqar
    assert config_hash(load_config(["task=mqar", "task.num_kv_pairs=8"], nano_project)) != \
        config_hash(load_config(["task=mqar"], nano_project))
    mlm = resume_config(load_config(["task=mlm"], nano_project))
    assert mlm["task.mask_fraction"] == 0.15 and "task.num_kv_pairs" not in mlm
    assert config_hash(load_config(["task=mlm", "task.mask_fraction=0.3"], nano_project)) != \
        config_hash(load_config(["task=mlm"], nano_project))


def test_a_key_stored_under_an_older_rule_matches_when_it_differs_only_in_what_the_rule_drops():
    from study.runner.resume_key import same_key

    today = {"train.lr": 3e-3, "variant.name": "baseline", "code:study/modeling/model.py": "ab12", "data:meta.json": "cd"}
    older = {**today, "task.name": "lm", "task.num_kv_pairs": 8, "task.train_examples": 100000}  # mqar's old defaults
    assert same_key(older, today) and same_key(today, today)
    assert not same_key({**older, "train.lr": 1e-3}, today)  # a setting that changes the numbers
    assert not same_key({**older, "code:study/modeling/model.py": "ef34"}, today)  # the training code
    assert not same_key({**older, "task.name": "mqar"}, today)  # another task keeps its own fields
    assert not same_key(None, today)


def test_every_task_names_the_fields_it_reads():
    import yaml

    from study.config import load_config, task_names
    from study.config.naming import config_hash as key
    from study.config.task import COMMON_FIELDS, task_fields

    assert task_names() == ["lm", "mlm", "mqar"]
    assert task_fields("lm") == () and task_fields("nope") is None  # an lm key holds no task field, as before tasks
    assert task_fields("mlm") == ("name", "mask_fraction", "mask_token_fraction", "random_token_fraction")
    for t in task_names():  # each conf/task file sets exactly its module's settings, and every task's common fields
        own = yaml.safe_load((Path(__file__).resolve().parent.parent / "conf" / "task" / f"{t}.yaml").read_text())
        assert set(own) - set(COMMON_FIELDS) == set(task_fields(t)) - {"name"} and own["name"] == t
    # a resolved field reaches the key through the section it fills: mlm's default positions are the named ones
    assert key(load_config(["task=mlm"])) == key(load_config(["task=mlm", "model.position=rope"]))
    assert key(load_config(["task=mlm"])) != key(load_config(["task=mlm", "model.position=learned"]))
    assert key(load_config(["task=mlm", "task.position=learned"])) == key(load_config(["task=mlm",
                                                                                     "model.position=learned"]))


def test_a_folder_stored_under_the_older_rule_is_resumed_or_kept_under_todays_key(nano_project, tmp_path, monkeypatch):
    """A finished lm run whose run.json holds mqar's old defaults is not "a finished run with other settings" to a
    hand-started rerun; an unfinished one resumes, and its run.json takes today's key."""
    from study.config import load_config
    from study.runner.resume_key import resume_record, run_digest
    from study.runner.run_state import open_run_folder

    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    cfg = load_config([], nano_project)
    data = nano_project / "data/tokens"
    record = resume_record(cfg, data)
    older = {**record, "task.name": "lm", "task.num_kv_pairs": 8, "task.train_examples": 100000}
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints/last.ckpt").write_bytes(b"x")
    state = {"config_hash": run_digest(cfg, data, older), "mlflow_run_id": "abc", "completed": False, "resume": older}
    (out / "checkpoints/run.json").write_text(json.dumps(state))
    rec, digest, st, run_id, resume, replaced = open_run_folder(cfg, "run", out, data, rank=0)
    replaced.restore()
    assert resume == out / "checkpoints/last.ckpt" and run_id == "abc"
    assert st["config_hash"] == digest == run_digest(cfg, data) and st["resume"] == record
    (out / "metrics.json").write_text("{}")  # finished: a hand-started rerun of the same settings is not refused
    (out / "checkpoints/run.json").write_text(json.dumps({**state, "completed": True}))
    open_run_folder(cfg, "run", out, data, rank=0)[-1].restore()
    (out / "checkpoints/run.json").write_text(json.dumps({**state, "completed": True,
                                                         "resume": {**older, "train.lr": 1.0}}))
    with pytest.raises(Exception, match=r"finished run with other settings \(train.lr: 1.0 -> "):
        open_run_folder(cfg, "run", out, data, rank=0)


def test_an_edited_task_name_is_a_difference_not_a_crash():
    from study.config import own_task_fields
    from study.runner.resume_key import same_key

    assert own_task_fields({"task.name": ["lm"], "task.num_kv_pairs": 4}) == {"task.name": ["lm"], "task.num_kv_pairs": 4}
    assert not same_key({"task.name": {"a": 1}}, {"train.lr": 1.0})


def test_run_digest_ignores_volatile_bytes(nano_project, tmp_path):
    from study.config import load_config
    from study.runner.resume_key import run_digest

    cfg = load_config([], nano_project)
    copy = shutil.copytree(nano_project / "data/tokens", tmp_path / "tokens")
    meta = json.loads((copy / "meta.json").read_text())
    (copy / "meta.json").write_text(json.dumps({**meta, "seconds": 12.3}, indent=4))  # older prepares' timing
    assert run_digest(cfg, copy) == run_digest(cfg, nano_project / "data/tokens")
    (copy / "meta.json").write_text(json.dumps({**meta, "val_documents": meta["val_documents"][1:]}))
    assert run_digest(cfg, copy) != run_digest(cfg, nano_project / "data/tokens")


# -- the code part of the key: what the training files compute, not their docstrings, comments or layout ----
MODEL = Path(__file__).resolve().parent.parent / "study/modeling/model.py"


def _edited(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """A copy of study/modeling/model.py with the first ``old`` replaced by ``new`` (asserted to occur)."""
    src = MODEL.read_text()
    assert old in src, old
    out = tmp_path / f"{name}.py"
    out.write_text(src.replace(old, new, 1))
    assert out.read_text() != src
    return out


def test_a_docstring_comment_or_layout_edit_keeps_the_code_digest(tmp_path):
    from study.runfolder.digests import source_digest

    base = source_digest(MODEL)
    assert source_digest(Path(shutil.copy(MODEL, tmp_path / "copy.py"))) == base  # elsewhere, unedited
    keeps = {  # the module's docstring, a method's, a comment and a function's layout
        "module_doc": ('"""GPT decoder whose attention projections', '"""A GPT decoder whose attention projections'),
        "method_doc": ("Init std of parameter ``name``:", "The init std of parameter ``name``:"),
        "comment": ("#: eps of the per-head RMS normalisation", "#: the eps of the per-head RMS normalisation"),
        "new_comment": ("    def init_std(self, name: str)",
                        "    # the init of each parameter\n    def init_std(self, name: str)"),
        "layout": ("return 0.02 / math.sqrt(2 * self.config.n_layer)",
                   "return (0.02\n                    /math.sqrt( 2*self.config.n_layer ))"),
    }
    for name, (old, new) in keeps.items():
        assert source_digest(_edited(tmp_path, name, old, new)) == base, name


def test_a_constant_operator_or_name_edit_changes_the_code_digest(tmp_path):
    from study.runfolder.digests import source_digest

    base = source_digest(MODEL)
    changes = {
        "constant": ("self.rms = nn.RMSNorm(n_embd, eps=1e-5)", "self.rms = nn.RMSNorm(n_embd, eps=1e-6)"),
        "operator": ("return 0.02 / math.sqrt(2 * self.config.n_layer)",
                     "return 0.02 * math.sqrt(2 * self.config.n_layer)"),
    }
    digests = {name: source_digest(_edited(tmp_path, name, old, new)) for name, (old, new) in changes.items()}
    # init_parameters' local std renamed sigma wherever it occurs: the same computation under another name
    src = MODEL.read_text()
    start = src.index("            std = self.init_std(name)")
    end = src.index("\n", src.index("p.copy_(_keyed_normal(tuple(p.shape), std, init_seed, name))"))
    renamed, n = re.subn(r"\bstd\b", "sigma", src[start:end])
    assert n == 4
    (tmp_path / "name.py").write_text(src[:start] + renamed + src[end:])
    digests["name"] = source_digest(tmp_path / "name.py")
    assert base not in digests.values() and len(set(digests.values())) == 3, digests


def test_the_code_digests_are_the_source_digests_of_the_training_files():
    from study.runfolder.digests import STUDY, code_digests, code_files, source_digest

    digests = code_digests()
    assert list(digests) == code_files() and "modeling/model.py" in digests
    # a run's key holds its own task's module, the ones it imports and the package's shared ones, no other task's
    assert [f for f in code_files("lm") if f.startswith("tasks/")] == ["tasks/__init__.py", "tasks/common.py", "tasks/lm.py"]
    assert [f for f in code_files("mlm") if f.startswith("tasks/")][-2:] == ["tasks/lm.py", "tasks/mlm.py"]
    assert "tasks/lm.py" not in code_files("mqar") and "tasks/mqar.py" in code_files("mqar")
    assert digests["modeling/model.py"] == source_digest(MODEL) and MODEL == STUDY / "modeling/model.py"


@pytest.mark.slow  # ~60 s: three training processes of 4,096 tokens in a project copy
def test_a_docstring_edit_reuses_a_finished_run_a_changed_constant_trains_it_again(nano_project, tmp_path):
    """In a copy of the project (its own study package, data prepared), a finished run is reused after its
    model.py's module docstring is edited, and trained again after the init std of its matrices changes."""
    project = shutil.copytree(nano_project, tmp_path / "project",
                              ignore=shutil.ignore_patterns("__pycache__", "runs", "mlruns*", "mlartifacts"))
    env = {k: v for k, v in env_for(project).items() if k != "DVC_STAGE"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # an edit of the same size within a second must not run stale bytecode
    cmd = [sys.executable, "-m", "study.train", "variant=baseline", "seed=1", "train.tokens=4096",
           "train.warmup_tokens=0", "trainer.progress_bar=false", f"study.runs_dir={tmp_path / 'runs'}",
           f"study.tracking_db={tmp_path / 'mlruns.db'}", f"study.artifact_dir={tmp_path / 'mlartifacts'}"]
    run = tmp_path / "runs/baseline-s1"
    model = project / "study/modeling/model.py"

    def train() -> tuple[str, dict, dict]:
        r = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout, json.loads((run / "checkpoints/run.json").read_text()), read_result(run)

    _, state, first = train()
    files = {n: (run / n).read_bytes() for n in ("metrics.json", "record.json", "config.json", "curve.csv")}
    model.write_text(model.read_text().replace('"""GPT decoder whose', '"""A GPT decoder whose', 1))
    out, again, result = train()
    assert "holds this run finished (same settings, code, data and numerics): reused" in out
    assert again == state and {n: (run / n).read_bytes() for n in files} == files
    src = model.read_text()
    assert '"k_norm") else 0.02\n' in src
    model.write_text(src.replace('"k_norm") else 0.02\n', '"k_norm") else 0.03\n', 1))  # the init std
    out, third, result = train()
    assert "reused" not in out and third["completed"] is True
    assert third["config_hash"] != state["config_hash"] and third["mlflow_run_id"] != state["mlflow_run_id"]
    assert third["resume"]["code:study/modeling/model.py"] != state["resume"]["code:study/modeling/model.py"]
    assert result["val_loss"] != first["val_loss"]
    assert json.loads((run / "config.json").read_text())["code_digest"] != json.loads(files["config.json"])["code_digest"]


def _fail_at(monkeypatch, step: int):
    from study.modeling.lit_module import GPTModule

    original = GPTModule.on_train_batch_end

    def failing(self, outputs, batch, batch_idx):
        original(self, outputs, batch, batch_idx)
        if self.trainer.global_step >= step:
            raise RuntimeError(f"injected failure at step {self.trainer.global_step}")
    monkeypatch.setattr(GPTModule, "on_train_batch_end", failing)
    return original


@pytest.mark.slow  # nano trainings
def test_failed_run_resumes_on_other_settings_and_a_finished_run_is_not_overwritten(
        run_in, nano_project, tmp_path, monkeypatch, capsys):
    """Exception -> FAILED with an end time; the same run with other logging, validation batch or trainer name
    resumes it (one MLflow run, honouring MLFLOW_TRACKING_URI; other threads would start afresh: they change the
    sums, tests/test_numerics.py); a hand-started run with another lr is refused while the finished run is there,
    and replaces it only with train.overwrite=true."""
    from study.modeling.lit_module import GPTModule
    from study.train import main

    env_db = tmp_path / "env.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{env_db}")
    original = _fail_at(monkeypatch, 7)
    with pytest.raises(RuntimeError, match="injected failure at step 7"):
        run_in("trainer.threads=1")
    client, runs = mlflow_runs(env_db)
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
    client, runs = mlflow_runs(env_db)
    assert [(r.info.run_id, r.info.status) for r in runs] == [(failed_id, "FINISHED")] == [(m["mlflow_run_id"],
                                                                                           "FINISHED")]
    assert m["steps"] == 10 and [int(r.split(",")[0]) for r in (run / "curve.csv").read_text().splitlines()[1:]] \
        == [5, 10]
    assert not (tmp_path / "mlruns.db").exists()  # the env store, not study.tracking_db
    assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{env_db}"

    finished = (run / "metrics.json").read_bytes()
    rc = main([f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
               "trainer.progress_bar=false", "train.lr=1e-3"])
    err = one_line_error(capsys)
    assert rc == 2 and "holds a finished run" in err and "train.lr: 0.003 -> 0.001" in err
    assert "study.group=NAME" in err and "train.overwrite=true" in err
    assert (run / "metrics.json").read_bytes() == finished and len(mlflow_runs(env_db)[1]) == 1

    again = run_in("train.lr=1e-3", "train.overwrite=true")
    assert again["lr"] == 1e-3 and again["mlflow_run_id"] != failed_id
    assert sorted(r.info.status for r in mlflow_runs(env_db)[1]) == ["FINISHED", "FINISHED"]


@pytest.mark.slow  # one nano training
def test_an_unreadable_checkpoint_or_run_json_is_refused_in_one_line_and_kept(
        run_in, nano_project, tmp_path, monkeypatch, capsys):
    """A checkpoint cut short (SIGKILL while saving, a full disk) used to raise `PytorchStreamReader failed
    reading zip archive` on every start; a run.json that is not an object, an AttributeError."""
    from study.train import main

    db = tmp_path / "mlruns.db"
    original = _fail_at(monkeypatch, 7)
    with pytest.raises(RuntimeError, match="injected failure at step 7"):
        run_in()
    monkeypatch.setattr(__import__("study.modeling.lit_module", fromlist=["GPTModule"]).GPTModule, "on_train_batch_end", original)
    ckpts = tmp_path / "runs/baseline-s1/checkpoints"
    before = [(r.info.run_id, r.info.status) for r in mlflow_runs(db)[1]]
    argv = [f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={db}",
            f"study.artifact_dir={tmp_path / 'mlartifacts'}", "trainer.progress_bar=false"]
    with open(ckpts / "last.ckpt", "r+b") as f:
        f.truncate(1000)
    capsys.readouterr()
    for _ in range(2):  # every start says so; nothing is deleted or changed
        assert main(argv) == 2
        err = one_line_error(capsys)
        assert f"{ckpts / 'last.ckpt'} is unreadable (" in err and f"delete {ckpts} to start the run afresh" in err
        assert (ckpts / "last.ckpt").stat().st_size == 1000 and (ckpts / "run.json").is_file()
        assert [(r.info.run_id, r.info.status) for r in mlflow_runs(db)[1]] == before
        assert sorted(p.name for p in ckpts.parent.iterdir() if p.name != ".lock") == ["checkpoints"]
    state = (ckpts / "run.json").read_text()
    (ckpts / "run.json").write_text("[1]")
    assert main(argv) == 2
    err = one_line_error(capsys)
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

    from study.modeling.lit_module import GPTModule

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
    _, runs = mlflow_runs(tmp_path / "mlruns.db")
    mine = [r for r in runs if r.info.run_id != ref["mlflow_run_id"]]
    assert [(r.info.run_id, r.info.status) for r in mine] == [(got["mlflow_run_id"], "FINISHED")]


def test_loop_state_is_rescaled_to_the_new_accumulation():
    """Step 5 of a run with 1 micro-batch per step, resumed with 2 (and back): Lightning's micro-batch
    counters become steps x accumulation, so the next step and evaluation fall where they did."""
    from study.runner.loop_state import rescale_loop_state

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


@pytest.mark.slow  # ~75 s: two training processes killed, one run in-process
def test_killed_runs_end_killed_never_running(nano_project, tmp_path, monkeypatch, capsys):
    from filelock import FileLock

    from study.train import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runs, db = tmp_path / "runs", tmp_path / "m.db"
    folder = runs / "identity_q-s4"
    ckpt = folder / "checkpoints/last.ckpt"
    proc = start_until_checkpoint(train_cmd(runs, db), nano_project, ckpt)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    client, killed = mlflow_runs(db)
    assert [(r.info.status, r.info.end_time is not None) for r in killed] == [("KILLED", True)]
    assert not (folder / "metrics.json").exists()
    FileLock(str(folder / ".lock"), timeout=0).acquire()  # released by the dead process (raises if not)

    # the same command resumes the KILLED run (RUNNING again); SIGKILL leaves it RUNNING ...
    proc = subprocess.Popen(train_cmd(runs, db), cwd=nano_project, env=env_for(nano_project),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert "identity_q-s4: resuming from step" in line, line
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert client.get_run(killed[0].info.run_id).info.status == "RUNNING"
    # ... until the next start in that folder, here with other settings: it starts afresh and says why
    monkeypatch.chdir(nano_project)
    capsys.readouterr()
    assert main(train_cmd(runs, db, "train.lr=1e-3", "train.tokens=20480")[3:]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "starting afresh" in x)
    assert "train.lr: 0.003 -> 0.001" in line and "train.tokens: 163840 -> 20480" in line
    assert "trainer" not in line and "code:" not in line  # only what differs
    assert "MLFLOW_TRACKING_URI" not in os.environ  # MLflow exported it during the run; not left behind
    old = client.get_run(killed[0].info.run_id).info
    assert old.status == "KILLED" and old.end_time is not None
    assert sorted(r.info.status for r in mlflow_runs(db)[1]) == ["FINISHED", "KILLED"]


# -- kill and resume --------------------------------------------------------------------------------
def _nonlinear_q_cmd(runs: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "study.train", "variant=nonlinear_q", "seed=2", "train.tokens=163840",
            "trainer.progress_bar=false", f"study.runs_dir={runs}", f"study.tracking_db={db}", *extra]


@pytest.mark.slow  # three training processes of 163,840 tokens
def test_killed_run_resumes_exactly(nano_project, tmp_path):
    """SIGKILL a real training process mid-run; the same command resumes to the uninterrupted result."""
    from mlflow import MlflowClient

    ref = subprocess.run(_nonlinear_q_cmd(tmp_path / "ref", tmp_path / "ref.db"), cwd=nano_project,
                         env=env_for(nano_project), capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    runs, db = tmp_path / "runs", tmp_path / "m.db"
    ckpt = runs / "nonlinear_q-s2/checkpoints/last.ckpt"
    proc = start_until_checkpoint(_nonlinear_q_cmd(runs, db), nano_project, ckpt)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt.exists(), "no checkpoint before the kill"
    import torch
    killed_at = torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]
    assert 0 < killed_at < 80, killed_at  # really mid-run (80 steps in all)
    assert not (runs / "nonlinear_q-s2/metrics.json").exists()
    again = subprocess.run(_nonlinear_q_cmd(runs, db), cwd=nano_project, env=env_for(nano_project),
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


def test_the_code_digest_reads_a_file_as_python_does_and_names_one_it_cannot(tmp_path):
    """A byte-order mark changes nothing (Python imports such a file alike); a file that is not Python (a syntax
    error, a null byte, bytes that are not UTF-8) is refused in one line naming it, not with a traceback."""
    from study.config import StudyError
    from study.runfolder.digests import source_digest

    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfX = 1\n")
    (tmp_path / "plain.py").write_bytes(b"X = 1\n")
    assert source_digest(tmp_path / "bom.py") == source_digest(tmp_path / "plain.py")
    for name, data in (("syntax.py", b"def f(:\n"), ("nul.py", b"x = 1\x00\n"), ("latin.py", b'x = "\xff"\n')):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(StudyError) as e:
            source_digest(tmp_path / name)
        assert "\n" not in str(e.value) and str(e.value).startswith(f"{tmp_path / name}")
        assert "is not valid Python" in str(e.value) and str(e.value).endswith("fix or remove that file")
