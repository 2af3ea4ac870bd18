"""Run naming and identity: the run's name and folder (``[group/]VARIANT-sSEED``), the flattened
config, and the resume key (:func:`resume_config`, :func:`config_hash`) that decides whether a
checkpoint may resume under the current settings."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .schema import LAUNCH_SECTIONS, VERDICT_SECTIONS, RunConfig


def run_name(variant: str, seed: int) -> str:
    """The canonical run name ``VARIANT-sSEED`` (MLflow run name and runs/ folder)."""
    return f"{variant}-s{seed}"


def run_dir(root: Path, cfg: RunConfig, variant: str, seed: int, group: str | None = None) -> Path:
    """``root/runs_dir[/group]/VARIANT-sSEED``: where one run's files live."""
    group = cfg.study.group if group is None else group
    base = root / cfg.study.runs_dir
    return (base / group if group else base) / run_name(variant, seed)


#: where the test runs go, under study.runs_dir (study.group=test/ARM: ``runs/test/ARM/VARIANT-sSEED``)
TEST_GROUP = "test"

#: the tuning table's JSON, in tune.table_dir (``python -m study.tune --write`` writes it; study/tuning/table.py)
TUNING_TABLE = "table.json"


def testing_group(arm: str) -> str:
    """``test/ARM``: the study.group of arm ``arm``'s test runs."""
    return f"{TEST_GROUP}/{arm}"


#: where the scale ladder's runs go, under study.runs_dir (``runs/scale_ladder/MODEL/VARIANT-sSEED``)
LADDER_GROUP = "scale_ladder"


def ladder_overrides(cfg: RunConfig, model: str) -> list[str]:
    """The ``study.train`` overrides that make a run a run of the scale ladder at size ``model`` (a file of
    conf/model/): the size, its compute-matched budget (``scale_ladder.tokens_per_param`` x the baseline's
    non-embedding parameters, derived by study.runner.spec) and warmup, where its peak lr comes from, and its
    group (``scale_ladder/MODEL``).  The ladder's stage (study.ladder_runs) adds ``variant=`` and ``seed=``."""
    lad = cfg.scale_ladder
    return [f"model={model}", f"train.tokens_per_param={lad.tokens_per_param}",
            f"train.warmup_tokens={lad.warmup_tokens}", f"train.lr_from_tuned={str(lad.lr_from_tuned).lower()}",
            f"train.lr_per_size={str(lad.lr_per_size).lower()}", f"study.group={LADDER_GROUP}/{model}"]


def run_role(group: str) -> str:
    """The part a run plays, read from its ``study.group``: ``"test"`` (``test/ARM``, a test run of the verdict),
    ``"tune"`` (``ARM/lrLR``, a tuning run), ``"main"`` (no group) or the group's first folder (``scale_ladder``,
    ``levers``, ...).  MLflow tag ``role``: the runs view filters on it (``tags.role = 'test'``)."""
    if not group:
        return "main"
    head, _, rest = group.partition("/")
    if head == TEST_GROUP and rest:
        return "test"
    if rest.startswith("lr") and "/" not in rest:
        try:
            float(rest[2:])
            return "tune"
        except ValueError:
            pass
    return head


def run_arm(group: str, variant: str) -> str:
    """The arm a run belongs to (MLflow tag ``arm``): ``ARM`` of a test run (``test/ARM``) or a tuning run
    (``ARM/lrLR``), else its variant (the variant is the arm of the study's other runs)."""
    role = run_role(group)
    if role == "test":
        return group.split("/", 1)[1]
    return group.split("/", 1)[0] if role == "tune" else variant


def run_label(cfg: RunConfig) -> str:
    """The MLflow run name: ``[group/]VARIANT-sSEED``."""
    name = run_name(cfg.variant.name, cfg.seed)
    return f"{cfg.study.group}/{name}" if cfg.study.group else name



def lr_key(lr: float) -> str:
    """The canonical text of a learning rate (folder names, table keys): 6 significant digits, ``%g``."""
    return f"{float(lr):.6g}"


