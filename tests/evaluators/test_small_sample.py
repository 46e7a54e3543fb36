"""Gold-based intervals at the gold budget a team has (100-300 labels): issue 89, item 1.

A synthetic world with a known truth: users whose relevance shares a taste (labels cluster
by user), three systems, a judge that tracks relevance in part. The gold sample is drawn by
``gold sample``'s own code and read by ``ppi_run`` as ``evaluate --gold`` reads it.
"""

from __future__ import annotations

import numpy as np
import pytest

from recjudge.evaluators import GoldSample, listed_pairs, ppi_run
from recjudge.evaluators.offline._gold_ppi import MIN_CLASS_LABELS, MIN_USER_CLUSTERS
from recjudge.evaluators.offline._ppi import (
    clustered_ppi_mean,
    hall_interval,
    ppi_user_totals,
    satterthwaite_df,
    skewness,
)
from synthetic_world import gold, world

_world, _gold = world, gold


def test_users_design_at_200_gold_pairs_covers_where_the_tuned_normal_interval_did_not():
    """About 7 labelled users: the tuned-lambda z interval (the code before issue 89) covered
    ~79 %; lambda 1 with Satterthwaite's t covers ~90 %."""
    reps, old, new, refused = 70, [], [], 0
    for rep in range(reps):
        runs, users, rel, judged, truth = _world(rep)
        gold = _gold(runs, users, rel, 200, "users", rep)
        frame = len(listed_pairs(runs, users, 10))
        for run in runs:
            t = truth[run.name]
            try:
                e = ppi_run(run, users, judged, gold, "precision@10", frame)
            except ValueError as err:  # fewer than MIN_CLASS_LABELS of a class: no interval
                assert "of each class are needed" in str(err) or "one-class" in str(err)
                refused += 1
                continue
            new.append(e.ci[0] <= t <= e.ci[1])
            y, yp, cl = [], [], []
            for u in users:
                for i in run.rankings[u][:10]:
                    y.append(rel[(u, i)] if (u, i) in gold.labels else np.nan)
                    yp.append(judged[(u, i)][0])
                    cl.append(u)
            c = clustered_ppi_mean(y, yp, cl, quantile="normal")  # tuned lambda, z
            old.append(c["lo"] <= t <= c["hi"])
    assert np.mean(new) >= 0.86
    assert np.mean(new) - np.mean(old) >= 0.05
    assert refused < len(new) // 10


def test_intervals_at_100_gold_pairs_of_uniform_pairs_hold_or_are_refused():
    reps, covered, refused = 40, [], 0
    for rep in range(reps):
        runs, users, rel, judged, truth = _world(100 + rep)
        gold = _gold(runs, users, rel, 100, "uniform", rep)
        frame = len(listed_pairs(runs, users, 10))
        for run in runs:
            try:
                e = ppi_run(run, users, judged, gold, "precision@10", frame)
            except ValueError:
                refused += 1
                continue
            covered.append(e.ci[0] <= truth[run.name] <= e.ci[1])
            assert "t(" in e.note
    assert np.mean(covered) >= 0.85
    assert refused < reps * 3 // 2


def test_whole_users_below_the_cluster_floor_are_refused_with_how_many_more_to_label():
    """About 100 gold pairs of whole users are 3-4 users: the bench measured 87 % coverage
    there; the interval is refused and the message says how many users (and pairs) more."""
    runs, users, rel, judged, truth = _world(100)
    frame = len(listed_pairs(runs, users, 10))
    gold = _gold(runs, users, rel, 100, "users", 0)
    g = len({u for u, _ in gold.labels})
    assert g < MIN_USER_CLUSTERS
    with pytest.raises(ValueError, match=rf"gold labels of {g} users.*label "
                       rf"{MIN_USER_CLUSTERS - g} more users \(about \d+ pairs"):  # fmt: skip
        ppi_run(runs[0], users, judged, gold, "precision@10", frame)
    more = _gold(runs, users, rel, 300, "users", 0)  # ~10 users: an interval
    assert len({u for u, _ in more.labels}) >= MIN_USER_CLUSTERS
    e = ppi_run(runs[0], users, judged, more, "precision@10", frame)
    assert e.ci[0] < e.value < e.ci[1] and "lambda 1:" in e.note


def test_one_class_gold_in_a_runs_lists_is_refused_with_how_many_to_label():
    runs, users, rel, judged, _ = _world(7)
    frame = listed_pairs(runs, users, 10)
    ones = GoldSample({pair: 1 for pair in frame[:40]}, design="unknown")
    with pytest.raises(ValueError, match=r"labelled relevant \(1\).*label about \d+"):
        ppi_run(runs[0], users, judged, ones, "ndcg_fixed@10", len(frame))


