# gTop-k S-SGD harness. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help setup test test-all wandb-sync clean-venv

help:  ## List the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

setup: $(STAMP)  ## Create .venv from requirements.lock (idempotent)

# Re-installs only when the lock file or pyproject.toml changed.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-deps -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -c "import torch, torchvision, hydra, gtopk; print('setup ok: torch', torch.__version__)"
	@touch $@

test: setup  ## Run the default test suite (CPU, gloo on loopback)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-all: setup  ## Run every test, the slow ones included
	$(PY) -m pytest -q -m "" $(PYTEST_ARGS)

wandb-sync: setup  ## Upload offline wandb runs under runs/ (needs `wandb login`)
	@runs=$$(find runs -type d -name 'offline-run-*' 2>/dev/null); \
	if [ -z "$$runs" ]; then echo "no offline wandb runs under runs/"; else $(VENV)/bin/wandb sync $$runs; fi

clean-venv:  ## Remove the virtual environment
	rm -rf $(VENV)
