"""The engine-side bias (what vLLM runs) against the transformers engine, without vLLM.

``ReferenceEngine`` plays vLLM's part with the real SmolLM2 weights: it compiles the
remainder grammar it is sent (as vLLM's structured outputs would), masks with a fresh
matcher, reports the watched tokens' log-probabilities after the mask, calls
``RequestBias.process`` (the code inside ``BranchBiasV1/V2``) and decodes greedily. The client
code under test is the real ``engine_constrained``: payload, remainder grammar, watch set and
decision replay.
"""

from __future__ import annotations

import json

import pytest
import torch
import xgrammar as xgr

from recjudge.decoding import BranchBias, Choice, EvidenceFirst, QAPairs, compile_schema
from recjudge.decoding._decode import READOUT_STEPS
from recjudge.decoding._remote import BiasPayload, RequestBias, replay_decision, watch_tokens
from recjudge.decoding._schemas import (
    Picks,
    Verdicts,
    remainder_ebnf,
    schema_from_spec,
    schema_spec,
)
from recjudge.distributed import RayRun
from recjudge.distributed._ray_data_llm import _finished, engine_calls
from recjudge.llm._vllm import EngineRequest, EngineResult, _EngineMixin
from recjudge.reward import Judge, JudgeConfig, JudgePlan, ask, request_for

PAIRS = [
    ("1", "Toy Story (1995)"),
    ("1", "Heat (1995)"),
    ("2", "Fargo (1996)"),
    ("5", "Alien (1979)"),
]


class ReferenceEngine(_EngineMixin):
    def __init__(self, hf):
        self.hf = hf
        self.tokenizer = hf.tokenizer
        self.vocab_size = hf.vocab_size
        self.name = hf.name
        self.sent: list[EngineRequest] = []

    def submit(self, requests):
        table = compile_schema(Choice(["x"]), self.tokenizer, self.vocab_size).table
        out = []
        for r in requests:
            self.sent.append(r)
            matcher = xgr.GrammarMatcher(table.compiler.compile_grammar(r.grammar))
            payload = BiasPayload.from_extra_args({"recjudge": r.payload}) if r.payload else None
            state = RequestBias(payload, table) if payload else None
            gen, steps = [], []
            feed, past = list(r.prompt_ids), None
            mask = xgr.allocate_token_bitmask(1, table.width)
            for _ in range(r.sampling.max_new_tokens):
                with torch.inference_mode():
                    o = self.hf.model(
                        input_ids=torch.tensor([feed]), past_key_values=past, use_cache=True
                    )
                past = o.past_key_values
                logits = o.logits[0, -1].float().clone().unsqueeze(0)
                if matcher.is_terminated():
                    break
                matcher.fill_next_token_bitmask(mask, 0)
                xgr.apply_token_bitmask_inplace(logits, mask)
                lp = torch.log_softmax(logits[0], -1)
                steps.append({t: float(lp[t]) for t in r.watch})
                if state is not None:
                    state.process(gen, logits[0])
                tok = int(logits[0].argmax())
                if tok in table.stop_ids:
                    break
                assert matcher.accept_token(tok)
                gen.append(tok)
                feed = [tok]
            out.append(EngineResult(gen, steps))
        return out


@pytest.fixture(scope="module")
def requests_(ml1m):
    sigmas = [0.8, -0.6, 0.3, -0.1]
    return [request_for(ml1m, u, c, sigma=s) for (u, c), s in zip(PAIRS, sigmas, strict=True)]


def _local_and_engine(llm, reqs, config):
    """The same requests judged locally and through the reference engine: the verdicts
    agree and p_yes within 2e-3 (asserted); (local, remote, engine)."""
    local = Judge(config, llm=llm).judge_many(reqs)
    engine = ReferenceEngine(llm)
    remote = Judge(config, llm=engine).judge_many(reqs)
    assert [j.is_relevant for j in remote] == [j.is_relevant for j in local]
    for a, b in zip(local, remote, strict=True):
        assert b.p_yes == pytest.approx(a.p_yes, abs=2e-3)
    return local, remote, engine


