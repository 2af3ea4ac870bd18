"""The lr sweep's points: read by :func:`study.runner.profiles.resolve` while training (a tuned run takes
its variant's best lr) and by the sweep's report.  Kept apart so that the train stages depend on
this file only, not on the rest of the analysis."""
from __future__ import annotations

import json
import math
from pathlib import Path

from study.config import run_name
from study.data import DataError


def sweep_results(cfg, root: Path, variant: str) -> list[dict]:
    """The lr-sweep runs of ``variant``, one per lr of ``lr_sweep.lrs``, in grid order.

    Returns: [{"lr", "val_loss" (nats, None when diverged), "status", "tokens", "run"}].

    Raises:
        DataError: a grid point has no finished run (names the command that makes it).
    """
    found = {}
    seed = cfg.lr_sweep.seed
    for path in sorted((root / cfg.study.runs_dir / "lr_sweep").glob(f"*/{run_name(variant, seed)}/metrics.json")):
        try:  # record.json (lr, status) beside metrics.json (val_loss, tokens; no val_loss when diverged)
            m = {**json.loads((path.parent / "record.json").read_text()), **json.loads(path.read_text())}
        except (OSError, ValueError):
            continue  # not a finished run of this layout: reported missing below
        if m.get("lr") is not None:
            found[float(m["lr"])] = {"lr": float(m["lr"]), "val_loss": m.get("val_loss"), "status": m["status"],
                                     "tokens": m["tokens"], "run": str(path.parent)}
    out, missing = [], []
    tokens = cfg.lr_sweep.tokens // cfg.train.batch_tokens * cfg.train.batch_tokens  # whole steps
    for lr in cfg.lr_sweep.lrs:
        hit = [r for x, r in found.items() if math.isclose(x, float(lr), rel_tol=1e-9)]
        if hit and hit[0]["tokens"] == tokens:
            out.append(hit[0])
        else:
            missing.append(lr)
    if missing:
        raise DataError(f"the lr sweep of {variant!r} lacks finished runs at lr {missing} (seed {seed}, "
                        f"{cfg.lr_sweep.tokens:,} tokens) under {cfg.study.runs_dir}/lr_sweep: run `dvc repro` with "
                        f"lr_sweep.variants including {variant!r} (docs/profiles.md)")
    return out


def best_lr(results: list[dict]) -> dict:
    """The best point of one variant's sweep: lowest final val_loss among runs that did not diverge.

    Returns: {"lr", "val_loss", "at_edge" (True when the best lr is the grid's smallest or largest:
    the optimum may lie outside the grid)}.

    Raises:
        DataError: every run of the sweep diverged.
    """
    ok = [r for r in results if r["status"] == "ok" and r["val_loss"] is not None]
    if not ok:
        raise DataError("every lr of the sweep diverged: lower lr_sweep.lrs")
    best = min(ok, key=lambda r: r["val_loss"])
    lrs = sorted(r["lr"] for r in results)
    return {"lr": best["lr"], "val_loss": best["val_loss"], "at_edge": best["lr"] in (lrs[0], lrs[-1])}
