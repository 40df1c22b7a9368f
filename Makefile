# specstudy — `make study` runs the embedded default end to end; `make test` runs the test suite.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
# Rules call the `specstudy` CLI: make the venv's scripts visible to Snakemake's shell commands.
export PATH := $(abspath $(BIN)):$(PATH)
CORES ?= 2
PROFILE ?= profiles/local
PYTEST_ARGS ?=

.PHONY: install install-harness study screen confirm capacity report test test-fast lint bench clean-results

install:
	envs/install.sh embedded

install-harness:
	envs/install.sh harness

study: install
	$(BIN)/snakemake --profile $(PROFILE) all

screen confirm capacity report: install
	$(BIN)/snakemake --profile $(PROFILE) $@

# Outside CI a Slurm install that cannot happen is reported and the slurm tests skip with its reason;
# under CI=true (.ci/run) it fails the run, and so does any skipped test (tests/ci_skips.py).
test: install
	tests/slurm/ensure-slurm-packages.sh
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -m "not vllm and not slurm and not study" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check scripts tests benchmarks
	$(BIN)/snakemake --lint

bench: install
	$(BIN)/python benchmarks/loadgen.py
	$(BIN)/snakemake --profile $(PROFILE) results/models/fixture/models.json results/corpora/bundled-open_chat/2/corpus.json
	$(BIN)/python benchmarks/autogroup.py

clean-results:
	rm -rf results .snakemake
