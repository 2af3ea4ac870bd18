"""Checks of a composed configuration beyond its types: shapes that divide, positive budgets and
learning rates, consistent profiles.  Each mistake raises :class:`~study.config.schema.ConfigError`
with one line naming the key and the fix."""
from __future__ import annotations

import re

from .schedule import batch_tokens_message, max_steps, peak_lr, wsd_decay_steps
from .schema import (ACTIVATIONS, CONTEXTS, FIXED_VOCAB, PRECISIONS, PROJECTION_MODES, QK_NORMS, SCHEDULES, TOKENIZERS,
                     ConfigError, DataConfig, RunConfig)
from .launcher import resolve_launcher

MAX_BPE_VOCAB = 2 ** 20  # tokens: 4x the largest vocabularies in use (Gemma's 256k); a typo beyond allocates GBs
from .transfer import check_transferable
from .verdict_checks import validate_verdict


def validate(cfg: RunConfig) -> None:
    """Check a composed config; raise :class:`ConfigError` naming the key and the fix."""
    d = cfg.data
    _validate_finite(cfg)
    _validate_model(cfg)
    _validate_variant(cfg)
    _validate_budget(cfg)
    _validate_precision(cfg)
    _validate_data(cfg)
    _validate_study(cfg)
    _validate_optimizer(cfg)
    _validate_recipe(cfg)
    if d.max_docs_per_corpus is not None and d.max_docs_per_corpus < 1:
        raise ConfigError(f"data.max_docs_per_corpus={d.max_docs_per_corpus} must be >= 1 (or null for all)")
    _validate_hf(d)
    _validate_profiles(cfg)
    validate_verdict(cfg)
    _validate_trainer(cfg.trainer)
    resolve_launcher(cfg)  # the launcher against the trainer it runs (study/config/launcher.py)
    _validate_chunk_bytes(d.chunk_bytes)


