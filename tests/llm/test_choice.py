"""Whole-option choice: the exact search against scoring every option with plain forwards
(real SmolLM2, fp32)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from _choice_data import FILLS, OPTIONS

import recjudge.llm._vllm as vllm_mod
from recjudge.decoding import CapabilityError, OptionJob, decode
from recjudge.evaluators.gist._gist import taxonomy_full_messages
from recjudge.llm import OptionTrie, best_options, option_tokens
from recjudge.llm._vllm import SCORING_ENGINE, _EngineMixin
from recjudge.reward import SLOT, choose, choose_shared

TOL = 2e-2  # summed fp32 log-probabilities of ~10 tokens; kernels round differently


def _messages():
    return taxonomy_full_messages(OPTIONS)  # the category question, slot at the end


def _exhaustive(llm, fill: str) -> list[float]:
    """Every option's summed log-probability: the shared prompt once through HF's own
    forward with its KV cache, then each option's tokens on a copy of that cache (plain
    transformers, none of the engine's code)."""
    text = llm.chat_prompt(_messages()).replace(" " + SLOT, " " + fill)
    base = llm.encode(text + '{"category')
    with torch.inference_mode():
        head = llm.model(input_ids=torch.tensor([base]), use_cache=True)
    out = []
    for o in OPTIONS:
        whole = llm.encode(text + '{"category": "' + o + '"}')
        assert whole[: len(base)] == base
        rest = whole[len(base) :]
        with torch.inference_mode():
            tail = llm.model(
                input_ids=torch.tensor([rest]),
                past_key_values=copy.deepcopy(head.past_key_values),
                use_cache=True,
            )
        logits = torch.cat([head.logits[0, -1:], tail.logits[0, :-1]]).float()
        lp = torch.log_softmax(logits, -1)
        out.append(sum(float(lp[j, t]) for j, t in enumerate(rest)))
    return out


def test_the_choice_is_the_exhaustive_argmax_with_its_score(smollm32):
    got = choose_shared(smollm32, _messages(), FILLS, OPTIONS, answer_key="category")
    assert len(got) == len(FILLS)
    for fill, b in zip(FILLS, got, strict=True):
        scores = _exhaustive(smollm32, fill)
        assert scores[b.index] >= max(scores) - TOL, fill
        assert b.logprob == pytest.approx(scores[b.index], abs=TOL)


def test_the_width_of_a_round_does_not_change_the_answer(smollm32):
    one = choose_shared(smollm32, _messages(), FILLS, OPTIONS, answer_key="category", width=1)
    many = choose_shared(smollm32, _messages(), FILLS, OPTIONS, answer_key="category", width=64)
    for a, b in zip(one, many, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=TOL)


def test_an_option_that_is_a_prefix_of_another_is_scored_on_its_own(smollm32):
    msgs = _messages()
    for only in (["Comedy"], ["Comedy Challenges"]):
        (b,) = choose_shared(smollm32, msgs, ["Comedy and Adventure"], only, answer_key="category")
        assert b.index == 0
    both = choose_shared(
        smollm32, msgs, ["Comedy and Adventure"], ["Comedy", "Comedy Challenges"],
        answer_key="category",
    )[0]  # fmt: skip
    scores = _exhaustive(smollm32, "Comedy and Adventure")
    assert both.logprob == pytest.approx(max(scores[0], scores[1]), abs=TOL)


def test_independent_questions_with_their_own_options_match_the_shared_slot(smollm32):
    shared = choose_shared(smollm32, _messages(), FILLS[:2], OPTIONS, answer_key="category")
    chats = [
        [{**m, "content": m["content"].replace(SLOT, fill)} for m in _messages()]
        for fill in FILLS[:2]
    ]
    flipped = OPTIONS[::-1]  # a question's own options, in its own order
    own = choose(smollm32, chats, [OPTIONS, flipped], answer_key="category")
    assert own[0].logprob == pytest.approx(shared[0].logprob, abs=TOL)
    assert own[1].logprob == pytest.approx(shared[1].logprob, abs=TOL)
    with pytest.raises(ValueError, match="option lists"):
        choose(smollm32, chats, [OPTIONS])


def test_option_tokens_follow_the_whole_text_split():
    def encode(text: str) -> list[int]:  # one id per character: every split is exact
        return [ord(ch) for ch in text]

    assert option_tokens(encode, '{"k', ['": "a"}']) == [[ord(c) for c in '": "a"}']]


def test_the_trie_refuses_empty_and_duplicate_options():
    with pytest.raises(ValueError, match="no options"):
        OptionTrie([])
    with pytest.raises(ValueError, match="no tokens"):
        OptionTrie([[1], []])
    with pytest.raises(ValueError, match="same tokens"):
        OptionTrie([[1, 2], [1, 2]])
    trie = OptionTrie([[1, 2], [1, 2, 3], [4]])
    assert trie.size == 4  # 1, 1-2, 1-2-3, 4


