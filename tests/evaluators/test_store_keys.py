"""Stored answers are keyed by declared fields: every config that feeds a store classifies
each field as keyed or not; one ``llm_key`` says what of an LLM changes an answer, for the
judge and every evaluator's stored questions; and keys made before those settings were keyed
(the committed checkpoints') are still the keys of the same questions asked the same way."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from recjudge._util import stable_hash
from recjudge.data import load_dataset
from recjudge.evaluators.arena import ArenaListConfig, arena_asks
from recjudge.evaluators.arena._arena import ARENA_PROMPT_VERSION, ArenaConfig, _asks
from recjudge.evaluators.arena._lists import _judges, list_run
from recjudge.evaluators.arena._prompts import arena_messages
from recjudge.evaluators.gist import _pipeline as _gist
from recjudge.evaluators.gist._config import GistConfig
from recjudge.evaluators.gist._gist import load_categories
from recjudge.evaluators.gist._metrics import Predicate
from recjudge.evaluators.gist._pipeline import gist_extraction_asks
from recjudge.evaluators.usersum import _usersum, usersum_summary_asks
from recjudge.evaluators.usersum._usersum import UserSumConfig
from recjudge.llm import (
    Capabilities,
    LLMConfig,
    LLMPool,
    SamplingConfig,
    former_llm_keys,
    llm_key,
    llm_settings_of,
    loaded_config,
    reset_llm_defaults,
    resolve_llm_config,
    set_llm_defaults,
)
from recjudge.reward import (
    JudgeConfig,
    ResultsStore,
    StoredAsk,
    adopt_former,
    ask_key,
    ask_stored,
    run_stored,
)

CHECKPOINTS = Path(__file__).parents[2] / "checkpoints"


STORE_CONFIGS = [
    LLMConfig,
    SamplingConfig,
    GistConfig,
    UserSumConfig,
    ArenaConfig,
    ArenaListConfig,
    JudgeConfig,
]


@pytest.mark.parametrize("config", STORE_CONFIGS, ids=lambda c: c.__name__)
def test_every_field_of_a_config_that_feeds_a_store_is_classified(config):
    groups = [config.KEYED, config.UNKEYED, frozenset(getattr(config, "KEYED_WHEN", {}))]
    assert set(config.model_fields) == set().union(*groups), (
        f"classify the new {config.__name__} field in KEYED or UNKEYED: does it change a "
        "stored answer? (a keyed field re-keys every stored answer it enters)"
    )
    assert sum(len(g) for g in groups) == len(config.model_fields)  # each in one group only


def test_llm_key_follows_the_classification(monkeypatch):
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    base = LLMConfig(model="m")
    assert llm_key(base) == {"dtype": "float32"}  # transformers on the CPU: the dtype only
    same = {"num_threads": 3, "api_key_env": "X", "concurrency": 2, "timeout": 5.0,
            "probe_bias": False, "implementation": "transformers"}  # fmt: skip
    assert set(same) == LLMConfig.UNKEYED
    for field, value in same.items():
        assert llm_key(base.model_copy(update={field: value})) == llm_key(base), field
    assert llm_key(base.model_copy(update={"dtype": "bfloat16"}))["dtype"] == "bfloat16"
    assert llm_key(base.model_copy(update={"device": "cuda:1"}))["device"] == "cuda"
    server = LLMConfig(model="m", backend="openai-compatible", base_url="http://h:1/v1")
    assert llm_key(server)["endpoint"] == "http://h:1/v1"
    assert llm_key(server.model_copy(update={"served_model": "other"}))["served_model"] == "other"
    vllm = LLMConfig(model="m", backend="vllm")
    assert "vllm_args" not in llm_key(vllm.model_copy(
        update={"vllm_args": {"gpu_memory_utilization": 0.5}}))  # memory only  # fmt: skip
    assert llm_key(vllm.model_copy(update={"vllm_args": {"quantization": "fp8"}}))[
        "vllm_args"] == {"quantization": "fp8"}  # fmt: skip


def test_a_loaded_backend_is_keyed_by_the_device_it_declares(monkeypatch):
    """``Capabilities.device`` (where the model computes) decides the key's device, not
    what ``auto`` would resolve to now; a stand-in refusing any use is read statically."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")

    class Loaded:
        def __init__(self, device):
            self.config = LLMConfig(model="m", device="auto")
            self.capabilities = Capabilities(device=device)

        def __getattr__(self, name):
            raise AssertionError(f"the model was used ({name})")

    assert llm_settings_of(Loaded("cuda:0"), "m") == {"dtype": "float32", "device": "cuda"}
    assert llm_settings_of(Loaded("cpu"), "m") == {"dtype": "float32"}
    assert loaded_config(Loaded("cuda:1")).device == "cuda:1"
    assert loaded_config(object()) is None and loaded_config(None) is None
    engine = Loaded("engine")
    engine.config = LLMConfig(model="m", backend="vllm")
    assert loaded_config(engine) == engine.config  # an engine places the model itself


