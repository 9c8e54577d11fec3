# Common entry points. `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: help setup lock wheelhouse setup-train setup-eval setup-gpu-stack check-gpu-stack test test-fast lint quality format bench-cpu clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup:  ## build everything `make test` needs: .venv (GPU or CPU training stack) and .venv-eval (FLASH_ATTN=auto|2|4|none: docs/gpu.md)
	bash scripts/setup.sh
	bash scripts/setup.sh --eval

setup-train:  ## build .venv alone (GPU training stack, or the CPU training stack without a GPU)
	bash scripts/setup.sh

setup-eval:  ## build .venv-eval alone: EvalScope, kept apart from verl's Hydra
	bash scripts/setup.sh --eval

lock:  ## write locks/*.txt again from pyproject.toml's pins (each lock's versions kept where the pins allow; UPGRADE=1: the newest): docs/guide.md#set-up
	bash scripts/setup.sh --lock

wheelhouse:  ## STACK=cpu|gpu|gpu-flash4|eval|eval-http DIR=folder [EXCLUDE=names]: that lock's files, for a machine without internet (then make setup WHEELHOUSE=folder there): docs/guide.md#set-up
	bash scripts/setup.sh --wheelhouse "$(STACK)" "$(DIR)"

setup-gpu-stack:  ## build .venv-gpu: a GPU machine's .venv (torch 2.11, vLLM 0.24), here without a GPU (its size: docs/gpu.md)
	bash scripts/setup.sh --gpu-stack

check-gpu-stack: setup-gpu-stack  ## the GPU stack's checks that need no GPU (docs/gpu.md; part of make test)
	$(PY) -m pytest tests/test_gpu_stack.py

lint:  ## ruff lint + format check, shellcheck of every launcher
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/shellcheck -x recipes/*.sh scripts/*.sh scripts/python slurm/*.sbatch .ci/run

quality: lint  ## alias of lint

format:  ## apply ruff fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Two pytest-xdist workers: the two chains of training runs side by side, one on each, then
# everything else (tests/conftest.py, SERIAL_GROUPS).
TEST_WORKERS ?= 2

test: lint  ## lint, then the whole CPU test suite, real CPU training included (its time: docs/testing.md)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

test-fast:  ## the suite without the slow tests (no training runs): for iteration, not for CI
	$(PY) -m pytest -m "not slow"

bench-cpu:  ## smoke_tiny on this CPU: wall time, time to each step, phases, peak memory
	$(PY) -m verl_gsm8k.bench.cpu_train

clean:  ## remove caches (keeps the environments)
	rm -rf .pytest_cache .ruff_cache .hypothesis build *.egg-info
