"""Result keys cannot drift: every JudgeConfig field is classified, and a judgment's key for a
fixed request is the one the committed checkpoints were written under."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recjudge._util import json_part, stable_hash, stable_hash_encoded
from recjudge.llm import LLMConfig, SamplingConfig, former_llm_keys, llm_key
from recjudge.reward import (
    HistoryItem,
    Judge,
    JudgeConfig,
    JudgePlan,
    JudgeRequest,
    Judgment,
    ResultsStore,
)
from recjudge.reward._plan import adopt_former_keys
from recjudge.reward._sweep import decisions_store


def test_every_judge_setting_is_classified_as_keyed_or_not():
    c = JudgeConfig
    groups = [c.KEYED, c.UNKEYED, frozenset(c.KEYED_WHEN)]
    assert set(c.model_fields) == set().union(*groups), (
        "classify the new JudgeConfig field in KEYED, UNKEYED or KEYED_WHEN: does it change "
        "an answer? (a keyed field re-keys every stored judgment)"
    )
    assert sum(len(g) for g in groups) == len(c.model_fields)  # each in one group only
    assert c.AFTER_DECISION <= c.KEYED


def _request() -> JudgeRequest:
    h = [HistoryItem("i1", "Up (2009)", "Up (2009) | family", 4.0),
         HistoryItem("i2", "Fargo (1996)", "Fargo (1996) | crime", None)]  # fmt: skip
    return JudgeRequest("7", h, "i9", "Heat (1995) | crime", sigma=0.25)


@pytest.mark.parametrize(
    ("config", "key", "decision"),
    [
        (JudgeConfig(), "43a48fd50c5bce3b750c729780da65c3", "5661e29e9c9c692a8ae4f72a86a2164a"),
        (JudgeConfig(deterministic=True, decode_rows=4), "438a782b20d62a0672b2c761cb7559e4",
         "436b2e9be0c0ff33f2622ca613ae4071"),
        (JudgeConfig(mode="zero-shot", beta=3.0), "f99d44d6b30b47759b11579b93453989",
         "5661e29e9c9c692a8ae4f72a86a2164a"),
    ],
)  # fmt: skip
def test_keys_are_the_ones_stores_and_checkpoints_were_written_under(
    monkeypatch, config, key, decision
):
    """Recorded before the key fields were classified (2026-11-27): any change to how a key
    is composed re-keys every store and committed checkpoint, and fails here first."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    j = Judge(config, llm=object())
    assert (j.key(_request()), j.decision_key(_request())) == (key, decision)


def test_unkeyed_and_conditional_settings_act_as_classified(monkeypatch):
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    req = _request()
    base = Judge(JudgeConfig(), llm=object()).key(req)
    assert Judge(JudgeConfig(batch_size=3), llm=object()).key(req) == base
    assert Judge(JudgeConfig(decode_rows=3), llm=object()).key(req) == base  # fast engine
    det = JudgeConfig(deterministic=True)
    assert Judge(det, llm=object()).key(req) != Judge(det.model_copy(update={"decode_rows": 3}),
                                                       llm=object()).key(req)  # fmt: skip
    assert Judge(JudgeConfig(persona_tokens=64), llm=object()).key(req) == base
    q = Judge(JudgeConfig(layout="question-last"), llm=object())  # keyed when not the default
    assert q.key(req) != base
    assert q.decision_key(req) != Judge(JudgeConfig(), llm=object()).decision_key(req)
    m = Judge(JudgeConfig(marking="datamark"), llm=object())  # likewise
    assert m.key(req) != base and m.key(req) != q.key(req)
    for field in sorted(JudgeConfig.AFTER_DECISION):
        other = {"mode": "no-behavior", "beta": 2.0, "need_evidence": False,
                 "cf_threshold": 0.5}[field]  # fmt: skip
        j = Judge(JudgeConfig().model_copy(update={field: other}), llm=object())
        assert j.decision_key(req) == Judge(JudgeConfig(), llm=object()).decision_key(req)
        assert j.key(req) != base