def test_one_sampling_key_and_greedy_ignores_what_greedy_ignores():
    greedy = SamplingConfig(max_new_tokens=64)
    when = {"temperature": 0.3, "top_p": 0.5, "top_k": 5, "seed": 7}
    assert set(when) == set(SamplingConfig.KEYED_WHEN)
    sampled = SamplingConfig.paper(max_new_tokens=64)
    for field, value in when.items():  # keyed when sampling, ignored when greedy
        assert greedy.model_copy(update={field: value}).key() == greedy.key(), field
        assert sampled.model_copy(update={field: value}).key() != sampled.key(), field
    for field, value in {"do_sample": True, "max_new_tokens": 65}.items():
        assert greedy.model_copy(update={field: value}).key() != greedy.key(), field
    # the form judgments were always keyed under (whole settings at their defaults), and the
    # evaluators' earlier short form, kept only to find their answers again
    assert greedy.key() == greedy.model_dump()
    assert greedy.former_key() == {"do_sample": False, "max_new_tokens": 64}
    assert sampled.former_key() == sampled.key()


class _NoModel:  # any model call fails the test
    def __getattr__(self, name):
        raise AssertionError(f"the model was used ({name})")


def test_an_answer_stored_under_a_former_key_is_rekeyed_not_asked_again(tmp_path):
    msgs = [{"role": "user", "content": "hi"}]
    old = StoredAsk("old-key", {"q": 1}, msgs)
    new = StoredAsk("new-key", {"q": 1}, msgs, formerly=("older-key", "old-key"))
    fresh = StoredAsk("fresh-key", {"q": 2}, msgs, formerly=("never-stored",))
    with ResultsStore(tmp_path / "s.sqlite") as store:
        store.put_many([(old.key, old.request, {"value": "A", "branches": None, "p": None})])
        got = ask_stored(_NoModel(), store, [new], progress=False)
        assert got == {"new-key": {"value": "A", "branches": None, "p": None}}
        assert store.missing(["new-key", "old-key"]) == []  # copied; the old row stays

        assert adopt_former(store, [new]) == 0  # idempotent
        assert adopt_former(store, [fresh]) == 0 and store.missing(["fresh-key"])


