"""Adding a task is one module, one conf/task file and one docs row: a toy task ``copy`` written into a project copy
trains, is checked and typed by its own Settings, keeps its runs apart, speaks in the report in its own words, and
leaves every finished run of another task reused."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, env_for
from study.runfolder import read_result

#: the toy task: recall the token ``task.lag`` positions back (uniform random tokens, so only attention can do it)
COPY_MODULE = '''"""Task ``copy`` (a toy): at each position from ``task.lag`` on, predict the token ``task.lag`` positions back."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import torch

from study.config import ConfigError, embedding_rows
from study.tasks.common import IGNORE, keyed_generator

CAUSAL, LABELLED, METRICS = True, True, ("val_loss", "val_accuracy")
NO_CONTEXT = "the token before cannot be seen: at best chance"


@dataclass
class Settings:
    vocab_size: int
    lag: int


def check(cfg) -> None:
    if not 1 <= cfg.task.lag < cfg.model.block_size:
        raise ConfigError(f"task.lag={cfg.task.lag} must lie in [1, model.block_size={cfg.model.block_size})")


def data_dir(cfg, root: Path) -> Path:
    return Path(root) / "data" / "copy"


def check_data(cfg, root: Path) -> dict:
    meta = {"tokenizer": "copy", "vocab_size": int(cfg.task.vocab_size)}
    data_dir(cfg, root).mkdir(parents=True, exist_ok=True)
    (data_dir(cfg, root) / "meta.json").write_text(json.dumps(meta))
    return meta


def config_ids(cfg) -> int:
    return int(cfg.task.vocab_size)


def model_vocab(cfg, meta: dict) -> int:
    return embedding_rows(meta["vocab_size"], cfg.model.vocab_multiple)


def val_examples(cfg) -> int:
    return 64


def examples(cfg, n: int, key: str):
    x = torch.randint(0, int(cfg.task.vocab_size), (n, cfg.model.block_size), generator=keyed_generator(key))
    y = torch.full_like(x, IGNORE)
    y[:, cfg.task.lag:] = x[:, :-cfg.task.lag]  # (n, T): the token lag positions back
    return x, y


class CopyData(pl.LightningDataModule):
    def __init__(self, cfg, micro: int, data_seed: int, val_micro: int):
        super().__init__()
        self.corpora, self.micro, self.val_micro = [], micro, val_micro
        self.train = torch.utils.data.TensorDataset(*examples(cfg, 2048, f"copy/train/{data_seed}"))
        self.val = torch.utils.data.TensorDataset(*examples(cfg, val_examples(cfg), "copy/val"))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train, batch_size=self.micro)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.val, batch_size=self.val_micro)


def datamodule(cfg, root, meta, micro, data_seed, n_val, val_micro, global_batch):
    return CopyData(cfg, micro, data_seed, val_micro)


def split(batch):
    return batch[0].long(), batch[1].long()


def tokens(batch) -> int:
    return batch[0].numel()


def yardsticks(cfg, root, meta) -> dict:
    return {"chance": round(math.log(int(cfg.task.vocab_size)), 6)}


def report_text(settings: dict) -> dict:
    return {"ids": f"task.vocab_size {settings.get('task.vocab_size')}", "losses": "", "corpus_yardsticks": (),
            "lines": [f"Task `copy`: recall the token task.lag {settings.get('task.lag')} positions back.", ""]}


def yardstick_lines(y: dict) -> list[str]:
    return ["", f"Yardstick: chance, {y.get('chance')} nats."]
