"""GPT decoder whose attention projections are chosen by name.

One readable file in the manner of nanoGPT: pre-LayerNorm blocks, learned
absolute positions (or, with ``model.position=rope``, rotary q and k: :func:`rotary`),
tied input/output embeddings, no biases, exact-GELU MLP, causal SDPA attention.
The subject of the study is how attention maps the block's normalised input
x (B, T, C) to queries, keys and values:

=================  ===========================================  =====================
mode               map                                          parameters (C = n_embd)
=================  ===========================================  =====================
linear             x W                                          C^2 (fused with others)
identity           x                                            0
residual_linear    x + x W                                      C^2
nonlinear          x + LN(W2 act(W1 RMSNorm(x)))   (residual)   2 C r + 2 C
                   LN(W2 act(W1 RMSNorm(x)))       (no residual)
=================  ===========================================  =====================

The nonlinear map is the one of arXiv 2603.13381 (Karbevski, "Beyond Linearity
in Attention Projections: The Case for Nonlinear Queries"): W1 (C -> r),
W2 (r -> C), r = C/2, no biases, exact GELU, RMSNorm eps 1e-5, LayerNorm
without bias; with r = C/2 it has C^2 + 2C parameters, the cost of a linear W_Q.
When q or k is not a plain linear map the attention scale is
1 / (2 sqrt(head_dim)) instead of 1 / sqrt(head_dim), as in that paper's code.
All linear projections of a block that remain are fused in one matrix
(C -> n_linear * C), so the baseline is nanoGPT's c_attn (C -> 3C) and the
identity/nonlinear query keeps one fused C -> 2C projection for k and v.

The recipe switches of the public follow-up "Retuning the Linear Baseline at GPT-3 Large" (GitHub fork 25simsa1/1beyond_query_linearity, 2026),
which asks whether the gain is the recipe or the architecture;
each a field of the variant, all resolved per layer by :func:`resolve_attention` and all off by
default (then every tensor op is the one of the plain model):

=====================  =========================================================  ====================
switch                 what                                                       parameters per layer
=====================  =========================================================  ====================
qk_norm: rms           q_h, k_h <- x_h rsqrt(mean_j x_hj^2 + 1e-6), after the       0
                       head split, before the softmax scale (arXiv 2010.04245;
                       parameter-free as in the follow-up)
qk_norm: rms_gain      the same times a learnable gain of head_dim, one for q       2 head_dim
                       and one for k (shared by the heads)
k_norm                 keys alone normalised as by qk_norm: rms                     0
per_head_norm          q_h = RMS(x_h) + g_h * RMS(f(x)_h), f(x) = W2 act(W1         as nonlinear
                       RMSNorm(x)), g = the branch's LayerNorm gain reshaped to
                       (n_head, head_dim)
activation: identity   the nonlinear query with act removed: q = x + LN(W2 W1      as nonlinear
                       RMSNorm(x)), the parameter-identical linear ablation
lower_query            the query mode of layers i < n_layer // 2 (the follow-up's   by mode
                       split depth: identity below, nonlinear above)
output: MODE           the output projection O of the merged heads y: c_proj     by mode (nonlinear:
                       (linear), or y + LN(W2 act(W1 RMSNorm(y))) (nonlinear)    C^2 + 2C, as W_O's C^2)
context: self          each position attends to itself only (a diagonal mask      as the variant
                       instead of the causal one): the no-context yardstick, a
                       stack of per-token MLPs, i.e. a learned bigram model
=====================  =========================================================  ====================
The task chooses the mask: ``GPT(causal=True)`` (lm, mqar) or ``causal=False`` (mlm: bidirectional, the
encoder of arXiv 1810.04805); ``context: self`` overrides both.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from study.config import ModelConfig, VariantConfig


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (RoFormer, arXiv 2104.09864; the half-split pairing of GPT-NeoX and LLaMA):
    x (B, n_head, T, head_dim) -> the same shape, the pair (x_i, x_{i + head_dim/2}) of position t rotated by the
    angle t 10000^(-2i / head_dim), so a query-key score depends on the two positions only through their offset."""
    T, half = x.size(-2), x.size(-1) // 2
    inv_freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)  # (half,)
    angle = torch.arange(T, dtype=torch.float32, device=x.device)[:, None] * inv_freq  # (T, half)
    cos, sin = angle.cos(), angle.sin()
    # rotated in fp32 (fp64 stays fp64) whatever x's dtype, so every arm alike under bf16 autocast; cast back after
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    x1, x2 = xf[..., :half], xf[..., half:]  # (B, n_head, T, half) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class ReLU2(nn.Module):
    """Squared ReLU, relu(x)^2 (arXiv 2109.08668)."""
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