@pytest.mark.parametrize("beta", [pytest.param(0.0, marks=pytest.mark.slow), 25.0])
def test_engine_side_bias_matches_transformers_engine(smollm32, requests_, beta):
    # two evidence titles at most: the parity under test is per step, not in long answers;
    # one user's two candidates (sigma +0.8 and -0.6): each prompt is prefilled in full by
    # the reference engine, the cost of this test
    config = JudgeConfig(model="smollm2-135m", beta=beta, max_history=10, max_evidence=2)
    local, remote, engine = _local_and_engine(smollm32, requests_[:2], config)
    for a, b in zip(local, remote, strict=True):
        assert b.p_yes_semantic == pytest.approx(a.p_yes_semantic, abs=2e-3)
        assert b.delta == pytest.approx(a.delta, abs=0.05 * max(1.0, abs(a.delta)))
        assert b.evidence == a.evidence
        assert json.loads(b.raw_text)["is_relevant"] == ("YES" if b.is_relevant else "NO")
    # what crossed the "wire": the remainder grammar and a small watch set
    sent = engine.sent[0]
    assert sent.grammar.startswith('root ::= "\\": "')
    assert 0 < len(sent.watch) <= 128
    assert json.loads(sent.payload)["beta"] == beta
    if beta:
        assert any(abs(j.delta) > 1 for j in remote)


def test_watch_set_covers_every_decision_token(smollm):
    schema = EvidenceFirst(["Heat (1995)", "Fargo (1996)", '"Quoted" [x]'], 3)
    compiled = compile_schema(schema, smollm.tokenizer, smollm.vocab_size)
    lead = smollm.encode('{"evidence')
    watch, complete = watch_tokens(compiled, lead)
    assert complete
    tb = compiled.table.token_bytes
    texts = {tb[t] for t in watch}
    assert b"[" in texts or b" [" in texts  # the opening bracket
    assert any(t.endswith(b"]") or t.endswith(b"[]") for t in texts if b"]" in t)


def test_replay_recovers_the_processor_record(smollm):
    """Replay from exact log-probabilities gives the record the processor computed."""
    schema = EvidenceFirst(["Heat (1995)", "Fargo (1996)"], 2)
    compiled = compile_schema(schema, smollm.tokenizer, smollm.vocab_size)
    lead = smollm.encode('{"evidence')
    payload = BiasPayload.build(schema, lead, 0.7, 25.0)
    watch, _ = watch_tokens(compiled, lead)
    state = RequestBias(payload, compiled.table)
    gen, steps = [], []
    g = torch.Generator().manual_seed(0)

    matcher = xgr.GrammarMatcher(compiled.grammar)
    for t in lead:
        matcher.accept_token(t)
    mask = xgr.allocate_token_bitmask(1, compiled.table.width)
    for _ in range(12):
        if matcher.is_terminated():
            break
        logits = torch.randn(1, compiled.table.width, generator=g) * 3
        matcher.fill_next_token_bitmask(mask, 0)
        xgr.apply_token_bitmask_inplace(logits, mask)
        lp = torch.log_softmax(logits[0], -1)
        steps.append({t: float(lp[t]) for t in watch})
        state.process(gen, logits[0])
        tok = int(logits[0].argmax())
        if tok in compiled.table.stop_ids:
            break
        matcher.accept_token(tok)
        gen.append(tok)
    truth = state.bias.records[0]
    rec = replay_decision(compiled, payload, gen, steps)
    assert truth.decision_steps >= 1
    assert rec.chosen == truth.chosen
    assert rec.p_before == pytest.approx(truth.p_before, abs=1e-6)
    assert rec.p_after == pytest.approx(truth.p_after, abs=1e-6)
    assert rec.delta == pytest.approx(truth.delta, abs=1e-5)
    assert rec.extra["coverage"] == pytest.approx(1.0, abs=1e-5)


def test_remainder_grammar_and_wire_form_round_trip():
    for schema in [
        EvidenceFirst(['A "b" \\ c', "D"], 2),
        Choice(["YES", "NO"], answer_key="is_relevant"),
        Picks(["x", "y", "z"], 2),
        Verdicts(["style", "overall"], ["A wins", "B wins", "Tie"]),
        Verdicts(["a", "b", "overall"], ["A wins", "B wins"], 30, None, ["a", "b"]),
    ]:
        back = schema_from_spec(json.loads(json.dumps(schema_spec(schema))))
        assert back.ebnf() == schema.ebnf()
    ev = remainder_ebnf(EvidenceFirst(["T"], 1), '{"evidence')
    assert ev.startswith('root ::= "\\": " (')
    assert remainder_ebnf(Choice(["Y"]), '{"answer": ').startswith("root ::= answer")
    with pytest.raises(ValueError, match="does not open with"):
        remainder_ebnf(EvidenceFirst(["T"], 1), '{"verdict')


