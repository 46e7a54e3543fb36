"""Uncertainty of ``brief-offline``'s gaps from the users: a paired bootstrap over users.

The t-interval over logging seeds (``_offline.seed_interval``) measures how much the gap
moves with the simulated log; with three seeds it is wide (t_{0.975, 2} = 4.30). The sample
of users is the other source of noise, and the comparison that matters is paired: do two
methods' gaps differ on the *same* users and logs? Each resample draws users with
replacement within every logging seed (independently per seed), recomputes every system's
mean metrics under every truth, and from them every method's gap, averaged over seeds like
the point estimate. The same draw serves every method, so a difference of two methods' gaps
has its own interval.

The intervals are *basic* bootstrap intervals, (2 theta - q_97.5, 2 theta - q_2.5) with q the
quantiles of the resampled statistic (Davison & Hinkley, 1997, eq. 5.6), not percentile ones:
a gap is a mean absolute error of lifts, which resampling noise inflates (every draw's
|offline lift - online lift| picks up noise on both sides), so the resampled gaps sit above
the estimate and a percentile interval would be shifted up by that bias; the basic interval
reflects the draws around the estimate and removes it to first order.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from recjudge._stats import bootstrap_ci

#: per truth ("online", "logged", "cf", "judge:<mode>"), per system: [users, metrics]
PerUser = Mapping[str, Mapping[str, np.ndarray]]


def _lifts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """100 (b - a) / a elementwise, NaN where a = 0 (``_offline.lift``'s None)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a == 0, np.nan, 100.0 * (b - a) / np.where(a == 0, 1.0, a))


def mean_gap_draws(
    per_user: PerUser, systems: Sequence[str], keep: np.ndarray, idx: np.ndarray
) -> dict[str, np.ndarray]:
    """Each offline method's mean gap under each row of user indices ``idx`` ([draws, users]).

    Per metric k (``keep``: the metrics in the gap, recall excluded): gap_k = mean over
    system pairs (a, b) of |lift_offline(a, b) - lift_online(a, b)|, pairs with an undefined
    lift skipped; the mean gap is the mean of gap_k over the metrics where it is defined.
    With ``idx = arange(users)[None]`` this is ``_offline.gap``'s point estimate.
    """
    means = {t: {s: a[idx].mean(axis=1) for s, a in d.items()} for t, d in per_user.items()}
    online = means["online"]
    out = {}
    for truth, m in means.items():
        if truth == "online":
            continue
        errs = np.stack(
            [
                np.abs(_lifts(m[a], m[b]) - _lifts(online[a], online[b]))
                for a, b in itertools.combinations(systems, 2)
            ]
        )  # [pairs, draws, metrics]
        with warnings.catch_warnings():  # an all-undefined metric is NaN, as None is
            warnings.simplefilter("ignore", RuntimeWarning)
            out[truth] = np.nanmean(np.nanmean(errs, axis=0)[:, keep], axis=1)
    return out


def gap_intervals(
    per_seed: Sequence[PerUser],
    systems: Sequence[str],
    metrics: Sequence[str],
    draws: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Mean gap per method over seeds, with 95 % basic intervals from resampling users
    within each seed, and the paired differences: every imputer minus ``logged`` (below 0:
    imputing moved offline lifts towards online ones) and ``judge:brief`` minus every other
    imputer (below 0: BRIEF closer than it). Each difference also carries its sign per seed.

    Args:
        per_seed: one ``PerUser`` per logging seed (its own users).
        systems: the recommenders compared pairwise.
        metrics: the metric names of the per-user arrays' columns.
        draws: bootstrap resamples.
        seed: resampling seed.
    """
    keep = np.array([not k.startswith("recall@") for k in metrics])
    g = np.random.default_rng(seed)
    point_seed, boot_seed = [], []
    for pu in per_seed:
        n = len(next(iter(pu["online"].values())))
        point_seed.append(mean_gap_draws(pu, systems, keep, np.arange(n)[None]))
        boot_seed.append(mean_gap_draws(pu, systems, keep, g.integers(0, n, (draws, n))))
    methods = list(point_seed[0])

    def over_seeds(per: list[dict[str, np.ndarray]], m: str) -> np.ndarray:
        return np.mean([p[m] for p in per], axis=0)

    def cell(point: float, boot: np.ndarray, signs: list[float]) -> dict[str, Any]:
        ok = boot[np.isfinite(boot)]
        lo, hi = bootstrap_ci(ok, point=point)  # the basic interval: see the module doc
        lo, hi = (np.nan, np.nan) if lo is None else (lo, hi)
        return {
            "estimate": _num(point),
            "lo": _num(lo),
            "hi": _num(hi),
            "per_seed": [_num(v) for v in signs],
        }

    out: dict[str, Any] = {"draws": draws, "mean_gap": {}, "minus_logged": {}, "brief_minus": {}}
    for m in methods:
        point = [float(p[m][0]) for p in point_seed]
        out["mean_gap"][m] = cell(float(np.mean(point)), over_seeds(boot_seed, m), point)
    for a, b, key in [(m, "logged", "minus_logged") for m in methods if m != "logged"] + [
        ("judge:brief", m, "brief_minus")
        for m in methods
        if "judge:brief" in methods and m not in ("judge:brief", "logged")
    ]:
        diffs = [float(p[a][0] - p[b][0]) for p in point_seed]
        boot = over_seeds(boot_seed, a) - over_seeds(boot_seed, b)
        out[key][a if key == "minus_logged" else b] = cell(float(np.mean(diffs)), boot, diffs)
    return out


def _num(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None