ACTIVATION_MODULES = {"gelu": lambda: nn.GELU(approximate="none"), "relu2": ReLU2, "silu": nn.SiLU,
                      "identity": nn.Identity}
#: eps of the per-head RMS normalisation of q and k (QK-norm, k_norm, per_head_norm), the follow-up's
HEAD_NORM_EPS = 1e-6


def head_rms_norm(kind: str, head_dim: int) -> nn.Module | None:
    """The per-head normalisation of q or k, (..., head_dim) -> (..., head_dim), by name.

    ``none``: None (no module, no op); ``rms``: x rsqrt(mean over head_dim of x^2 + 1e-6), no
    parameters; ``rms_gain``: the same times a learnable gain (head_dim,), initialised to ones.
    torch's ``nn.RMSNorm`` computes exactly this (arXiv 1910.07467; QK-norm: arXiv 2010.04245).

    Raises:
        ValueError: unknown kind.
    """
    if kind == "none":
        return None
    if kind in ("rms", "rms_gain"):
        return nn.RMSNorm(head_dim, eps=HEAD_NORM_EPS, elementwise_affine=kind == "rms_gain")
    raise ValueError(f"unknown head normalisation {kind!r}")


class NonlinearProjection(nn.Module):
    """x (B, T, C) -> x + LN(W2 act(W1 RMSNorm(x))) (B, T, C), or without the ``x +``.

    Parameters: W1 (r, C), W2 (C, r), RMSNorm gain (C), LayerNorm gain (C).

    With ``n_head`` set (the follow-up's per-head normalised query): the LayerNorm is not
    applied; its gain g (C,) is read as (n_head, head_dim) and, per head h,
    q_h = RMS(x_h) + g_h * RMS(u_h), u = W2 act(W1 RMSNorm(x)), RMS(v) = v rsqrt(mean(v^2) + 1e-6)
    over head_dim: the same parameters as the plain map.
    """

    def __init__(self, n_embd: int, width: int, activation: str = "gelu", residual: bool = True,
                 n_head: int | None = None):
        super().__init__()
        self.rms = nn.RMSNorm(n_embd, eps=1e-5)
        self.w1 = nn.Linear(n_embd, width, bias=False)
        self.act = ACTIVATION_MODULES[activation]()
        self.w2 = nn.Linear(width, n_embd, bias=False)
        self.ln = nn.LayerNorm(n_embd, eps=1e-5, bias=False)
        self.residual = residual
        self.n_head = n_head
        self.head_rms = head_rms_norm("rms", n_embd // n_head) if n_head else None

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, T, n_head, head_dim), each head normalised to RMS 1."""
        return self.head_rms(t.view(*t.shape[:-1], self.n_head, -1))

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(x): (B, T, C) -> (B, T, C); per head g_h * RMS(u_h) with ``n_head``."""
        u = self.w2(self.act(self.w1(self.rms(x))))
        if self.n_head is None:
            return self.ln(u)
        g = self.ln.weight.view(self.n_head, -1)  # (n_head, head_dim)
        return (g * self._heads(u)).flatten(-2)  # (B, T, n_head, head_dim) -> (B, T, C)

    def base(self, x: torch.Tensor) -> torch.Tensor:
        """The identity term: x, or RMS(x_h) per head with ``n_head``; (B, T, C) -> (B, T, C)."""
        return x if self.n_head is None else self._heads(x).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.branch(x)
        return self.base(x) + f if self.residual else f


