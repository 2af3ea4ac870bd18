"""Context use: the per-position validation loss, the in-context gain, and the no-context arm's diagonal mask.

Expected values are computed here by hand (explicit loops, explicit score matrices), never read back from the
code under test.
"""
from __future__ import annotations

import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F

from study.modeling.lit_module import in_context_gain
from study.modeling.accounting import describe
from study.modeling.model import GPT
from tests.test_model import VOCAB, model_cfg, variant_cfg


def test_in_context_gain_on_a_synthetic_curve():
    """Positions 1-4 against the last quarter of the window: by hand on a curve 5, 4, 3, 2, then flat 1.5 ... 1.0."""
    curve = [5.0, 4.0, 3.0, 2.0] + [1.5] * 8 + [1.25, 1.0, 1.0, 1.0]  # 16 positions: the last quarter is the last 4
    assert in_context_gain(curve) == pytest.approx((5 + 4 + 3 + 2) / 4 - (1.25 + 1 + 1 + 1) / 4)  # 3.5 - 1.0625
    assert in_context_gain([2.0] * 128) == 0.0  # a model that ignores its context gains nothing
    rising = list(range(1, 129))  # worse with more context: a negative gain
    assert in_context_gain([float(x) for x in rising]) == pytest.approx(2.5 - (97 + 128) / 2)
    with pytest.raises(ValueError, match="at least 8 positions"):
        in_context_gain([1.0] * 7)


