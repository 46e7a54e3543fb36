"""A tuned judge's card against the evaluation: impute refuses a judge tuned into the
evaluated users' held-out period, evaluate refuses gold labels of users the tuning read; each
in one line with the option that goes on, and the report names an allowed overlap."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cli_in_process import run_cli
from recjudge.data import Dataset, load_from_files
from recjudge.evaluators import GoldSample
from recjudge.evaluators.offline._jobs import _check_tuned_gold
from recjudge.tune import (
    TunedLeakageError,
    gold_overlap,
    period_overlap,
    refuse_gold,
    refuse_period,
)
from tuned_folders import fake_tuned


def _feedback(rows):
    inter = pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp"])
    inter["rating"], inter["event_type"] = 5.0, "rating"
    items = pd.DataFrame({"item_id": sorted(set(inter["item_id"])), "title": "t"})
    return Dataset("fb", inter, items)


def test_the_period_rule_counts_users_read_past_their_first_held_out_interaction(tmp_path):
    model = fake_tuned(tmp_path / "m", {"a": 5.0, "b": 20.0, "c": 10.0})
    fb = _feedback([("a", "x", 10), ("b", "x", 10), ("c", "y", 10), ("d", "y", 1)])
    got = period_overlap(model, fb, ["a", "b", "c", "d"])
    # b was read at 20 > 10; c at its first held-out timestamp is a tie, not counted
    assert got == {"evaluated_users": 4, "read_by_tuning": 3, "period_overlap": 1,
                   "example": "b"}  # fmt: skip
    with pytest.raises(TunedLeakageError, match="tuned on the evaluated period.*--allow-tuned"):
        refuse_period(got, str(model), allow=False)
    refuse_period(got, str(model), allow=True)
    assert period_overlap(tmp_path, fb, ["a"]) is None  # not a tuned folder


def test_the_gold_rule_counts_gold_users_the_tuning_read(tmp_path):
    model = fake_tuned(tmp_path / "m", {"a": 5.0, "b": 20.0})
    got = gold_overlap(model, ["b", "e", "b"])
    assert got == {"gold_users": 2, "read_by_tuning": 1, "example": "b"}
    with pytest.raises(TunedLeakageError, match="tuned on gold users"):
        refuse_gold(got, str(model), allow=False)
    refuse_gold(gold_overlap(model, ["e", "f"]), str(model), allow=False)


def test_a_users_record_that_is_not_the_cards_is_refused(tmp_path):
    model = fake_tuned(tmp_path / "m", {"a": 5.0})
    (model / "tuning-users.json").write_text(json.dumps({"last_time": {}}))
    with pytest.raises(TunedLeakageError, match="not the one its card lists"):
        gold_overlap(model, ["a"])


def test_evaluate_refuses_gold_of_users_the_tuning_read(tmp_path):
    model = fake_tuned(tmp_path / "m", {"a": 5.0})
    gold = GoldSample({("a", "x"): 1, ("e", "y"): 0})
    summary = {"judge": {"model": str(model)}, "tuned": {"period_overlap": 0}}
    with pytest.raises(TunedLeakageError, match="1 of the 2 users of the gold sample"):
        _check_tuned_gold(summary, gold, allow=False)
    _check_tuned_gold(summary, gold, allow=True)
    assert summary["tuned"]["gold"]["read_by_tuning"] == 1
    gone = {"judge": {"model": str(tmp_path / "moved")}, "tuned": {"period_overlap": 0}}
    with pytest.raises(TunedLeakageError, match="is not here"):
        _check_tuned_gold(gone, gold, allow=False)


def test_impute_refuses_a_judge_tuned_on_the_evaluated_period_in_one_line(tmp_path):
    log = "user_id,item_id,timestamp,rating\n" + "".join(
        f"u{u},i{i},{10 * u + i},{1 + (u + i) % 5}\n" for u in range(4) for i in range(8)
    )
    lines = log.splitlines()[1:]
    past = "".join(ln + "\n" for ln in lines if int(ln.split(",")[1][1:]) < 6)
    future = "".join(ln + "\n" for ln in lines if int(ln.split(",")[1][1:]) >= 6)
    items = "item_id,title\n" + "".join(f"i{i},Movie {i} (199{i})\n" for i in range(10))
    header = "user_id,item_id,timestamp,rating\n"
    (tmp_path / "items.csv").write_text(items)
    for name, body in (("past", past), ("future", future)):
        (tmp_path / f"{name}.csv").write_text(header + body)
        load_from_files(tmp_path / f"{name}.csv", tmp_path / "items.csv", name=name).save(
            tmp_path / name)  # fmt: skip
    (tmp_path / "run.jsonl").write_text("".join(
        json.dumps({"user_id": f"u{u}", "item_id": f"i{i}", "score": 9 - i}) + "\n"
        for u in range(4) for i in (6, 7, 8)))  # fmt: skip
    # the tuning read u1 up to its last interaction (the held-out ones included)
    model = fake_tuned(tmp_path / "tuned", {"u1": 17.0, "u2": 25.0})
    args = ["impute", "--data", str(tmp_path / "past"), "--feedback", str(tmp_path / "future"),
            "--runs", str(tmp_path / "run.jsonl"), "--model", str(model), "--k", "3",
            "--out", str(tmp_path / "imp")]  # fmt: skip
    r = run_cli(*args)
    assert r.code == 2 and "Traceback" not in r.stderr
    assert "tuned on the evaluated period" in r.stderr and "--allow-tuned-overlap" in r.stderr
    assert "user 'u1'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "imp" / "store.sqlite").exists()  # refused before any judging
