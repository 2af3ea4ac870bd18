"""conf/tuned.yaml as text: each arm's lr* with the recipe it was tuned at, and the scale ladder's per-size lr*
(written by ``make tune`` and ``make ladder-tune``, study/tune.py; read back here); and the check that the composed
``tuned`` section agrees with the tuning table it came from (the tuning and test stages run it first)."""
from __future__ import annotations

import json
from pathlib import Path

from study.config import ConfigError
from study.config.naming import TUNING_TABLE
from study.config.task import tune_command
from study.config.transfer import recipe_difference
from study.runner.arms import plain_container


def tuned_yaml(table: dict, size: dict | None = None, tasks: dict | None = None,
               size_recipe: dict | None = None) -> str:
    """conf/tuned.yaml's text: every arm's lr* (repr: the exact float of table.json) and the recipe it was tuned at,
    then ``size`` ({model: {variant: lr*}}, the scale ladder's sizes tuned by ``--ladder``) and ``size_recipe``
    ({model: {variant: the recipe it was tuned at, with train.tokens_per_param}}; a size's entries kept only where
    ``size`` holds that size), then ``tasks`` ({task: {"lr": {arm: lr*}, "recipe": {arm: ...}}}: each task but lm
    tuned apart, ``tuned.task``)."""
    lines = ["# Each arm's tuned peak lr (lr*), written by `make tune` from the tuning table beside it "
             "(conf/tuning/table.json,", "# table.md, tuning.png): tracked, so a fresh `make study` tests at these "
             "values without tuning again.", "# Edit only through `make tune`: tests/test_tuning.py fails when this "
             "file and the table disagree.", "tuned:"]
    lrs = {k: a["lr_star"] for k, a in table["arms"].items() if a["lr_star"] is not None}
    at = {k: table["arms"][k]["recipe"] for k in lrs if table["arms"][k].get("recipe")}
    lines += ["  lr:" + ("" if lrs else " {}")] + [f"    {k}: {float(v)!r}" for k, v in lrs.items()]
    if at:  # the model and budget each lr* was tuned at: the study refuses an lr* tuned at other settings
        lines += ["  recipe:"] + [f"    {k}: {json.dumps(v, sort_keys=True)}" for k, v in at.items()]
    if size:  # the ladder's sizes, each tuned by the same rule (scale_ladder.lr_per_size)
        lines += ["  size:"] + [f"    {m}: {json.dumps({v: float(x) for v, x in size[m].items()}, sort_keys=True)}"
                                for m in sorted(size)]
    at_size = {m: r for m, r in (size_recipe or {}).items() if r and m in (size or {})}
    if at_size:  # the settings each size's lr* was tuned at: a ladder run at other settings is refused
        lines += ["  size_recipe:"] + [f"    {m}: {json.dumps(at_size[m], sort_keys=True)}" for m in sorted(at_size)]
    if tasks:  # the other tasks' lr*, never lent across tasks (study.config.task.resolve_task reads them)
        lines += ["  task:"] + [f"    {t}: {json.dumps(tasks[t], sort_keys=True)}" for t in sorted(tasks)]
    return "\n".join(lines) + "\n"


def task_section(table: dict) -> dict:
    """A tuning table as one task's ``tuned.task`` entry: {"lr": {arm: lr*}, "recipe": {arm: recipe}}."""
    lrs = {k: float(a["lr_star"]) for k, a in table["arms"].items() if a["lr_star"] is not None}
    return {"lr": lrs, "recipe": {k: table["arms"][k]["recipe"] for k in lrs if table["arms"][k].get("recipe")}}


def tuned_section(path: Path) -> dict:
    """The ``tuned`` mapping of the tuned file at ``path`` ({} when the file is missing, unreadable or holds none)."""
    import yaml

    try:
        t = (yaml.safe_load(path.read_text()) or {}).get("tuned", {}) or {}
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return {}
    return t if isinstance(t, dict) else {}


def _entry(section: dict, key: str) -> dict:
    """``section[key]`` (a part of :func:`tuned_section`) as a dict ({} when missing or not a mapping)."""
    x = section.get(key)
    return dict(x) if isinstance(x, dict) else {}


def tuned_tasks(path: Path) -> dict:
    """``tuned.task`` of the tuned file at ``path`` ({} when the file or the section is missing)."""
    return _entry(tuned_section(path), "task")


def read_tuned(path: Path) -> dict:
    """The arms of the tuned file at ``path`` as tuned_yaml's table rows ({arm: {lr_star, recipe}})."""
    t = tuned_section(path)  # read once
    rec = _entry(t, "recipe")
    return {k: {"lr_star": float(v), "recipe": rec.get(k)} for k, v in _entry(t, "lr").items()}


def tuned_sizes(path: Path) -> dict:
    """``tuned.size`` of the tuned file at ``path`` ({} when the file or the section is missing)."""
    return _entry(tuned_section(path), "size")


def tuned_size_recipes(path: Path) -> dict:
    """``tuned.size_recipe`` of the tuned file at ``path`` ({} when the file or the section is missing)."""
    return _entry(tuned_section(path), "size_recipe")


def check_tuned(cfg, root: Path) -> None:
    """conf/tuned.yaml (``tuned.lr``) agrees with the tuning table it came from (tune.table_dir/table.json).

    Raises:
        ConfigError: an arm's lr differs, or is in one and not the other (one line: re-run the task's tuning,
            `make tune` or `make tasks TASKS=T`).
    """
    p = root / cfg.tune.table_dir / TUNING_TABLE
    table = json.loads(p.read_text()) if p.is_file() else {"arms": {}}
    want = {k: a["lr_star"] for k, a in table.get("arms", {}).items() if a.get("lr_star") is not None}
    have = {str(k): float(v) for k, v in cfg.tuned.lr.items()}
    have_at = dict(plain_container(cfg.tuned.recipe))
    want_at = {k: a["recipe"] for k, a in table.get("arms", {}).items() if k in want and a.get("recipe")}
    bad_at = sorted(k for k in set(want_at) | set(have_at) if recipe_difference(want_at.get(k, {}), have_at.get(k, {})))
    if bad_at and want == have:
        raise ConfigError(f"conf/tuned.yaml (tuned.recipe) disagrees with {p.name} on the settings {bad_at} were tuned at: "
                          f"re-run {tune_command(cfg)} (which writes both), or restore both from git")
    if want != have:
        bad = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        raise ConfigError(f"conf/tuned.yaml (tuned.lr) disagrees with {p.relative_to(root) if p.is_relative_to(root) else p} "
                          f"for {bad} ({ {k: have.get(k) for k in bad} } vs {{{', '.join(f'{k!r}: {want.get(k)}' for k in bad)}}}): "
                          f"re-run {tune_command(cfg)} (which writes both), or restore both from git")
