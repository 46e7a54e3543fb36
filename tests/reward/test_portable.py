"""Title-free checkpoints: a run's work carried to a fresh store, with no item text in the file."""

from __future__ import annotations

import gzip
import json

import pytest

from recjudge.reward import (
    Judge,
    JudgeConfig,
    PortableError,
    ResultsStore,
    export_portable,
    import_portable,
    request_for,
    sweep_into_store,
)
from recjudge.reward._portable import MAX_PERSONA, check_row, portable_decision, portable_result
from recjudge.reward._stored import PORTABLE_FORM

PAIRS = [("1", "Toy Story (1995)", 0.9), ("1", "Heat (1995)", -0.8), ("2", "Fargo (1996)", 0.05)]


@pytest.fixture(scope="module")
def requests(ml1m):
    out = []
    for u, c, s in PAIRS:
        r = request_for(ml1m, u, c)
        r.sigma = s
        out.append(r)
    return out


def _judge(llm, **kw):
    return Judge(JudgeConfig(max_history=10, need_evidence=False, **kw), llm=llm)


def test_a_checkpoint_carries_a_sweep_to_a_fresh_store_without_item_text(
    smollm32, requests, tmp_path
):
    # fp32: the replayed setting is compared with the same judge decoding on its own (two
    # computations of one number; bf16 rounds them differently by batch shape).
    smollm = smollm32
    swept = {"brief": _judge(smollm, beta=25.0), "nb": _judge(smollm, mode="no-behavior")}
    zs = _judge(smollm, mode="zero-shot")
    with ResultsStore(tmp_path / "a" / "store.sqlite") as a:
        assert sweep_into_store(swept, requests, a).decoded == len(requests)
        first = {"zs": zs.judge_many(requests, a)}
        first |= {name: j.judge_many(requests, a) for name, j in swept.items()}
    n = export_portable(tmp_path / "a" / "store.sqlite", tmp_path / "ck.jsonl.gz")
    assert (n.results, n.decisions, n.left_out) == (3 * len(requests), len(requests), 0)
    text = gzip.decompress((tmp_path / "ck.jsonl.gz").read_bytes()).decode()
    names = {h.title for r in requests for h in r.history} | {r.candidate_id for r in requests}
    names |= {h.item_id for r in requests for h in r.history}
    assert not [t for t in names if t in text]  # no history title, candidate or item id
    assert '"user_id"' not in text and '"candidate_id"' not in text

    b = tmp_path / "b" / "store.sqlite"
    got = import_portable(tmp_path / "ck.jsonl.gz", b)
    assert (got.results, got.decisions, got.present) == (3 * len(requests), len(requests), 0)
    assert import_portable(tmp_path / "ck.jsonl.gz", b).present == 4 * len(requests)
    with ResultsStore(b) as store:
        for name, judge in [("zs", _judge(smollm, mode="zero-shot")),
                            ("brief", _judge(smollm, beta=25.0))]:  # fmt: skip
            again = judge.judge_many(requests, store)
            assert judge.last_run.judged == 0  # read, not judged
            for x, y, r in zip(again, first[name], requests, strict=True):
                assert (x.user_id, x.candidate_id) == (r.user_id, r.candidate_id)
                assert (x.is_relevant, x.p_yes, x.key) == (y.is_relevant, y.p_yes, y.key)
        # A setting the first run never had is replayed from the imported decision records.
        new = {"b5": _judge(smollm, beta=5.0), "nb": _judge(smollm, mode="no-behavior")}
        fill = sweep_into_store(new, requests, store)
        assert (fill.decoded, fill.replayed) == (0, len(requests))
        alone = new["b5"].judge_many(requests)
        for x, y in zip(new["b5"].judge_many(requests, store), alone, strict=True):
            assert x.is_relevant == y.is_relevant and x.p_yes == pytest.approx(y.p_yes, abs=2e-3)
            assert x.candidate_id == y.candidate_id