#: the settings an lr* depends on beyond the arm itself, recorded beside it (tuned.recipe) by `make tune`
RECIPE = {"model": ("name", "n_layer", "n_head", "n_embd", "block_size", "vocab_multiple", "position"),
          "data": ("tokenizer", "vocab_size"),
          "train": ("tokens", "batch_tokens", "warmup_tokens", "min_lr", "weight_decay", "schedule")}
#: the same, flat ("model.name", ..., "train.schedule"): a test run must have recorded the study's values of these
RECIPE_KEYS = tuple(f"{sec}.{k}" for sec, keys in RECIPE.items() for k in keys)
def to_dict(cfg: RunConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


# Keys that do not change a run's numbers (where and how fast it runs, what it logs, which runs exist):
# left out of the resume key, so a checkpoint resumes on another world size, thread count or compile mode.
# The micro-batch splits the same global batch of windows differently (like the world size does): it
# changes the order of float sums only, as devices, threads and compile do.
NOT_IN_RESUME_KEY = (
    "study", "scale_ladder",
    "trainer.name", "trainer.devices", "trainer.num_nodes", "trainer.strategy", "trainer.threads",
    "trainer.compile", "trainer.progress_bar",
    "train.micro_batch_size", "train.log_every", "train.val_micro_batch_size", "train.overwrite",
    "train.lr_from_tuned", "train.lr_per_size",  # where the peak lr came from: the lr itself (arm.lr, derived before hashing) is in the key
    "data.num_proc", "data.hf_cache_dir", "data.dir",  # how/where prepare runs; the data's own digest is checked
    "variant.description",
    "numerics",  # config.json's record of the kernels: in the resume key as its numerics:* entries (runner/resume_key.py)
    *VERDICT_SECTIONS, *LAUNCH_SECTIONS,
)


def resume_config(cfg: RunConfig) -> dict[str, Any]:
    """The flattened settings that change a run's numbers (``{"train.lr": 0.003, ...}``): the resume key.

    Everything in the config except :data:`NOT_IN_RESUME_KEY` (devices, nodes, strategy, threads,
    compile, logging cadence, validation micro-batch, the study's run list and folders).  A checkpoint
    resumes only under the same resume config (see :func:`study.runner.resume_key.run_digest`)."""
    return resume_part(flatten(to_dict(cfg)))


def own_task_fields(flat: dict[str, Any]) -> dict[str, Any]:
    """A flattened config without the ``task.*`` fields its task does not read
    (:func:`study.config.task.task_fields`: ``name`` and its module's ``Settings``; an ``lm`` config, the task of
    every run made before tasks existed, keeps none).  An unknown task keeps every field."""
    from .task import task_fields

    name = flat.get("task.name", "lm")
    used = task_fields(name) if isinstance(name, str) else None
    return {k: v for k, v in flat.items()
            if not k.startswith("task.") or used is None or k.split(".", 1)[1] in used}


def resume_part(flat: dict[str, Any]) -> dict[str, Any]:
    """The keys of a flattened config that are in the resume key, sorted: all but :data:`NOT_IN_RESUME_KEY`
    and the task fields its task does not read (:func:`own_task_fields`)."""
    return {k: v for k, v in sorted(own_task_fields(flat).items())
            if not any(k == x or k.startswith(x + ".") for x in NOT_IN_RESUME_KEY)}


def config_hash(cfg: RunConfig) -> str:
    """sha256 (16 hex digits) of :func:`resume_config`: everything that changes the numbers of a run."""
    return hashlib.sha256(json.dumps(resume_config(cfg), sort_keys=True).encode()).hexdigest()[:16]


def diff_keys(old: dict, new: dict) -> list[str]:
    """``["key: OLD -> NEW", ...]`` for every key whose value differs between two flat dicts (sorted)."""
    missing = object()
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, missing), new.get(k, missing)
        if a != b:
            out.append(f"{k}: {'(unset)' if a is missing else a!r} -> {'(unset)' if b is missing else b!r}")
    return out


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}: the resolved config as MLflow params."""
    out = {}
    for k, val in d.items():
        key = f"{prefix}{k}"
        if isinstance(val, dict):
            out.update(flatten(val, key + "."))
        else:
            out[key] = val
    return out


