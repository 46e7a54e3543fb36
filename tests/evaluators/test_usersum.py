"""UserSumBench: MCQ invariants, metric arithmetic, segmentation, text overlap, e2e."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recjudge.evaluators import (
    TASKS,
    UserSumConfig,
    bleu,
    make_mcq,
    regenerate_messages,
    rouge_l,
    rouge_n,
    run_usersum,
    segment,
    summary_messages,
    summary_quality,
    time_range,
    time_segments,
    usersum_metrics,
)


@given(
    pool=st.lists(st.text(min_size=1, max_size=6), min_size=5, max_size=40, unique=True),
    seed=st.integers(0, 10**6),
)
@settings(max_examples=60, deadline=None)
def test_mcq_has_exactly_one_correct_distinct_options_and_is_seeded(pool, seed):
    correct = pool[0]
    opts, ans = make_mcq(correct, pool[1:] + [correct], seed)
    assert len(opts) == 5 and len(set(opts)) == 5
    assert opts.count(correct) == 1
    assert opts["ABCDE".index(ans)] == correct
    assert set(opts) - {correct} <= set(pool[1:])
    assert make_mcq(correct, pool[1:] + [correct], seed) == (opts, ans)


def test_mcq_positions_are_spread_and_small_pools_fail():
    letters = [make_mcq("x", [f"o{i}" for i in range(10)], s)[1] for s in range(500)]
    for letter in "ABCDE":
        assert 60 <= letters.count(letter) <= 140  # ~100 each
    with pytest.raises(ValueError, match="need 4 wrong options"):
        make_mcq("x", ["a", "b", "c", "x"], 0)


def test_quality_metrics_by_hand():
    assert summary_quality([True, True, True, False]) == 1
    assert summary_quality([True, True, False, False]) == 0
    assert summary_quality([True, True, False, False], m=2) == 1
    sums = [
        {"text": "a b c d", "correct": [True, True, True, False]},  # Q 1, 4 words, acc .75
        {"text": " ".join(["w"] * 10), "correct": [True, False, False, False]},  # Q 0, acc .25
        {"text": "", "correct": [False] * 4},  # empty: density 0, within the limit
    ]
    m = usersum_metrics(sums, word_limit=5)
    assert m["qm"] == pytest.approx(1 / 3)
    assert m["ifm"] == pytest.approx(2 / 3)
    assert m["idm"] == pytest.approx((0.75 / 4 + 0.25 / 10 + 0) / 3)
    assert m["task_accuracy"] == pytest.approx((0.75 + 0.25 + 0) / 3)
    assert usersum_metrics([], 5)["qm"] == 0.0


def test_text_overlap_metrics_by_hand():
    assert rouge_n("the cat sat", "the cat sat", 2) == pytest.approx(1.0)
    assert rouge_l("a b c", "x y z") == 0.0
    # candidate bigrams {the cat, cat sat}; reference {the cat, cat ran, ran far}: overlap 1,
    # P = 1/2, R = 1/3 -> F1 = 0.4.
    assert rouge_n("The cat sat", "the cat ran far", 2) == pytest.approx(0.4)
    # LCS("a b c d", "a c d e") = 3 -> P = R = 3/4.
    assert rouge_l("a b c d", "a c d e") == pytest.approx(0.75)
    assert bleu("a b c d e", "a b c d e") == pytest.approx(1.0)
    assert bleu("zzz", "a b c") == 0.0
    short, long_ = bleu("a b", "a b c d"), bleu("a b c d", "a b c d")
    assert 0 < short < long_  # the brevity penalty


@given(n=st.integers(1, 400), min_size=st.integers(2, 60), max_seg=st.integers(1, 8))
@settings(max_examples=200, deadline=None)
def test_segments_are_contiguous_chronological_and_large_enough(n, min_size, max_seg):
    segs = segment(n, min_size, max_seg)
    assert segs[0][0] == 0 and segs[-1][1] == n
    assert all(a < b for a, b in segs)
    assert all(segs[i][1] == segs[i + 1][0] for i in range(len(segs) - 1))
    assert len(segs) <= max_seg
    sizes = [b - a for a, b in segs]
    if n >= min_size:
        assert min(sizes) >= min_size
    assert max(sizes) - min(sizes) <= 1


@given(
    gaps=st.lists(st.integers(0, 10**6), min_size=1, max_size=300),
    min_count=st.integers(2, 60),
    max_seg=st.integers(1, 8),
)
@settings(max_examples=200, deadline=None)
def test_time_segments_cover_the_timeline_and_respect_time(gaps, min_count, max_seg):
    t = np.cumsum(gaps).astype(float)
    segs = time_segments(t, min_count, max_seg)
    n = len(t)
    assert segs[0][0] == 0 and segs[-1][1] == n and len(segs) <= max_seg
    assert all(segs[i][1] == segs[i + 1][0] for i in range(len(segs) - 1))
    if len(segs) > 1:
        assert min(b - a for a, b in segs) >= min_count
    # A cut never separates activities with the same time: segments are time windows.
    assert all(t[b - 1] < t[b] for _, b in segs[:-1])


def test_time_segments_follow_bursts_not_counts():
    day = 86400.0
    t = [0.0] * 30 + [100 * day + i for i in range(30)]  # two bursts 100 days apart
    assert time_segments(t, 20, 4) == [(0, 30), (30, 60)]
    assert segment(60, 20, 4) == [(0, 20), (20, 40), (40, 60)]  # counts ignore time
    assert time_segments(sorted([3.0, 1.0]), 5, 2) == [(0, 2)]
    with pytest.raises(ValueError, match="chronological"):
        time_segments([2.0, 1.0], 1, 2)


def test_prompts_carry_time_range_and_regeneration_sees_what_failed():
    acts = [{"text": "Heat (1995)", "rating": 5.0}]
    single = summary_messages(acts, "Summarize", 50)[1]["content"]
    assert "Only state" not in single and " from " not in single.split("\n")[0]
    seg = summary_messages(acts, "Summarize", 50, "1999-01-01 to 1999-02-01")[1]["content"]
    assert seg.startswith("My activities from 1999-01-01 to 1999-02-01")
    failed = ["- Question: Which genre? Your summary's answer: 'Westerns'. The log says: crime"]
    regen = regenerate_messages(acts, "Summarize", 50, "1999", "I love Westerns.", failed)
    text = regen[1]["content"]
    assert "I love Westerns." in text and failed[0] in text and "from 1999" in text
    assert time_range([{"t": 915148800.0}, {"t": 917827200.0}]) == "1999-01-01 to 1999-02-01"
    assert time_range([{"t": 3.0}, {"t": 9.0}]) == ""  # no real time (Book-Crossing)


def test_config_round_trip():
    cfg = UserSumConfig(summarizers=("hierarchy",), users=4, word_limit=80, runs=2)
    assert UserSumConfig.model_validate_json(cfg.model_dump_json()) == cfg


@pytest.mark.e2e
def test_usersum_end_to_end_one_real_user(smollm, tmp_path):
    cfg = UserSumConfig(
        model="smollm2-135m",
        predictor="smollm2-135m",
        users=1,
        max_activities=45,
        future=5,
        min_segment=20,
        critique_rounds=1,
        qa_pairs=1,
        word_limit=8,
        runs=2,
    )
    llms = {"smollm2-135m": smollm}
    r = run_usersum(cfg, "ml-1m", tmp_path, llms=llms, progress=False)
    assert set(r["table"]) == {"single", "hierarchy"}
    for v in r["table"].values():
        for k in ("qm", "ifm", "idm"):
            assert 0.0 <= v[k]["mean"] <= 1.0 and v[k]["sd"] >= 0.0
        assert set(v["per_task_accuracy"]) == set(TASKS)
    # 1 user x 2 summarisers x 2 runs, each with the four task outcomes.
    assert len(r["answers"]) == 4
    assert all(set(TASKS) <= set(a) for a in r["answers"])
    sums = [json.loads(x) for x in (tmp_path / "summaries.jsonl").read_text().splitlines()]
    assert len(sums) == 2 and all(s["text"] for s in sums)
    hier = [s for s in sums if s["summarizer"] == "hierarchy"]
    for s in hier:  # time windows of >= 20 of the 40 past activities, each with its dates
        assert 1 <= s["segments"] <= 2 and len(s["time_ranges"]) == s["segments"]
        assert all(r[:2] in ("19", "20") for r in s["time_ranges"])
        assert len(s["audit"]) == s["segments"] and s["audit"][0][0]["round"] == 0
        # Exactly the segments the verifier failed in round 0 were regenerated.
        failed = sum(
            not a[0]["query_consistent"] or a[0]["qa_inconsistent"] > 0 for a in s["audit"]
        )
        assert s["regenerated"] == failed
    assert (tmp_path / "metrics.png").stat().st_size > 1000
    report = (tmp_path / "report.md").read_text()
    assert "QM" in report and "hierarchy minus single" in report
    # The per-user terms average to the table's means; the paired difference is theirs.
    t, iv = r["table"], r["intervals"]
    for k in ("qm", "ifm", "idm", "task_accuracy"):
        for name in ("single", "hierarchy"):
            assert iv[name][k]["estimate"] == pytest.approx(t[name][k]["mean"])
        diff = r["paired"]["minus_single"]["hierarchy"][k]
        assert diff["estimate"] == pytest.approx(t["hierarchy"][k]["mean"] - t["single"][k]["mean"])
        assert diff["users"]["lo"] <= diff["estimate"] <= diff["users"]["hi"]
    assert r["cost"]["free_text"]["asked_now"] > 0 and r["cost"]["closed"]["asked_now"] > 0
    again = run_usersum(cfg, "ml-1m", tmp_path, llms=llms, progress=False)  # resumes
    assert again["table"] == r["table"]
    assert again["cost"]["free_text"]["asked_now"] == again["cost"]["closed"]["asked_now"] == 0
    assert again["cost"]["closed"]["questions"] == r["cost"]["closed"]["questions"]
