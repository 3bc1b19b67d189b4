# gTop-k S-SGD harness. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# reproduce-*: ARGS = Hydra overrides for the runs (e.g. ARGS="cluster=local compute=measured"),
# NETBENCH_ARGS = gtopk.perf.netbench overrides (e.g. "pingpong.reps=3"), FULL=1 (reproduce-fig5:
# the full variant, P = 4, 16, 32 and three densities, instead of the quick one; reproduce-fig6 and
# -fig6-baselines, validate-model: also P = 16, 32 for the models whose ranks fit in memory), DATA=fashion
# (reproduce-fig5 on Fashion-MNIST: quick P = 4, 16 at three densities; FULL=1: the paper's point).
ARGS ?=
DATA ?= digits
NETBENCH_ARGS ?=
FULL ?=
# VARIANTS = reducer settings reproduce-fig6 also sweeps as lines of their own (selection=sampled)
VARIANTS ?=
REPRODUCE = $(PY) -m analysis.reproduce

.DEFAULT_GOAL := help
.PHONY: help setup native fashion-mnist lint format test test-all test-slow test-gpu bench wandb-sync wandb-export wandb-report clean-venv reproduce-fig6 reproduce-fig6-baselines reproduce-table4 reproduce-breakdown reproduce-fig5 reproduce-all reproduce-scale reproduce-paper-length payoff validate-model fidelity

help:  ## List the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

setup: $(STAMP) native fashion-mnist  ## Create .venv from requirements.lock (idempotent); the compiled rounds; Fashion-MNIST as root

native: $(STAMP)  ## Build gTop-k's compiled rounds (gtopk/reducers/native; a warning where no C++ compiler works)
	@$(PY) -m gtopk.reducers.native

