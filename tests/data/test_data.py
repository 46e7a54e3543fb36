"""Data layer: real counts, event mappings, splits (hypothesis), rendering and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recjudge.data import (
    EVENT_TYPES,
    DataError,
    Dataset,
    bookcrossing_event,
    clean_text,
    export_gistbench,
    kcore,
    leave_one_out,
    load_dataset,
    load_from_files,
    movielens_event,
    render_item,
    sample_users,
    temporal_split,
    timeline_split,
)
from recjudge.data._loaders import _parsed_cache
from recjudge.data._schema import _event_types


# -- real data ---------------------------------------------------------------------------
def test_ml1m_counts(ml1m):
    info = ml1m.info()
    assert info["interactions"] == 1_000_209
    assert info["users"] == 6_040
    assert info["items_rated"] == 3_706
    assert info["items"] == 3_883
    assert sum(info["event_types"].values()) == 1_000_209
    assert info["event_types"]["explicit_positive"] == int((ml1m.interactions.rating == 5).sum())
    assert ml1m.interactions["user_id"].map(type).eq(str).all()
    assert ml1m.has_item("Toy Story (1995)")


def test_ml1m_history_is_chronological(ml1m):
    h = ml1m.history("1")
    assert len(h) == 53
    assert h["timestamp"].is_monotonic_increasing
    with pytest.raises(KeyError, match="not in dataset"):
        ml1m.history("999999")


def test_ml100k_original_ids(ml100k):
    info = ml100k.info()
    assert (info["interactions"], info["users"], info["items"]) == (100_000, 943, 1_682)
    assert ml100k.item_row("1")["title"] == "Toy Story (1995)"
    assert "Animation" in ml100k.item_row("1")["genres"]


def test_items_rendered_in_one_pass_equal_those_rendered_one_by_one():
    """``rendered_many`` reads the items it has not rendered in one pass over the table:
    the same (title, text) as ``rendered`` gives each alone, repeats and all."""
    one, many = load_dataset("ml-100k"), load_dataset("ml-100k")
    ids = one.items.item_id.astype(str).tolist()
    ids = ids[::-1] + ids[:7]  # another order, and repeats
    assert many.rendered_many(ids) == [one.rendered(i) for i in ids]
    with pytest.raises(KeyError):
        many.rendered_many(["1", "no-such-item"])


def test_history_columns_are_the_history_rows_on_either_path():
    """``history_columns`` answers the first lookups from ``history``'s scan and the rest
    from one pass over the sorted table: the same ids, timestamps and ratings in the same
    order either way (ties in time included), and an unknown user's KeyError names it."""
    ds = load_dataset("ml-100k")
    users = sorted(ds.interactions.user_id.astype(str).unique())[:12]
    for u in users:  # the first ones before the table's pass, the rest after it
        ids, ts, ratings = ds.history_columns(u)
        rows = ds.interactions[ds.interactions["user_id"].astype(str) == u]
        rows = rows.sort_values("timestamp", kind="stable")
        assert ids == rows["item_id"].astype(str).tolist()
        assert ts.tolist() == rows["timestamp"].tolist()
        assert ratings == rows["rating"].tolist()
    assert ds._columns is not None  # the pass was made, and answered the later users
    with pytest.raises(KeyError, match="ghost"):
        ds.history_columns("ghost")


def test_event_mapping_tables():
    ml = movielens_event(pd.Series([1.0, 2, 3, 4, 5]))
    assert ml.tolist() == [
        "explicit_negative",
        "explicit_negative",
        "implicit_positive",
        "implicit_positive",
        "explicit_positive",
    ]
    bx = bookcrossing_event(pd.Series([0.0, 1, 4, 5, 7, 8, 10]))
    assert bx.tolist() == [
        "implicit_positive",
        "explicit_negative",
        "explicit_negative",
        "implicit_positive",
        "implicit_positive",
        "explicit_positive",
        "explicit_positive",
    ]


def test_render_movies_and_books():
    assert (
        render_item(
            {"title": "Toy Story (1995)", "year": 1995, "genres": "Animation|Comedy"}, "movies"
        )
        == "Toy Story (1995) | Animation, Comedy"
    )
    assert render_item({"title": "Heat", "year": 1995, "genres": ""}, "movies") == "Heat (1995)"
    assert (
        render_item({"title": "Emma", "author": "Jane Austen", "year": 1815}, "books")
        == "Emma by Jane Austen (1815)"
    )
    assert render_item({"title": "Emma", "author": None, "year": None}, "books") == "Emma"