class ResidualLinearProjection(nn.Module):
    """x (B, T, C) -> x + x W^T (B, T, C): a linear map written as identity plus a residual."""

    def __init__(self, n_embd: int):
        super().__init__()
        self.w = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w(x)


def build_projection(mode: str, n_embd: int, variant: VariantConfig, n_head: int | None = None) -> nn.Module | None:
    """The one place where projection-mode names become modules.

    Returns None for ``linear`` (those rows go into the block's fused matrix).  ``n_head``: the
    per-head normalised nonlinear map (:class:`NonlinearProjection`).

    Raises:
        ValueError: unknown mode.
    """
    if mode == "linear":
        return None
    if mode == "identity":
        return nn.Identity()
    if mode == "residual_linear":
        return ResidualLinearProjection(n_embd)
    if mode == "nonlinear":
        return NonlinearProjection(n_embd, round(n_embd * variant.bottleneck), variant.activation,
                                   variant.residual, n_head)
    raise ValueError(f"unknown projection mode {mode!r}")


def attention_scale(head_dim: int, variant: VariantConfig, query: str | None = None) -> float:
    """Softmax scale: factor / sqrt(head_dim); factor 0.5 when q or k is not plain linear.

    ``query``: the query mode of the layer (default ``variant.query``; see :func:`resolve_attention`)."""
    factor = variant.scale_factor
    query = variant.query if query is None else query
    if factor is None:
        factor = 0.5 if (query != "linear" or variant.key != "linear") else 1.0
    return factor / math.sqrt(head_dim)


@dataclass(frozen=True)
class AttentionRecipe:
    """What one block's attention is, resolved from the variant (:func:`resolve_attention`).

    ``query``/``key``/``value``: projection modes; ``scale``: the softmax scale; ``q_norm``/``k_norm``:
    the per-head normalisation of q and k (:func:`head_rms_norm`: none, rms, rms_gain);
    ``per_head_norm``: the query is the per-head normalised nonlinear map."""

    query: str
    key: str
    value: str
    scale: float
    q_norm: str = "none"
    k_norm: str = "none"
    per_head_norm: bool = False


