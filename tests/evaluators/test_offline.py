"""Runs and qrels in other libraries' formats, the impute/evaluate/augment rules, and the
metrics cross-checked against an independent implementation."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from recjudge.data import DataError, Dataset, leave_one_out
from recjudge.evaluators import (
    AugmentConfig,
    EvaluateConfig,
    ImputeConfig,
    RecRun,
    RunCheck,
    augmented_interactions,
    evaluate_runs,
    evaluation_users,
    logged_qrels,
    pairs_to_impute,
    read_qrels,
    read_run,
    restrict_to,
    select_positives,
    write_qrels,
)
from recjudge.evaluators.offline._evaluate import report_lines
from recjudge.reward import Judgment

RANKS = {"u1": ["a", "b", "c"], "u2": ["c", "a"]}


def _write_all_formats(tmp_path):
    rows = [(u, i, r + 1) for u, items in RANKS.items() for r, i in enumerate(items)]
    trec = "".join(f"{u} Q0 {i} {r} {10 - r} sys\n" for u, i, r in rows)
    (tmp_path / "run.trec").write_text(trec)
    ranx = {u: {i: 10.0 - r for uu, i, r in rows if uu == u} for u in RANKS}
    (tmp_path / "run.json").write_text(json.dumps(ranx))
    (tmp_path / "run.jsonl").write_text(
        "".join(json.dumps({"user_id": u, "rank": r, "item_id": i}) + "\n" for u, i, r in rows)
    )
    pd.DataFrame(rows, columns=["user_id", "item_id", "rank"]).assign(
        score=lambda d: 10.0 - d["rank"]
    ).drop(columns="rank").to_parquet(tmp_path / "run.parquet")
    return ["run.trec", "run.json", "run.jsonl", "run.parquet"]


def test_every_run_format_reads_to_the_same_rankings(tmp_path):
    for name in _write_all_formats(tmp_path):
        run = read_run(tmp_path / name)
        assert run.rankings == RANKS, name
        assert run.check.duplicates == run.check.ties == 0


def test_ties_keep_file_order_and_duplicates_keep_the_best_entry(tmp_path):
    p = tmp_path / "r.jsonl"
    recs = [("u", "x", 1.0), ("u", "y", 2.0), ("u", "z", 1.0), ("u", "x", 0.5)]
    p.write_text("".join(json.dumps({"user_id": u, "item_id": i, "score": s}) + "\n"
                         for u, i, s in recs))  # fmt: skip
    run = read_run(p)
    assert run.rankings["u"] == ["y", "x", "z"]
    assert (run.check.ties, run.check.duplicates) == (1, 1)
    assert "1 duplicates" in run.check.problems() and "'x'" in run.check.problems()


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [("bad.trec", "u Q0 a 1 0.5\n", "row 1"),  # 5 fields
     ("bad2.trec", "u Q0 a 1 0.5 s\nu Q0 b 2 high s\n", "row 2"),
     ("bad.jsonl", '{"user_id": "u", "item_id": "a", "score": 1}\n[1, 2]\n', "row 2"),
     ("bad2.jsonl", '{"user_id": "u", "item_id": "a"}\n', "row 1"),
     ("nan.jsonl", '{"user_id": "u", "item_id": "a", "score": NaN}\n', "row 1"),
     ("empty.trec", "\n", "holds no ranking"),
     ("bad.json", '{"u": [1, 2]}', "ranx run")],
)  # fmt: skip
def test_bad_run_files_name_the_file_and_line(tmp_path, name, text, where):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError) as e:
        read_run(tmp_path / name)
    assert name in str(e.value) and where in str(e.value) and "Fix:" in str(e.value)


def _toy_dataset() -> Dataset:
    inter = pd.DataFrame({
        "user_id": ["u1"] * 5 + ["u2"] * 4,
        "item_id": ["a", "b", "c", "d", "e", "a", "b", "c", "d"],
        "timestamp": [1.0, 2, 3, 4, 5, 1, 2, 3, 4],
        "rating": [5.0, 4, 3, 5, 1, 4, 4, 2, 5],
    })  # fmt: skip
    inter["event_type"] = pd.Categorical(
        np.where(inter["rating"] >= 4, "explicit_positive", "explicit_negative"),
        categories=["explicit_positive", "implicit_positive", "implicit_negative",
                    "explicit_negative"],
    )  # fmt: skip
    items = pd.DataFrame({"item_id": list("abcdefgh"), "title": [f"T{c}" for c in "abcdefgh"]})
    return Dataset("toy", inter, items)


def test_restrict_to_counts_unknown_users_items_and_short_lists(tmp_path):
    p = tmp_path / "r.jsonl"
    recs = [("u1", "f", 3), ("u1", "zzz", 2), ("u1", "g", 1), ("ghost", "a", 1)]
    p.write_text("".join(json.dumps({"user_id": u, "item_id": i, "score": s}) + "\n"
                         for u, i, s in recs))  # fmt: skip
    run = restrict_to(read_run(p), _toy_dataset(), k=3)
    assert run.rankings == {"u1": ["f", "g"]}
    c = run.check
    assert (c.unknown_users, c.unknown_items, c.short_lists) == (1, 1, 1)
    with pytest.raises(DataError, match="--data"):
        p.write_text('{"user_id": "ghost", "item_id": "a", "score": 1}\n')
        restrict_to(read_run(p), _toy_dataset(), k=3)


def _run(name, rankings):
    return RecRun(name, name, rankings, {u: [0.0] * len(v) for u, v in rankings.items()},
                  RunCheck())  # fmt: skip


def test_logged_qrels_and_pairs_to_impute():
    fb = _toy_dataset()
    q = logged_qrels(fb)
    assert q["u1"] == {"a": 1, "b": 1, "c": 0, "d": 1, "e": 0}
    assert logged_qrels(fb, min_rating=5)["u1"]["b"] == 0
    runs = [_run("r1", {"u1": ["a", "x", "y"], "u3": ["x"]}),
            _run("r2", {"u1": ["y", "c", "z"], "u2": ["q"]})]  # fmt: skip
    # every listed user (chosen without looking at labels), or the old rule's: u3 has no
    # logged positive
    assert sorted(evaluation_users(runs, q)) == ["u1", "u2", "u3"]
    assert sorted(evaluation_users(runs, q, rule="logged-positive")) == ["u1", "u2"]
    pairs = pairs_to_impute(runs, q, ["u1", "u2"], k=3)
    # each unlabelled pair once (y is in both runs), logged a and c are not judged again
    assert pairs == [("u1", "x"), ("u1", "y"), ("u1", "z"), ("u2", "q")]
    assert pairs_to_impute(runs, q, ["u1"], k=1) == [("u1", "y")]


def _ndcg(ranking, rel, k):
    """Independent nDCG@k (Jarvelin & Kekalainen): binary gains, log2(rank + 1) discounts."""
    gains = [1.0 if rel.get(i, 0) > 0 else 0.0 for i in ranking[:k]]
    dcg = sum(g / math.log2(r + 2) for r, g in enumerate(gains))
    ideal = sum(1 / math.log2(r + 2) for r in range(min(k, sum(v > 0 for v in rel.values()))))
    return dcg / ideal if ideal else 0.0


def test_evaluate_matches_an_independent_ndcg_and_precision_and_tau():
    rng = np.random.default_rng(0)
    items = [f"i{n}" for n in range(30)]
    users = [f"u{n}" for n in range(25)]
    logged = {u: {i: int(rng.random() < 0.3) for i in rng.choice(items, 8, replace=False)}
              for u in users}  # fmt: skip
    for u in users:
        logged[u][items[0]] = 1  # every user has a positive
    imputed = {u: {**d, **{i: 1 for i in rng.choice(items, 4)}} for u, d in logged.items()}
    runs = [_run(f"s{n}", {u: list(rng.permutation(items)[:10]) for u in users})
            for n in range(3)]  # fmt: skip
    cfg = EvaluateConfig(metrics=("ndcg@5", "precision@5"), k=10)
    res = evaluate_runs({"logged": logged, "imputed": imputed}, runs, users, cfg)
    for kind, q in (("logged", logged), ("imputed", imputed)):
        for r in runs:
            want = np.mean([_ndcg(r.rankings[u], q[u], 5) for u in users])
            assert res["scores"][kind][r.name]["ndcg@5"] == pytest.approx(want, abs=1e-9)
            prec = np.mean([sum(q[u].get(i, 0) > 0 for i in r.rankings[u][:5]) / 5
                            for u in users])  # fmt: skip
            assert res["scores"][kind][r.name]["precision@5"] == pytest.approx(prec)
    from scipy.stats import kendalltau

    s = res["scores"]
    tau = kendalltau([s["logged"][r.name]["ndcg@5"] for r in runs],
                     [s["imputed"][r.name]["ndcg@5"] for r in runs]).statistic  # fmt: skip
    assert res["kendall_tau"]["ndcg@5"] == pytest.approx(tau)
    assert set(res["tests"]["logged"]["ndcg@5"]) == {"s0 vs s1", "s0 vs s2", "s1 vs s2"}


def test_a_user_missing_from_a_run_scores_zero_not_dropped():
    q = {"u1": {"a": 1}, "u2": {"b": 1}}
    runs = [_run("full", {"u1": ["a"], "u2": ["b"]}), _run("half", {"u1": ["a"]})]
    res = evaluate_runs({"logged": q}, runs, ["u1", "u2"], EvaluateConfig(metrics=("ndcg@5",)))
    assert res["scores"]["logged"]["full"]["ndcg@5"] == pytest.approx(1.0)
    assert res["scores"]["logged"]["half"]["ndcg@5"] == pytest.approx(0.5)


def test_qrels_round_trip_in_trec_and_ranx_json(tmp_path):
    q = {"u1": {"a": 1, "b": 0}, "u 2": {"c": 1}} | {"u3": {}}
    q.pop("u 2")  # TREC fields are whitespace-separated: ids have no spaces
    paths = write_qrels(q, tmp_path / "q")
    for p in paths:
        back = read_qrels(p)
        assert {u: d for u, d in back.items() if d} == {u: d for u, d in q.items() if d}
    (tmp_path / "bad.trec").write_text("u1 0 a 1\nu1 0 b yes\n")
    with pytest.raises(DataError, match="row 2"):
        read_qrels(tmp_path / "bad.trec")


@dataclass
class _J:
    user_id: str
    candidate_id: str
    is_relevant: bool
    p_yes: float
    error: str | None = None

    @property
    def log_odds(self) -> float:
        return math.log(self.p_yes / (1 - self.p_yes)) if 0 < self.p_yes < 1 else self.p_yes


def test_select_positives_takes_top_m_yes_and_never_a_no():
    js = [_J("u", "a", True, 0.6), _J("u", "b", False, 0.9), _J("u", "c", True, 0.8),
          _J("u", "d", True, 0.7), _J("v", "e", False, 0.4), _J("w", "f", True, float("nan"),
          error="boom")]  # fmt: skip
    chosen = select_positives(js, top_m=2)
    assert [j.candidate_id for j in chosen["u"]] == ["c", "d"]
    assert "v" not in chosen and "w" not in chosen


def test_select_positives_orders_saturated_p_yes_by_log_odds():
    """A strong bias rounds p_yes to exactly 1.0 for several candidates; the judge's log-odds
    (semantic logit + 2 delta), not the candidate order, must pick among them."""

    def j(cand: str, p_sem: float, delta: float) -> Judgment:
        p_no = 1.0 / (1.0 + math.exp(math.log(p_sem / (1 - p_sem)) + 2 * delta))
        return Judgment("u", cand, "brief", True, ["t"], 1.0 - p_no, p_sem, 0.5, delta, 0.3, "")

    js = [j("a", 0.30, 25.0), j("b", 0.60, 30.0), j("c", 0.90, 28.0), j("d", 0.5, 0.4)]
    assert [x.p_yes for x in js[:3]] == [1.0, 1.0, 1.0]  # saturated: p_yes cannot order them
    assert js[1].log_odds > js[2].log_odds > js[0].log_odds > js[3].log_odds
    chosen = select_positives(js, top_m=2)
    assert [x.candidate_id for x in chosen["u"]] == ["b", "c"]
    # Unsaturated p_yes still decides first, and the log-odds agrees with it.
    lo = Judgment("u", "e", "zero-shot", True, [], 0.7, 0.7, None, 0.0, 0.9, "")
    assert lo.log_odds == pytest.approx(math.log(0.7 / 0.3))
    cf = Judgment("u", "f", "cf-only", True, [], 0.8, None, 0.6, 0.0, 0.0, "")
    assert cf.log_odds == pytest.approx(math.log(0.8 / 0.2))


def test_pseudo_positives_train_but_are_never_held_out():
    ds = _toy_dataset()
    chosen = {"u1": [_J("u1", "f", True, 0.9)], "u2": [_J("u2", "g", True, 0.8)]}
    inter = augmented_interactions(ds, chosen)
    assert len(inter) == len(ds.interactions) + 2
    assert inter["source"].value_counts().to_dict() == {"logged": 9, "judge": 2}
    split = leave_one_out(inter)
    assert set(split.test["source"]) == set(split.valid["source"]) == {"logged"}
    assert set(split.test["item_id"]) == {"e", "d"}  # the last logged items, as before
    assert {"f", "g"} <= set(split.train["item_id"])


@pytest.mark.parametrize(
    "config",
    [ImputeConfig(k=5, users=10, min_rating=4.0), EvaluateConfig(metrics=("ndcg@3",)),
     AugmentConfig(k=4, top_m=1)],
)  # fmt: skip
def test_configs_round_trip(config):
    assert type(config).model_validate_json(config.model_dump_json()) == config
    with pytest.raises(ValueError):
        type(config)(**{**config.model_dump(), "k": 0})


def test_rank_intervals_separate_a_clear_winner_and_not_a_tie():
    """Issue 89, item 6: ``best`` only where the rank interval is [1, 1]; Kendall's tau with
    its interval."""
    rng = np.random.default_rng(1)
    users = [f"u{n}" for n in range(60)]
    items = [f"i{n}" for n in range(40)]
    rel = {u: {i: int(n < 5) for n, i in enumerate(rng.permutation(items))} for u in users}
    good = {u: [i for i, r in rel[u].items() if r] + [i for i, r in rel[u].items() if not r]
            for u in users}  # fmt: skip
    tie_a = {u: list(rng.permutation(items)) for u in users}
    tie_b = {u: list(rng.permutation(items)) for u in users}
    runs = [_run("good", good), _run("a", tie_a), _run("b", tie_b)]
    cfg = EvaluateConfig(metrics=("precision@5",), k=10)
    res = evaluate_runs({"logged": rel, "imputed": rel}, runs, users, cfg)
    ranks = res["ranks"]["logged"]
    assert ranks["good"]["precision@5"] == {"rank": 1, "rank_ci": [1, 1]}
    assert ranks["a"]["precision@5"]["rank_ci"] == [2, 3] == ranks["b"]["precision@5"]["rank_ci"]
    lo, hi = res["kendall_tau_ci"]["precision@5"]
    assert lo <= res["kendall_tau"]["precision@5"] <= hi
    text = "\n".join(report_lines(res, []))
    assert "good 1 [1, 1]" in text and "Kendall's tau" in text
