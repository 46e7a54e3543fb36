"""``bench brief-offline-estimators``' machinery on a synthetic world: the vectorised rows
equal the reference estimators on the same lists, a redrawn world is the population on the
drawn users, a simulated log is what ``evaluate`` reads, the propensities are ``evaluate``'s
own fit, and over many redrawn evaluations IPS (true propensities) covers the population
truth on the ``listed`` users while the ``logged-positive`` rule biases it upward."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from recjudge._stats import user_draws
from recjudge.bench._offline_estimators import (
    BOUND,
    EstimatorCheckConfig,
    _sigma_per_user,
    estimator_rows,
    gold_on_log,
    gold_summary,
    headroom,
    leniency_flags,
    one_log,
    ppi_limit,
    propensity_sets,
    resample,
    selections,
    simulate_log,
    summarise,
    synthetic_imputer,
    truth_of,
    tuned_judge,
    world_from,
)
from recjudge.cf_models import MODELS
from recjudge.evaluators import ListLabels, estimate, propensities_from
from recjudge.evaluators.offline._gold_ppi import ppi_mean
from recjudge.tune import TunedLeakageError
from tuned_folders import fake_tuned

METRICS = ("precision@5", "ndcg_fixed@5", "dcg@3")


def _world(seed=0, users=40, items=60, relevant=12, alpha=0.7, pop=(1, 200), short=True):
    g = np.random.default_rng(seed)
    names = [f"i{n}" for n in range(items)]
    popularity = {i: int(g.integers(*pop)) for i in names}
    rankings = {
        name: {
            f"u{u}": list(g.choice(names, 3 if short and u % 7 == 0 else 5, replace=False))
            for u in range(users)
        }  # fmt: skip
        for name in ("a", "b", "c")
    }
    online = {f"u{u}": list(g.choice(names, relevant, replace=False)) for u in range(users)}
    w = world_from([f"u{u}" for u in range(users)], rankings, online, popularity, alpha, 5)
    n = len(w.pairs)
    p = np.clip(0.6 * w.relevant + g.uniform(0, 0.4, n), 0, 1)
    w.imputers["judge"] = (p, (p > 0.5).astype(float))
    w.imputers["judge+cal"] = (p, (p > 0.5).astype(float))
    w.imputers["all-yes"] = (np.ones(n), np.ones(n))
    return w, rankings


def _all(w, draws=50, seed=0):
    rows = np.arange(len(w.users))
    idx = user_draws(len(rows), draws, seed)
    return {"listed": (rows, idx), "logged-positive": (rows, idx)}


def test_rows_equal_the_reference_estimators_on_the_same_lists():
    w, rankings = _world()
    observed, logged = simulate_log(w, np.random.default_rng(1))
    thetas, _ = propensity_sets(w, logged, 0.05, 0.5)
    got = one_log(w, observed, METRICS, thetas, _all(w))
    index = {pair: n for n, pair in enumerate(w.pairs)}
    for row, est, imputer, prop, _rule in estimator_rows(list(w.imputers)):
        th = thetas[prop]
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


def test_a_redrawn_world_is_the_population_on_the_drawn_users():
    w, rankings = _world()
    rows = np.array([3, 3, 0, 17, 39, 3])
    r = resample(w, rows)
    assert len(r.users) == len(rows) and len(set(r.users)) == len(rows)  # a repeat is new
    for j, s in enumerate(rows):
        u = w.users[s]
        for name, lists in rankings.items():
            got = [r.pairs[p][1] for p in r.slots[name][j] if p >= 0]
            assert got == list(lists[u])
            assert all(r.pairs[p][0] == r.users[j] for p in r.slots[name][j] if p >= 0)
    # every per-pair array follows its pair; the truth is the mean over the drawn rows
    src = {(u, i): n for n, (u, i) in enumerate(w.pairs)}
    for n, (u, i) in enumerate(r.pairs):
        o = src[(u.rsplit("#", 1)[0], i)]
        assert r.relevant[n] == w.relevant[o] and r.theta[n] == w.theta[o]
        assert r.imputers["judge"][0][n] == w.imputers["judge"][0][o]
    per_user = {s: truth_of(resample(w, [s]), ["precision@5"])["precision@5"] for s in set(rows)}
    t = truth_of(r, ["precision@5"])["precision@5"]
    for name in rankings:
        assert t[name] == pytest.approx(np.mean([per_user[s][name] for s in rows]))
    same, full = truth_of(resample(w, np.arange(len(w.users))), METRICS), truth_of(w, METRICS)
    for m in METRICS:
        assert same[m] == pytest.approx(full[m])


def test_a_simulated_log_is_what_evaluate_reads():
    w, _ = _world()
    r = resample(w, np.arange(len(w.users)).repeat(2))
    observed, logged = simulate_log(r, np.random.default_rng(3))
    assert list(logged) == r.users  # every user, one with no observation holding {}
    for n, (u, i) in enumerate(r.pairs):
        assert bool(observed[n]) == (i in logged[u])
        if observed[n]:
            assert logged[u][i] == int(r.relevant[n])
    # unlisted items are observed too (the fit needs the whole log), labelled by the truth
    listed = set(r.pairs)
    extra = [(u, i, y) for u, d in logged.items() for i, y in d.items() if (u, i) not in listed]
    assert extra
    row = {u: k for k, u in enumerate(r.users)}
    assert all(y == int(i in r.online[row[u]]) for u, i, y in extra)


def test_propensities_are_evaluates_own_fit_and_recover_the_exponent():
    w, _ = _world(users=300, items=200, alpha=1.0)
    observed, logged = simulate_log(w, np.random.default_rng(4))
    thetas, fit = propensity_sets(w, logged, 1e-4, 0.5)
    ref = propensities_from("fit", logged, 1e-4, w.item_popularity)
    assert thetas["fit"] == pytest.approx([ref.of(u, i)[0] for u, i in w.pairs])
    assert fit["exponent"] == pytest.approx(ref.fit["exponent"])
    # 300 users x 200 items: the ML fit of (pop + 1)^a lands near the true exponent 1
    assert abs(fit["exponent"] - 1.0) < 0.2
    assert thetas["true"] == pytest.approx(np.clip(w.theta, 1e-4, 1))


def _coverage_run(logs: int = 120, sparse: bool = False):
    # sparse: 2 relevant items of 20, exposure (pop / max)^2 with pop 20-99: about a quarter
    # of the users have no logged positive, and who keeps one depends on what was observed
    w, _ = (_world(users=80, items=20, relevant=2, alpha=2.0, pop=(20, 100), short=False)
            if sparse else _world(users=80, items=80))  # fmt: skip
    truth = truth_of(w, ["precision@5"])
    per = []
    for t in range(logs):
        g = np.random.default_rng(100 + t)
        r = resample(w, g.integers(0, len(w.users), len(w.users)))
        observed, logged = simulate_log(r, g)
        thetas, _ = propensity_sets(r, logged, 1e-6, 0.5)
        per.append(one_log(r, observed, ["precision@5"], thetas, selections(r, logged, 200, t)))
    return summarise(per, truth)


def test_redrawn_users_ips_covers_the_population_truth_and_logged_does_not():
    s = _coverage_run()
    assert s["ips (true theta)"]["precision@5"]["coverage"] >= 0.85
    assert s["logged"]["precision@5"]["coverage"] <= 0.2
    # signed error per system is reported, and logged runs low for every system
    assert all(v < 0 for v in s["logged"]["precision@5"]["signed_error"].values())
    assert set(s["ips (true theta)"]["precision@5"]["coverage_by_system"]) == {"a", "b", "c"}


def test_the_logged_positive_rule_biases_ips_upward_on_a_sparse_log():
    s = _coverage_run(sparse=True)
    listed = s["ips (true theta)"]["precision@5"]["signed_error"]
    chosen = s["ips (true theta), logged-positive users"]["precision@5"]["signed_error"]
    # the truth is ~0.09 per system: the rule adds ~+0.03 (a third), the listed users ~0
    for name in listed:
        assert chosen[name] > listed[name] + 0.01
    assert abs(np.mean(list(listed.values()))) < 0.3 * np.mean(list(chosen.values()))


def test_gold_samples_run_through_evaluates_ppi_with_both_intervals():
    w, _ = _world(users=60)  # 100 gold pairs: 6-7 whole users (5 at least for an interval)
    truth = truth_of(w, ["precision@5"])
    got = gold_on_log(w, "judge", ["precision@5"], [100], 0, truth)
    assert set(got) == {(100, d, m, "precision@5") for d in ("users", "uniform", "active")
                        for m in ("auto", "iid")}  # fmt: skip
    assert all(len(v) == 3 for v in got.values())  # one entry per system
    # a perfect judge leaves PPI a narrower interval than an uninformative one does
    w.imputers["perfect"] = (w.relevant.copy(), w.relevant.copy())
    w.imputers["flat"] = (np.full(len(w.pairs), 0.5), np.ones(len(w.pairs)))
    widths = {}
    for name in ("perfect", "flat"):
        s = gold_summary([gold_on_log(w, name, ["precision@5"], [100], t, truth)
                          for t in range(5)])  # fmt: skip
        widths[name] = s["100"]["users"]["auto"]["precision@5"]["ci_width"]
        assert s["100"]["users"]["auto"]["precision@5"]["intervals"] > 0
    assert widths["perfect"] < widths["flat"]


def test_summary_counts_coverage_and_error_per_log():
    truth = {"p@1": {"a": 0.5, "b": 0.2}}
    logs = [{"r": {"p@1": {"a": (0.6, 0.4, 0.7), "b": (0.1, 0.25, 0.3)}}}] * 2
    s = summarise(logs, truth)["r"]["p@1"]
    assert s["coverage"] == 0.5  # a's interval holds 0.5, b's [0.25, 0.3] misses 0.2
    assert s["coverage_by_system"] == {"a": 1.0, "b": 0.0}
    assert s["signed_error"] == pytest.approx({"a": 0.1, "b": -0.1})
    assert s["abs_error"] == pytest.approx(0.1)
    assert s["ci_width"] == pytest.approx((0.3 + 0.05) / 2)
    assert s["abs_error_per_log"] == pytest.approx([0.1, 0.1])
    assert s["kendall_tau"] == 1.0  # a above b in both


def test_sigma_sources_must_be_circular_and_independent_as_named():
    cfg = EstimatorCheckConfig(systems=("pop", "als"), circular_system="als",
                               independent_cf="fm")  # fmt: skip
    assert cfg.circular_system == "als"
    with pytest.raises(ValueError, match="not one of the systems"):
        EstimatorCheckConfig(systems=("pop", "als"), circular_system="bpr")
    with pytest.raises(ValueError, match="is one of the systems"):
        EstimatorCheckConfig(systems=("pop", "als"), independent_cf="als")
    assert EstimatorCheckConfig(circular_system=None, independent_cf=None).independent_cf is None


def test_the_leniency_rule_flags_the_system_a_circular_judge_favours_and_only_it():
    w, _ = _world(3, users=60)
    g = np.random.default_rng(1)
    observed, _logged = simulate_log(w, g)
    a = np.zeros(len(w.pairs), dtype=bool)
    a[w.slots["a"][w.slots["a"] >= 0]] = True
    honest = (w.relevant > 0).astype(float)  # says YES where relevant: rates follow the log
    w.imputers["judge:brief"] = (honest, honest)
    w.imputers["judge:brief/sigma=a-system"] = (honest, np.where(a, 1.0, honest))
    rows = np.arange(len(w.users))
    sources = {"own": "judge:brief", "circ": "judge:brief/sigma=a-system"}
    got = leniency_flags(w, observed, rows, sources, k=5)
    assert got["own"] == {"a": False, "b": False, "c": False}
    assert got["circ"]["a"] and not got["circ"]["b"] and not got["circ"]["c"]


def test_dr_with_the_truth_as_imputer_is_the_narrowest_and_headroom_reads_it():
    """``BOUND``: DR with the truth as imputer has no correction term (its value is the
    drawn users' own metric), so no imputer's DR interval is narrower on average, and
    ``headroom`` states each DR row's width over SNIPS's against the bound's."""
    w, _ = _world(seed=3, alpha=0.5)
    w.imputers[BOUND] = (w.relevant.astype(float), w.relevant.astype(float))
    truth = truth_of(w, ["precision@5"])
    per = []
    for t in range(30):
        g = np.random.default_rng(500 + t)
        r = resample(w, g.integers(0, len(w.users), len(w.users)))
        observed, logged = simulate_log(r, g)
        thetas, _ = propensity_sets(r, logged, 1e-6, 0.5)
        cells = one_log(r, observed, ["precision@5"], thetas, selections(r, logged, 200, t))
        # no correction left: DR with the truth is the drawn users' truth, whatever the log
        sample_truth = truth_of(r, ["precision@5"])["precision@5"]
        for system, (value, _, _) in cells[f"dr [{BOUND}, fit theta]"]["precision@5"].items():
            assert value == pytest.approx(sample_truth[system], abs=1e-12)
        per.append(cells)
    s = summarise(per, truth)
    room = headroom(s)["precision@5"]
    bound = s[f"dr [{BOUND}, fit theta]"]["precision@5"]["ci_width"]
    assert room["bound_width"] == bound
    assert room["bound_ratio"] == pytest.approx(
        bound / s["snips (fit theta)"]["precision@5"]["ci_width"]
    )
    assert set(room["dr_ratios"]) == {"dr [judge, fit theta]", "dr [judge+cal, fit theta]",
                                      "dr [all-yes, fit theta]"}  # fmt: skip
    assert all(ratio > room["bound_ratio"] for ratio in room["dr_ratios"].values())
    assert headroom({}) == {}


def test_sigma_per_user_equals_the_per_pair_signal():
    g = np.random.default_rng(0)
    inter = pd.DataFrame({"user_id": g.integers(0, 30, 600).astype(str),
                          "item_id": g.integers(0, 50, 600).astype(str)})  # fmt: skip
    inter["rating"] = 5.0
    inter["timestamp"] = np.arange(len(inter))
    cls = MODELS.get("als")  # the world's CF: a fold-in per history
    model = cls(cls.Config(factors=4, iterations=3)).train(inter, items=[str(i) for i in range(50)])
    hist = {str(u): inter[inter.user_id == str(u)].item_id.tolist() for u in range(30)}
    model.calibrate([hist[str(u)] for u in range(30)], [str(u) for u in range(30)])
    pairs = [(str(u), str(i)) for u in range(30) for i in g.choice(50, 4, replace=False)]
    got = _sigma_per_user(model, hist, pairs)
    want = [model.sigma(hist[u], i, u) for u, i in pairs]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("auc", [0.6, 0.8, 0.95])
def test_a_synthetic_imputer_has_the_asked_auc_and_is_calibrated(auc):
    """``synthetic_imputer``: the posterior of a noisy score of the truth, so its AUC is the
    one asked and, being a posterior, it is calibrated (both up to sampling error over
    40,000 pairs)."""
    from scipy.stats import mannwhitneyu

    r = (np.random.default_rng(1).random(40_000) < 0.1).astype(float)
    p = synthetic_imputer(r, auc, seed=0)
    u = mannwhitneyu(p[r == 1], p[r == 0]).statistic
    assert u / ((r == 1).sum() * (r == 0).sum()) == pytest.approx(auc, abs=0.015)
    assert p.mean() == pytest.approx(r.mean(), abs=0.01)
    # calibrated: in each fifth of the pairs by p, the relevant share is the mean p
    for part in np.array_split(np.argsort(p), 5):
        assert r[part].mean() == pytest.approx(p[part].mean(), abs=0.03)
    np.testing.assert_array_equal(p, synthetic_imputer(r, auc, seed=0))  # fixed per seed
    with pytest.raises(ValueError, match="bound_aucs"):
        synthetic_imputer(r, 0.5, seed=0)


def test_the_ppi_limit_is_ppi_pluss_width_over_the_labels_alone():
    """``ppi_limit``: with many more unlabelled pairs than gold ones, the power-tuned PPI++
    interval for a mean (``ppi_mean``, equal to ppi_py's: scripts/crosscheck_ppi.py) over the
    labels-only one (lambda 0) is ``sqrt(1 - rho^2)``."""
    g = np.random.default_rng(4)
    y = (g.random(400_000) < 0.1).astype(float)
    # lambda* = cov / var f = 0.027 / 0.0306, about 0.88: inside ppi_mean's [0, 1]
    f = 0.1 + 0.3 * (y - 0.1) + g.normal(0, 0.15, len(y))
    limit = ppi_limit(f, y)
    n = 2000
    tuned = ppi_mean(y[:n], f[:n], f[n:], lam=None, alpha=0.05)
    alone = ppi_mean(y[:n], f[:n], f[n:], lam=0.0, alpha=0.05)
    ratio = (tuned["hi"] - tuned["lo"]) / (alone["hi"] - alone["lo"])
    # the gold sample's own correlation and fitted lambda: a few per cent from the limit
    assert ratio == pytest.approx(limit["ppi_width_limit"], rel=0.05)
    assert 0.3 < limit["ppi_width_limit"] < 0.9  # a case where the limit is not trivial
    assert ppi_limit(y, y)["ppi_width_limit"] == pytest.approx(0.0, abs=1e-7)
    assert ppi_limit(np.ones(10), y[:10]) == {"corr_vs_truth": None, "ppi_width_limit": None}


def test_a_judge_tuned_on_the_worlds_users_is_refused(tmp_path):
    """The known-truth world with a tuned judge: a tuning that read any of the world's users
    is refused (its judgments would not be independent of the truth); one that read none is
    named in the report's results with its card; a model that is not a tuned folder, or a
    run without judges, has no record."""

    leaky = fake_tuned(tmp_path / "leaky", {"u1": 5.0, "other": 1.0})
    with pytest.raises(TunedLeakageError, match="tuned on 1 of this world's 3 users"):
        tuned_judge(EstimatorCheckConfig(model=str(leaky)), ["u0", "u1", "u2"])
    clean = fake_tuned(tmp_path / "clean", {"other": 1.0})
    got = tuned_judge(EstimatorCheckConfig(model=str(clean)), ["u0", "u1", "u2"])
    assert got is not None and (got["world_users"], got["world_users_read"]) == (3, 0)
    assert tuned_judge(EstimatorCheckConfig(model=str(tmp_path)), ["u0"]) is None
    assert tuned_judge(EstimatorCheckConfig(model=str(leaky), judges=()), ["u1"]) is None
