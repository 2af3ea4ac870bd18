"""Diagnostics of a :class:`study.modeling.model.GPT` at an evaluation: attention entropy, the largest attention
logit (arXiv 2309.14322's instability signal) and how far a nonlinear projection moves from the identity;
and how they are written to a run's curve.csv and record.json.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from study.modeling.model import GPT, NonlinearProjection

@torch.no_grad()
def diagnostics(model: GPT, idx: torch.Tensor) -> dict[str, float]:
    """Per-layer diagnostics on token ids idx (B, T), for logging at each evaluation.

    x is the block's normalised input ln_1(.) (B, T, C) and, for a nonlinear projection p in q/k/v,
    f(x) = LN(W2 act(W1 RMSNorm(x))) its branch, p(x) = x + f(x) (or f(x) without the residual; with
    per_head_norm f(x)_h = g_h RMS(W2 act(W1 RMSNorm(x)))_h and p(x)_h = RMS(x_h) + f(x)_h).
    Means over the batch's tokens:

    ``L{i}/attn_entropy``
        entropy (nats) of the causal attention distributions, over heads and positions.
    ``L{i}/attn_logit_max``
        the largest attention logit in absolute value, max |q_h(t) . k_h(s)| x scale over the batch,
        the heads and the causal pairs s <= t (the ones the softmax sees), with q and k as attention
        uses them (after QK-norm): the attention-logit growth that precedes divergence
        (arXiv 2309.14322, section 3.1).
    ``L{i}/f_ratio_{p}``
        ||f(x)|| / ||x||.  Both vectors leave a LayerNorm (f ends in one), so each norm is
        sqrt(C) x the RMS of its LayerNorm's gain (f's a little less while its pre-norm variance is
        near LayerNorm's eps, as at initialisation): once training starts the ratio is ~1 (1.00-1.05
        observed) and tracks the ratio of the two gains, not how far p moved from the identity.
    ``L{i}/branch_share_{p}``
        ||f(x)|| / ||p(x)||: the nonlinear branch's share of the projection's output (1 without
        the residual; ~0.71 at initialisation, where f(x) is about orthogonal to x and as long).
    ``L{i}/turn_{p}``
        1 - cos(p(x), x): how far the branch turns the output away from the identity map
        (0: p(x) is parallel to x; 1: orthogonal).
    """
    out = {}
    B, T = idx.size()
    x = model.embed(idx)  # (B, T, C)
    full = torch.ones(T, T, dtype=torch.bool, device=idx.device)
    causal = full.tril()
    for i, block in enumerate(model.transformer.h):
        attn = block.attn
        # what it attends to: itself (context: self), s <= t (causal), or every s (bidirectional, the mlm task)
        mask = torch.eye(T, dtype=torch.bool, device=idx.device) if attn.self_only else (causal if attn.causal else full)
        h = block.ln_1(x)
        for name, proj in attn.proj.items():
            if name in "qkv" and isinstance(proj, NonlinearProjection):  # the output map ("o") reads y, not x
                f = proj.branch(h)  # (B, T, C)
                p = proj(h)  # (B, T, C)
                out[f"L{i}/f_ratio_{name}"] = (f.norm(dim=-1) / h.norm(dim=-1).clamp_min(1e-12)).mean().item()
                out[f"L{i}/branch_share_{name}"] = (f.norm(dim=-1) / p.norm(dim=-1).clamp_min(1e-12)).mean().item()
                out[f"L{i}/turn_{name}"] = (1 - F.cosine_similarity(p, h, dim=-1)).mean().item()
        q, k, _ = attn.heads(h)  # (B, n_head, T, head_dim) each, normalised as attention uses them
        scores = (q @ k.transpose(-2, -1)) * attn.scale  # (B, n_head, T, T)
        out[f"L{i}/attn_logit_max"] = scores.masked_fill(~mask, 0.0).abs().amax().item()
        p = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # (B, n_head, T)
        out[f"L{i}/attn_entropy"] = entropy.mean().item()
        x = block(x)
    return out


#: the diagnostics (:func:`diagnostics` keys ``L{i}/NAME``) that a run's curve.csv rows and record.json
#: carry, as ``NAME/L{i}`` columns (MLflow has every diagnostic as ``diag/L{i}/NAME``)
CURVE_DIAGNOSTICS = ("attn_logit_max",)


def layer_order(key: str) -> tuple[str, int]:
    """Sort key of a ``NAME/L{i}`` column: by name, then layer number (L2 before L10)."""
    name, _, layer = key.rpartition("/L")
    return name, int(layer)


def curve_diagnostics(diag: dict[str, float] | None) -> dict[str, float]:
    """One evaluation's :func:`diagnostics` -> its curve row's columns {``attn_logit_max/L0``: value, ...}
    (:data:`CURVE_DIAGNOSTICS`, layers in order); {} where none were computed (ranks other than 0)."""
    out = {}
    for key, value in (diag or {}).items():
        layer, _, name = key.partition("/")
        if name in CURVE_DIAGNOSTICS:
            out[f"{name}/{layer}"] = value
    return dict(sorted(out.items(), key=lambda kv: layer_order(kv[0])))


def final_diagnostics(row: dict) -> dict[str, list[float]]:
    """record.json's diagnostics from a run's last curve row: {``attn_logit_max``: [layer 0, 1, ...]}
    for each of :data:`CURVE_DIAGNOSTICS` the row has ({} for none); a non-finite value (a diverged
    run's) is None, so that record.json stays strict JSON."""
    out = {}
    for name in CURVE_DIAGNOSTICS:
        cols = sorted((k for k in row if k.startswith(f"{name}/L")), key=layer_order)
        if cols:
            out[name] = [row[k] if math.isfinite(row[k]) else None for k in cols]
    return out
