"""The scale ladder's lr transfer, checked (``python -m study.tune --ladder MODEL``): the ladder's variants tuned by the
same rule at size MODEL on the ladder's budget, their lr* there against the lr each transfers from the default size
(transfer.json, transfer.md), and each lr* at that size written to conf/tuned.yaml (``tuned.size.MODEL``)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from study.config import ConfigError, load_config
from study.config.transfer import check_transferable, transferred_lr
from study.orchestration.losses import finite_or_none
from study.tuning.search import tune_one
from study.tuning.table import TUNED_FILE, check_tuned_file, write_table
from study.tuning.tuned_file import read_tuned, tuned_size_recipes, tuned_sizes, tuned_tasks, tuned_yaml

TRANSFER_JSON, TRANSFER_MD = "transfer.json", "transfer.md"


def transfer_check(results: dict[str, dict], transferred: dict[str, float], model: str, rule: str) -> dict:
    """The scale ladder's lr transfer against the lr* tuned at ``model``.

    Args:
        results: {arm: tuning.json} at ``model``; transferred: {arm: the lr the ladder trains it at (nats-free)}.

    Returns: {"model", "rule", "arms": {arm: {"transferred", "lr_star", "ratio" (transferred / lr*), "log2_ratio",
    "predicted_cost" (A ln(ratio)^2, nats; None without a fit), "nearest_lr", "nearest_mean" (the measured mean loss at
    the grid point nearest the transferred lr, nats; None when that point is lost), "nearest_status" ("ok"/"lost"),
    "best_mean", "status"}}.
    """
    arms = {}
    for name, r in results.items():
        lr, star, fit = transferred[name], r.get("lr_star"), r.get("fit") or {}
        near = min(r["points"], key=lambda p: abs(math.log(p["lr"] / lr))) if r["points"] else None
        ratio = lr / star if star else None
        arms[name] = {"transferred": lr, "lr_star": star, "ratio": ratio,
                      "log2_ratio": math.log2(ratio) if ratio else None,
                      "predicted_cost": fit["A"] * math.log(ratio) ** 2 if ratio and fit.get("A") else None,
                      "nearest_lr": near["lr"] if near else None, "nearest_mean": near["mean"] if near else None,
                      "nearest_status": near["status"] if near else None,
                      "best_mean": finite_or_none(r.get("best_loss")), "status": r.get("status")}
    return {"model": model, "rule": rule, "arms": arms}


def transfer_markdown(t: dict) -> str:
    """transfer.md: one row per arm of :func:`transfer_check`."""
    fmt = (lambda x, s=".4g": "n/a" if x is None else format(x, s))  # noqa: E731
    lines = ["# The scale ladder's lr transfer, checked at " + t["model"], "",
             f"Rule: {t['rule']}.  lr* here is tuned by the same rule as the default size (table.md beside this file); "
             f"the predicted cost is the fitted quadratic's A ln(transferred / lr*)^2 (nats); the measured column is "
             f"the mean loss of the grid point nearest the transferred lr, beside the best point's.", "",
             "| arm | transferred lr | lr* here | ratio | log2 ratio | grid status | predicted cost (nats) | "
             "nearest grid lr | its mean loss | best mean loss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in t["arms"].items():
        lines.append(f"| {name} | {fmt(a['transferred'])} | {fmt(a['lr_star'])} | {fmt(a['ratio'], '.3f')} | "
                     f"{fmt(a['log2_ratio'], '+.2f')} | {a['status']} | {fmt(a['predicted_cost'], '.4f')} | "
                     f"{fmt(a['nearest_lr'])} | {fmt(a['nearest_mean'], '.4f').replace('n/a', 'lost (diverged)')} | "
                     f"{fmt(a['best_mean'], '.4f')} |")
    return "\n".join(lines) + "\n"


TRANSFER_RULE = "each variant trains at the lr* of its arm in conf/tuned.yaml (tuned at the default size), unchanged"


def ladder_overrides(cfg, model: str) -> list[str]:
    """The overrides that tune scale_ladder.variants at size ``model`` on the ladder's budget, apart from the
    default size's tuning (its own runs and table folders)."""
    la, tu = cfg.scale_ladder, cfg.tune
    return [f"model={model}", f"train.tokens_per_param={la.tokens_per_param}", f"train.warmup_tokens={la.warmup_tokens}",
            f"tune.arms=[{','.join(la.variants)}]", "tune.tokens=null", f"tune.runs_dir={tu.runs_dir}/ladder/{model}",
            f"tune.table_dir={tu.table_dir}/{model}"]


def tune_ladder(cfg, root: Path, model: str, params: str | None, base: list[str] = (),
                tuned_file: Path | None = None) -> dict:
    """``--ladder MODEL`` (module docstring): tune scale_ladder.variants at ``model``, write the table, the
    transfer check and each variant's lr* at that size to conf/tuned.yaml (``tuned.size.MODEL``, ``tuned_file``;
    its other entries kept) with the recipe it was tuned at and the ladder's ``train.tokens_per_param``
    (``tuned.size_recipe.MODEL``: a ladder run at another is refused); returns the check (:func:`transfer_check`).

    Raises:
        ConfigError: a variant has no arm of its name, or no lr* in conf/tuned.yaml to transfer.
    """
    if cfg.task.name != "lm":  # the ladder's lr* (tuned.size) are lm's: another task's lr* must not seed them
        raise ConfigError(f"--ladder tunes the scale ladder of the lm task, not task={cfg.task.name}: drop "
                          f"task={cfg.task.name} (each task's own lr* come from `study.tune --arm ARM task=TASK`)")
    if not cfg.scale_ladder.variants:
        raise ConfigError("scale_ladder.variants is empty: name the variants whose lr transfer to check, e.g. "
                          "'scale_ladder.variants=[baseline,nonlinear_q]' (the tables already written are kept)")
    over = [*base, *ladder_overrides(cfg, model)]
    sub = load_config(over, root, params=params)
    for v in cfg.scale_ladder.variants:  # the default size's lr*, at the positions this size trains at
        check_transferable(cfg, v, "scale_ladder.variants:", "leave it out of scale_ladder.variants",
                           position=sub.model.position)
    tuned_file = root / TUNED_FILE if tuned_file is None else tuned_file
    check_tuned_file(tuned_file)  # before any training
    transferred = {v: transferred_lr(cfg, v) for v in sub.tune.arms}
    results = {v: tune_one(sub, root, v, params, over) for v in sub.tune.arms}
    write_table(sub, root, tuned_file=False)
    t = transfer_check(results, transferred, model, TRANSFER_RULE)
    out = root / sub.tune.table_dir
    (out / TRANSFER_JSON).write_text(json.dumps(t, indent=1, sort_keys=True) + "\n")
    (out / TRANSFER_MD).write_text(transfer_markdown(t))
    here = {v: a["lr_star"] for v, a in results.items() if a["lr_star"] is not None}
    current = read_tuned(tuned_file)
    sizes = {**tuned_sizes(tuned_file), model: here}
    at = {v: {**results[v]["recipe"], "train": {**results[v]["recipe"]["train"],
                                                "tokens_per_param": sub.train.tokens_per_param}} for v in here}
    recipes = {**tuned_size_recipes(tuned_file), model: at}  # what a ladder run at this size must train at
    tuned_file.write_text(tuned_yaml({"arms": current}, {m: x for m, x in sizes.items() if x},
                                     tuned_tasks(tuned_file), recipes))  # the other tasks' lr* kept
    for name, a in t["arms"].items():
        print(f"ladder {model} {name}: transferred lr {a['transferred']:.4g}, lr* here "
              f"{'n/a' if a['lr_star'] is None else format(a['lr_star'], '.4g')} ({a['status']})")
    print(f"wrote {out / TRANSFER_MD} and {out / TRANSFER_JSON}")
    return t
