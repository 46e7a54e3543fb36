"""The one metrics module: nDCG from the ranks of held-out items (the CF evaluation's form)
is the list form's nDCG, ties between held-out items included."""

from __future__ import annotations

import numpy as np
import pytest

from recjudge._metrics import ndcg, ranking_metrics, rel_from_ranks


@pytest.mark.parametrize("seed", range(3))
def test_ndcg_from_ranks_is_the_sum_over_the_hits(seed):
    g = np.random.default_rng(seed)
    for _ in range(300):
        n, k = int(g.integers(1, 6)), int(g.integers(1, 25))
        ranks = g.integers(0, 30, n)  # repeats: held-out items tied at one rank
        hits = ranks[ranks < k]
        direct = np.sum(1 / np.log2(hits + 2)) / np.sum(1 / np.log2(np.arange(min(n, k)) + 2))
        assert ndcg(rel_from_ranks(ranks, k), n, k) == pytest.approx(direct, abs=1e-12)


def test_the_list_metrics_of_a_known_list():
    m = ranking_metrics([0, 1, 0, 1], 3, ks=(2, 4))
    assert m["p@2"] == 0.5 and m["recall@4"] == pytest.approx(2 / 3) and m["mrr"] == 0.5
    assert m["map@4"] == pytest.approx((1 / 2 + 2 / 4) / 3)
    assert m["ndcg@2"] == pytest.approx((1 / np.log2(3)) / (1 + 1 / np.log2(3)))
