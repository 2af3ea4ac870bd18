"""Registers the study's typed schema (``study.config.schema.RunConfig``) in Hydra's ConfigStore as
``run_config``, the first entry of conf/study.yaml's defaults list.

Hydra imports every module of the ``hydra_plugins`` namespace package it finds on ``sys.path`` when it
scans for plugins; DVC's Hydra mode (``dvc exp run``) scans this folder (``hydra.plugins_path``, the
repository root by default) before it composes conf/ into params.yaml, so its composition is typed by
the same schema as the stages' own (study/config/compose.py).
"""
from study.config.schema import register

register()
