"""Typed configuration of the study, composed by Hydra from the YAML under ``conf/``.

The YAML stays plain data; this package gives it types, defaults and checks:

    schema.py      the dataclasses (one per section), the error types, Hydra's ConfigStore entry
    compose.py     Hydra composition of conf/ (overrides, params.yaml under DVC)
    hydra_errors.py  Hydra's and OmegaConf's errors as one-line ConfigErrors (closest key, YAML line)
    stage.py       the stage runner of every ``python -m study.NAME``: --help, --cfg job, -m, --params
    validation.py  the checks beyond types (one-line ConfigError naming the key and the fix)
    schedule.py    seeds, micro-batches, step budget and peak lr of a run (the schedule per step: modeling)
    naming.py      run names and folders, the flattened config and the resume key
    task.py        a task's folders, experiment and lr* resolved into a copy; the task fields that count

Everything callers use is re-exported here (``from study.config import load_config, RunConfig``).
"""
from .compose import NAMED_GROUPS, PARAMS_FILE, available, composed_params, load_config, project_root, sweep
from .hydra_errors import GRAMMAR
from .naming import (NOT_IN_RESUME_KEY, config_hash, diff_keys, flatten, own_task_fields, resume_config, resume_part,
                     run_dir, run_label, run_name, to_dict)
from .schedule import max_steps, micro_batches, peak_lr, run_seeds
from .schema import (ACTIVATIONS, CONTEXTS, GROUPS, PRECISIONS, PROJECTION_MODES, QK_NORMS, SCHEDULES, SCHEMA_NAME, TOKENIZERS, VERDICT_SECTIONS,
                     ConfigError, DataConfig, ModelConfig, RunConfig, ScaleLadderConfig, StudyConfig, StudyError,
                     TrainConfig, TrainerConfig, VariantConfig, register)
from .stage import run_stage
from .schema import (EXECUTORS, FIXED_VOCAB, LAUNCH_SECTIONS, embedding_rows, tokenizer_vocab, ArmConfig,
                     DecompositionConfig, LauncherConfig, TuneConfig, TunedConfig)
from .task import resolve_task, task_fields, task_names
from .validation import validate

__all__ = [n for n in dir() if not n.startswith("_")]
