"""Paired intervals over repeats and users (brief-augment's seeds, UserSumBench's runs)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t

import recjudge
from recjudge._stats import (
    arm_interval,
    bootstrap_ci,
    labelled_auc,
    paired_comparisons,
    paired_difference,
    user_draws,
    verdict,
)

METRICS = ("recall@10", "ndcg@10")


def _runs(seeds=3, users=40):
    g = np.random.default_rng(0)
    base = [g.random((users, len(METRICS))) for _ in range(seeds)]
    return {
        "none": base,
        "shifted": [a + 0.05 for a in base],  # the same users, every value 0.05 higher
        "noisy": [a + g.normal(0, 0.2, a.shape) for a in base],
        "brief": [a + 0.01 for a in base],
    }


def test_a_constant_shift_is_estimated_exactly_and_both_intervals_collapse():
    runs = _runs()
    idx = np.random.default_rng(1).integers(0, 40, (200, 40))
    cell = paired_difference(runs, "shifted", "none", METRICS, idx)["recall@10"]
    assert cell["estimate"] == pytest.approx(0.05)
    assert cell["per_repeat"] == pytest.approx([0.05] * 3)
    for k in ("repeats", "users"):
        assert [cell[k]["lo"], cell[k]["hi"]] == pytest.approx([0.05, 0.05])
    assert verdict(cell) == "better"
    same = paired_difference(runs, "none", "none", METRICS, idx)["ndcg@10"]
    assert same["estimate"] == 0 and same["users"] == {"lo": 0.0, "hi": 0.0}
    assert verdict(same) == "no difference shown"


def test_the_seed_interval_is_students_t_over_the_per_seed_differences():
    runs = _runs()
    idx = np.random.default_rng(1).integers(0, 40, (200, 40))
    cell = paired_difference(runs, "noisy", "none", METRICS, idx)["recall@10"]
    d = np.array([(a - b)[:, 0].mean() for a, b in zip(runs["noisy"], runs["none"], strict=True)])
    half = t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert cell["per_repeat"] == pytest.approx(list(d))
    assert cell["repeats"]["lo"] == pytest.approx(d.mean() - half)
    assert cell["repeats"]["hi"] == pytest.approx(d.mean() + half)
    assert cell["users"]["lo"] < cell["estimate"] < cell["users"]["hi"]


def test_differences_are_antisymmetric_and_share_the_user_draws():
    runs = _runs()
    idx = np.random.default_rng(2).integers(0, 40, (300, 40))
    ab = paired_difference(runs, "noisy", "none", METRICS, idx)["ndcg@10"]
    ba = paired_difference(runs, "none", "noisy", METRICS, idx)["ndcg@10"]
    assert ab["estimate"] == pytest.approx(-ba["estimate"])
    assert ab["users"]["lo"] == pytest.approx(-ba["users"]["hi"])
    assert ab["repeats"]["hi"] == pytest.approx(-ba["repeats"]["lo"])


def test_balanced_differences_do_not_exclude_zero():
    # Per user exactly +1 or -1 in equal numbers: the mean difference is 0.
    users = 50
    d = np.where(np.arange(users) % 2 == 0, 1.0, -1.0)[:, None].repeat(2, axis=1)
    base = [np.zeros((users, 2)) for _ in range(3)]
    runs = {"none": base, "x": [b + d for b in base]}
    out = paired_comparisons(runs, METRICS, draws=500, seed=0)
    cell = out["minus_none"]["x"]["recall@10"]
    assert cell["estimate"] == 0
    assert cell["users"]["lo"] < 0 < cell["users"]["hi"]
    assert verdict(cell) == "no difference shown"


def test_comparisons_cover_every_method_against_none_and_brief_against_the_rest():
    out = paired_comparisons(_runs(), METRICS, draws=100, seed=0)
    assert set(out["minus_none"]) == {"shifted", "noisy", "brief"}
    assert set(out["brief_minus"]) == {"shifted", "noisy"}
    assert out["brief_minus"]["shifted"]["recall@10"]["estimate"] == pytest.approx(-0.04)
    assert verdict(out["brief_minus"]["shifted"]["recall@10"]) == "worse"
    assert paired_comparisons({"none": _runs()["none"]}, METRICS, 100)["brief_minus"] == {}


def test_mismatched_users_or_seeds_are_refused():
    runs = _runs()
    with pytest.raises(ValueError, match="same users"):
        paired_comparisons({**runs, "x": [a[:-1] for a in runs["none"]]}, METRICS, 100)
    with pytest.raises(ValueError, match="repeats"):
        paired_difference({**runs, "x": runs["none"][:2]}, "x", "none", METRICS,
                          np.zeros((10, 40), dtype=int))  # fmt: skip


def test_an_arms_own_interval_is_its_mean_with_both_intervals_around_it():
    runs = _runs()
    idx = user_draws(40, 300, 0)
    cell = arm_interval(runs, "noisy", METRICS, idx)["ndcg@10"]
    per_repeat = [a[:, 1].mean() for a in runs["noisy"]]
    assert cell["per_repeat"] == pytest.approx(per_repeat)
    assert cell["estimate"] == pytest.approx(np.mean(per_repeat))
    assert cell["users"]["lo"] < cell["estimate"] < cell["users"]["hi"]
    assert cell["repeats"]["lo"] < cell["estimate"] < cell["repeats"]["hi"]
    # An arm minus a zero arm is the arm itself, on the same draws.
    zero = {"zero": [np.zeros_like(a) for a in runs["noisy"]], "noisy": runs["noisy"]}
    diff = paired_difference(zero, "noisy", "zero", METRICS, idx)["ndcg@10"]
    assert diff["estimate"] == pytest.approx(cell["estimate"])
    for k in ("repeats", "users"):
        assert [diff[k]["lo"], diff[k]["hi"]] == pytest.approx([cell[k]["lo"], cell[k]["hi"]])


def test_user_draws_are_reproducible_and_in_range():
    a, b = user_draws(7, 50, 3), user_draws(7, 50, 3)
    assert a.shape == (50, 7) and (a == b).all()
    assert a.min() >= 0 and a.max() < 7


def test_bootstrap_ci_percentile_and_basic_intervals():
    draws = np.arange(1001, dtype=float)  # percentiles 25 and 975 exactly
    assert bootstrap_ci(draws) == (25.0, 975.0)
    # basic: 2 * point - q_hi, 2 * point - q_lo (reflected around the estimate)
    assert bootstrap_ci(draws, point=100.0) == (-775.0, 175.0)
    lo, hi = bootstrap_ci(np.stack([draws, -draws], axis=1))  # one interval per column
    assert lo.tolist() == [25.0, -975.0] and hi.tolist() == [975.0, -25.0]
    assert bootstrap_ci([]) == (None, None)


def test_labelled_auc_counts_ordered_pairs_with_ties_as_half():
    scores = [0.9, 0.4, 0.4, 0.1, 0.4]
    labels = [1, 1, 0, 0, 0]
    # positives 0.9 and 0.4 against negatives 0.4, 0.1, 0.4: 3 + (0.5 + 1 + 0.5) of 6 pairs
    assert labelled_auc(scores, labels) == pytest.approx(5 / 6)
    g = np.random.default_rng(1)
    s, y = g.random(200), g.integers(0, 2, 200)
    direct = np.mean([(a > b) + 0.5 * (a == b) for a in s[y == 1] for b in s[y == 0]])
    assert labelled_auc(s, y) == pytest.approx(direct, abs=1e-12)
    assert labelled_auc([0.2, 0.3], [1, 1]) is None  # one class: no AUC


def test_no_module_computes_its_own_bootstrap_percentiles():
    """One rule for intervals from draws: only ``_stats.bootstrap_ci`` calls the 2.5/97.5
    percentiles (a second copy is how two reports came to use different intervals)."""
    src = Path(recjudge.__file__).parent
    rule = re.compile(r"percentile\([^)]*(2\.5|97\.5)")
    offenders = [
        str(f.relative_to(src))
        for f in src.rglob("*.py")
        if f.name != "_stats.py" and rule.search(f.read_text(encoding="utf-8"))
    ]
    assert offenders == []
