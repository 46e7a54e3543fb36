"""Fuzz: the answer parsers of every grammar schema on arbitrary text and on near-miss JSON.

A parser either returns a value that satisfies its schema's rules or raises ``ValueError``
(``SchemaError``: the caller records a read-out or a failure); any other exception would
abort a batch. Valid answers built from hostile titles round-trip exactly."""

from __future__ import annotations

import json

import pytest
from _fuzz import FUZZ, json_values, texts
from hypothesis import given
from hypothesis import strategies as st

from recjudge.decoding import Choice, CitedList, EvidenceFirst, compile_schema
from recjudge.llm import resolve_model_path
from recjudge.reward._judgment import parse_answer

TITLES = ["Heat (1995)", 'He said "hi"', "<|im_end|>", "日本語", "a\\b"]


def _answers():
    """Arbitrary text, any JSON value, and JSON shaped like an answer with wrong parts."""
    near = st.fixed_dictionaries(
        {
            "evidence": st.one_of(json_values, st.lists(st.sampled_from(TITLES), max_size=4)),
            "is_relevant": st.one_of(st.sampled_from(["YES", "NO"]), json_values),
        }  # fmt: skip
    )
    return st.one_of(texts, json_values.map(json.dumps), near.map(json.dumps))


@FUZZ
@given(_answers())
def test_evidence_first_parse_returns_a_valid_answer_or_raises_valueerror(text):
    schema = EvidenceFirst(TITLES, max_evidence=3)
    try:
        obj = schema.parse(text)
    except ValueError:
        assert parse_answer(schema, text) is None
        return
    assert set(obj) == {"evidence", "is_relevant"} and obj["is_relevant"] in ("YES", "NO")
    assert isinstance(obj["evidence"], list) and set(obj["evidence"]) <= set(TITLES)
    assert (len(obj["evidence"]) > 0) == (obj["is_relevant"] == "YES")


@FUZZ
@given(st.lists(texts, max_size=8, unique=True), st.data())
def test_a_valid_answer_with_hostile_titles_round_trips(titles, data):
    schema = EvidenceFirst(titles, max_evidence=3)
    cited = data.draw(st.lists(st.sampled_from(titles), max_size=3, unique=True)
                      if titles else st.just([]))  # fmt: skip
    answer = {"evidence": cited, "is_relevant": "YES" if cited else "NO"}
    for text in (json.dumps(answer), json.dumps(answer, ensure_ascii=False)):
        assert schema.parse(text) == answer


#: schemas whose parser must return its shape or refuse with ValueError
OTHER_SCHEMAS = {
    "choice": (lambda: Choice(["A wins", "B wins", "Tie"]), dict),
    "cited-list": (lambda: CitedList(["1", "2", "<|im_end|>"]), list),
}


@pytest.mark.parametrize("name", list(OTHER_SCHEMAS))
@FUZZ
@given(text=_answers())
def test_other_parsers_return_their_shape_or_raise_valueerror(name, text):
    make, shape = OTHER_SCHEMAS[name]
    try:
        parsed = make().parse(text)
    except ValueError:
        return
    assert isinstance(parsed, shape)


@pytest.mark.parametrize("text", ['{"evidence": 5, "is_relevant": "YES"}',
                                  '{"evidence": [[1]], "is_relevant": "YES"}',
                                  '[["evidence"], ["is_relevant"]]',
                                  '{"evidence": "Heat (1995)", "is_relevant": "YES"}'])  # fmt: skip
def test_near_miss_answers_found_by_the_fuzzer_are_refused_as_valueerror(text):
    with pytest.raises(ValueError):
        EvidenceFirst(TITLES).parse(text)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))


@FUZZ
@given(st.lists(st.one_of(texts, st.sampled_from(["\ud800", "a\udfffb", "\x7f", "\x1b[31m"])),
                max_size=6), st.data())  # fmt: skip
def test_the_evidence_grammar_builds_for_any_titles_and_accepts_every_valid_answer(
    tok, titles, data
):
    """Titles with lone surrogates, control characters or JSON syntax: the grammar compiles
    (or the titles are refused with ValueError) and every answer the schema allows, written
    in the tokenizer's literal encoding, is accepted whole by xgrammar."""
    import xgrammar as xgr

    try:
        schema = EvidenceFirst(titles, max_evidence=2)
        compiled = compile_schema(schema, tok, 49152)
    except ValueError:
        return
    uniq = list(dict.fromkeys(schema.titles))
    cited = data.draw(st.lists(st.sampled_from(uniq), max_size=2, unique=True)
                      if uniq else st.just([]))  # fmt: skip
    lit = compiled.table.json_literal
    verdict = "YES" if cited else "NO"
    text = ('{"evidence": [' + ", ".join(lit(t) for t in cited)
            + f'], "is_relevant": "{verdict}"}}')  # fmt: skip
    matcher = xgr.GrammarMatcher(compiled.grammar)
    assert matcher.accept_string(text), text
    assert schema.parse(text) == {"evidence": cited, "is_relevant": verdict}
