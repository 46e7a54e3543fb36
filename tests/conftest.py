"""Shared fixtures: the real SmolLM2 backend and real MovieLens data, loaded once per session."""

from __future__ import annotations

import importlib.util
import os

import pytest

# The vLLM parity tests run only in the vLLM environment (`make test-vllm`).
collect_ignore = [] if importlib.util.find_spec("vllm") else ["llm/test_vllm_parity.py"]

# Small torch ops are slower with 2 threads than 1 on this class of machine; tests are
# dominated by them, so keep one thread unless told otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_xdist_auto_num_workers(config):
    """Worker processes for ``-n auto`` (set in pyproject's addopts).

    One per core up to 4: each worker loads its own SmolLM2 and datasets (about 1.5 GB), and
    the suite has too few heavy tests to keep more busy. ``RECJUDGE_TEST_WORKERS`` overrides
    (``-n 0`` runs in one process, e.g. under a debugger).
    """
    wanted = os.environ.get("RECJUDGE_TEST_WORKERS")
    if wanted:
        return int(wanted)
    return max(1, min(len(os.sched_getaffinity(0)), 4))


@pytest.fixture(scope="session")
def smollm():
    from recjudge.llm import load_llm

    return load_llm("smollm2-135m")


@pytest.fixture(scope="session")
def smollm32():
    """SmolLM2 in fp32 whatever the CPU: for tests that compare two computations of the same
    numbers (batch vs single, engine vs engine), where bf16 rounding (picked by ``dtype="auto"``
    on CPUs with native bf16) would differ by kernel and batch shape, not by mechanism."""
    from recjudge.llm import LLMConfig, load_llm

    return load_llm(LLMConfig(model="smollm2-135m", dtype="float32"))


@pytest.fixture(scope="session")
def ml1m():
    from recjudge.data import load_dataset

    return load_dataset("ml-1m")


@pytest.fixture(scope="session")
def ml100k():
    from recjudge.data import load_dataset

    return load_dataset("ml-100k")
