"""Fuzz: the readers of files people hand us (runs, qrels, gold labels, interaction logs,
checkpoints) on arbitrary bytes and on near-valid files with hostile fields.

Each reader either returns what it read or raises a ``UserFacingError`` (one line naming the
file and what to fix, exit 2 at the CLI); any other exception is a traceback for the user."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path

import pytest
from _fuzz import FUZZ, json_values, texts
from hypothesis import example, given
from hypothesis import strategies as st

from recjudge._util import UserFacingError
from recjudge.data import load_from_files
from recjudge.evaluators.offline import read_qrels, read_run
from recjudge.evaluators.offline._calibrate import read_labels
from recjudge.reward import import_portable

ids = st.one_of(st.sampled_from(["1", "u 1", "a,b", '"q"', "\t", "", "é", "1e3", "-0"]), texts)
numbers = st.one_of(st.integers(-5, 5).map(str), st.sampled_from(["nan", "inf", "-inf", "1e999",
                    "", "x", "0.5", "1.0", " 1"]))  # fmt: skip


def _csv(header, rows) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode("utf-8", "surrogatepass")


def _files(kind: str):
    """Arbitrary bytes, or a file of the right format whose fields are hostile."""
    raw = st.binary(max_size=300)
    if kind == "trec":
        line = st.tuples(ids, st.sampled_from(["Q0", "x"]), ids, numbers, numbers, ids)
        near = st.lists(line, max_size=6).map(
            lambda rows: "\n".join(" ".join(r) for r in rows).encode("utf-8", "surrogatepass")
        )
    elif kind == "jsonl":
        rec = st.one_of(
            json_values,
            st.fixed_dictionaries(
                {"user_id": json_values, "item_id": json_values, "score": json_values}
            ),
        )
        near = st.lists(rec, max_size=6).map(
            lambda rows: "\n".join(json.dumps(r) for r in rows).encode("utf-8", "surrogatepass")
        )
    elif kind == "json":
        near = st.dictionaries(
            ids, st.one_of(json_values, st.dictionaries(ids, json_values)), max_size=4
        ).map(lambda d: json.dumps(d).encode("utf-8", "surrogatepass"))
    else:  # csv with the columns a reader asks for
        cols = {
            "labels": ["user_id", "item_id", "label"],
            "log": ["user_id", "item_id", "timestamp", "rating"],
        }[kind]
        header = st.one_of(st.just(cols), st.lists(st.sampled_from(cols + ["x", ""]),
                                                     max_size=5))  # fmt: skip
        near = st.tuples(header, st.lists(st.lists(st.one_of(ids, numbers), max_size=5),
                                          max_size=6)).map(lambda hr: _csv(*hr))  # fmt: skip
    return st.one_of(raw, near)


def _read(reader, data: bytes, suffix: str):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"file{suffix}"
        path.write_bytes(data)
        try:
            reader(path)
        except UserFacingError as e:
            assert str(e).strip(), "an error without a message"
            assert "Traceback" not in str(e)


def _run_reader(fmt: str):
    return lambda p: read_run(p, fmt=fmt)


def _labels(p):
    return read_labels(p)


def _log(p):
    return load_from_files(p)


#: (file kind the strategy writes, reader, file suffix)
READERS = {
    "run-trec": ("trec", _run_reader("trec"), ".trec"),
    "run-jsonl": ("jsonl", _run_reader("auto"), ".jsonl"),
    "run-ranx-json": ("json", _run_reader("auto"), ".json"),
    "gold-labels": ("labels", _labels, ".csv"),
    "interaction-log": ("log", _log, ".csv"),
}


@pytest.mark.parametrize("name", list(READERS))
@FUZZ
@given(data=st.data())
def test_a_reader_returns_or_says_what_is_wrong_in_one_line(name, data):
    kind, reader, suffix = READERS[name]
    _read(reader, data.draw(_files(kind)), suffix)


@FUZZ
@given(st.one_of(_files("json"), _files("trec")), st.sampled_from([".json", ".trec"]))
@example(b"\x80", ".trec")  # found by this target: UnicodeDecodeError
@example(b'{"u": {"i": 1e999}}', ".json")  # OverflowError
def test_qrels_reader(data, suffix):
    _read(read_qrels, data, suffix)


@pytest.mark.parametrize("grade", ["1.5", "1e999", '"1"', "[1]"])
def test_a_qrels_grade_that_is_not_an_integer_is_refused_not_truncated(tmp_path, grade):
    path = tmp_path / "q.json"
    path.write_text('{"u": {"i": ' + grade + "}}")
    with pytest.raises(UserFacingError, match="not an integer"):
        read_qrels(path)
    path.write_text('{"u": {"i": 2.0, "j": true}}')
    assert read_qrels(path) == {"u": {"i": 2, "j": 1}}


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=400),
        st.lists(json_values, max_size=4).map(
            lambda rows: "\n".join(json.dumps(r) for r in rows).encode("utf-8", "surrogatepass")
        ),
    )
)
def test_checkpoint_import_refuses_what_it_cannot_verify(data):
    with tempfile.TemporaryDirectory() as d:
        ckpt = Path(d) / "x.ckpt"
        ckpt.write_bytes(data)
        store = Path(d) / "store.sqlite"
        with pytest.raises(UserFacingError):
            import_portable(ckpt, store)
        assert not store.exists()  # checked whole before anything is written
