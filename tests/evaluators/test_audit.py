"""Judge bias audit: bins, a popularity-biased judge shows as a rising gap, and the command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_in_process import run_cli
from recjudge.data import load_from_files
from recjudge.evaluators.offline._audit import audit, position_audit, quantile_bins


def test_quantile_bins_keep_ties_together_and_cover_every_value():
    v = np.array([1, 1, 1, 1, 2, 3, 4, 5, 6, 100], dtype=float)
    which, ranges = quantile_bins(v, 5)
    assert len(ranges) == len(set(which.tolist())) <= 5
    assert len(set(which[v == 1].tolist())) == 1  # ties in one bin
    assert ranges[0][0] == 1 and ranges[-1][1] == 100
    which, ranges = quantile_bins(np.full(4, 7.0), 3)
    assert ranges == [(7.0, 7.0)] and set(which.tolist()) == {0}


def test_a_popularity_biased_judge_shows_a_rising_gap():
    g = np.random.default_rng(0)
    n = 4000
    pop = g.integers(1, 1000, n).astype(float)
    labels = (g.random(n) < 0.3).astype(int)  # relevance independent of popularity
    p = np.clip(0.1 + 0.8 * pop / 1000, 0, 1)  # the judge's YES grows with popularity
    pairs = [(f"u{i}", f"i{i}") for i in range(n)]
    r = audit(pairs, p, p > 0.5, {"item_popularity": pop}, labels.tolist(), bins=5)
    rows = r["item_popularity"]
    assert len(rows) == 5 and sum(x["pairs"] for x in rows) == n
    gaps = [x["gap"] for x in rows]
    assert gaps == sorted(gaps) and gaps[-1] - gaps[0] > 0.5
    assert all(abs(x["observed_rate"] - 0.3) < 0.06 for x in rows)
    assert rows[0]["yes_rate"] < rows[-1]["yes_rate"]


def test_audit_command_on_an_impute_folder(tmp_path):
    log = "user_id,item_id\n" + "".join(f"u{u},i{i}\n" for u in range(4) for i in range(u + 2))
    (tmp_path / "log.csv").write_text(log)
    (tmp_path / "items.csv").write_text(
        "item_id,title\n" + "".join(f"i{i},{'Long ' * i}Title {i}\n" for i in range(6))
    )
    load_from_files(tmp_path / "log.csv", tmp_path / "items.csv", name="toy").save(tmp_path / "ds")
    folder = tmp_path / "imputed"
    folder.mkdir()
    recs = [{"user_id": f"u{u}", "item_id": f"i{i}", "label": int(i % 2), "p_yes": 0.1 * i}
            for u in range(4) for i in range(6)]  # fmt: skip
    (folder / "imputed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "l.csv").write_text("user_id,item_id,label\nu0,i1,1\nu1,i2,0\n")
    r = run_cli("audit", "--judgments", str(folder), "--data", str(tmp_path / "ds"), "--out",
                str(tmp_path / "a"), "--labels", str(tmp_path / "l.csv"), "--bins", "3",
                "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["pairs"] == 24 and set(got["factors"]) == {
        "item_popularity",
        "history_length",
        "title_length",
    }
    for rows in got["factors"].values():
        assert sum(x["pairs"] for x in rows) == 24
        assert sum(x["labelled"] for x in rows) == 2
    assert (tmp_path / "a/audit.png").stat().st_size > 1000
    assert "## title length" in (tmp_path / "a/report.md").read_text()
    r = run_cli("audit", "--judgments", str(tmp_path), "--data", str(tmp_path / "ds"), "--out",
                str(tmp_path / "b"))  # fmt: skip
    assert r.code == 2 and "imputed.jsonl" in r.stderr and "recjudge impute" in r.stderr


@pytest.mark.parametrize("bins", [2, 10])
def test_every_pair_lands_in_one_bin(bins):
    v = np.random.default_rng(bins).random(100)
    which, ranges = quantile_bins(v, bins)
    assert which.min() == 0 and which.max() == len(ranges) - 1


def _arena_records(judge):
    """Per-order verdict records of 'ref' against s1, s2 for 10 users in both orders, each
    verdict given by ``judge(system_a, system_b, aspect)``."""
    recs = []
    for u in range(10):
        for s in ("s1", "s2"):
            for a, b in (("ref", s), (s, "ref")):
                for aspect in ("accuracy", "overall"):
                    recs.append({"user_id": str(u), "system_a": a, "system_b": b,
                                 "aspect": aspect, "verdict": judge(a, b, aspect)})  # fmt: skip
    return recs


def test_a_judge_that_reads_only_the_position_flips_every_verdict():
    res = position_audit(_arena_records(lambda a, b, aspect: "A wins"))
    for aspect in ("accuracy", "overall"):
        c = res["aspects"][aspect]
        assert c["A wins"] == 1.0 and c["order_flip_rate"] == 1.0 and c["verdicts"] == 40
    assert res["systems"]["s1"] == {"in_A": 10, "in_B": 10, "won_in_A": 1.0, "won_in_B": 0.0}


def test_a_judge_that_reads_the_lists_wins_a_system_in_either_place():
    best = {"s1": 2, "ref": 1, "s2": 0}
    res = position_audit(_arena_records(
        lambda a, b, aspect: "A wins" if best[a] > best[b] else "B wins"))  # fmt: skip
    assert res["aspects"]["overall"]["order_flip_rate"] == 0.0
    assert res["aspects"]["overall"]["A wins"] == 0.5
    assert res["systems"]["s1"]["won_in_A"] == res["systems"]["s1"]["won_in_B"] == 1.0
    assert res["systems"]["s2"]["won_in_A"] == res["systems"]["s2"]["won_in_B"] == 0.0


def test_arena_audit_command_and_its_bad_input(tmp_path):
    run = tmp_path / "arena"
    run.mkdir()
    recs = _arena_records(lambda a, b, aspect: "Tie" if aspect == "accuracy" else "A wins")
    (run / "verdicts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    r = run_cli("audit", "--arena", str(run), "--out", str(tmp_path / "a"), "--json")
    assert r.code == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["aspects"]["accuracy"]["Tie"] == 1.0
    assert (tmp_path / "a/audit.png").stat().st_size > 1000
    assert "order-flip rate" in (tmp_path / "a/report.md").read_text()
    (run / "verdicts.jsonl").write_text(json.dumps(recs[0]) + "\n{not json\n")
    r = run_cli("audit", "--arena", str(run), "--out", str(tmp_path / "b"))
    assert r.code == 2 and "verdicts.jsonl" in r.stderr and "2" in r.stderr
    (run / "verdicts.jsonl").write_text(json.dumps({**recs[0], "verdict": "A"}) + "\n")
    r = run_cli("audit", "--arena", str(run), "--out", str(tmp_path / "c"))
    assert r.code == 2 and "record 1" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("audit", "--arena", str(tmp_path), "--out", str(tmp_path / "d"))
    assert r.code == 2 and "recjudge arena run" in r.stderr
    r = run_cli("audit", "--out", str(tmp_path / "e"))
    assert r.code == 2 and "--arena" in r.stderr
