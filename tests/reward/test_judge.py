"""The judge end to end on real ML-1M rows with SmolLM2, the store, keys and resume."""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import recjudge.reward._keys as jm
from cli_in_process import run_cli
from recjudge._util import gc_paused
from recjudge.cf_models import TrainOptions, train_cf
from recjudge.llm import LLMConfig, SamplingConfig
from recjudge.reward import (
    MODES,
    SIMULATOR_MODES,
    HistoryItem,
    Judge,
    JudgeConfig,
    JudgePlan,
    JudgeRequest,
    Judgment,
    ResultsStore,
    build_messages,
    plan_calls,
    request_for,
    requests_for,
)

PAIRS = [
    ("1", "Toy Story (1995)"),
    ("1", "Friday the 13th (1980)"),
    ("10", "Heat (1995)"),
    ("10", "Fargo (1996)"),
]


@pytest.fixture(scope="module")
def als(ml1m, tmp_path_factory):
    path = tmp_path_factory.mktemp("cf") / "als"
    return train_cf(
        "als", ml1m, path, {"factors": 16, "iterations": 3}, TrainOptions(progress=False, threads=2)
    ), path


@pytest.fixture(scope="module")
def requests(ml1m):
    return [request_for(ml1m, u, c) for u, c in PAIRS]


# The user simulators have their own end-to-end test (tests/reward/test_simulators.py).
@pytest.mark.parametrize("mode", [m for m in MODES if m not in SIMULATOR_MODES])
def test_every_mode_end_to_end(smollm, als, requests, mode):
    # 20 history items (the default is 50): each mode's wiring, not the prefill's size
    cfg = JudgeConfig(mode=mode, max_evidence=2, batch_size=4, max_history=20)
    judge = Judge(cfg, llm=smollm, cf=als[0])
    results = judge.judge_many(requests[:2])
    for req, j in zip(requests[:2], results, strict=True):
        assert j.mode == mode and j.candidate_id == req.candidate_id
        assert 0.0 <= j.p_yes <= 1.0
        shown = {h.title for h in req.history}
        assert set(j.evidence) <= shown  # evidence is a subset of the history titles
        if mode in ("brief", "non-adaptive", "no-behavior", "item-item"):
            value = json.loads(j.raw_text)
            assert (len(value["evidence"]) > 0) == j.is_relevant  # the iff rule
            assert (value["is_relevant"] == "YES") == j.is_relevant
            assert len(value["evidence"]) == len(set(value["evidence"])) <= 2
            assert 0.0 <= j.p_yes_semantic <= 1.0
        if mode == "zero-shot":
            assert json.loads(j.raw_text)["is_relevant"] in ("YES", "NO") and not j.evidence
        if mode in ("no-behavior", "zero-shot"):
            assert j.delta == 0.0 and j.p_yes == pytest.approx(j.p_yes_semantic)
        if mode == "cf-only":
            assert j.is_relevant == (j.sigma > 0)
        if mode in ("brief", "non-adaptive", "item-item"):
            assert -1.0 <= j.sigma <= 1.0
            assert j.delta == pytest.approx(j.delta)  # finite
            # The bias pushes the verdict the signal's way, whatever the model's own preference
            # (which differs by dtype and CPU); its exact size is test_adaptive_delta_formula's.
            if j.sigma > 0:
                assert j.p_yes >= j.p_yes_semantic
            if j.sigma < 0:
                assert j.p_yes <= j.p_yes_semantic


