"""Faults during a batch run: one failing pair never aborts it, failures are stored and
counted, resume retries them only on request, and a broken model stops the run loudly."""

from __future__ import annotations

import math

import pytest

from recjudge.llm import LLMConfig, NonFiniteLogitsError, load_llm
from recjudge.reward import (
    HistoryItem,
    Judge,
    JudgeConfig,
    JudgeRequest,
    ResultsStore,
    is_run_fault,
)

HISTORY = [HistoryItem(t, t, t, 4.0) for t in ("Heat (1995)", "Alien (1979)", "Fargo (1996)")]
CANDIDATES = ["Up (2009)", "Jaws (1975)", "Rocky (1976)", "Big (1988)"]


def _reqs():
    return [JudgeRequest("u", HISTORY, c, c, c, sigma=0.3) for c in CANDIDATES]


class _Flaky(Judge):
    """Fails on one candidate while ``broken`` holds it (a record-level fault)."""

    broken = {"Jaws (1975)"}
    calls = 0

    def sigma_for(self, req):
        type(self).calls += 1
        if req.candidate_id in self.broken:
            raise ValueError(f"no sigma for {req.candidate_id}")
        return super().sigma_for(req)


def test_one_failing_pair_is_recorded_and_the_rest_match_a_clean_run(smollm32, tmp_path):
    # fp32: the survivors are judged one by one after the batch fails, the clean run batches
    # them, and the comparison must not depend on bf16 rounding by batch shape.
    config = JudgeConfig(mode="brief", beta=5.0, max_evidence=1, batch_size=4)
    with ResultsStore(tmp_path / "s.sqlite") as store:
        got = _Flaky(config, llm=smollm32).judge_many(_reqs(), store=store, errors="record")
        assert [j.error is None for j in got] == [True, False, True, True]
        assert "ValueError: no sigma for Jaws (1975)" in got[1].error
        assert math.isnan(got[1].p_yes) and "is_relevant" not in got[1].to_dict()
        assert len(store) == 3 and list(store.failures().values()) == [got[1].error]
    clean = Judge(config, llm=smollm32).judge_many(
        [r for r in _reqs() if r.candidate_id != "Jaws (1975)"]
    )
    ok = [j for j in got if j.error is None]
    assert [(j.is_relevant, j.raw_text) for j in ok] == [(j.is_relevant, j.raw_text) for j in clean]


def test_resume_retries_failures_only_on_request(smollm, tmp_path):
    config = JudgeConfig(mode="brief", beta=5.0, need_evidence=False, batch_size=4)
    path = tmp_path / "s.sqlite"
    with ResultsStore(path) as store:
        _Flaky(config, llm=smollm).judge_many(_reqs(), store=store, errors="record")
    _Flaky.broken = set()  # the cause is fixed
    try:
        with ResultsStore(path) as store:
            judge = _Flaky(config, llm=smollm)
            _Flaky.calls = 0
            again = judge.judge_many(_reqs(), store=store, errors="record", retry_failed=False)
            assert _Flaky.calls == 0 and again[1].error and judge.last_run.reused == 4
            fixed = judge.judge_many(_reqs(), store=store, errors="record", retry_failed=True)
            assert _Flaky.calls == 1 and all(j.error is None for j in fixed)
            assert judge.last_run.judged == 1 and store.failures() == {} and len(store) == 4
    finally:
        _Flaky.broken = {"Jaws (1975)"}


def test_errors_raise_by_default(smollm):
    with pytest.raises(ValueError, match="no sigma for Jaws"):
        _Flaky(JudgeConfig(need_evidence=False), llm=smollm).judge_many(_reqs())


def test_nan_logits_stop_the_run_even_when_recording(tmp_path):
    """Damaged weights (here: a NaN norm scale) give NaN logits; that is the model's fault,
    not one pair's, so it ends the run with a message instead of 'YES with p_yes 0'."""
    broken = load_llm(LLMConfig(model="smollm2-135m", dtype="float32"), reuse=False)
    broken.model.model.norm.weight.data.fill_(float("nan"))
    judge = Judge(JudgeConfig(need_evidence=False), llm=broken)
    with pytest.raises(NonFiniteLogitsError, match="NaN/inf logits.*models install"):
        judge.judge_many(_reqs()[:1], errors="record")


def test_resume_judges_again_what_an_earlier_whole_run_fault_recorded(smollm, tmp_path):
    """A store of an earlier version recorded a missing model per pair; once the model is
    there, --resume judges those pairs again (counted) without --retry-failed, while a
    per-pair failure (its own bad input) stays recorded until asked."""
    assert is_run_fault("ModelNotInstalledError: model 'x' needs packages")
    assert is_run_fault("ServerError: http://h/v1 answered 500") and is_run_fault("DeviceError: x")
    assert not is_run_fault("ValueError: no sigma for Jaws (1975)")
    assert not is_run_fault("KeyError: 'i9'")
    config = JudgeConfig(mode="brief", beta=5.0, need_evidence=False, batch_size=4)
    path = tmp_path / "s.sqlite"
    judge = _Flaky(config, llm=smollm)
    reqs = _reqs()
    keys = [judge.key(r) for r in reqs]
    with ResultsStore(path) as store:
        store.put_many([], [(keys[0], {"candidate_id": reqs[0].candidate_id},
                             "ModelNotInstalledError: model 'x' needs packages"),
                            (keys[1], {"candidate_id": reqs[1].candidate_id},
                             "ValueError: no sigma for Jaws (1975)")])  # fmt: skip
        got = judge.judge_many(reqs, store=store, errors="record", retry_failed=False)
        assert judge.last_run.retried_faults == 1
        assert got[0].error is None  # judged again
        assert got[1].error == "ValueError: no sigma for Jaws (1975)"  # kept, not retried
        assert set(store.failures()) == {keys[1]} and len(store) == 3