@given(st.text(max_size=400))
def test_clean_text_strips_controls_and_caps(s):
    out = clean_text(s, max_chars=50)
    assert len(out) <= 50
    assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in out)
    assert out == out.strip()


# -- splits ------------------------------------------------------------------------------
def _frame(counts: list[int], seed: int) -> pd.DataFrame:
    rs = np.random.default_rng(seed)
    rows = []
    for u, n in enumerate(counts):
        ts = rs.integers(0, 50, size=n)  # ties on purpose
        for i, t in enumerate(ts):
            rows.append((str(u), f"i{u}_{i}", float(t), 3.0, "implicit_positive"))
    return pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp", "rating", "event_type"])


counts_st = st.lists(st.integers(1, 12), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(counts_st, st.integers(0, 10))
def test_leave_one_out_invariants(counts, seed):
    df = _frame(counts, seed)
    s = leave_one_out(df)
    assert len(s.train) + len(s.valid) + len(s.test) == len(df)
    allrows = pd.concat([s.train, s.valid, s.test])
    assert not allrows.duplicated(["user_id", "item_id"]).any()
    for u, n in enumerate(counts):
        u = str(u)
        tr, va, te = (x[x.user_id == u] for x in (s.train, s.valid, s.test))
        if n < 4:
            assert (len(tr), len(va), len(te)) == (n, 0, 0)
        else:
            assert (len(va), len(te)) == (1, 1)
            assert tr.timestamp.max() <= va.timestamp.iloc[0] <= te.timestamp.iloc[0]


@settings(max_examples=40, deadline=None)
@given(counts_st, st.floats(0.05, 0.95), st.integers(0, 10))
def test_timeline_split_invariants(counts, frac, seed):
    df = _frame(counts, seed)
    past, future = timeline_split(df, fraction=frac)
    assert len(past) + len(future) == len(df)
    for u in past.user_id.unique():
        p, f = past[past.user_id == u], future[future.user_id == u]
        assert len(p) >= 1
        if len(f):
            assert p.timestamp.max() <= f.timestamp.min()
    past2, future2 = timeline_split(df, future_count=2)
    assert (future2.groupby("user_id").size() <= 2).all()


@settings(max_examples=30, deadline=None)
@given(counts_st, st.floats(0.1, 0.9), st.integers(0, 10))
def test_temporal_split_invariants(counts, q, seed):
    df = _frame(counts, seed)
    past, future = temporal_split(df, quantile=q)
    assert len(past) + len(future) == len(df)
    if len(past) and len(future):
        assert past.timestamp.max() < future.timestamp.min()


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), min_size=1, max_size=80, unique=True),
    st.integers(1, 4),
)
def test_kcore_invariants(pairs, k):
    df = pd.DataFrame(
        [(str(u), str(i), 0.0, 1.0, "implicit_positive") for u, i in pairs],
        columns=["user_id", "item_id", "timestamp", "rating", "event_type"],
    )
    out, report = kcore(df, k)
    if len(out):
        assert out.groupby("user_id").size().min() >= k
        assert out.groupby("item_id").size().min() >= k
    assert report["rows_removed"] == len(df) - len(out)


def test_sample_users_is_process_independent():
    ids = [str(i) for i in range(500)]
    here = sample_users(ids, 10, seed=42)
    code = (
        "from recjudge.data import sample_users;"
        "print(','.join(sample_users([str(i) for i in range(500)], 10, seed=42)))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        check=True,
    ).stdout.strip()
    assert other.split(",") == here
    assert sample_users(ids, 20, seed=42)[:10] == here  # prefix-stable
    assert sample_users(ids, 10, seed=43) != here


# -- from files and bad input -------------------------------------------------------------
def _write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


GOOD = "uid,iid,ts,stars\n1,a,10,5\n1,b,11,2\n2,a,12,4\n"
MAP = "user_id=uid,item_id=iid,timestamp=ts,rating=stars"


def test_from_files_with_mapping(tmp_path):
    ds = load_from_files(_write(tmp_path / "x.csv", GOOD), mapping=MAP)
    assert ds.info()["interactions"] == 3
    assert ds.interactions.event_type.astype(str).tolist() == [
        "explicit_positive",
        "explicit_negative",
        "implicit_positive",
    ]


def test_from_files_toml_mapping(tmp_path):
    toml = _write(
        tmp_path / "m.toml",
        '[columns]\nuser_id = "uid"\nitem_id = "iid"\ntimestamp = "ts"\nrating = "stars"\n',
    )
    ds = load_from_files(_write(tmp_path / "x.csv", GOOD), mapping=str(toml))
    assert ds.info()["users"] == 2


