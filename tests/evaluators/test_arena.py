"""RecSys Arena: aggregate arithmetic, the order-swap rule, Bradley-Terry, and a real run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from recjudge.evaluators import (
    ArenaConfig,
    bradley_terry,
    combine_orders,
    ndcg_at,
    pair_counts,
    q_score,
    run_arena,
    summarize,
    system_q,
    urd,
)


def rec(a, b, v, aspect="overall", u="1"):
    return {"user_id": u, "system_a": a, "system_b": b, "aspect": aspect, "verdict": v}


def test_q_arithmetic():
    assert q_score(6, 2, 2) == pytest.approx(8 / 4)
    assert q_score(0, 0, 3) == 0.0
    assert q_score(2, 0, 0) == float("inf")
    recs = [
        rec("x", "y", "A wins"),
        rec("x", "y", "A wins"),
        rec("y", "x", "A wins"),
        rec("x", "y", "Tie"),
    ]
    c = pair_counts(recs)[("x", "y")]
    assert (c["win"], c["tie"], c["lose"]) == (2, 1, 1)
    assert c["q"] == pytest.approx(3 / 2)
    assert c["win_pct"] == pytest.approx(50.0)
    q = system_q(recs)
    assert q["x"] == pytest.approx(3 / 2) and q["y"] == pytest.approx(2 / 3)


def test_order_swap_rule():
    # (A,B) says A; the swapped (B,A) says B, i.e. the original A again: consistent.
    assert combine_orders("A wins", "B wins") == ["A wins"]
    # both orders prefer whatever is in position A: position bias -> tie
    assert combine_orders("A wins", "A wins") == ["Tie"]
    assert combine_orders("Tie", "Tie") == ["Tie"]
    assert combine_orders("A wins", "A wins", "keep") == ["A wins", "B wins"]


def test_bradley_terry_recovers_known_strengths():
    truth = {"pop": -1.0, "itemknn": 0.0, "als": 0.5, "sasrec": 1.2}
    g = np.random.default_rng(0)
    names = list(truth)
    recs = []
    for _ in range(6000):
        a, b = g.choice(names, 2, replace=False)
        p = 1 / (1 + np.exp(truth[b] - truth[a]))
        recs.append(rec(a, b, "A wins" if g.random() < p else "B wins"))
    est = bradley_terry(recs)
    centred = {k: v - np.mean(list(truth.values())) for k, v in truth.items()}
    for k in names:
        assert est[k] == pytest.approx(centred[k], abs=0.1)
    s = summarize(recs, {"pop": 0.7, "itemknn": 0.8, "als": 0.85, "sasrec": 0.9}, bootstrap=50)
    lo, hi = s["bradley_terry"]["sasrec"]["ci95"]
    assert lo < est["sasrec"] < hi
    assert s["corr_bt_auc"]["spearman"] == pytest.approx(1.0)


def test_summarize_rejects_bad_records():
    with pytest.raises(ValueError, match="record 1: missing"):
        summarize([{"user_id": "1"}])
    with pytest.raises(ValueError, match="not one of"):
        summarize([rec("x", "y", "A")])


def test_offline_metric_oracles():
    assert ndcg_at(["a", "b", "c"], {"b"}, 5) == pytest.approx(1 / np.log2(3))
    assert ndcg_at(["a", "b"], {"z"}, 5) == 0.0
    same = lambda a, b: 1.0  # noqa: E731
    assert urd(["a", "b", "c"], same) == 0.0


def test_summarize_cli_on_records(tmp_path):
    path = tmp_path / "v.jsonl"
    path.write_text(
        "".join(json.dumps(rec("x", "y", v)) + "\n" for v in ["A wins", "A wins", "Tie", "B wins"])
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "recjudge.cli._main",
            "arena",
            "summarize",
            "--verdicts",
            str(path),
            "--json",
            "--bootstrap",
            "10",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    s = json.loads(out)
    c = s["pairs"]["overall"]["x vs y"]
    assert (c["win"], c["tie"], c["lose"], c["q"]) == (2, 1, 1, 1.5)


def test_arena_end_to_end_one_user(smollm, tmp_path):
    cfg = ArenaConfig(
        model="smollm2-135m",
        systems=("pop", "itemknn"),
        users=1,
        analysis_chars=40,
        history_items=8,
        bootstrap=20,
    )
    r = run_arena(cfg, "ml-100k", tmp_path, llm=smollm, progress=False)
    lines = (tmp_path / "verdicts.jsonl").read_text().splitlines()
    assert len(lines) == 7  # 1 user x 1 pair x (6 aspects + overall), swap rule "tie"
    for x in map(json.loads, lines):
        assert x["verdict"] in ("A wins", "B wins", "Tie")
    pair = r["pairs"]["overall"]["itemknn vs pop"]
    assert pair["win"] + pair["tie"] + pair["lose"] == 1
    assert set(r["absolute_score"]) == {"pop", "itemknn"}
    assert all(0 <= v <= 1 for v in r["absolute_score"].values())
    assert (tmp_path / "winrates.png").stat().st_size > 1000
    assert "Bradley-Terry" in (tmp_path / "report.md").read_text()
    assert 0.0 <= r["offline"]["pop"]["auc"] <= 1.0
    again = run_arena(cfg, "ml-100k", tmp_path, llm=smollm, progress=False)  # resumes: no work
    assert again["pairs"] == r["pairs"]


def test_embedding_similarity_is_cosine():
    from recjudge.evaluators._arena import embedding_similarity

    class M:
        item_index = {"a": 0, "b": 1, "c": 2}

        def item_embeddings(self):
            return np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]])

    sim = embedding_similarity(M())
    assert sim("a", "b") == pytest.approx(1.0) and sim("a", "c") == pytest.approx(0.0)
    assert urd(["a", "b", "c"], sim) == pytest.approx(1 - 1 / 3)
    assert sim("a", "zzz") == 0.0


def test_order_flip_rate_counts_each_pair_once_under_both_swap_rules():
    from recjudge.evaluators import ASPECTS, order_flip_rate, pair_records

    def both(v):
        return {a: v for a in (*ASPECTS, "overall")}

    # (x, y): A wins, and from the swapped side B wins = the same verdict (no flip);
    # (x, z): A wins both times from each side's A = a flip.
    judged = [("x", "y", "A wins", "B wins"), ("x", "z", "A wins", "A wins")]
    for rule in ("tie", "keep"):
        records = [r for a, b, v_ab, v_ba in judged
                   for r in pair_records("u1", a, b, both(v_ab), both(v_ba), rule)]  # fmt: skip
        overall = [r for r in records if r["aspect"] == "overall"]
        assert len(overall) == (2 if rule == "tie" else 4)
        assert all("order_flip" in r for r in overall)
        assert order_flip_rate(records) == 0.5, rule
