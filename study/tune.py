"""Tuning by one rule, ``make tune``: every arm of ``tune.arms`` on the same x2 lr grid, on the tuning seeds.

    python -m study.tune --arm NAME [--params params.yaml] [overrides]   tune one arm (DVC stage tune@NAME)
    python -m study.tune --arm NAME --dry-run [...]                      print its first array (runs, GPU-hours); train nothing
    python -m study.tune --write [--params params.yaml] [overrides]      the table, figure and conf/tuned.yaml
    python -m study.tune --targets [--params params.yaml]                the DVC stages of tune.arms, one a line
    python -m study.tune --ladder MODEL [--params params.yaml]            the scale ladder's lr transfer, checked

``--arm NAME`` trains (or reuses: a finished run of the same settings, code and data is never retrained)
each (lr, tuning seed) of the arm's grid in ``tune.runs_dir/NAME/lrLR/VARIANT-sSEED`` (study.train: in this
process, or ``study.jobs`` processes at once), extends the grid by x2 at the edge holding the best mean until
the optimum is bracketed or
``tune.max_points`` is reached (study/analysis/tuning.py has the rule), and writes
``tune.runs_dir/NAME/tuning.json``: every point's per-seed losses (nats; null = diverged), its mean (null =
lost), the grid's status, the quadratic (A, B, C, vertex, cost of a x2 miss) and lr* with its source.

``--write`` gathers the arms' tuning.json into ``tune.table_dir`` (table.json, table.md, tuning.png: loss
against lr per arm, the fitted parabola, lr* marked) and writes each arm's lr* to conf/tuned.yaml, which the
study's composition reads (``tuned.lr``); both are tracked, so a fresh ``make study`` does not tune again.
``--ladder MODEL`` checks the scale ladder's transfer rule (each variant at the lr* of its arm in conf/tuned.yaml,
tuned at the default size, unchanged at every size): it tunes every arm of ``scale_ladder.variants`` by the same
rule at size MODEL on the ladder's budget (tokens_per_param, warmup_tokens), runs in
``tune.runs_dir/ladder/MODEL``, and writes the table, figure and ``transfer.md``/``transfer.json`` (the transferred
lr against that size's lr*, their ratio, the quadratic's predicted cost of the miss in nats and the measured loss at
the grid point nearest the transferred lr) under ``tune.table_dir/MODEL``, and each variant's lr* at that size to
conf/tuned.yaml (``tuned.size.MODEL``: what the ladder trains at with ``scale_ladder.lr_per_size``; the default
size's ``tuned.lr`` and ``tuned.recipe`` are left as they are).
Every output is byte-stable (no times, no ids).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from study.analysis.tuned_file import (read_tuned, task_section, tuned_size_recipes, tuned_sizes, tuned_tasks,  # noqa: F401
                                      tuned_yaml)  # (tuned_yaml: public here too)
from study.analysis.tuning import choose, initial_grid, score, tune_arm
from study.analysis.tuning_table import check_result, figure, table_markdown  # noqa: F401 (public here too)
from study.orchestration.losses import TABLE_JSON, finite_or_none, arm_losses, check_tuned, seed_losses  # noqa: F401 (public here too)
from study.runner.arms import arm_of, recipe, tune_group
from study.config import ConfigError, StudyError, run_stage
from study.config.naming import lr_key
from study.config.task import tune_command
from study.runner.run_state import INTERRUPTED  # noqa: F401 (public here too)

TABLE_MD, FIGURE, RESULT = "table.md", "tuning.png", "tuning.json"
TUNED_FILE = Path("conf") / "tuned.yaml"


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


def read_results(cfg, root: Path) -> dict[str, dict]:
    """{arm: tuning.json} of every arm of tune.arms, each checked (:func:`check_result`).

    Raises:
        StudyError: an arm has no tuning.json (run the task's tuning command), or one lacks a key or holds a bad
            value.
    """
    out = {}
    for name in cfg.tune.arms:
        p = root / cfg.tune.runs_dir / name / RESULT
        try:
            out[name] = json.loads(p.read_text())
        except (OSError, ValueError):
            task = "" if cfg.task.name == "lm" else f" task={cfg.task.name}"
            raise StudyError(f"{p} is missing or unreadable: tune the arm first ({tune_command(cfg)}, or "
                             f"`python -m study.tune --arm {name} --params params.yaml{task}`)") from None
        check_result(name, out[name], p)
    return out


def write_table(cfg, root: Path, tuned_file: Path | None | bool = None) -> dict:
    """table.json, table.md, tuning.png under tune.table_dir and conf/tuned.yaml (``tuned_file``; False: not
    written), from the tuning.json of the arms of tune.arms; an arm already in table.json and not in tune.arms
    keeps its row and its lr* when the row records its recipe (the study refuses the lr* when that recipe is not
    the study's); a row without one is dropped.

    Every input is read and checked, and every output made, before any file is replaced; then all are replaced
    together (each by a rename), so a refusal leaves the table and conf/tuned.yaml as they were, and agreeing.

    Raises:
        StudyError: a tuning.json is missing or bad (:func:`read_results`); or conf/tuned.yaml holds the lr* of an
            arm that neither tune.arms nor the table being rewritten holds (another tune.table_dir's): writing would
            drop it.
    """
    results = read_results(cfg, root)
    out = root / cfg.tune.table_dir
    try:  # arms tuned before and not in tune.arms now keep their row, when it records the recipe it was tuned at
        before = json.loads((out / TABLE_JSON).read_text())["arms"]
        kept = {k: a for k, a in before.items() if k not in results and a.get("recipe")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        before, kept = {}, {}
    for k, a in kept.items():
        check_result(k, a, out / TABLE_JSON)
    table = {"rule": cfg.tune.rule, "seeds": [int(s) for s in cfg.tune.seeds], "max_points": cfg.tune.max_points,
             "arms": {**results, **dict(sorted(kept.items()))}}
    files = {out / TABLE_JSON: json.dumps(table, indent=1, sort_keys=True) + "\n", out / TABLE_MD: table_markdown(table)}
    if tuned_file is not False:
        tuned_file = root / TUNED_FILE if tuned_file is None else tuned_file
        check_tuned_file(tuned_file)
        task = cfg.task.name  # lm: tuned.lr; another task: its own tuned.task.TASK (never pooled)
        mine = read_tuned(tuned_file) if task == "lm" else (tuned_tasks(tuned_file).get(task) or {}).get("lr") or {}
        others = sorted(k for k in mine if k not in table["arms"] and k not in before)
        if others:  # tuned into another table (another tune.table_dir): this table cannot carry them
            raise StudyError(f"{tuned_file} holds the lr* of {others}, which {out / TABLE_JSON} does not (they were "
                             f"tuned into another tune.table_dir): writing this table would drop them from "
                             f"{tuned_file.name}; write into the tune.table_dir they came from (default conf/tuning), "
                             f"or add them to tune.arms")
        tasks = tuned_tasks(tuned_file)
        if task != "lm":
            tasks[task] = task_section(table)
            table_lm = {"arms": read_tuned(tuned_file)}  # lm's lr* as they are
        files[tuned_file] = tuned_yaml(table if task == "lm" else table_lm, tuned_sizes(tuned_file), tasks,
                                       tuned_size_recipes(tuned_file))
    out.mkdir(parents=True, exist_ok=True)
    replace_together(files, (table, out) if results else None)
    shown = f"{out / TABLE_MD}, {out / TABLE_JSON}{', ' + str(out / FIGURE) if results else ''}"
    if tuned_file is False:
        print(f"wrote {shown}")
    else:
        print(f"wrote {shown} and {tuned_file} (run `make params`, then commit them)")
    return table


def replace_together(files: dict[Path, str], figure_of: tuple[dict, Path] | None) -> None:
    """Write each of ``files`` ({path: text}) and, given ``(table, folder)``, the tuning figure into the folder: every
    output made first beside its target, then all renamed into place, so that a failure replaces none of them."""
    made = []
    try:
        if figure_of is not None:
            table, out = figure_of
            made.append((figure(table, out / ("tmp." + FIGURE)), out / FIGURE))
        for path, text in files.items():
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            made.append((tmp, path))
        for tmp, path in made:  # every output made: replace them together
            tmp.replace(path)
    finally:
        for tmp, _ in made:
            tmp.unlink(missing_ok=True)


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


def check_tuned_file(path: Path) -> None:
    """Refuse to rewrite a tuned file that exists but is not a YAML mapping: its readers would see nothing in it,
    and the rewrite would drop every lr* it holds.

    Raises:
        StudyError: ``path`` exists and is not a YAML mapping; the message says how to restore it.
    """
    import yaml

    if not path.exists():
        return
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise StudyError(f"{path} is not readable YAML ({type(e).__name__}): nothing written; restore it "
                         f"(`git checkout {TUNED_FILE}`) and run again") from None
    if data is not None and not isinstance(data, dict):
        raise StudyError(f"{path} is not a YAML mapping: nothing written; restore it (`git checkout {TUNED_FILE}`) "
                         f"and run again")


def tune_ladder(cfg, root: Path, model: str, params: str | None, base: list[str] = (),
                tuned_file: Path | None = None) -> dict:
    """``--ladder MODEL`` (module docstring): tune scale_ladder.variants at ``model``, write the table, the
    transfer check and each variant's lr* at that size to conf/tuned.yaml (``tuned.size.MODEL``, ``tuned_file``;
    its other entries kept) with the recipe it was tuned at and the ladder's ``train.tokens_per_param``
    (``tuned.size_recipe.MODEL``: a ladder run at another is refused); returns the check (:func:`transfer_check`).

    Raises:
        ConfigError: a variant has no arm of its name, or no lr* in conf/tuned.yaml to transfer.
    """
    from study.config import load_config
    from study.config.validation import check_transferable, transferred_lr

    if cfg.task.name != "lm":  # the ladder's lr* (tuned.size) are lm's: another task's lr* must not seed them
        raise ConfigError(f"--ladder tunes the scale ladder of the lm task, not task={cfg.task.name}: drop "
                          f"task={cfg.task.name} (each task's own lr* come from `study.tune --arm ARM task=TASK`)")
    if not cfg.scale_ladder.variants:
        raise ConfigError("scale_ladder.variants is empty: name the variants whose lr transfer to check, e.g. "
                          "'scale_ladder.variants=[baseline,nonlinear_q]' (the tables already written are kept)")
    for v in cfg.scale_ladder.variants:
        check_transferable(cfg, v, "scale_ladder.variants:", "leave it out of scale_ladder.variants")
    tuned_file = root / TUNED_FILE if tuned_file is None else tuned_file
    check_tuned_file(tuned_file)  # before any training
    over = [*base, *ladder_overrides(cfg, model)]
    sub = load_config(over, root, params=params)
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


def targets(cfg) -> list[str]:
    """The DVC stages of tune.arms: ``tune@ARM``."""
    return [f"tune@{a}" for a in cfg.tune.arms]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mode, arm, rest, dry = None, None, [], False
    it = iter(argv)
    for a in it:
        if a == "--arm" or a.startswith("--arm="):
            arm = a.split("=", 1)[1] if "=" in a else next(it, None)
            mode = "arm"
        elif a == "--ladder" or a.startswith("--ladder="):
            arm = a.split("=", 1)[1] if "=" in a else next(it, None)
            if arm is not None and arm.startswith("-"):  # `--ladder --params ...`: the model is missing
                rest.append(arm)
                arm = None
            mode = "ladder"
        elif a in ("--write", "--targets"):
            mode = a[2:]
        elif a == "--dry-run":
            dry = True
        else:
            rest.append(a)
    if any(a in ("-h", "--help") for a in rest) or mode is None:
        print(__doc__.strip())
        return 0 if mode is not None or any(a in ("-h", "--help") for a in rest) else 2
    params = next((r.split("=", 1)[1] for r in rest if r.startswith("--params=")), None)
    if "--params" in rest:
        i = rest.index("--params")
        params = rest[i + 1] if i + 1 < len(rest) else None
    if mode == "arm" and not arm:
        print("error: --arm needs an arm name, e.g. --arm baseline", file=sys.stderr)
        return 2
    if mode == "ladder" and not arm:
        print("error: --ladder needs a model size of conf/model, e.g. --ladder ladder-128", file=sys.stderr)
        return 2

    base = [r for i, r in enumerate(rest) if not r.startswith("-") and not (i and rest[i - 1] == "--params")]

    def body(cfg, root: Path) -> int:
        if mode == "arm":
            tune_one(cfg, root, arm, params, base, dry=dry)
        elif dry:
            print("error: --dry-run goes with --arm NAME (the arrays that arm's tuning would submit)", file=sys.stderr)
            return 2
        elif mode == "ladder":
            tune_ladder(cfg, root, arm, params, base)
        elif mode == "write":
            if not cfg.tune.arms:  # an empty table would erase the tracked lr* of every arm tuned before
                print(f"tune.arms is empty: {TUNED_FILE} and {cfg.tune.table_dir} left as they are")
                return 0
            write_table(cfg, root)
        else:
            print("\n".join(targets(cfg)))
        return 0
    return run_stage(body, rest, interruptible="study.tune")  # Ctrl-C: each training stopped, marked KILLED


if __name__ == "__main__":
    sys.exit(main())
