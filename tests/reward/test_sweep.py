"""judge_sweep: every bias setting from one pass equals each judge run on its own."""

from __future__ import annotations

import pytest

from recjudge.llm import SamplingConfig
from recjudge.reward import (
    Judge,
    JudgeConfig,
    ResultsStore,
    can_sweep,
    judge_sweep,
    request_for,
    sweep_into_store,
)

PAIRS = [
    ("1", "Toy Story (1995)", 0.9),
    ("1", "Friday the 13th (1980)", -0.8),
    ("1", "Heat (1995)", 0.05),
]


@pytest.fixture(scope="module")
def requests(ml1m):
    out = []
    for u, c, s in PAIRS:
        r = request_for(ml1m, u, c)
        r.sigma = s  # spread signals: strong ones decide, weak ones leave it to the model
        out.append(r)
    return out


def _judges(llm):
    base = JudgeConfig(max_evidence=2, max_history=10)
    settings = {
        "brief@8": dict(mode="brief", beta=8.0),
        "brief@0.5/readout": dict(mode="brief", beta=0.5, need_evidence=False),
        "non-adaptive@2/readout": dict(mode="non-adaptive", beta=2.0, need_evidence=False),
        "no-behavior/readout": dict(mode="no-behavior", need_evidence=False),
    }
    return {k: Judge(base.model_copy(update=v), llm=llm) for k, v in settings.items()}


def test_sweep_equals_each_judge_alone(smollm32, requests):
    # fp32: both sides compute the same logits in different batch shapes (bf16 rounding
    # differs by kernel and shape, not by mechanism).
    judges = _judges(smollm32)
    swept = judge_sweep(judges, requests)
    verdicts = set()
    for label, judge in judges.items():
        alone = judge.judge_many(requests)
        for a, b in zip(swept[label], alone, strict=True):
            assert a.key == b.key and a.mode == b.mode
            assert a.is_relevant == b.is_relevant, label
            assert a.p_yes == pytest.approx(b.p_yes, abs=2e-3)
            assert a.p_yes_semantic == pytest.approx(b.p_yes_semantic, abs=2e-3)
            assert a.delta == pytest.approx(b.delta, rel=1e-3, abs=1e-3)
            assert a.entropy == pytest.approx(b.entropy, abs=2e-3)
            assert a.evidence == b.evidence, label
            if judge.config.need_evidence:
                assert a.raw_text == b.raw_text
            verdicts.add(b.is_relevant)
    assert verdicts == {True, False}  # the workload decides both ways


def test_sweep_refuses_settings_that_change_the_prompt_or_sample(smollm):
    base = Judge(JudgeConfig(), llm=smollm)
    with pytest.raises(ValueError, match="max_history"):
        judge_sweep({"a": base, "b": Judge(JudgeConfig(max_history=5), llm=smollm)}, [])
    with pytest.raises(ValueError, match="zero-shot"):
        judge_sweep({"a": Judge(JudgeConfig(mode="zero-shot"), llm=smollm)}, [])
    sampled = JudgeConfig(sampling=SamplingConfig.paper(seed=1))
    with pytest.raises(ValueError, match="greedy"):
        judge_sweep({"a": Judge(sampled, llm=smollm)}, [])
    with pytest.raises(ValueError, match="at least one"):
        judge_sweep({}, [])


def test_sweep_into_store_fills_what_each_judge_reads_back(smollm32, requests, tmp_path):
    judges = {k: v for k, v in _judges(smollm32).items() if k.endswith("/readout")}
    with ResultsStore(tmp_path / "s.sqlite") as store:
        fill = sweep_into_store(judges, requests + requests[:1], store)  # a repeated request
        assert fill.decoded == len(requests)
        assert fill.written == dict.fromkeys(judges, len(requests))
        for label, judge in judges.items():
            stored = judge.judge_many(requests, store)
            assert judge.last_run.judged == 0 and judge.last_run.reused == len(requests)
            for a, b in zip(stored, judge.judge_many(requests), strict=True):
                assert a.is_relevant == b.is_relevant, label
                assert a.p_yes == pytest.approx(b.p_yes, abs=2e-3)
        again = sweep_into_store(judges, requests, store)
        assert again.decoded == 0 and set(again.written.values()) == {0}
        # A new setting: only it is written, replayed from the stored decision records
        # (no model pass), and it equals that judge run on its own.
        extra = Judge(JudgeConfig(max_evidence=2, max_history=10, beta=3.0, need_evidence=False),
                      llm=smollm32)  # fmt: skip
        fill = sweep_into_store(dict(judges, extra=extra), requests, store)
        assert (fill.decoded, fill.replayed) == (0, len(requests))
        assert fill.written == dict.fromkeys(judges, 0) | {"extra": len(requests)}
        for a, b in zip(extra.judge_many(requests, store), extra.judge_many(requests),
                        strict=True):  # fmt: skip
            assert a.is_relevant == b.is_relevant
            assert a.p_yes == pytest.approx(b.p_yes, abs=2e-3)
            assert a.entropy == pytest.approx(b.entropy, abs=2e-3)
    assert (tmp_path / "s.sqlite.decisions").exists()


def test_can_sweep_picks_the_settings_one_pass_serves(smollm):
    base = JudgeConfig(max_history=10, need_evidence=False)
    judges = {
        "brief": Judge(base, llm=smollm),
        "nb": Judge(base.model_copy(update={"mode": "no-behavior"}), llm=smollm),
        "zero": Judge(base.model_copy(update={"mode": "zero-shot"}), llm=smollm),
        "other-history": Judge(base.model_copy(update={"max_history": 5}), llm=smollm),
        "sampled": Judge(
            base.model_copy(update={"sampling": SamplingConfig.paper(seed=1)}), llm=smollm
        ),
    }
    assert can_sweep(judges) == ["brief", "nb"]
    # a lone sweepable judge still goes through the decision records
    assert can_sweep({"brief": judges["brief"], "zero": judges["zero"]}) == ["brief"]
    assert can_sweep({"zero": judges["zero"], "sampled": judges["sampled"]}) == []
