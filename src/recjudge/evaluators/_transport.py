"""Does the calibration transport to every system? A per-system check of its residuals.

A calibration (isotonic map or supervised imputer) is fitted on the gold pairs of every system
pooled and then applied to each system's pairs. When the judge is more lenient with one system
than with the others (the circular case in a milder form: its sigma favours that system's
items), the pooled map is right on average and wrong for that system: its calibrated level (DM,
DR's model part) is biased and no interval shows it. CJE (arXiv 2512.11150) runs a transport
test per policy and refuses a level claim where it fails; this is that test for a mean:

for system ``s`` with gold pairs ``(u, i)`` in its top-k lists, residuals
``e = Y - p_cal``; per user ``E_u = sum e`` and ``n_u`` pairs;
``mean = sum E_u / sum n_u``, cluster-robust standard error
``se = sqrt(G / (G - 1) * sum_u (E_u - mean n_u)^2) / sum n_u`` over the ``G`` users
(CR1, Cameron and Miller 2015), and ``t = mean / se`` against Student's t with ``G - 1``
degrees of freedom. A system fails when the two-sided p-value is below ``alpha`` (0.05); its
calibrated level is refused (the report says why), while PPI, which rectifies each system with
its own gold pairs, and the differences between systems stay.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MIN_TRANSPORT_USERS", "refuse_levels", "transport_check"]

#: fewest users holding a system's gold pairs for the test to say anything (fewer: untested)
MIN_TRANSPORT_USERS = 3


def transport_check(
    runs: Sequence[Any],
    users: Sequence[str],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    gold: Mapping[tuple[str, str], int],
    k: int,
    alpha: float = 0.05,
) -> dict[str, dict[str, Any]]:
    """Per run, the calibration's mean residual on its gold pairs with its ``1 - alpha``
    interval,
    the test's p-value and the verdict (``ok``, ``fails`` or ``untested``; module docstring).

    Args:
        judged: the calibrated probability per pair (``p`` first).
        gold: labels per (user, item).
    """
    from scipy.stats import t as student

    out = {}
    for run in runs:
        sums: dict[str, list[float]] = {}
        for u in users:
            for i in run.rankings.get(u, [])[:k]:
                if (u, i) in gold and (u, i) in judged:
                    cell = sums.setdefault(u, [0.0, 0.0])
                    cell[0] += gold[(u, i)] - judged[(u, i)][0]
                    cell[1] += 1
        g = len(sums)
        n = sum(c[1] for c in sums.values())
        if g < MIN_TRANSPORT_USERS:
            out[run.name] = {"verdict": "untested", "gold_pairs": int(n), "users": g,
                             "mean_residual": None, "ci": None, "p": None}  # fmt: skip
            continue
        mean = sum(c[0] for c in sums.values()) / n
        var = g / (g - 1) * sum((c[0] - mean * c[1]) ** 2 for c in sums.values())
        se = math.sqrt(var) / n
        q = float(student.ppf(1 - alpha / 2, g - 1))
        # no spread at all: fails unless the residuals are exactly 0
        p = float(2 * student.sf(abs(mean / se), g - 1)) if se > 0 else float(mean == 0)
        out[run.name] = {"verdict": "fails" if p < alpha else "ok", "gold_pairs": int(n),
                         "users": g, "mean_residual": mean,
                         "ci": [mean - q * se, mean + q * se], "p": p}  # fmt: skip
    return out


def refuse_levels(systems: Mapping[str, Any], check: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse ``dm`` and ``dr`` (the calibrated level) of every system whose check fails, in
    place: value and interval None, the note saying why."""
    for name, d in check.items():
        if d["verdict"] != "fails":
            continue
        lo, hi = d["ci"]
        why = (f"the calibration does not transport to {name}: its mean residual on "
               f"{d['gold_pairs']} gold pairs of {d['users']} users is {d['mean_residual']:+.3f} "
               f"[{lo:+.3f}, {hi:+.3f}] (p = {d['p']:.3g}); its calibrated level is refused "
               "(PPI, which rectifies it with its own gold pairs, stands)")  # fmt: skip
        for by_est in systems.get(name, {}).values():
            for est in ("dm", "dr"):
                if est in by_est:
                    by_est[est] = {**by_est[est], "value": None, "ci": None, "note": why,
                                   "rank": None, "rank_ci": None}  # fmt: skip