@pytest.mark.parametrize(
    "bad, match",
    [
        ("not json", "not a recjudge bias payload"),
        (json.dumps({"schema": {"kind": "nope", "args": {}}}), "unknown schema kind"),
        (json.dumps({"schema": {"kind": "choice", "args": {"options": []}}}), "at least one"),
        (
            json.dumps({"v": 99, "schema": {"kind": "choice", "args": {"options": ["a"]}}}),
            "version",
        ),
        (
            json.dumps({"schema": {"kind": "choice", "args": {"options": ["a"]}}, "beta": -1}),
            "beta",
        ),
        (json.dumps({"schema": {"kind": "choice", "args": {"options": ["x" * 20_000]}}}),
         "at most 16,384"),
        (json.dumps({"schema": {"kind": "choice",
                                "args": {"options": list(map(str, range(6000)))}}}),
         "at most 5,000"),
        ("x" * 1_000_001, "at most 1,000,000"),
    ],
)  # fmt: skip
def test_bad_payloads_are_refused_clearly(bad, match):
    with pytest.raises(ValueError, match=match):
        BiasPayload.from_extra_args({"recjudge": bad})
    assert BiasPayload.from_extra_args({"other": 1}) is None


def test_ask_through_an_engine_backend_matches_local(smollm32):
    """Evaluators' questions (reward.ask) take the engine path too, including a schema whose
    grammar cannot start after the prefilled opening (QAPairs: the model decodes it)."""
    msgs = [[{"role": "user", "content": "Which is a fruit? A: apple, B: car"}]]
    engine = ReferenceEngine(smollm32)
    for schema in [Choice(["A", "B"]), QAPairs(1)]:
        local = ask(smollm32, msgs, schema, decode_rows=1)[0]
        remote = ask(engine, msgs, schema)[0]
        assert remote.text == local.text
        assert remote.value == local.value
    assert engine.sent[-1].grammar.startswith("root ::= ")
    assert not engine.sent[-1].payload  # no decision, no distinct list: nothing to bias


def test_engine_readouts_stop_at_the_decision_and_match_local(smollm32, requests_):
    """A read-out on an engine backend asks for a few tokens, not the whole answer, and
    reads the same verdict and p_yes as the local engine."""
    config = JudgeConfig(model="smollm2-135m", beta=25.0, max_history=10, need_evidence=False)
    _, _, engine = _local_and_engine(smollm32, requests_[1:3], config)  # two users
    assert {r.sampling.max_new_tokens for r in engine.sent} == {READOUT_STEPS}


def test_the_payload_carries_every_field_of_branch_bias():
    """BiasPayload derives from BranchBias: a knob added there reaches the engine."""
    assert set(BranchBias.model_fields) <= set(BiasPayload.model_fields)
    bias = BranchBias(beta=3.0, adaptive=False, block_one_sided=False)
    p = BiasPayload.build(Choice(["YES", "NO"]), [1, 2], 0.5, bias)
    back = BiasPayload.from_extra_args({"recjudge": p.encode()})
    assert {k: getattr(back, k) for k in BranchBias.model_fields} == bias.model_dump()


def test_ray_data_llm_calls_judge_as_submit_does_and_ask_again_only_where_needed(
    smollm32, requests_
):
    """The Ray Data LLM driver's calls (``engine_calls``: prompts, job and engine requests
    built once, results fed back, no decoding again) give the judgments ``decode`` gives
    through ``submit``; a row whose round-1 result holds no decision (withheld here) is asked
    again alone, with the full budget, in a second round."""
    config = JudgeConfig(model="smollm2-135m", beta=25.0, max_history=10, need_evidence=False)
    engine = ReferenceEngine(smollm32)
    judge = Judge(config, llm=engine)
    want = judge.judge_many(requests_)
    plan = JudgePlan.build(judge, requests_)
    calls = [[{"i": i, "key": plan.keys[i], "sigma": plan.sigmas[i]} for i in call]
             for call in plan.calls]  # fmt: skip
    run = RayRun(judge, requests_, plan.keys, calls, None, record=True)  # type: ignore[arg-type]
    built, failed = engine_calls(judge, run)
    assert not failed and sorted(i for c in built for i in c.idx) == plan.todo
    got: dict[int, object] = {}
    todo, rounds = built, 0
    while todo:  # what stream_on_ray_data_llm does with the stage's results
        rounds += 1
        later = []
        for c in todo:
            asked = c.ask()
            results = engine.submit(list(asked.values()))
            if rounds == 1:
                assert {r.sampling.max_new_tokens for r in asked.values()} == {READOUT_STEPS}
            if rounds == 1 and c is built[0]:
                results[0] = EngineResult([], [])  # no decision came
            c.got.update(zip(asked, results, strict=True))
            done = _finished(c, run)
            if done is None:
                again = c.stage.requests
                assert len(again) == 1 and again[0].sampling.max_new_tokens > READOUT_STEPS
                later.append(c)
            else:
                got.update(zip(*done, strict=True))
        todo = later
    assert rounds == 2
    for i, w in enumerate(want):
        assert got[i].is_relevant == w.is_relevant and got[i].error is None
        assert got[i].p_yes == pytest.approx(w.p_yes, abs=1e-6)
