"""The bad-input corpus: data files, pairs/run/qrels/profile files, stores, CF folders, model
caches and CLI options, each through the real CLI entry point (in process, for speed).

Every case must end with exit 2 and a message that names the file (and row/field where there
is one) and a fix that exists, never a traceback or an exit 0. The words each case checks are
the specific ones: the file name, the row, the field, the flag or command of the fix.
"""

# ruff: noqa: E501  (the case table keeps one case per line or two, for reading)
from __future__ import annotations

import json

import pytest

from cli_in_process import run_cli
from cli_in_process import write_files as _write
from recjudge.cf_models import TrainOptions, train_cf
from recjudge.data import load_dataset, load_from_files

LOG = "user_id,item_id,timestamp,rating\n" + "".join(
    f"u{u},i{i},{10 * u + i},{1 + (u + i) % 5}\n" for u in range(3) for i in range(6)
)
ITEMS = "item_id,title\n" + "".join(f"i{i},Movie {i} (199{i})\n" for i in range(8))
GOOD_RUN = "".join(
    json.dumps({"user_id": f"u{u}", "item_id": f"i{i}", "score": 8 - i}) + "\n"
    for u in range(3) for i in (6, 7)
)  # fmt: skip


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``recjudge ARGS`` in this process: (exit code, stderr)."""
    r = run_cli(*args, env=env)
    return r.code, r.stderr


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small dataset (files and folder), a past/future split, a run and a trained Pop."""
    t = tmp_path_factory.mktemp("world")
    (t / "log.csv").write_text(LOG)
    (t / "items.csv").write_text(ITEMS)
    ds = load_from_files(t / "log.csv", t / "items.csv", name="toy")
    ds.save(t / "ds")
    assert (
        cli("data", "split", str(t / "ds"), "--out", str(t / "split"), "--fraction", "0.34")[0] == 0
    )
    (t / "run.jsonl").write_text(GOOD_RUN)
    train_cf("pop", load_dataset(str(t / "ds")), t / "pop", {}, TrainOptions(progress=False))
    return t


IMPORT = ["data", "import"]
JUDGE0 = ["--model", "smollm2-135m", "--mode", "zero-shot"]