def test_one_class_gold_counts_what_is_labelled_not_the_judges_rate():
    # 160 pairs all labelled 0 while the judge says ~half are relevant: the sample bounds
    # the relevant share below 3 / 160 (rule of three), so far more than 11 pairs are needed,
    # and the message counts the 160 already labelled
    runs, users, rel, judged, _ = _world(7)
    frame = listed_pairs(runs, users, 10)
    mine = [(u, i) for u in users for i in runs[0].rankings[u][:10]][:160]
    assert len(mine) == 160
    zeros = GoldSample(dict.fromkeys(mine, 0), design="unknown")
    loud = {key: (0.5, True) for key in judged}
    with pytest.raises(ValueError, match=r"all 160 gold pairs .* not relevant \(0\)") as err:
        ppi_run(runs[0], users, loud, zeros, "precision@10", len(frame))
    text = str(err.value)
    assert "rule of three" in text and "160 labelled now" in text
    more = int(text.split("label about ")[1].split(" more")[0])
    assert more + 160 >= 5 * 160 / 3  # 5 of a class whose share is below 3 / 160


def test_satterthwaite_df_is_n_minus_1_for_one_part_and_between_for_two():
    assert satterthwaite_df([(0.3, 8)]) == pytest.approx(7)
    df = satterthwaite_df([(0.3, 8), (0.01, 200)])
    assert 7 < df < 207
    assert satterthwaite_df([(0.0, 5)]) is None


def test_a_single_label_of_the_rarer_class_is_refused_with_how_many_to_label():
    runs, users, rel, judged, _ = _world(7)
    frame = listed_pairs(runs, users, 10)
    mine = [(u, i) for u in users[:8] for i in runs[0].rankings[u][:5]]
    one = GoldSample({pair: int(n == 0) for n, pair in enumerate(mine)}, design="unknown")
    assert MIN_CLASS_LABELS == 2
    with pytest.raises(ValueError, match=r"1 of its 40 gold pairs .* relevant \(1\).*label "
                       r"about (\d+)") as err:  # fmt: skip
        ppi_run(runs[0], users, judged, one, "precision@10", len(frame))
    # 5 of the rarer class at the sample's rate (1 in 40): more than the 40 it has
    assert "about 200 of its pairs hold 5" in str(err.value)
    assert "label about 160 more (40 labelled now" in str(err.value)
    two = GoldSample({pair: int(n < 2) for n, pair in enumerate(mine)}, design="unknown")
    e = ppi_run(runs[0], users, judged, two, "precision@10", len(frame))
    assert e.ci[0] < e.value < e.ci[1]


def test_halls_interval_is_the_symmetric_one_without_skewness_and_leans_with_it():
    from scipy.stats import t

    sym = hall_interval(0.3, 0.05, 0.0, 100, 0.05, df=9)
    q = t.ppf(0.975, 9)
    assert sym["lo"] == pytest.approx(0.3 - q * 0.05) and sym["hi"] == pytest.approx(0.3 + q * 0.05)
    right = hall_interval(0.3, 0.05, 4.0, 100, 0.05, df=9)
    assert right["hi"] - 0.3 > 0.3 - right["lo"] > 0  # longer on the side the skew points to
    left = hall_interval(0.3, 0.05, -4.0, 100, 0.05, df=9)
    assert left["lo"] == pytest.approx(0.6 - right["hi"]) and left["hi"] == pytest.approx(
        0.6 - right["lo"])  # fmt: skip
    g = np.random.default_rng(0)
    assert abs(skewness(g.normal(size=20_000))) < 0.1
    assert skewness(g.exponential(size=20_000)) == pytest.approx(2.0, abs=0.2)
    assert skewness(np.ones(10)) == 0.0


def test_rare_large_user_totals_are_covered_by_halls_interval_and_not_by_the_symmetric_one():
    """The pair designs' failure at a few hundred gold pairs: a handful of users hold a
    relevant gold pair, each weighted by ``w / pi``, so the users' totals are rare and large.
    The symmetric t interval misses from below (a sample with few such users has a low mean
    and a small spread); Hall's covers (measured: 84-86 % against 96 %)."""
    users, truth = 200, 0.03 * 10.0
    g = np.random.default_rng(5)
    hits = {False: [], True: []}
    for _ in range(1500):
        totals = (g.random(users) < 0.03) * g.exponential(10.0, users)
        if np.count_nonzero(totals) < MIN_CLASS_LABELS:
            continue
        zero = np.zeros(users)
        for skew in hits:
            e = ppi_user_totals(zero, totals, zero, lam=1.0, holders=users, skew=skew)
            hits[skew].append(e["lo"] <= truth <= e["hi"])
    assert np.mean(hits[False]) < 0.89
    assert np.mean(hits[True]) >= 0.93
