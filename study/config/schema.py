"""The typed schema of the study's configuration: one dataclass per section of the composed config.

``RunConfig`` is registered in Hydra's ConfigStore as ``run_config`` (:func:`register`) and heads the
defaults list of ``conf/study.yaml``, so every Hydra composition of ``conf/`` is typed by it: a key
that is not a field here, or a value of the wrong type, stops the composition (see
``study.config.compose``).  Values that are well typed but inconsistent are checked afterwards by
``study.config.validation``.

Errors: :class:`StudyError` (bad input anywhere in the study) and its subclass :class:`ConfigError`
(configuration), each with a one-line message naming the key or file and the fix; the stage runner
prints them as ``error: ...``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

SCHEMA_NAME = "run_config"  # the ConfigStore name of RunConfig, first in conf/study.yaml's defaults list
GROUPS = ("model", "variant", "data", "trainer", "launcher", "task")
#: sections that say which runs exist and how they are judged, not how one run trains: left out of a run's
#: config.json, its resume key and the settings runs pair on (like study and scale_ladder)
VERDICT_SECTIONS = ("arms", "tune", "tuned", "decomposition")
#: where and how the trainings of a stage are launched (this machine, SLURM job arrays): never a run's setting, so
#: left out of config.json, the resume key, the settings runs pair on and the stages' inputs (same numbers on both)
LAUNCH_SECTIONS = ("launcher",)
EXECUTORS = ("local", "slurm")
PROJECTION_MODES = ("linear", "identity", "residual_linear", "nonlinear")
ACTIVATIONS = ("gelu", "relu2", "silu", "identity")
CONTEXTS = ("causal", "self")  # what a position attends to (study.modeling.model.CausalSelfAttention)
QK_NORMS = ("none", "rms", "rms_gain")  # per-head normalisation of q and k (study.modeling.model.head_rms_norm)
SCHEDULES = ("cosine", "d2z", "wsd")  # learning-rate schedules (study.config.schedule.SCHEDULES)
TOKENIZERS = ("bytes", "bpe", "gpt2")
#: the vocabulary (ids, end of text included) of the tokenizers that fix their own: ``bytes`` (256 bytes + end of
#: text) and ``gpt2`` (the GPT-2 BPE); ``bpe`` takes ``data.vocab_size``
FIXED_VOCAB = {"bytes": 257, "gpt2": 50257}


def tokenizer_vocab(data) -> int:
    """The ids (tokens, end of text included) that ``data`` (a DataConfig) tokenises into: :data:`FIXED_VOCAB`
    for ``bytes`` and ``gpt2``, ``data.vocab_size`` for ``bpe`` (the size asked of its training)."""
    return FIXED_VOCAB.get(data.tokenizer, data.vocab_size)


def embedding_rows(ids: int, multiple: int) -> int:
    """``ids`` (tokens) rounded up to a multiple of ``multiple`` (``model.vocab_multiple``): the rows of the
    embedding and the output head (50257 GPT-2 ids at 64 -> 50304)."""
    return -(-int(ids) // int(multiple)) * int(multiple)


# Lightning 2.6's precision names (lightning.fabric.connector._PRECISION_INPUT), checked before Lightning is imported
PRECISIONS = frozenset({"64", "32", "16", "bf16", "64-true", "32-true", "16-true", "bf16-true", "16-mixed",
                        "bf16-mixed", "transformer-engine", "transformer-engine-float16"})


class StudyError(Exception):
    """A mistake in the study's input; the message names the key or file and the fix."""


class ConfigError(StudyError, ValueError):
    """A configuration mistake; the message names the key or file and the fix."""


@dataclass
class ModelConfig:
    """GPT decoder shape.  The embedding's rows are not set here: they are the prepared data's vocabulary
    (meta.json ``vocab_size``, set by ``data.tokenizer``/``data.vocab_size``) plus what the task adds, rounded up to
    a multiple of ``vocab_multiple`` (64 on GPUs: 50257 GPT-2 ids -> 50304 rows)."""

    name: str = "cpu"  # the conf/GROUP file (set by the composition from the group choice)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    vocab_multiple: int = 1  # embedding rows rounded up to a multiple of this (tokens)
    mlp_ratio: float = 4.0  # MLP hidden size = int(n_embd * mlp_ratio)
    dropout: float = 0.0
    norm: str = "layernorm"  # "layernorm" (the paper's) or "none" (the exact algebra of arXiv 2510.23912)
    max_block_size: Optional[int] = None  # largest context the positions table allows (None: block_size)
    position: Optional[str] = None  # "learned" (nanoGPT's table wpe), "rope" (rotary q and k, arXiv 2104.09864; no
    # wpe) or None: the task's (task.position, set by study.config.task.resolve_task)


