"""Synthetic run folders (metrics.json, record.json, curve.csv, config.json) as study.train writes them."""
from __future__ import annotations

import json
from pathlib import Path

CORPORA = ("sotu", "shakespeare", "kjv")


def write_run(d: Path, variant: str, seed: int, loss: float, *, tokens=1000, lr=3e-3, params=1000, fpt=6000,
              status="ok", group="", model=None, train=None, digest="0123456789abcdef", per_corpus=None,
              results=None) -> Path:
    """One finished run in folder ``d``; ``model``/``train`` override recorded settings, ``per_corpus``
    ({corpus: final loss}) adds per-corpus losses to record.json and curve.csv, ``results`` adds results (a task's
    val_accuracy to metrics.json, its task and yardsticks to record.json)."""
    d.mkdir(parents=True, exist_ok=True)
    metrics = {"variant": variant, "seed": seed, "status": status, "reason": None if status == "ok" else "test",
               "val_loss": loss if status == "ok" else None, "tokens": tokens, "tokenizer": "bpe", "lr": lr,
               "min_lr": lr / 10, "non_embedding_params": params, "total_params": params + 10,
               "flops_per_token": fpt, "group": group}
    cols = ["step", "tokens", "train_loss", "val_loss", "lr"] + [f"val_loss/{c}" for c in (per_corpus or {})]
    rows = []
    for k in (1, 2, 3):  # three evaluations, the loss falling to its final value
        extra = [f"{x + 0.1 * (3 - k)}" for x in (per_corpus or {}).values()]
        rows.append(",".join([str(k), str(k * tokens // 3), str(loss + 0.12 * (3 - k) + 0.05),
                              str(loss + 0.1 * (3 - k)), str(lr)] + extra))
    if per_corpus:
        metrics["val_loss_per_corpus"] = dict(per_corpus)
    metrics.update(results or {})
    from study.runfolder import split_result

    numbers, record = split_result(metrics)
    (d / "record.json").write_text(json.dumps(record))
    (d / "metrics.json").write_text(json.dumps(numbers))
    (d / "curve.csv").write_text(",".join(cols) + "\n" + "\n".join(rows) + "\n")
    config = {"model": {"name": "nano", "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64, "vocab_multiple": 1,
                        **(model or {})},
              "variant": {"name": variant}, "arm": {"lr": lr},
              "data": {"tokenizer": "bpe", "corpora": list(CORPORA), "vocab_size": 512},
              "train": {"tokens": tokens, "batch_tokens": 500, "lr": 3e-3, "min_lr": 3e-4, "warmup_tokens": 0,
                        "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0, "val_tokens": 8192,
                        "data_seed": None, "init_seed": None, **(train or {})},
              "trainer": {"precision": "32-true", "progress_bar": False},
              "seed": seed, "data_digest": digest}
    (d / "config.json").write_text(json.dumps(config))
    return d
