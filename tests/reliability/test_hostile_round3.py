"""Hostile input, round 3: the commands added last round, forged checkpoints, TREC files.

Each case asserts its exact outcome: a refusal (exit 2, one line naming the file/row/field and
a fix that exists, no traceback) or a correct result (exit 0 and the value that proves it).
"""

# ruff: noqa: E501  (the case tables keep one case per line or two, for reading)
from __future__ import annotations

import gzip
import json
import os
import tracemalloc
from pathlib import Path

import ir_measures
import pytest

from cli_in_process import run_cli
from cli_in_process import write_files as _write
from recjudge.data import load_dataset, load_from_files
from recjudge.evaluators import (
    from_trec_id,
    logged_qrels,
    read_qrels,
    read_run,
    trec_id,
    write_qrels,
)
from recjudge.evaluators.gist._pipeline import PROFILE_INTEREST_CAP, read_profiles
from recjudge.reward import (
    HistoryItem,
    Judge,
    JudgeConfig,
    JudgeRequest,
    PortableError,
    ResultsStore,
    export_portable,
    import_portable,
)
from recjudge.reward._portable import _write as write_checkpoint

LOG = "user_id,item_id,timestamp,rating\n" + "".join(
    f"u{u},i{i},{10 * u + i},{1 + (u + i) % 5}\n" for u in range(3) for i in range(6)
)
ITEMS = "item_id,title\n" + "".join(f"i{i},Movie {i} (199{i})\n" for i in range(8))
IMPORT = ["data", "import"]


# -- checkpoints ---------------------------------------------------------------------------
def _judgment(key: str, yes: bool, p: float) -> dict:
    raw = '{"evidence": ["' if yes else '{"evidence": [], "is_relevant": "NO"}'
    return {"mode": "brief", "is_relevant": yes, "p_yes": p, "p_yes_semantic": p, "sigma": 0.1,
            "delta": 1.0, "entropy": 0.5, "raw_text": raw, "decision_steps": 1,
            "history_shown": 10, "history_dropped": 0, "samples_yes": None, "key": key}  # fmt: skip


ROWS = [
    {"table": "results", "key": "a" * 32, "result": _judgment("a" * 32, False, 0.2)},
    {"table": "results", "key": "b" * 32, "result": _judgment("b" * 32, True, 0.9)},
    {"table": "decisions", "key": "c" * 32, "result": {"branches": ["YES", "NO"], "chosen": "NO",
     "steps": [[[0, 1], [1.0, 2.0], [1.0, 2.0], 0.0]], "text": '{"evidence": [', "shown": 10, "dropped": 0}},
]  # fmt: skip


def _checkpoint(rows=ROWS, *, head=None, env_key=None, tmp: Path | None = None) -> bytes:
    """A checkpoint file's bytes as `recjudge store export` writes it (through its writer)."""
    counts = {t: sum(r.get("table") == t for r in rows) for t in ("results", "decisions")}
    out = (tmp or Path(".")) / "_ck.gz"
    old = os.environ.pop("RECJUDGE_CHECKPOINT_KEY", None)
    if env_key:
        os.environ["RECJUDGE_CHECKPOINT_KEY"] = env_key
    try:
        write_checkpoint(out, [json.dumps(r) for r in rows], {**counts, "left_out": 0}, "s")
    finally:
        os.environ.pop("RECJUDGE_CHECKPOINT_KEY", None)
        if old is not None:
            os.environ["RECJUDGE_CHECKPOINT_KEY"] = old
    data = out.read_bytes()
    out.unlink()
    if head is not None:  # rewrite the manifest line, keeping the rows
        lines = gzip.decompress(data).decode().splitlines()
        lines[0] = json.dumps(head(json.loads(lines[0])))
        data = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
    return data


def _edit(data: bytes, old: str, new: str) -> bytes:
    text = gzip.decompress(data).decode()
    assert old in text
    return gzip.compress(text.replace(old, new, 1).encode(), mtime=0)


def _v1(rows=ROWS) -> bytes:
    head = {"format": "recjudge-portable-store", "version": 1, "results": 2, "decisions": 1,
            "left_out": 0}  # fmt: skip
    return gzip.compress("\n".join(json.dumps(x) for x in [head, *rows]).encode() + b"\n", mtime=0)


def _with_row(row) -> list:
    return [*ROWS, row]


