"""Shared fixtures.  Every output goes under pytest's tmp_path (never the repository)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import study  # noqa: F401  (first: pins the CPU kernels before anything imports torch, as every stage does)

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# A small study: the nano model on a slice of the embedded corpus (real text, real BPE).
NANO_STUDY = """\
defaults:
  - run_config
  - model: nano
  - variant: baseline
  - data: default
  - trainer: cpu
  - launcher: local
  - task: lm
  - _self_
study:
  name: {name}
  seeds: {seeds}
  baseline: baseline
{verdict}{arms_section}model: {{}}
trainer: {{}}
data:
  tokenizer: bpe
  vocab_size: 512
  max_docs_per_corpus: 10
  val_every: 5
train:
  tokens: {tokens}
  batch_tokens: 2048
  micro_batch_size: 32
  lr: 3.0e-3
  min_lr: 3.0e-4
  warmup_tokens: 4096
  eval_every: 5
  val_tokens: 8192
  log_every: 5
scale_ladder:
  models: []
  variants: [baseline, nonlinear_q]
  tokens_per_param: 0.5
  warmup_tokens: 2048
"""


def project_files() -> list[str]:
    """Files of the working tree that git would commit (tracked + untracked, not ignored), but dvc.lock: it records
    the stages run in this checkout (after `make study`, compare's outputs), which a copy without their runs lacks."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f and f != "dvc.lock" and (ROOT / f).is_file()]


#: a nano study's arms (copy_project's ``arms``): its test stage and decided verdict, nothing tuned
NANO_VERDICT = """\
  arms: {arms}
  references: [baseline]
  pairs: []
  max_seeds: {max_seeds}
  pilot_seeds: []
tune:
  arms: []
  table_dir: tuning
"""

#: the arms a nano study can name (copy_project's ``arms``), each its variant at one fixed lr (nothing tuned)
NANO_ARMS = {"baseline": "baseline", "nonlinear_q": "nonlinear_q", "no_context": "no_context",
             "baseline_mlp4.75": "baseline_mlp4.75", "baseline_mlp5": "baseline_mlp5", "identity_q": "identity_q",
             "baseline_qknorm": "baseline_qknorm"}


#: the arms section of a nano study: every arm of :data:`NANO_ARMS` at lr 3e-3
NANO_ARMS_SECTION = "arms:\n" + "".join(f"  {a}: {{variant: {v}, lr: 3.0e-3}}\n" for a, v in NANO_ARMS.items())


def copy_project(dest: Path, name: str = "test-study", arms=(), seeds=(1, 2), tokens: int = 20480) -> Path:
    """Copy the project into ``dest`` as a fresh git repository with a nano study.yaml: study.arms = ``arms``
    (names of :data:`NANO_ARMS`, each at lr 3e-3; reference: baseline) on ``seeds`` (at least 5 with arms)."""
    for f in project_files():
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, target)
    (dest / "conf" / "study.yaml").write_text(NANO_STUDY.format(
        name=name, seeds=list(seeds), tokens=tokens, arms_section=NANO_ARMS_SECTION,
        verdict=NANO_VERDICT.format(arms=list(arms), max_seeds=len(seeds)) if arms else ""))
    # lm at learned positions (its default until 2026-12-06), so that the nano runs' pinned losses hold
    lm = dest / "conf" / "task" / "lm.yaml"
    lm.write_text(lm.read_text().replace("\nposition: rope\n", "\nposition: learned\n"))
    write_params(dest)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=dest, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dest, check=True)
    subprocess.run(git + ["commit", "-qm", "test copy"], cwd=dest, check=True)
    return dest


def write_params(project: Path) -> None:
    """params.yaml of ``project``: its conf/ composed as DVC's Hydra mode does (`make params`)."""
    from study.config import composed_params

    (project / "params.yaml").write_text(composed_params(project))


def env_for(project: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env["PYTHONPATH"] = str(project)
    return env


def run_cli(project: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run ``python -m ARGS`` in ``project`` with the test's interpreter."""
    return subprocess.run([sys.executable, "-m", *args], cwd=project, env=env_for(project),
                          capture_output=True, text=True, timeout=timeout)


def start_until_checkpoint(cmd: list[str], project: Path, ckpt: Path, timeout: float = 300) -> subprocess.Popen:
    """Start a training command in ``project`` and return once it has written ``ckpt`` (or ended)."""
    import time

    proc = subprocess.Popen(cmd, cwd=project, env=env_for(project), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    return proc


def mlflow_runs(db: Path):
    """(client, every run of every experiment) of the SQLite MLflow store ``db``."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    return client, client.search_runs([e.experiment_id for e in client.search_experiments()])


def one_line_error(capsys) -> str:
    """The stage's error on stderr, asserted to be one line starting ``error: ``."""
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


def train_cmd(runs: Path, db: Path, *extra: str) -> list[str]:
    """A ``study.train`` process long enough (163,840 tokens) to be signalled after its first checkpoint."""
    return [sys.executable, "-m", "study.train", "variant=identity_q", "seed=4", "train.tokens=163840",
            "trainer.progress_bar=false", f"study.runs_dir={runs}", f"study.tracking_db={db}", *extra]


@pytest.fixture(scope="session")
def nano_project(tmp_path_factory) -> Path:
    """A project copy with the nano study's token data already prepared (shared, read-only use)."""
    project = copy_project(tmp_path_factory.mktemp("nano_project"))
    r = run_cli(project, "study.prepare")
    assert r.returncode == 0, r.stderr[-3000:]
    return project


@pytest.fixture
def run_in(nano_project, tmp_path, monkeypatch):
    """Train in-process on the shared nano data; runs/ and the MLflow store go to tmp_path."""
    from study.config import load_config
    from study.runner.run import train

    monkeypatch.chdir(nano_project)

    def _run(*overrides: str):
        cfg = load_config([f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
                           f"study.artifact_dir={tmp_path / 'mlartifacts'}", "trainer.progress_bar=false",
                           *overrides], nano_project)
        return train(cfg, nano_project)
    return _run