def test_a_backend_without_option_scoring_is_refused(smollm32, monkeypatch):
    off = replace(smollm32.capabilities, option_scoring=False)
    monkeypatch.setattr(smollm32, "capabilities", off)
    with pytest.raises(ValueError, match="does not score whole options"):
        best_options(smollm32, [1, 2], [[3]], OptionTrie([[4]]))
    # through decoding's one entry point: a fault of the whole run, in one line
    with pytest.raises(CapabilityError, match="whole-option scoring.*does not declare"):
        decode(smollm32, OptionJob([1, 2], [[3]], OptionTrie([[4]])))


def test_an_option_job_is_best_options_behind_decode(smollm32):
    prefix = smollm32.encode("Pick a colour: red, green or blue. Answer:")
    trie = OptionTrie([smollm32.encode(w) for w in (" red", " green", " blue")])
    ctxs = [smollm32.encode(" I pick"), smollm32.encode(" The sky is")]
    assert decode(smollm32, OptionJob(prefix, ctxs, trie, width=2)) == best_options(
        smollm32, prefix, ctxs, trie, width=2
    )
    with pytest.raises(ValueError, match="empty context"):
        OptionJob(prefix, [[]], trie)


class _ForwardEngine:
    """An engine backend (vLLM's interface: ``next_logprobs`` through ``_step_logprobs``)
    answered by plain full forwards of the transformers model: the engine path of the
    search, its watch-list split included (``MAX_WATCH`` lowered), without vLLM."""

    def __init__(self, hf):
        self.hf, self.name, self.calls = hf, "forward-engine", 0
        self.tokenizer, self.encode, self.chat_prompt = hf.tokenizer, hf.encode, hf.chat_prompt
        self.capabilities = SCORING_ENGINE
        self.next_logprobs = _EngineMixin.next_logprobs.__get__(self)
        self._first: list[int] | None = None
        self._bases: dict[int, object] = {}  # HF KV caches of the first prompt's prefixes

    def _logits(self, p: list[int]) -> torch.Tensor:
        """The last position's logits of ``p``: HF's own forward, the part ``p`` shares with
        the first prompt asked read from HF's KV cache of it (as vLLM's prefix caching
        would: every prompt of the search is the question plus a short continuation; a
        full forward of each made this test ~10x slower on fp32 CPUs without AMX)."""
        if self._first is None:
            self._first = list(p)
        same = [a == b for a, b in zip(p, self._first, strict=False)]
        n = same.index(False) if False in same else len(same)
        n = min(n, len(p) - 1)  # at least one token computed here
        if n == 0:
            return self.hf.model(input_ids=torch.tensor([p])).logits[0, -1]
        if n not in self._bases:
            out = self.hf.model(input_ids=torch.tensor([p[:n]]), use_cache=True)
            self._bases[n] = out.past_key_values
        rest = self.hf.model(input_ids=torch.tensor([p[n:]]), use_cache=True,
                             past_key_values=copy.deepcopy(self._bases[n]))  # fmt: skip
        return rest.logits[0, -1]

    def _step_logprobs(self, prompts, watch):
        self.calls += len(prompts)
        out = []
        for p, w in zip(prompts, watch, strict=True):
            with torch.inference_mode():
                lp = torch.log_softmax(self._logits(list(p)).float(), -1)
            out.append({int(t): float(lp[t]) for t in w})
        return out


def test_the_engine_search_finds_the_local_searchs_options(smollm32, monkeypatch):
    monkeypatch.setattr(vllm_mod, "MAX_WATCH", 3)  # the root's children come in parts
    engine = _ForwardEngine(smollm32)
    fills = FILLS[:2]  # each prompt of the engine path is a forward of its own here
    local = choose_shared(smollm32, _messages(), fills, OPTIONS, answer_key="category")
    got = choose_shared(engine, _messages(), fills, OPTIONS, answer_key="category")
    for a, b in zip(local, got, strict=True):
        assert a.index == b.index
        assert a.logprob == pytest.approx(b.logprob, abs=TOL)
    assert engine.calls > len(fills)


def test_one_token_options_end_the_search_at_the_root_on_both_paths(smollm32):
    """Options of one token each: no path is expanded; the choice is the root's argmax
    among them, on the fast engine and (several questions in lockstep) on an engine."""
    prefix = smollm32.encode("Pick a colour: red, green or blue. Answer:")
    opts = [smollm32.encode(w)[:1] for w in (" red", " green", " blue")]
    ctxs = [smollm32.encode(" I pick"), smollm32.encode(" The sky is")]
    trie = OptionTrie(opts)
    for backend in (smollm32, _ForwardEngine(smollm32)):
        got = best_options(backend, prefix, ctxs, trie)
        for ctx, b in zip(ctxs, got, strict=True):
            with torch.inference_mode():
                logits = smollm32.model(input_ids=torch.tensor([prefix + ctx])).logits[0, -1]
            lp = torch.log_softmax(logits.float(), -1)
            scores = [float(lp[o[0]]) for o in opts]
            assert b.expanded == 0 and b.index == scores.index(max(scores))
            assert b.logprob == pytest.approx(max(scores), abs=TOL)
