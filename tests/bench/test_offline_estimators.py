"""``bench brief-offline-estimators``' machinery on a synthetic world: the vectorised rows
equal the reference estimators on the same lists, the estimated propensities match the
observed count, a perfect judge puts PPI ahead of the gold sample alone, and over many logs
IPS and DR (true propensities) centre on the truth while ``logged`` does not."""

from __future__ import annotations

import numpy as np
import pytest

from recjudge.bench._offline_estimators import (
    estimated_theta,
    estimator_rows,
    gold_experiment,
    one_log,
    summarise,
    truth_of,
    world_from,
)
from recjudge.evaluators._estimators import ListLabels, estimate

METRICS = ("precision@5", "ndcg_fixed@5", "dcg@3")


def _world(seed: int = 0, users: int = 40):
    g = np.random.default_rng(seed)
    items = [f"i{n}" for n in range(60)]
    popularity = {i: int(g.integers(1, 200)) for i in items}
    rankings = {
        name: {
            f"u{u}": list(g.choice(items, 5 if u % 7 else 3, replace=False)) for u in range(users)
        }  # fmt: skip
        for name in ("a", "b", "c")
    }
    online = {f"u{u}": list(g.choice(items, 12, replace=False)) for u in range(users)}
    w = world_from([f"u{u}" for u in range(users)], rankings, online, popularity, 0.7, 5)
    n = len(w.pairs)
    p = np.clip(0.6 * w.relevant + g.uniform(0, 0.4, n), 0, 1)
    w.imputers["judge"] = (p, (p > 0.5).astype(float))
    w.imputers["all-yes"] = (np.ones(n), np.ones(n))
    return w, rankings


def test_rows_equal_the_reference_estimators_on_the_same_lists():
    w, rankings = _world()
    observed = np.random.default_rng(1).random(len(w.pairs)) < w.theta
    idx = np.arange(len(w.users))[None]
    got = one_log(w, observed, METRICS, 0.05, 0.5, idx)
    index = {pair: n for n, pair in enumerate(w.pairs)}
    theta = {"true": np.maximum(w.theta, 0.05),
             "est": np.maximum(estimated_theta(w, observed, 0.5), 0.05)}  # fmt: skip
    for row, est, arg in estimator_rows(["judge", "all-yes"]):
        imputer, _, prop = arg.partition("|")
        th = theta.get(prop or arg, theta["true"])
        for system, lists in rankings.items():
            labels = {}
            for u in w.users:
                ids = [index[(u, i)] for i in lists[u]]
                p, h = w.imputers.get(imputer, (np.zeros(len(w.pairs)),) * 2)
                labels[u] = ListLabels(observed[ids].astype(float),
                                       (w.relevant * observed)[ids], p[ids], h[ids],
                                       th[ids])  # fmt: skip
            ref = estimate(labels, list(METRICS), [est], draws=0)
            for m in METRICS:
                assert got[row][m][system][0] == pytest.approx(ref[m][est].value), (row, m)


def test_estimated_propensities_expect_the_observed_count():
    w, _ = _world()
    observed = np.random.default_rng(2).random(len(w.pairs)) < w.theta
    est = estimated_theta(w, observed, 0.5)
    assert est.max() <= 1.0
    if est.max() < 1.0:  # no cap bound: the expectation matches exactly
        assert est.sum() == pytest.approx(observed.sum())
    # the popularity order is kept
    order = np.argsort(w.popularity)
    assert (np.diff(est[order]) >= -1e-12).all()


def test_a_perfect_judge_makes_ppi_beat_the_gold_sample_alone():
    # PPI++ with perfect predictions is lam * truth + (1 - lam) * gold mean (lam in (0, 1]),
    # so on the same gold draws its error and width are below the gold sample's alone.
    w, _ = _world()
    w.imputers["perfect"] = (w.relevant.copy(), w.relevant.copy())
    metrics = ["precision@5", "ndcg_fixed@5"]
    res = gold_experiment(w, "perfect", metrics, [30], draws=5, seed=0)["30"]
    for m in ("precision@5", "ndcg_fixed@5"):
        ppi, alone = res["ppi++"][m], res["gold only"][m]
        assert ppi["abs_error"] < alone["abs_error"]
        assert ppi["ci_width"] < alone["ci_width"]
        assert ppi["intervals"] == alone["intervals"] > 0


def test_over_many_logs_ips_and_dr_centre_on_the_truth_and_logged_does_not():
    w, _ = _world(users=60)
    truth = truth_of(w, ["precision@5"])["precision@5"]
    g = np.random.default_rng(5)
    idx = np.arange(len(w.users))[None]
    sums: dict[str, list[float]] = {}
    for _ in range(400):
        observed = g.random(len(w.pairs)) < w.theta
        got = one_log(w, observed, ["precision@5"], 1e-6, 0.5, idx)
        for row in ("logged", "ips (true theta)", "dr [judge, true theta]"):
            sums.setdefault(row, []).append(got[row]["precision@5"]["a"][0])
    for row in ("ips (true theta)", "dr [judge, true theta]"):
        v = np.asarray(sums[row])
        assert abs(v.mean() - truth["a"]) < 4 * v.std(ddof=1) / np.sqrt(len(v)) + 1e-12, row
    v = np.asarray(sums["logged"])
    assert v.mean() < truth["a"] - 4 * v.std(ddof=1) / np.sqrt(len(v))


def test_summary_counts_coverage_and_error_per_log():
    truth = {"p@1": {"a": 0.5, "b": 0.2}}
    logs = [{"r": {"p@1": {"a": (0.6, 0.4, 0.7), "b": (0.1, 0.25, 0.3)}}}] * 2
    s = summarise(logs, truth)["r"]["p@1"]
    assert s["coverage"] == 0.5  # a's interval holds 0.5, b's [0.25, 0.3] misses 0.2
    assert s["abs_error"] == pytest.approx(0.1)
    assert s["ci_width"] == pytest.approx((0.3 + 0.05) / 2)
    assert s["abs_error_per_log"] == pytest.approx([0.1, 0.1])
    assert s["kendall_tau"] == 1.0  # a above b in both