@dataclass
class VariantConfig:
    """How attention projects x into q, k and v (see ``study.modeling.model``).

    ``query``/``key``/``value`` each take one of :data:`PROJECTION_MODES`, and so does ``output``, the map of
    the merged heads y (B, T, C) back to the residual stream (``linear``: nanoGPT's c_proj; ``nonlinear``:
    y + LN(W2 GELU(W1 RMSNorm(y))), the paper's map moved to O, as its code asks to try).
    ``scale_factor`` multiplies the usual 1/sqrt(head_dim) attention scale;
    ``None`` means 0.5 when q or k is not a plain linear map (arXiv 2603.13381)
    and 1.0 otherwise.

    The recipe switches (all off by default; ``study.modeling.model.resolve_attention`` reads them):
    ``qk_norm`` (:data:`QK_NORMS`) normalises q and k of each head to RMS 1 (``rms_gain``: times a
    learnable gain of head_dim each); ``k_norm`` the keys alone; ``per_head_norm`` makes the nonlinear
    query q_h = RMS(x_h) + g_h RMS(f(x)_h); ``lower_query`` is the query mode of the lower half of the
    layers (split depth); ``activation: identity`` removes the nonlinear query's activation.
    """

    name: str = "baseline"
    query: str = "linear"
    key: str = "linear"
    value: str = "linear"
    residual: bool = True  # nonlinear branch: x + f(x) (True) or f(x) alone
    bottleneck: float = 0.5  # r = n_embd * bottleneck, the hidden width of f
    activation: str = "gelu"  # of the nonlinear branch: ACTIVATIONS ("identity": the linear ablation)
    mlp_ratio: Optional[float] = None  # overrides model.mlp_ratio (parameter-matched baselines)
    scale_factor: Optional[float] = None
    qk_norm: str = "none"  # "none", "rms" (parameter-free, arXiv 2010.04245) or "rms_gain" (+2 head_dim per layer)
    k_norm: bool = False  # keys alone normalised per head (rms), as the follow-up's per-head arm
    per_head_norm: bool = False  # nonlinear query only: q_h = RMS(x_h) + g_h RMS(f(x)_h), g the LN gain
    lower_query: Optional[str] = None  # query mode of layers i < n_layer // 2 (None: query everywhere)
    output: str = "linear"  # the attention's output projection O, a PROJECTION_MODES name ("nonlinear": y + f(y))
    context: str = "causal"  # CONTEXTS: "self" = attention to its own position only (the no-context arm)
    description: str = ""


@dataclass
class RunArmConfig:
    """The peak learning rate of the arm a run belongs to: its lr* (``make tune``) or fixed lr, which the stages
    that train an arm pass as ``arm.lr=LR`` (``study.runner.arms``) and ``train.lr_from_tuned`` derives
    (``study.runner.spec``).  None: ``train.lr``.  It is the arm's, not the variant's: the variant is the
    architecture alone, and pairing ignores this section as it ignores the variant (each arm at its own lr*)."""

    lr: Optional[float] = None  # peak lr (overrides train.lr); the schedule keeps train.min_lr / train.lr
    min_lr: Optional[float] = None  # the cosine schedule's final lr (None: train.min_lr x lr / train.lr)


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
    tokenizer: str = "bytes"  # "bytes" (256 bytes + end of text), "bpe" (byte-level BPE trained here) or "gpt2"
    vocab_size: Optional[int] = None  # the tokenizer's ids: bpe's trained size; null for bytes (257) and gpt2 (50257)
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
    schedule: str = "cosine"  # after warmup: "cosine" to min_lr, "d2z" linear to zero, "wsd" constant then linear to zero
    decay_fraction: float = 0.2  # wsd: the last fraction of the steps, decayed linearly to zero
    z_loss: float = 0.0  # coefficient of mean(logsumexp(logits)^2), added to the training loss only (0: off)
    tokens_per_param: Optional[float] = None  # set: tokens = this x the baseline's non-embedding params (scale ladder)
    lr_from_tuned: bool = False  # true: the peak lr is tuned.lr[VARIANT] (conf/tuned.yaml), at any size (scale ladder)
    lr_per_size: bool = False  # with lr_from_tuned: tuned.size[MODEL][VARIANT] instead, the lr* tuned at this size
    overwrite: bool = False  # true: a hand-started run may replace a finished run of other settings in its folder
    data_seed: Optional[int] = None  # the training-data order (None: seed)
    init_seed: Optional[int] = None  # the initial weights, keyed by parameter name (None: seed)