def _validate_model(cfg: RunConfig) -> None:
    """Cfg.model's shape and positions (:func:`validate`)."""
    m = cfg.model
    for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_multiple"):
        if getattr(m, key) <= 0:
            raise ConfigError(f"model.{key}={getattr(m, key)} must be a positive integer")
    if m.n_embd % m.n_head:
        raise ConfigError(f"model.n_embd={m.n_embd} is not divisible by model.n_head={m.n_head}: "
                          f"choose n_head among {[h for h in range(1, m.n_embd + 1) if m.n_embd % h == 0][:12]}")
    if m.max_block_size is not None and m.block_size > m.max_block_size:
        raise ConfigError(f"model.block_size={m.block_size} is larger than model.max_block_size="
                          f"{m.max_block_size} that this model supports: lower block_size")
    if m.norm not in ("layernorm", "none"):
        raise ConfigError(f"model.norm={m.norm!r}: choose 'layernorm' or 'none'")
    if m.position not in (None, "learned", "rope"):  # None: the task's (study.config.task.resolve_task)
        raise ConfigError(f"model.position={m.position!r}: choose 'learned' or 'rope' (or null: the task's)")
    if m.position == "rope" and (m.n_embd // m.n_head) % 2:
        raise ConfigError(f"model.position=rope rotates pairs of head_dim = {m.n_embd // m.n_head}, which is odd: "
                          f"choose n_embd / n_head even, or model.position=learned")


def _validate_variant(cfg: RunConfig) -> None:
    """Cfg.variant's projections, activation, bottleneck and MLP width (:func:`validate`)."""
    m, v = cfg.model, cfg.variant
    for key in ("query", "key", "value", "output"):
        if getattr(v, key) not in PROJECTION_MODES:
            raise ConfigError(f"variant.{key}={getattr(v, key)!r} is not a projection mode: "
                              f"choose one of {list(PROJECTION_MODES)}")
    if v.activation not in ACTIVATIONS:
        raise ConfigError(f"variant.activation={v.activation!r}: choose one of {list(ACTIVATIONS)}")
    r = m.n_embd * v.bottleneck
    if v.bottleneck <= 0 or abs(r - round(r)) > 1e-9:
        raise ConfigError(f"variant.bottleneck={v.bottleneck} gives a width n_embd*bottleneck={r} "
                          f"that is not a positive integer: choose a bottleneck that divides n_embd={m.n_embd}")
    ratio = v.mlp_ratio if v.mlp_ratio is not None else m.mlp_ratio
    if ratio <= 0:
        raise ConfigError(f"mlp_ratio={ratio} must be positive")


def _validate_budget(cfg: RunConfig) -> None:
    """The learning rates, the token budget and its windows, the seeds (:func:`validate`)."""
    m, a, t = cfg.model, cfg.arm, cfg.train
    for key in ("lr", "min_lr"):
        val = getattr(t, key)
        if not val > 0:
            raise ConfigError(f"train.{key}={val} must be > 0: use a positive learning rate")
    for key in ("lr", "min_lr"):
        val = getattr(a, key)
        if val is not None and not val > 0:
            raise ConfigError(f"arm.{key}={val} must be > 0 (or null to use train.{key})")
    for key in ("tokens", "batch_tokens", "micro_batch_size", "eval_every", "val_tokens",
                "val_micro_batch_size", "log_every"):
        if getattr(t, key) <= 0:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be a positive integer")
    if t.batch_tokens % m.block_size:  # times the world size: checked when the run starts (micro_batches)
        raise ConfigError(batch_tokens_message(t.batch_tokens, m.block_size, f"model.block_size={m.block_size}"))
    if t.warmup_tokens < 0:
        raise ConfigError(f"train.warmup_tokens={t.warmup_tokens} must be >= 0")
    if t.val_tokens < m.block_size:
        raise ConfigError(f"train.val_tokens={t.val_tokens} is less than one window of "
                          f"model.block_size={m.block_size}: raise val_tokens")
    if t.tokens % t.batch_tokens and t.tokens_per_param is None:
        raise ConfigError(f"train.tokens={t.tokens} is not a multiple of train.batch_tokens={t.batch_tokens}: "
                          f"use {t.tokens // t.batch_tokens * t.batch_tokens or t.batch_tokens} (whole optimizer steps; "
                          f"the recorded budget must be the one trained)")
    if t.val_tokens % m.block_size:
        raise ConfigError(f"train.val_tokens={t.val_tokens} is not a multiple of model.block_size={m.block_size}: "
                          f"use {max(1, t.val_tokens // m.block_size) * m.block_size} (whole validation windows)")
    if t.warmup_tokens > t.tokens:
        raise ConfigError(f"train.warmup_tokens={t.warmup_tokens} is more than the run's train.tokens={t.tokens}: "
                          f"the lr would never reach its peak; lower warmup_tokens")
    for key, val in (("seed", cfg.seed), ("train.data_seed", t.data_seed), ("train.init_seed", t.init_seed)):
        if val is not None and not 0 <= val < 2 ** 32:
            raise ConfigError(f"{key}={val} must be in [0, 2**32) (a numpy/torch seed)")


def _validate_precision(cfg: RunConfig) -> None:
    """Threads and precision against the accelerator, and one optimizer step at least (:func:`validate`)."""
    t = cfg.train
    c = cfg.trainer
    if c.threads is not None and c.threads < 1:
        raise ConfigError(f"trainer.threads={c.threads} must be >= 1 (or null for torch's default)")
    if str(c.precision) not in PRECISIONS:
        raise ConfigError(f"trainer.precision={c.precision!r} is not a Lightning precision: choose one of "
                          f"{sorted(PRECISIONS)}")
    if c.accelerator == "cpu" and str(c.precision) in ("16", "16-mixed"):  # Lightning swaps in bf16-mixed on CPU
        raise ConfigError(f"trainer.precision={c.precision} with trainer.accelerator=cpu: Lightning would run bf16 "
                          f"autocast instead while config.json records fp16; use 32-true (conf/trainer/cpu.yaml) or "
                          f"bf16-mixed")
    if t.tokens < t.batch_tokens:
        raise ConfigError(f"train.tokens={t.tokens} is less than one step of train.batch_tokens="
                          f"{t.batch_tokens}: raise the token budget")


def _validate_data(cfg: RunConfig) -> None:
    """The tokenizer and its vocabulary, the held-out share (:func:`validate`)."""
    d = cfg.data
    if d.tokenizer not in TOKENIZERS:
        raise ConfigError(f"data.tokenizer={d.tokenizer!r}: choose one of {list(TOKENIZERS)}")
    fixed = FIXED_VOCAB.get(d.tokenizer)
    if fixed is not None and d.vocab_size is not None:
        raise ConfigError(f"data.vocab_size={d.vocab_size} but data.tokenizer={d.tokenizer} has its own {fixed} ids: "
                          f"set data.vocab_size=null, or data.tokenizer=bpe to train a BPE of that size")
    if d.tokenizer == "bpe" and (d.vocab_size is None or not 257 <= d.vocab_size <= MAX_BPE_VOCAB):
        raise ConfigError(f"data.tokenizer=bpe needs data.vocab_size from 257 (256 bytes + <|endoftext|>) to "
                          f"{MAX_BPE_VOCAB:,}, not {d.vocab_size}: set it, or use data.tokenizer=bytes")
    if d.val_every < 2:
        raise ConfigError(f"data.val_every={d.val_every} must be >= 2 (one document in val_every is held out)")


def _validate_study(cfg: RunConfig) -> None:
    """The MLflow experiment's name, the seeds and what is compared (:func:`validate`)."""
    s = cfg.study
    name = s.name if isinstance(s.name, str) else str(s.name)
    if not name.strip() or name != name.strip() or name in (".", "..") or "/" in name or "\\" in name:
        raise ConfigError(f"study.name={name!r} is not a usable MLflow experiment name: write a non-empty name "
                          f"without surrounding spaces, '/' or '\\' (and not . or ..), e.g. study.name=nonlinear-queries")
    if not list(s.seeds):
        raise ConfigError("study.seeds is empty: list at least one seed, e.g. study.seeds=[1,2,3]")
    twice = sorted({x for x in s.seeds if list(s.seeds).count(x) > 1})
    if twice:  # a seed listed twice would be one pair counted twice: the paired statistics' n and df would be wrong
        raise ConfigError(f"study.seeds={list(s.seeds)} lists {twice} more than once: name each seed once, e.g. "
                          f"study.seeds={sorted(set(s.seeds))}")


def _validate_optimizer(cfg: RunConfig) -> None:
    """Dropout, AdamW's betas, decay, clipping, the divergence test and the lr schedule's floor (:func:`validate`)."""
    m, v, t = cfg.model, cfg.variant, cfg.train
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(f"model.dropout={m.dropout} must be in [0, 1)")
    for key in ("beta1", "beta2"):
        if not 0.0 <= getattr(t, key) < 1.0:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be in [0, 1)")
    for key in ("weight_decay", "grad_clip"):
        if getattr(t, key) < 0:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be >= 0")
    if t.divergence_nats <= 0:
        raise ConfigError(f"train.divergence_nats={t.divergence_nats} must be > 0")
    lr, min_lr = peak_lr(cfg)
    if min_lr > lr:
        raise ConfigError(f"min_lr={min_lr} is above the peak lr={lr}: lower train.min_lr (or arm.min_lr)")
    if v.scale_factor is not None and v.scale_factor <= 0:
        raise ConfigError(f"variant.scale_factor={v.scale_factor} must be > 0 (or null)")


#: Lightning's accelerator names (``AcceleratorRegistry`` and its aliases ``gpu``, ``auto``); written out
#: so that a config is checked before Lightning is imported (tests/test_bad_input.py keeps them in sync)
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
#: Lightning's strategy names: ``auto`` and ``StrategyRegistry.available_strategies()`` of Lightning 2.6
STRATEGIES = ("auto", "ddp", "ddp_find_unused_parameters_false", "ddp_find_unused_parameters_true", "ddp_fork",
              "ddp_fork_find_unused_parameters_false", "ddp_fork_find_unused_parameters_true", "ddp_notebook",
              "ddp_notebook_find_unused_parameters_false", "ddp_notebook_find_unused_parameters_true", "ddp_spawn",
              "ddp_spawn_find_unused_parameters_false", "ddp_spawn_find_unused_parameters_true", "deepspeed",
              "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
              "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme", "fsdp", "fsdp_cpu_offload",
              "single_device", "single_tpu", "single_xla", "xla", "xla_debug")


def validate_paths(cfg: RunConfig, root) -> None:
    """The folders of ``cfg.study`` that the project would create, checked against what is on disk.

    Raises:
        ConfigError: study.artifact_dir, runs_dir or reports_dir (or a folder above one) is an existing file.
    """
    from pathlib import Path

    s = cfg.study
    for key, default, what in (("artifact_dir", "mlartifacts", "MLflow's artifacts"),
                               ("runs_dir", "runs", "the run folders"), ("reports_dir", "reports", "the reports")):
        value = str(getattr(s, key))
        if not value.strip():
            raise ConfigError(f"study.{key} is empty: name a folder for {what}, e.g. study.{key}={default}")
        path = Path(root) / value
        for p in (path, *path.parents):
            if p.exists() and not p.is_dir():
                where = "is a file" if p == path else f"is below the file {p}"
                raise ConfigError(f"study.{key}={value} {where}, not a folder: choose a folder (existing or new) "
                                  f"for {what}, e.g. study.{key}={default}")


def _validate_finite(cfg: RunConfig) -> None:
    """Every float of the config is a finite number: a NaN slips through comparisons such as ``x < 0``
    (train.divergence_nats=nan, train.weight_decay=nan) and an infinity through ``x > 0`` (train.lr=inf),
    and either would stop the run later with a traceback (config.json is strict JSON)."""
    import math
    from dataclasses import asdict

    from omegaconf import OmegaConf

    def walk(node, path):
        if isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(f"{path}={node} is not a finite number: write a finite value (nan and inf are no "
                              f"setting of this study)")
        if isinstance(node, dict):
            for k, x in node.items():
                walk(x, f"{path}.{k}" if path else str(k))
        elif isinstance(node, (list, tuple)):
            for i, x in enumerate(node):
                walk(x, f"{path}[{i}]")

    walk(OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else asdict(cfg), "")


def _int_like(x) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, str) and re.fullmatch(r"-?\d+", x.strip()) is not None)


