"""Gold-based intervals at the gold budget a team has (100-300 labels): issue 89, item 1.

A synthetic world with a known truth: users whose relevance shares a taste (labels cluster
by user), three systems, a judge that tracks relevance in part. The gold sample is drawn by
``gold sample``'s own code and read by ``ppi_run`` as ``evaluate --gold`` reads it.
"""

from __future__ import annotations

import numpy as np
import pytest

from recjudge.evaluators import GoldSample, RecRun, RunCheck, listed_pairs, ppi_run, sample_gold
from recjudge.evaluators.offline._gold_ppi import MIN_USER_CLUSTERS
from recjudge.evaluators.offline._ppi import clustered_ppi_mean, satterthwaite_df


def _world(seed: int, n_users: int = 300, k: int = 10, items: int = 400):
    g = np.random.default_rng(seed)
    taste, quality = g.normal(0, 1, n_users), g.normal(0, 1, items)
    runs, rel, judged = [], {}, {}
    for s, effect in enumerate((-0.3, 0.0, 0.4)):
        lists = {}
        for u in range(n_users):
            pool = g.choice(items, k, replace=False)
            lists[str(u)] = [str(i) for i in pool]
            for i in pool:
                key = (str(u), str(i))
                if key not in rel:
                    z = -2.4 + taste[u] + 0.7 * quality[i] + effect
                    rel[key] = int(g.random() < 1 / (1 + np.exp(-z)))
                    judged[key] = (float(1 / (1 + np.exp(-(0.6 * z + g.normal())))), False)
        runs.append(RecRun(f"s{s}", "", lists, {}, RunCheck()))
    users = [str(u) for u in range(n_users)]
    truth = {r.name: float(np.mean([np.mean([rel[(u, i)] for i in r.rankings[u][:k]])
                                    for u in users])) for r in runs}  # fmt: skip
    return runs, users, rel, judged, truth


def _gold(runs, users, rel, n, design, seed):
    rows = sample_gold(runs, users, 10, n, design=design, seed=seed)
    keys = [(r["user_id"], r["item_id"]) for r in rows]
    return GoldSample({key: rel[key] for key in keys},
                      {key: float(r["inclusion_prob"]) for key, r in zip(keys, rows,
                                                                         strict=True)},
                      design=design)  # fmt: skip


def test_users_design_at_200_gold_pairs_covers_where_the_tuned_normal_interval_did_not():
    """About 7 labelled users: the tuned-lambda z interval (the code before issue 89) covered
    ~79 %; lambda 1 with Satterthwaite's t covers ~90 %."""
    reps, old, new = 70, [], []
    for rep in range(reps):
        runs, users, rel, judged, truth = _world(rep)
        gold = _gold(runs, users, rel, 200, "users", rep)
        frame = len(listed_pairs(runs, users, 10))
        for run in runs:
            t = truth[run.name]
            e = ppi_run(run, users, judged, gold, "precision@10", frame)
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


def test_satterthwaite_df_is_n_minus_1_for_one_part_and_between_for_two():
    assert satterthwaite_df([(0.3, 8)]) == pytest.approx(7)
    df = satterthwaite_df([(0.3, 8), (0.01, 200)])
    assert 7 < df < 207
    assert satterthwaite_df([(0.0, 5)]) is None