def test_adaptive_delta_formula(smollm, als, requests):
    def judged(mode, **kw):
        cfg = JudgeConfig(mode=mode, need_evidence=False, max_history=20, **kw)
        return Judge(cfg, llm=smollm, cf=als[0]).judge(requests[2])

    j = judged("brief")
    assert j.delta == pytest.approx(25.0 * (1 + j.entropy) * j.sigma, rel=1e-9)
    n = judged("non-adaptive")
    assert n.delta == pytest.approx(25.0 * n.sigma, rel=1e-9)
    # +Delta on YES and -Delta on NO: the YES log-odds move by exactly 2 * Delta (beta 1 keeps
    # both probabilities away from 0 and 1, where the log-odds are not representable).
    w = judged("non-adaptive", beta=1.0)
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    assert logit(w.p_yes) - logit(w.p_yes_semantic) == pytest.approx(2 * w.delta, abs=1e-4)


def test_batch_equals_single(smollm32, als, requests):
    # fp32: in bf16 a batch of 4 and a batch of 1 round differently (kernel blocking).
    cfg = JudgeConfig(mode="brief", beta=2.0, max_evidence=2, batch_size=4, max_history=20)
    judge = Judge(cfg, llm=smollm32, cf=als[0])
    batched = judge.judge_many(requests)
    for req, b in zip(requests, batched, strict=True):
        s = judge.judge(req)
        assert s.is_relevant == b.is_relevant
        assert abs(s.p_yes - b.p_yes) < 1e-3
        assert abs(s.p_yes_semantic - b.p_yes_semantic) < 1e-3
        assert s.raw_text == b.raw_text


def test_calls_pack_several_users_whole_and_never_split_one_below_the_batch(smollm, requests):
    """Requests of one prefix (a user) stay in one call; several users share a call while
    they fit (their rows decode in the same steps); a user larger than a call is cut."""

    def calls(batch_size):
        config = JudgeConfig(mode="no-behavior", batch_size=batch_size)
        return plan_calls(config, requests, list(range(len(requests))))

    assert calls(4) == [[0, 1, 2, 3]]  # two users, two candidates each
    assert calls(3) == [[0, 1], [2, 3]]  # the second user does not fit beside the first
    assert calls(1) == [[0], [1], [2], [3]]
    assert sorted(i for c in calls(None) for i in c) == [0, 1, 2, 3]


def test_deterministic_engine_is_bit_identical_alone_or_batched(smollm, als, requests):
    cfg = JudgeConfig(
        mode="brief", beta=2.0, max_evidence=2, deterministic=True, decode_rows=4, max_history=20
    )
    judge = Judge(cfg, llm=smollm, cf=als[0])
    batched = judge.judge_many(requests[:2])  # one user: two rows share the prefix
    for req, b in zip(requests[:2], batched, strict=True):
        s = judge.judge(req)
        assert (s.p_yes, s.p_yes_semantic, s.raw_text) == (b.p_yes, b.p_yes_semantic, b.raw_text)


def test_sampled_estimate_is_seeded(smollm, requests):
    cfg = JudgeConfig(
        mode="no-behavior",
        need_evidence=False,
        samples=6,
        sampling=SamplingConfig.paper(seed=5, max_new_tokens=64),
    )
    a = Judge(cfg, llm=smollm).judge(requests[0])
    b = Judge(cfg, llm=smollm).judge(requests[0])
    assert a.samples_yes == b.samples_yes and 0 <= a.samples_yes <= 6
    assert a.p_yes == pytest.approx(a.samples_yes / 6)


