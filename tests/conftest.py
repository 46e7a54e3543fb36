"""Shared fixtures: the real SmolLM2 backend and real MovieLens data, loaded once per session."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

import recjudge.evaluators.gist._pipeline as pipeline
from recjudge.data import load_dataset
from recjudge.llm import DTYPE_ENV, LLMConfig, auto_dtype, load_llm, resolve_model_path

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
    return load_llm("smollm2-135m")


@pytest.fixture(scope="session")
def smollm32():
    """SmolLM2 in fp32 whatever the CPU: for tests that compare two computations of the same
    numbers (batch vs single, engine vs engine), where bf16 rounding (picked by ``dtype="auto"``
    on CPUs with native bf16) would differ by kernel and batch shape, not by mechanism."""
    return load_llm(LLMConfig(model="smollm2-135m", dtype="float32"))


@pytest.fixture(scope="session")
def ml1m():
    return load_dataset("ml-1m")


@pytest.fixture(scope="session")
def ml100k():
    return load_dataset("ml-100k")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama (2 layers of width 32) in a model folder with SmolLM2's tokenizer
    files: tuning and scoring tests run on it in seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    base = resolve_model_path("smollm2-135m")
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    cfg = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=4096, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(base / f, out / f)
    return out


@pytest.fixture(autouse=True)
def _own_gist_answers(monkeypatch, tmp_path_factory):
    """Each test gets its own store of shared GISTBench judge answers (the real one lives in
    the cache and would carry answers from test to test and from run to run)."""
    path = tmp_path_factory.mktemp("gist-answers") / "judge-answers.sqlite"
    monkeypatch.setattr(pipeline, "judge_answers_path", lambda: path)