@dataclass
class TrainerConfig:
    """Lightning Trainer settings (accelerator, devices, strategy, precision)."""

    name: str = "cpu"  # the conf/GROUP file (set by the composition from the group choice)
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
    """The study: its arms x seeds, and where outputs and tracking live."""

    name: str = "nonlinear-queries"
    seeds: list = field(default_factory=lambda: [1, 2, 3, 4])
    baseline: str = "baseline"
    runs_dir: str = "runs"
    reports_dir: str = "reports"
    tracking_db: str = "mlruns.db"  # SQLite MLflow store, relative to the project root
    artifact_dir: str = "mlartifacts"
    group: str = ""  # sub-folder of runs_dir for one run (the stages set it: "test/ARM", "scale_ladder/MODEL", ...)
    # the decided verdict (docs/verdict.md; off while arms is empty): every arm at its lr* on the test
    # seeds (study.seeds: Stein's first stage, at least 5), more seeds up to max_seeds until decided
    arms: list = field(default_factory=list)  # arms (names in the arms section) of the test stage
    references: list = field(default_factory=list)  # every other arm is compared with each of these
    pairs: list = field(default_factory=list)  # [[arm, reference], ...]; []: every arm not in references vs each
    target_halfwidth: float = 0.5  # Stein's half-width d of the interval, % log-loss of the reference
    max_seeds: int = 20  # most test seeds per arm; a comparison needing more is "undecided (N seeds needed)"
    equivalence_margin: float = 1.0  # +-delta of the equivalence test (TOST), % log-loss of the reference
    jobs: int = 1  # trainings the tune, test_runs and scale_ladder stages run at once, each its own process (needs trainer.threads)
    pilot_seeds: list = field(default_factory=list)  # seeds the default was chosen on: never tuning or test seeds


@dataclass
class ScaleLadderConfig:
    """The scale-ladder profile (off while ``models`` is empty).

    Every variant of ``variants`` x study.seeds is trained at each model size of
    ``models`` (conf/model files) on tokens = ``tokens_per_param`` x the baseline's
    non-embedding parameters at that size (so compute grows with size and is the same
    for every variant of one size), warmup ``warmup_tokens``.  With ``lr_from_tuned`` each variant
    trains at an lr* of conf/tuned.yaml: with ``lr_per_size`` the one tuned at that size by the same rule
    (``tuned.size.MODEL``, ``make ladder-tune``), else the one of the arm of its name tuned at the default size,
    unchanged at every size (the transfer rule that ``python -m study.tune --ladder MODEL`` checks at one size).
    """

    models: list = field(default_factory=list)
    variants: list = field(default_factory=lambda: ["baseline", "nonlinear_q"])
    tokens_per_param: float = 10.64
    warmup_tokens: int = 262_144
    lr_from_tuned: bool = True  # each variant at an lr* of conf/tuned.yaml; false: the shared train.lr
    lr_per_size: bool = True  # that lr* tuned at each size (tuned.size, make ladder-tune); false: the default size's


@dataclass
class ArmConfig:
    """One arm: a variant plus the training overrides of its recipe (``study.arms``, ``tune.arms``)."""

    variant: str = "baseline"  # conf/variant/NAME.yaml
    overrides: list = field(default_factory=list)  # study.train overrides, e.g. ["train.schedule=d2z"]
    lr: Optional[float] = None  # a fixed peak lr (never tuned); None: tuned.lr[ARM] from conf/tuned.yaml
    description: str = ""


@dataclass
class TuneConfig:
    """Tuning by one rule (``make tune``; study/tuning/rule.py): a x2 lr grid per arm on ``seeds``."""

    arms: list = field(default_factory=list)  # arms tuned by `make tune` (off while empty)
    seeds: list = field(default_factory=lambda: [101, 102])  # tuning seeds (>= 2), never test seeds
    centre: float = 3.0e-3  # the initial grid: centre x 2^k, ``points`` points around it
    points: int = 3
    max_points: int = 8  # the grid extends by x2 at the edge holding the best mean until bracketed or this
    tokens: Optional[int] = None  # tokens per tuning run (None: train.tokens)
    rule: str = "vertex"  # lr*: "vertex" (the quadratic's, where defined inside the bracket) or "best" (grid point)
    runs_dir: str = "runs_tune"  # the tuning runs: RUNS_DIR/ARM/lrLR/VARIANT-sSEED (outside runs/: see dvc.yaml)
    table_dir: str = "conf/tuning"  # table.md, table.json, tuning.png: the evidence beside conf/tuned.yaml