def test_arena_keys_its_budget_once_and_finds_answers_under_the_former_form():
    """The arena's greedy budget entered its keys in the short form until 2026-12-02 (the
    committed arena checkpoints' keys): each question names that key as ``formerly``."""
    config = ArenaConfig(model="m", systems=("pop", "itemknn"), users=1, absolute=False)
    arena = SimpleNamespace(config=config, users=["7"], profiles={"7": "age 25"},
                            history={"7": ["Up (2009)"]}, word="movies",
                            lists={"pop": {"7": ["Heat (1995)"]},
                                   "itemknn": {"7": ["Fargo (1996)"]}})  # fmt: skip
    sampling = SamplingConfig(max_new_tokens=300)
    llm = {"dtype": "bfloat16"}
    asks = _asks(arena, sampling, llm)
    assert asks and all(len(a.formerly) == 1 for a in asks)
    for a in asks:
        req = a.request
        msgs = arena_messages("age 25", ["Up (2009)"], arena.lists[req["system_a"]]["7"],
                              arena.lists[req["system_b"]]["7"], config.analysis_chars,
                              "movies", config.analysis == "per-aspect")  # fmt: skip
        assert a.messages == msgs
        short = {"do_sample": False, "max_new_tokens": 300}  # the form before 2026-12-02
        assert a.formerly[0] == ask_key(ARENA_PROMPT_VERSION, "m", msgs, short, a.schema.key(),
                                        llm=llm, length=32)  # fmt: skip
        assert a.key == ask_key(ARENA_PROMPT_VERSION, "m", msgs, sampling.key(),
                                a.schema.key(), llm=llm, length=32)  # fmt: skip


def test_legacy_settings_add_nothing_to_a_key_and_any_other_value_is_its_own_key():
    parts = ("v1", "extract", "m", [{"role": "user", "content": "hi"}])
    legacy = {"deterministic": False, "extraction_tokens": 1024}
    old = stable_hash(*parts)
    assert ask_key(*parts, llm={"dtype": "bfloat16"}, settings=legacy, legacy=legacy) == old
    others = [({"dtype": "float32"}, legacy), ({"dtype": "bfloat16", "device": "cuda"}, legacy),
              ({"dtype": "bfloat16"}, {**legacy, "extraction_tokens": 512}),
              ({"dtype": "bfloat16"}, {**legacy, "deterministic": True})]  # fmt: skip
    keys = {ask_key(*parts, llm=llm, settings=s, legacy=legacy) for llm, s in others}
    assert old not in keys and len(keys) == len(others)


@pytest.fixture(scope="module")
def gist_ml1m():
    """GISTBench's extraction questions as the committed ML-1M run asked them (its command
    in checkpoints/README.md), and the keys its checkpoint holds."""
    config = GistConfig(models=("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"),
                        judge="qwen2.5-coder-1.5b", users=30)  # fmt: skip
    ck = CHECKPOINTS / "gist-ml1m-1.5b" / "store.ckpt.gz"
    with gzip.open(ck, "rt") as f:
        next(f)
        stored = {json.loads(line)["key"] for line in f}
    return config, stored


def _extraction_keys(config, monkeypatch, dtype="bfloat16"):
    monkeypatch.setenv("RECJUDGE_DTYPE", dtype)
    return {a.key for a in gist_extraction_asks(config, "ml-1m")}


def test_the_committed_gist_checkpoint_answers_todays_questions(gist_ml1m, monkeypatch):
    """The run was bf16 on the CPU, default budget, not deterministic: today's keys for its
    189 extraction questions are the stored ones (182 exported; the 7 that name a title stay
    behind, checkpoints/README.md), so nothing it holds is asked again."""
    config, stored = gist_ml1m
    keys = _extraction_keys(config, monkeypatch)
    assert len(keys) == 189 and len(keys & stored) == 182


@pytest.mark.parametrize(
    ("update", "dtype", "reused"),
    [({"extraction_tokens": 512}, "bfloat16", False),  # a cut answer is another answer
     ({"deterministic": True}, "bfloat16", False),  # the batch-invariant engine's answer
     ({}, "float32", False),  # fp32 rounds differently
     ({"batch_size": 3, "bootstrap": 10, "agreement_sample": 5}, "bfloat16", True)],
)  # fmt: skip
def test_a_changed_setting_is_asked_again_and_an_unkeyed_one_is_not(
    gist_ml1m, monkeypatch, update, dtype, reused
):
    config, stored = gist_ml1m
    keys = _extraction_keys(config.model_copy(update=update), monkeypatch, dtype)
    assert len(keys & stored) == (182 if reused else 0)


