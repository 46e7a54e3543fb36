"""Say the time before spending it (issue 112): the work ahead, then one projection from the
first calls, with what to do when it is over an hour."""

from __future__ import annotations

import recjudge.reward._eta as eta


def test_the_work_ahead_and_one_projection(monkeypatch):
    clock = iter([0.0, 100.0, 200.0, 300.0])
    monkeypatch.setattr(eta.time, "perf_counter", lambda: next(clock))
    said: list[str] = []
    w = eta.WorkAhead(said.append)
    w.start(10_000, 50)
    assert said == ["work ahead: 10000 pairs to judge (50 pairs reused from the store)"]
    w.done(100)  # 100 pairs in 100 s: 1 pair/s, 9,900 left
    assert said[1].startswith("projected: 2.8 h more for 9900 pairs at 1.00 pairs/s")
    assert "smaller --users" in said[1] and "--resume keeps every judged pair" in said[1]
    w.done(100)
    assert len(said) == 2  # said once


def test_a_short_run_is_not_told_to_shrink(monkeypatch):
    clock = iter([0.0, 30.0])
    monkeypatch.setattr(eta.time, "perf_counter", lambda: next(clock))
    said: list[str] = []
    w = eta.WorkAhead(said.append)
    w.start(300, 0)
    w.done(30)
    assert said[0] == "work ahead: 300 pairs to judge" and "smaller" not in said[1]
    assert said[1].startswith("projected: 4 min more for 270 pairs")
