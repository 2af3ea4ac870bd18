"""A run's specification: its composed config with the derived settings resolved once, then frozen.

``run_spec(cfg, root)`` is the one place a run's derived settings are computed, before anything is hashed,
paired or trained:

- ``train.tokens_per_param`` (the scale ladder's budget rule) sets ``train.tokens`` = tokens_per_param x the
  non-embedding parameters of the *baseline* at this model size, rounded down to whole steps of
  ``train.batch_tokens`` (at least one): every variant of one size trains on the same tokens;
- ``train.lr_from_tuned`` sets the run's peak lr ``arm.lr`` to the lr* of the arm of the variant's name
  (``tuned.lr[VARIANT]``, or with ``train.lr_per_size`` the lr* tuned at this size, ``tuned.size[MODEL][VARIANT]``;
  :func:`study.config.transfer.transferred_lr`).

The settings are merged into a copy of the composition (the caller's config is never assigned into) and the copy
is made read-only (OmegaConf's readonly flag: an assignment raises).  The runner trains from it, the resume key
and config.json are computed from it, and the tuning, launch and dry-run accounting read the same values from it,
so that each of them hashes and counts the run the runner trains.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from study.config import ConfigError, RunConfig, load_config, peak_lr, run_dir, run_label
from study.tasks import task_data_dir
from study.config.naming import run_arm


@dataclass(frozen=True)
class RunSpec:
    """One run, resolved and frozen.

    ``cfg``: the read-only config it trains from; ``arm``: the arm it belongs to (``study.group`` test/ARM or
    ARM/lrLR, else its variant); ``lr``, ``min_lr``: its peak and final lr (1/step units of AdamW's lr),
    ``lr_source`` where the peak lr came from (``train.lr``, ``arm.lr``, ``tuned.lr.V`` or
    ``tuned.size.MODEL.V``); ``tokens``: its training tokens; ``data_dir``: the data it reads (mqar: its kept test
    set); ``out_dir``: its run folder; ``name``: its MLflow run name.
    """
    cfg: RunConfig
    name: str
    out_dir: Path
    arm: str
    variant: str
    seed: int
    task: str
    position: str
    schedule: str
    tokens: int
    lr: float
    min_lr: float
    lr_source: str
    data_dir: Path

    def record(self) -> dict:
        """The specification as plain JSON values (paths as text): what a reader needs to know of the run without
        its config."""
        return {"name": self.name, "arm": self.arm, "variant": self.variant, "seed": self.seed, "task": self.task,
                "position": self.position, "schedule": self.schedule, "tokens": self.tokens, "lr": self.lr,
                "min_lr": self.min_lr, "lr_source": self.lr_source}


def derived_settings(cfg: RunConfig, root: Path) -> tuple[dict, str | None]:
    """({section: {key: value}} of the settings the budget rule and the lr transfer derive, the lr's source or None).

    Raises:
        ConfigError: a wsd schedule's decay would start inside the warmup at the resolved tokens; with
            ``train.lr_per_size``, the size's lr* was tuned at another recipe (its tokens included).
    """
    out: dict = {}
    tokens = int(cfg.train.tokens)
    if cfg.train.tokens_per_param is not None:
        from study.config.validation import check_wsd_fits
        from study.modeling.accounting import describe
        from study.tasks import configured_rows

        base = load_config([f"variant={cfg.study.baseline}"], root).variant
        n = describe(cfg.model, base, configured_rows(cfg))["non_embedding_params"]
        tokens = max(1, int(cfg.train.tokens_per_param * n) // cfg.train.batch_tokens) * cfg.train.batch_tokens
        out["train"] = {"tokens": tokens}
        if cfg.train.warmup_tokens > tokens:  # validate() checked it against train.tokens: these were not known then
            raise ConfigError(f"train.warmup_tokens={cfg.train.warmup_tokens} is more than the run's {tokens} tokens "
                              f"(train.tokens_per_param={cfg.train.tokens_per_param} x the baseline's {n:,} "
                              f"non-embedding parameters): the lr would never reach its peak; lower the warmup "
                              f"(scale_ladder.warmup_tokens for the ladder) or raise tokens_per_param")
        check_wsd_fits(cfg, tokens)
    source = None
    if cfg.train.lr_from_tuned:  # validate() checked the variant's arm is plain and has one
        from study.config.transfer import check_size_recipe, size_recipe_now, transferred_lr

        v, model = cfg.variant.name, cfg.model.name
        out["arm"] = {"lr": transferred_lr(cfg, v)}
        source = f"tuned.size.{model}.{v}" if cfg.train.lr_per_size else f"tuned.lr.{v}"
        if cfg.train.lr_per_size:  # the tokens are known now: the whole recipe its size's lr* was tuned at
            check_size_recipe(cfg, v, model, size_recipe_now(cfg, model, ladder=False, tokens=tokens),
                              "train.lr_per_size=true: variant", "set train.lr_from_tuned=false")
    return out, source


def frozen(cfg: RunConfig, settings: dict | None = None) -> RunConfig:
    """A read-only copy of ``cfg`` with ``settings`` ({section: {key: value}}) merged in; ``cfg`` is unchanged."""
    out = OmegaConf.merge(cfg, settings or {})
    OmegaConf.set_readonly(out, True)
    return out  # type: ignore[return-value]


def run_spec(cfg: RunConfig, root: Path) -> RunSpec:
    """The :class:`RunSpec` of a composed config (its derived settings resolved, :func:`derived_settings`).

    Raises:
        ConfigError: as :func:`derived_settings`; one line.
    """
    settings, source = derived_settings(cfg, root)
    c = frozen(cfg, settings)
    lr, min_lr = peak_lr(c)
    if source is None:
        source = "arm.lr" if c.arm.lr is not None else "train.lr"
    return RunSpec(cfg=c, name=run_label(c), out_dir=run_dir(root, c, c.variant.name, c.seed),
                   arm=run_arm(c.study.group, c.variant.name), variant=c.variant.name, seed=int(c.seed),
                   task=c.task.name, position=c.model.position, schedule=c.train.schedule, tokens=int(c.train.tokens),
                   lr=float(lr), min_lr=float(min_lr), lr_source=source, data_dir=task_data_dir(c, root))