# -- each declared field acts as declared: a keyed one moves the keys, an unkeyed one not ----


def _moves_and_keeps(base: dict, other: dict, keyed: bool, field: str) -> None:
    """``base``/``other``: question id -> key. Keyed: a question both runs ask has another
    key in at least one case (or, where no question is shared, no key is). Unkeyed: the
    runs share a question, and every shared one keeps its key."""
    both = base.keys() & other.keys()
    if keyed:
        moved = any(base[q] != other[q] for q in both) if both else (
            not set(base.values()) & set(other.values()))  # fmt: skip
        assert moved and other, f"{field} is declared keyed but no key moved"
    else:
        assert both, f"{field}: the perturbation leaves no question to compare"
        assert all(base[q] == other[q] for q in both), f"{field} moved a key it should keep"


def _arena_questions(config) -> dict:
    asks, _, _ = arena_asks(config, "ml-100k", {"dtype": "float32"})
    return {tuple(sorted(a.request.items())): a.key for a in asks}


def test_every_arena_field_acts_on_the_keys_as_declared(tmp_path):
    """ArenaConfig: each KEYED field changed alone moves a comparison's key; each UNKEYED
    one (changed alone, or with ``both_orders`` where the orders would share nothing) keeps
    the key of every comparison both runs ask."""
    base = ArenaConfig(model="smollm2-135m", systems=("pop", "als"), users=3, k=3,
                       history_items=3, history_min_rating=4.0)  # fmt: skip
    asked = _arena_questions(base)
    # lists of the same system name from a file: other items for the same users
    users = sorted({dict(q)["user_id"] for q in asked})
    lists = tmp_path / "als-lists.csv"
    lists.write_text("user_id,rank,item_id\n" + "".join(
        f"{u},{r},{i}\n" for u in users for r, i in enumerate(["1", "2", "3"], 1)))  # fmt: skip
    keyed = {"model": "qwen2.5-coder-0.5b", "systems": ("pop", f"als={lists}"), "k": 2,
             "history_items": 2, "history_min_rating": 5.0, "analysis": "joint",
             "analysis_chars": 100, "seed": 1}  # fmt: skip
    unkeyed = {"design": {"design": "round-robin"}, "users": {"users": 4},
               "reference": {"reference": "als", "both_orders": True},
               "reference_position": {"reference_position": "A", "both_orders": True},
               "both_orders": {"both_orders": True}, "swap_rule": {"swap_rule": "keep"},
               "bootstrap": {"bootstrap": 10}, "similarity": {"similarity": "embedding"},
               "absolute": {"absolute": True}, "batch_size": {"batch_size": 3}}  # fmt: skip
    assert set(keyed) == ArenaConfig.KEYED and set(unkeyed) == ArenaConfig.UNKEYED
    for field, value in keyed.items():
        _moves_and_keeps(asked, _arena_questions(base.model_copy(update={field: value})),
                         True, field)  # fmt: skip
    for field, update in unkeyed.items():
        mine = base.model_copy(update={"both_orders": True}) if "both_orders" in update and (
            field != "both_orders") else base  # fmt: skip
        _moves_and_keeps(_arena_questions(mine), _arena_questions(
            mine.model_copy(update=update)), False, field)  # fmt: skip


def _list_questions(config) -> dict:
    run = list_run(config, "ml-100k")
    judges = _judges(config, None, run.cf)
    return {(name, r.user_id, r.candidate_id): j.key(r) for name, j in judges.items()
            for r in run.reqs}  # fmt: skip


