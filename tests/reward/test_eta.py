"""Say the time before spending it (issue 112): the work ahead, then one projection from the
first calls, with what to do when it is over an hour."""

from __future__ import annotations

import recjudge.reward._eta as eta
from recjudge.reward import ResultsStore, StoredAsk, run_stored


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


def test_the_evaluators_loop_says_its_work_ahead_and_reads_the_shared_answers(tmp_path, capsys):
    asks = [StoredAsk(f"k{i}", {"i": i}, [{"role": "user", "content": str(i)}]) for i in range(4)]
    asked: list[str] = []

    def answer(part):
        asked.extend(a.key for a in part)
        return [{"v": a.request["i"]} for a in part]

    with ResultsStore(tmp_path / "shared.sqlite") as shared:
        with ResultsStore(tmp_path / "a.sqlite") as a:
            got = run_stored(a, asks[:3], answer, batch_size=2, desc="stage", shared=shared)
        err = capsys.readouterr().err
        assert "stage: work ahead: 3 questions to ask" in err
        assert got == {f"k{i}": {"v": i} for i in range(3)} and asked == ["k0", "k1", "k2"]
        asked.clear()
        with ResultsStore(tmp_path / "b.sqlite") as b:  # another run, another folder
            got = run_stored(b, asks, answer, batch_size=2, desc="stage", shared=shared)
            assert asked == ["k3"] and len(b) == 4  # the shared three copied in, one asked
        assert "work ahead: 1 question to ask (3 questions reused from the store)" in \
            capsys.readouterr().err  # fmt: skip
        assert got["k3"] == {"v": 3} and len(shared) == 4
