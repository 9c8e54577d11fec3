# Common entry points. `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: help setup setup-eval test lint quality format bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup:  ## build .venv (GPU training stack, or the CPU dev stack without a GPU)
	bash scripts/setup.sh

setup-eval:  ## build .venv-eval with EvalScope (kept apart from verl's Hydra)
	bash scripts/setup.sh --eval

lint:  ## ruff lint + format check, shellcheck of every launcher
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/shellcheck -x recipes/*.sh scripts/*.sh .ci/run

quality: lint  ## alias of lint

format:  ## apply ruff fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: lint  ## lint, then the whole CPU test suite
	$(PY) -m pytest

bench:  ## reward throughput: ours vs verl's built-in scorer
	$(PY) scripts/bench_reward.py

clean:  ## remove caches (keeps the environments)
	rm -rf .pytest_cache .ruff_cache .hypothesis build *.egg-info
