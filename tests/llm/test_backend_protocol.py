"""The backends say, on a Protocol, everything their callers use: the local model's members
for the fast engine, the engine's for decoding's requests (no ``getattr`` probing)."""

from __future__ import annotations

import importlib
import typing

from recjudge.llm import BACKENDS, EngineBackend, LLMBackend, LLMConfig, LocalModel


def test_the_local_backend_is_a_local_model_and_not_an_engine(smollm):
    assert isinstance(smollm, LLMBackend) and isinstance(smollm, LocalModel)
    assert not isinstance(smollm, EngineBackend)
    assert isinstance(smollm.config, LLMConfig) and smollm.device == "cpu"


def test_the_engine_backends_declare_what_decoding_sends_them():
    for name in ("vllm", "openai-compatible"):
        module, cls = BACKENDS.get(name).target.split(":")
        backend = getattr(importlib.import_module(module), cls)
        for member in ("submit", "next_logprobs", "chat_prompt", "encode", "generate",
                       "next_token_logits"):  # fmt: skip
            assert callable(getattr(backend, member, None)), (name, member)
        assert hasattr(backend, "needs_bias_probe")


def test_the_backend_registry_holds_every_backend_llmconfig_accepts():
    names = typing.get_args(LLMConfig.model_fields["backend"].annotation)
    assert sorted(names) == sorted(BACKENDS.names())
