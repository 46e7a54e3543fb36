"""The one decoding entry point: its lead policy gives the judge's and the closed questions'
openings, its stop rule (at the decision, or when the rest is forced), and its refusals."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest

import recjudge.decoding._decode as dec
from recjudge.decoding import (
    BranchBias,
    CapabilityError,
    Choice,
    DecodeJob,
    EvidenceFirst,
    Picks,
    decode,
    lead_ids,
    make_processors,
    require,
)
from recjudge.decoding._decode import draft_ids, room_for_answers
from recjudge.llm import ENGINE_CAPABILITIES, BackendError, SamplingConfig, _fast
from recjudge.reward import Judge, JudgeConfig, request_for

TITLES = ["Heat (1995)", "Fargo (1996)"]
PROMPT = "Is Alien (1979) relevant? Answer in JSON.\n"


@pytest.mark.parametrize(
    ("schema", "opening"),
    [
        (EvidenceFirst(TITLES), '{"evidence'),
        (Choice(["YES", "NO"], answer_key="is_relevant"), '{"is_relevant'),
        (Choice(["a", "b"]), '{"answer'),
    ],
)
def test_the_lead_is_the_forced_opening_cut_after_its_last_letter(smollm, schema, opening):
    grammar, _ = make_processors(smollm, [schema], None, None)
    assert lead_ids(smollm, grammar, 0) == smollm.encode(opening)


def _job(smollm, **kw):
    prompt = smollm.encode(smollm.chat_prompt([{"role": "user", "content": PROMPT}]))
    return DecodeJob(
        suffixes=[prompt[-3:]] * 2,
        prefix=prompt[:-3],
        schemas=[EvidenceFirst(TITLES)] * 2,
        signal=[1.0, -1.0],
        sampling=SamplingConfig(max_new_tokens=64),
        **kw,
    )


def test_a_read_out_stops_at_the_decision_and_a_full_answer_completes(smollm):
    full = decode(smollm, _job(smollm))
    for o in full:
        assert isinstance(o.value, dict) and o.record.chosen in ("YES", "NO")
        assert (o.record.chosen == "YES") == bool(o.value["evidence"])
    read = decode(smollm, _job(smollm, stop_at_decision=True))
    for r, f in zip(read, full, strict=True):
        assert r.record.chosen == f.record.chosen  # the same decision, fewer steps
        assert len(r.token_ids) <= len(f.token_ids)
        if r.record.chosen == "YES":  # stopped inside the evidence list
            assert r.value is None and f.text.startswith(r.text.rstrip())
    kept = decode(smollm, _job(smollm, stop_at_decision=True, keep_branch="YES"))
    for k, f in zip(kept, full, strict=True):
        assert k.text == f.text  # YES keeps writing its evidence; NO is forced to the end


def test_a_non_backend_and_an_engine_sweep_are_refused(smollm):
    with pytest.raises(BackendError, match="declares no `capabilities`"):
        decode(object(), _job(smollm))
    engine = SimpleNamespace(capabilities=ENGINE_CAPABILITIES, name="vllm:m")
    with pytest.raises(ValueError, match="per-step scores"):
        decode(engine, _job(smollm, explore=lambda *a: None))


def test_a_promise_the_backend_does_not_declare_is_refused_before_decoding(smollm):
    """deterministic on an engine backend (its engine batches as it likes) would store
    answers keyed as batch-invariant that are not: refused in one line, nothing decoded."""
    engine = SimpleNamespace(capabilities=ENGINE_CAPABILITIES, name="vllm:m")
    with pytest.raises(CapabilityError, match="deterministic.*vllm:m.*transformers backend"):
        decode(engine, _job(smollm, deterministic=True))
    # speed settings are not promises: an engine ignores them (no refusal before submit)
    require(ENGINE_CAPABILITIES, _job(smollm, rows=3, head="allowed", draft=False))
    assert decode(smollm, _job(smollm, deterministic=True, stop_at_decision=True))


def test_a_job_checks_its_rows():
    with pytest.raises(ValueError, match="1 schemas for 2 rows"):
        DecodeJob(suffixes=[[1], [2]], schemas=[Choice(["a"])])
    with pytest.raises(ValueError, match="head"):
        DecodeJob(suffixes=[[1]], schemas=[Choice(["a"])], head="some")


def test_grammar_drafts_change_no_judgment_and_save_forwards(smollm32, ml1m, monkeypatch):
    """The fast engine's drafts (each row's grammar-forced text fed with its token, kept
    where the model takes it) give the judgments of one token per step (fp32: the same
    texts, decisions and probabilities) in fewer forwards."""
    reqs = [request_for(ml1m, "10", c, sigma=s) for c, s in
            (("Fargo (1996)", -0.2), ("Big (1988)", 0.9), ("Toy Story (1995)", 0.8))]  # fmt: skip
    cfg = JudgeConfig(beta=5.0, max_evidence=2, max_history=20)
    with_drafts = Judge(cfg, llm=smollm32)
    got = with_drafts.judge_many(reqs)
    monkeypatch.setattr(dec, "draft_ids", lambda llm, grammar: None)
    _fast.prefixes_of(smollm32).clear()
    without = Judge(cfg, llm=smollm32)
    ref = without.judge_many(reqs)
    for a, b in zip(got, ref, strict=True):
        assert (a.is_relevant, a.raw_text, a.evidence) == (b.is_relevant, b.raw_text, b.evidence)
        assert a.p_yes == pytest.approx(b.p_yes, abs=1e-4)
    s, r = with_drafts.stats, without.stats
    assert r.draft_tokens == 0
    if any(j.evidence for j in ref):  # titles were written: their forced rests were drafted
        assert s.draft_accepted > 0 and s.decode_steps < r.decode_steps


def test_a_draft_never_feeds_a_title_as_a_special_token(smollm):
    """A title that spells a special token (``<|im_end|>``) is drafted only up to it: the
    engine is never fed the special id from untrusted text."""
    title = "Heat <|im_end|> 2 (1995)"
    grammar, _ = make_processors(smollm, [EvidenceFirst([title, "Up (2009)"])], None, None)
    special = smollm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert special in smollm.encode(title)  # what a plain encode would feed
    for t in smollm.encode('{"evidence": ["He'):
        grammar.accept(0, t)
    forced = grammar.jump_forward(0)
    assert "<|im_end|>" in forced
    ids = draft_ids(smollm, grammar)(0)
    assert ids and special not in ids
    assert smollm.tokenizer.decode(ids) == forced[: forced.index("<|im_end|>")]


LONG = ["A " + "very long title, " * 30 + "(2001)", "Ünïcödé — 東京物語 😀 " * 8, "Heat (1995)"]


@pytest.mark.parametrize(
    "schema",
    [EvidenceFirst(LONG), EvidenceFirst(LONG, max_evidence=1), EvidenceFirst([]),
     Choice(["A wins", "B wins", "Tie 😀"]), Picks(LONG, 2)],
)  # fmt: skip
def test_the_answer_bound_covers_every_answer_the_grammar_accepts(schema):
    """``max_answer_bytes`` bounds the longest answer, in either JSON form of its strings
    (as written, or with non-ASCII escaped)."""
    bound = schema.max_answer_bytes()
    if isinstance(schema, EvidenceFirst):
        answers = [{"evidence": [], "is_relevant": "NO"}] + [
            {"evidence": list(c), "is_relevant": "YES"}
            for k in range(1, min(schema.max_evidence, len(schema.titles)) + 1)
            for c in itertools.permutations(schema.titles, k)
        ]
    elif isinstance(schema, Picks):
        answers = [{"picks": list(c)} for c in itertools.permutations(schema.labels, schema.n)]
    else:
        answers = [{"answer": o} for o in schema.options]
    for a in answers:
        schema.parse(json.dumps(a, ensure_ascii=False))  # a real answer of this grammar
        for text in (json.dumps(a, ensure_ascii=False), json.dumps(a)):
            assert len(text.encode()) <= bound
    assert Choice(["a"], analysis_chars=10).max_answer_bytes() is None  # free text: no bound


def test_a_long_title_is_cited_whole_whatever_the_token_budget(smollm):
    """A YES must carry its evidence: a budget below the longest answer is raised for a
    grammar of listed strings (room_for_answers), so a long title is never cut mid-list."""
    small = SamplingConfig(max_new_tokens=16)
    assert room_for_answers(small, [EvidenceFirst(LONG)]).max_new_tokens > len(LONG[0])
    assert room_for_answers(small, [Choice(["a"], analysis_chars=99)]) is small
    assert room_for_answers(SamplingConfig(max_new_tokens=4096), [EvidenceFirst(LONG)]) \
        .max_new_tokens == 4096  # fmt: skip
    prompt = smollm.encode(smollm.chat_prompt([{"role": "user", "content": PROMPT}]))
    job = DecodeJob(suffixes=[prompt], schemas=[EvidenceFirst(LONG[:1])], signal=[1.0],
                    bias=BranchBias(beta=50.0), sampling=small)  # fmt: skip
    (out,) = decode(smollm, job)
    assert out.value == {"evidence": LONG[:1], "is_relevant": "YES"}, out.text
