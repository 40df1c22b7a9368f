# specstudy — `make study` runs the embedded default end to end; `make test` runs the test suite.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
# Rules call the `specstudy` CLI: make the venv's scripts visible to Snakemake's shell commands.
export PATH := $(abspath $(BIN)):$(PATH)
CORES ?= 2
PROFILE ?= profiles/local
PYTEST_ARGS ?=
# Study config of `make cost` (the embedded study unless given, e.g. CONFIG=config/clariden-70b.yaml).
CONFIG ?= config/config.yaml

.PHONY: install install-harness study screen confirm capacity report test test-fast lint bench clean-results cost

install:
	envs/install.sh embedded

install-harness:
	envs/install.sh harness

# Deployment jobs also write their progress lines to this terminal (specstudy/progress.py).
study screen confirm capacity: export SPECSTUDY_PROGRESS_TTY = 1

study: install
	$(BIN)/snakemake --profile $(PROFILE) all

screen confirm capacity report: install
	$(BIN)/snakemake --profile $(PROFILE) $@

test: install
	tests/slurm/ensure-slurm-packages.sh || true
	tests/ensure-chromium.sh || true
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -m "not vllm and not slurm and not study" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check scripts tests benchmarks
	$(BIN)/snakemake --lint

bench: install
	$(BIN)/python benchmarks/loadgen.py
	$(BIN)/snakemake --profile $(PROFILE) results/models/fixture/models.json results/corpora/bundled-open_chat/1/corpus.json
	$(BIN)/python benchmarks/autogroup.py

# What the study will cost before launching it: deployments, cells, requests, wall time, node-hours.
cost: install
	$(BIN)/specstudy plan --cost --config $(CONFIG) --profile $(PROFILE)

clean-results:
	rm -rf results .snakemake
