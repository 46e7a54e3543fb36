"""``gold sample --design active`` (issue 89, item 5): inclusion probabilities from the
judge's uncertainty, recorded so the estimators weight them, and unbiased weights."""

from __future__ import annotations

import numpy as np
import pytest

from recjudge.evaluators import RecRun, RunCheck, listed_pairs, sample_gold
from recjudge.evaluators.offline._gold import active_inclusion


def test_active_inclusion_sums_to_n_and_favours_uncertain_pairs():
    p = np.array([0.5] * 50 + [0.99] * 50 + [0.0] * 10)
    pi = active_inclusion(p, 40)
    assert pi.sum() == pytest.approx(40)
    assert pi[0] > pi[60] > 0 and pi[100] > 0  # confident pairs still drawn (floor)
    assert np.all(pi <= 1)
    capped = active_inclusion(p, 105)  # more than the uncertain pairs can take
    assert capped.sum() == pytest.approx(105) and capped.max() == 1.0


def test_active_design_weights_are_unbiased_for_the_frame_total():
    g = np.random.default_rng(0)
    lists = {f"u{u}": [f"i{(u * 7 + r) % 90}" for r in range(6)] for u in range(40)}
    run = RecRun("a", "", lists, {}, RunCheck())
    users = sorted(lists)
    frame = listed_pairs([run], users, 6)
    judged = {pair: (float(g.beta(2, 2)), False) for pair in frame}
    y = {pair: int(g.random() < judged[pair][0]) for pair in frame}
    truth = sum(y.values())
    totals = []
    for seed in range(400):
        rows = sample_gold([run], users, 6, 60, design="active", seed=seed, judged=judged)
        totals.append(sum(y[(r["user_id"], r["item_id"])] / r["inclusion_prob"] for r in rows))
    se = np.std(totals) / np.sqrt(len(totals))
    assert abs(np.mean(totals) - truth) < 4 * se
    assert 40 < np.mean([len(sample_gold([run], users, 6, 60, design="active", seed=s,
                                         judged=judged)) for s in range(20)]) < 80  # fmt: skip


def test_active_design_needs_the_judges_probabilities():
    run = RecRun("a", "", {"u": ["i", "j"]}, {}, RunCheck())
    with pytest.raises(ValueError, match="active design needs the judge's probabilities"):
        sample_gold([run], ["u"], 2, 2, design="active")


def test_a_judge_certain_of_everything_gives_the_uniform_design():
    pi = active_inclusion([1.0] * 20 + [0.0] * 20, 10)
    assert pi == pytest.approx(np.full(40, 0.25))
