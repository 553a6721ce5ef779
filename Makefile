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

# The demo's database lives in the ignored .venv and is recreated on every run: the demo
# never reads or writes your own sessions (those default to ~/.local/share/zerda).
DEMO_DB := $(VENV)/demo.sqlite3
ZERDA   := $(BIN)/zerda --db $(DEMO_DB)

demo: $(VENV)/.core
	@rm -f $(DEMO_DB) $(DEMO_DB)-wal $(DEMO_DB)-shm
	@echo "== A coffee order with tool calls, imported into a SQLite store: $(DEMO_DB)"
	@echo "   (a demo database, recreated on every run; your own sessions are not touched)"
	$(ZERDA) import examples/coffee-order.jsonl --session demo
	@echo
	@echo "== What the model sees within 300 tokens: the pinned system prompt and the newest"
	@echo "   whole turns; older turns are evicted, a tool call never without its result"
	$(ZERDA) show demo --context --token-limit 300
	@echo
	@echo "== The sessions in the store"
	$(ZERDA) sessions
	@echo
	@echo "Try: $(ZERDA) show demo        (every turn, with tokens)"
	@echo "     $(ZERDA) show demo --context --k 1"
	@echo "     $(ZERDA) export demo"
	@echo "     $(BIN)/zerda replay examples/coffee-order.jsonl --token-limit 200,300"

lint: $(VENV)/.dev
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)
	$(BIN)/mypy

format: $(VENV)/.dev
	$(BIN)/ruff check --fix $(CODE)
	$(BIN)/ruff format $(CODE)

# The suite alone (`make lint` checks the code; .ci/run runs both), on two workers
# (pytest-xdist): the suite is hundreds of tests that each wait on a server or a subprocess;
# every test keeps to its own key prefix, schema or folder, so they run side by side.
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set (as on the CI machine): without
# it every worker and every `zerda` subprocess of the tests compiles the package and rewrites
# the test modules again. PYTEST_ARGS adds options: make test PYTEST_ARGS="-k sqlite --lf".
test: $(VENV)/.dev
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n 2 $(PYTEST_ARGS)

bench: $(VENV)/.dev
	$(BIN)/python benchmarks/token_buffer.py
	$(BIN)/python benchmarks/sqlite_store.py
	$(BIN)/python benchmarks/redis_store.py
	$(BIN)/python benchmarks/postgres_store.py
	$(BIN)/python benchmarks/inspector.py
	$(BIN)/python benchmarks/compare.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