def _bomb() -> bytes:
    """~40 KB of gzip that inflates to 40 MiB of one row's worth of spaces."""
    head = json.dumps({"format": "recjudge-portable-store", "version": 2}).encode() + b"\n"
    return gzip.compress(head + b" " * (40 * 2**20), compresslevel=9)


def _many_lines() -> bytes:
    """Small gzip, ~40 MiB of well-formed rows: refused by a 1 MiB bound before it is all
    inflated (or held)."""
    head = json.dumps({"format": "recjudge-portable-store", "version": 2}).encode() + b"\n"
    row = (json.dumps(ROWS[0]) + "\n").encode()
    return gzip.compress(head + row * (40 * 2**20 // len(row)), compresslevel=9)


STORE_IMPORT = ["store", "import", "{t}/ck.gz", "--into", "{t}/s.sqlite"]

# (id, checkpoint bytes (a function of the case folder) or None, extra argv, env, words)
REFUSED_CHECKPOINTS = [
    ("ck-verdict-flipped", lambda t: _edit(_checkpoint(tmp=t), '"is_relevant": false, "p_yes": 0.2', '"is_relevant": true, "p_yes": 0.2'), [], {}, ["ck.gz", "contradicts its own answer text", "line 2"]),
    ("ck-verdict-and-text-flipped", lambda t: _edit(_checkpoint(tmp=t), '"is_relevant": false, "p_yes": 0.2, "p_yes_semantic": 0.2, "sigma": 0.1, "delta": 1.0, "entropy": 0.5, "raw_text": "{\\"evidence\\": [], \\"is_relevant\\": \\"NO\\"}"', '"is_relevant": true, "p_yes": 0.2, "p_yes_semantic": 0.2, "sigma": 0.1, "delta": 1.0, "entropy": 0.5, "raw_text": "{\\"evidence\\": [\\""'), [], {}, ["ck.gz", "does not match its digest", "--trust-unsigned"]),
    ("ck-probability-edited", lambda t: _edit(_checkpoint(tmp=t), '"p_yes": 0.9', '"p_yes": 0.8'), [], {}, ["ck.gz", "does not match its digest"]),
    ("ck-row-dropped", lambda t: gzip.compress("\n".join(gzip.decompress(_checkpoint(tmp=t)).decode().splitlines()[:-1]).encode() + b"\n"), [], {}, ["ck.gz", "holds 2 rows", "says 3"]),
    ("ck-row-duplicated", lambda t: gzip.compress((gzip.decompress(_checkpoint(tmp=t)).decode() + json.dumps(ROWS[0]) + "\n").encode()), [], {}, ["ck.gz", "holds 4 rows"]),
    ("ck-gzip-truncated", lambda t: _checkpoint(tmp=t)[:-12], [], {}, ["ck.gz", "damaged or truncated"]),
    ("ck-gzip-cut-in-half", lambda t: _checkpoint(tmp=t)[: len(_checkpoint(tmp=t)) // 2], [], {}, ["ck.gz", "damaged or truncated"]),
    ("ck-manifest-count-edited", lambda t: _checkpoint(tmp=t, head=lambda h: {**h, "results": 3}), [], {}, ["ck.gz", "says 3"]),
    ("ck-manifest-digest-removed", lambda t: _checkpoint(tmp=t, head=lambda h: {k: v for k, v in h.items() if k != "digest"}), [], {}, ["ck.gz", "does not match its digest"]),
    ("ck-version-1-unsigned", lambda t: _v1(), [], {}, ["ck.gz", "re-export it", "--trust-unsigned"]),
    ("ck-version-unknown", lambda t: _checkpoint(tmp=t, head=lambda h: {**h, "version": 9}), [], {}, ["ck.gz", "version 9", "export it again"]),
    ("ck-foreign-format", lambda t: gzip.compress(b'{"format": "other"}\n'), [], {}, ["ck.gz", "not a recjudge checkpoint"]),
    ("ck-empty-gzip", lambda t: gzip.compress(b""), [], {}, ["ck.gz", "not a recjudge checkpoint"]),
    ("ck-plain-text", lambda t: b"hello\n", [], {}, ["ck.gz", "not a whole gzip checkpoint"]),
    ("ck-sqlite-store", lambda t: b"SQLite format 3\x00" + b"\x00" * 100, [], {}, ["ck.gz", "a results store", "recjudge store export"]),
    ("ck-bomb-one-line", lambda t: _bomb(), [], {}, ["ck.gz", "line 2", "longer than 4 MiB"]),
    ("ck-bomb-many-lines", lambda t: _many_lines(), ["--max-size", "1"], {}, ["ck.gz", "inflates past 1 MiB", "--max-size"]),
    ("ck-row-foo", lambda t: _checkpoint(_with_row({"foo": 1}), tmp=t), [], {}, ["ck.gz", "line 5", "exactly table, key and result"]),
    ("ck-result-foo", lambda t: _checkpoint(_with_row({"table": "results", "key": "d" * 32, "result": {"foo": 1}}), tmp=t), [], {}, ["ck.gz", "line 5", "'mode' is missing"]),
    ("ck-judgment-extra-field", lambda t: _checkpoint(_with_row({"table": "results", "key": "d" * 32, "result": {**_judgment("d", True, 0.9), "user_id": "7"}}), tmp=t), [], {}, ["ck.gz", "'user_id' is no field"]),
    ("ck-p-yes-above-one", lambda t: _checkpoint(_with_row({"table": "results", "key": "d" * 32, "result": _judgment("d", True, 1.5)}), tmp=t), [], {}, ["ck.gz", "'p_yes'", "1.5"]),
    ("ck-p-yes-nan", lambda t: _checkpoint(_with_row({"table": "results", "key": "d" * 32, "result": _judgment("d", True, float("nan"))}), tmp=t), [], {}, ["ck.gz", "'p_yes'"]),
    ("ck-verdict-a-string", lambda t: _checkpoint(_with_row({"table": "results", "key": "d" * 32, "result": {**_judgment("d", True, 0.9), "is_relevant": "YES"}}), tmp=t), [], {}, ["ck.gz", "'is_relevant'"]),
    ("ck-answer-names-a-title", lambda t: _checkpoint(_with_row({"table": "results", "key": "d" * 32, "result": {**_judgment("d", True, 0.9), "raw_text": '{"evidence": ["Heat (1995)"'}}), tmp=t), [], {}, ["ck.gz", "'raw_text'"]),
    ("ck-sigma-out-of-range", lambda t: _checkpoint(_with_row({"table": "results", "key": "d" * 32, "result": {**_judgment("d", True, 0.9), "sigma": 7}}), tmp=t), [], {}, ["ck.gz", "'sigma'"]),
    ("ck-unknown-table", lambda t: _checkpoint(_with_row({"table": "users", "key": "d" * 32, "result": {}}), tmp=t), [], {}, ["ck.gz", "none of results, decisions, personas"]),
    ("ck-key-with-newline", lambda t: _checkpoint(_with_row({"table": "results", "key": "d\nd", "result": _judgment("d", True, 0.9)}), tmp=t), [], {}, ["ck.gz", "not a result key"]),
    ("ck-decision-chosen-unknown", lambda t: _checkpoint(_with_row({"table": "decisions", "key": "d" * 32, "result": {**ROWS[2]["result"], "chosen": "MAYBE"}}), tmp=t), [], {}, ["ck.gz", "'MAYBE' is none of its branches"]),
    ("ck-decision-one-branch", lambda t: _checkpoint(_with_row({"table": "decisions", "key": "d" * 32, "result": {**ROWS[2]["result"], "branches": ["YES"]}}), tmp=t), [], {}, ["ck.gz", "'branches'"]),
    ("ck-evaluator-answer-beside-its-form", lambda t: _checkpoint(_with_row({"table": "results", "key": "d" * 32, "result": {"value": "A wins", "notes": "Heat (1995) is great", "portable_form": {"value": "A wins"}}}), tmp=t), [], {}, ["ck.gz", "declared portable form"]),
    ("ck-unsigned-while-key-set", lambda t: _checkpoint(tmp=t), [], {"RECJUDGE_CHECKPOINT_KEY": "k3y"}, ["ck.gz", "is not signed"]),
    ("ck-signed-other-key", lambda t: _checkpoint(tmp=t, env_key="other"), [], {"RECJUDGE_CHECKPOINT_KEY": "k3y"}, ["ck.gz", "signature", "does not verify"]),
    ("ck-resigned-after-edit", lambda t: _edit(_checkpoint(tmp=t, env_key="k3y"), '"p_yes": 0.9', '"p_yes": 0.8'), [], {"RECJUDGE_CHECKPOINT_KEY": "k3y"}, ["ck.gz", "does not match its digest"]),
    ("ck-is-a-folder", None, [], {}, ["ck.gz", "a folder"]),
    ("ck-missing", "missing", [], {}, ["ck.gz", "no such file"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "make", "extra", "env", "words"),
    REFUSED_CHECKPOINTS,
    ids=[c[0] for c in REFUSED_CHECKPOINTS],
)
def test_a_bad_checkpoint_is_refused_whole(tmp_path, case, make, extra, env, words):
    if make is None:
        (tmp_path / "ck.gz").mkdir()
    elif make != "missing":
        (tmp_path / "ck.gz").write_bytes(make(tmp_path))
    argv = [a.replace("{t}", str(tmp_path)) for a in STORE_IMPORT] + extra
    r = run_cli(*argv, env={"RECJUDGE_CHECKPOINT_KEY": "", **env})
    assert r.code == 2, f"{case}: exit {r.code}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    text = " ".join(r.stderr.split())
    for w in words:
        assert w in text, f"{case}: {w!r} not in {r.stderr!r}"
    assert not (tmp_path / "s.sqlite").exists()  # nothing imported, no store created


def _import_json(tmp_path, data: bytes, *extra, env=None):
    (tmp_path / "ck.gz").write_bytes(data)
    argv = [a.replace("{t}", str(tmp_path)) for a in STORE_IMPORT]
    r = run_cli(*argv, *extra, "--json", env={"RECJUDGE_CHECKPOINT_KEY": "", **(env or {})})
    assert r.code == 0, r.stderr
    return json.loads(r.stdout)


def test_an_intact_checkpoint_imports_with_its_digest_checked(tmp_path):
    got = _import_json(tmp_path, _checkpoint(tmp=tmp_path))
    assert (got["results"], got["decisions"], got["verified"]) == (2, 1, "digest")


def test_a_signed_checkpoint_verifies_with_the_key(tmp_path):
    data = _checkpoint(tmp=tmp_path, env_key="k3y")
    got = _import_json(tmp_path, data, env={"RECJUDGE_CHECKPOINT_KEY": "k3y"})
    assert (got["results"], got["verified"]) == (2, "signed")
    assert "k3y" not in json.dumps(got)  # the key is never printed


def test_a_version_1_file_imports_only_when_trusted_and_says_so(tmp_path):
    got = _import_json(tmp_path, _v1(), "--trust-unsigned")
    assert (got["results"], got["decisions"], got["verified"]) == (2, 1, "unverified")


def test_an_imported_row_that_changes_a_stored_verdict_is_counted_and_not_applied(tmp_path):
    store = tmp_path / "s.sqlite"
    with ResultsStore(store) as s:  # the store already says YES under the key the file says NO
        s.put_many([("a" * 32, {}, {**_judgment("a" * 32, True, 0.9), "user_id": "1"})])
    got = _import_json(tmp_path, _checkpoint(tmp=tmp_path))
    assert (got["present"], got["conflicts"], got["results"]) == (1, 1, 1)
    with ResultsStore(store) as s:
        assert s.get_many(["a" * 32])["a" * 32]["is_relevant"] is True


def test_the_decompression_bomb_stays_within_memory(tmp_path):
    """Refused at the size bound, streamed: far less memory than the inflated size."""
    (tmp_path / "ck.gz").write_bytes(_many_lines())
    tracemalloc.start()
    with pytest.raises(PortableError, match="inflates past 1 MiB"):
        import_portable(tmp_path / "ck.gz", tmp_path / "s.sqlite", max_inflated=2**20)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20


def test_reseal_of_an_unverified_file_stays_marked_and_needs_the_flag_at_every_import(tmp_path):
    (tmp_path / "old.gz").write_bytes(_v1())
    r = run_cli("store", "reseal", str(tmp_path / "old.gz"), "--out", str(tmp_path / "ck.gz"))
    assert r.code == 2 and "--trust-unsigned" in r.stderr
    r = run_cli("store", "reseal", str(tmp_path / "old.gz"), "--out", str(tmp_path / "ck.gz"),
                "--trust-unsigned")  # fmt: skip
    assert r.code == 0, r.stderr
    # a valid digest now, but it vouches only for the reseal: refused without the flag ...
    (tmp_path / "s.sqlite").unlink(missing_ok=True)
    r = run_cli("store", "import", str(tmp_path / "ck.gz"), "--into", str(tmp_path / "s.sqlite"),
                env={"RECJUDGE_CHECKPOINT_KEY": ""})  # fmt: skip
    assert r.code == 2 and "resealed" in r.stderr and "--trust-unsigned" in r.stderr, r.stderr
    assert not (tmp_path / "s.sqlite").exists()
    # ... and a reseal of the resealed file (flag given) keeps the mark
    r = run_cli("store", "reseal", str(tmp_path / "ck.gz"), "--out", str(tmp_path / "ck2.gz"),
                "--trust-unsigned")  # fmt: skip
    assert r.code == 0, r.stderr
    for name in ("ck.gz", "ck2.gz"):
        for old in tmp_path.glob("s.sqlite*"):
            old.unlink()
        got = _import_json(tmp_path, (tmp_path / name).read_bytes(), "--trust-unsigned")
        assert (got["results"], got["decisions"], got["verified"]) == (2, 1, "unverified")
        r = run_cli("store", "import", str(tmp_path / name), "--into",
                    str(tmp_path / f"{name}.sqlite"), env={"RECJUDGE_CHECKPOINT_KEY": ""})  # fmt: skip
        assert r.code == 2 and "resealed" in r.stderr


def test_an_edited_checkpoint_resealed_never_imports_as_verified(tmp_path):
    """The forgery path: edit a verdict, reseal with --trust-unsigned, import without a flag."""
    good = _checkpoint(tmp=tmp_path)
    (tmp_path / "edited.gz").write_bytes(_edit(good, '"p_yes": 0.2', '"p_yes": 0.999'))
    r = run_cli("store", "reseal", str(tmp_path / "edited.gz"), "--out", str(tmp_path / "ck.gz"),
                "--trust-unsigned", env={"RECJUDGE_CHECKPOINT_KEY": ""})  # fmt: skip
    assert r.code == 0, r.stderr
    r = run_cli("store", "import", str(tmp_path / "ck.gz"), "--into", str(tmp_path / "s.sqlite"),
                env={"RECJUDGE_CHECKPOINT_KEY": ""})  # fmt: skip
    assert r.code == 2 and "resealed" in r.stderr
    assert not (tmp_path / "s.sqlite").exists()


def test_a_reseal_of_a_verified_file_stays_verified(tmp_path):
    (tmp_path / "good.gz").write_bytes(_checkpoint(tmp=tmp_path))
    r = run_cli("store", "reseal", str(tmp_path / "good.gz"), "--out", str(tmp_path / "ck.gz"),
                env={"RECJUDGE_CHECKPOINT_KEY": ""})  # fmt: skip
    assert r.code == 0, r.stderr
    got = _import_json(tmp_path, (tmp_path / "ck.gz").read_bytes())
    assert got["verified"] == "digest"


def test_an_exported_store_round_trips_through_the_manifest(tmp_path):
    with ResultsStore(tmp_path / "a.sqlite") as s:
        s.put_many([(r["key"], {"user_id": "1"}, r["result"]) for r in ROWS[:2]])
    n = export_portable(tmp_path / "a.sqlite", tmp_path / "ck.gz")
    head = json.loads(gzip.decompress((tmp_path / "ck.gz").read_bytes()).splitlines()[0])
    assert head["digest"].startswith("sha256:") and head["rows"] == n.results == 2
    assert head["producer"]["recjudge"]
    got = import_portable(tmp_path / "ck.gz", tmp_path / "b.sqlite")
    assert (got.results, got.verified) == (2, "digest")


# -- data import, evaluate, judge: refusals ----------------------------------------------------
TOML_OK = '[columns]\nuser_id = "uid"\nitem_id = "iid"\n'
REFUSED_COMMANDS = [
    ("import-mapping-rating-to-missing-column", {"l.csv": "uid,iid\nu,a\n"}, [*IMPORT, "{t}/l.csv", "--mapping", "user_id=uid,item_id=iid,rating=stars", "--out", "{t}/o"], ["l.csv", "'stars'", "rating=stars", "--mapping"]),
    ("import-mapping-timestamp-to-missing-column", {"l.csv": "uid,iid\nu,a\n"}, [*IMPORT, "{t}/l.csv", "--mapping", "user_id=uid,item_id=iid,timestamp=ts", "--out", "{t}/o"], ["l.csv", "'ts'"]),
    ("import-mapping-event-to-missing-column", {"l.csv": "uid,iid\nu,a\n"}, [*IMPORT, "{t}/l.csv", "--mapping", "user_id=uid,item_id=iid,event_type=act", "--out", "{t}/o"], ["l.csv", "'act'"]),
    ("import-domain-bogus", {"l.csv": "user_id,item_id\nu,a\n"}, [*IMPORT, "{t}/l.csv", "--domain", "bogus", "--out", "{t}/o"], ["--domain", "'bogus'", "movies, books, generic"]),
    ("import-domain-typo", {"l.csv": "user_id,item_id\nu,a\n"}, [*IMPORT, "{t}/l.csv", "--domain", "movie", "--out", "{t}/o"], ["did you mean 'movies'"]),
    ("import-toml-broken", {"l.csv": "uid,iid\nu,a\n", "m.toml": "[columns\nuser_id = uid"}, [*IMPORT, "{t}/l.csv", "--mapping", "{t}/m.toml", "--out", "{t}/o"], ["m.toml", "not valid TOML", "[columns]"]),
    ("import-toml-not-strings", {"l.csv": "uid,iid\nu,a\n", "m.toml": "[columns]\nuser_id = 3\n"}, [*IMPORT, "{t}/l.csv", "--mapping", "{t}/m.toml", "--out", "{t}/o"], ["m.toml", "user_id", "not a column name"]),
    ("import-toml-missing", {"l.csv": "uid,iid\nu,a\n"}, [*IMPORT, "{t}/l.csv", "--mapping", "{t}/nope.toml", "--out", "{t}/o"], ["nope.toml", "no such mapping file"]),
    ("import-toml-empty", {"l.csv": "uid,iid\nu,a\n", "m.toml": ""}, [*IMPORT, "{t}/l.csv", "--mapping", "{t}/m.toml", "--out", "{t}/o"], ["m.toml", "no [columns] table"]),
    ("import-out-is-a-file", {"l.csv": "user_id,item_id\nu,a\n", "o": "x"}, [*IMPORT, "{t}/l.csv", "--out", "{t}/o"], ["/o", "is a file", "--out a folder"]),
    ("evaluate-metric-cut-beyond-k", {"r.jsonl": '{"user_id": "u0", "item_id": "i6", "score": 1}\n'}, ["evaluate", "--runs", "{t}/r.jsonl", "--feedback", "{w}/ds", "--k", "3", "--metrics", "ndcg@10,precision@10"], ["ndcg@10", "--k 3", "--k 10"]),
    ("evaluate-second-metric-beyond-k", {"r.jsonl": '{"user_id": "u0", "item_id": "i6", "score": 1}\n'}, ["evaluate", "--runs", "{t}/r.jsonl", "--feedback", "{w}/ds", "--k", "5", "--metrics", "ndcg@5,mrr@20"], ["mrr@20", "--k 5"]),
    ("evaluate-stat-test-named", {}, ["evaluate", "--runs", "{w}/run.jsonl", "--feedback", "{w}/ds", "--stat-test", "magic"], ["--stat-test", "'magic'"]),
    ("judge-candidate-id-and-title", {}, ["judge", "--data", "{w}/amb", "--user", "u0", "--candidate", "i2", "--mode", "zero-shot"], ["'i2' is ambiguous", "id:i2", "title:i2"]),
    ("judge-candidate-id-prefix-unknown", {}, ["judge", "--data", "{w}/amb", "--user", "u0", "--candidate", "id:zz", "--mode", "zero-shot"], ["id:zz", "no item with id 'zz'"]),
    ("judge-candidate-title-prefix-unknown", {}, ["judge", "--data", "{w}/amb", "--user", "u0", "--candidate", "title:Nope", "--mode", "zero-shot"], ["title:Nope", "0 items"]),
    ("store-import-repair-flag-exists", {"s.sqlite": b"not a database at all"}, ["store", "import", "{t}/nope.gz", "--into", "{t}/s.sqlite", "--repair"], ["nope.gz", "no such file"]),
    ("dtype-env-bogus", {}, ["judge", "--data", "{w}/ds", "--user", "u0", "--candidate", "i1", "--mode", "zero-shot"], ["RECJUDGE_DTYPE", "'fp8'", "bfloat16, float32"]),
]  # fmt: skip
ENVS = {"dtype-env-bogus": {"RECJUDGE_DTYPE": "fp8"}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small dataset folder, a run, and a dataset whose item 'i3' is titled 'i2'."""
    t = tmp_path_factory.mktemp("world3")
    (t / "log.csv").write_text(LOG)
    (t / "items.csv").write_text(ITEMS)
    load_from_files(t / "log.csv", t / "items.csv", name="toy").save(t / "ds")
    (t / "amb.csv").write_text(ITEMS.replace("Movie 3 (1993)", "i2"))
    load_from_files(t / "log.csv", t / "amb.csv", name="amb").save(t / "amb")
    (t / "run.jsonl").write_text(
        "".join(
            json.dumps({"user_id": f"u{u}", "item_id": f"i{i}", "score": 8 - i}) + "\n"
            for u in range(3)
            for i in (6, 7)
        )  # fmt: skip
    )
    return t


@pytest.mark.parametrize(
    ("case", "files", "argv", "words"), REFUSED_COMMANDS, ids=[c[0] for c in REFUSED_COMMANDS]
)
def test_bad_command_input_is_one_clear_line(world, tmp_path, case, files, argv, words):
    _write(tmp_path, files)
    args = [a.replace("{t}", str(tmp_path)).replace("{w}", str(world)) for a in argv]
    r = run_cli(*args, env=ENVS.get(case))
    assert r.code == 2, f"{case}: exit {r.code}\n{r.stdout[-500:]}\n{r.stderr[-1500:]}"
    assert "Traceback" not in r.stderr, r.stderr
    text = " ".join(r.stderr.split())
    for w in words:
        w = w.replace("{t}", str(tmp_path))
        assert w in text, f"{case}: {w!r} not in {r.stderr!r}"


def test_a_toml_mapping_file_that_is_right_imports(world, tmp_path):
    _write(tmp_path, {"l.csv": "uid,iid\nu,a\nu,b\n", "m.toml": TOML_OK})
    r = run_cli(*IMPORT, str(tmp_path / "l.csv"), "--mapping", str(tmp_path / "m.toml"),
                "--out", str(tmp_path / "o"), "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["interactions"] == 2


def test_ids_with_whitespace_import_and_their_qrels_stay_four_fields(world, tmp_path):
    """data import accepts ids with spaces and tabs (ML-1M's items are titles); the qrels
    written for them have four fields a line and read back as they were."""
    log = 'user_id,item_id,rating\n"u 1",Heat (1995),5\n"u 1","Up\tx",4\n'
    _write(tmp_path, {"l.csv": log})
    r = run_cli(*IMPORT, str(tmp_path / "l.csv"), "--out", str(tmp_path / "o"))
    assert r.code == 0, r.stderr
    q = logged_qrels(load_dataset(str(tmp_path / "o")), 4)
    trec, _ = write_qrels(q, tmp_path / "qrels_logged")
    lines = trec.read_text().splitlines()
    assert len(lines) == 2 and all(len(x.split()) == 4 for x in lines)
    assert read_qrels(trec) == q == {"u 1": {"Heat (1995)": 1, "Up\tx": 1}}


# -- TREC files: whatever the ids hold, every reader sees the same qrels ----------------------
HOSTILE_IDS = [
    ("space", "Toy Story (1995)"),
    ("tab", "a\tb"),
    ("newline-injection", "x\n1 0 forged 1"),
    ("carriage-return", "x\r0"),
    ("percent", "100% Love (2001)"),
    ("percent-escape-lookalike", "a%20b"),
    ("unicode-line-separator", "Am\u2028elie"),
    ("non-breaking-space", "Am\u00e9lie\u00a0(2001)"),
    ("control-char", "bell\x07"),
    ("leading-dash", "-1"),
]


@pytest.mark.parametrize(("case", "item"), HOSTILE_IDS, ids=[c[0] for c in HOSTILE_IDS])
def test_qrels_with_a_hostile_id_read_back_identically(tmp_path, monkeypatch, case, item):
    from ranx import Qrels

    q = {"user 1": {item: 1, "plain": 0}, "2": {item: 1}}
    trec, js = write_qrels(q, tmp_path / "qrels_imputed")
    assert len(trec.read_bytes().splitlines()) == 3  # no line added or split
    assert read_qrels(trec) == read_qrels(js) == q

    def decoded(pairs):
        out: dict = {}
        for u, i, r in pairs:
            out.setdefault(from_trec_id(u), {})[from_trec_id(i)] = int(r)
        return out

    # ranx's own TREC reader (its numba Qrels built from the same dict is ranx's business).
    monkeypatch.setattr(Qrels, "from_dict", staticmethod(lambda d: d))
    got = Qrels.from_file(str(trec), kind="trec")
    assert decoded((u, i, r) for u, d in got.items() for i, r in d.items()) == q
    got = ir_measures.read_trec_qrels(str(trec))  # pytrec_eval's reader
    assert decoded((x.query_id, x.doc_id, x.relevance) for x in got) == q


def test_ml1m_qrels_read_back_identically_by_every_reader(ml1m, tmp_path, monkeypatch):
    """What impute writes on ML-1M (items are titles): every title, through write_qrels."""
    from ranx import Qrels

    items = ml1m.items["item_id"].astype(str).tolist()
    q = {str(u): {i: (u + n) % 2 for n, i in enumerate(items[u::7])} for u in range(1, 8)}
    trec, _ = write_qrels(q, tmp_path / "qrels_imputed")
    assert read_qrels(trec) == q
    monkeypatch.setattr(Qrels, "from_dict", staticmethod(lambda d: d))
    got = Qrels.from_file(str(trec), kind="trec")
    assert {u: {from_trec_id(i): r for i, r in d.items()} for u, d in got.items()} == q
    back: dict = {}
    for x in ir_measures.read_trec_qrels(str(trec)):
        back.setdefault(x.query_id, {})[from_trec_id(x.doc_id)] = x.relevance
    assert back == q


def test_a_trec_run_with_encoded_ids_reads_back_as_written(tmp_path):
    items = ["Heat (1995)", "x\n1 Q0 forged 1 9 t", "plain"]
    (tmp_path / "r.trec").write_text(
        "".join(
            f"{trec_id('u 1')} Q0 {trec_id(i)} {r + 1} {9 - r} sys\n" for r, i in enumerate(items)
        )
    )
    run = read_run(tmp_path / "r.trec")
    assert run.rankings == {"u 1": items}


# -- gist verify: what the rules did is counted and said before judging -----------------------
def test_profiles_empty_and_oversized_are_counted(ml100k, tmp_path):
    user = str(ml100k.interactions["user_id"].iloc[0])
    item = str(ml100k.history(user)["item_id"].iloc[0])
    big = [{"name": f"interest {k}", "object_ids": [item]} for k in range(10_000)]
    lines = [{"user_id": user, "interests": big}, {"user_id": str(ml100k.interactions["user_id"].iloc[-1]), "interests": []}]  # fmt: skip
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    interests, check = read_profiles(tmp_path / "p.jsonl", ml100k)
    assert check.profiles == 2 and check.empty_profiles == 1
    assert check.capped == 10_000 - PROFILE_INTEREST_CAP
    assert len(interests) == PROFILE_INTEREST_CAP and check.questions == PROFILE_INTEREST_CAP
    assert "empty profiles" in check.problems() and "capped" in check.problems()


def test_a_judgment_reused_from_an_imported_checkpoint_is_counted_as_such(tmp_path):
    """A verified checkpoint's rows are reused, and the run says how many came from it."""
    h = [HistoryItem("i1", "Up (2009)", "Up (2009)", None)]
    req = JudgeRequest("7", h, "i9", "Heat (1995)", sigma=0.3)
    judge = Judge(JudgeConfig(mode="no-behavior", need_evidence=False), llm=object())
    key = judge.key(req)
    rows = [{"table": "results", "key": key, "result": {**_judgment(key, False, 0.2),
             "mode": "no-behavior"}}]  # fmt: skip
    (tmp_path / "ck.gz").write_bytes(_checkpoint(rows, tmp=tmp_path))
    import_portable(tmp_path / "ck.gz", tmp_path / "s.sqlite")
    with ResultsStore(tmp_path / "s.sqlite") as store:
        (got,) = judge.judge_many([req], store=store)
    assert not got.is_relevant and got.user_id == "7"  # ids filled from the request
    assert (judge.last_run.reused, judge.last_run.imported, judge.last_run.judged) == (1, 1, 0)
    # A row the store got from a judgment (its request holds the history) is not "imported".
    with ResultsStore(tmp_path / "s.sqlite") as store:
        store.put_many([("f" * 32, {"user_id": "8", "history": ["x"]}, got.to_dict())])
        assert store.imported([key, "f" * 32, "absent"]) == {key}
