"""The study's fairness rules, issue by issue: the training order is a window-level permutation of the whole
split, two variants of one seed share their initial weights wherever they share a module, the yardsticks
are what count models score, and every evaluation logs the validation loss per corpus."""
from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

STEPS, BATCH = 20, 32  # NANO_STUDY: batch_tokens 2048 / block_size 64 = 32 windows per optimizer step


@pytest.mark.slow  # one nano training
def test_each_step_reads_windows_spread_over_the_split_and_the_run_sees_the_split_mix(run_in, nano_project, tmp_path,
                                                                                      monkeypatch):
    """Record a real run's window order: the 32 windows of a step fall in ~25 of 64 equal blocks of the split
    (a uniform draw: 64 (1 - (63/64)^32) = 25.3; litdata's block shuffle gave 1-2), and the corpus mix the
    run trains on is within 5 points of the split's."""
    from study.data.loader import RECORD_ENV
    from study.data.records import read_meta
    from study.data.windows import corpus_of_tokens, split_windows, window_token_offsets

    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "windows"))
    metrics = run_in(f"train.tokens={STEPS * BATCH * 64}", "seed=3")
    assert metrics["steps"] == STEPS and metrics["data_seed"] == metrics["init_seed"] == 3
    read = [int(x) for x in (tmp_path / "windows/train-windows-rank0.txt").read_text().split()]
    assert len(read) == STEPS * BATCH and len(set(read)) == len(read)  # no window twice in an epoch
    split = nano_project / "data/tokens/train"
    n = split_windows(split, 65)
    blocks = [len({w * 64 // n for w in read[i * BATCH:(i + 1) * BATCH]}) for i in range(STEPS)]
    assert np.mean(blocks) > 20 and min(blocks) >= 15, blocks
    meta = read_meta(nano_project / "data/tokens")
    runs = meta["corpus_tokens"]["train"]
    seen = Counter(corpus_of_tokens(runs, window_token_offsets(split, 65, read)).tolist())
    total = sum(t for _, t in runs)
    for i, (name, tokens) in enumerate(runs):
        assert abs(seen[i] / len(read) - tokens / total) < 0.05, (name, seen, runs)


def test_one_seed_gives_two_variants_the_same_weights_where_they_share_modules(nano_project):
    """Common random numbers: init values are keyed by (init seed, parameter name)."""
    import torch

    from study.config import load_config
    from study.modeling.model import GPT

    def build(variant, seed=1):
        cfg = load_config(["model=nano", f"variant={variant}"], nano_project)
        return dict(GPT(cfg.model, cfg.variant, 257, init_seed=seed).named_parameters())

    base, nlq, mlp, other = build("baseline"), build("nonlinear_q"), build("baseline_mlp4.75"), build("baseline", 2)
    C = 32
    shared = [k for k in base if "c_attn" not in k]
    assert any("mlp.c_fc" in k for k in shared) and any("attn.c_proj" in k for k in shared)
    for k in shared:  # embeddings, MLPs, output projections, norms
        assert torch.equal(base[k], nlq[k]), k
        assert not torch.equal(base[k], other[k]) or "ln" in k, k  # another seed draws other values
    for i in range(2):
        b, q = base[f"transformer.h.{i}.attn.c_attn.weight"], nlq[f"transformer.h.{i}.attn.c_attn.weight"]
        assert b.shape == (3 * C, C) and q.shape == (2 * C, C)
        assert torch.equal(b[C:], q)  # key and value rows (the query rows are the baseline's own)
    for k in base:
        if ".mlp." not in k:
            assert torch.equal(base[k], mlp[k]), k  # baseline_mlp4.75: all but the wider MLP
    assert mlp["transformer.h.0.mlp.c_fc.weight"].shape == (int(C * 4.75), C)
    # the std of each tensor is the GPT-2 init: 0.02, and 0.02/sqrt(2 n_layer) for the output projections
    assert base["transformer.h.0.mlp.c_fc.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    assert base["transformer.h.0.attn.c_proj.weight"].std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.1)


def test_yardsticks_match_a_direct_count(nano_project):
    """ngram_yardsticks against a plain-Python add-k unigram and bigram on a small stream."""
    from study.data.yardsticks import K_GRID, ngram_yardsticks

    rng = np.random.default_rng(0)
    V = 7
    train = rng.integers(0, V, 400) ** 2 % V  # a skewed stream
    windows = rng.integers(0, V, (6, 5))
    corpus = np.array([0, 0, 1, 1, 1, 0])
    out = ngram_yardsticks(train, windows, corpus, ["a", "b"], V)
    ku, kb = out["k"]["unigram"], out["k"]["bigram"]
    assert ku in K_GRID and kb in K_GRID
    uni, big = Counter(train.tolist()), Counter(zip(train[:-1].tolist(), train[1:].tolist()))
    rows = Counter(train[:-1].tolist())

    def ce(w, bigram):
        terms = [-math.log((big[(a, b)] + kb) / (rows[a] + kb * V)) if bigram else
                 -math.log((uni[b] + ku) / (len(train) + ku * V)) for a, b in zip(w[:-1], w[1:])]
        return sum(terms) / len(terms)

    for name, bigram in (("unigram", False), ("bigram", True)):
        per = [ce(w.tolist(), bigram) for w in windows]
        assert out[name]["all"] == pytest.approx(np.mean(per), abs=1e-6)
        assert out[name]["a"] == pytest.approx(np.mean([p for p, c in zip(per, corpus) if c == 0]), abs=1e-6)
        assert out[name]["b"] == pytest.approx(np.mean([p for p, c in zip(per, corpus) if c == 1]), abs=1e-6)


def test_prepare_writes_the_yardsticks_of_the_fixed_validation_windows(nano_project):
    meta = json.loads((nano_project / "data/tokens/meta.json").read_text())
    y = meta["yardsticks"]
    corpora = [c for c, _ in meta["corpus_tokens"]["val"]]
    assert corpora == ["kjv", "shakespeare", "sotu"]
    assert sum(t for _, t in meta["corpus_tokens"]["val"]) == meta["tokens"]["val"]
    assert y["block_size"] == 64 and y["n_val_windows"] == 8192 // 64
    for name in ("unigram", "bigram"):
        assert set(y[name]) == {"all", *corpora}
    # a bigram table knows more than token frequencies, which know more than a uniform guess
    assert 2.0 < y["bigram"]["all"] < y["unigram"]["all"] < math.log(meta["vocab_size"])


@pytest.mark.slow  # one nano training
def test_every_evaluation_logs_the_validation_loss_per_corpus(run_in, nano_project, tmp_path):
    """val_loss/CORPUS in the curve, metrics.json and MLflow; their window-weighted mean is val_loss."""
    import csv

    from mlflow import MlflowClient

    from study.data.loader import fixed_val_windows
    from study.data.records import read_meta

    metrics = run_in(f"train.tokens={10 * BATCH * 64}")
    per = metrics["val_loss_per_corpus"]
    meta = read_meta(nano_project / "data/tokens")
    _, corpus = fixed_val_windows(nano_project / "data/tokens", 64, 128, meta["corpus_tokens"]["val"])
    names = [c for c, _ in meta["corpus_tokens"]["val"]]
    counts = np.bincount(corpus.numpy(), minlength=len(names))
    assert set(per) == {n for n, c in zip(names, counts) if c}
    weighted = sum(per[n] * c for n, c in zip(names, counts) if c) / counts.sum()
    assert weighted == pytest.approx(metrics["val_loss"], abs=1e-5)
    with open(tmp_path / "runs/baseline-s1/curve.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [5, 10] and float(rows[-1]["val_loss/sotu"]) == pytest.approx(per["sotu"])
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    history = client.get_metric_history(metrics["mlflow_run_id"], "val_loss/sotu")
    assert len(history) == 2 and history[-1].value == pytest.approx(per["sotu"])
