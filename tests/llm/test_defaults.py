"""Command-wide LLM settings (``recjudge --backend/--server/--device/--dtype <command>``):
they fill what a caller left unset, never what it set, and results stay keyed by the LLM
that ran them."""

from __future__ import annotations

import pytest

from recjudge.llm import LLMConfig, reset_llm_defaults, resolve_llm_config, set_llm_defaults
from recjudge.reward import Judge, JudgeConfig


@pytest.fixture
def defaults():
    tokens = []

    def set_(**kw):
        tokens.append(set_llm_defaults(**kw))

    yield set_
    for t in reversed(tokens):
        reset_llm_defaults(t)


def test_defaults_fill_unset_fields_only(defaults):
    defaults(backend="vllm", dtype="float32", vllm_args={"max_model_len": 2048})
    by_name = resolve_llm_config("smollm2-135m")
    assert (by_name.backend, by_name.dtype, by_name.vllm_args) == (
        "vllm", "float32", {"max_model_len": 2048})  # fmt: skip
    pinned = resolve_llm_config(LLMConfig(model="smollm2-135m", backend="transformers",
                                          dtype="bfloat16"))  # fmt: skip
    assert (pinned.backend, pinned.dtype) == ("transformers", "bfloat16")


def test_a_server_url_means_the_server_backend_and_reset_restores(defaults):
    assert resolve_llm_config("smollm2-135m").backend == "transformers"
    defaults(base_url="http://127.0.0.1:8000/v1")
    got = resolve_llm_config("smollm2-135m")
    assert (got.backend, got.base_url) == ("openai-compatible", "http://127.0.0.1:8000/v1")


def test_defaults_end_with_their_reset():
    token = set_llm_defaults(device="cpu")
    assert resolve_llm_config("smollm2-135m").device == "cpu"
    reset_llm_defaults(token)
    assert resolve_llm_config("smollm2-135m").device == "auto"


@pytest.mark.parametrize(
    "bad", [{"model": "x"}, {"device": "gpu"}, {"backend": "tgi"}, {"dtype": "int8"}]
)
def test_bad_defaults_are_refused(bad):
    with pytest.raises(ValueError):
        set_llm_defaults(**bad)


def test_judgments_made_under_defaults_are_keyed_by_that_llm(defaults):
    """A judge loaded through a server default keys its results as one given that server's
    LLMConfig itself, and apart from the in-process judge's."""
    cfg = JudgeConfig(model="smollm2-135m", mode="no-behavior")
    local = Judge(cfg)._llm_settings()
    url = "http://127.0.0.1:8000/v1"
    explicit = Judge(cfg, llm_config=LLMConfig(model="smollm2-135m", backend="openai-compatible",
                                               base_url=url))._llm_settings()  # fmt: skip
    defaults(base_url=url)
    assert Judge(cfg)._llm_settings() == explicit != local