def _validate_trainer(c) -> None:
    """accelerator, strategy, devices and num_nodes as Lightning's Trainer takes them (before Lightning is
    imported: a Trainer that refuses its settings would otherwise do so after the run folder was opened)."""
    if c.accelerator not in ACCELERATORS:
        raise ConfigError(f"trainer.accelerator={c.accelerator!r} is not a Lightning accelerator: choose one of "
                          f"{list(ACCELERATORS)}")
    if not isinstance(c.strategy, str) or c.strategy not in STRATEGIES:
        raise ConfigError(f"trainer.strategy={c.strategy!r} is not a Lightning strategy: use auto, ddp or fsdp "
                          f"(conf/trainer), or another name of Lightning's StrategyRegistry (ddp_spawn, deepspeed, single_device, ...)")
    if c.num_nodes < 1:
        raise ConfigError(f"trainer.num_nodes={c.num_nodes} must be >= 1")
    dev = c.devices
    devices = list(dev) if not isinstance(dev, (str, int)) and hasattr(dev, "__iter__") else None
    cpu = c.accelerator == "cpu"
    if cpu:
        ok = dev == "auto" or (_int_like(dev) and int(dev) > 0)
        fix = "a number of processes >= 1 (e.g. trainer.devices=1) or auto"
    elif devices is not None:
        ok = bool(devices) and all(_int_like(x) and not isinstance(x, str) and x >= 0 for x in devices) \
            and len(set(devices)) == len(devices)
        fix = "a number of devices >= 1, -1 (every GPU), auto, or a list of distinct GPU indices such as [0,1]"
    else:
        ok = dev == "auto" or (_int_like(dev) and (int(dev) > 0 or int(dev) == -1))
        fix = "a number of devices >= 1, -1 (every GPU), auto, or a list of distinct GPU indices such as [0,1]"
    if not ok:
        shown = devices if devices is not None else dev
        raise ConfigError(f"trainer.devices={shown!r} is not valid with trainer.accelerator={c.accelerator}: use {fix}")


