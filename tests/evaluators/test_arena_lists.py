"""The list-level arena (our extension): list scores, position-free verdicts, Q per scorer."""

from __future__ import annotations

import json
import math

import pytest

from recjudge.evaluators.arena import (
    LIST_SCORERS,
    ArenaListConfig,
    list_records,
    list_score,
    list_scores,
    list_verdict,
    reference_q,
    run_arena_lists,
)


def test_list_score_is_the_discounted_mean():
    w = [1 / math.log2(r + 1) for r in (1, 2, 3)]
    p = [1.0, 0.0, 0.5]
    want = sum(a * b for a, b in zip(w, p, strict=True)) / sum(w)
    assert list_score(p) == pytest.approx(want)
    assert list_score(p, "none") == pytest.approx(0.5)
    # the top of the list weighs more: the same items in another order score differently
    assert list_score([1.0, 0.0]) > list_score([0.0, 1.0])
    # an unjudged item is left out, its weight with it; nothing judged gives None
    assert list_score([None, 1.0, 1.0]) == pytest.approx(1.0)
    assert list_score([None, None]) is None and list_score([]) is None
    with pytest.raises(ValueError, match="unknown discount"):
        list_score([0.5], "exp")


def test_list_verdict_has_no_position_and_a_tie_margin():
    assert list_verdict(0.6, 0.5, 0.05) == "A wins"
    assert list_verdict(0.5, 0.6, 0.05) == "B wins"
    assert list_verdict(0.52, 0.5, 0.05) == "Tie"
    for a, b in ((0.9, 0.1), (0.3, 0.31), (0.2, 0.7)):  # swapping the lists swaps the verdict
        flip = {"A wins": "B wins", "B wins": "A wins", "Tie": "Tie"}
        assert list_verdict(b, a, 0.02) == flip[list_verdict(a, b, 0.02)]


def test_records_give_the_arena_q_per_scorer():
    lists = {"ref": {"u1": ["a", "b"], "u2": ["c"]}, "sys": {"u1": ["b", "a"], "u2": ["d"]}}
    p = {"brief": {("u1", "a"): 0.9, ("u1", "b"): 0.1, ("u2", "c"): 0.2, ("u2", "d"): 0.8}}
    scores = list_scores(lists, p, ["u1", "u2"], "log2")
    assert scores["brief"]["ref"]["u1"] > scores["brief"]["sys"]["u1"]  # a first beats b first
    recs = list_records(scores, "ref", margin=0.01)
    assert [(r["user_id"], r["verdict"]) for r in recs] == [("u1", "B wins"), ("u2", "A wins")]
    q = reference_q(recs, "ref", "brief")["sys"]
    assert (q["win"], q["tie"], q["lose"], q["q"]) == (1, 0, 1, 1.0)
    # a user whose reference list was not scored gives no record
    p["brief"].pop(("u2", "c"))
    assert len(list_records(list_scores(lists, p, ["u1", "u2"], "log2"), "ref", 0.01)) == 1


def test_config_refuses_a_sigma_source_that_is_a_contestant():
    with pytest.raises(ValueError, match=r"CF signal is the evaluated system 'itemknn' \(sigma_"):
        ArenaListConfig(systems=("pop", "itemknn"))
    with pytest.raises(ValueError, match="did you mean"):
        ArenaListConfig(systems=("pop", "als"), reference="alss")
    with pytest.raises(ValueError, match="twice"):
        ArenaListConfig(systems=("pop", "pop"))
    with pytest.raises(KeyError):
        ArenaListConfig(systems=("pop", "als"), sigma_from="itemnn")


@pytest.mark.e2e
def test_end_to_end_one_pass_per_item_and_resume(smollm, tmp_path):
    cfg = ArenaListConfig(
        model="smollm2-135m", systems=("pop", "als"), users=2, k=3, bootstrap=20,
        history_items=10,
    )  # fmt: skip
    r = run_arena_lists(cfg, "ml-100k", tmp_path, llm=smollm, progress=False)
    c = r["cost"]
    assert c["pairs"] <= 2 * 2 * 3 and c["unbuilt"] == 0
    # one decoding pass per distinct (user, item) serves both LLM scorers
    assert c["decoding_passes"] == c["pairs"] and c["llm_requests"] == 2 * c["pairs"]
    assert set(r["summary"]) == set(LIST_SCORERS)
    for scorer, sm in r["summary"].items():
        assert sm["users_scored"] == 2
        assert set(sm["mean_score"]) == {"pop", "als"}
        assert all(0.0 <= m["estimate"] <= 1.0 for m in sm["mean_score"].values())
        q = sm["q"]["als"]
        assert q["win"] + q["tie"] + q["lose"] == 2, scorer
        d = sm["minus_reference"]["als"]
        means = sm["mean_score"]
        assert d["estimate"] == pytest.approx(means["als"]["estimate"] - means["pop"]["estimate"])
    rows = [json.loads(x) for x in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2 * 2  # scorer x system x user
    report = (tmp_path / "report.md").read_text()
    assert "our extension" in report and "sigma from itemknn" in report
    assert "tie margin 0.01" in report and "decoding passes" in report
    assert (tmp_path / "scores.png").stat().st_size > 1000

    again = run_arena_lists(cfg, "ml-100k", tmp_path, llm=smollm, progress=False)
    assert again["summary"] == r["summary"]  # resumed from the store: no decoding
    assert again["cost"]["judged_now"] == again["cost"]["decoding_passes"] == 0
    # another tie margin is decided from the same judgments
    wide = run_arena_lists(
        cfg.model_copy(update={"tie_margin": 0.99}), "ml-100k", tmp_path, llm=smollm,
        progress=False,
    )  # fmt: skip
    assert wide["cost"]["decoding_passes"] == 0
    assert all(sm["q"]["als"]["tie"] == 2 for sm in wide["summary"].values())
