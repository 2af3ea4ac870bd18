"""Arms: what the tuning and test stages train.  An arm is a variant plus training overrides (its recipe),
named in the ``arms`` section of conf/study.yaml::

    arms:
      baseline_today: {variant: baseline, lr: 3.0e-3}        # a fixed lr: never tuned
      baseline_d2z:   {variant: baseline, overrides: [train.schedule=d2z]}
      nonlinear_q:    {variant: nonlinear_q}                 # lr: null -> tuned.lr.nonlinear_q (make tune)

A run of an arm is ``study.train`` with ``variant=VARIANT seed=SEED arm.lr=LR`` and the arm's overrides, in
its own folder (``study.group``): tuning runs under ``tune.runs_dir/ARM/lrLR/VARIANT-sSEED``, test runs under
``runs/test/ARM/VARIANT-sSEED``.  :func:`ensure_run` reuses a finished run trained under the same resume key
(settings, code and data) and trains it otherwise, in this process (replacing a finished run of another key, as
DVC replaces a stage's outputs when its dependencies change).  study.orchestration.ensure.ensure_runs does the same for a
list of runs through the study's launcher (``study.jobs`` processes here, or SLURM job arrays).
"""
from __future__ import annotations

import json
from pathlib import Path

from study.config import ConfigError, StudyError, load_config, run_dir
from study.config.naming import RECIPE, TUNING_TABLE, lr_key
from study.config.task import retune_hint, tune_command, tuned_where
from study.config.transfer import recipe_difference, recipe_value
from study.runfolder import METRICS_FILE, RECORD_FILE


def arm_of(cfg, name: str):
    """The ``arms.NAME`` entry.  Raises ConfigError (one line) for an arm the section lacks."""
    if name not in cfg.arms:
        raise ConfigError(f"arm {name!r} is not defined: add it to the arms section of conf/study.yaml "
                          f"(variant, overrides, lr), or choose one of {sorted(cfg.arms)}")
    return cfg.arms[name]




def recipe(cfg, tokens: int | None = None) -> dict[str, dict]:
    """The model size and training budget and schedule an lr* is tuned at: ``{"model": {...}, "train": {...}}``
    with the keys of :data:`RECIPE` (``tokens``: the tuning's own budget, when it is not train.tokens)."""
    out = {sec: {k: cfg[sec][k] for k in keys} for sec, keys in RECIPE.items()}
    if tokens is not None:
        out["train"]["tokens"] = int(tokens)
    return json.loads(json.dumps(out))


def tuned_lr(cfg, name: str, root: Path | None = None) -> float:
    """The peak lr of an arm in the test stage: its fixed ``lr``, else ``tuned.lr[NAME]`` (conf/tuned.yaml), which
    must have been tuned at this study's model and training budget and schedule (``tuned.recipe[NAME]``).

    Raises:
        ConfigError: the arm has neither, or its lr* was tuned at another recipe; one line naming the task's tuning
            command (`make tune`; another task's: `make tasks TASKS=T`).
    """
    arm = arm_of(cfg, name)
    if arm.lr is not None:
        return float(arm.lr)
    if name not in cfg.tuned.lr and name in cfg.tune.arms:
        raise ConfigError(_why_untuned(cfg, name, root))
    if name not in cfg.tuned.lr:
        raise ConfigError(f"arm {name!r} has no tuned lr in conf/tuned.yaml ({tuned_where(cfg)}) and no fixed "
                          f"arms.{name}.lr: add it to tune.arms and tune it ({retune_hint(cfg, name)}; then commit "
                          f"conf/tuned.yaml and conf/tuning/)")
    at = cfg.tuned.recipe.get(name)
    if at is not None:
        at, now = json.loads(json.dumps(plain_container(at))), recipe(cfg)
        diff = recipe_difference(at, now)
        if diff:
            def show(r):
                return ", ".join(f"{k}={recipe_value(r, k)}" for k in diff)
            learned = (diff == ["model.position"] and recipe_value(now, "model.position") == "learned"
                       and cfg.task.name == "lm")  # the previous default: its lr* are kept, not lost
            kept = ("; the lr* tuned at learned positions are in conf/tuning/lm-learned/ (`make study-learned` "
                    "pins them)") if learned else ""
            raise ConfigError(f"arm {name!r}'s lr* (conf/tuned.yaml) was tuned at {show(at)}, but this study runs "
                              f"{show(now)}: re-tune it ({retune_hint(cfg, name)}) or set those back{kept}")
    return float(cfg.tuned.lr[name])


def _why_untuned(cfg, name: str, root: Path | None) -> str:
    """Why arm ``name`` of tune.arms has no lr* in conf/tuned.yaml: every point of its tuning grid diverged (its row
    in tune.table_dir/table.json, read when ``root`` is given), or it was not tuned yet."""
    row = None
    if root is not None:
        try:
            row = json.loads((root / cfg.tune.table_dir / TUNING_TABLE).read_text())["arms"].get(name)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            row = None
    points = (row or {}).get("points") or []
    if row is not None and row.get("lr_star") is None and points and all(p.get("mean") is None for p in points):
        low, grid = min(p["lr"] for p in points), ", ".join(format(p["lr"], "g") for p in points)
        return (f"arm {name!r} has no lr*: every lr of its tuning grid ({grid}) "
                f"diverged on a tuning seed ({cfg.tune.table_dir}/table.json): tune it lower (e.g. "
                f"tune.centre={low / 4:g} and {tune_command(cfg)}), or give it a fixed arms.{name}.lr")
    if cfg.task.name == "lm":
        return (f"arm {name!r} (in tune.arms) has no lr* in conf/tuned.yaml yet: run `make tune` (then commit "
                f"conf/tuned.yaml and conf/tuning/)")
    return (f"arm {name!r} (in tune.arms) has no lr* in conf/tuned.yaml ({tuned_where(cfg)}) yet: tune it "
            f"({retune_hint(cfg, name)}; then commit conf/tuned.yaml and conf/tuning/)")