def test_keys_change_with_every_keyed_setting(als, requests, monkeypatch):
    base = JudgeConfig()
    req = requests[0]
    k0 = Judge(base, llm=object(), cf=als[0]).key(req)
    variants = [
        base.model_copy(update={"model": "qwen2.5-coder-0.5b"}),
        base.model_copy(update={"mode": "non-adaptive"}),
        base.model_copy(update={"beta": 10.0}),
        base.model_copy(update={"max_evidence": 3}),
        base.model_copy(update={"sampling": SamplingConfig.paper(seed=1)}),
        base.model_copy(update={"token_budget": 500}),
    ]
    keys = {Judge(v, llm=object(), cf=als[0]).key(req) for v in variants}
    assert k0 not in keys and len(keys) == len(variants)
    assert (
        Judge(base.model_copy(update={"batch_size": 3}), llm=object(), cf=als[0]).key(req) == k0
    )  # batching never changes a result
    # decode_rows is only a batch bound on the fast engine, but fixes the rounding of the
    # batch-invariant one; that engine's results never share keys with the fast one's.
    rows = base.model_copy(update={"decode_rows": 3})
    assert Judge(rows, llm=object(), cf=als[0]).key(req) == k0
    det = base.model_copy(update={"deterministic": True})
    det_keys = {
        Judge(d, llm=object(), cf=als[0]).key(req)
        for d in (det, det.model_copy(update={"decode_rows": 3}))
    }
    assert len(det_keys) == 2 and k0 not in det_keys
    assert Judge(base, llm=object(), cf=als[0]).key(requests[1]) != k0
    assert Judge(base, llm=object(), cf=None).key(req) != k0  # another CF model

    class _Remote:  # a loaded backend is identified by its config
        def __init__(self, url):
            self.config = LLMConfig(model=base.model, backend="openai-compatible", base_url=url)

    a, b = (Judge(base, llm=_Remote(u), cf=als[0]).key(req)
            for u in ("http://127.0.0.1:8000/v1", "http://127.0.0.1:9000/v1"))  # fmt: skip
    assert len({k0, a, b}) == 3  # another endpoint may serve another build of the model

    monkeypatch.setattr(jm, "PROMPT_VERSION", "brief-v2")
    assert Judge(base, llm=object(), cf=als[0]).key(req) != k0


def test_config_round_trip():
    c = JudgeConfig(mode="item-item", beta=15, sampling=SamplingConfig.paper(seed=3))
    assert JudgeConfig.model_validate_json(c.model_dump_json()) == c


def test_bad_requests(ml1m):
    with pytest.raises(KeyError, match="Closest matches: 'Toy Story \\(1995\\)'"):
        request_for(ml1m, "1", "Toy Stroy (1995)")
    with pytest.raises(KeyError, match="user '0' is not in dataset"):
        request_for(ml1m, "0", "Toy Story (1995)")
    with pytest.raises(ValueError, match="empty history"):
        JudgeRequest("u", [], "i", "Item")
    with pytest.raises(ValueError, match="needs a CF model"):
        Judge(JudgeConfig(mode="brief"), llm=object()).sigma_for(
            JudgeRequest("u", [HistoryItem("a", "A", "A")], "b", "B")
        )


def test_sigmas_for_scores_once_per_user_and_equals_sigma_for(ml1m, als):
    cf = als[0]
    judge = Judge(JudgeConfig(mode="brief"), llm=object(), cf=cf)
    seen = ml1m.history("1")["item_id"].astype(str).tolist()
    new = [i for i in ml1m.items["item_id"].astype(str) if i not in seen][:3]
    pairs = [("1", new[0]), ("1", new[1]), ("1", seen[5]), ("2", new[2]), ("1", new[2])]
    reqs = requests_for(ml1m, pairs)
    reqs.append(replace(reqs[0], sigma=0.25))  # a given sigma is taken as given
    calls = []
    score = cf.score_history
    cf.score_history = lambda *a, **k: calls.append(a) or score(*a, **k)
    try:
        got = judge.sigmas_for(reqs)
    finally:
        del cf.score_history
    # user 1's history differs for an item it rated (shown without it): 3 histories
    assert len(calls) == len({(r.user_id, tuple(h.item_id for h in r.history))
                              for r in reqs[:-1]}) == 3  # fmt: skip
    assert got == [judge.sigma_for(r) for r in reqs] and got[-1] == 0.25


def test_a_failing_sigma_fails_only_its_own_request(ml1m, als):
    judge = Judge(JudgeConfig(mode="brief"), llm=object(), cf=als[0])
    ok = request_for(ml1m, "1", "Toy Story (1995)")
    bad = replace(ok, sigma=float("nan"))
    got = judge.sigmas_for([ok, bad, ok])
    assert isinstance(got[1], ValueError) and "sigma is not finite" in str(got[1])
    assert got[0] == got[2] == judge.sigma_for(ok)


