"""Calibration uncertainty inside DM's interval (issue 89, item 2): the imputer refitted on
resampled gold users in every bootstrap draw (CJE's oracle-uncertainty-aware bootstrap)."""

from __future__ import annotations

import numpy as np

from recjudge.evaluators.offline._estimators import ListLabels, estimate
from recjudge.evaluators.offline._supervised import fit_imputer, logit, refit_draws


def _world(seed: int, n_users: int = 300, k: int = 10):
    g = np.random.default_rng(seed)
    taste = g.normal(-1.5, 1.0, n_users)
    z = taste[:, None] + g.normal(0, 1.0, (n_users, k))
    q = 1 / (1 + np.exp(-z))  # P(relevant)
    y = (g.random((n_users, k)) < q).astype(float)
    raw = 1 / (1 + np.exp(-(0.5 * z + 1.5 + g.normal(0, 0.7, (n_users, k)))))  # lenient judge
    users = [f"u{u:03d}" for u in range(n_users)]
    rows = {(u, f"i{r}"): {"logit_p_yes": logit(raw[n, r])} for n, u in enumerate(users)
            for r in range(k)}  # fmt: skip
    return g, users, y, rows, float(y.mean(axis=1).mean())


def test_dm_with_a_calibration_refit_per_draw_covers_where_the_fixed_map_does_not():
    reps, draws, k = 40, 200, 10
    fixed, oua, wider = [], [], []
    for rep in range(reps):
        g, users, y, rows, truth = _world(rep)
        labelled = g.choice(len(users), 12, replace=False)  # ~120 gold pairs, whole users
        gold = {(users[n], f"i{r}"): int(y[n, r]) for n in labelled for r in range(k)}
        p = fit_imputer(rows, gold, "isotonic").p
        lists = {u: ListLabels(np.zeros(k), np.zeros(k),
                               np.array([p[(u, f"i{r}")] for r in range(k)]), np.zeros(k),
                               np.ones(k)) for u in users}  # fmt: skip
        index, probs, n_gold = refit_draws(rows, gold, "isotonic", draws, seed=rep)
        cols = np.array([[index[(u, f"i{r}")] for r in range(k)] for u in sorted(lists)])
        a = estimate(lists, ["precision@10"], ["dm"], draws=draws, seed=rep)
        b = estimate(lists, ["precision@10"], ["dm"], draws=draws, seed=rep,
                     p_draws=probs[:, cols], p_clusters=n_gold)  # fmt: skip
        (lo_a, hi_a), (lo_b, hi_b) = a["precision@10"]["dm"].ci, b["precision@10"]["dm"].ci
        fixed.append(lo_a <= truth <= hi_a)
        oua.append(lo_b <= truth <= hi_b)
        wider.append((hi_b - lo_b) > (hi_a - lo_a))
    assert np.mean(oua) >= 0.88
    assert np.mean(oua) - np.mean(fixed) >= 0.15
    assert np.mean(wider) > 0.9
