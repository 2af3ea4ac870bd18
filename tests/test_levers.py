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
  bytes: [data.bpe_vocab_size=257, model.vocab_size=257]
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
        base = json.loads((project / f"runs/levers/{name}/baseline-s1/metrics.json").read_text())
        yard = json.loads((project / f"runs/levers/{name}/no_context-s1/metrics.json").read_text())
        (data,) = [p for p in (project / "data/levers").glob(f"bpe{vocab}-T64-*") if p.is_dir()]  # each row's own data
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
