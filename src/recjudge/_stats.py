"""Uncertainty of a comparison repeated over runs and paired on users.

Several experiments score the same users under every arm (a method, a summariser) and repeat
the whole scoring a few times (training seeds in ``brief-augment``, prediction runs with other
option samples in UserSumBench). A comparison of two arms is then paired twice: on the repeat
and on the user. Two intervals are given for each arm's mean and each difference of means,
arm ``a`` minus arm ``b``:

- **repeats**: the per-repeat values ``mean_u a_r(u) - mean_u b_r(u)`` and a Student-t
  interval over repeats (``seed_interval``); with three repeats t_{0.975, 2} = 4.30, so it is
  wide, and it ignores which users happened to be sampled.
- **users**: ``d(u) = mean_r (a_r(u) - b_r(u))`` per user, resampled with replacement (the
  same draws for every comparison and metric); a 95 % percentile interval of the mean of
  ``d``. The mean is linear in the users, so the percentile interval has no first-order bias.

The point estimate is the same for both: the mean over repeats of the per-repeat values.
Lowest layer: numpy and scipy only, so evaluators and benchmarks share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "auc",
    "arm_interval",
    "labelled_auc",
    "bootstrap_ci",
    "paired_comparisons",
    "paired_difference",
    "seed_interval",
    "user_draws",
    "verdict",
]

#: per arm: one [users, metrics] array per repeat (the same users, in the same order)
PerRepeat = Mapping[str, Sequence[np.ndarray]]


def seed_interval(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """Mean over repeats with a 95 % Student-t interval, mean +- t_{0.975, n-1} * sd / sqrt(n)
    (``None`` values are left out; fewer than two values: no interval)."""
    from scipy.stats import t

    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) == 0:
        return {"mean": None, "lo": None, "hi": None, "sd": None, "n": 0}
    mean = float(v.mean())
    if len(v) < 2:
        return {"mean": mean, "lo": None, "hi": None, "sd": None, "n": 1}
    sd = float(v.std(ddof=1))
    half = float(t.ppf(0.975, len(v) - 1) * sd / np.sqrt(len(v)))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "sd": sd, "n": int(len(v))}


def bootstrap_ci(draws: Any, point: Any = None, axis: int = 0) -> tuple[Any, Any]:
    """The one rule that turns bootstrap draws into a 95 % interval (every site uses it).

    Percentile interval (Efron & Tibshirani 1993, sec. 13.3): the 2.5th and 97.5th
    percentiles of the resampled statistic, numpy's linear interpolation. Given ``point``
    (the estimate on the full sample), the basic interval instead (Davison & Hinkley 1997,
    eq. 5.6): ``2 * point - q_97.5, 2 * point - q_2.5``, which corrects a statistic whose
    draws are biased away from it (a mean of absolute errors).

    Args:
        draws: the resampled statistic, [draws] or [draws, ...] (reduced along ``axis``);
            callers drop undefined draws first, since what "undefined" means is theirs.
        point: the full-sample estimate for the basic interval; None: percentile.
        axis: the draws' axis.

    Returns:
        ``(lo, hi)``: floats for 1-D draws, arrays otherwise; ``(None, None)`` when there
        is no draw.
    """
    d = np.asarray(draws, dtype=float)
    if d.size == 0:
        return None, None
    q_lo, q_hi = np.percentile(d, [2.5, 97.5], axis=axis)
    if point is not None:
        q_lo, q_hi = 2 * np.asarray(point) - q_hi, 2 * np.asarray(point) - q_lo
    if np.ndim(q_lo) == 0:
        return float(q_lo), float(q_hi)
    return q_lo, q_hi


def user_draws(n_users: int, draws: int, seed: int) -> np.ndarray:
    """[draws, users] indices of users resampled with replacement (shared by comparisons)."""
    return np.random.default_rng(seed).integers(0, n_users, (draws, n_users))


def _intervals(d: np.ndarray, metrics: Sequence[str], idx: np.ndarray) -> dict[str, Any]:
    """Per metric of ``d`` ([repeats, users, metrics]): estimate, per-repeat means, the
    t-interval over repeats and the user bootstrap interval over ``idx``."""
    per_repeat = d.mean(axis=1)  # [repeats, metrics]
    per_user = d.mean(axis=0)  # [users, metrics]
    boot = per_user[idx].mean(axis=1)  # [draws, metrics]
    lo, hi = bootstrap_ci(boot)
    out = {}
    for j, m in enumerate(metrics):
        t = seed_interval([float(v) for v in per_repeat[:, j]])
        out[m] = {
            "estimate": float(per_repeat[:, j].mean()),
            "per_repeat": [float(v) for v in per_repeat[:, j]],
            "repeats": {"lo": t["lo"], "hi": t["hi"]},
            "users": {"lo": float(lo[j]), "hi": float(hi[j])},
        }
    return out


def arm_interval(
    runs: PerRepeat, a: str, metrics: Sequence[str], idx: np.ndarray
) -> dict[str, dict[str, Any]]:
    """Per metric, arm ``a``'s mean with its repeat t-interval and user bootstrap interval
    (the user resamples ``idx``, [draws, users])."""
    return _intervals(np.stack(list(runs[a])), metrics, idx)


def paired_difference(
    runs: PerRepeat, a: str, b: str, metrics: Sequence[str], idx: np.ndarray
) -> dict[str, dict[str, Any]]:
    """Per metric, ``a`` minus ``b``: the estimate, the repeat t-interval and the user
    bootstrap interval from the user resamples ``idx`` ([draws, users]).

    Returns:
        ``{metric: {"estimate", "per_repeat", "repeats": {"lo", "hi"}, "users": {"lo", "hi"}}}``.
    """
    if len(runs[a]) != len(runs[b]):
        raise ValueError(f"{a!r} has {len(runs[a])} repeats, {b!r} has {len(runs[b])}")
    d = np.stack([x - y for x, y in zip(runs[a], runs[b], strict=True)])
    return _intervals(d, metrics, idx)


def paired_comparisons(
    runs: PerRepeat,
    metrics: Sequence[str],
    draws: int = 1000,
    seed: int = 0,
    baseline: str = "none",
    proposed: str = "brief",
) -> dict[str, Any]:
    """Every arm minus ``baseline``, and ``proposed`` minus every other arm, each with repeat
    and user intervals (``paired_difference``); one set of user resamples serves every
    comparison, so the comparisons are paired with each other too.

    Args:
        runs: per arm, one [users, metrics] array per repeat.
        metrics: the arrays' column names.
        draws: user bootstrap resamples.
        seed: resampling seed.
        baseline: the arm every other is compared with.
        proposed: the arm compared with every other (skipped when absent).

    Returns:
        ``{"draws", "users", "minus_<baseline>": {arm: cells}, "<proposed>_minus": {...}}``.
    """
    first = next(iter(runs.values()))
    n_users = first[0].shape[0]
    if any(a.shape != first[0].shape for arrs in runs.values() for a in arrs):
        raise ValueError("every arm and repeat must give [users, metrics] over the same users")
    idx = user_draws(n_users, draws, seed)
    out: dict[str, Any] = {"draws": draws, "users": n_users, "minus_" + baseline: {},
                           f"{proposed}_minus": {}}  # fmt: skip
    for m in runs:
        if m != baseline and baseline in runs:
            out["minus_" + baseline][m] = paired_difference(runs, m, baseline, metrics, idx)
    if proposed in runs:
        for m in runs:
            if m not in (proposed, baseline):
                out[f"{proposed}_minus"][m] = paired_difference(runs, proposed, m, metrics, idx)
    return out


def verdict(cell: Mapping[str, Any], interval: str = "users") -> str:
    """``better`` / ``worse`` when the interval excludes 0, else ``no difference shown``."""
    lo, hi = cell[interval]["lo"], cell[interval]["hi"]
    if lo is None or hi is None:
        return "no interval"
    if lo > 0:
        return "better"
    if hi < 0:
        return "worse"
    return "no difference shown"


def auc(pos: Sequence[float], neg: Sequence[float]) -> float | None:
    """P(score of a positive > score of a negative), ties counting one half (Mann-Whitney U
    over ``len(pos) * len(neg)``, from average ranks: O(n log n) time, O(n) memory); None
    when either side is empty."""
    from scipy.stats import rankdata

    p, n = np.asarray(pos, float), np.asarray(neg, float)
    if not len(p) or not len(n):
        return None
    ranks = rankdata(np.concatenate([p, n]))
    u = ranks[: len(p)].sum() - len(p) * (len(p) + 1) / 2
    return float(u / (len(p) * len(n)))


def labelled_auc(scores: Sequence[float], labels: Sequence[float]) -> float | None:
    """``auc`` of ``scores`` with the pairs labelled 1 (any label > 0) as positives and those
    labelled 0 as negatives; None when either class is absent."""
    s, y = np.asarray(scores, float), np.asarray(labels, float)
    return auc(s[y > 0], s[y == 0])


def bootstrap_ranks(boot: Any, point: Sequence[float]) -> list[dict[str, Any]]:
    """Per system (rows of ``boot``, [systems, draws] of a statistic over *shared*
    resamples), ``{"rank", "rank_ci"}``: its rank among the systems (1 = the largest
    ``point``) and the 95 % interval of its rank over the draws (2.5th and 97.5th
    percentiles, nearest rank): Hall and Miller, "Using the bootstrap to quantify the
    authority of an empirical ranking", Annals of Statistics 2009. A rank interval
    ``[1, 1]`` says the system is first in at least 97.5 % of the resamples."""
    b = np.asarray(boot, dtype=float)
    ranks = (-b).argsort(axis=0).argsort(axis=0) + 1
    first = (-np.asarray(point, dtype=float)).argsort(kind="stable").argsort() + 1
    out = []
    for j in range(len(b)):
        lo, hi = np.percentile(ranks[j], [2.5, 97.5], method="nearest")
        out.append({"rank": int(first[j]), "rank_ci": [int(lo), int(hi)]})
    return out
