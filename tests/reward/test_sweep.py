"""judge_sweep: every bias setting from one pass equals each judge run on its own."""

from __future__ import annotations

import pytest

from recjudge.llm import SamplingConfig
from recjudge.reward import Judge, JudgeConfig, judge_sweep, request_for

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


def test_sweep_equals_each_judge_alone(smollm, requests):
    judges = _judges(smollm)
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
