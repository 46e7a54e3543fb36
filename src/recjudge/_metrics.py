"""The ranking metrics every layer uses, one function per formula (lowest layer: numpy only,
so cf_models, evaluators and benchmarks share them; cross-checked against ranx in tests).

``discount(n)[i] = 1 / log2(i + 2)``: the gain of rank ``i + 1`` (Jarvelin & Kekalainen,
2002, as trec_eval and ranx compute it). ``ndcg`` is binary-relevance nDCG@k:
``DCG@k / IDCG@k`` with ``DCG@k = sum_{i<k} rel_i discount_i`` and ``IDCG@k`` the DCG of
``min(k, n_relevant)`` relevant items at the top (0 when nothing is relevant).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["discount", "ndcg", "ranking_metrics", "rel_from_ranks"]


def discount(n: int) -> np.ndarray:
    """``1 / log2(rank + 1)`` for ranks ``1 .. n``."""
    return 1.0 / np.log2(np.arange(2, n + 2, dtype=float))


def ndcg(rel: Sequence[float], n_relevant: int, k: int) -> float:
    """Binary-relevance nDCG@k of one ranked list (``rel[i]``: relevance at rank ``i + 1``;
    ``n_relevant``: relevant items overall, for the ideal list)."""
    top = np.asarray(rel, dtype=float)[:k]
    ideal = discount(min(k, n_relevant)).sum() if n_relevant > 0 else 0.0
    return float((top * discount(len(top))).sum() / ideal) if ideal else 0.0


def rel_from_ranks(ranks: Sequence[int], k: int) -> np.ndarray:
    """The relevance vector of a list's top ``k`` from the 0-based ranks of the relevant
    items (two relevant items tied at one rank count twice there, as a sum over them does)."""
    rel = np.zeros(k)
    r = np.asarray(ranks, dtype=int)
    np.add.at(rel, r[r < k], 1.0)
    return rel


def ranking_metrics(
    rel: Sequence[int], n_relevant: int, ks: Sequence[int] = (10, 20)
) -> dict[str, float]:
    """Binary-relevance metrics of one ranked list.

    ``rel[i]`` is 1 if the item at rank i+1 is relevant; ``n_relevant`` is the number of
    relevant items overall (for MAP's normaliser).
    P@k = hits@k / k; Recall@k = hits@k / n_relevant; HitRate@k = 1[hits@k > 0];
    nDCG@k = ``ndcg`` (the ideal list as long as this one: a list shorter than k cannot hold
    more); MAP@k = sum_{i<=k} P@i rel_i / n_relevant (the trec_eval / ranx convention);
    MRR = 1 / rank of the first relevant item in the list (0 if none).
    """
    r = np.asarray(rel, dtype=float)
    out = {}
    for k in ks:
        top = r[:k]
        hits = top.sum()
        prec_at = np.cumsum(top) / np.arange(1, len(top) + 1)
        out[f"p@{k}"] = float(hits / k)
        out[f"recall@{k}"] = float(hits / n_relevant) if n_relevant else 0.0
        out[f"hit_rate@{k}"] = float(hits > 0)
        out[f"ndcg@{k}"] = ndcg(top, min(n_relevant, len(top)), k)
        out[f"map@{k}"] = float((prec_at * top).sum() / n_relevant) if n_relevant else 0.0
    first = np.flatnonzero(r)
    out["mrr"] = float(1.0 / (first[0] + 1)) if len(first) else 0.0
    return out
