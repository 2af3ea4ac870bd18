"""One arm tuned by the one rule (study/tuning/rule.py), ``python -m study.tune --arm NAME``: each (lr, tuning seed)
of its x2 grid trained or reused through the launcher, the grid extended until the optimum is bracketed, and
tune.runs_dir/NAME/tuning.json written (every point's per-seed losses, nats; the grid's status; the quadratic; lr*)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from study.config import ConfigError
from study.config.naming import lr_key
from study.orchestration.losses import arm_losses, finite_or_none, seed_losses
from study.runner.arms import arm_of, recipe, tune_group
from study.tuning.rule import choose, initial_grid, score, tune_arm
from study.tuning.table import RESULT


def tune_one(cfg, root: Path, name: str, params: str | None, base: list[str] = (), dry: bool = False) -> dict:
    """Tune arm ``name`` (see the module docstring); returns and writes its tuning.json content.

    Under ``launcher=slurm`` the whole initial grid goes out as one job array first (each extension then one more);
    ``dry``: print that array (runs, resources, GPU-hours) and what may follow, train nothing, return {}.

    Args:
        params: the composed config the runs start from (params.yaml under DVC; None: conf/ composed).
        base: the stage's own overrides, given to every run before the run's own.
    """
    arm, tu = arm_of(cfg, name), cfg.tune
    if name not in tu.arms:
        raise ConfigError(f"arm {name!r} is not in tune.arms={list(tu.arms)}: add it there to tune it")
    if cfg.train.lr_from_tuned:
        raise ConfigError("tuning sets each grid point's lr, but train.lr_from_tuned would replace it with one lr: "
                          "drop that override")
    extra = [f"train.tokens={tu.tokens}"] if tu.tokens is not None else []
    points = {}
    if dry or cfg.launcher.executor != "local":  # the initial grid in one batch: on a cluster, one array
        grid = initial_grid(tu.centre, min(tu.points, tu.max_points))
        arm_losses(cfg, root, [(name, lr, tune_group(name, lr), f"tune {name}: lr {lr_key(lr)} ") for lr in grid],
                   {name: list(tu.seeds)}, params, base, tu.runs_dir, extra, stage=f"tune {name}", dry=dry)
        if dry:
            print(f"tune {name}: then up to {tu.max_points - len(grid)} more lr point(s) of {len(tu.seeds)} run(s) "
                  f"each, one batch per extension, until the optimum is bracketed (tune.max_points={tu.max_points})")
            return {}

    def evaluate(lr: float) -> float:
        losses = seed_losses(cfg, root, name, lr, tu.seeds, tune_group(name, lr), params, base, tu.runs_dir, extra,
                             label=f"tune {name}: lr {lr_key(lr)} ")
        s = score(list(losses.values()))
        points[lr] = {"lr": lr, "losses": {str(k): v for k, v in losses.items()}, "mean": finite_or_none(s),
                      "status": "ok" if math.isfinite(s) else "lost"}
        return s

    lrs, scores, status = tune_arm(evaluate, tu.centre, tu.points, tu.max_points)
    res = choose(lrs, scores, tu.max_points, tu.rule)
    tokens = tu.tokens or cfg.train.tokens
    if tu.tokens is None and cfg.train.tokens_per_param is not None:  # the ladder's budget, as the runs resolve it
        from study.runner.spec import run_spec
        tokens = run_spec(cfg, root).tokens
    out = {"arm": name, "variant": arm.variant, "overrides": [str(o) for o in arm.overrides],
           "model": cfg.model.name, "seeds": [int(s) for s in tu.seeds], "tokens": int(tokens), "rule": tu.rule,
           "recipe": recipe(cfg, tokens),
           "centre": tu.centre, "max_points": tu.max_points, "points": [points[x] for x in lrs],
           **{k: res[k] for k in ("status", "best_lr", "lr_star", "source", "why")},
           "best_loss": finite_or_none(res["best_loss"]), "fit": res["fit"]}
    folder = root / tu.runs_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RESULT).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    star = "none (every point lost)" if out["lr_star"] is None else f"{out['lr_star']:.4g} ({out['source']})"
    print(f"tune {name}: {out['status']}; lr* = {star}")
    return out