def plain_container(x):
    """An OmegaConf node as plain dicts and lists (a plain value unchanged)."""
    from omegaconf import OmegaConf
    return OmegaConf.to_container(x) if OmegaConf.is_config(x) else x


def run_overrides(cfg, name: str, seed: int, lr: float, group: str, runs_dir: str | None = None) -> list[str]:
    """The ``study.train`` overrides of one run of arm ``name`` (Hydra syntax)."""
    arm = arm_of(cfg, name)
    out = [f"variant={arm.variant}", f"seed={seed}", f"arm.lr={float(lr)!r}",
           f"study.group={group}", *[str(o) for o in arm.overrides]]
    if runs_dir is not None:
        out.append(f"study.runs_dir={runs_dir}")
    return out


def tune_group(name: str, lr: float) -> str:
    return f"{name}/lr{lr_key(lr)}"


def _train(cfg, root: Path) -> dict:
    from study.runner.run import train

    return train(cfg, root)


#: the function that trains one run (``study.runner.run.train``); tests put a synthetic trainer here
TRAIN = _train


def reusable(cfg, root: Path, d: Path) -> bool:
    """Whether ``d`` holds a finished run trained under this config's resume key (settings, code, data): record.json's
    ``config_hash`` is the key (or checkpoints/run.json's stored record is, under today's rule of what the key holds:
    :func:`study.runner.resume_key.same_key`), and the settings config.json records (what compare pairs the run on)
    are the key's settings, so a run whose config.json was edited is trained again, never reused for compare to
    refuse."""
    from study.config import diff_keys
    from study.runfolder import recorded_settings
    from study.runner.resume_key import config_part, resume_record, run_digest, same_key, stored_key

    try:
        record = json.loads((d / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not (d / METRICS_FILE).is_file() or not isinstance(record, dict):
        return False
    from study.runner.spec import run_spec

    try:  # hashed as study.runner.run hashes it (open_run_folder): its frozen specification (derived tokens, lr ...)
        spec = run_spec(cfg, root)
        key = resume_record(spec.cfg, spec.data_dir)  # the task's data (mqar: its kept test set)
        if record.get("config_hash") != run_digest(spec.cfg, spec.data_dir, key) and not same_key(stored_key(d), key):
            return False
    except StudyError:
        return False
    recorded = recorded_settings(d)
    return recorded is not None and not diff_keys(recorded, config_part(key))


def wait_while_trained(d: Path, poll_s: float = 1.0) -> None:
    """Wait while another process trains the run in ``d`` (it holds ``d/.lock``: a stage's training left running, a
    hand-started run), saying so in one line, so that a restart reuses that run when it finishes instead of training
    it again beside it."""
    from filelock import Timeout

    from study.runfolder.lock import run_lock

    if not (d / ".lock").exists():
        return
    lock = run_lock(d)
    try:
        lock.acquire()
    except Timeout:
        print(f"{d}: another process is still training this run (it holds {d / '.lock'}): waiting for it to end "
              f"(stop it to train the run here instead)", flush=True)
        lock.acquire(timeout=-1, poll_interval=poll_s)
    lock.release()


def pending(overrides: list[str], root: Path, params: str | None, wait: bool = True):
    """(the run folder, the overrides to train it with (None when a finished run there is reusable), its config,
    with ``train.overwrite`` set when it replaces a finished run of other settings).  ``wait``: first wait while
    another process trains that run (:func:`wait_while_trained`)."""
    cfg = load_config(overrides, root, params=params)
    d = run_dir(root, cfg, cfg.variant.name, cfg.seed)
    if wait:
        wait_while_trained(d)
    if reusable(cfg, root, d):
        return d, None, cfg
    if (d / METRICS_FILE).is_file() and wait:
        print(f"{d}: the finished run there was trained under other settings, code or data: replacing it", flush=True)
        todo = [*overrides, "train.overwrite=true"]
        return d, todo, load_config(todo, root, params=params)
    return d, list(overrides), cfg


def ensure_run(overrides: list[str], root: Path, params: str | None) -> tuple[Path, bool]:
    """Train one run unless its folder already holds it finished under the same resume key.

    A finished run under another key (the arm's settings, the training code or the data changed since) is
    replaced, as DVC replaces a stage's outputs when its dependencies change (``train.overwrite``: study.train
    prints the keys that differ and starts afresh).

    Returns: (the run folder, whether it was reused).
    """
    d, todo, cfg = pending(overrides, root, params)
    if todo is None:
        return d, True
    TRAIN(cfg, root)
    return d, False