@pytest.mark.parametrize(
    ("content", "mapping", "kwargs", "row", "field", "words"),
    [
        ("uid,ts,stars\n1,10,5\n", MAP, {}, None, "iid", "missing column"),
        ("uid,iid,ts,stars\n1,a,10,5\n1,b,11,five\n", MAP, {}, 2, "rating", "not a number"),
        (
            "uid,iid,ts,kind\n1,a,10,liked\n2,a,1,clicked\n",
            "user_id=uid,item_id=iid,timestamp=ts,event_type=kind",
            {},
            1,
            "event_type",
            "unknown event type",
        ),
        (
            "uid,iid,ts,stars\n1,a,10,5\n1,a,10,5\n",
            MAP,
            {},
            2,
            "user_id,item_id,timestamp",
            "duplicate",
        ),
    ],
)
def test_bad_input_messages(tmp_path, content, mapping, kwargs, row, field, words):
    path = _write(tmp_path / "bad.csv", content)
    with pytest.raises(DataError) as e:
        load_from_files(path, mapping=mapping, **kwargs)
    msg = str(e.value)
    assert str(path) in msg and words in msg and "Fix:" in msg
    assert e.value.row == row
    assert field in msg


def test_dedupe_reports_count(tmp_path):
    path = _write(tmp_path / "d.csv", "uid,iid,ts,stars\n1,a,10,5\n1,a,10,5\n1,b,11,3\n")
    ds = load_from_files(path, mapping=MAP, dedupe=True)
    assert ds.card["removed"]["duplicates"] == 1
    assert len(ds.interactions) == 2


def test_orphan_item_names_row(tmp_path):
    inter = _write(tmp_path / "i.csv", GOOD)
    items = _write(tmp_path / "items.csv", "item_id,title\na,Alpha\n")
    with pytest.raises(DataError, match=r"row 2.*'b' has no row in the items table") as e:
        load_from_files(inter, items=items, mapping=MAP)
    assert e.value.field == "item_id"


def test_bad_encoding_names_line_and_fix(tmp_path):
    path = _write(tmp_path / "latin.csv", "uid,iid,ts,stars\n1,Amélie,10,5\n", "latin-1")
    with pytest.raises(DataError, match=r"latin-1") as e:
        load_from_files(path, mapping=MAP)
    assert "line 2" in str(e.value) and str(path) in str(e.value)
    ds = load_from_files(path, mapping=MAP, encoding="latin-1")
    assert ds.interactions.item_id.iloc[0] == "Amélie"


def test_gistbench_round_trip(tmp_path, ml100k):
    small = ml100k.with_interactions(
        ml100k.interactions[ml100k.interactions.user_id.isin(["1", "2"])]
    )
    for suffix in (".csv", ".jsonl"):
        out = export_gistbench(small, tmp_path / f"g{suffix}")
        if suffix == ".jsonl":
            first = json.loads(out.read_text().splitlines()[0])
            assert set(first) == {
                "user_id",
                "object_id",
                "object_text",
                "interaction_type",
                "interaction_time",
            }
        back = load_from_files(out, fmt="gistbench", name="back")
        assert len(back.interactions) == len(small.interactions)
        assert (
            back.interactions.event_type.astype(str).tolist()
            == small.interactions.event_type.astype(str).tolist()
        )
        assert set(back.items.item_id) == set(small.interactions.item_id)
        title = back.items.set_index("item_id").loc["1", "title"]
        assert title.startswith("Toy Story (1995)")


def test_dataset_save_load_round_trip(tmp_path, ml100k):
    small = ml100k.with_interactions(ml100k.interactions.head(500), note="head(500)")
    small.save(tmp_path / "ds")
    back = Dataset.load(tmp_path / "ds")
    pd.testing.assert_frame_equal(back.interactions, small.interactions)
    assert back.card["filters"] == ["head(500)"]
    assert list(back.interactions.event_type.cat.categories) == list(EVENT_TYPES)


def test_event_types_read_back_by_value_whatever_the_stored_categories():
    """A stored column's categories may come in any order, hold values outside
    EVENT_TYPES or be missing: each row keeps its own value, in EVENT_TYPES' categories."""
    values = ["explicit_negative", None, "implicit_positive", "bogus", "explicit_negative"]
    for stored in (
        pd.Series(values, dtype="string"),
        pd.Series(
            pd.Categorical(values, categories=["implicit_positive", "bogus", "explicit_negative"])
        ),  # fmt: skip
        pd.Series(values, dtype=object),
    ):
        got = _event_types(stored)
        assert list(got.categories) == list(EVENT_TYPES)
        want = [v if v in EVENT_TYPES else None for v in values]
        assert [None if pd.isna(x) else x for x in got] == want