#: the size strings litdata's ``optimize(chunk_bytes=...)`` reads (``litdata.utilities.format``): a number and a unit
CHUNK_BYTES = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(tb|gb|mb|kb|t|g|m|k|b)\s*", re.IGNORECASE)
_UNIT = {"b": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}


def _validate_chunk_bytes(value) -> None:
    m = CHUNK_BYTES.fullmatch(str(value))
    if m is None or int(float(m.group(1)) * _UNIT[m.group(2)[0].lower()]) < 1:
        raise ConfigError(f"data.chunk_bytes={value!r} is not a size: write a positive number and a unit, "
                          f"B, KB, MB, GB or TB (or K, M, G, T), e.g. data.chunk_bytes=16MB")


def _validate_hf(d: DataConfig) -> None:
    if d.source == "hf":
        if not d.hf_dataset or not str(d.hf_dataset).strip():
            raise ConfigError("data.source=hf needs data.hf_dataset: a hub name such as Skylion007/openwebtext "
                              "or a local copy (a .parquet/.arrow file, a glob or folder of them, a save_to_disk folder)")
        for key in ("hf_split", "hf_text_field"):
            if not str(getattr(d, key)).strip():
                raise ConfigError(f"data.{key} is empty: name the dataset's split (e.g. train) / text column (e.g. text)")
    elif d.hf_dataset:
        raise ConfigError(f"data.hf_dataset={d.hf_dataset!r} is set but data.source={d.source!r}: "
                          f"set data.source=hf to read it (or data.hf_dataset=null)")
    if d.num_proc is not None and d.num_proc < 1:
        raise ConfigError(f"data.num_proc={d.num_proc} must be >= 1 (or null for min(8, CPU count))")


