"""The model: shapes, parameter/FLOP counts, fidelity to arXiv 2603.13381, the algebra of 2510.23912.

Expected values are computed here independently of study/modeling/model.py (formulas,
plain tensor algebra), never read back from the module under test.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from study.config import ModelConfig, VariantConfig, embedding_rows
from study.modeling.accounting import describe, param_counts
from study.modeling.model import GPT

VOCAB = 512  # embedding rows of the test models (tokens)

ROOT_CONF = __import__("pathlib").Path(__file__).resolve().parent.parent / "conf"


def model_cfg(name: str = "nano", **over) -> ModelConfig:
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(ROOT_CONF / "model" / f"{name}.yaml"))
    for k, v in over.items():
        cfg[k] = v
    return cfg


def variant_cfg(name: str, **over) -> VariantConfig:
    cfg = OmegaConf.merge(OmegaConf.structured(VariantConfig), OmegaConf.load(ROOT_CONF / "variant" / f"{name}.yaml"))
    cfg.name = name
    for k, v in over.items():
        cfg[k] = v
    return cfg


VARIANTS = ["baseline", "identity_q", "nonlinear_q", "baseline_mlp4.75"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_shapes_and_initial_loss(variant):
    torch.manual_seed(0)
    m = model_cfg("nano")
    model = GPT(m, variant_cfg(variant), VOCAB)
    idx = torch.randint(0, VOCAB, (3, m.block_size))
    targets = torch.randint(0, VOCAB, (3, m.block_size))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, m.block_size, VOCAB)
    # at init the logits are nearly uniform: loss close to ln(vocab_size)
    assert abs(loss.item() - math.log(VOCAB)) < 0.1
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, m.block_size + 1, dtype=torch.long))


def test_non_embedding_parameters_at_gpt3_small():
    m = model_cfg("gpt3-small")
    rows = embedding_rows(50257, m.vocab_multiple)  # GPT-2's ids padded to model.vocab_multiple
    assert rows == 50304
    C, L = 768, 12
    per_layer_ln = 2 * C
    baseline = L * (4 * C * C + 2 * C * 4 * C + per_layer_ln) + C  # qkv+proj, MLP 4C, 2 LN; final LN
    counts = {v: describe(m, variant_cfg(v), rows)["non_embedding_params"] for v in VARIANTS}
    assert counts["baseline"] == baseline
    assert round(counts["baseline"] / 1e6, 2) == 84.95
    assert round(counts["identity_q"] / 1e6, 2) == 77.88
    assert counts["identity_q"] == baseline - L * C * C
    assert counts["nonlinear_q"] == baseline + L * 2 * C  # W1, W2 replace W_Q; + RMSNorm and LN gains
    assert abs(counts["baseline_mlp4.75"] / baseline - 1.125) < 0.001
    assert describe(m, variant_cfg("baseline"), rows)["total_params"] == baseline + 50304 * C + 1024 * C


def test_flops_per_token_formula():
    m = model_cfg("gpt3-small")
    C, L, T, V = 768, 12, 1024, 50304
    rows = embedding_rows(50257, m.vocab_multiple)
    matmul_weights = L * 12 * C * C + V * C
    assert describe(m, variant_cfg("baseline"), rows)["flops_per_token"] == 6 * matmul_weights + 12 * L * C * T
    # the nonlinear query costs the same matmul FLOPs as the linear one (C x C/2 + C/2 x C = C x C)
    assert describe(m, variant_cfg("nonlinear_q"), rows)["flops_per_token"] == 6 * matmul_weights + 12 * L * C * T


def test_nonlinear_query_is_the_papers_f():
    """q = x + LN(W2 GELU(W1 RMSNorm(x))), W1: C -> C/2, W2: C/2 -> C, no biases, exact GELU."""
    torch.manual_seed(1)
    m = model_cfg("nano", n_embd=64, n_head=4)
    model = GPT(m, variant_cfg("nonlinear_q"), VOCAB)
    attn = model.transformer.h[0].attn
    f = attn.proj["q"]
    C = m.n_embd
    assert f.w1.weight.shape == (C // 2, C) and f.w2.weight.shape == (C, C // 2)
    assert all(mod.bias is None for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    assert f.ln.bias is None and f.rms.eps == 1e-5 and f.ln.eps == 1e-5
    with torch.no_grad():  # give the norm gains non-trivial values
        f.rms.weight.uniform_(0.5, 1.5)
        f.ln.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, C)
    rms = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * f.rms.weight
    h = rms @ f.w1.weight.T
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))  # exact GELU
    y = h @ f.w2.weight.T
    y = (y - y.mean(-1, keepdim=True)) / torch.sqrt(y.var(-1, unbiased=False, keepdim=True) + 1e-5) * f.ln.weight
    q, k, v = attn.qkv(x)
    torch.testing.assert_close(q, x + y, atol=1e-5, rtol=1e-5)
    # keys and values: one fused C -> 2C projection
    assert attn.c_attn.weight.shape == (2 * C, C)
    kv = x @ attn.c_attn.weight.T
    torch.testing.assert_close(torch.cat([k, v], -1), kv)
    assert sum(p.numel() for p in f.parameters()) == C * C + 2 * C


def reference_attention(q, k, v, n_head, scale):
    B, T, C = q.shape
    hd = C // n_head
    q, k, v = (t.view(B, T, n_head, hd).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * scale
    att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(B, T, C)


@pytest.mark.parametrize("variant,factor", [("baseline", 1.0), ("identity_q", 0.5), ("nonlinear_q", 0.5),
                                            ("baseline_mlp4.75", 1.0)])
def test_attention_scale(variant, factor):
    torch.manual_seed(2)
    m = model_cfg("nano", n_embd=64, n_head=4)
    attn = GPT(m, variant_cfg(variant), VOCAB).transformer.h[0].attn
    x = torch.randn(2, 7, 64)
    q, k, v = attn.qkv(x)
    expected = reference_attention(q, k, v, 4, factor / math.sqrt(16)) @ attn.c_proj.weight.T
    torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-4)
    if variant == "identity_q":
        torch.testing.assert_close(q, x)
        assert attn.c_attn.weight.shape == (128, 64)
    if variant.startswith("baseline"):
        assert attn.c_attn.weight.shape == (192, 64)


def test_initialisation_follows_the_paper():
    torch.manual_seed(3)
    m = model_cfg("nano", n_layer=4, n_embd=256, n_head=4, block_size=256)
    model = GPT(m, variant_cfg("nonlinear_q"), 4096)
    scaled = 0.02 / math.sqrt(2 * 4)
    for block in model.transformer.h:
        assert abs(block.attn.c_proj.weight.std().item() - scaled) < 0.1 * scaled
        assert abs(block.mlp.c_proj.weight.std().item() - scaled) < 0.1 * scaled
        for w in (block.attn.proj["q"].w1.weight, block.attn.proj["q"].w2.weight, block.mlp.c_fc.weight,
                  block.attn.c_attn.weight):
            assert abs(w.std().item() - 0.02) < 0.002
        assert torch.all(block.attn.proj["q"].rms.weight == 1) and torch.all(block.attn.proj["q"].ln.weight == 1)
    assert abs(model.transformer.wte.weight.std().item() - 0.02) < 0.001
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    C, V, T, L = 256, 4096, 256, 4
    nonlinear_per_layer = 12 * C * C - C * C + C * C + 2 * C + 2 * C  # W_Q swapped for W1, W2 (+2 gains)
    assert param_counts(model) == {"total": L * nonlinear_per_layer + C + V * C + T * C,
                                   "non_embedding": L * nonlinear_per_layer + C}


def test_identity_query_is_a_change_of_basis_without_normalisation():
    """The algebra of arXiv 2510.23912, in the setting where it is exact (no LayerNorm).

    Write the layers in row-vector form: q = x A_q, k = x A_k, v = x A_v, the
    attention writes y A_o, the MLP reads x A_fc and writes g A_proj, and tokens
    enter as E[idx] + P[pos].  With A_q invertible, change the basis of the
    residual stream to x' = x A_q.  Then q' = x' (W_Q = I) equals q; setting
    A_k' = 2 A_q^{-1} A_k (the 2 undoes the identity variant's 1/(2 sqrt(hd))
    scale), A_v' = A_q^{-1} A_v, A_o' = A_o A_q, A_fc' = A_q^{-1} A_fc,
    A_proj' = A_proj A_q, E' = E A_q, P' = P A_q makes every quantity of the
    identity-query model equal to the baseline's, and its residual stream equal
    to the baseline's times A_q; an untied readout U' = A_q^{-1} U gives the same
    logits (with tied embeddings the readout would need E A_q^{-T} instead, so
    the construction unties it).  One residual
    basis serves all layers, so this is exact for one layer (or layers sharing
    one W_Q); a LayerNorm between the basis change and the projections is not
    equivariant under a general A_q, which is why with normalisation the
    result is only empirical.
    """
    torch.manual_seed(4)
    torch.set_default_dtype(torch.float64)
    try:
        m = model_cfg("nano", n_layer=1, n_embd=32, n_head=4, norm="none")
        base = GPT(m, variant_cfg("baseline"), VOCAB)
        ident = GPT(m, variant_cfg("identity_q"), VOCAB)
        C = m.n_embd
        ba, ia = base.transformer.h[0], ident.transformer.h[0]
        Wq, Wk, Wv = ba.attn.c_attn.weight.split(C, dim=0)  # nn.Linear weights: A = W^T
        Aq = Wq.T
        Aq_inv = torch.linalg.inv(Aq)
        with torch.no_grad():
            ia.attn.c_attn.weight.copy_(torch.cat([(2 * Aq_inv @ Wk.T).T, (Aq_inv @ Wv.T).T], 0))
            ia.attn.c_proj.weight.copy_((ba.attn.c_proj.weight.T @ Aq).T)
            ia.mlp.c_fc.weight.copy_((Aq_inv @ ba.mlp.c_fc.weight.T).T)
            ia.mlp.c_proj.weight.copy_((ba.mlp.c_proj.weight.T @ Aq).T)
            ident.transformer.wte.weight.copy_(base.transformer.wte.weight @ Aq)
            ident.transformer.wpe.weight.copy_(base.transformer.wpe.weight @ Aq)
        idx = torch.randint(0, VOCAB, (2, m.block_size))

        def stream(model):
            pos = torch.arange(idx.shape[1])
            x = model.transformer.wte(idx) + model.transformer.wpe(pos)
            return model.transformer.h[0](x)

        h_base, h_ident = stream(base), stream(ident)
        torch.testing.assert_close(h_ident, h_base @ Aq, atol=1e-9, rtol=1e-9)
        logits_base = h_base @ base.transformer.wte.weight.T
        torch.testing.assert_close(h_ident @ Aq_inv @ base.transformer.wte.weight.T, logits_base)
        assert describe(m, variant_cfg("identity_q"), VOCAB)["non_embedding_params"] == \
            describe(m, variant_cfg("baseline"), VOCAB)["non_embedding_params"] - C * C
    finally:
        torch.set_default_dtype(torch.float32)


def test_diagnostics_by_hand():
    from study.modeling.diagnostics import diagnostics

    torch.manual_seed(5)
    m = model_cfg("nano", n_layer=2)
    model = GPT(m, variant_cfg("nonlinear_q"), VOCAB).eval()
    idx = torch.randint(0, VOCAB, (2, 16))
    d = diagnostics(model, idx)
    assert set(d) == {f"L{i}/{k}" for i in (0, 1)
                      for k in ("f_ratio_q", "branch_share_q", "turn_q", "attn_entropy", "attn_logit_max")}
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(16))
    h = model.transformer.h[0].ln_1(x)
    f = model.transformer.h[0].attn.proj["q"].branch(h)
    assert d["L0/f_ratio_q"] == pytest.approx((f.norm(dim=-1) / h.norm(dim=-1)).mean().item(), rel=1e-5)
    # the branch's share of q = x + f(x), and 1 - cos(q, x), by hand (numpy, float64)
    hn, fn = h.detach().double().numpy(), f.detach().double().numpy()
    q = hn + fn
    share = np.linalg.norm(fn, axis=-1) / np.linalg.norm(q, axis=-1)
    cos = (q * hn).sum(-1) / (np.linalg.norm(q, axis=-1) * np.linalg.norm(hn, axis=-1))
    assert d["L0/branch_share_q"] == pytest.approx(share.mean(), rel=1e-5)
    assert d["L0/turn_q"] == pytest.approx((1 - cos).mean(), rel=1e-4)
    # both leave a LayerNorm: ||f(x)|| <= sqrt(C) x its gain's RMS (equal once f's pre-norm variance >> eps)
    C = m.n_embd
    assert np.linalg.norm(fn, axis=-1).max() <= math.sqrt(C) * 1.0001
    assert math.sqrt(C) * 0.98 < np.linalg.norm(hn, axis=-1).min() <= np.linalg.norm(hn, axis=-1).max() <= math.sqrt(C)
    # entropy of a causal softmax lies between 0 and the uniform bound mean(log(t)), t = 1..T
    upper = sum(math.log(t) for t in range(1, 17)) / 16
    assert 0 < d["L0/attn_entropy"] <= upper + 1e-6
    assert "L0/f_ratio_q" not in diagnostics(GPT(m, variant_cfg("baseline"), VOCAB), idx)


def test_the_nonlinear_output_projection_by_hand_and_its_parameters():
    """nonlinear_o: O(y) = y + LN(W2 GELU(W1 RMSNorm(y))) on the merged heads, computed here with plain tensor ops;
    per layer it swaps W_O (C^2) for W1, W2 (2 C C/2) and two gains (2C): + 2C per layer at both sizes."""
    torch.manual_seed(0)
    m = model_cfg("nano")
    attn = GPT(m, variant_cfg("nonlinear_o"), VOCAB, init_seed=2).transformer.h[0].attn.eval()
    assert attn.c_proj is None and set(attn.proj) == {"o"}
    x = torch.randn(2, 8, m.n_embd)
    o = attn.proj["o"]
    with torch.no_grad():
        q, k, v = attn.heads(x)  # (B, n_head, T, head_dim)
        scores = (q @ k.transpose(-2, -1)) * attn.scale
        scores = scores.masked_fill(~torch.ones(8, 8).tril().bool(), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 8, m.n_embd)  # (B, T, C)
        r = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * o.rms.weight
        u = F.gelu(r @ o.w1.weight.T) @ o.w2.weight.T
        ln = (u - u.mean(-1, keepdim=True)) / torch.sqrt(u.var(-1, unbiased=False, keepdim=True) + 1e-5) * o.ln.weight
        assert torch.allclose(attn(x), y + ln, atol=1e-5)
    for size in ("nano", "gpt3-small"):
        c = model_cfg(size)
        base = describe(c, variant_cfg("baseline"), VOCAB)["non_embedding_params"]
        assert describe(c, variant_cfg("nonlinear_o"), VOCAB)["non_embedding_params"] == base + c.n_layer * 2 * c.n_embd
