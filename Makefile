# Every target builds or reuses .venv; it reinstalls only when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CODE   := $(wildcard src tests benchmarks examples)

.PHONY: demo test lint format bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Zerda needs Python 3.10+; run make PYTHON=python3.x")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Core install: what a user gets from `pip install zerda-memory`.
$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	@touch $@

# Development install: test and lint tools on top.
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@ $(VENV)/.core

demo: $(VENV)/.core
	$(BIN)/python examples/quickstart.py

lint: $(VENV)/.dev
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)
	$(BIN)/mypy

format: $(VENV)/.dev
	$(BIN)/ruff check --fix $(CODE)
	$(BIN)/ruff format $(CODE)

test: lint
	$(BIN)/pytest

bench: $(VENV)/.dev
	$(BIN)/python benchmarks/token_buffer.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