def check_ladder_lr(cfg: RunConfig, position: str) -> None:
    """Every variant of the scale ladder has the lr* it trains at (scale_ladder.lr_from_tuned): with
    scale_ladder.lr_per_size the one tuned at each size, else the default size's, tuned at the recipe the ladder trains
    at (``position``: the positions of its sizes, read from their model files by the composition).

    Raises:
        ConfigError: one line naming the variant, the size and the fix (:func:`check_transferable`).
    """
    la = cfg.scale_ladder
    off = ("set scale_ladder.lr_per_size=false (the default size's lr*) or " if la.lr_per_size else "set ") + \
        "scale_ladder.lr_from_tuned=false (train.lr)"
    for v in la.variants:
        for m in (la.models if la.lr_per_size else [None]):
            check_transferable(cfg, v, "scale_ladder.variants:", off, model=m, position=position)


def _validate_profiles(cfg: RunConfig) -> None:
    s, la = cfg.study, cfg.scale_ladder
    if la.models:
        if len(set(la.models)) < 2:
            raise ConfigError(f"scale_ladder.models={list(la.models)} needs at least 2 distinct model sizes "
                              f"(3 or more for a trend), e.g. [ladder-64, ladder-96, ladder-128]")
        for key, names in (("models", la.models), ("variants", la.variants)):
            twice = sorted({n for n in names if list(names).count(n) > 1})
            if twice:
                raise ConfigError(f"scale_ladder.{key}={list(names)} names {twice} more than once: each is one set "
                                  f"of runs (one folder each), list it once")
        if s.baseline not in la.variants:
            raise ConfigError(f"scale_ladder.variants={list(la.variants)} must include study.baseline={s.baseline!r}")
        if not la.tokens_per_param > 0 or la.warmup_tokens < 0:
            raise ConfigError(f"scale_ladder.tokens_per_param={la.tokens_per_param} must be > 0 and "
                              f"scale_ladder.warmup_tokens={la.warmup_tokens} >= 0")
    if cfg.train.lr_from_tuned:
        check_transferable(cfg, cfg.variant.name, "train.lr_from_tuned=true: variant", "set train.lr_from_tuned=false")
    if cfg.train.tokens_per_param is not None and not cfg.train.tokens_per_param > 0:
        raise ConfigError(f"train.tokens_per_param={cfg.train.tokens_per_param} must be > 0 (or null)")
    if s.group and (s.group.startswith("/") or ".." in s.group.split("/")):
        raise ConfigError(f"study.group={s.group!r} must be a relative sub-folder of study.runs_dir")