def test_bookcrossing_from_wheel():
    ds = load_dataset("bookcrossing")
    info = ds.info()
    assert info["interactions"] + ds.card["dropped_ratings_without_book_row"] == 1_149_780
    # 271,379 rows in BX-Books.csv; one ISBN repeats once white space is stripped.
    assert info["items"] == 271_378
    assert ds.items["item_id"].is_unique
    zero = ds.interactions[ds.interactions.rating == 0]
    assert (zero.event_type.astype(str) == "implicit_positive").all()
    assert ds.domain == "books"
    row = ds.item_row("0195153448")
    assert render_item(row.to_dict(), "books") == "Classical Mythology by Mark P. O. Morford (2002)"


def test_parsed_cache_round_trips_exactly(tmp_path, monkeypatch):
    """The parquet copy of a registered dataset equals a fresh parse, and a damaged copy is
    rebuilt instead of trusted."""
    monkeypatch.setenv("RECJUDGE_CACHE", str(tmp_path))
    fresh = load_dataset("ml-100k", cache=False)
    first = load_dataset("ml-100k")  # parses and writes the copy
    where = _parsed_cache("ml-100k", {})
    assert where is not None and (where / "interactions.parquet").exists()
    cached = load_dataset("ml-100k")
    for a, b in ((fresh, first), (fresh, cached)):
        pd.testing.assert_frame_equal(a.interactions, b.interactions)
        pd.testing.assert_frame_equal(a.items, b.items)
        pd.testing.assert_frame_equal(a.users, b.users)
        assert (a.name, a.domain, a.card) == (b.name, b.domain, b.card)
    (where / "items.parquet").write_bytes(b"not parquet")
    rebuilt = load_dataset("ml-100k")
    pd.testing.assert_frame_equal(fresh.items, rebuilt.items)


def test_history_by_scan_equals_the_per_user_index(tmp_path):
    """The first lookups scan (a single judgment needs one user); later ones use the index;
    both give the same rows in the same order, ties in time kept in file order."""
    log = "user_id,item_id,timestamp,rating\n" + "".join(
        f"u{u},i{(u * 7 + k) % 11},{k // 2},{1 + k % 5}\n" for u in range(6) for k in range(9)
    )
    (tmp_path / "log.csv").write_text(log)
    ds = load_from_files(tmp_path / "log.csv", name="toy")
    users = [f"u{u}" for u in range(6)]
    scanned = [ds.history(u) for u in users[: Dataset.SCAN_LOOKUPS]]
    indexed = [ds.history(u) for u in users]  # past the scan budget: the index
    for a, b in zip(scanned, indexed, strict=False):
        assert a.equals(b) and list(a.index) == list(b.index)
    fresh = load_from_files(tmp_path / "log.csv", name="toy")
    with pytest.raises(KeyError, match="u9"):
        fresh.history("u9")  # an unknown user is still a clear error on the scan path


def test_bidi_overrides_and_zero_width_characters_never_reach_a_prompt():
    """Issue 110: U+202E passed into prompts and every printed evidence list (display
    spoofing, Trojan Source); joiners that scripts need stay."""
    spoof = "Heat (1995)\u202e)5991( taeH\u2066\u2069\u200b\u200e\u200f\ufeff\u061c"
    got = clean_text(spoof)
    assert not any(c in got for c in "\u202e\u2066\u2069\u200b\u200e\u200f\ufeff\u061c")
    assert got.startswith("Heat (1995)")
    assert clean_text("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645") == (
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"
    )  # ZWNJ in Persian stays


def test_import_says_how_ratings_became_events_and_takes_a_threshold(tmp_path):
    """Issue 112: ML-100K's ratings 3-4 became implicit_positive (61,319 of 100,000) without
    a word; the card now says how and counts each event type, and --positive-rating sets it."""
    (tmp_path / "log.csv").write_text("user_id,item_id,rating\n1,a,5\n1,b,4\n2,a,3\n2,b,1\n")
    ds = load_from_files(tmp_path / "log.csv")
    assert "star convention" in ds.card["event_mapping"]
    assert ds.card["event_counts"]["implicit_positive"] == 2
    ds = load_from_files(tmp_path / "log.csv", positive_rating=4)
    assert ds.card["event_counts"]["explicit_positive"] == 2
    assert ds.card["event_counts"]["explicit_negative"] == 2
    assert ds.card["event_mapping"].startswith("rating >= 4 explicit_positive")