def test_a_greedy_judgment_key_ignores_the_warpers_and_the_sample_count(monkeypatch):
    """One sampling key (``SamplingConfig.key``): greedy decodes once and ignores the
    warpers, so they and ``samples`` change no greedy key; with sampling each does."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    req = _request()

    def key(**update):
        return Judge(JudgeConfig().model_copy(update=update), llm=object()).key(req)

    base = key()
    warm = SamplingConfig(max_new_tokens=256, temperature=0.2, top_k=3, seed=5)
    assert key(sampling=warm, samples=4) == base
    assert key(sampling=SamplingConfig(max_new_tokens=128)) != base
    sampled = SamplingConfig.paper(max_new_tokens=256)
    assert len({base, key(sampling=sampled), key(sampling=sampled, samples=4),
                key(sampling=sampled.model_copy(update={"seed": 1}))}) == 4  # fmt: skip


def test_rows_from_the_work_keep_the_keys_of_the_old_fixed_defaults(monkeypatch):
    """batch_size and decode_rows default to the work (None); on the batch-invariant engine,
    whose row count is keyed, None runs and keys as the old default 8, so deterministic
    stores and checkpoints written before keep resuming."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    req = _request()
    det = JudgeConfig(deterministic=True)
    assert det.rows() == 8
    old = det.model_copy(update={"decode_rows": 8, "batch_size": 8})
    assert Judge(det, llm=object()).key(req) == Judge(old, llm=object()).key(req)
    fast = JudgeConfig()
    assert (fast.batch(), fast.rows()) == (JudgeConfig.AUTO_ROWS, JudgeConfig.AUTO_ROWS)
    assert JudgeConfig(batch_size=20).rows() == 20 and JudgeConfig(decode_rows=5).rows() == 5


@given(st.lists(st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8), min_size=1, max_size=6))  # fmt: skip
@settings(max_examples=60, deadline=None, database=None)
def test_a_key_hashed_from_encoded_parts_equals_stable_hash(parts):
    assert stable_hash_encoded([json_part(p) for p in parts], length=32) == stable_hash(
        *parts, length=32)  # fmt: skip
    # items of a list joined as the list joins them (how _key encodes its small parts)
    assert stable_hash_encoded([json_part(parts)[1:-1]]) == stable_hash(*parts)


def test_a_key_follows_the_history_not_the_list_that_holds_it():
    judge = Judge(JudgeConfig(mode="no-behavior"), llm=object())
    history = [HistoryItem("a", "A", "A (1999)", 4.0), HistoryItem("b", "B", "B (2001)", None)]
    req = JudgeRequest("u", history, "c", "C")
    k = judge.key(req)
    assert judge.key(JudgeRequest("u", list(history), "c", "C")) == k  # a copy: same key
    history.append(HistoryItem("d", "D", "D", 1.0))  # the same list, edited: a new key
    assert judge.key(req) != k
    other = JudgeRequest("u", [HistoryItem("a", "A", "A (1999)", 5.0)] + history[1:2], "c", "C")
    assert judge.key(other) != k


