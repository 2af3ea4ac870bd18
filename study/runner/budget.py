"""The scale ladder: the profile that chooses *which* runs of ``study.train`` exist (dvc.yaml's
``scale_ladder`` stage, on while ``scale_ladder.models`` is non-empty; conf/study.yaml).

``runs/scale_ladder/MODEL/VARIANT-sSEED``: every ladder variant x study.seeds at each model size, on
tokens = ``tokens_per_param`` x the baseline's non-embedding parameters (compute grows with size; variants
of one size get the same tokens), each variant at its lr* of conf/tuned.yaml (``scale_ladder.lr_from_tuned``;
``python -m study.tune --ladder MODEL`` tunes it at one size).  The report gives the effect against the
baseline at each size with its 95% interval, a power-law fit of val loss against training FLOPs per
variant, and each variant's compute multiplier at each size: the baseline compute that would reach its
loss, divided by its own (> 1: the variant is worth more compute).  Learning rates are tuned by one rule
(``make tune``, :mod:`study.tune`).

This module resolves a run's derived settings (:func:`resolve`, called by ``study.train``);
the ladder's report reads its runs through :mod:`study.analysis.scale_ladder`.
"""
from __future__ import annotations

from pathlib import Path

from study.config import RunConfig, load_config


# -- resolving a run's budget and learning rate ----------------------------------------------------
def resolve(cfg: RunConfig, root: Path) -> RunConfig:
    """Apply a run's derived settings before it is hashed and trained (in place; returns cfg).

    ``train.tokens_per_param`` sets ``train.tokens`` = tokens_per_param x the non-embedding
    parameters of the *baseline* at this model size, rounded down to whole steps of
    train.batch_tokens (at least one): every variant of one size trains on the same tokens.
    ``train.lr_from_tuned`` sets ``variant.lr`` (min_lr keeps the schedule's ratio, see
    :func:`study.config.peak_lr`) to
    ``tuned.lr[VARIANT]`` (conf/tuned.yaml: lr* of the arm of the variant's name, tuned at the default size), or
    with ``train.lr_per_size`` to ``tuned.size[MODEL][VARIANT]`` (the lr* tuned at this size).

    Raises:
        ConfigError: a wsd schedule's decay would start inside the warmup at the resolved tokens; with
            ``train.lr_per_size``, the size's lr* was tuned at another recipe (its tokens included).
    """
    if cfg.train.tokens_per_param is not None:
        from study.modeling.accounting import describe
        from study.tasks import configured_rows

        base = load_config([f"variant={cfg.study.baseline}"], root).variant
        n = describe(cfg.model, base, configured_rows(cfg))["non_embedding_params"]
        steps = max(1, int(cfg.train.tokens_per_param * n) // cfg.train.batch_tokens)
        cfg.train.tokens = steps * cfg.train.batch_tokens
        from study.config.validation import check_wsd_fits

        check_wsd_fits(cfg)  # validate() could not: the tokens were not known then
    if cfg.train.lr_from_tuned:  # validate() checked the variant's arm is plain and has one
        from study.config.transfer import check_size_recipe, size_recipe_now, transferred_lr

        cfg.variant.lr = transferred_lr(cfg, cfg.variant.name)
        if cfg.train.lr_per_size:  # the tokens are known now: the whole recipe its size's lr* was tuned at
            check_size_recipe(cfg, cfg.variant.name, cfg.model.name,
                              size_recipe_now(cfg, cfg.model.name, ladder=False, tokens=cfg.train.tokens),
                              "train.lr_per_size=true: variant", "set train.lr_from_tuned=false")
    return cfg