'''

COPY_CONF = "# recall the token lag positions back (study/tasks/copy.py)\nname: copy\nposition: learned\nvocab_size: 32\nlag: 2\n"


def test_every_task_is_a_module_a_conf_file_and_a_docs_row():
    from study.config import task_names

    table = (ROOT / "docs" / "tasks.md").read_text()
    for t in task_names():
        assert (ROOT / "conf" / "task" / f"{t}.yaml").is_file() and f"| `{t}`" in table, t
    assert sorted(p.stem for p in (ROOT / "conf" / "task").glob("*.yaml")) == task_names()


@pytest.mark.slow  # ~60 s: four training processes of 4,096 tokens in a project copy
def test_a_toy_task_added_as_one_module_trains_reports_and_leaves_other_runs_reused(nano_project, tmp_path):
    project = shutil.copytree(nano_project, tmp_path / "project",
                              ignore=shutil.ignore_patterns("__pycache__", "runs", "mlruns*", "mlartifacts"))
    env = {k: v for k, v in env_for(project).items() if k != "DVC_STAGE"}
    common = ["variant=baseline", "seed=1", "train.tokens=4096", "train.warmup_tokens=0", "trainer.progress_bar=false",
              f"study.runs_dir={tmp_path / 'runs'}", f"study.tracking_db={tmp_path / 'mlruns.db'}",
              f"study.artifact_dir={tmp_path / 'mlartifacts'}"]

    def train(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "study.train", *common, *extra], cwd=project, env=env,
                              capture_output=True, text=True, timeout=600)

    first = train()
    assert first.returncode == 0, first.stderr[-3000:]
    lm_state = json.loads((tmp_path / "runs/baseline-s1/checkpoints/run.json").read_text())
    (project / "study/tasks/copy.py").write_text(COPY_MODULE)
    (project / "conf/task/copy.yaml").write_text(COPY_CONF)

    for bad, words in (("task.lag=0", "task.lag=0 must lie in [1, model.block_size=64)"),
                       ("task.lag=two", "task.lag: Value 'two' of type 'str' could not be converted to Integer"),
                       ("task.lags=2", "did you mean task.lag (task=copy)?")):
        r = train("task=copy", bad)
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr[-2000:]
    toy = train("task=copy")
    assert toy.returncode == 0, toy.stderr[-3000:]
    result = read_result(tmp_path / "runs/copy/baseline-s1")
    assert result["task"] == "copy" and 0.0 <= result["val_accuracy"] <= 1.0 and result["status"] == "ok"
    assert result["yardsticks"] == {"chance": round(math.log(32), 6)}
    config = json.loads((tmp_path / "runs/copy/baseline-s1/config.json").read_text())
    assert {k: v for k, v in config["task"].items()} == {"name": "copy", "position": "learned", "vocab_size": 32, "lag": 2}

    for (name, text), words in (
            (("conf/task/copy.yaml", COPY_CONF.replace("lag: 2\n", "")),
             "conf/task/copy.yaml sets ['vocab_size'] but study/tasks/copy.py Settings has"),
            (("study/tasks/copy.py", COPY_MODULE + "\ndef (:\n"), "cannot be imported (SyntaxError"),
            (("study/tasks/copy.py", COPY_MODULE.replace("def check(", "def checks(")),
             "study/tasks/copy.py lacks ['check']")):
        path = project / name
        kept = path.read_text()
        path.write_text(text)
        r = train("task=copy")
        path.write_text(kept)
        assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr[-2000:]

    again = train()  # the lm run: the new module is not in its key
    assert "holds this run finished (same settings, code, data and numerics): reused" in again.stdout, again.stdout
    assert json.loads((tmp_path / "runs/baseline-s1/checkpoints/run.json").read_text()) == lm_state

    report = subprocess.run([sys.executable, "-c", (
        "from study.analysis.tables import header, yardstick_lines\n"
        "s = {'study': 'toy', 'task': 'copy', 'seeds': [1], 'settings': {'task.vocab_size': 32, 'task.lag': 2}}\n"
        "print('\\n'.join(header(s) + yardstick_lines({**s, 'yardsticks': {'chance': 3.4657}})))")],
        cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "(task.vocab_size 32)" in report.stdout and "Task `copy`: recall the token task.lag 2 positions back." \
        in report.stdout and "Yardstick: chance, 3.4657 nats." in report.stdout


def test_a_task_file_that_states_no_positions_is_refused_in_one_line(tmp_path, monkeypatch):
    """Without ``position`` in its conf/task file a task's models would take the schema's default silently."""
    import study.config.task as task
    from study.config import ConfigError, load_config

    files = shutil.copytree(task.TASK_DIR, tmp_path / "conf" / "task")
    (tmp_path / "study").symlink_to(ROOT / "study")  # the task modules beside the files, as in the project
    text = (files / "mlm.yaml").read_text()
    assert "\nposition: rope\n" in text
    (files / "mlm.yaml").write_text(text.replace("\nposition: rope\n", "\n"))
    monkeypatch.setattr(task, "TASK_DIR", files)
    with pytest.raises(ConfigError) as e:
        load_config(["task=mlm"], ROOT)
    assert str(e.value) == ("conf/task/mlm.yaml states no position: write position: rope or position: learned (where "
                            "the task's models take their positions, docs/tasks.md)")
    assert load_config(["task=mqar"], ROOT).model.position == "learned"  # the others as they were
