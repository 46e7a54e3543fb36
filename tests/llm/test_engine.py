"""The batch-invariant engine: a row computes the same bits alone as beside any other rows.

Run in both dtypes explicitly, whatever the CPU: the invariance is a property of the engine's
shapes, not of one kernel library, and bf16 on oneDNN/AMX is where a batched prefill broke it.
"""

from __future__ import annotations

import pytest
import torch

from recjudge.llm import EngineJob, LLMConfig, SamplingConfig, load_llm
from recjudge.llm._engine import SUFFIX_BUCKET, constrained_decode, prefill, shared_prefix_decode


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def llm(request):
    return load_llm(LLMConfig(model="smollm2-135m", dtype=request.param))


def _prompts(llm):
    a = llm.encode("Tell me about the films of 1997 and what they share. " * 3)
    b = llm.encode("A user watched Being There, Titanic and Contact; name their interests. " * 3)
    return a, b


def _recorder(n):
    scores: dict[int, list[torch.Tensor]] = {r: [] for r in range(n)}
    tokens: dict[int, list[int]] = {r: [] for r in range(n)}

    def step(s, rows):
        for i, r in enumerate(rows):
            scores[r].append(s[i].clone())

    return scores, tokens, step, lambda r, t: tokens[r].append(t), lambda r: False


def test_prefill_of_a_row_is_the_same_alone_or_beside_others(llm):
    a, b = _prompts(llm)
    alone, _ = prefill(llm, [b])
    for batch in ([a, b], [a, b, a, b], [b, a, a]):
        logits, cache = prefill(llm, batch)
        i = batch.index(b)
        assert torch.equal(logits[i], alone[0]), f"row {i} of {len(batch)} differs from alone"
        assert cache.layers[0].keys.shape[0] == len(batch)


def test_decoded_scores_are_bit_identical_alone_or_batched(llm):
    a, b = _prompts(llm)
    sampling = SamplingConfig(max_new_tokens=4)
    s1, t1, step, accept, fin = _recorder(1)
    constrained_decode(llm, [b], EngineJob(step, accept, fin, sampling=sampling, rows=4))
    s3, t3, step, accept, fin = _recorder(3)
    constrained_decode(llm, [a, b, a], EngineJob(step, accept, fin, sampling=sampling, rows=4))
    assert t1[0] == t3[1]
    assert all(torch.equal(x, y) for x, y in zip(s1[0], s3[1], strict=True))


def test_a_suffix_decodes_the_same_beside_a_longer_one(llm):
    """A neighbour whose suffix pads to a wider bucket must not widen this row's shapes."""
    prefix, _ = _prompts(llm)
    short = llm.encode(" Heat (1995)?")
    long = llm.encode(" The Lord of the Rings: The Fellowship of the Ring (2001), extended cut?")
    assert len(short) <= SUFFIX_BUCKET < len(long)
    sampling = SamplingConfig(max_new_tokens=3)
    s1, t1, step, accept, fin = _recorder(1)
    shared_prefix_decode(llm, prefix, [short], EngineJob(step, accept, fin, sampling=sampling))
    s2, t2, step, accept, fin = _recorder(2)
    shared_prefix_decode(
        llm, prefix, [long, short], EngineJob(step, accept, fin, sampling=sampling)
    )
    assert t1[0] == t2[1]
    assert all(torch.equal(x, y) for x, y in zip(s1[0], s2[1], strict=True))
