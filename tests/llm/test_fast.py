"""The fast engine against plain full forwards of the same token sequences (real SmolLM2, fp32)."""

from __future__ import annotations

import pytest
import torch

import recjudge.llm._fast as fast
import recjudge.llm._fast_attention as attn
import recjudge.llm._fast_loop as fast_loop
from recjudge.llm import EngineJob, SamplingConfig, _fast, _fast_loop
from recjudge.llm._engine import EngineStats
from recjudge.llm._fast import (
    PrefixLRU,
    decode_prompts,
    decode_shared,
    encode_prefix,
    fast_decode,
    fast_shared_prefix_decode,
    supports_fast,
)
from recjudge.reward import Judge, JudgeConfig, request_for

ATOL = 2e-3  # fp32 logits of magnitude ~20; different kernels round differently


@pytest.fixture(scope="module")
def llm32(smollm32):
    return smollm32


def _full_logits(llm, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return llm.model(input_ids=torch.tensor([ids])).logits[0].float()


def _record(n_rows: int, stop_after: dict[int, int]):
    """Callbacks that keep every row's scores per step and stop row r after stop_after[r]."""
    scores: dict[int, list[torch.Tensor]] = {r: [] for r in range(n_rows)}
    tokens: dict[int, list[int]] = {r: [] for r in range(n_rows)}

    def step(s, rows):
        for i, r in enumerate(rows):
            scores[r].append(s[i].clone())

    def accept(r, t):
        tokens[r].append(t)

    def finished(r):
        return len(tokens[r]) >= stop_after.get(r, 10**9)

    return scores, tokens, step, accept, finished


def _use_kernel(monkeypatch, kernel: str) -> None:
    """The CPU flash kernels ("flash") or the sdpa/matmul path other devices take."""
    if kernel == "sdpa":
        monkeypatch.setattr(attn, "_FLASH_CPU", None)
    elif attn._FLASH_CPU is None:
        pytest.skip("this torch has no CPU flash-attention kernel")


def test_smollm2_is_supported(llm32):
    assert supports_fast(llm32.model)


@pytest.mark.parametrize("room", [64, 2])
def test_every_step_matches_a_full_forward_with_rows_leaving(llm32, monkeypatch, room):
    """(``room`` 2: the rows' buffers grow twice while the rows decode.)"""
    monkeypatch.setattr(fast_loop, "FIRST_ROOM", room)
    prefix = llm32.encode("A user watched Heat (1995), Casino (1995) and Fargo (1996). " * 6)
    suffixes = [
        llm32.encode(" Would they watch " + t + "? Answer:")
        for t in ["Up (2009)", "The Godfather: Part II (1974)", "Babe (1995)"]
    ]
    stop = {0: 3, 1: 7, 2: 5}  # rows finish at different steps: the batch shrinks twice
    scores, tokens, step, accept, finished = _record(3, stop)
    out = fast_shared_prefix_decode(
        llm32,
        encode_prefix(llm32, prefix),
        suffixes,
        EngineJob(step, accept, finished, sampling=SamplingConfig(max_new_tokens=20)),
    )
    for r, suffix in enumerate(suffixes):
        assert out[r] == tokens[r] and len(out[r]) == stop[r]
        full = _full_logits(llm32, prefix + suffix + out[r])
        start = len(prefix) + len(suffix) - 1
        for k, got in enumerate(scores[r]):
            torch.testing.assert_close(got, full[start + k], atol=ATOL, rtol=0)
        # greedy: each token is the argmax of its step's scores
        assert out[r] == [int(s.argmax()) for s in scores[r]]


@pytest.mark.parametrize("kernel", ["flash", "sdpa"])
def test_rows_of_several_prefixes_decode_together_as_full_forwards(llm32, monkeypatch, kernel):
    """Several users' rows in one step: each row attends to its own prefix only (prefixes
    of different lengths, rows given interleaved, rows leaving mid-way), and every step's
    scores equal a plain full forward of that row's own prompt; results come back in the
    caller's order. Both attention paths: the CPU flash kernels merged by log-sum-exps, and
    the sdpa/matmul path other devices take."""
    _use_kernel(monkeypatch, kernel)
    prefixes = [
        llm32.encode("A user watched Heat (1995), Casino (1995) and Fargo (1996). " * 3),
        llm32.encode("Another user loved Toy Story (1995) and Babe (1995)."),
        llm32.encode("A third one: " + "Alien (1979), Aliens (1986), " * 5),
    ]
    titles = ["Up (2009)", "Rocky (1976)", "Big (1988)", "Jaws (1975)", "Heat (1995)"]
    suffixes = [llm32.encode(" Would they watch " + t + "? Answer:") for t in titles]
    prefix_of = [2, 0, 1, 0, 2]  # interleaved: the engine orders rows by prefix itself
    stop = {0: 3, 1: 6, 2: 4, 3: 2, 4: 5}
    scores, tokens, step, accept, finished = _record(5, stop)
    kvs = [encode_prefix(llm32, p) for p in prefixes]

    out = fast_decode(
        llm32,
        kvs,
        prefix_of,
        suffixes,
        EngineJob(step, accept, finished, sampling=SamplingConfig(max_new_tokens=20)),
    )
    for r, suffix in enumerate(suffixes):
        assert out[r] == tokens[r] and len(out[r]) == stop[r]
        prompt = prefixes[prefix_of[r]] + suffix
        full = _full_logits(llm32, prompt + out[r])
        for k, got in enumerate(scores[r]):
            torch.testing.assert_close(got, full[len(prompt) - 1 + k], atol=ATOL, rtol=0)


@pytest.mark.parametrize("kernel", ["flash", "sdpa"])
def test_drafts_give_the_steps_of_one_token_at_a_time(llm32, monkeypatch, kernel):
    """Rows fed a draft with their token (several tokens per row in one forward, rows of
    several prefixes, drafts of different lengths, right, wrong part-way, or none): every
    step's scores still equal a full forward of that row's own prompt and tokens, each token
    is its step's argmax, the hooks see one token at a time in order, a row stops where
    ``finished`` says even inside a draft, and the drafts taken save forwards."""
    _use_kernel(monkeypatch, kernel)
    prefixes = [
        llm32.encode("A user watched Heat (1995), Casino (1995) and Fargo (1996). " * 3),
        llm32.encode("Another user loved Toy Story (1995) and Babe (1995)."),
    ]
    titles = ["Up (2009)", "Rocky (1976)", "Big (1988)", "Jaws (1975)"]
    suffixes = [llm32.encode(" Would they watch " + t + "? Answer:") for t in titles]
    prefix_of = [1, 0, 1, 0]
    kvs = [encode_prefix(llm32, p) for p in prefixes]
    stop = {0: 9, 1: 12, 2: 5, 3: 10}
    sampling = SamplingConfig(max_new_tokens=20)
    # the tokens each row takes without drafts: the drafts below are built from them
    _, plain, step, accept, finished = _record(4, stop)
    fast.fast_decode(
        llm32, kvs, prefix_of, suffixes, EngineJob(step, accept, finished, sampling=sampling)
    )
    scores, tokens, step, accept, finished = _record(4, stop)

    def draft(r):
        have, ahead = len(tokens[r]), plain[r][len(tokens[r]) :]
        if r == 0:
            return list(ahead)  # right, past the row's stop
        if r == 1 and ahead:  # right, then wrong from its third token
            return [*ahead[:2], (ahead[min(2, len(ahead) - 1)] + 1) % 1000 + 7][:5]
        if r == 2:
            return []
        return list(ahead[:3]) if have % 2 else []  # right, every other step

    stats = EngineStats()
    out = fast.fast_decode(
        llm32,
        kvs,
        prefix_of,
        suffixes,
        EngineJob(step, accept, finished, sampling=sampling, stats=stats, draft=draft),
    )
    for r, suffix in enumerate(suffixes):
        assert out[r] == tokens[r] and len(out[r]) == stop[r] == len(scores[r])
        prompt = prefixes[prefix_of[r]] + suffix
        full = _full_logits(llm32, prompt + out[r])
        for k, got in enumerate(scores[r]):
            torch.testing.assert_close(got, full[len(prompt) - 1 + k], atol=ATOL, rtol=0)
        assert out[r] == [int(s.argmax()) for s in scores[r]]
    assert stats.draft_accepted > 0 and stats.draft_tokens >= stats.draft_accepted
    # one forward per step, and each taken draft token is a step without one
    assert stats.decode_steps < max(stop.values()) - 1
    assert stats.decode_tokens == sum(stop.values()) - len(stop) + (
        stats.draft_tokens - stats.draft_accepted
    )


def test_several_prefixes_on_the_invariant_engine_equal_one_prefix_at_a_time(llm32):
    prefixes = [llm32.encode("History: Alien (1979); Jaws (1975)."),
                llm32.encode("History: Babe (1995); Up (2009); Big (1988).")]  # fmt: skip
    suffixes = [llm32.encode(f" Candidate {c}. Verdict:") for c in ("Rocky", "Heat", "Fargo")]
    prefix_of = [1, 0, 1]
    both, _, step, accept, finished = _record(3, {r: 3 for r in range(3)})
    decode_shared(
        llm32,
        prefixes,
        prefix_of,
        suffixes,
        EngineJob(step, accept, finished, deterministic=True, rows=2),
    )
    for r in range(3):
        alone, _, step_a, acc_a, fin_a = _record(1, {0: 3})
        decode_shared(
            llm32,
            [prefixes[prefix_of[r]]],
            [0],
            [suffixes[r]],
            EngineJob(step_a, acc_a, fin_a, deterministic=True, rows=2),
        )
        for a, b in zip(alone[0], both[r], strict=True):
            assert torch.equal(a, b)  # batch-invariant: bit-identical
    with pytest.raises(ValueError, match="prefix_of"):
        decode_shared(llm32, prefixes, [0, 2, 1], suffixes, EngineJob(step, accept, finished))


def test_a_row_alone_and_in_a_batch_agree(llm32):
    prefix = llm32.encode("History: Alien (1979); Aliens (1986); Jaws (1975).")
    suffixes = [llm32.encode(f" Candidate {c}. Verdict:") for c in ("Rocky", "Up", "Heat", "Big")]
    steps = {r: 4 for r in range(4)}
    kv = encode_prefix(llm32, prefix)
    batch, _, step_b, acc_b, fin_b = _record(4, steps)
    fast_shared_prefix_decode(llm32, kv, suffixes, EngineJob(step_b, acc_b, fin_b))
    for r in range(4):
        alone, _, step_a, acc_a, fin_a = _record(1, {0: 4})
        fast_shared_prefix_decode(llm32, kv, [suffixes[r]], EngineJob(step_a, acc_a, fin_a))
        for a, b in zip(alone[0], batch[r], strict=True):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_prompts_without_a_shared_prefix_and_the_invariant_engine_agree(llm32):
    prompts = [
        llm32.encode("The capital of France is"),
        llm32.encode("Two plus two equals"),
        llm32.encode("The capital of Italy is"),
    ]
    runs = {}
    for deterministic in (False, True):
        scores, tokens, step, accept, finished = _record(3, {0: 4, 1: 4, 2: 4})
        decode_prompts(
            llm32, prompts, EngineJob(step, accept, finished, deterministic=deterministic, rows=2)
        )
        runs[deterministic] = scores
    for r in range(3):
        for a, b in zip(runs[False][r], runs[True][r], strict=True):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_shared_decode_caches_the_prefix_once_per_backend(llm32):
    lru = PrefixLRU(slots=1)
    llm32.prefixes, old = lru, getattr(llm32, "prefixes", None)
    try:
        prefix = llm32.encode("Shared prompt prefix for caching.")
        for _ in range(2):
            _, _, step, accept, finished = _record(1, {0: 1})
            decode_shared(
                llm32, [prefix], [0], [llm32.encode(" x")], EngineJob(step, accept, finished)
            )
        assert len(lru._items) == 1
        decode_shared(
            llm32, [prefix[:-1]], [0], [llm32.encode(" y")], EngineJob(step, accept, lambda r: True)
        )
        assert len(lru._items) == 1 and ("fast", tuple(prefix[:-1])) in lru._items
    finally:
        llm32.prefixes = old


def test_free_text_generate_is_greedy_under_a_full_forward(llm32):
    """generate() without processors runs on the fast engine: every token it emits is (up to
    rounding) the argmax of a plain full forward over the text so far, and it stops at EOS."""
    prompts = [
        llm32.chat_prompt([{"role": "user", "content": "Name a famous movie."}]),
        llm32.chat_prompt([{"role": "user", "content": "Say hello in French."}]),
    ]
    outs = llm32.generate(prompts, sampling=SamplingConfig(max_new_tokens=16))
    eos = llm32.tokenizer.eos_token_id
    for prompt, out in zip(prompts, outs, strict=True):
        ids = llm32.encode(prompt)
        assert out.prompt_tokens == len(ids) and out.token_ids and eos not in out.token_ids
        full = _full_logits(llm32, ids + out.token_ids)
        for k, tok in enumerate(out.token_ids):
            row = full[len(ids) - 1 + k]
            assert row[tok] >= row.max() - ATOL


def test_head_for_allowed_tokens_only_equals_the_full_head(llm32, ml1m, monkeypatch):
    """The LM head restricted to the grammar's allowed tokens gives the judge's answers and
    probabilities of the full head (the masked scores are -inf either way)."""
    reqs = [request_for(ml1m, "10", c, sigma=s) for c, s in
            (("Heat (1995)", 0.4), ("Fargo (1996)", -0.3), ("Big (1988)", 0.9))]  # fmt: skip
    cfg = JudgeConfig(beta=5.0, max_evidence=2, max_history=15)
    calls = {"restricted": 0}
    real = _fast_loop._Head.__call__

    def spy(self, hidden, rows):
        out, columns = real(self, hidden, rows)
        calls["restricted"] += columns is not None
        assert columns is None or bool(
            torch.isinf(out).sum(1).eq(out.shape[1] - len(columns)).all()
        )
        return out, columns

    monkeypatch.setattr(_fast_loop._Head, "__call__", spy)
    restricted = Judge(cfg, llm=llm32).judge_many(reqs)
    assert calls["restricted"] > 0
    monkeypatch.setattr(_fast_loop._Head, "MAX_SHARE", 0.0)  # never restrict
    _fast.prefixes_of(llm32).clear()
    full = Judge(cfg, llm=llm32).judge_many(reqs)
    for a, b in zip(restricted, full, strict=True):
        assert (a.is_relevant, a.raw_text) == (b.is_relevant, b.raw_text)
        assert a.p_yes == pytest.approx(b.p_yes, abs=1e-4)
        assert a.p_yes_semantic == pytest.approx(b.p_yes_semantic, abs=1e-4)


def test_the_prefix_lru_holds_one_calls_prefixes_and_no_more():
    lru = PrefixLRU(slots=2)
    four = [[i] for i in range(4)]
    lru.reserve("fast", four)  # a call of four users
    for p in four:
        lru.get("fast", p, lambda: object())
    assert len(lru._items) == 4
    lru.reserve("fast", [[9]])  # the next call needs one: back to the base size, oldest dropped
    assert list(lru._items) == [("fast", (2,)), ("fast", (3,))]
    # A call on the first user of a large call finds its prefix: the others make room.
    lru.reserve("fast", four)
    for p in four:
        lru.get("fast", p, lambda: object())
    lru.reserve("fast", [[0]])
    assert ("fast", (0,)) in lru._items and len(lru._items) == 2
    built = []
    lru.get("fast", [0], lambda: built.append(1))
    assert not built  # read, not encoded again
    lru.reserve("invariant", [[0]])  # another engine's entry of the same ids is not this one
    assert len(lru._items) == 2


def test_sampled_rows_draw_the_same_tokens_with_drafts(llm32):
    """Sampling reads a draft's positions in order with the row's own generator, one draw
    per token as without drafts: the same seeds give the same tokens (fp32)."""
    prefix = llm32.encode("A user watched Heat (1995), Casino (1995) and Fargo (1996). " * 2)
    suffixes = [llm32.encode(f" Would they watch {t}? Say why:") for t in ("Up", "Big", "Jaws")]
    kv = encode_prefix(llm32, prefix)
    sampling = SamplingConfig(do_sample=True, temperature=0.8, top_p=0.95, max_new_tokens=12)
    _, plain, step, accept, finished = _record(3, {})
    fast.fast_decode(
        llm32,
        [kv],
        [0, 0, 0],
        suffixes,
        EngineJob(step, accept, finished, sampling=sampling, seeds=[5, 6, 7]),
    )
    _, tokens, step, accept, finished = _record(3, {})
    stats = EngineStats()
    out = fast.fast_decode(
        llm32,
        [kv],
        [0, 0, 0],
        suffixes,
        EngineJob(
            step,
            accept,
            finished,
            sampling=sampling,
            seeds=[5, 6, 7],
            stats=stats,
            draft=lambda r: plain[r][len(tokens[r]) : len(tokens[r]) + 4],
        ),
    )
    assert out == [plain[r] for r in range(3)] and all(len(o) == 12 for o in out)
    assert stats.draft_accepted > 0
