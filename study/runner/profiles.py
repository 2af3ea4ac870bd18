"""The two fairness profiles of the study: a learning-rate sweep and a scale ladder.

Both run through the same DVC pipeline and the same ``study.train`` stage; they
only choose *which* runs exist (see dvc.yaml and conf/study.yaml):

lr sweep (``lr_sweep.variants`` non-empty)
    ``runs/lr_sweep/lrLR/VARIANT-sSEED``: one short run (``lr_sweep.tokens``) per
    variant and peak lr of ``lr_sweep.lrs``; then ``runs/tuned/VARIANT-sSEED``: the
    full comparison over study.seeds with each variant at its best lr
    (``train.lr_from_sweep=true``).  The report sets the shared-lr verdict (the
    study's own runs) beside the tuned-lr verdict.

scale ladder (``scale_ladder.models`` non-empty)
    ``runs/scale_ladder/MODEL/VARIANT-sSEED``: every ladder variant x study.seeds at
    each model size, on tokens = ``tokens_per_param`` x the baseline's non-embedding
    parameters (compute grows with size; variants of one size get the same tokens), each
    variant at its lr* of conf/tuned.yaml (``scale_ladder.lr_from_tuned``: the transfer rule
    that ``python -m study.tune --ladder MODEL`` checks by tuning at one size).
    The report gives the effect against the baseline at each size with its 95%
    interval, a power-law fit of val loss against training FLOPs per variant, and
    each variant's compute multiplier at each size: the baseline compute that would
    reach its loss, divided by its own (> 1: the variant is worth more compute).

This module resolves a run's derived settings (:func:`resolve`, called by ``study.train``);
the profiles' reports read their runs through :mod:`study.analysis` (``analysis/profiles.py``).
"""
from __future__ import annotations

from pathlib import Path

from study.analysis.sweep import best_lr, sweep_results
from study.config import RunConfig, load_config

SWEEP, TUNED, LADDER = "lr_sweep", "tuned", "scale_ladder"


# -- resolving a run's budget and learning rate ----------------------------------------------------
def resolve(cfg: RunConfig, root: Path) -> RunConfig:
    """Apply a run's derived settings before it is hashed and trained (in place; returns cfg).

    ``train.tokens_per_param`` sets ``train.tokens`` = tokens_per_param x the non-embedding
    parameters of the *baseline* at this model size, rounded down to whole steps of
    train.batch_tokens (at least one): every variant of one size trains on the same tokens.
    ``train.lr_from_sweep`` sets ``variant.lr`` to the variant's best swept lr (min_lr keeps
    the schedule's ratio, see :func:`study.config.peak_lr`); ``train.lr_from_tuned`` sets it to
    ``tuned.lr[VARIANT]`` (conf/tuned.yaml: lr* of the arm of the variant's name, tuned at the default size), or
    with ``train.lr_per_size`` to ``tuned.size[MODEL][VARIANT]`` (the lr* tuned at this size).

    Raises:
        DataError (RunsError): the lr sweep this run needs is missing or fully diverged.
    """
    if cfg.train.tokens_per_param is not None:
        from study.modeling.model import describe

        base = load_config([f"variant={cfg.study.baseline}"], root).variant
        n = describe(cfg.model, base)["non_embedding_params"]
        steps = max(1, int(cfg.train.tokens_per_param * n) // cfg.train.batch_tokens)
        cfg.train.tokens = steps * cfg.train.batch_tokens
        from study.config.validation import check_wsd_fits

        check_wsd_fits(cfg)  # validate() could not: the tokens were not known then
    if cfg.train.lr_from_sweep:
        cfg.variant.lr = best_lr(sweep_results(cfg, root, cfg.variant.name))["lr"]
    if cfg.train.lr_from_tuned:  # validate() checked the variant's arm is plain and has one
        from study.config.validation import transferred_lr

        cfg.variant.lr = transferred_lr(cfg, cfg.variant.name)
    return cfg