def test_history_is_before_candidate(ml1m):
    h = ml1m.history("1")
    target = h.iloc[10]
    req = request_for(ml1m, "1", target["item_id"])
    assert target["item_id"] not in [x.item_id for x in req.history]
    assert len(req.history) <= 10 + int((h["timestamp"] == target["timestamp"]).sum())


def test_prompt_budget_drops_oldest_and_counts():
    hist = [HistoryItem(str(i), f"T{i}", f"Title {i}", 4.0) for i in range(30)]
    rp = build_messages(
        hist,
        "Cand",
        domain="movies",
        rating_scale=5,
        count_tokens=lambda lines: [10] * len(lines),
        token_budget=95,
    )
    assert len(rp.shown) == 9 and rp.dropped == 21
    assert rp.shown[0].title == "T29"  # most recent first
    assert "21 older movies not shown" in rp.messages[1]["content"]
    assert "(rated 4/5)" in rp.messages[1]["content"]


def test_store_transactions_and_export(tmp_path):
    with ResultsStore(tmp_path / "s.sqlite") as st:
        st.put_many([("a", {"u": 1}, {"p": 0.5}), ("b", {"u": 2}, {"p": 0.1})])
        st.put_many([("a", {"u": 1}, {"p": 0.9})])  # an existing key is kept
        assert len(st) == 2 and st.get_many(["a"])["a"]["p"] == 0.5
        assert st.missing(["a", "c"]) == ["c"]
        lines = st.export_jsonl(tmp_path / "o.jsonl").read_text().splitlines()
        assert [json.loads(x)["key"] for x in lines] == ["a", "b"]
        assert st.export_parquet(tmp_path / "o.parquet").exists()


