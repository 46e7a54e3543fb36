"""``bench latency``'s arithmetic (the processes it times are the benchmark's, not a test's)."""

from __future__ import annotations

import pytest

from recjudge.bench._latency import START_PARTS, cold_summary
from recjudge.bench._speed import latency_text


def _run(scale: float) -> dict:
    parts = dict.fromkeys(START_PARTS, 0.2 * scale)  # 1.0 s of start
    return {**parts, "judge_built_s": 0.05, "first_judgment_s": 0.9, "warm_judgment_s": 0.7,
            "start_exit_s": 0.5, "native": True}  # fmt: skip


def test_the_cold_floor_is_the_start_its_exit_and_the_judgments_compute_alone():
    runs = [_run(1.0), _run(3.0), _run(1.0)]  # medians per part: the middle one is an outlier
    s = cold_summary([3.0, 2.6, 9.0], runs)
    assert s["cli_judgment_s"] == 3.0
    assert s["floor_s"] == pytest.approx(1.0 + 0.5 + 0.7)
    assert s["judgment_s"] == pytest.approx(3.0 - 1.0 - 0.5)  # the wall less start and exit
    assert s["over_floor"] == pytest.approx(3.0 / 2.2)
    warm = {"new_user_judgment_s": 1.0, "same_user_judgment_s": 1.0}
    assert "1.36x its floor of 2.20 s" in latency_text({"cold": s, "warm": warm})
    # results written before the floor was measured are still read
    old = {k: v for k, v in s.items() if k not in ("floor_s", "over_floor")}
    assert "floor" not in latency_text({"cold": old, "warm": warm})
