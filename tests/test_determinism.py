"""The same inputs give the same bytes: one seed gives identical curves, prepare twice identical data, compare
twice identical reports."""
from __future__ import annotations

import filecmp
import json

import pytest

from conftest import run_cli


# -- one seed, one curve --------------------------------------------------------------------------------
@pytest.mark.slow  # three nano trainings
def test_same_seed_gives_identical_curves(run_in, tmp_path):
    a = run_in("variant=nonlinear_q", "seed=3", f"study.runs_dir={tmp_path / 'a'}")
    b = run_in("variant=nonlinear_q", "seed=3", f"study.runs_dir={tmp_path / 'b'}")
    assert (tmp_path / "a/nonlinear_q-s3/curve.csv").read_text() == (tmp_path / "b/nonlinear_q-s3/curve.csv").read_text()
    assert a["val_loss"] == b["val_loss"]
    c = run_in("variant=nonlinear_q", "seed=4", f"study.runs_dir={tmp_path / 'c'}")
    assert c["val_loss"] != a["val_loss"]  # the seed matters


# -- the numbers of one run, pinned ---------------------------------------------------------------
#: the nano study's nonlinear_q seed 1 (tests/conftest.py's copy_project: 20,480 tokens, 10 steps, evaluated at steps
#: 5 and 10) under the pinned CPU kernels (study/config/numerics.py), the same on an AMD EPYC with AVX2 only and one
#: with AVX-512: {step: (train_loss, val_loss)} of curve.csv, and positions.csv's first rows (nats, as written)
PINNED_CURVE = {5: ("6.161877", "6.000157"), 10: ("5.926387", "5.876031")}
PINNED_FINAL = 5.876030921936035
PINNED_POSITIONS = {1: "5.904243", 2: "5.890377", 3: "5.894095"}


@pytest.mark.slow  # one nano training
def test_the_nano_run_gives_the_pinned_losses(run_in, tmp_path):
    """A refactor of the run path changes no number: the nano run's curve, final and per-position losses are the
    pinned ones, to the last digit (the kernels are pinned to AVX2, so every x86 CPU sums in the same order)."""
    import csv

    r = run_in("variant=nonlinear_q", "seed=1")
    assert r["status"] == "ok" and r["steps"] == 10
    assert (r["tokenizer"], r["vocab_size"]) == ("bpe", 512)  # the embedding's rows: the prepared BPE's 512 ids
    assert r["val_loss"] == PINNED_FINAL
    d = tmp_path / "runs" / "nonlinear_q-s1"
    with open(d / "curve.csv", newline="") as f:
        rows = {int(row["step"]): row for row in csv.DictReader(f)}
    assert {step: (row["train_loss"], row["val_loss"]) for step, row in rows.items()} == PINNED_CURVE
    with open(d / "positions.csv", newline="") as f:
        positions = {int(row["position"]): row["val_loss"] for row in csv.DictReader(f)}
    assert len(positions) == 64
    assert {pos: positions[pos] for pos in PINNED_POSITIONS} == PINNED_POSITIONS


# -- byte-identical prepare outputs ---------------------------------------------------------------
@pytest.mark.slow  # two prepare processes
def test_prepare_twice_gives_byte_identical_data(nano_project, tmp_path):
    from study.config import load_config
    from study.runner.resume_key import run_digest

    small = ["model=nano", "data.corpora=[sotu]", "data.max_docs_per_corpus=7", "data.val_every=3",
             "data.tokenizer=bpe", "data.vocab_size=300"]
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

    from tests.synthetic_runs import arms_overrides, write_arms

    runs = tmp_path / "runs"
    offs = {1: -0.01, 2: 0.0, 3: 0.013, 4: 0.004, 5: -0.006}
    write_arms(runs, {v: {seed: {"loss": 10 * n ** -0.1 + off * (1 + len(v) / 10), "params": int(n), "fpt": 6 * int(n),
                                 "per_corpus": {"sotu": 4.0 + off, "kjv": 3.0 - off}} for seed, off in offs.items()}
                      for v, n in {"baseline": 1.2e5, "baseline_mlp5": 1.6e5, "nonlinear_q": 1.0e5}.items()})
    monkeypatch.chdir(nano_project)
    for out in ("a", "b"):
        assert main([*arms_overrides(tmp_path, ("baseline", "baseline_mlp5", "nonlinear_q")),
                     f"study.reports_dir={tmp_path / out}"]) == 0
    files = sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert {"comparison.md", "summary.json"} <= set(files) and sum(f.endswith(".png") for f in files) >= 2
    assert sorted(str(p.relative_to(tmp_path / "b")) for p in (tmp_path / "b").rglob("*") if p.is_file()) == files
    assert filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", files, shallow=False)[1:] == ([], [])
