"""Parameter and FLOP accounting of :class:`study.modeling.model.GPT` (arXiv 2001.08361's conventions)."""
from __future__ import annotations

import torch
import torch.nn as nn

from study.config import ModelConfig, VariantConfig
from study.modeling.model import GPT

def param_counts(model: GPT) -> dict[str, int]:
    """Parameter counts of a model.

    Returns:
        ``total``: every parameter, the tied embedding once; ``non_embedding``:
        total minus token and position embeddings (the convention of
        arXiv 2001.08361 and of the paper's 84.95M baseline).
    """
    total = sum(p.numel() for p in model.parameters())
    emb = sum(model.transformer[e].weight.numel() for e in ("wte", "wpe") if e in model.transformer)
    return {"total": total, "non_embedding": total - emb}


def flops_per_token(model: GPT) -> int:
    """Training FLOPs per token, forward + backward: 6 N + 12 n_layer n_embd block_size.

    N counts the weights of every matrix multiply (all nn.Linear weights, the
    tied output head included); 12 L C T is the attention score and value
    products (PaLM, arXiv 2204.02311, Appendix B; Kaplan et al., arXiv
    2001.08361, Table 1, times 3 for the backward pass).  Causal masking is
    not discounted, as in those sources.
    """
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    c = model.config
    return 6 * n + 12 * c.n_layer * c.n_embd * c.block_size


def describe(config: ModelConfig, variant: VariantConfig, vocab_size: int) -> dict[str, int]:
    """Counts of a model of ``vocab_size`` embedding rows without allocating its weights (built on the meta device).

    Returns: {"total_params", "non_embedding_params", "flops_per_token"}.
    """
    with torch.device("meta"):
        model = GPT(config, variant, vocab_size)
    counts = param_counts(model)
    return {"total_params": counts["total"], "non_embedding_params": counts["non_embedding"],
            "flops_per_token": flops_per_token(model)}
