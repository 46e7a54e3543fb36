"""Uncertainty for the BRIEF ratings table: per-level CIs and paired comparisons of two reward
settings on the same pairs (issue 23: a difference is claimed only when its CI excludes 0)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from recjudge._stats import auc as _auc
from recjudge._stats import bootstrap_ci
from recjudge._util import rng

__all__ = ["auc", "level_ci", "setting_difference", "spearman_or_none"]


def level_ci(
    levels: Sequence[int], positive: Sequence[float], bootstrap: int, seed: Any
) -> dict[int, dict[str, float | int]]:
    """Per rating level: % positive with a percentile bootstrap 95 % CI.

    ``positive`` is 1/0 per pair (greedy read-out) or the share of YES samples (sampled
    decoding); a level's pairs are resampled with replacement, as many as it holds.

    Returns:
        ``{level: {"pct", "lo", "hi", "n"}}`` in percent, levels in ascending order.
    """
    by: dict[int, list[float]] = {}
    for lvl, v in zip(levels, positive, strict=True):
        by.setdefault(int(lvl), []).append(float(v))
    out = {}
    for lvl in sorted(by):
        v = np.asarray(by[lvl])
        g = rng("level-ci", seed, lvl)
        boots = (
            [float(v[g.integers(len(v), size=len(v))].mean()) for _ in range(bootstrap)]
            if bootstrap
            else [float(v.mean())]
        )
        lo, hi = bootstrap_ci(boots)
        out[lvl] = {
            "pct": 100.0 * float(v.mean()),
            "lo": 100.0 * float(lo),
            "hi": 100.0 * float(hi),
            "n": len(v),
        }
    return out


def spearman_or_none(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman rho, or None where it is undefined (fewer than 3 pairs, a constant side)."""
    from scipy.stats import spearmanr

    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def auc(pos: Sequence[float], neg: Sequence[float]) -> float | None:
    """P(score of a positive > score of a negative), ties count one half: ``_stats.auc``."""
    return _auc(pos, neg)


def _summary(point: float | None, boots: list[float]) -> dict[str, float | int | None]:
    """The difference, its percentile 95 % CI and a two-sided bootstrap p-value
    (2 x the smaller share of resampled differences on either side of 0, at most 1)."""
    if point is None or not boots:
        return {"diff": point, "lo": None, "hi": None, "p": None, "n_boot": len(boots)}
    b = np.asarray(boots)
    lo, hi = bootstrap_ci(b)
    p = min(1.0, 2.0 * min(float((b <= 0).mean()), float((b >= 0).mean())))
    return {"diff": point, "lo": float(lo), "hi": float(hi), "p": p, "n_boot": len(boots)}


def setting_difference(
    a: Mapping[str, Sequence[float]],
    b: Mapping[str, Sequence[float]],
    ratings: Sequence[float],
    labels: Sequence[int],
    bootstrap: int,
    seed: Any,
) -> dict[str, dict[str, float | int | None]]:
    """Setting A minus setting B on the same pairs, with a paired bootstrap.

    Pair Spearman: rho(p_yes_A, rating) - rho(p_yes_B, rating) over the held-out rating pairs;
    each resample draws pair indices once and uses them for both settings, so what the two
    settings share (the pairs' difficulty) cancels. Relevance AUC: AUC_A - AUC_B with
    positives and negatives resampled apart (as ``auc_ci``), again the same draw for both.

    Args:
        a: ``{"rating": p_yes per rating pair, "relevance": p_yes per relevance pair}``.
        b: the same for setting B.
        ratings: the held-out rating of each rating pair.
        labels: 1 (held-out future item) / 0 (never-rated item) per relevance pair.
        bootstrap: resamples.
        seed: any hashable seed material.

    Returns:
        ``{"pair_spearman": {...}, "relevance_auc": {...}}``, each with ``diff``, ``lo``,
        ``hi``, ``p`` (None where a measure is undefined, e.g. a constant score).
    """
    ra, rb = np.asarray(a["rating"], float), np.asarray(b["rating"], float)
    y = np.asarray(ratings, float)
    lab = np.asarray(labels, int)
    qa, qb = np.asarray(a["relevance"], float), np.asarray(b["relevance"], float)
    pa, na, pb, nb = qa[lab == 1], qa[lab == 0], qb[lab == 1], qb[lab == 0]

    def sp_diff(i: np.ndarray) -> float | None:
        x1, x2 = spearman_or_none(ra[i], y[i]), spearman_or_none(rb[i], y[i])
        return None if x1 is None or x2 is None else x1 - x2

    def auc_diff(i: np.ndarray, j: np.ndarray) -> float | None:
        x1, x2 = auc(pa[i], na[j]), auc(pb[i], nb[j])
        return None if x1 is None or x2 is None else x1 - x2

    g = rng("paired-diff", seed)
    sp_boots, auc_boots = [], []
    for _ in range(bootstrap):
        d = sp_diff(g.integers(len(y), size=len(y))) if len(y) else None
        if d is not None:
            sp_boots.append(d)
        if len(pa) and len(na):
            d = auc_diff(g.integers(len(pa), size=len(pa)), g.integers(len(na), size=len(na)))
            if d is not None:
                auc_boots.append(d)
    every_pair = np.arange(len(y))
    return {
        "pair_spearman": _summary(sp_diff(every_pair) if len(y) else None, sp_boots),
        "relevance_auc": _summary(auc_diff(np.arange(len(pa)), np.arange(len(na))), auc_boots),
    }
