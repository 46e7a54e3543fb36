"""The one discounted-gain definition every ranking metric here uses (lowest layer: numpy
only, so cf_models, evaluators and benchmarks share it).

``discount(n)[i] = 1 / log2(i + 2)``: the gain of rank ``i + 1`` (Jarvelin & Kekalainen,
2002, as trec_eval and ranx compute it). ``ndcg`` is binary-relevance nDCG@k:
``DCG@k / IDCG@k`` with ``DCG@k = sum_{i<k} rel_i discount_i`` and ``IDCG@k`` the DCG of
``min(k, n_relevant)`` relevant items at the top (0 when nothing is relevant).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["discount", "ndcg"]


def discount(n: int) -> np.ndarray:
    """``1 / log2(rank + 1)`` for ranks ``1 .. n``."""
    return 1.0 / np.log2(np.arange(2, n + 2, dtype=float))


def ndcg(rel: Sequence[float], n_relevant: int, k: int) -> float:
    """Binary-relevance nDCG@k of one ranked list (``rel[i]``: relevance at rank ``i + 1``;
    ``n_relevant``: relevant items overall, for the ideal list)."""
    top = np.asarray(rel, dtype=float)[:k]
    ideal = discount(min(k, n_relevant)).sum() if n_relevant > 0 else 0.0
    return float((top * discount(len(top))).sum() / ideal) if ideal else 0.0
