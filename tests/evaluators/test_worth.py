"""What the judge is worth on the team's data (``_worth``): PPI's interval against the same
design's labels-only one, DR's against SNIPS's, in every evaluation with the estimators."""

from __future__ import annotations

import numpy as np
import pytest

from recjudge.evaluators import GoldSample, RecRun, RunCheck, sample_gold
from recjudge.evaluators.offline._evaluation import estimate_evaluation
from recjudge.evaluators.offline._jobs import estimator_lines
from recjudge.evaluators.offline._propensities import Propensities
from recjudge.evaluators.offline._worth import judge_worth, worth_lines


def _est(value, lo, hi):
    return {"value": value, "ci": [lo, hi]}


def test_the_ratios_are_the_interval_widths_and_the_label_equivalent_scales_as_their_square():
    systems = {
        "a": {
            "precision@10": {
                "ppi": _est(0.3, 0.25, 0.35),
                "dr": _est(0.3, 0.2, 0.38),
                "snips": _est(0.31, 0.2, 0.4),
            }
        },
        "b": {"precision@10": {"ppi": _est(None, None, None), "snips": _est(0.1, 0, 0.2)}},
    }
    labels = {"a": {"precision@10": _est(0.32, 0.22, 0.42)},
              "b": {"precision@10": _est(0.1, 0.0, 0.3)}}  # fmt: skip
    got = judge_worth(systems, labels, {"a": {"precision@10": 120}, "b": {"precision@10": 80}})
    a = got["a"]["precision@10"]
    assert a["ppi_over_labels"] == pytest.approx(0.5)  # 0.10 wide against 0.20
    assert a["label_equivalent"] == pytest.approx(480)  # 120 / 0.5^2
    assert a["dr_over_snips"] == pytest.approx(0.9)  # 0.18 against 0.20
    assert "b" not in got  # PPI undefined, no DR: nothing to compare
    assert judge_worth(systems, {}, {})["a"]["precision@10"]["ppi_over_labels"] is None
    lines = worth_lines(got)
    assert "## What the judge is worth here" in lines[1]
    assert lines[-1] == "| a | precision@10 | 0.50x (-50 %) | 480 (has 120) | 0.90x (-10 %) |"
    assert worth_lines({}) == []


def _world(seed: int, judge: str, users: int = 300, k: int = 10, items: int = 200):
    """Relevance that clusters by user; every listed pair logged with propensity 0.3; a
    judge that knows the truth (``oracle``) or guesses (``noise``: uniform on [0, 0.4],
    right on average, blind per pair)."""
    g, guess = np.random.default_rng(seed), np.random.default_rng(seed + 1000)
    taste, quality = g.normal(0, 1, users), g.normal(0, 1, items)
    lists, rel, judged, logged = {}, {}, {}, {}
    for u in range(users):
        top = [str(i) for i in g.choice(items, k, replace=False)]
        lists[str(u)] = top
        for i in top:
            z = -1.5 + taste[u] + 0.8 * quality[int(i)]
            y = int(g.random() < 1 / (1 + np.exp(-z)))
            rel[(str(u), i)] = y
            p = float(y) if judge == "oracle" else 0.4 * float(guess.random())
            judged[(str(u), i)] = (p, False)
            if g.random() < 0.3:
                logged.setdefault(str(u), {})[i] = y
    run = RecRun("sys", "sys.jsonl", lists, {}, RunCheck())
    return run, sorted(lists), rel, judged, logged


def _evaluate(judge: str, seed: int = 0):
    run, users, rel, judged, logged = _world(seed, judge)
    rows = sample_gold([run], users, 10, 300, design="uniform", seed=seed)
    keys = [(r["user_id"], r["item_id"]) for r in rows]
    gold = GoldSample({key: rel[key] for key in keys},
                      {key: float(r["inclusion_prob"]) for key, r in zip(keys, rows, strict=True)},
                      design="uniform")  # fmt: skip
    props = Propensities("uniform", "", {}, default=0.3)
    return estimate_evaluation([run], logged, judged, props, users, ["precision@10"],
                               ["snips", "dr"], calibrated=True, gold=gold)  # fmt: skip


def test_a_judge_that_knows_the_labels_narrows_both_and_a_guessing_one_neither():
    oracle = _evaluate("oracle")["judge_worth"]["sys"]["precision@10"]
    noise = _evaluate("noise")["judge_worth"]["sys"]["precision@10"]
    # the oracle's residuals are 0: only the predictions' own mean is left to estimate
    assert oracle["ppi_over_labels"] < 0.5 and oracle["label_equivalent"] > 4 * 300
    # DR with the truth as imputer keeps only the users' sampling variance (the bench's
    # 0.70-0.74x floor); a guessing imputer's residuals are as variable as the labels
    assert oracle["dr_over_snips"] < 0.9 < noise["dr_over_snips"]
    # a guess carries nothing: power-tuned lambda gives it (almost) no weight
    assert 0.9 < noise["ppi_over_labels"] < 1.1
    assert noise["gold_pairs"] == oracle["gold_pairs"] == 300


def test_the_labels_only_yardstick_does_not_read_the_judge():
    a, b = _evaluate("oracle", 3), _evaluate("noise", 3)
    # same world and gold (same seed), two judges: the labels-only estimate is one
    la, lb = (r["judge_worth"]["sys"]["precision@10"]["labels_only"] for r in (a, b))
    assert la["value"] == pytest.approx(lb["value"]) and la["ci"] == pytest.approx(lb["ci"])
    for r, lab in ((a, la), (b, lb)):  # and each ratio is PPI's width over that interval's
        lo, hi = r["systems"]["sys"]["precision@10"]["ppi"]["ci"]
        ratio = r["judge_worth"]["sys"]["precision@10"]["ppi_over_labels"]
        assert ratio == pytest.approx((hi - lo) / (lab["ci"][1] - lab["ci"][0]))
    assert any("What the judge is worth here" in line for line in estimator_lines(a))


def test_a_user_whose_gold_pairs_are_0_with_predictions_0_still_counts_as_a_labelled_user():
    """The t's degrees of freedom count every user holding a gold pair; before, a user with
    only 0 labels that the judge also put at exactly 0 (hard labels, an isotonic map's lowest
    level) dropped out of the count (50 of 191 users here: a needlessly wide interval)."""
    res = _evaluate("oracle", 3)
    holders = res["systems"]["sys"]["precision@10"]["ppi"]["note"]
    assert "300 gold pairs of 191 users" in holders and "t(190)" in holders
