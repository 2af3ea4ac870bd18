"""Synthetic run folders (metrics.json, record.json, curve.csv, config.json) as study.train writes them."""
from __future__ import annotations

import json
from pathlib import Path

CORPORA = ("sotu", "shakespeare", "kjv")
#: the nano study's budget (tests/conftest.py NANO_STUDY): an arm's test run records the study's recipe
NANO_TOKENS = 20480
NANO_TRAIN = {"batch_tokens": 2048, "warmup_tokens": 4096}


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


def arm_run(runs: Path, arm: str, seed: int, variant: str | None = None) -> Path:
    """The folder of arm ``arm``'s test run at ``seed`` under ``runs`` (the test stage's runs/test/ARM/VARIANT-sSEED)."""
    return runs / "test" / arm / f"{variant or arm}-s{seed}"


def write_arms(runs: Path, losses: dict[str, dict[int, float | dict]], variants: dict[str, str] | None = None,
               **kw) -> dict[str, list[int]]:
    """The test runs of arms as the test stage writes them: one :func:`write_run` per ``losses[arm][seed]`` (a final
    loss, or the keyword arguments of that run: ``{"loss": 4.0, "status": "diverged", ...}``) in
    :func:`arm_run`'s folder, ``kw`` given to every run (the nano study's budget unless they say otherwise), and runs/test/plan.json planning those seeds.  ``variants``:
    {arm: variant} where an arm's variant is not its name.  Returns the plan's seeds."""
    variants = variants or {}
    kw = {"tokens": NANO_TOKENS, **kw, "train": {**NANO_TRAIN, **(kw.get("train") or {})}}
    for arm, by_seed in losses.items():
        for seed, x in by_seed.items():
            one = {**kw, **(x if isinstance(x, dict) else {"loss": x})}
            loss = one.pop("loss")
            v = variants.get(arm, arm)
            write_run(arm_run(runs, arm, seed, v), v, seed, loss, group=f"test/{arm}", **one)
    seeds = {arm: sorted(by_seed) for arm, by_seed in losses.items()}
    (runs / "test").mkdir(parents=True, exist_ok=True)
    (runs / "test" / "plan.json").write_text(json.dumps({"arms": list(losses), "seeds": seeds}, indent=1))
    return seeds


def arms_overrides(tmp_path: Path, arms=("baseline", "nonlinear_q"), seeds=(1, 2, 3, 4, 5)) -> list[str]:
    """The overrides of a nano study of ``arms`` (tests/conftest.py NANO_ARMS, each at lr 3e-3) on ``seeds``, every
    arm against the baseline, its runs, reports and MLflow store under ``tmp_path``."""
    return [f"study.runs_dir={tmp_path / 'runs'}", f"study.reports_dir={tmp_path / 'reports'}",
            f"study.tracking_db={tmp_path / 'm.db'}", f"study.artifact_dir={tmp_path / 'art'}",
            f"study.seeds={list(seeds)}", f"study.max_seeds={len(seeds)}", "study.pilot_seeds=[]",
            f"study.arms=[{','.join(arms)}]", "study.references=[baseline]", "study.pairs=[]"]
