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


def pytest_report_header(config):
    from recjudge.llm import DTYPE_ENV, auto_dtype

    forced = os.environ.get(DTYPE_ENV)
    why = f"${DTYPE_ENV}={forced}" if forced else "this CPU's choice"
    return f"recjudge: dtype auto = {auto_dtype()} ({why})"


def pytest_collection_modifyitems(config, items):
    """Mark ``model`` every test that computes with the real model in the auto dtype: those
    that take the ``smollm`` fixture, and the few that run it through the CLI (marked by
    hand). ``make test-other-dtype`` runs them again under the other dtype."""
    for item in items:
        if "smollm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def smollm():
    """SmolLM2 in the auto dtype: bf16 on CPUs with native bf16, else fp32, or whatever
    ``$RECJUDGE_DTYPE`` forces (the suite's second leg). A test that takes it asserts what
    the code guarantees whatever the model writes in either dtype."""
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
