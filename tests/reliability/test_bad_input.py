"""Bad input gets a clear error naming the file, row and field and a fix that exists."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from recjudge.cf_models import CFMismatchError, Pop, TrainOptions, check_fits
from recjudge.data import DataError, load_from_files
from recjudge.reward import (
    HistoryItem,
    Judge,
    JudgeConfig,
    JudgeRequest,
    ResultsStore,
    StoreError,
    request_for,
    salvage,
)
from recjudge.reward._prompt import citable


@pytest.mark.parametrize(
    ("rating", "words"),
    [("inf", "not a finite number"), ("-inf", "not a finite number"),
     ("-7", "outside the 1-5 star scale"), ("1e308", "outside the 1-5 star scale")],
)  # fmt: skip
def test_ratings_that_would_be_silently_wrong_are_rejected(tmp_path, rating, words):
    f = tmp_path / "log.csv"
    f.write_text(f"uid,iid,stars\nu1,a,4\nu1,b,{rating}\n")
    with pytest.raises(DataError, match=words) as e:
        load_from_files(f, mapping="user_id=uid,item_id=iid,rating=stars")
    assert e.value.source == str(f) and e.value.row == 2 and e.value.field in ("stars", "rating")
    assert e.value.fix


def test_header_only_file_is_rejected(tmp_path):
    f = tmp_path / "log.csv"
    f.write_text("user_id,item_id,rating\n")
    with pytest.raises(DataError, match="no interactions") as e:
        load_from_files(f)
    assert str(f) in str(e.value)


def test_duplicate_titles_are_not_resolved_silently(tmp_path):
    log, items = tmp_path / "log.csv", tmp_path / "items.csv"
    log.write_text("user_id,item_id,timestamp\nu1,a,1\nu1,c,2\n")
    items.write_text("item_id,title\na,Heat (1995)\nb,Heat (1995)\nc,Up (2009)\n")
    ds = load_from_files(log, items)
    with pytest.raises(ValueError, match=r"names 2 items .*'a', 'b'.*give the item id"):
        request_for(ds, "u1", "Heat (1995)")
    assert request_for(ds, "u1", "b").candidate_id == "b"


def test_cf_model_from_other_data_is_refused(ml100k):
    other = pd.DataFrame(
        {"user_id": ["x", "y"], "item_id": ["i1", "i2"], "timestamp": [0.0, 1.0], "rating": 4.0}
    )
    model = Pop().train(other, TrainOptions(progress=False))
    model.train_info["dataset"] = "somewhere-else"
    with pytest.raises(CFMismatchError, match="somewhere-else.*0% are known.*cf train"):
        check_fits(model, ml100k)
    assert check_fits(model, ml100k, allow_mismatch=True) == 0.0
    own = Pop().train(ml100k.interactions, TrainOptions(progress=False))
    own.train_info["dataset"] = ml100k.name
    assert check_fits(own, ml100k) == 1.0


def test_unreadable_store_is_named_and_repair_keeps_readable_rows(tmp_path):
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=f"{garbage}.*--repair"):
        ResultsStore(garbage)
    assert salvage(garbage, tmp_path / "none.sqlite") == (0, 0)
    good = tmp_path / "good.sqlite"
    with ResultsStore(good) as st:
        st.put_many([(f"k{i}", {"i": i}, {"p": i / 10}) for i in range(5)])
    with ResultsStore(good) as st:  # damage one stored result's text
        st._db.execute("UPDATE results SET result = '{broken' WHERE key = 'k2'")
    assert salvage(good, tmp_path / "new.sqlite") == (4, 1)
    with ResultsStore(tmp_path / "new.sqlite") as st:
        assert sorted(st.get_many([f"k{i}" for i in range(5)])) == ["k0", "k1", "k3", "k4"]


def test_stored_result_with_missing_fields_is_named(smollm, tmp_path):
    hist = [HistoryItem("a", "Heat (1995)", "Heat (1995)", 4.0)]
    req = JudgeRequest("u", hist, "b", "Up (2009)", "Up (2009)")
    judge = Judge(JudgeConfig(mode="zero-shot"), llm=smollm)
    with ResultsStore(tmp_path / "s.sqlite") as st:
        st.put_many([(judge.key(req), {}, {"user_id": "u"})])
        with pytest.raises(StoreError, match=r"s.sqlite.*lacks \['candidate_id'"):
            judge.judge_many([req], store=st)


def test_hand_edited_stored_result_is_refused_and_repair_rejudges_it(smollm, tmp_path):
    hist = [HistoryItem("a", "Heat (1995)", "Heat (1995)", 4.0)]
    reqs = [JudgeRequest("u", hist, c, t, t) for c, t in [("b", "Up (2009)"), ("c", "Jaws (1975)")]]
    judge = Judge(JudgeConfig(mode="zero-shot"), llm=smollm)
    path = tmp_path / "s.sqlite"
    with ResultsStore(path) as st:
        first = judge.judge_many(reqs, store=st)
        key = judge.key(reqs[0])
        flipped = json.dumps({**first[0].to_dict(), "is_relevant": not first[0].is_relevant})
        st._db.execute("UPDATE results SET result = ? WHERE key = ?", (flipped, key))
        with pytest.raises(StoreError, match=f"s.sqlite.*{key}.*changed after it was written"):
            judge.judge_many(reqs, store=st)
    assert salvage(path, tmp_path / "fixed.sqlite") == (1, 1)  # the edited row is not kept
    with ResultsStore(tmp_path / "fixed.sqlite") as st:
        again = judge.judge_many(reqs, store=st)
        assert judge.last_run.judged == 1 and judge.last_run.reused == 1
    assert [j.is_relevant for j in again] == [j.is_relevant for j in first]


def test_long_titles_equal_after_truncation_stay_distinct_and_resolve(tmp_path):
    log, items = tmp_path / "log.csv", tmp_path / "items.csv"
    stem = "An Extremely Long Title " * 20  # 480 characters, cut to 200 when shown
    log.write_text("user_id,item_id,timestamp\nu1,a,1\nu1,b,2\nu1,c,3\n")
    items.write_text(f'item_id,title\na,"{stem} Part One"\nb,"{stem} Part Two"\nc,Up (2009)\n')
    ds = load_from_files(log, items)
    req = request_for(ds, "u1", "c")
    shown = citable(req.history)
    titles = [h.title for h in shown]
    assert len(set(titles)) == 2 and all(len(t) < 260 for t in titles)
    assert {t.rsplit("[id ", 1)[1].rstrip("]") for t in titles} == {"a", "b"}