@dataclass
class TunedConfig:
    """The tuned learning rates (conf/tuned.yaml, written by ``make tune``, tracked)."""

    lr: Dict[str, float] = field(default_factory=dict)  # arm -> lr*
    recipe: Dict[str, Any] = field(default_factory=dict)  # arm -> {model: {...}, train: {...}} it was tuned at
    size: Dict[str, Any] = field(default_factory=dict)  # model -> {variant: lr*} tuned at that size (the scale ladder)
    size_recipe: Dict[str, Any] = field(default_factory=dict)  # model -> {variant: the recipe of its tuned.size lr*}
    task: Dict[str, Any] = field(default_factory=dict)  # task (not lm) -> {lr: {arm: lr*}, recipe: {...}}: its own lr*


@dataclass
class DecompositionConfig:
    """The recipe decomposition's rows (arms) and the gap whose share the linear recipe closes."""

    rows: list = field(default_factory=list)  # arms in report order (off while empty)
    start: str = ""  # the gap's start, e.g. the baseline at today's recipe
    end: str = ""  # the gap's end, e.g. tuned nonlinear_q
    linear: str = ""  # the linear recipe alone (e.g. baseline + d2z + QK-norm, tuned)
    # the parameter frontier (off while family is []): the baseline family's arms (MLP widths, each at its lr*, at
    # least 3 sizes) and the arms priced on it (how many non-embedding parameters each is worth, with its interval)
    family: list = field(default_factory=list)
    worth: list = field(default_factory=list)


@dataclass
class LauncherConfig:
    """Where the tuning and test stages train their missing runs (conf/launcher/; study/orchestration/launch.py):
    ``local``: ``study.jobs`` trainings at once on this machine; ``slurm``: one SLURM job array per batch of
    missing runs, through submitit, one training per job (docs/scaling.md)."""

    name: str = "local"  # the conf/launcher file
    executor: str = "local"  # "local" or "slurm"
    log_dir: str = "logs/launcher"  # each training's log (local: RUN.log; slurm: submitit's JOBID_TASK_log.out/.err)
    jobs_per_gpu: int = 1  # local, GPU trainer: trainings at once on each GPU (small models); each gets its own GPU(s)
    partition: Optional[str] = None  # sbatch --partition (None: the cluster's default)
    account: Optional[str] = None  # --account
    qos: Optional[str] = None  # --qos
    constraint: Optional[str] = None  # --constraint, e.g. "h100"
    nodes: Optional[int] = None  # nodes per job (None: trainer.num_nodes)
    gpus_per_node: int = 0  # --gpus-per-node (0: a CPU job)
    tasks_per_node: Optional[int] = None  # None: trainer.devices under a multi-device strategy (ddp, fsdp), else 1
    cpus_per_task: int = 2  # --cpus-per-task
    mem_gb: Optional[float] = None  # --mem per node, GB (None: the partition's default)
    timeout_min: int = 60  # --time, minutes; a job at its limit is checkpointed and requeued (submitit)
    max_requeues: int = 3  # requeues at the time limit before the job counts as failed (submitit's max_num_timeout)
    array_parallelism: int = 64  # jobs of one array that run at once (--array=...%N)
    setup: list = field(default_factory=list)  # shell lines run in each job before the training (module load ...)
    additional: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option, e.g. {reservation: x}
    poll_s: float = 5.0  # seconds between two looks at the queue while a stage waits
    mfu: float = 0.4  # assumed model FLOPs utilisation of the --dry-run estimate
    peak_tflops: float = 989.4  # one GPU's peak (dense bf16 TFLOP/s, H100 or H200 SXM) of the --dry-run estimate


@dataclass
class RunConfig:
    """Everything one training run needs; ``seed`` fixes init and data order (see :func:`run_seeds`)."""

    study: StudyConfig = field(default_factory=StudyConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    variant: VariantConfig = field(default_factory=VariantConfig)
    arm: RunArmConfig = field(default_factory=RunArmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    scale_ladder: ScaleLadderConfig = field(default_factory=ScaleLadderConfig)
    arms: Dict[str, ArmConfig] = field(default_factory=dict)
    tune: TuneConfig = field(default_factory=TuneConfig)
    tuned: TunedConfig = field(default_factory=TunedConfig)
    decomposition: DecompositionConfig = field(default_factory=DecompositionConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    # what a run learns (conf/task/NAME.yaml): name, position (its models' positions where model.position is None)
    # and the task's own settings, typed by its module's Settings (study/tasks/<NAME>.py; study.config.task)
    task: Dict[str, Any] = field(default_factory=lambda: {"name": "lm", "position": "learned"})
    seed: int = 1


def register() -> None:
    """Store :class:`RunConfig` in Hydra's ConfigStore as ``run_config`` (idempotent).

    Called before every composition here, and by ``hydra_plugins/study_schema.py`` when Hydra scans
    its plugins, which is how DVC's own composition (``dvc exp run``) finds the schema."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    if f"{SCHEMA_NAME}.yaml" not in store.repo:
        store.store(name=SCHEMA_NAME, node=RunConfig)
