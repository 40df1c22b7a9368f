# specstudy — `make study` runs the embedded default end to end; `make test` runs the test suite.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
# Rules call the `specstudy` CLI: make the venv's scripts visible to Snakemake's shell commands.
export PATH := $(abspath $(BIN)):$(PATH)
CORES ?= 2
PROFILE ?= profiles/local
PYTEST_ARGS ?=
# Every run lists its 20 slowest tests (docs/testing.md keeps the figures of a full run).
PYTEST_TIMES := --durations=20 --durations-min=1
# Two test processes (pytest-xdist): the tests that start real servers or the Slurm cluster run in one,
# in order, at the front of the queue; every other module is a unit of work for whichever process is free
# (tests/conftest.py, xdist_group_of). PYTEST_JOBS=0 runs the suite in one process.
PYTEST_JOBS ?= 2
PYTEST_PAR := $(if $(filter 0,$(PYTEST_JOBS)),,-n $(PYTEST_JOBS) --dist loadgroup --no-loadscope-reorder)
# Study config of `make cost` (the embedded study unless given, e.g. CONFIG=config/clariden-70b.yaml).
CONFIG ?= config/config.yaml

.PHONY: install install-harness install-suffix gpu-stage study screen confirm capacity report sampling ignore_eos mechanics memory profile rerun test test-fast lint bench bench-decision confirm-again clean-results cost

install:
	envs/install.sh embedded

install-harness:
	envs/install.sh harness

# Opt-in: arctic-inference 0.1.1 (suffix decoding) for the embedded engine, built into $(SUFFIX_DIR)/site,
# never into the venv; prints the engine.server.env.PYTHONPATH to set (docs/methods.md). cmake + g++ needed.
SUFFIX_DIR ?= build/arctic-inference-0.1.1
install-suffix: install
	$(BIN)/specstudy engine build-suffix --dest $(SUFFIX_DIR)

# Wheels for the offline GPU machine -> .stage/p1 ... (docs/gpu.md, "Offline install"). Needs no venv.
gpu-stage:
	python3 envs/gpu/stage.py

# Deployment jobs also write their progress lines to this terminal (specstudy/measure/progress.py).
study screen confirm capacity sampling ignore_eos mechanics memory profile: export SPECSTUDY_PROGRESS_TTY = 1

study: install
	$(BIN)/snakemake --profile $(PROFILE) all

screen confirm capacity report: install
	$(BIN)/snakemake --profile $(PROFILE) $@

# The opt-in extension phases (docs/extensions.md); each runs after screening and the selection.
sampling ignore_eos memory profile: install
	$(BIN)/snakemake --profile $(PROFILE) $@

# The old name of the ignore_eos (fixed-length) phase's target, kept so `make mechanics` still runs it;
# "mechanics" is the random-weights point (`snakemake decode_mechanics`, docs/gpu.md).
mechanics: ignore_eos

# Re-run the job writing one result (a cell: its deployment): make rerun CELL=results/screen/<arm>/rep1/<w>/c1/summary.json
rerun: install
	@test -n "$(CELL)" || { echo "usage: make rerun CELL=results/<phase>/<arm>/<rep>/<workload>/c<conc>/summary.json"; exit 2; }
	$(BIN)/specstudy rerun --profile=$(PROFILE) $(CELL)

# Outside CI a Slurm install that cannot happen is reported and the slurm tests skip with its reason;
# under CI=true (.ci/run) it fails the run, and so does any skipped test (tests/ci_skips.py).
test: install
	tests/slurm/ensure-slurm-packages.sh
	tests/ensure-chromium.sh
	$(BIN)/python -m pytest $(PYTEST_PAR) $(PYTEST_TIMES) $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -m "not vllm and not slurm and not study" $(PYTEST_PAR) $(PYTEST_TIMES) $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check scripts tests benchmarks
	$(BIN)/snakemake --lint

bench: install
	$(BIN)/python benchmarks/loadgen.py
	$(BIN)/snakemake --profile $(PROFILE) results/models/fixture/models.json results/corpora/bundled-open_chat/1/corpus.json
	$(BIN)/python benchmarks/autogroup.py

bench-decision: install
	$(BIN)/python benchmarks/decision_rule.py

# Run the confirmation again from scratch (same screening, selection, locked pre-registration and plan) and
# show the decisions and stability figures of every confirmation run so far (issue #15 item 5).
# RESELECT=1: screening data changed after the selection was locked; archive the selection and its plan too.
confirm-again: install
	$(BIN)/specstudy confirm-archive --results results --to results-archive $(if $(RESELECT),--reselect)
	$(BIN)/snakemake --profile $(PROFILE) confirm
	$(BIN)/specstudy confirm-show results-archive/confirm-* results/confirm/rounds

# What the study will cost before launching it: deployments, cells, requests, wall time, node-hours.
cost: install
	$(BIN)/specstudy plan --cost --config $(CONFIG) --profile $(PROFILE)

clean-results:
	rm -rf results .snakemake