@pytest.mark.e2e
def test_sigkill_mid_run_then_resume_matches_uninterrupted(tmp_path, ml1m, smollm):
    """A real subprocess killed with SIGKILL mid-run, then resumed, ends with exactly one row
    per request and the same results as an uninterrupted run (here in-process)."""
    users = ["1", "2", "3", "4", "5", "6"]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"user_id": u, "item_id": "Toy Story (1995)"}) + "\n" for u in users)
    )
    cmd = [
        sys.executable,
        "-m",
        "recjudge.cli._main",
        "judge",
        "--data",
        "ml-1m",
        "--pairs",
        str(pairs),
        "--mode",
        "zero-shot",
        "--batch-size",
        "1",
        "--max-history",
        "8",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    killed = tmp_path / "killed.jsonl"
    proc = subprocess.Popen(
        cmd + ["--out", str(killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    store = Path(f"{killed}.sqlite")
    deadline = time.time() + 300
    rows = 0
    while time.time() < deadline and proc.poll() is None:
        if store.exists():
            try:
                with sqlite3.connect(store) as db:
                    rows = db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
            except sqlite3.Error:
                rows = 0
            if rows >= 2:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with sqlite3.connect(store) as db:
        partial = db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    assert 2 <= partial < len(users)
    assert not killed.exists()
    # The resume runs in this process (the kill above is what needs a real process).
    resumed_run = run_cli(*cmd[3:], "--out", str(killed), "--resume")
    assert resumed_run.code == 0, resumed_run.stderr
    summary = resumed_run.stdout
    assert "6 pairs: 6 judged" in summary and "0 failed" in summary
    assert f"{partial} from the store" in summary
    with sqlite3.connect(store) as db:
        keys = [k for (k,) in db.execute("SELECT key FROM results")]
    assert len(keys) == len(set(keys)) == len(users)
    resumed = [json.loads(x) for x in killed.read_text().splitlines()]
    cfg = JudgeConfig(mode="zero-shot", batch_size=1, max_history=8)
    reqs = [request_for(ml1m, u, "Toy Story (1995)") for u in users]
    clean = Judge(cfg, llm=smollm).judge_many(reqs)
    assert [r["key"] for r in resumed] == [j.key for j in clean]
    for r, j in zip(resumed, clean, strict=True):
        # Another process may round the last bits differently (thread count, allocation).
        assert r["is_relevant"] == j.is_relevant and r["raw_text"] == j.raw_text
        assert r["p_yes"] == pytest.approx(j.p_yes, abs=1e-4)


@pytest.mark.parametrize("history", ["all", "before"])
def test_requests_for_equals_request_for_pair_by_pair(ml100k, history):
    seen = ml100k.history("1")["item_id"].astype(str).tolist()
    pairs = [("1", "1682"), ("1", seen[3]), ("2", "50"), ("ghost", "1"), ("1", "no-such"),
             ("1", "Toy Story (1995)"), ("1", "1681"), ("1", seen[-1])]  # fmt: skip
    got = requests_for(ml100k, pairs, history=history)
    for (u, i), r in zip(pairs, got, strict=True):
        try:
            want = request_for(ml100k, u, i, history=history)
        except (KeyError, ValueError) as e:
            assert type(r) is type(e) and str(r) == str(e)
            continue
        assert r == want
    assert isinstance(got[3], KeyError) and isinstance(got[4], KeyError)
    # the rows shown, from the raw interactions: under "before", only those earlier in time
    # (a tie: earlier in the file's stable order) than the candidate's interaction
    rows = ml100k.interactions[ml100k.interactions["user_id"].astype(str) == "1"]
    rows = rows.sort_values("timestamp", kind="stable")
    ids, ts = rows["item_id"].astype(str).tolist(), rows["timestamp"].tolist()
    for r, cand in ((got[1], seen[3]), (got[7], seen[-1])):
        pos = ids.index(cand)
        want = [x for n, x in enumerate(ids) if x != cand and (
            history == "all" or ts[n] < ts[pos] or (ts[n] == ts[pos] and n < pos))]  # fmt: skip
        assert [h.item_id for h in r.history] == want
        assert r.candidate_text and all(h.text and h.title for h in r.history)


def test_a_judgment_dict_holds_every_field_but_the_error_and_owns_its_lists():
    j = Judgment("u", "i", "brief", True, ["A"], 0.9, 0.6, 0.2, 3.1, 0.7, "{}",
                 evidence_ids=["a"], key="k")  # fmt: skip
    d = j.to_dict()
    want = asdict(j)
    del want["error"]
    assert d == want and list(d) == list(want)
    d["evidence"].append("B")
    assert j.evidence == ["A"] and Judgment.from_dict(j.to_dict()) == j


def test_requests_and_the_plan_are_built_with_the_collector_paused(ml100k, monkeypatch):
    """``requests_for`` and ``JudgePlan.build`` allocate in bursts with Python's cyclic
    collector off (``gc_paused``: each full collection walks the whole process), and leave
    it as they found it, also when they raise."""
    seen: list[bool] = []
    judge = Judge(JudgeConfig(mode="cf-only"))
    real_key = judge.key
    monkeypatch.setattr(judge, "key", lambda r, *a: seen.append(gc.isenabled()) or real_key(r, *a))
    reqs = [r for r in requests_for(ml100k, [("1", "50"), ("2", "1"), ("ghost", "1")])
            if not isinstance(r, Exception)]  # fmt: skip
    assert gc.isenabled()
    JudgePlan.build(judge, reqs, record=True)
    assert seen == [False, False] and gc.isenabled()
    with pytest.raises(KeyError), gc_paused():
        assert not gc.isenabled()
        raise KeyError("x")
    assert gc.isenabled()
    gc.disable()
    try:  # a caller's own pause is kept
        requests_for(ml100k, [("1", "50")])
        assert not gc.isenabled()
    finally:
        gc.enable()
