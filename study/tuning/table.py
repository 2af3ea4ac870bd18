"""The tuning table, ``python -m study.tune --write``: every arm's tuning.json read and checked, table.json, table.md
and the figure tuning.png under tune.table_dir, and each arm's lr* into conf/tuned.yaml (its text:
study/tuning/tuned_file.py), all replaced together."""
from __future__ import annotations

import json
import math
from pathlib import Path

from study.config import StudyError
from study.config.naming import TUNING_TABLE, lr_key
from study.config.task import tune_command
from study.tuning.tuned_file import (read_tuned, task_section, tuned_size_recipes, tuned_sizes, tuned_tasks,
                                     tuned_yaml)

#: the files of a tuning: one arm's result (in tune.runs_dir/ARM) and the table's (in tune.table_dir)
RESULT, TABLE_MD, FIGURE = "tuning.json", "table.md", "tuning.png"
#: the tracked lr* the study's composition reads (``tuned.lr``)
TUNED_FILE = Path("conf") / "tuned.yaml"


def table_markdown(table: dict) -> str:
    """table.md: one section per arm, every grid point's per-seed losses and mean, then lr* and the fit."""
    seeds = table["seeds"]
    lines = ["# Tuning table", "",
             f"Every arm on the same x2 lr grid, each point trained on tuning seeds {seeds} (never test seeds); a "
             f"point's score is the mean final validation loss (nats), and a point with a diverged seed is lost. "
             f"The grid grows by x2 at the edge holding the best mean until the best point has a worse neighbour "
             f"on each side, or it holds {table['max_points']} points (optimum not bracketed). lr* rule: "
             f"{table['rule']} (the vertex exp(-B/2A) of the quadratic in ln lr through the best point and its "
             f"neighbours, when A > 0 and it lies between them; else the best point). A: curvature, nats per "
             f"(ln lr)^2; A (ln 2)^2: the predicted cost of a x2 miss.", "",
             "| arm | variant | overrides | status | best lr | best mean | A | x2 miss (nats) | vertex | lr* | from |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = (lambda x, s=".4g": "n/a" if x is None else format(x, s))  # noqa: E731
    for name, a in table["arms"].items():
        f = a.get("fit") or {}
        lines.append(f"| {name} | {a['variant']} | {' '.join(a['overrides']) or '-'} | {a['status']} | "
                     f"{fmt(a['best_lr'])} | {fmt(a['best_loss'], '.4f')} | {fmt(f.get('A'), '.4f')} | "
                     f"{fmt(f.get('miss_cost_x2'), '.4f')} | {fmt(f.get('vertex'))} | {fmt(a['lr_star'])} | "
                     f"{a['source'] or 'n/a'}{' (' + a['why'] + ')' if a.get('why') else ''} |")
    for name, a in table["arms"].items():
        lines += ["", f"## {name}", ""]
        if a.get("recipe"):
            lines += ["Tuned at (before the arm's overrides) " + ", ".join(f"{sec}.{k}={v}" for sec, kv in a["recipe"].items() for k, v in kv.items())
                      + ".", ""]
        lines += ["| lr | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |", "|---|" + "---|" * (len(seeds) + 1)]
        for p in a["points"]:
            cells = [fmt(p["losses"].get(str(s)), ".4f").replace("n/a", "diverged") for s in seeds]
            lines.append(f"| {lr_key(p['lr'])} | " + " | ".join(cells) + f" | {fmt(p['mean'], '.4f').replace('n/a', 'lost')} |")
    return "\n".join(lines) + "\n"


def figure(table: dict, path: Path) -> Path:
    """tuning.png: mean loss against lr (log) per arm, each seed's loss as a dot, lost points as x at the top,
    the parabola through the best point and its neighbours, lr* as a star."""
    import numpy as np

    from study.analysis.figures import finish, panel, save

    import matplotlib

    fig, ax = panel(8.0)
    tops = []
    colours = {name: matplotlib.colors.to_hex(matplotlib.colormaps["tab10"](i % 10))
               for i, name in enumerate(table["arms"])}  # one colour per arm, distinct
    for name, a in table["arms"].items():
        c = colours[name]
        pts = [p for p in a["points"] if p["mean"] is not None]
        ax.plot([p["lr"] for p in pts], [p["mean"] for p in pts], "o-", color=c, label=name, ms=4)
        for p in a["points"]:
            xs = [v for v in p["losses"].values() if v is not None]
            ax.plot([p["lr"]] * len(xs), xs, ".", color=c, alpha=0.4, ms=3)
            tops += xs
        f = a.get("fit")
        if f:
            i = [p["lr"] for p in a["points"]].index(a["best_lr"])
            x = np.linspace(math.log(a["points"][i - 1]["lr"]), math.log(a["points"][i + 1]["lr"]), 50)
            ax.plot(np.exp(x), f["A"] * x * x + f["B"] * x + f["C"], "--", color=c, lw=1)
        if a["lr_star"] is not None:
            y = (f or {}).get("vertex_loss") if a["source"] == "vertex" else a["best_loss"]
            ax.plot([a["lr_star"]], [y], "*", color=c, ms=12, mec="k")
    top = max(tops) if tops else 1.0
    for name, a in table["arms"].items():
        lost = [p["lr"] for p in a["points"] if p["mean"] is None]
        if lost:
            ax.plot(lost, [top] * len(lost), "x", color=colours[name], ms=8)
    finish(ax, "Tuning: mean final validation loss against peak lr (x: lost, *: lr*)", "validation loss (nats)",
           "peak learning rate", xlog=True)
    return save(fig, path)


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_result(name: str, r, path: Path) -> None:
    """Check one arm's tuning.json (``r``, read from ``path``) holds every key the table, the figure and conf/tuned.yaml
    read, of the right kind: ``variant`` (str), ``overrides`` (list), ``status`` (str), ``best_lr``/``lr_star``/
    ``best_loss`` (number or null), ``source`` (str or null), ``points`` (a list of {lr > 0, losses: object, mean:
    number or null, status}), ``fit`` (null or {A, B, C}), ``recipe`` (null or an object).

    Raises:
        StudyError: in one line naming the file and the key, and how to make the file again.
    """
    fix = f"re-tune the arm (`python -m study.tune --arm {name} --params params.yaml`, or `make tune`), or restore the file"

    def bad(key: str, want: str) -> StudyError:
        return StudyError(f"{path}: {key} is missing or not {want}: {fix}")

    if not isinstance(r, dict):
        raise StudyError(f"{path} holds {type(r).__name__}, not a JSON object: {fix}")
    kinds = {"variant": (str,), "overrides": (list,), "status": (str,)}
    for key, kind in kinds.items():
        if not isinstance(r.get(key), kind):
            raise bad(repr(key), "a " + kind[0].__name__)
    for key in ("best_lr", "lr_star", "best_loss"):
        if key not in r or not (r[key] is None or _num(r[key])):
            raise bad(repr(key), "a number (or null)")
    if r.get("lr_star") is not None and not r["lr_star"] > 0:
        raise bad("'lr_star'", "a positive number")
    if "source" not in r or not (r["source"] is None or isinstance(r["source"], str)):
        raise bad("'source'", "a string (or null)")
    if not isinstance(r.get("points"), list):
        raise bad("'points'", "a list")
    for i, p in enumerate(r["points"]):
        if not (isinstance(p, dict) and _num(p.get("lr")) and p["lr"] > 0 and isinstance(p.get("losses"), dict)
                and "mean" in p and (p["mean"] is None or _num(p["mean"])) and isinstance(p.get("status"), str)
                and all(v is None or _num(v) for v in p["losses"].values())):
            raise bad(f"'points'[{i}]", "an object {lr > 0, losses: {seed: number or null}, mean, status}")
    fit = r.get("fit")
    if fit is not None and not (isinstance(fit, dict) and all(_num(fit.get(k)) for k in ("A", "B", "C"))):
        raise bad("'fit'", "null or an object with numbers A, B, C")
    if fit is not None and r["best_lr"] not in [p["lr"] for p in r["points"][1:-1]]:
        raise bad("'best_lr'", "an inner grid point (a fit needs the best point's two neighbours)")
    if r.get("recipe") is not None and not isinstance(r["recipe"], dict):
        raise bad("'recipe'", "null or an object")


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
        before = json.loads((out / TUNING_TABLE).read_text())["arms"]
        kept = {k: a for k, a in before.items() if k not in results and a.get("recipe")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        before, kept = {}, {}
    for k, a in kept.items():
        check_result(k, a, out / TUNING_TABLE)
    table = {"rule": cfg.tune.rule, "seeds": [int(s) for s in cfg.tune.seeds], "max_points": cfg.tune.max_points,
             "arms": {**results, **dict(sorted(kept.items()))}}
    files = {out / TUNING_TABLE: json.dumps(table, indent=1, sort_keys=True) + "\n", out / TABLE_MD: table_markdown(table)}
    if tuned_file is not False:
        tuned_file = root / TUNED_FILE if tuned_file is None else tuned_file
        check_tuned_file(tuned_file)
        task = cfg.task.name  # lm: tuned.lr; another task: its own tuned.task.TASK (never pooled)
        mine = read_tuned(tuned_file) if task == "lm" else (tuned_tasks(tuned_file).get(task) or {}).get("lr") or {}
        others = sorted(k for k in mine if k not in table["arms"] and k not in before)
        if others:  # tuned into another table (another tune.table_dir): this table cannot carry them
            raise StudyError(f"{tuned_file} holds the lr* of {others}, which {out / TUNING_TABLE} does not (they were "
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
    shown = f"{out / TABLE_MD}, {out / TUNING_TABLE}{', ' + str(out / FIGURE) if results else ''}"
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
