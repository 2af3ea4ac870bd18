"""What the tasks share: the target of an unscored position, per-token scoring, keyed generators, numbers in
report text."""
from __future__ import annotations

import math

#: the target of an unscored position (torch's cross_entropy ignore_index default)
IGNORE = -100


def scored(logits, targets):
    """Per-token cross-entropy (nats) and hits where ``targets`` is scored.

    Args:
        logits: (B, T, V); targets: (B, T) int64, :data:`IGNORE` at unscored positions.

    Returns:
        (losses (B, T) float32, 0 where unscored; scored (B, T) bool; correct (B, T) bool: argmax = target).
    """
    import torch.nn.functional as F

    # (B, T, V) -> (B, V, T) against (B, T)
    losses = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none", ignore_index=IGNORE)
    mask = targets != IGNORE
    return losses, mask, (logits.argmax(-1) == targets) & mask


def keyed_generator(key: str):
    """A CPU ``torch.Generator`` seeded by sha256(``key``): the same stream wherever the key is the same."""
    import hashlib

    import torch

    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1
    return torch.Generator().manual_seed(seed)


def fmt(x, spec=".4f") -> str:
    """A number for report text, or "n/a" for None/NaN/inf."""
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def yardstick_paragraph(y: dict, sentence: str) -> list[str]:
    """comparison.md's yardstick paragraph of a task whose runs record their yardstick (summary.json "yardsticks"):
    ``sentence``, or why none is shown."""
    return ["", sentence if y.get("available") else f"Yardstick: not shown ({y.get('note')})."]
