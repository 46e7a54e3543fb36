"""Metric estimators under missing feedback: a hand-computed case, unbiasedness over many
simulated logs with known propensities, propensity models and bad propensity files."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recjudge.data import DataError
from recjudge.evaluators.offline import ESTIMATOR_SPECS, ESTIMATORS
from recjudge.evaluators.offline._estimators import (
    ListLabels,
    estimate,
    estimate_user,
    metric_weights,
)
from recjudge.evaluators.offline._evaluation import list_labels
from recjudge.evaluators.offline._gold import read_gold
from recjudge.evaluators.offline._gold_ppi import ppi_mean, ppi_metric
from recjudge.evaluators.offline._propensities import (
    Propensities,
    powerlaw_propensities,
    read_propensities,
)
from recjudge.evaluators.offline._runs import RecRun, RunCheck

CASE = ListLabels(
    observed=np.array([1, 0, 1]),
    label=np.array([1, 0, 0]),
    p=np.array([0.8, 0.6, 0.3]),
    hard=np.array([1, 1, 0]),
    propensity=np.array([0.5, 0.2, 0.25]),
)


@pytest.mark.parametrize(
    ("est", "metric", "want"),
    [
        ("logged", "precision", 1 / 3),
        ("imputed", "precision", 2 / 3),  # the unlogged rank 2 takes the judge's YES
        ("dm", "precision", 1.7 / 3),
        ("ips", "precision", (1 / 0.5) / 3),
        ("dr", "precision", (0.8 + 0.2 / 0.5 + 0.6 + 0.3 - 0.3 / 0.25) / 3),
        ("logged", "dcg", 1.0),
        ("dr", "dcg", 0.8 + 0.2 / 0.5 + 0.6 / math.log2(3) + (0.3 - 0.3 / 0.25) / 2),
        ("dm", "hit", 1 - 0.2 * 0.4 * 0.7),
        ("dm", "mrr", 0.8 + 0.6 * 0.2 / 2 + 0.3 * 0.2 * 0.4 / 3),
        ("imputed", "mrr", 1.0),
        ("logged", "hit", 1.0),
        ("ips", "hit", None),  # not linear in the labels
        ("dr", "mrr", None),
    ],
)
def test_each_estimator_on_a_hand_computed_list(est, metric, want):
    got = estimate_user(est, metric, 3, CASE)
    assert got == pytest.approx(want) if want is not None else got is None


def test_ndcg_weights_are_dcg_over_the_dcg_of_k_relevant_items():
    w = metric_weights("ndcg_fixed", 4)
    assert w.sum() == pytest.approx(1.0)
    assert w[0] / w[1] == pytest.approx(math.log2(3))


def _simulate(n_users=60, k=5, sims=250, seed=0):
    """A fixed truth (relevance per user and rank), known propensities, and many logs."""
    g = np.random.default_rng(seed)
    y = (g.random((n_users, k)) < 0.35).astype(float)
    theta = g.uniform(0.1, 0.9, (n_users, k))
    truth = float((y @ metric_weights("ndcg_fixed", k)).mean())
    logs = g.random((sims, n_users, k)) < theta  # O per simulated log
    return y, theta, truth, logs


def _mean_and_se(y, theta, logs, est, p, th_used):
    k = y.shape[1]
    values = []
    for o in logs:
        lists = {str(u): ListLabels(o[u], y[u], p[u], (p[u] > 0.5), th_used[u])
                 for u in range(len(y))}  # fmt: skip
        m = f"ndcg_fixed@{k}"
        values.append(estimate(lists, [m], [est], draws=0)[m][est].value)
    values = np.asarray(values)
    return values.mean(), values.std(ddof=1) / math.sqrt(len(values))


def test_ips_and_dr_are_unbiased_with_the_true_propensities_and_logged_is_not():
    y, theta, truth, logs = _simulate()
    wrong_judge = np.full_like(y, 0.5)  # knows nothing
    for est, p in (("ips", wrong_judge), ("dr", wrong_judge)):
        mean, se = _mean_and_se(y, theta, logs, est, p, theta)
        assert abs(mean - truth) < 4 * se, (est, mean, truth, se)
    mean, se = _mean_and_se(y, theta, logs, "logged", wrong_judge, theta)
    assert truth - mean > 20 * se  # unlabelled = irrelevant: biased low


def test_dr_is_unbiased_with_a_right_judge_and_wrong_propensities():
    y, theta, truth, logs = _simulate(seed=1)
    flat = np.full_like(theta, 0.5)  # wrong propensities
    mean, se = _mean_and_se(y, theta, logs, "dr", y.copy(), flat)
    assert abs(mean - truth) < 4 * se + 1e-12
    mean_ips, se_ips = _mean_and_se(y, theta, logs, "ips", y.copy(), flat)
    assert abs(mean_ips - truth) > 4 * se_ips  # IPS has only the propensities to go on


def test_snips_normalises_by_the_mean_inverse_propensity_weight():
    lists = {"a": CASE, "b": CASE}
    got = estimate(lists, ["precision@3"], ["ips", "snips"], draws=0)["precision@3"]
    n = float(np.mean([1 / 0.5, 0, 1 / 0.25]))
    assert got["snips"].value == pytest.approx(got["ips"].value / n)


def test_estimates_carry_user_intervals_and_the_judge_share():
    lists = {str(u): CASE for u in range(5)}
    got = estimate(lists, ["precision@3"], ["logged", "dm", "dr"], draws=200)["precision@3"]
    assert got["dm"].ci[0] <= got["dm"].value <= got["dm"].ci[1]
    assert got["dm"].judge_share == pytest.approx(1 / 3)  # one of three equal weights unlogged
    assert got["logged"].judge_share == 0.0
    assert len(got["dr"].per_user) == 5


def test_dm_and_dr_are_undefined_without_the_judges_probability_for_logged_pairs():
    props = Propensities("uniform", "", {}, default=0.5)
    lab, _ = list_labels(["a", "b"], "u", {"a": 1}, {"b": (0.7, True)}, props, 2)
    got = estimate({"u": lab}, ["precision@2"], ["dm", "dr", "imputed"], draws=0)["precision@2"]
    assert got["dm"].value is None and "--judge-logged" in got["dm"].note
    assert got["imputed"].value == pytest.approx(1.0)


def test_powerlaw_propensities_expect_the_observed_count():
    counts = {"a": 100, "b": 25, "c": 4}
    pr = powerlaw_propensities(counts, n_users=50, n_observed=40, exponent=0.5)  # no cap hit
    total = 50 * sum(pr.of("u", i)[0] for i in counts)
    assert total == pytest.approx(40)
    assert pr.of("u", "a")[0] / pr.of("u", "b")[0] == pytest.approx(2.0)  # sqrt(100 / 25)
    assert pr.of("u", "never-logged")[0] > 0


def test_clipping_is_applied_and_counted():
    pr = Propensities("file", "", {"a": 0.001, "b": 0.5}, clip=0.01)
    assert pr.of("u", "a") == (0.01, True) and pr.of("u", "b") == (0.5, False)
    lab, clipped = list_labels(["a", "b"], "u", {}, {}, pr, 2)
    assert clipped == 1 and list(lab.propensity) == [0.01, 0.5]


@pytest.mark.parametrize(
    ("text", "row"),
    [
        ("item_id,propensity\na,0.5\nb,0\n", 2),
        ("item_id,propensity\na,-0.1\n", 1),
        ("item_id,propensity\na,1.5\n", 1),
        ("item_id,propensity\na,0.2\nb,high\n", 2),
        ("item_id,propensity\na,nan\n", 1),
    ],
)
def test_a_propensity_outside_0_1_names_the_file_and_row(tmp_path, text, row):
    (tmp_path / "p.csv").write_text(text)
    with pytest.raises(DataError, match=rf"p.csv, row {row}, field 'propensity'"):
        read_propensities(tmp_path / "p.csv")


def test_a_propensity_file_reads_per_item_and_per_pair(tmp_path):
    (tmp_path / "i.csv").write_text("item_id,propensity\na,0.5\n")
    (tmp_path / "p.csv").write_text("user_id,item_id,propensity\nu,a,0.25\n")
    assert read_propensities(tmp_path / "i.csv").of("x", "a") == (0.5, False)
    with pytest.raises(DataError, match=r"i.csv: no propensity for user 'x', item 'b'"):
        read_propensities(tmp_path / "i.csv").of("x", "b")
    assert read_propensities(tmp_path / "p.csv").of("u", "a") == (0.25, False)
    with pytest.raises(DataError, match="no propensity column"):
        (tmp_path / "bad.csv").write_text("item_id,p\na,0.5\n")
        read_propensities(tmp_path / "bad.csv")


# -- gold samples: PPI ----------------------------------------------------------------------
def test_ppi_closed_forms():
    y, yhat, yu = np.array([1.0, 0, 1, 1]), np.array([0.5, 0.5, 0.5, 1]), np.array([0.2, 0.6])
    classic = ppi_mean(y, yhat, yu, lam=1.0)
    assert classic["value"] == pytest.approx(0.4 + (0.5 - 0.5 + 0.5 + 0) / 4)
    half = 1.959964 * math.sqrt(yu.std() ** 2 / 2 + (y - yhat).std() ** 2 / 4)
    assert classic["hi"] - classic["value"] == pytest.approx(half, rel=1e-5)
    assert ppi_mean(y, yhat, yu, lam=0.0)["value"] == pytest.approx(0.75)  # the gold mean
    assert 0.0 <= ppi_mean(y, yhat, yu)["lam"] <= 1.0


def test_ppi_intervals_cover_the_truth_with_a_biased_judge():
    """A judge whose probabilities are far off (p^3) still gives intervals at about their
    nominal 95 %: the gold sample corrects it."""
    g = np.random.default_rng(7)
    truth_p = g.random(5000)
    y_all = (g.random(5000) < truth_p).astype(float)
    truth = y_all.mean()
    judge = truth_p**3
    covered, reps = 0, 300
    for _ in range(reps):
        gold = g.choice(5000, 150, replace=False)
        r = ppi_mean(y_all[gold], judge[gold], judge)
        covered += r["lo"] <= truth <= r["hi"]
    assert covered / reps >= 0.9
    assert abs(judge.mean() - truth) > 0.2  # the judge alone is far off


def test_gold_pairs_outside_the_runs_are_refused_by_row(tmp_path):
    run = RecRun("s", "", {"u": ["a", "b", "c"], "v": ["b", "c", "d"]}, {}, RunCheck())
    listed = {(u, i) for u, items in run.rankings.items() for i in items}
    (tmp_path / "g.csv").write_text("user_id,item_id,label\nu,a,1\nv,zz,0\n")
    listed_by = r"no evaluated run lists item 'zz'"
    with pytest.raises(DataError, match=r"g.csv, row 2: gold pair \('v', 'zz'\): " + listed_by):
        read_gold(tmp_path / "g.csv", ["u", "v"], listed)
    (tmp_path / "g.csv").write_text("user_id,item_id,label\nu,a,1\nv,b,0\nu,c,1\n")
    gold = read_gold(tmp_path / "g.csv", ["u", "v"], listed).labels
    judged = {p: (0.5, True) for p in listed}
    r = ppi_metric(run, ["u", "v"], judged, gold, "precision@3", lam=1.0)
    # M = mean_users sum_r Y/3: judge term 0.5, rectifier mean(c w (Y - p)) over the 3 gold
    assert r["value"] == pytest.approx(0.5 + (0.5 - 0.5 + 0.5) / 3) and r["n"] == 3
    with pytest.raises(ValueError, match="no judge probability"):
        ppi_metric(run, ["u", "v"], {}, gold, "precision@3")


def test_the_batched_estimate_equals_the_per_user_formula():
    # estimate() computes every user at once; estimate_user is the formula per list.
    g = np.random.default_rng(4)
    lists = {}
    for u in range(30):
        n = int(g.integers(1, 9))  # some lists shorter than k
        o = (g.random(n) < 0.4).astype(float)
        lists[f"u{u}"] = ListLabels(o, (g.random(n) < 0.5) * o, g.random(n),
                                    (g.random(n) < 0.5).astype(float),
                                    g.uniform(0.05, 1, n))  # fmt: skip
    names = ["precision@5", "ndcg_fixed@8", "dcg@3", "hit@5", "mrr@8"]
    got = estimate(lists, names, draws=0)
    for name in names:
        metric, k = name.split("@")
        for est, e in got[name].items():
            ref = [estimate_user(est, metric, int(k), x) for x in lists.values()]
            if any(v is None for v in ref):
                assert e.value is None
                continue
            if est == "snips":
                ratios = np.concatenate([x.observed[: int(k)] / x.propensity[: int(k)]
                                         for x in lists.values()])  # fmt: skip
                ref = [v / ratios.mean() for v in ref]
            assert e.value == pytest.approx(np.mean(ref)), (name, est)
            assert e.per_user == pytest.approx([ref[i] for i in np.argsort(list(lists))])


def test_every_estimator_is_one_spec_and_they_agree_where_the_truth_is_seen():
    """The estimators are records of one registry (what each reads, where it is defined);
    with every label observed at propensity 1 and a judge that is right (p = h = Y), every
    estimator of a linear metric is the true value, and the ones defined for hit@k too."""
    assert tuple(ESTIMATOR_SPECS) == ESTIMATORS
    y = np.array([1.0, 0.0, 1.0, 1.0])
    seen = ListLabels(observed=np.ones(4), label=y, p=y, hard=y, propensity=np.ones(4))
    for name in ESTIMATORS:
        spec = ESTIMATOR_SPECS.get(name)
        for metric in ("precision", "dcg", "ndcg_fixed"):
            truth = float(y @ metric_weights(metric, 4))
            assert estimate_user(name, metric, 4, seen) == pytest.approx(truth, abs=1e-12)
        hit = estimate_user(name, "hit", 4, seen)
        assert (hit is None) == (spec.relevance is None)
        assert hit is None or hit == pytest.approx(1.0)
    # what a spec says it reads decides where it is undefined
    unjudged = {"u": ListLabels(np.ones(2), np.ones(2), np.array([np.nan, 0.5]), np.ones(2),
                                np.ones(2))}  # fmt: skip
    got = estimate(unjudged, ["precision@2"], draws=0)["precision@2"]
    assert {n for n, e in got.items() if e.value is None} == {
        n for n in ESTIMATORS if ESTIMATOR_SPECS.get(n).reads_p
    }
    with pytest.raises(ValueError, match="unknown estimator 'dmm'"):
        estimate(unjudged, ["precision@2"], ["dmm"], draws=0)
