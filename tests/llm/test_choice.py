"""Whole-option choice: the exact search against scoring every option with plain forwards
(real SmolLM2, fp32)."""

from __future__ import annotations

import pytest
import torch

from recjudge.evaluators._gist import taxonomy_full_messages
from recjudge.llm import OptionTrie, best_options, option_tokens
from recjudge.reward import SLOT, choose, choose_shared

# Options sharing first tokens (one a prefix of another), as the 325 categories do.
OPTIONS = [
    "Comedy",
    "Comedy Challenges",
    "Diving",
    "Drama",
    "Disability",
    "Sci-Tech News",
    "Movies & TV Reviews or Commentary",
    "Scripted Dramatic Content",
    "Humorous Moments",
    "Fantasy & Mythology",
]
FILLS = ["Drama and Romance", "Comedy and Adventure", "Sci-Fi films", "scuba diving trips"]
TOL = 2e-2  # summed fp32 log-probabilities of ~10 tokens; kernels round differently


def _messages():
    return taxonomy_full_messages(OPTIONS)  # the category question, slot at the end


def _exhaustive(llm, fill: str) -> list[float]:
    """Every option's summed log-probability: the shared prompt once through HF's own
    forward with its KV cache, then each option's tokens on a copy of that cache (plain
    transformers, none of the engine's code)."""
    import copy

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


def test_a_model_off_the_fast_engine_is_refused(smollm32, monkeypatch):
    import recjudge.llm._fast as fast

    monkeypatch.setattr(fast, "supports_fast", lambda model: False)
    with pytest.raises(ValueError, match="fast engine"):
        best_options(smollm32, [1, 2], [[3]], OptionTrie([[4]]))
