"""brief-augment's paired intervals over seeds and users."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import t

from recjudge.bench._augment_stats import augment_comparisons, paired_difference, verdict

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
    assert cell["per_seed"] == pytest.approx([0.05] * 3)
    assert cell["seeds"]["lo"] == pytest.approx(0.05) and cell["seeds"]["hi"] == pytest.approx(0.05)
    assert cell["users"]["lo"] == pytest.approx(0.05) and cell["users"]["hi"] == pytest.approx(0.05)
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
    assert cell["per_seed"] == pytest.approx(list(d))
    assert cell["seeds"]["lo"] == pytest.approx(d.mean() - half)
    assert cell["seeds"]["hi"] == pytest.approx(d.mean() + half)
    assert cell["users"]["lo"] < cell["estimate"] < cell["users"]["hi"]


def test_differences_are_antisymmetric_and_share_the_user_draws():
    runs = _runs()
    idx = np.random.default_rng(2).integers(0, 40, (300, 40))
    ab = paired_difference(runs, "noisy", "none", METRICS, idx)["ndcg@10"]
    ba = paired_difference(runs, "none", "noisy", METRICS, idx)["ndcg@10"]
    assert ab["estimate"] == pytest.approx(-ba["estimate"])
    assert ab["users"]["lo"] == pytest.approx(-ba["users"]["hi"])
    assert ab["seeds"]["hi"] == pytest.approx(-ba["seeds"]["lo"])


def test_balanced_differences_do_not_exclude_zero():
    # Per user exactly +1 or -1 in equal numbers: the mean difference is 0.
    users = 50
    d = np.where(np.arange(users) % 2 == 0, 1.0, -1.0)[:, None].repeat(2, axis=1)
    base = [np.zeros((users, 2)) for _ in range(3)]
    runs = {"none": base, "x": [b + d for b in base]}
    out = augment_comparisons(runs, METRICS, draws=500, seed=0)
    cell = out["minus_none"]["x"]["recall@10"]
    assert cell["estimate"] == 0
    assert cell["users"]["lo"] < 0 < cell["users"]["hi"]
    assert verdict(cell) == "no difference shown"


def test_comparisons_cover_every_method_against_none_and_brief_against_the_rest():
    out = augment_comparisons(_runs(), METRICS, draws=100, seed=0)
    assert set(out["minus_none"]) == {"shifted", "noisy", "brief"}
    assert set(out["brief_minus"]) == {"shifted", "noisy"}
    assert out["brief_minus"]["shifted"]["recall@10"]["estimate"] == pytest.approx(-0.04)
    assert verdict(out["brief_minus"]["shifted"]["recall@10"]) == "worse"
    assert augment_comparisons({"none": _runs()["none"]}, METRICS, 100)["brief_minus"] == {}


def test_mismatched_users_or_seeds_are_refused():
    runs = _runs()
    with pytest.raises(ValueError, match="same users"):
        augment_comparisons({**runs, "x": [a[:-1] for a in runs["none"]]}, METRICS, 100)
    with pytest.raises(ValueError, match="seeds"):
        paired_difference({**runs, "x": runs["none"][:2]}, "x", "none", METRICS,
                          np.zeros((10, 40), dtype=int))  # fmt: skip