def test_answers_that_name_items_are_left_out():
    base = {"user_id": "1", "candidate_id": "Heat (1995)", "mode": "brief", "is_relevant": True,
            "p_yes": 0.9, "evidence": [], "evidence_ids": [], "key": "k"}  # fmt: skip
    kept = portable_result(base | {"raw_text": '{"evidence": ["'})
    assert kept is not None and not {"user_id", "candidate_id", "evidence"} & set(kept)
    assert portable_result(base | {"raw_text": '{"is_relevant": "NO"}'}) is not None
    cited = '{"evidence": ["Toy Story (1995)"], "is_relevant": "YES"}'
    assert portable_result(base | {"raw_text": cited, "evidence": ["Toy Story (1995)"]}) is None
    assert portable_result(base | {"raw_text": cited}) is None  # text alone is enough
    assert portable_result(base | {"raw_text": "", "evidence_ids": ["1"]}) is None
    rec = {"branches": ["YES", "NO"], "chosen": "NO", "steps": [], "shown": 3, "dropped": 0}
    assert portable_decision(rec | {"text": '{"evidence": [], "is_relevant": "NO"}'}) is not None
    assert portable_decision(rec | {"text": cited}) is None


def test_an_evaluator_answer_is_exported_only_through_its_declared_form():
    answer = {"value": {"analysis": {"accuracy": "Heat (1995) fits"}, "overall": "Tie"},
              "branches": ["A wins", "B wins", "Tie"], "p": [0.1, 0.2, 0.7]}  # fmt: skip
    assert portable_result(answer) is None  # free text and no declared form
    assert portable_result({"text": "a persona naming Heat (1995)"}) is None
    form = {"value": {"overall": "Tie"}, "branches": answer["branches"], "p": answer["p"]}
    kept = portable_result(answer | {PORTABLE_FORM: form})
    assert kept == form | {PORTABLE_FORM: form}  # re-exported the same from an import
    assert "Heat" not in json.dumps(kept)


def test_a_damaged_or_foreign_checkpoint_is_a_clear_error(tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"a": 1}\n')
    with pytest.raises(PortableError, match="plain.jsonl: not a whole gzip checkpoint"):
        import_portable(plain, tmp_path / "s.sqlite")
    foreign = tmp_path / "foreign.gz"
    foreign.write_bytes(gzip.compress(b'{"format": "other"}\n'))
    with pytest.raises(PortableError, match="not a recjudge checkpoint"):
        import_portable(foreign, tmp_path / "s.sqlite")
    head = json.dumps({"format": "recjudge-portable-store", "version": 1})
    bad = tmp_path / "bad.gz"
    bad.write_bytes(gzip.compress(f'{head}\n{{"table": "results", "key": 3}}\n'.encode()))
    with pytest.raises(
        PortableError, match="bad.gz, line 2: a row is an object with exactly table, key and result"
    ):
        import_portable(bad, tmp_path / "s.sqlite")
    # A persona row is one bounded text in its declared form, nothing else.
    ok = {"text": "calm", PORTABLE_FORM: {"text": "calm"}}
    assert check_row({"table": "personas", "key": "k", "result": ok}) is None
    for result, why in [
        ({"text": "calm"}, "exactly {text, portable_form"),
        ({"text": "a", PORTABLE_FORM: {"text": "b"}}, "exactly {text, portable_form"),
        ({"text": 3, PORTABLE_FORM: {"text": 3}}, "exactly {text, portable_form"),
        (ok | {"user_id": "1"}, "exactly {text, portable_form"),
        ({"text": "x" * (MAX_PERSONA + 1), PORTABLE_FORM: {"text": "x" * (MAX_PERSONA + 1)}},
         "longer than"),
    ]:  # fmt: skip
        assert why in check_row({"table": "personas", "key": "k", "result": result})
    assert "none of results, decisions, personas" in check_row(
        {"table": "other", "key": "k", "result": ok}
    )
    with pytest.raises(PortableError, match="no such results store"):
        export_portable(tmp_path / "missing.sqlite", tmp_path / "out.gz")
    assert not (tmp_path / "s.sqlite").exists()  # nothing written on a bad file
