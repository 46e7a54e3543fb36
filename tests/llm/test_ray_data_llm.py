"""The driver's half of vLLM on Ray Data LLM workers: it holds the tokenizer and runs
nothing, a result is found again by everything the engine reads of its request, rows
survive Ray Data's numpy conversion, and the stage is configured with recjudge's engine (its
processor, grammar backend, watched log-probabilities) on CPU or GPU bundles. The driver's
calls fed with results are ``tests/decoding/test_remote.py``'s; the run itself (vLLM in Ray
Data LLM's stage) is ``make test-vllm``'s."""

from __future__ import annotations

import numpy as np
import pytest

from recjudge.llm import (
    PROCESSORS,
    EngineBackend,
    EngineRequest,
    LLMConfig,
    RayDataLLM,
    SamplingConfig,
    model_source,
)
from recjudge.llm._ray_data_llm import engine_row, fingerprint, processor_config, result_row


def _req(**kw) -> EngineRequest:
    base = {"prompt_ids": [1, 2, 3], "grammar": 'root ::= "x"', "payload": '{"beta": 1}',
            "watch": [7, 8], "sampling": SamplingConfig(), "seed": 0}  # fmt: skip
    base.update(kw)
    return EngineRequest(**base)


@pytest.fixture(scope="module")
def engine():
    return RayDataLLM(LLMConfig(model="smollm2-135m", backend="vllm", dtype="float32"))


def test_a_fingerprint_follows_everything_the_engine_reads():
    a = fingerprint(_req())
    assert a == fingerprint(_req())
    changed = [_req(prompt_ids=[1, 2, 4]), _req(grammar='root ::= "y"'), _req(payload=None),
               _req(watch=[7]), _req(seed=1),
               _req(sampling=SamplingConfig(max_new_tokens=7))]  # fmt: skip
    assert len({a, *map(fingerprint, changed)}) == len(changed) + 1


def test_the_driver_backend_builds_requests_and_runs_nothing(engine):
    """Its requests are data that the executor runs (``decoding.engine_stage``,
    ``run_requests``): asked to run them itself, it says where they go."""
    assert isinstance(engine, EngineBackend)
    assert engine.capabilities.engine_constraints and not engine.capabilities.option_scoring
    with pytest.raises(NotImplementedError, match="engine_stage"):
        engine.submit([_req()])


def test_the_driver_reads_the_tokenizer_and_vocabulary_vllm_would(engine):
    from transformers import AutoConfig

    src, _ = model_source("smollm2-135m")
    assert engine.vocab_size == AutoConfig.from_pretrained(src).vocab_size
    assert (
        engine.encode("Heat (1995)")
        == engine.tokenizer("Heat (1995)", add_special_tokens=False)["input_ids"]
    )
    with pytest.raises(NotImplementedError, match="constrained engine requests"):
        engine.generate(["hi"])


def test_rows_are_the_vllm_stages_format_and_read_back_from_numpy():
    r, plain = _req(), _req(payload=None, watch=[])
    row, other = engine_row("f", r), engine_row("g", plain)
    assert row["tokenized_prompt"] == [1, 2, 3] and row["fp"] == "f"
    sp = row["sampling_params"]
    assert sp["structured_outputs"] == {"grammar": r.grammar}
    assert sp["extra_args"] == {"recjudge": r.payload} and sp["logprob_token_ids"] == [7, 8]
    assert sp["temperature"] == 0.0 and sp["max_tokens"] == r.sampling.max_new_tokens
    # every row has the same keys (Arrow would fill a missing one with null anyway)
    assert set(other["sampling_params"]) == set(sp)
    assert other["sampling_params"]["extra_args"] is None
    # what the vLLM stage gives back, as Ray Data hands it over (arrays, dicts by token id)
    fp, res = result_row(
        {
            "fp": np.str_("f"),
            "generated_tokens": np.array([5, 6]),
            "logprobs": [
                {
                    7: {"logprob": -0.25, "rank": 1, "decoded_token": "a"},
                    8: {"logprob": -1.5, "rank": 2, "decoded_token": "b"},
                },
                {7: {"logprob": -3.0, "rank": 4, "decoded_token": "a"}},
            ],
        }
    )
    assert fp == "f" and res.token_ids == [5, 6]
    assert res.step_logprobs == [{7: -0.25, 8: -1.5}, {7: -3.0}]
    _, empty = result_row({"fp": "g", "generated_tokens": None, "logprobs": None})
    assert empty.token_ids == [] and empty.step_logprobs == []


@pytest.mark.parametrize("gpus", [0.0, 1.0])
def test_the_stage_runs_recjudges_engine_on_the_bundle_asked_for(gpus):
    pytest.importorskip("ray.data.llm")
    cfg = processor_config(LLMConfig(model="smollm2-135m", backend="vllm", dtype="float32",
                                     vllm_args={"max_model_len": 2048}),
                           actors=3, threads=2, gpus=gpus)  # fmt: skip
    kw = cfg.engine_kwargs
    assert "model" not in kw and kw["max_model_len"] == 2048
    assert kw["logits_processors"][0] in PROCESSORS.values()
    assert kw["structured_outputs_config"] == {"backend": "xgrammar"}
    assert kw["max_logprobs"] == 128 and kw["dtype"] == "float32"
    assert cfg.runtime_env["env_vars"]["VLLM_USE_V2_MODEL_RUNNER"] in ("0", "1")
    bundle = cfg.placement_group_config["bundles"][0]
    assert bundle["CPU"] == 2.0 and bundle.get("GPU", 0.0) == gpus
    assert cfg.concurrency == 3
