"""The paired user bootstrap of brief-offline's gaps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from recjudge.bench._offline import METRICS, _means, gap
from recjudge.bench._offline_stats import gap_intervals, mean_gap_draws

SYSTEMS = ("a", "b", "c")


def _world(seed: int, users: int = 40) -> dict[str, dict[str, np.ndarray]]:
    g = np.random.default_rng(seed)
    online = {s: g.random((users, len(METRICS))) for s in SYSTEMS}
    online["a"][:, 0] = 0.0  # a metric whose lift from system a is undefined
    noisy = {s: online[s] + g.normal(0, 0.3, online[s].shape) ** 2 for s in SYSTEMS}
    return {"online": online, "logged": noisy, "cf": online, "judge:brief": noisy}


def _keep() -> np.ndarray:
    return np.array([not k.startswith("recall@") for k in METRICS])


def test_point_estimate_is_the_gap_of_the_means():
    pu = _world(1)
    got = mean_gap_draws(pu, SYSTEMS, _keep(), np.arange(40)[None])
    online = {s: {k: v for k, v in d.items() if not k.startswith("recall@")}
              for s, d in _means(pu["online"]).items()}  # fmt: skip
    pairs = list(itertools.combinations(SYSTEMS, 2))
    for m in ("logged", "cf", "judge:brief"):
        g = gap(_means(pu[m]), online, pairs)
        assert got[m][0] == pytest.approx(np.mean([v for v in g.values() if v is not None]))


def test_paired_differences_and_intervals():
    per_seed = [_world(1), _world(2, users=30)]
    b = gap_intervals(per_seed, SYSTEMS, METRICS, draws=200, seed=0)
    # The imputer that reproduces the online metrics has no gap in any resample.
    assert b["mean_gap"]["cf"] == {"estimate": 0.0, "lo": 0.0, "hi": 0.0, "per_seed": [0.0, 0.0]}
    logged = b["mean_gap"]["logged"]
    assert logged["lo"] < logged["hi"] and logged["estimate"] > 0
    assert logged["estimate"] == pytest.approx(np.mean(logged["per_seed"]))
    # cf minus logged: exactly minus the logged gap, in every resample.
    d = b["minus_logged"]["cf"]
    assert (d["estimate"], d["lo"], d["hi"]) == pytest.approx(
        (-logged["estimate"], -logged["hi"], -logged["lo"])
    )
    # Two methods with the same labels differ by exactly 0 on every draw (paired).
    same = b["minus_logged"]["judge:brief"]
    assert (same["estimate"], same["lo"], same["hi"]) == (0.0, 0.0, 0.0)
    assert set(b["brief_minus"]) == {"cf"}
    assert b["brief_minus"]["cf"]["estimate"] == pytest.approx(logged["estimate"])


def test_without_brief_there_is_no_brief_comparison():
    pu = {k: v for k, v in _world(3).items() if k != "judge:brief"}
    b = gap_intervals([pu], SYSTEMS, METRICS, draws=50)
    assert b["brief_minus"] == {} and set(b["minus_logged"]) == {"cf"}