# data=fashion_mnist reads the IDX files of Debian's package dataset-fashion-mnist. Installed
# here when missing and the machine allows it (root with apt-get); otherwise one line says how.
FASHION_MNIST := /usr/share/datasets/fashion-mnist
fashion-mnist:  ## Install Debian's dataset-fashion-mnist (data=fashion_mnist) if missing: as root with apt-get, else say how
	@if [ -f $(FASHION_MNIST)/train-images-idx3-ubyte.gz ] || [ -f $(FASHION_MNIST)/train-images-idx3-ubyte ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's dataset-fashion-mnist (data=fashion_mnist)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; } \
		|| echo "note: apt-get could not install dataset-fashion-mnist; data=fashion_mnist needs its files (docs/data.md)"; \
	else \
		echo "note: data=fashion_mnist needs Debian's dataset-fashion-mnist (sudo apt-get install dataset-fashion-mnist), or data.root= a folder with its four IDX files (docs/data.md)"; \
	fi

# Re-installs only when the lock file or pyproject.toml changed.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-deps -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -c "import torch, torchvision, hydra, gtopk; print('setup ok: torch', torch.__version__)"
	@touch $@

lint: setup  ## ruff check and ruff format --check (config in pyproject.toml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup  ## Apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: setup  ## Run the default test suite (CPU, gloo on loopback)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-all: setup  ## Run every test, the slow ones included (not the benchmarks, not the GPU tier)
	$(PY) -m pytest -q -m "not bench and not gpu" $(PYTEST_ARGS)

test-slow: setup  ## Run only the tests marked slow (make test + make test-slow = make test-all)
	$(PY) -m pytest -q -m "slow and not bench and not gpu" $(PYTEST_ARGS)

test-gpu: setup  ## GPU smoke tier: P=1,2 on NCCL, every reducer and DDP, 3 steps, CUDA events, NCCL_DEBUG=INFO (skips without GPUs)
	NCCL_DEBUG=INFO $(PY) -m pytest -q -rs -s -m gpu tests/gpu $(PYTEST_ARGS)

bench: setup  ## Benchmarks: selection, merge, harness overhead (JSON), collectives over P on the emulated cluster (CSV) in runs/bench/
	@mkdir -p runs/bench
	$(PY) -m pytest tests/bench -m bench -p no:cacheprovider --benchmark-columns=min,median,max,rounds \
		--benchmark-json runs/bench/bench-$$(date +%Y%m%d-%H%M%S).json $(PYTEST_ARGS)
	@cluster=$$($(PY) -c "from gtopk.run.cluster.netns import unavailable_reason as u; print('local' if u() else 'emulated')"); \
	out=runs/bench/net-$$cluster-$$(date +%Y%m%d-%H%M%S); \
	echo "collectives over P and sizes on cluster=$$cluster -> $$out"; \
	$(PY) -m gtopk.perf.netbench cluster=$$cluster out=$$out $(NETBENCH_ARGS)

wandb-sync: setup  ## Upload the exported offline wandb runs (runs/wandb-export/, or WANDB_DIR) (needs `wandb login`)
	@dir=$${WANDB_DIR:-runs/wandb-export}/wandb; runs=$$(find $$dir -maxdepth 1 -type d -name 'offline-run-*' 2>/dev/null); \
	if [ -z "$$runs" ]; then echo "no exported offline wandb runs in $$dir (make wandb-export first)"; else $(VENV)/bin/wandb sync $$runs; fi

# wandb-export / wandb-report: RUNS = folders holding run directories (default runs),
# PROJECT = wandb project (export default: the jobs' logger.project; report default gtopk),
# ENTITY = wandb user or team (report), EXPERIMENT = experiment name (report; default the only one).
RUNS ?= runs
PROJECT ?=
ENTITY ?=
EXPERIMENT ?=

wandb-export: setup  ## Finished jobs + analysis outputs under RUNS (default runs/) -> wandb runs (offline unless logged in)
	$(PY) -m analysis.wandb.export $(RUNS) $(if $(PROJECT),--project "$(PROJECT)") $(if $(ENTITY),--entity "$(ENTITY)")

wandb-report: setup  ## wandb report of an experiment (online): ENTITY=... PROJECT=... [EXPERIMENT=...]
	$(PY) -m analysis.wandb.report $(RUNS) --entity "$(ENTITY)" $(if $(PROJECT),--project "$(PROJECT)") $(if $(EXPERIMENT),--experiment "$(EXPERIMENT)")

reproduce-fig6: setup  ## Fig. 6, Table IV, breakdown, comm model: emulated 1 Gbit/s (else loopback), p102 replay, dense/Top-k/gTop-k at the paper's P=1,4,8 measured (v_1: DDP at P=1), 16/32 modelled; FULL=1: 16/32 measured for the models whose ranks fit in memory
	$(REPRODUCE) fig6 $(if $(FULL),--full) --netbench "$(NETBENCH_ARGS)" --variants "$(VARIANTS)" $(ARGS)

reproduce-fig6-baselines: setup  ## DDP, DDP-fp16, PowerSGD (torch's hooks) and Ok-Topk at P=2,4,8 beside Fig. 6 / Table IV / breakdown, into the runs of reproduce-fig6; FULL=1: also P=16, 32 where the ranks fit
	$(REPRODUCE) fig6 experiment=fig6_baselines $(if $(FULL),--full) --netbench "$(NETBENCH_ARGS)" $(ARGS)

reproduce-table4: setup  ## Table IV: efficiency and gTop-k speedups (the runs of reproduce-fig6)
	$(REPRODUCE) table4 --netbench "$(NETBENCH_ARGS)" $(ARGS)

reproduce-breakdown: setup  ## Time breakdown per model and reducer beside the paper's (the runs of reproduce-fig6)
	$(REPRODUCE) breakdown --netbench "$(NETBENCH_ARGS)" $(ARGS)

reproduce-fig5: setup  ## Fig. 5, simulated workers, on the offline digits: quick (P=4,16, ~15 min); FULL=1: P=4,16,32 x 3 densities; DATA=fashion: Fashion-MNIST
	$(REPRODUCE) fig5 $(if $(FULL),--full) --data $(DATA) $(ARGS)

# reproduce-scale: the grid of experiment fig5_scale (hours: docs/reproducing.md), job by job in the
# order that pays first (seed 0 at P = 16, 32, 4, then seeds 1 and 2); finished jobs are archived
# under SCALE_ARCHIVE (committed) after each block and restored from it first, so the grid goes on
# across sittings; SCALE_SEEDS / SCALE_NODES pick a part of it.
SCALE_ARCHIVE := analysis/results/fig5_scale/runs
SCALE_SEEDS ?= 0 1 2
SCALE_NODES ?= 16 32 4

reproduce-scale: setup fashion-mnist  ## Fig. 5 at scale: P=4,16,32 x every reducer x 3 seeds, resumable across sittings (hours)
	$(PY) -m gtopk.records.archive restore $(SCALE_ARCHIVE) runs/fig5_scale
	@rc=0; for s in $(SCALE_SEEDS); do for p in $(SCALE_NODES); do \
	  $(PY) run.py -m experiment=fig5_scale seed=$$s nodes=$$p $(ARGS) || rc=1; \
	  $(PY) -m gtopk.records.archive save runs/fig5_scale $(SCALE_ARCHIVE) || exit 1; \
	done; done; exit $$rc
	$(REPRODUCE) scale

# reproduce-paper-length: Fig. 5 at the paper's training length (experiment fig5_paper_length, 55,224
# iterations per rank: hours per cell on a CPU), one cell after another in PL_CELLS (nodes:reducer:seed,
# the order that pays first); each finished cell is archived under PL_ARCHIVE (committed) at once and
# restored from it first, so the grid goes on across sittings and machines. Two lanes on two cores:
# make reproduce-paper-length PL_CELLS="32:gtopk:0 ..." & make reproduce-paper-length PL_CELLS="32:dense:0 ...".
PL_ARCHIVE := analysis/results/fig5_paper_length/runs
PL_CELLS ?= 32:gtopk:0 32:dense:0 32:gtopk_exact:0 32:topk:0 4:dense:0 4:gtopk:0 4:gtopk_exact:0 \
	32:gtopk:1 32:dense:1 32:gtopk_exact:1 32:gtopk:2 32:dense:2 32:gtopk_exact:2

reproduce-paper-length: setup fashion-mnist  ## Fig. 5 at the paper's length: P=32 and 4, 55,224 iterations a cell, archived cell by cell (hours: PL_CELLS picks)
	$(PY) -m gtopk.records.archive restore $(PL_ARCHIVE) runs/fig5_paper_length
	@rc=0; for c in $(PL_CELLS); do \
	  p=$${c%%:*}; rest=$${c#*:}; r=$${rest%%:*}; s=$${rest#*:}; \
	  $(PY) run.py -m experiment=fig5_paper_length nodes=$$p reducer=$$r seed=$$s $(ARGS) || rc=1; \
	  $(PY) -m gtopk.records.archive save runs/fig5_paper_length $(PL_ARCHIVE) || exit 1; \
	done; exit $$rc
	$(REPRODUCE) paper_length

reproduce-all: setup  ## Every figure and table: the scaling ones, then Fig. 5 (FULL=1, DATA=fashion as for reproduce-fig5)
	$(REPRODUCE) scaling --netbench "$(NETBENCH_ARGS)" $(ARGS)
	$(REPRODUCE) fig5 $(if $(FULL),--full) --data $(DATA) $(ARGS)

validate-model: setup  ## The performance model against measurement: every reducer, P=1..8, emulated 100 Mbit/s and 1 Gbit/s (docs/payoff.md); FULL=1: also P=16, 32
	$(REPRODUCE) validate $(if $(FULL),--full) --netbench "$(NETBENCH_ARGS)" $(ARGS)

fidelity: setup  ## The emulated cluster's fidelity checks (docs/cluster.md): 16 jobs, 5-8 min, timing targets: run on a quiet machine
	$(PY) -m tests.bench.fidelity $(ARGS)

# payoff: PAYOFF_RUNS = folders of training runs (default: runs/fig5_scale of make reproduce-scale where it
# exists and DATA=fashion is not given, else those of make reproduce-fig5 that exist),
# NETWORK = network profile(s) (default: those of runs/fig6_reproduce and runs/model_validation, one per
# cluster setting; none yet: this machine's emulated 1 Gbit/s network is calibrated first), TARGET_ACC =
# absolute top-1 target(s), PAYOFF_ARGS = other options of analysis.payoff (--borrow, --compute, --bench, --out).
PAYOFF_RUNS ?= $(or $(if $(filter fashion,$(DATA)),,$(wildcard runs/fig5_scale)),$(wildcard $(if $(filter fashion,$(DATA)),runs/fig5_fashion_quick,runs/fig5_quick)))
NETWORK ?=
TARGET_ACC ?=
PAYOFF_ARGS ?=

payoff: setup  ## Time to accuracy per reducer over P x bandwidth (docs/payoff.md): [NETWORK=profile.json] [TARGET_ACC=0.95]
	@test -n "$(PAYOFF_RUNS)" || { echo "make payoff: no training runs in $(if $(filter fashion,$(DATA)),runs/fig5_fashion_quick,runs/fig5_scale or runs/fig5_quick): run make reproduce-$(if $(filter fashion,$(DATA)),fig5 DATA=fashion,scale or make reproduce-fig5), or set PAYOFF_RUNS=<folder>" >&2; exit 2; }
	$(PY) -m analysis.payoff $(PAYOFF_RUNS) $(foreach n,$(NETWORK),--network $(n)) $(foreach a,$(TARGET_ACC),--target-acc $(a)) $(PAYOFF_ARGS)

clean-venv:  ## Remove the virtual environment
	rm -rf $(VENV)