def test_every_list_arena_field_acts_on_the_keys_as_declared(monkeypatch):
    """ArenaListConfig (its judgments are the judges'): each KEYED field changed alone moves
    a judgment's key; each UNKEYED one keeps the key of every judgment both runs make."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    base = ArenaListConfig(model="smollm2-135m", systems=("pop", "als"), users=3, k=3,
                           history_items=5, dtype="float32")  # fmt: skip
    asked = _list_questions(base)
    keyed = {"model": "qwen2.5-coder-0.5b", "dtype": "bfloat16", "beta": 5.0,
             "history_items": 2, "sigma_from": "bpr", "seed": 1}  # fmt: skip
    unkeyed = {"systems": ("pop", "als", "itemknn"), "reference": "als", "users": 4,
               "k": 2, "discount": "none", "tie_margin": 0.1, "bootstrap": 10,
               "decode_rows": 3}  # fmt: skip
    assert set(keyed) == ArenaListConfig.KEYED and set(unkeyed) == ArenaListConfig.UNKEYED
    for field, value in {**keyed, **unkeyed}.items():
        other = base.model_copy(update={field: value})
        if field == "systems":  # itemknn is the default sigma_from: take another
            other = other.model_copy(update={"sigma_from": "bpr"})
            base_q = _list_questions(base.model_copy(update={"sigma_from": "bpr"}))
        else:
            base_q = asked
        _moves_and_keeps(base_q, _list_questions(other), field in keyed, field)


#: GistConfig's keyed fields that enter the questions after extraction (relevance,
#: taxonomy, specificity): at extraction they must leave every key as it is; their own
#: stages are checked on fixed interests (``test_every_gist_field_acts_on_the_later_...``)
GIST_LATER_STAGES = {"judge", "evidence_for_specificity", "options", "pool_size", "taxonomy",
                     "shortlist"}  # fmt: skip


def test_every_gist_field_acts_on_the_extraction_keys_as_declared(monkeypatch):
    """GistConfig at its first stage (``gist_extraction_asks``, no model): each keyed field
    of extraction moves a question's key; the keyed fields of the later stages and every
    UNKEYED one keep the key of each extraction question both runs ask. (``seed`` draws the
    users, so the runs share no question: its keying is at the later stages'.)"""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")

    def questions(config):
        return {tuple(sorted(a.request.items())): a.key
                for a in gist_extraction_asks(config, "ml-100k")}  # fmt: skip

    base = GistConfig(models=("smollm2-135m",), judge="smollm2-135m", users=3)
    asked = questions(base)
    extraction = {"models": ("qwen2.5-coder-0.5b",), "max_history": 20, "chunk_size": 50,
                  "max_interests": 5, "max_ids": 5, "extraction_tokens": 512,
                  "words": (1, 4), "interest_example": "quiet family dramas",
                  "deterministic": True, "max_citations": 3,
                  "predicate": Predicate(imp_pos=2)}  # fmt: skip
    later = {"judge": "qwen2.5-coder-0.5b", "evidence_for_specificity": 3, "options": 20,
             "pool_size": 500, "taxonomy": "shortlist", "shortlist": 10}  # fmt: skip
    unkeyed = {"users": 4, "min_history": 10, "enforce_citations": True,
               "agreement_sample": 5, "batch_size": 3, "bootstrap": 10,
               "share_judge_answers": False}  # fmt: skip
    assert set(later) == GIST_LATER_STAGES
    assert set(extraction) | set(later) | {"seed"} == GistConfig.KEYED
    assert set(unkeyed) == GistConfig.UNKEYED
    for field, value in {**extraction, **later, **unkeyed}.items():
        other = questions(base.model_copy(update={field: value}))
        _moves_and_keeps(asked, other, field in extraction, field)


#: UserSumConfig's keyed fields that enter only the questions after each user's single
#: summary (segments, critiques, QA, the predictor's options): checked through every stage
#: with stand-in answers (``test_every_usersum_field_acts_on_the_later_stages_...``)
USERSUM_LATER_STAGES = {"predictor", "segmentation", "min_segment", "max_segments",
                        "critique_rounds", "qa_pairs", "recent"}  # fmt: skip


def test_every_usersum_field_acts_on_the_summary_keys_as_declared(monkeypatch):
    """UserSumConfig at its first questions (``usersum_summary_asks``, no model): each keyed
    field of a single summary moves a question's key; the later stages' keyed fields and
    every UNKEYED one keep every key. (``seed`` draws the users: its keying is the options'.)"""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")

    def questions(config):
        return {json.dumps(a.messages): a.key for a in usersum_summary_asks(config, "ml-100k")}

    base = UserSumConfig(model="smollm2-135m", predictor="smollm2-135m", users=3,
                         max_activities=60, future=5)  # fmt: skip
    asked = questions(base)
    first = {"model": "qwen2.5-coder-0.5b", "max_activities": 50, "future": 6,
             "word_limit": 100, "query": "What does this {domain} fan like?"}  # fmt: skip
    later = {"predictor": "qwen2.5-coder-0.5b", "segmentation": "count", "min_segment": 10,
             "max_segments": 2, "critique_rounds": 1, "qa_pairs": 2,
             "recent": 5}  # fmt: skip
    unkeyed = {"summarizers": ("single",), "users": 4, "min_activities": 60, "m": 2,
               "batch_size": 2, "bootstrap": 200, "runs": 2}  # fmt: skip
    assert set(later) == USERSUM_LATER_STAGES
    assert set(first) | set(later) | {"seed"} == UserSumConfig.KEYED
    assert set(unkeyed) == UserSumConfig.UNKEYED
    for field, value in {**first, **later, **unkeyed}.items():
        other = questions(base.model_copy(update={field: value}))
        _moves_and_keeps(asked, other, field in first, field)


@pytest.mark.parametrize("evaluator", ["gist", "usersum", "arena"])
def test_an_evaluator_question_asked_of_a_server_finds_its_answer_under_the_former_key(
    evaluator, monkeypatch, tmp_path
):
    """A server's key no longer holds the client's dtype guess (``llm_key``); a question a
    client whose ``auto`` was fp32 stored under the former form is found and re-keyed, not
    asked again (``formerly``, ``adopt_former``)."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    token = set_llm_defaults(backend="openai-compatible", base_url="http://127.0.0.1:9/v1")
    try:
        if evaluator == "gist":
            asks = gist_extraction_asks(GistConfig(judge="smollm2-135m", users=2), "ml-100k")
        elif evaluator == "usersum":
            asks = usersum_summary_asks(UserSumConfig(model="smollm2-135m", users=2,
                                                      max_activities=60), "ml-100k")  # fmt: skip
        else:
            server = resolve_llm_config("smollm2-135m")
            asks, _, _ = arena_asks(ArenaConfig(model="smollm2-135m", systems=("pop", "als"),
                                                users=2, k=3), "ml-100k", llm_key(server),
                                    former_llm_keys(server))  # fmt: skip
    finally:
        reset_llm_defaults(token)
    assert asks and all(a.formerly for a in asks)
    with ResultsStore(tmp_path / "s.sqlite") as store:
        old = asks[0].formerly[-1]  # the former LLM form (after any budget forms)
        store.put_many([(old, {"kind": "test"}, {"value": "stored before", "text": "x"})])
        assert adopt_former(store, asks) == 1
        assert store.get_many([asks[0].key])[asks[0].key]["value"] == "stored before"


# -- the later stages: every question asked, answered at the store by a stand-in ------------


class _KeysOnly(LLMPool):
    """Keys each model as ``load_llm`` would load it; never loads one (any use fails)."""

    def get(self, name):
        return _NoModel()


def _stand_in(part: list[StoredAsk]) -> list[dict]:
    """An answer per question, by its kind, in the stored form its stage reads (for
    ``run_stored``, in place of the model). Free choices follow from the key, so a question
    asked under the same key gets the same answer and what depends on it is asked alike."""
    names = {n: i for i, n in load_categories().items()}
    out = []
    for q in part:
        h, kind = int(stable_hash(q.key), 16), q.request["kind"]
        if kind == "relevant":
            out.append({"yes": h % 3 == 0, "p": [(h % 97) / 97]})
        elif kind.startswith("taxonomy"):
            name = q.request.get("options", list(names))[h % 3]
            out.append({"category_id": names[name], "category": name, "logprob": -1.0})
        elif kind == "specificity":
            out.append({"picks": list(q.schema.labels[: q.schema.n])})
        elif kind == "gen":
            out.append({"text": f"Enjoys the kind of film numbered {h % 1000}."})
        elif kind == "qg":
            qa = [{"question": f"Which {n}?", "answer": f"{h % 10}"} for n in range(q.schema.n)]
            out.append({"value": qa, "p": None})
        else:  # the verifier's checks always fail (every summary is regenerated every
            # round), the predictor answers from the key
            value = {"query_check": {"verdict": "inconsistent"},
                     "qa_check": {"verdict": "inconsistent", "analysis": "the log differs"},
                     "predict": {"answer": "ABCDE"[h % 5]}}[kind]  # fmt: skip
            out.append({"value": value, "p": None})
    return out


class _Asked(dict):
    """Question id (its request, without a shortlist's options: content the settings
    choose) -> key, for every question a run asks; one id is one question."""

    def record(self, asks) -> None:
        for a in asks:
            qid = json.dumps({k: v for k, v in a.request.items() if k != "options"},
                             sort_keys=True)  # fmt: skip
            assert self.setdefault(qid, a.key) == a.key, f"two questions under one id {qid}"


def _gist_later_questions(config, users, tmp_path, monkeypatch) -> _Asked:
    """Every question GISTBench's later stages (evidence filter, taxonomy, specificity with
    its distractor checks) ask about fixed interests of ``users``; answered by ``_stand_in``."""
    asked = _Asked()

    def ask(run, llm, asks, desc, sampling, kind="judge"):
        asked.record(asks)
        return run_stored(run.store, asks, _stand_in, progress=False)

    def judge(run, asks, answer, desc, batch_size=None):
        asked.record(asks)
        return run_stored(run.store, asks, _stand_in, progress=False)

    def embed(llm, texts, batch=32):  # the shortlist's similarity: any fixed vectors
        return np.stack([np.random.default_rng(int(stable_hash(t), 16)).normal(size=8)
                         for t in texts])  # fmt: skip

    monkeypatch.setattr(_gist, "_ask_stored", ask)
    monkeypatch.setattr(_gist, "_judge_stored", judge)
    monkeypatch.setattr(_gist, "embed_texts", embed)
    monkeypatch.setattr(_gist, "taxonomy_rule", lambda judge: "likelihood")
    ds = load_dataset("ml-100k")
    histories, text, word, titles = _gist._texts(ds, users, config.max_history)
    # three interests per user; the second history item is cited by all three, one more
    # than max_citations allows
    interests = [_gist._Interest(u, config.models[0], f"{name} {n}",
                                 [i for i, _ in histories[u][a:b]])
                 for n, u in enumerate(users)
                 for name, (a, b) in (("family dramas", (0, 3)), ("crime thrillers", (1, 4)),
                                      ("space adventures", (1, 2)))]  # fmt: skip
    with ResultsStore(tmp_path / f"{stable_hash(config.model_dump_json())}.sqlite") as store:
        run = _gist._Run(config, ds, users, histories, text, word, titles, store, False,
                         _KeysOnly())  # fmt: skip
        _gist._verify(run, interests)
    return asked


def test_every_gist_field_acts_on_the_later_stages_keys_as_declared(monkeypatch, tmp_path):
    """GistConfig after extraction, for the same interests of the same users: each keyed
    field of the later stages (and ``seed``: distractors, evidence samples) changed alone
    moves a question's key; every UNKEYED one keeps the key of each question both ask."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    base = GistConfig(models=("smollm2-135m",), judge="smollm2-135m", users=2, options=8,
                      pool_size=40, taxonomy="shortlist", shortlist=6,
                      agreement_sample=0)  # fmt: skip
    users = _gist._sampled_users(base, load_dataset("ml-100k"))

    def questions(config):
        return _gist_later_questions(config, users, tmp_path, monkeypatch)

    asked = questions(base)
    kinds = {json.loads(q)["kind"] for q in asked}
    assert kinds == {"relevant", "taxonomy-likelihood-shortlist", "specificity"}
    later = {"judge": "qwen2.5-coder-0.5b", "evidence_for_specificity": 2, "options": 10,
             "pool_size": 60, "shortlist": 4, "seed": 1}  # fmt: skip
    unkeyed = {"users": 5, "min_history": 30, "enforce_citations": True,
               "agreement_sample": 2, "batch_size": 3, "bootstrap": 10,
               "share_judge_answers": False}  # fmt: skip
    assert set(later) | {"taxonomy"} == GIST_LATER_STAGES | {"seed"}
    assert set(unkeyed) == GistConfig.UNKEYED
    for field, value in {**later, **unkeyed}.items():
        other = questions(base.model_copy(update={field: value}))
        _moves_and_keeps(asked, other, field in later, field)

    # the full taxonomy asks each interest another question: none under a shortlist key
    def taxonomy(qs):
        return {q: k for q, k in qs.items() if json.loads(q)["kind"].startswith("taxonomy")}

    full = questions(base.model_copy(update={"taxonomy": "full"}))
    _moves_and_keeps(taxonomy(asked), taxonomy(full), True, "taxonomy")