def _validate_recipe(cfg: RunConfig) -> None:
    """The recipe switches of the variant (qk_norm, context, k_norm, per_head_norm, lower_query) and of train
    (schedule, decay_fraction, z_loss)."""
    m, v, t = cfg.model, cfg.variant, cfg.train
    if v.qk_norm not in QK_NORMS:
        raise ConfigError(f"variant.qk_norm={v.qk_norm!r}: choose one of {list(QK_NORMS)}")
    if v.context not in CONTEXTS:
        raise ConfigError(f"variant.context={v.context!r}: choose one of {list(CONTEXTS)} (causal: the decoder; "
                          f"self: each position attends to itself only, the no-context yardstick)")
    if v.k_norm and v.qk_norm != "none":
        raise ConfigError(f"variant.k_norm=true with variant.qk_norm={v.qk_norm}: qk_norm already normalises the "
                          f"keys; drop k_norm (or set qk_norm=none to normalise the keys alone)")
    if v.lower_query is not None:
        if v.lower_query not in PROJECTION_MODES:
            raise ConfigError(f"variant.lower_query={v.lower_query!r} is not a projection mode: choose one of "
                              f"{list(PROJECTION_MODES)} (or null for variant.query in every layer)")
        if m.n_layer < 2:
            raise ConfigError(f"variant.lower_query={v.lower_query} needs model.n_layer >= 2 (it sets the query of "
                              f"layers below n_layer // 2): raise n_layer or set lower_query=null")
    if v.per_head_norm:
        if v.query != "nonlinear" or not v.residual:
            raise ConfigError(f"variant.per_head_norm=true needs a residual nonlinear query (variant.query=nonlinear, "
                              f"residual=true), not query={v.query} residual={v.residual}: set them or drop per_head_norm")
        if v.qk_norm != "none":
            raise ConfigError(f"variant.per_head_norm=true with variant.qk_norm={v.qk_norm}: per_head_norm already "
                              f"normalises q per head; normalise the keys with k_norm=true and set qk_norm=none")
    if t.schedule not in SCHEDULES:
        raise ConfigError(f"train.schedule={t.schedule!r}: choose one of {list(SCHEDULES)}")
    if t.schedule != "cosine" and cfg.arm.min_lr is not None:
        raise ConfigError(f"arm.min_lr={cfg.arm.min_lr} with train.schedule={t.schedule}, which decays to zero: "
                          f"set arm.min_lr=null (or train.schedule=cosine)")
    if not 0.0 < t.decay_fraction <= 1.0:
        raise ConfigError(f"train.decay_fraction={t.decay_fraction} must be in (0, 1] (the fraction of the steps "
                          f"that wsd decays over, e.g. 0.2)")
    if t.tokens_per_param is None:  # else train.tokens is derived when the run starts (study.runner.spec.run_spec)
        check_wsd_fits(cfg)
    if not (t.z_loss >= 0.0 and t.z_loss < float("inf")):
        raise ConfigError(f"train.z_loss={t.z_loss} must be a finite number >= 0 (0: off; 1e-4 is usual)")


def check_wsd_fits(cfg: RunConfig, tokens: int | None = None) -> None:
    """``train.schedule=wsd``: its decay must start after the warmup, at the run's ``train.tokens`` (or ``tokens``:
    checked again once ``train.tokens_per_param`` has derived them)."""
    t = cfg.train
    if t.schedule == "wsd":
        steps = max_steps(cfg) if tokens is None else tokens // t.batch_tokens
        warmup = t.warmup_tokens // t.batch_tokens
        if steps - wsd_decay_steps(steps, t.decay_fraction) < warmup:
            how = f"train.tokens_per_param={t.tokens_per_param}; " if t.tokens_per_param is not None else ""
            raise ConfigError(f"train.schedule=wsd decays over the last {wsd_decay_steps(steps, t.decay_fraction)} "
                              f"of {steps} steps ({how}train.decay_fraction={t.decay_fraction}), which starts inside "
                              f"the {warmup} warmup steps: lower decay_fraction or train.warmup_tokens")
