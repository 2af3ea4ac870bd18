"""The table of choices (`make levers`, study/levers.py) on the nano model: every number read back from the run
folders and the prepared data, attention's share = the no-context run's loss minus the baseline's."""
from __future__ import annotations

import json

import pytest

from tests.conftest import copy_project, run_cli

pytestmark = pytest.mark.slow

LEVERS = """\
seed: 1
lr: 3.0e-3
rows:
  bpe512: []
  bytes: [data.tokenizer=bytes, data.vocab_size=null]
"""


def test_the_levers_table_reads_its_runs(tmp_path):
    project = copy_project(tmp_path / "p")
    (project / "conf/levers.yaml").write_text(LEVERS)
    r = run_cli(project, "study.levers", "study.jobs=1")
    assert r.returncode == 0, r.stderr[-3000:]
    md = (project / "reports/levers.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in md.splitlines() if line.startswith("| b")}
    assert set(rows) == {"bpe512", "bytes"}
    for name, vocab in (("bpe512", 512), ("bytes", 257)):
        folder = f"{name}-T64-*"
        base = json.loads((project / f"runs/levers/{name}/baseline-s1/metrics.json").read_text())
        yard = json.loads((project / f"runs/levers/{name}/no_context-s1/metrics.json").read_text())
        (data,) = [p for p in (project / "data/levers").glob(folder) if p.is_dir()]  # each row's own data
        meta = json.loads((data / "meta.json").read_text())
        assert meta["vocab_size"] == vocab
        cells = rows[name]
        assert cells[3] == f"{base['val_loss']:.4f}" and cells[6] == f"{yard['val_loss']:.4f}"
        assert cells[5] == f"{meta['yardsticks']['bigram']['all']:.4f}"
        assert cells[7] == f"{yard['val_loss'] - base['val_loss']:+.4f}"
        assert cells[8] == f"{(yard['val_loss'] - base['val_loss']) / (0.01 * base['val_loss']):.1f}"
        assert cells[9].rstrip(" |") == f"{base['in_context_gain']:.4f}"
    # a second call reuses every run and every prepared data folder
    again = run_cli(project, "study.levers", "study.jobs=1")
    assert again.returncode == 0 and "preparing" not in again.stdout
    assert (project / "reports/levers.md").read_text() == md


def test_a_malformed_levers_file_is_refused_in_one_line(tmp_path):
    project = copy_project(tmp_path / "p")
    (project / "conf/levers.yaml").write_text("seed: 1\nlr: 0.01\nrows: {a: x}\n")
    r = run_cli(project, "study.levers")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "rows must map each row's name to a list of overrides" in r.stderr


def test_the_command_lines_overrides_reach_every_row(tmp_path, monkeypatch):
    """`python -m study.levers OVERRIDES`: every row's data and every run of it carry the overrides (before the row's
    own), so a quick trial prepares a small corpus into its own folder instead of the full default one."""
    import study.levers as levers
    from study.config import StudyError, load_config
    from tests.conftest import ROOT

    monkeypatch.chdir(ROOT)
    (tmp_path / "levers.yaml").write_text(LEVERS)
    monkeypatch.setattr(levers, "LEVERS", str(tmp_path / "levers.yaml"))
    prepared, trained = [], []
    monkeypatch.setattr(levers, "_prepare", lambda data, root, params: prepared.append(list(data)))

    def stop(runs, root, params, jobs=1):
        trained.extend(runs)
        raise StudyError("stopped before training")
    monkeypatch.setattr(levers, "ensure_runs", stop)
    over = ["data.max_docs_per_corpus=3", f"study.runs_dir={tmp_path / 'runs'}", "train.tokens=1048576"]
    assert levers.main(over) == 2
    assert len(prepared) == 2 and len(trained) == 4
    for overrides in [*prepared, *trained]:
        cfg = load_config(overrides, ROOT)
        assert (cfg.data.max_docs_per_corpus, cfg.study.runs_dir, cfg.train.tokens) == (3, str(tmp_path / "runs"), 1048576)
    bytes_cfg = load_config(trained[-1], ROOT)
    assert (bytes_cfg.data.tokenizer, bytes_cfg.variant.name) == ("bytes", "no_context")
    default = load_config(["data.tokenizer=bytes"], ROOT)
    assert bytes_cfg.data.dir != levers.data_dir_of(default)  # the small corpus has its own folder


def test_an_override_that_a_row_sets_too_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    import study.levers as levers
    from tests.conftest import ROOT

    monkeypatch.chdir(ROOT)
    (tmp_path / "levers.yaml").write_text(LEVERS)
    monkeypatch.setattr(levers, "LEVERS", str(tmp_path / "levers.yaml"))
    monkeypatch.setattr(levers, "_prepare", lambda *a: pytest.fail("prepared despite a clash"))
    assert levers.main(["data.tokenizer=gpt2"]) == 2
    assert capsys.readouterr().err == (f"error: data.tokenizer is set by row bytes of {tmp_path / 'levers.yaml'} and on "
                                       f"the command line: drop it from the command line (or edit the row)\n")