def _usersum_later_questions(config, tmp_path, monkeypatch) -> _Asked:
    """Every question UserSumBench asks (summaries, the verifier's checks, regenerations,
    the predictor's tasks), answered by ``_stand_in``."""
    asked = _Asked()

    def stored(llm, store, asks, **kw):
        asked.record(asks)
        return run_stored(store, asks, _stand_in, progress=False)

    monkeypatch.setattr(_usersum, "generate_stored", stored)
    monkeypatch.setattr(_usersum, "ask_stored", stored)
    world = _usersum._world(config, "ml-100k")
    with ResultsStore(tmp_path / f"{stable_hash(config.model_dump_json())}.sqlite") as store:
        _usersum._ask_all(_usersum._Sum(config, *world, store, False, _KeysOnly()))
    return asked


def test_every_usersum_field_acts_on_the_later_stages_keys_as_declared(monkeypatch, tmp_path):
    """UserSumConfig through every stage (each question named by user, stage, segment,
    round, summariser, run and task): each keyed field of the later stages changed alone
    moves a question's key; every UNKEYED one keeps the key of each question both ask."""
    monkeypatch.setenv("RECJUDGE_DTYPE", "float32")
    base = UserSumConfig(model="smollm2-135m", predictor="smollm2-135m", users=3,
                         max_activities=60, future=5, min_segment=10, runs=1)  # fmt: skip

    def questions(config):
        return _usersum_later_questions(config, tmp_path, monkeypatch)

    asked = questions(base)
    kinds = {json.loads(q)["kind"] for q in asked}
    assert kinds == {"gen", "query_check", "qg", "qa_check", "predict"}
    later = {"predictor": "qwen2.5-coder-0.5b", "segmentation": "count", "min_segment": 20,
             "max_segments": 2, "critique_rounds": 1, "qa_pairs": 2, "recent": 5}  # fmt: skip
    unkeyed = {"summarizers": ("single",), "users": 4, "min_activities": 60, "m": 2,
               "batch_size": 2, "bootstrap": 200, "runs": 2}  # fmt: skip
    assert set(later) == USERSUM_LATER_STAGES
    assert set(unkeyed) == UserSumConfig.UNKEYED
    for field, value in {**later, **unkeyed}.items():
        other = questions(base.model_copy(update={field: value}))
        _moves_and_keeps(asked, other, field in later, field)