# (id, files to write, argv with {t} for the case folder and {w} for the shared world,
#  words the message must contain)
CASES = [
    # -- data files: `data import` ----------------------------------------------------------
    ("import-missing-file", {}, [*IMPORT, "{t}/nope.csv", "--out", "{t}/o"], ["nope.csv"]),
    ("import-empty-file", {"e.csv": ""}, [*IMPORT, "{t}/e.csv", "--out", "{t}/o"], ["e.csv"]),
    ("import-header-only", {"h.csv": "user_id,item_id\n"}, [*IMPORT, "{t}/h.csv", "--out", "{t}/o"],
     ["h.csv", "no interactions"]),
    ("import-unmapped-columns", {"c.csv": "uid,iid\nu,a\n"}, [*IMPORT, "{t}/c.csv", "--out", "{t}/o"],
     ["c.csv", "user_id", "--mapping"]),
    ("import-mapping-names-missing-column", {"c.csv": "uid,iid\nu,a\n"},
     [*IMPORT, "{t}/c.csv", "--mapping", "user_id=uid,item_id=item", "--out", "{t}/o"],
     ["c.csv", "item"]),
    ("import-malformed-mapping", {"c.csv": "uid,iid\nu,a\n"},
     [*IMPORT, "{t}/c.csv", "--mapping", "user_id", "--out", "{t}/o"],
     ["--mapping", "field=column"]),
    ("import-not-utf8", {"l.csv": b"user_id,item_id\nu1,caf\xe9\n"},
     [*IMPORT, "{t}/l.csv", "--out", "{t}/o"], ["l.csv", "--encoding"]),
    ("import-rating-text", {"l.csv": "user_id,item_id,rating\nu,a,good\n"},
     [*IMPORT, "{t}/l.csv", "--out", "{t}/o"], ["l.csv", "row 1", "rating"]),
    ("import-rating-inf", {"l.csv": "user_id,item_id,rating\nu,a,4\nu,b,inf\n"},
     [*IMPORT, "{t}/l.csv", "--out", "{t}/o"], ["l.csv", "row 2", "finite"]),
    ("import-rating-negative", {"l.csv": "user_id,item_id,rating\nu,a,-7\n"},
     [*IMPORT, "{t}/l.csv", "--out", "{t}/o"], ["l.csv", "row 1", "1-5"]),
    ("import-duplicate-rows", {"l.csv": "user_id,item_id,timestamp\nu,a,1\nu,a,1\n"},
     [*IMPORT, "{t}/l.csv", "--out", "{t}/o"], ["l.csv", "--dedupe"]),
    ("import-orphans", {"l.csv": "user_id,item_id\nu,a\nu,zz\n", "i.csv": "item_id,title\na,A\n"},
     [*IMPORT, "{t}/l.csv", "--items", "{t}/i.csv", "--out", "{t}/o"], ["row 2", "--drop-orphans"]),
    ("import-items-without-item-id", {"l.csv": "user_id,item_id\nu,a\n", "i.csv": "id,title\na,A\n"},
     [*IMPORT, "{t}/l.csv", "--items", "{t}/i.csv", "--out", "{t}/o"], ["i.csv", "item_id"]),
    ("import-users-without-user-id", {"l.csv": "user_id,item_id\nu,a\n", "u.csv": "uid,age\nu,3\n"},
     [*IMPORT, "{t}/l.csv", "--users", "{t}/u.csv", "--out", "{t}/o"], ["u.csv", "user_id"]),
    ("import-timestamp-text", {"l.csv": "user_id,item_id,timestamp\nu,a,yesterday\n"},
     [*IMPORT, "{t}/l.csv", "--out", "{t}/o"], ["l.csv", "row 1", "timestamp"]),
    ("import-unknown-event-label", {"l.csv": "user_id,item_id,event_type\nu,a,clicked\n"},
     [*IMPORT, "{t}/l.csv", "--out", "{t}/o"], ["l.csv", "clicked", "--events"]),
    ("import-bad-events-spec", {"l.csv": "user_id,item_id\nu,a\n"},
     [*IMPORT, "{t}/l.csv", "--events", "click", "--out", "{t}/o"], ["click"]),
    ("import-empty-user-id", {"l.csv": "user_id,item_id\nu,a\n,b\n"},
     [*IMPORT, "{t}/l.csv", "--out", "{t}/o"], ["l.csv", "row 2", "user_id"]),
    ("import-jsonl-broken-line", {"l.jsonl": '{"user_id": "u", "item_id": "a"}\n{"user_id": \n'},
     [*IMPORT, "{t}/l.jsonl", "--out", "{t}/o"], ["l.jsonl"]),
    ("import-parquet-garbage", {"l.parquet": b"PAR1 not really"},
     [*IMPORT, "{t}/l.parquet", "--out", "{t}/o"], ["l.parquet"]),
    ("import-unknown-format", {"l.csv": "user_id,item_id\nu,a\n"},
     [*IMPORT, "{t}/l.csv", "--format", "excel", "--out", "{t}/o"], ["excel"]),
    # -- datasets and splits ----------------------------------------------------------------
    ("dataset-unknown-name", {}, ["data", "info", "ml-1mm"], ["ml-1mm", "ml-1m"]),
    ("split-unknown-by", {}, ["data", "split", "{w}/ds", "--by", "random", "--out", "{t}/s"],
     ["random", "user-time"]),
    ("split-unknown-dataset", {}, ["data", "split", "{t}/none", "--out", "{t}/s"], ["none"]),
    # -- run files: `evaluate` / `impute` ---------------------------------------------------
    *[
        (f"run-{name}", {f"r.{ext}": text},
         ["evaluate", "--runs", f"{{t}}/r.{ext}", "--feedback", "{w}/split/future"],
         [f"r.{ext}", *words])
        for name, ext, text, words in [
            ("trec-five-fields", "trec", "u0 Q0 i6 1 0.5\n", ["row 1", "6 fields"]),
            ("trec-text-score", "trec", "u0 Q0 i6 1 high s\n", ["row 1", "score"]),
            ("jsonl-array-line", "jsonl", '{"user_id": "u0", "item_id": "i6", "score": 1}\n[1]\n',
             ["row 2", "not an object"]),
            ("jsonl-no-item", "jsonl", '{"user_id": "u0", "score": 1}\n', ["row 1", "item_id"]),
            ("jsonl-no-score-or-rank", "jsonl", '{"user_id": "u0", "item_id": "i6"}\n',
             ["row 1", "rank"]),
            ("jsonl-nan-score", "jsonl", '{"user_id": "u0", "item_id": "i6", "score": NaN}\n',
             ["row 1", "finite"]),
            ("jsonl-not-json", "jsonl", "user_id,item_id\n", ["row 1", "not JSON"]),
            ("empty", "trec", "", ["no ranking"]),
            ("ranx-wrong-shape", "json", '{"u0": [1, 2]}', ["ranx run"]),
            ("parquet-garbage", "parquet", "not parquet", ["Parquet"]),
            ("not-utf8", "trec", b"u0 Q0 caf\xe9 1 1 s\n", ["UTF-8"]),
        ]
    ],
    ("run-missing-file", {}, ["evaluate", "--runs", "{t}/gone.trec", "--feedback", "{w}/ds"],
     ["gone.trec", "cf recommend"]),
    ("run-unknown-format", {"r.trec": "u0 Q0 i6 1 1 s\n"},
     ["evaluate", "--runs", "{t}/r.trec", "--run-format", "csv", "--feedback", "{w}/ds"],
     ["r.trec", "csv", "trec"]),
    ("run-only-unknown-users", {"r.jsonl": '{"user_id": "ghost", "item_id": "i6", "score": 1}\n'},
     ["impute", "--data", "{w}/split/past", "--feedback", "{w}/split/future", "--runs",
      "{t}/r.jsonl", *JUDGE0, "--out", "{t}/imp"], ["r.jsonl", "ghost", "--data"]),
    ("runs-share-a-name", {}, ["evaluate", "--runs", "{w}/run.jsonl,{w}/run.jsonl", "--feedback",
     "{w}/split/future"], ["share a name", "NAME=PATH"]),
    ("evaluate-without-qrels-or-feedback", {}, ["evaluate", "--runs", "{w}/run.jsonl"],
     ["--qrels", "--feedback"]),
    ("evaluate-qrels-folder-empty", {"q/.keep": ""}, ["evaluate", "--runs", "{w}/run.jsonl",
     "--qrels", "{t}/q"], ["qrels_logged.json", "impute"]),
    ("qrels-malformed-json", {"q/qrels_logged.json": "{", "q/qrels_imputed.json": "{}"},
     ["evaluate", "--runs", "{w}/run.jsonl", "--qrels", "{t}/q"], ["qrels_logged.json"]),
    ("feedback-without-positives", {},
     ["evaluate", "--runs", "{w}/run.jsonl", "--feedback", "{w}/split/future", "--min-rating",
      "9"], ["logged positive", "--min-rating"]),
    ("evaluate-unknown-metric", {}, ["evaluate", "--runs", "{w}/run.jsonl", "--feedback",
     "{w}/split/future", "--metrics", "ndcgg@10"], ["ndcgg@10"]),
    ("evaluate-unknown-stat-test", {}, ["evaluate", "--runs", "{w}/run.jsonl", "--feedback",
     "{w}/split/future", "--stat-test", "magic"], ["magic"]),
    ("impute-unknown-mode", {}, ["impute", "--data", "{w}/split/past", "--feedback",
     "{w}/split/future", "--runs", "{w}/run.jsonl", "--mode", "breif", "--out", "{t}/imp"],
     ["breif", "brief"]),
    ("impute-cf-folder-missing", {}, ["impute", "--data", "{w}/split/past", "--feedback",
     "{w}/split/future", "--runs", "{w}/run.jsonl", "--cf", "{t}/nocf", "--out", "{t}/imp"],
     ["nocf"]),
    ("impute-existing-store", {"imp/store.sqlite": ""}, ["impute", "--data", "{w}/split/past",
     "--feedback", "{w}/split/future", "--runs", "{w}/run.jsonl", *JUDGE0, "--out", "{t}/imp"],
     ["store.sqlite", "--resume"]),
    ("augment-candidates-missing", {}, ["augment", "--data", "{w}/ds", "--candidates",
     "{t}/c.jsonl", *JUDGE0, "--out", "{t}/aug"], ["c.jsonl"]),
    # -- profiles: `gist verify` ------------------------------------------------------------
    *[
        (f"profile-{name}", {"p.jsonl": text},
         ["gist", "verify", "--data", "{w}/ds", "--profiles", "{t}/p.jsonl", "--judge",
          "smollm2-135m", "--out", "{t}/g"], ["p.jsonl", *words])
        for name, text, words in [
            ("not-json", "{user\n", ["row 1", "not JSON"]),
            ("no-user-id", '{"interests": []}\n', ["row 1", "user_id"]),
            ("interests-not-list", '{"user_id": "u0", "interests": "war"}\n', ["interests"]),
            ("interest-without-name", '{"user_id": "u0", "interests": [{"object_ids": []}]}\n',
             ["interest 0", "name"]),
            ("all-users-unknown", '{"user_id": "zz", "interests": []}\n', ["zz", "--data"]),
            ("empty", "\n", ["no profile"]),
        ]
    ],
    # -- pairs files and stores: `judge --pairs` --------------------------------------------
    ("pairs-not-json", {"p.jsonl": "user 1\n"}, ["judge", "--data", "{w}/ds", "--pairs",
     "{t}/p.jsonl", "--out", "{t}/o.jsonl", *JUDGE0], ["p.jsonl, line 1", "user_id"]),
    ("pairs-missing-item", {"p.jsonl": '{"user_id": "u0"}\n'}, ["judge", "--data", "{w}/ds",
     "--pairs", "{t}/p.jsonl", "--out", "{t}/o.jsonl", *JUDGE0], ["line 1", "item_id"]),
    ("pairs-unknown-user", {"p.jsonl": '{"user_id": "u9", "item_id": "i1"}\n'},
     ["judge", "--data", "{w}/ds", "--pairs", "{t}/p.jsonl", "--out", "{t}/o.jsonl", *JUDGE0],
     ["line 1", "u9"]),
    ("pairs-without-out", {"p.jsonl": '{"user_id": "u0", "item_id": "i1"}\n'},
     ["judge", "--data", "{w}/ds", "--pairs", "{t}/p.jsonl", *JUDGE0], ["--out"]),
    ("store-exists-without-resume", {"p.jsonl": '{"user_id": "u0", "item_id": "i5"}\n',
     "o.jsonl.sqlite": ""}, ["judge", "--data", "{w}/ds", "--pairs", "{t}/p.jsonl", "--out",
     "{t}/o.jsonl", *JUDGE0], ["o.jsonl.sqlite", "--resume"]),
    ("store-garbage", {"p.jsonl": '{"user_id": "u0", "item_id": "i5"}\n',
     "o.jsonl.sqlite": b"not a database" * 64}, ["judge", "--data", "{w}/ds", "--pairs",
     "{t}/p.jsonl", "--out", "{t}/o.jsonl", "--resume", *JUDGE0], ["o.jsonl.sqlite", "--repair"]),
    # -- single judgments and options -------------------------------------------------------
    ("judge-user-without-candidate", {}, ["judge", "--data", "{w}/ds", "--user", "u0", *JUDGE0],
     ["--candidate"]),
    ("judge-unknown-user", {}, ["judge", "--data", "{w}/ds", "--user", "u7", "--candidate", "i1",
     *JUDGE0], ["u7", "u0"]),
    ("judge-unknown-title", {}, ["judge", "--data", "{w}/ds", "--user", "u0", "--candidate",
     "Movie 3 (1993", *JUDGE0], ["Movie 3 (1993", "Movie 3 (1993)"]),
    ("judge-mode-needs-cf", {}, ["judge", "--data", "{w}/ds", "--user", "u0", "--candidate", "i7",
     "--model", "smollm2-135m"], ["--cf", "no-behavior"]),
    ("judge-cf-from-other-data", {}, ["judge", "--data", "ml-100k", "--user", "1", "--candidate",
     "1", "--model", "smollm2-135m", "--cf", "{w}/pop"], ["toy", "--allow-cf-mismatch"]),
    # -- CF folders and training options ----------------------------------------------------
    ("cf-unknown-model", {}, ["cf", "train", "sasrek", "--data", "{w}/ds", "--out", "{t}/m"],
     ["sasrek", "sasrec"]),
    ("cf-config-not-json", {}, ["cf", "train", "pop", "--data", "{w}/ds", "--out", "{t}/m",
     "--config", "{epochs: 3}"], ["--config", "JSON"]),
    ("cf-eval-missing-folder", {}, ["cf", "eval", "{t}/nomodel", "--data", "{w}/ds"],
     ["nomodel"]),
    ("cf-folder-garbage-weights", {"m/model.json": '{"name": "pop"}',
     "m/model.safetensors": b"\x00" * 64}, ["cf", "recommend", "{t}/m", "--data", "{w}/ds",
     "--out", "{t}/r.jsonl"], ["m"]),
    # -- models and the cache ---------------------------------------------------------------
    ("model-missing-path", {}, ["judge", "--data", "{w}/ds", "--user", "u0", "--candidate", "i7",
     "--mode", "zero-shot", "--model", "{t}/missing/dir"], ["missing/dir", "smollm2-135m"]),
    ("gist-run-model-missing", {}, ["gist", "run", "--data", "{w}/ds", "--models",
     "smollm2-135m,{t}/nomodel.gguf", "--judge", "smollm2-135m", "--out", "{t}/g"],
     ["nomodel.gguf"]),
    ("model-unknown-preset", {}, ["models", "info", "smolm2-135m"], ["smolm2-135m", "smollm2-135m"]),
    ("model-install-unknown", {}, ["models", "install", "qwen9"], ["qwen9"]),
    # -- evaluators and benchmarks by name ------------------------------------------------------
    ("run-unknown-evaluator", {}, ["run", "aren"], ["aren", "Did you mean 'arena'"]),
    ("run-config-not-json", {"c.json": "{users: 3"}, ["run", "gist", "--config", "{t}/c.json"],
     ["c.json", "not JSON", "omit --config"]),
    ("run-config-bad-field", {"r.json": '{"config": {"users": 0}, "data": "ml-1m"}'},
     ["run", "usersum", "--config", "{t}/r.json"], ["r.json", "users"]),
    ("run-arena-unknown-reference", {"c.json": '{"systems": ["pop", "als"], "reference": "alss"}'},
     ["run", "arena", "--config", "{t}/c.json"], ["alss", "did you mean 'als'"]),
    ("bench-run-unknown", {}, ["bench", "run", "brief-bet"], ["brief-bet", "brief-beta"]),
    ("bench-bad-sampling", {}, ["bench", "brief-beta", "--sampling", "nucleus"],
     ["--sampling", "'greedy' or 'paper'"]),
    ("bench-bad-score-from", {}, ["bench", "brief-augment", "--score-from", "latest"],
     ["--score-from", "'augmented' or 'logged'"]),
    ("arena-bad-analysis", {}, ["arena", "run", "--analysis", "both"], ["--analysis", "per-aspect"]),
]  # fmt: skip


def test_the_corpus_is_at_least_sixty_cases():
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("case", "files", "argv", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_case(world, tmp_path, case, files, argv, words):
    _write(tmp_path, files)
    args = [a.replace("{t}", str(tmp_path)).replace("{w}", str(world)) for a in argv]
    code, err = cli(*args)
    assert code == 2, f"{case}: exit {code}\n{err[-1500:]}"
    assert "Traceback" not in err, err
    text = " ".join(err.split())  # typer may wrap long usage errors
    for w in words:
        w = w.replace("{t}", str(tmp_path))
        assert w in text or w in text.replace("│", " "), f"{case}: {w!r} not in {err[-800:]!r}"