#: a value other than the default for every keyed judge setting (a new keyed field fails
#: ``test_every_keyed_judge_setting_moves_the_key`` until it has one here)
_OTHER = {
    "beta": 3.0, "cf_threshold": 0.5, "deterministic": True, "domain": "books",
    "jump_forward_prefix": False, "max_evidence": 2, "max_history": 1, "mode": "no-behavior",
    "model": "another-model", "need_evidence": False, "rating_scale": 10.0, "samples": 3,
    "sampling": SamplingConfig(max_new_tokens=99), "show_ratings": False, "token_budget": 900,
}  # fmt: skip


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_every_keyed_judge_setting_moves_the_key(monkeypatch, sampled):
    """Declared keyed means in the key: each ``KEYED`` field changed alone moves the
    judgment's key, and its decision key unless it acts after the decision
    (``AFTER_DECISION``); greedy decodes once, so ``samples`` enters only sampled keys."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    assert set(_OTHER) == JudgeConfig.KEYED
    req = _request()
    base = JudgeConfig(sampling=SamplingConfig.paper(max_new_tokens=256)) if sampled else (
        JudgeConfig())  # fmt: skip
    judge = Judge(base, llm=object())
    for field, value in _OTHER.items():
        other = Judge(base.model_copy(update={field: value}), llm=object())
        moves = sampled or field != "samples"
        assert (other.key(req) != judge.key(req)) == moves, field
        after = field in JudgeConfig.AFTER_DECISION or not moves
        assert (other.decision_key(req) != judge.decision_key(req)) == (not after), field


def test_a_server_key_holds_no_client_dtype_guess_and_finds_answers_under_the_former(
    monkeypatch, tmp_path
):
    """A server computes in its own dtype: the client's ``auto`` (bf16 on one machine, fp32
    on another) is not in the key, a stated dtype is; a store written under the former form
    (the client's guess, until 2026-12-06) answers today's key, copied once, not judged again."""
    server = LLMConfig(model="m", backend="openai-compatible", base_url="http://127.0.0.1:9/v1")
    judge = Judge(JudgeConfig(model="m"), llm_config=server)
    req = _request()
    keys = {}
    for dtype in ("float32", "bfloat16"):
        monkeypatch.setenv("RECJUDGE_DTYPE", dtype)
        assert "dtype" not in llm_key(server)
        assert former_llm_keys(server) == [{**llm_key(server), "dtype": dtype}]
        keys[dtype] = Judge(JudgeConfig(model="m"), llm_config=server).key(req)
    assert keys["float32"] == keys["bfloat16"]  # the client's machine does not move it
    stated = server.model_copy(update={"dtype": "float16"})
    assert llm_key(stated)["dtype"] == "float16" and former_llm_keys(stated) == []
    assert former_llm_keys(LLMConfig(model="m")) == []  # transformers: nothing to migrate
    # an answer stored under the former key (bf16 here) is today's answer
    old_key = judge.keys.former(req)[0]
    assert old_key != judge.key(req)
    answer = Judgment("7", "i9", "brief", True, ["Up (2009)"], 0.8, 0.7, 0.25, 1.0, 0.3, "{}",
                      evidence_ids=["i1"], key=old_key)  # fmt: skip
    with ResultsStore(tmp_path / "s.sqlite") as store:
        store.put_many([(old_key, {"user_id": "7"}, answer.to_dict())])
        plan = JudgePlan.build(judge, [req], store)
        assert plan.todo == [] and plan.done[judge.key(req)].p_yes == 0.8
        assert plan.done[judge.key(req)].key == judge.key(req)
        assert set(store.get_many([judge.key(req), old_key])) == {judge.key(req), old_key}
        assert JudgePlan.build(judge, [req], store).todo == []  # idempotent


def test_a_decision_record_under_a_former_key_is_adopted(monkeypatch, tmp_path):
    """The sweep's decision records migrate as results do: one held only under the former
    decision key (a server's, with the client's dtype guess) is copied to today's."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    server = LLMConfig(model="m", backend="openai-compatible", base_url="http://127.0.0.1:9/v1")
    judge, req = Judge(JudgeConfig(model="m"), llm_config=server), _request()
    dkey, (old,) = judge.decision_key(req), judge.keys.former(req, bias=False)
    assert old != dkey and old not in judge.keys.former(req)  # a decision key, not a result's
    with ResultsStore(tmp_path / "s.sqlite") as store, decisions_store(store) as decisions:
        decisions.put_many([(old, {"user_id": "7"}, {"record": "as stored"})])
        stored = decisions.get_many([dkey])
        adopt_former_keys(judge.keys, decisions, [req], [dkey], stored,
                          lambda r: {"user_id": r.user_id}, bias=False)  # fmt: skip
        assert stored == {dkey: {"record": "as stored"}}
        assert decisions.get_many([dkey]) == stored