def resolve_attention(config: ModelConfig, variant: VariantConfig, layer: int) -> AttentionRecipe:
    """The one place where a variant's switches become one layer's attention.

    * query mode: ``variant.lower_query`` in layers ``layer < n_layer // 2`` where it is set (the
      follow-up's split depth), else ``variant.query``;
    * scale: :func:`attention_scale` of that query mode;
    * q_norm = ``variant.qk_norm``; k_norm = ``variant.qk_norm``, or ``rms`` with ``variant.k_norm``;
    * per_head_norm: ``variant.per_head_norm`` where this layer's query is nonlinear.

    Every switch off gives the plain recipe of arXiv 2603.13381's code (q_norm = k_norm = none).
    """
    query = variant.query
    if variant.lower_query is not None and layer < config.n_layer // 2:
        query = variant.lower_query
    head_dim = config.n_embd // config.n_head
    k_norm = variant.qk_norm if variant.qk_norm != "none" else ("rms" if variant.k_norm else "none")
    return AttentionRecipe(query=query, key=variant.key, value=variant.value,
                           scale=attention_scale(head_dim, variant, query), q_norm=variant.qk_norm, k_norm=k_norm,
                           per_head_norm=bool(variant.per_head_norm) and query == "nonlinear")


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention, pluggable q, k, v and output projections (layer ``layer``); causal or not."""

    def __init__(self, config: ModelConfig, variant: VariantConfig, layer: int = 0, causal: bool = True):
        super().__init__()
        self.causal, self.n_head, self.n_embd = causal, config.n_head, config.n_embd
        self.head_dim = config.n_embd // config.n_head
        self.recipe = recipe = resolve_attention(config, variant, layer)
        self.modes = (recipe.query, recipe.key, recipe.value)
        self.n_linear = sum(m == "linear" for m in self.modes)
        # fused matrix for every linear projection, in q, k, v order
        self.c_attn = nn.Linear(config.n_embd, self.n_linear * config.n_embd, bias=False) if self.n_linear else None
        per_head = {"q": config.n_head} if recipe.per_head_norm else {}
        self.proj = nn.ModuleDict({name: p for name, mode in zip("qkv", self.modes)
                                   if (p := build_projection(mode, config.n_embd, variant, per_head.get(name)))
                                   is not None})
        self.q_norm = head_rms_norm(recipe.q_norm, self.head_dim)  # None when off
        self.k_norm = head_rms_norm(recipe.k_norm, self.head_dim)
        # the output projection O: nanoGPT's c_proj (GPT-2 scaled init), or a projection mode's module ("o")
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False) if variant.output == "linear" else None
        if variant.output != "linear":
            self.proj["o"] = build_projection(variant.output, config.n_embd, variant)
        self.scale = recipe.scale
        self.self_only = variant.context == "self"  # the no-context yardstick: a diagonal mask
        self.rope = config.position == "rope"
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> q, k, v each (B, T, C)."""
        linear = iter(self.c_attn(x).split(self.n_embd, dim=2)) if self.c_attn is not None else iter(())
        out = []
        for name, mode in zip("qkv", self.modes):
            out.append(next(linear) if mode == "linear" else self.proj[name](x))
        return out[0], out[1], out[2]

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> q, k, v each (B, n_head, T, head_dim), q and k normalised where the recipe says."""
        B, T, C = x.size()
        q, k, v = self.qkv(x)
        # (B, T, C) -> (B, T, n_head, head_dim) -> (B, n_head, T, head_dim)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        # QK-norm over head_dim, after the head split and before the softmax scale (arXiv 2010.04245)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.rope:  # positions enter here, after the norm (the wpe table is absent)
            q, k = rotary(q), rotary(k)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.heads(x)
        # causal, none (bidirectional), or (context: self) a diagonal mask (T, T): position t sees itself only, its
        # output is v_t; q and k still enter the softmax (their gradients are exactly zero), so DDP sees every parameter
        mask = torch.eye(T, dtype=torch.bool, device=x.device) if self.self_only else None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal and not self.self_only,
                                           scale=self.scale, dropout_p=self.dropout if self.training else 0.0)
        # (B, n_head, T, head_dim) -> (B, T, n_head, head_dim) -> (B, T, C)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y) if self.c_proj is not None else self.proj["o"](y))


class MLP(nn.Module):
    """(B, T, C) -> (B, T, C): C -> hidden -> C with exact GELU, no biases."""

    def __init__(self, n_embd: int, hidden: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, hidden, bias=False)
        self.gelu = nn.GELU(approximate="none")
        self.c_proj = nn.Linear(hidden, n_embd, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


def _norm(config: ModelConfig) -> nn.Module:
    return nn.LayerNorm(config.n_embd, bias=False) if config.norm == "layernorm" else nn.Identity()


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + mlp(LN(x)); (B, T, C) -> (B, T, C)."""

    def __init__(self, config: ModelConfig, variant: VariantConfig, layer: int = 0, causal: bool = True):
        super().__init__()
        self.ln_1 = _norm(config)
        self.attn = CausalSelfAttention(config, variant, layer, causal)
        self.ln_2 = _norm(config)
        ratio = variant.mlp_ratio if variant.mlp_ratio is not None else config.mlp_ratio
        self.mlp = MLP(config.n_embd, int(config.n_embd * ratio), config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _keyed_normal(shape: tuple, std: float, seed: int, name: str) -> torch.Tensor:
    """N(0, std) values of ``shape`` from a CPU generator seeded by sha256(seed, name): the same
    values wherever a parameter of that name and shape appears."""
    key = int.from_bytes(hashlib.sha256(f"init/{seed}/{name}".encode()).digest()[:8], "little") >> 1
    return torch.empty(shape).normal_(0.0, std, generator=torch.Generator().manual_seed(key))


class GPT(nn.Module):
    """Token ids (B, T) -> logits (B, T, vocab_size): a decoder, or with ``causal=False`` an encoder (same blocks).
    ``vocab_size`` is the embedding's rows (tokens): the prepared data's vocabulary as the task pads it
    (``study.tasks``' ``model_vocab``)."""

    def __init__(self, config: ModelConfig, variant: VariantConfig, vocab_size: int, init_seed: int = 0,
                 causal: bool = True):
        super().__init__()
        self.config, self.variant, self.causal, self.vocab_size = config, variant, causal, vocab_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, config.n_embd),
            **({"wpe": nn.Embedding(config.block_size, config.n_embd)} if config.position != "rope" else {}),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, variant, i, causal) for i in range(config.n_layer)]),
            ln_f=_norm(config),
        ))
        self.lm_head = nn.Linear(config.n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied embeddings
        self.init_parameters(init_seed)

    # -- initialisation, all in one place (GPT-2 / nanoGPT) ----------------------------------
    def init_std(self, name: str) -> float | None:
        """Init std of parameter ``name``: matrices and embeddings N(0, 0.02), the blocks' output
        projections (``attn.c_proj``, ``mlp.c_proj``) N(0, 0.02 / sqrt(2 n_layer)) (GPT-2 scaled init);
        None for norm gains (ones, torch's default), the QK-norm gains (``attn.q_norm``, ``attn.k_norm``) too."""
        if name.endswith("c_proj.weight"):
            return 0.02 / math.sqrt(2 * self.config.n_layer)
        return None if name.split(".")[-2] in ("ln_1", "ln_2", "ln_f", "ln", "rms", "q_norm", "k_norm") else 0.02

    @torch.no_grad()
    def init_parameters(self, init_seed: int) -> None:
        """Draw every parameter from a generator keyed by (init_seed, its name) only (common random numbers).

        Two variants built with one seed therefore start with identical values in every tensor they share
        by name and shape (embeddings, MLPs, output projections, norms), whatever else they hold; the fused
        linear q/k/v matrix ``c_attn`` draws each C-row block under the name of its projection
        (``...attn.q``, ``.k``, ``.v``), so the key and value rows of the baseline equal those of a variant
        whose query is not linear.  Parameters on the meta device are left as they are.
        """
        for name, p in self.named_parameters():  # the tied embedding once, as transformer.wte.weight
            if p.device.type == "meta":
                continue
            std = self.init_std(name)
            if std is None:
                p.fill_(1.0)
                continue
            if name.endswith("attn.c_attn.weight"):
                attn = self.get_submodule(name.rsplit(".", 1)[0].rsplit(".", 1)[0])
                rows = [m for m in "qkv" if dict(zip("qkv", attn.modes))[m] == "linear"]
                base = name.rsplit(".", 2)[0]
                parts = [_keyed_normal((attn.n_embd, p.shape[1]), std, init_seed, f"{base}.{m}") for m in rows]
                p.copy_(torch.cat(parts))  # (n_linear * C, C), in q, k, v order
            else:
                p.copy_(_keyed_normal(tuple(p.shape), std, init_seed, name))

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) -> (B, T, C): token embeddings, plus the learned positions where the model has them (with
        ``position=rope`` the positions enter q and k in every block instead)."""
        x = self.transformer.wte(idx)  # (B, T, C)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(idx.size(1), dtype=torch.long, device=idx.device))  # (T, C)
        return x

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx (B, T) int64 token ids -> (logits (B, T, vocab_size), mean cross-entropy in nats or None); ``targets``
        (B, T): the id to predict at each position, -100 where nothing is scored (mlm, mqar; cross_entropy's default).

        Raises:
            ValueError: T is larger than block_size.
        """
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} > block_size {self.config.block_size}")
        x = self.transformer.drop(self.embed(idx))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            # (B, T, V) -> (B*T, V) against (B*T,)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