def _explicit_attention(attn, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The attention layer's output by hand: scores q k^T * scale, -inf where ``allowed`` (T, T) is False,
    softmax over the keys, times v, heads merged, c_proj."""
    B, T, C = x.shape
    q, k, v = attn.heads(x)  # (B, n_head, T, head_dim) each
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) * attn.scale  # (B, n_head, T, T)
    scores = scores.masked_fill(~allowed, float("-inf"))
    y = torch.einsum("bhts,bhsd->bhtd", scores.softmax(dim=-1), v)  # (B, n_head, T, head_dim)
    return attn.c_proj(y.transpose(1, 2).reshape(B, T, C))


def test_the_diagonal_mask_against_an_explicit_score_matrix():
    """context: self attends to its own position only (an identity score mask); causal to itself and before."""
    torch.manual_seed(0)
    m = model_cfg("nano")
    x = torch.randn(2, 16, m.n_embd)
    for name, allowed in (("no_context", torch.eye(16, dtype=torch.bool)),
                          ("baseline", torch.ones(16, 16).tril().bool())):
        attn = GPT(m, variant_cfg(name), VOCAB, init_seed=3).transformer.h[0].attn.eval()
        with torch.no_grad():
            assert torch.allclose(attn(x), _explicit_attention(attn, x, allowed), atol=1e-6), name
    # with one key per query the softmax is exactly 1: the output is c_proj(v_t)
    attn = GPT(m, variant_cfg("no_context"), VOCAB, init_seed=3).transformer.h[0].attn.eval()
    with torch.no_grad():
        _, _, v = attn.heads(x)
        assert torch.allclose(attn(x), attn.c_proj(v.transpose(1, 2).reshape(2, 16, m.n_embd)), atol=1e-6)


def test_the_no_context_model_ignores_every_earlier_token():
    """The output at position t does not change when tokens before t change (a learned bigram), while the
    causal baseline's does; both have the same parameters."""
    torch.manual_seed(1)
    m = model_cfg("nano")
    idx = torch.randint(0, VOCAB, (1, m.block_size))
    changed = idx.clone()
    changed[0, :10] = (idx[0, :10] + 7) % VOCAB  # every token before position 10 differs
    for name, same in (("no_context", True), ("baseline", False)):
        model = GPT(m, variant_cfg(name), VOCAB, init_seed=5).eval()
        with torch.no_grad():
            a, _ = model(idx)
            b, _ = model(changed)
        # positions 10.. see the same own token (and position): identical under context: self
        assert torch.equal(a[0, 10:], b[0, 10:]) is same, name
    assert describe(m, variant_cfg("no_context"), VOCAB) == describe(m, variant_cfg("baseline"), VOCAB)


def _read_positions(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [int(r["position"]) for r in rows], [float(r["val_loss"]) for r in rows]


@pytest.mark.slow  # one nano training
def test_per_position_loss_against_a_hand_loop(run_in, nano_project, tmp_path):
    """A nano run's positions.csv against a hand loop over the same fixed validation windows with the run's
    final weights: each position's mean loss, their mean = val_loss, in_context_gain from them."""
    from study.config import load_config
    from study.data.datamodule import TokenDataModule

    m = run_in("variant=baseline", "seed=1")
    run = tmp_path / "runs/baseline-s1"
    positions, losses = _read_positions(run / "positions.csv")
    cfg = load_config([], nano_project)
    T = cfg.model.block_size
    assert positions == list(range(1, T + 1))
    assert sum(losses) / T == pytest.approx(m["val_loss"], abs=1e-5)  # each window has T positions alike
    assert m["in_context_gain"] == pytest.approx(sum(losses[:4]) / 4 - sum(losses[-T // 4:]) / (T // 4), abs=1e-5)
    assert json.loads((run / "metrics.json").read_text())["in_context_gain"] == m["in_context_gain"]

    # the hand loop: the run's final weights, the fixed validation windows, one window and one position at a time
    ckpt = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    model = GPT(cfg.model, variant_cfg("baseline"), VOCAB)
    model.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()})
    model.eval()
    n_val = cfg.train.val_tokens // T
    dm = TokenDataModule(nano_project / cfg.data.dir, T, 4, 0, n_val, 4)
    sums, count = [0.0] * T, 0
    with torch.no_grad():
        for batch in dm.val_dataloader():
            tokens = (batch[0] if isinstance(batch, (list, tuple)) else batch).long()
            for window in tokens:
                logits, _ = model(window[None, :-1])  # (1, T, V)
                for t in range(T):
                    sums[t] += F.cross_entropy(logits[0, t], window[t + 1]).item()
                count += 1
    assert count == n_val
    hand = [s / count for s in sums]
    assert max(abs(a - b) for a, b in zip(hand, losses)) < 1e-4
    assert all(math.isfinite(x) for x in losses)


def _run(context: str, loss: float, curve=None, gain=None) -> dict:
    return {"status": "ok", "val_loss": loss, "settings": {"variant.context": context}, "position_loss": curve,
            "in_context_gain": gain}


def test_attention_share_is_the_paired_no_context_gap_against_the_margin():
    """The no-context arm (found by its recorded variant.context) minus each reference, paired by seed, with a
    95% paired-t interval computed here by scipy, and the margin in nats = margin % x the reference's mean."""
    from types import SimpleNamespace

    import numpy as np
    from scipy import stats

    from study.analysis.verdict import attention_share, no_context_arms

    base = {1: 3.0, 2: 3.1, 3: 2.9}
    bigram = {1: 3.5, 2: 3.7, 3: 3.3, 4: 3.6}  # seed 4 has no reference run: not a pair
    runs = {"base": {s: _run("causal", x) for s, x in base.items()},
            "yard": {s: _run("self", x) for s, x in bigram.items()}}
    assert no_context_arms(runs) == ["yard"]
    cfg = SimpleNamespace(study=SimpleNamespace(references=["base"], equivalence_margin=1.0))
    ok = {a: {s: r["val_loss"] for s, r in by.items()} for a, by in runs.items()}
    (row,) = attention_share(cfg, runs, ok)
    diffs = np.array([0.5, 0.6, 0.4])
    lo, hi = stats.t.interval(0.95, 2, loc=diffs.mean(), scale=stats.sem(diffs))
    assert row["arm"] == "yard" and row["reference"] == "base" and row["n_pairs"] == 3
    assert row["share"] == pytest.approx(0.5) and row["ci95"] == pytest.approx([lo, hi])
    assert row["margin_nats"] == pytest.approx(0.03) and row["ratio"] == pytest.approx(0.5 / 0.03)
    assert attention_share(cfg, {"base": runs["base"]}, {"base": ok["base"]}) == []


def test_context_use_averages_the_seeds_curves():
    from study.analysis.verdict import context_use

    by_seed = {1: _run("causal", 2.0, [3.0, 2.0, 1.0], 0.4), 2: _run("causal", 2.0, [5.0, 2.0, 3.0], 0.2),
               3: {**_run("causal", None), "status": "diverged"}}  # a lost point counts in neither
    u = context_use(by_seed)
    assert u["in_context_gain"] == pytest.approx(0.3) and u["position_loss"] == pytest.approx([4.0, 2.0, 2.0])
    assert context_use({1: _run("causal", 2.0)})["position_loss"] is None  # a run that recorded no curve


def test_the_report_opens_with_attention_share_and_draws_the_position_curves(tmp_path):
    from study.analysis import figures
    from study.analysis.tables import markdown

    arm = {"variant": "v", "overrides": [], "lr": 1e-2, "lr_from": "tuned", "tuning": "bracketed", "n_seeds": 2,
           "val_loss_mean": 3.0, "val_loss_sd": 0.01, "val_loss_ci95": [2.9, 3.1], "diverged": {}}
    verdict = {"arms": {"base": {**arm, "in_context_gain": 0.7, "position_loss": [4.0, 3.0, 2.5, 2.0]},
                        "yard": {**arm, "in_context_gain": 0.01, "position_loss": [4.0, 4.0, 4.0, 4.0]}},
               "comparisons": {}, "margin_pct": 1.0, "halfwidth_pct": 0.5, "max_seeds": 10, "n0": 5,
               "decomposition": None,
               "attention": [{"arm": "yard", "reference": "base", "n_pairs": 2, "share": 1.25, "ci95": [1.2, 1.3],
                              "margin_nats": 0.03, "ratio": 41.666}]}
    summary = {"study": "s", "verdict": verdict, "settings": {},
               "yardsticks": {"available": True, "bigram": {"all": 3.9}}}
    names = figures.write_all(summary, {}, tmp_path)
    assert "position_loss.png" in names and (tmp_path / "position_loss.png").stat().st_size > 10_000
    md = markdown({**summary, "baseline": "base", "n_seeds": 2, "seeds": [1, 2]}, names)
    head = md.split("## The decided verdict")[0]
    assert "| yard | base | 2 | +1.2500 | [+1.2000, +1.3000] | 0.0300 | 41.7 |" in head
    assert "| base | v | - | 0.01 | tuned | bracketed | 2 | 3.0000 | 0.0100 | [2.9000, 3.1000] | 0.7000 |" in md


def test_the_no_context_diagnostics_use_its_own_mask():
    """Attention entropy is 0 where each position attends to itself only (one key: probability 1), and the
    largest logit is the diagonal's, not a causal one's."""
    from study.modeling.diagnostics import diagnostics

    torch.manual_seed(2)
    m = model_cfg("nano")
    idx = torch.randint(0, VOCAB, (2, 16))
    model = GPT(m, variant_cfg("no_context"), VOCAB, init_seed=1).eval()
    with torch.no_grad():
        d = diagnostics(model, idx)
        attn, h = model.transformer.h[0].attn, model.transformer.h[0].ln_1(
            model.transformer.wte(idx) + model.transformer.wpe(torch.arange(16)))
        q, k, _ = attn.heads(h)
        diag = (q * k).sum(-1) * attn.scale  # (B, n_head, T): the only scores it uses
    assert all(d[f"L{i}/attn_entropy"] == 0.0 for i in range(m.n_layer))
    assert d["L0/attn_logit_max"] == pytest.approx(diag.abs().max().item(), rel=1e-5)
