"""Uncertainty of ``brief-augment``'s comparisons: over seeds and over the augmented users.

Every method retrains the same recommenders on the same augmented users under the same seeds,
so a comparison of two methods is paired twice: on the seed (model initialisation, the random
method's draw) and on the user (the same future items are scored). Two intervals are given
for each difference of a metric's mean, method ``a`` minus method ``b``:

- **seeds**: the per-seed differences ``mean_u a_s(u) - mean_u b_s(u)`` and a Student-t
  interval over seeds (``_offline.seed_interval``); with three seeds, t_{0.975, 2} = 4.30, so
  it is wide, and it ignores which users happened to be augmented.
- **users**: ``d(u) = mean_s (a_s(u) - b_s(u))`` per user, resampled with replacement (the
  same draws for every comparison and metric); a 95 % percentile interval of the mean of
  ``d``. The mean is linear in the users, so the percentile interval has no first-order bias
  (unlike the offline gaps' absolute errors, ``_offline_stats``).

The point estimate is the same for both: the mean over seeds of the per-seed differences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: per method: one [users, metrics] array per seed (the same users, in the same order)
PerSeed = Mapping[str, Sequence[np.ndarray]]


def _diffs(runs: PerSeed, a: str, b: str) -> np.ndarray:
    """[seeds, users, metrics]: method ``a`` minus method ``b`` per seed and user."""
    if len(runs[a]) != len(runs[b]):
        raise ValueError(f"{a!r} has {len(runs[a])} seeds, {b!r} has {len(runs[b])}")
    return np.stack([x - y for x, y in zip(runs[a], runs[b], strict=True)])


def paired_difference(
    runs: PerSeed, a: str, b: str, metrics: Sequence[str], idx: np.ndarray
) -> dict[str, dict[str, Any]]:
    """Per metric, ``a`` minus ``b``: the estimate, the seed t-interval and the user
    bootstrap interval from the user resamples ``idx`` ([draws, users]).

    Returns:
        ``{metric: {"estimate", "per_seed", "seeds": {"lo", "hi"}, "users": {"lo", "hi"}}}``.
    """
    from recjudge.bench._offline import seed_interval

    d = _diffs(runs, a, b)
    per_seed = d.mean(axis=1)  # [seeds, metrics]
    per_user = d.mean(axis=0)  # [users, metrics]
    boot = per_user[idx].mean(axis=1)  # [draws, metrics]
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    out = {}
    for j, m in enumerate(metrics):
        t = seed_interval([float(v) for v in per_seed[:, j]])
        out[m] = {
            "estimate": float(per_seed[:, j].mean()),
            "per_seed": [float(v) for v in per_seed[:, j]],
            "seeds": {"lo": t["lo"], "hi": t["hi"]},
            "users": {"lo": float(lo[j]), "hi": float(hi[j])},
        }
    return out


def augment_comparisons(
    runs: PerSeed,
    metrics: Sequence[str],
    draws: int = 1000,
    seed: int = 0,
    baseline: str = "none",
    proposed: str = "brief",
) -> dict[str, Any]:
    """Every method minus ``baseline`` (no augmentation), and ``proposed`` minus every other
    method, each with seed and user intervals (``paired_difference``); one set of user
    resamples serves every comparison, so the comparisons are paired with each other too.

    Args:
        runs: per method, one [users, metrics] array per seed.
        metrics: the arrays' column names.
        draws: user bootstrap resamples.
        seed: resampling seed.
        baseline: the method every other is compared with.
        proposed: the method compared with every other (skipped when absent).
    """
    first = next(iter(runs.values()))
    n_users = first[0].shape[0]
    if any(a.shape != first[0].shape for arrs in runs.values() for a in arrs):
        raise ValueError("every method and seed must give [users, metrics] over the same users")
    idx = np.random.default_rng(seed).integers(0, n_users, (draws, n_users))
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
