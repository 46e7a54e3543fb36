"""Observation propensities for the estimators (``_estimators``): from a file, a power
law of the logged counts, or fitted to the log (``propensities_from``, ``fit_propensities``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recjudge.data import DataError, read_table


@dataclass(frozen=True)
class Propensities:
    """Observation propensities and how they were obtained (for the report header).

    Attributes:
        model: ``file``, ``powerlaw``, ``fit`` or ``empirical``.
        describe: one line for the report header.
        per_item / per_pair: theta by item, and by (user, item) (a pair wins over its item).
        default: theta of an item neither table holds (None: such an item is an error).
        clip: the floor theta is clipped to.
        source: the file they came from (named in errors).
        fit: for ``fit``, the fitted parameters and the fit per popularity quintile.
    """

    model: str
    describe: str
    per_item: Mapping[str, float]
    per_pair: Mapping[tuple[str, str], float] = field(default_factory=dict)
    default: float | None = None
    clip: float = 0.01
    source: str = ""
    fit: Mapping[str, Any] | None = None

    def of(self, user: str, item: str) -> tuple[float, bool]:
        """(theta clipped to ``[clip, 1]``, whether clipping raised it).

        Raises:
            DataError: no propensity for the pair or its item, and no default.
        """
        theta = self.per_pair.get((user, item))
        if theta is None:
            theta = self.per_item.get(item, self.default)
        if theta is None:
            raise DataError(
                f"no propensity for user {user!r}, item {item!r}, which an evaluated run lists.",
                source=self.source or self.model,
                fix="give every listed item (or pair) a propensity row, or use "
                "--propensities powerlaw:EXP",
            )
        return (max(theta, self.clip), theta < self.clip)


def powerlaw_propensities(
    log_counts: Mapping[str, int],
    n_users: int,
    n_observed: int,
    exponent: float = 0.5,
    clip: float = 0.01,
) -> Propensities:
    """Propensities from item popularity, after Yang et al. (RecSys 2018):
    ``theta_i = c * n_i ** exponent``, with ``n_i`` the item's count in the log (at least 1)
    and ``c`` chosen so that the expected number of observations over every user-item pair
    equals the observed number, ``c = n_observed / (n_users * sum_i n_i ** exponent)``;
    capped at 1, floored at ``clip``.
    """
    if exponent < 0:
        raise ValueError("the power-law exponent must be >= 0")
    if n_users < 1 or n_observed < 1 or not log_counts:
        raise ValueError("power-law propensities need a log with at least one observation")
    base = {i: max(int(n), 1) ** exponent for i, n in log_counts.items()}
    c = n_observed / (n_users * sum(base.values()))
    per_item = {i: min(1.0, c * b) for i, b in base.items()}
    unseen = min(1.0, c * 1.0)  # an item the log never holds: as if seen once
    return Propensities(
        "powerlaw",
        f"power law of item popularity (Yang et al. 2018): theta_i = c * n_i^{exponent:g}, "
        f"c = {c:.3g} (expected observations = {n_observed}); clipped at {clip:g}",
        per_item,
        default=unseen,
        clip=clip,
    )


def read_propensities(path: str | Path, clip: float = 0.01) -> Propensities:
    """Propensities from a CSV/JSONL/Parquet file with ``item_id, propensity`` (per item) or
    ``user_id, item_id, propensity`` (per pair).

    Raises:
        DataError: a missing file or column, or a propensity that is not a number in (0, 1]
            (names the file and row).
    """
    path = Path(path)
    fix = "write item_id,propensity (or user_id,item_id,propensity) rows with 0 < propensity <= 1"
    if not path.is_file():
        raise DataError("no such propensity file.", source=str(path), fix=fix)
    df = read_table(path)
    for col in ("item_id", "propensity"):
        if col not in df.columns:
            raise DataError(f"no {col} column; found {list(df.columns)}.", source=str(path),
                            field=col, fix=fix)  # fmt: skip
    theta = pd.to_numeric(df["propensity"], errors="coerce")
    bad = theta.isna() | ~np.isfinite(theta) | (theta <= 0) | (theta > 1)
    if bad.any():
        r = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(
            f"propensity {df['propensity'].iloc[r]!r} is not a probability in (0, 1] "
            f"({int(bad.sum())} row(s)); a propensity of 0 means the pair could never be "
            "logged, and no estimator can weight it.",
            source=str(path),
            row=r + 1,
            field="propensity",
            fix=fix,
        )
    items = df["item_id"].astype(str)
    keys = (df["user_id"].astype(str) + "\t" + items) if "user_id" in df.columns else items
    dup = keys.duplicated(keep="first")
    if dup.any():
        r = int(np.flatnonzero(dup.to_numpy())[0])
        raise DataError(
            f"{'pair' if 'user_id' in df.columns else 'item'} {keys.iloc[r]!r} is given "
            f"twice ({int(dup.sum())} repeated row(s)); which propensity holds is ambiguous.",
            source=str(path), row=r + 1, field="item_id",
            fix="keep one row per item (or per user_id,item_id)",
        )  # fmt: skip
    if "user_id" in df.columns:
        pairs = dict(zip(zip(df["user_id"].astype(str), items, strict=True),
                         theta.astype(float), strict=True))  # fmt: skip
        return Propensities("file", f"from {path.name} (per user-item); clipped at {clip:g}",
                            {}, pairs, clip=clip, source=str(path))  # fmt: skip
    return Propensities("file", f"from {path.name} (per item); clipped at {clip:g}",
                        dict(zip(items, theta.astype(float), strict=True)), clip=clip,
                        source=str(path))  # fmt: skip


def logged_counts(logged: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Per item, the number of users with a logged label for it (observed, whatever the
    label)."""
    counts: dict[str, int] = {}
    for labels in logged.values():
        for i in labels:
            counts[i] = counts.get(i, 0) + 1
    return counts


def logged_propensities(logged: Mapping[str, Mapping[str, int]], exponent: float,
                        clip: float) -> Propensities:  # fmt: skip
    """``powerlaw_propensities`` estimated from the logged labels themselves: an item's count
    is the number of users with a logged label for it."""
    counts = logged_counts(logged)
    n_obs = sum(counts.values())
    return powerlaw_propensities(counts, max(len(logged), 1), max(n_obs, 1), exponent, clip)


def propensities_from(
    spec: str,
    logged: Mapping[str, Mapping[str, int]],
    clip: float,
    popularity: Mapping[str, int] | None = None,
) -> Propensities:
    """``fit`` (``fit_propensities``: a power law of ``popularity`` fitted to ``logged``),
    ``powerlaw:EXP`` (a fixed exponent of the logged counts) or a propensity file's path.

    Raises:
        ValueError / DataError: a malformed ``powerlaw:`` spec (an exponent that is not a
            finite number in [0, 10]), or a bad file.
    """
    kind, _, arg = spec.partition(":")
    if kind == "fit" and not arg:
        return fit_propensities(logged, popularity, clip)
    if kind != "powerlaw":
        return read_propensities(spec, clip)
    fix = "write powerlaw:EXP with 0 <= EXP <= 10 (e.g. powerlaw:0.5), or --propensities fit"
    try:
        exponent = float(arg or 0.5)
    except ValueError:
        raise ValueError(f"--propensities {spec}: {fix}") from None
    if not (math.isfinite(exponent) and 0.0 <= exponent <= 10.0):
        raise ValueError(f"--propensities {spec}: the exponent {exponent:g} is not a finite "
                         f"number in [0, 10]; {fix}")  # fmt: skip
    return logged_propensities(logged, exponent, clip)


#: fewest users whose log a popularity power law is fitted to without a warning (with 1-5
#: users the fitted exponent ranged 0.63-1.09 against a truth of 1, and one user made SNIPS
#: exactly 1.0 [1.0, 1.0])
MIN_FIT_USERS = 20


def _exponent_se(nll: Callable[[np.ndarray], float], at: np.ndarray) -> float | None:
    """The standard error of the fitted exponent: the inverse of the negative log-
    likelihood's Hessian at the optimum (central differences), its ``[1, 1]`` entry; None
    when the Hessian is not positive definite (the optimum on a bound)."""
    h = 1e-4
    hess = np.empty((2, 2))
    for i in range(2):
        for j in range(2):
            e_i, e_j = np.eye(2)[i] * h, np.eye(2)[j] * h
            hess[i, j] = (nll(at + e_i + e_j) - nll(at + e_i - e_j) - nll(at - e_i + e_j)
                          + nll(at - e_i - e_j)) / (4 * h * h)  # fmt: skip
    try:
        cov = np.linalg.inv(hess)
    except np.linalg.LinAlgError:
        return None
    return (
        float(math.sqrt(cov[1, 1]))
        if cov[1, 1] > 0 and np.all(np.linalg.eigvalsh(hess) > 0)
        else None
    )


def fit_propensities(
    logged: Mapping[str, Mapping[str, int]],
    popularity: Mapping[str, int] | None,
    clip: float = 0.01,
) -> Propensities:
    """Item propensities fitted to the log by maximum likelihood.

    The log says, for each of the ``U`` evaluation users and each item ``i``, whether the
    pair was observed (``n_i`` users hold a logged label for ``i``). Model: ``O_ui ~
    Bernoulli(theta_i)``, ``theta_i = min(1, c * (m_i + 1)^a)`` with ``m_i`` the item's count
    in the training data (``popularity``, which ``impute`` records; it does not look at the
    held-out labels), after Yang et al. (RecSys 2018), whose exposure is a power law of
    popularity; ``(c, a)`` maximise ``sum_i n_i log theta_i + (U - n_i) log(1 - theta_i)``
    over every item of the training data and the log (L-BFGS-B, ``a`` in [0, 5]). The fit is
    reported per popularity quintile (observed vs predicted observation rate), beside the
    fixed exponent 0.5's likelihood.

    Without ``popularity`` the covariate is the logged count itself, for which the maximum is
    the empirical rate ``theta_i = n_i / U`` (exponent 1), used as it is.
    """
    from scipy.optimize import minimize

    users = max(len(logged), 1)
    counts = logged_counts(logged)
    if not counts:
        raise ValueError("fitted propensities need a log with at least one observation")
    if not popularity:
        per_item = {i: n / users for i, n in counts.items()}
        return Propensities(
            "empirical",
            f"empirical observation rate per item, theta_i = n_i / U (U = {users}; no "
            f"training popularity recorded: rerun impute to fit a power law); clipped at "
            f"{clip:g}",
            per_item, default=1.0 / users, clip=clip,
        )  # fmt: skip
    items = sorted(set(popularity) | set(counts))
    x = np.log1p(np.array([max(int(popularity.get(i, 0)), 0) for i in items], dtype=float))
    n = np.array([counts.get(i, 0) for i in items], dtype=float)
    eps = 1e-12

    def nll(params: np.ndarray) -> float:
        th = np.clip(np.exp(params[0] + params[1] * x), eps, 1 - 1e-9)
        return float(-(n * np.log(th) + (users - n) * np.log1p(-th)).sum())

    def at(a: float) -> float:  # log c matching the observed total at exponent a
        return float(np.log(n.sum() / users) - np.log(np.exp(a * x).sum()))

    best = minimize(nll, np.array([at(0.5), 0.5]), method="L-BFGS-B",
                    bounds=[(None, 0.0), (0.0, 5.0)])  # fmt: skip
    log_c, a = (float(v) for v in best.x)
    theta = np.minimum(1.0, np.exp(log_c + a * x))
    se = _exponent_se(nll, best.x)
    few = users < MIN_FIT_USERS
    order = np.argsort(x, kind="stable")
    quintiles = []
    for part in np.array_split(order, 5):
        if len(part):
            quintiles.append({
                "items": int(len(part)),
                "popularity": [int(np.expm1(x[part]).min().round()),
                               int(np.expm1(x[part]).max().round())],
                "observed_rate": float(n[part].sum() / (users * len(part))),
                "predicted_rate": float(theta[part].mean()),
            })  # fmt: skip
    fit = {"exponent": a, "c": math.exp(log_c), "users": users, "items": len(items),
           "log_likelihood": -nll(best.x),
           "log_likelihood_exponent_0.5": -nll(np.array([at(0.5), 0.5])),
           "exponent_se": se, "few_users": few, "quintiles": quintiles}  # fmt: skip
    unseen = float(min(1.0, math.exp(log_c)))  # an item with no training count
    return Propensities(
        "fit",
        f"power law of training popularity fitted to the log (Bernoulli ML, Yang et al. "
        f"2018): theta_i = c (m_i + 1)^a, a = {a:.3f} (se {'n/a' if se is None else f'{se:.3f}'}"
        f"), c = {math.exp(log_c):.3g} "
        f"({users} users, {len(items)} items; log-likelihood {fit['log_likelihood']:.1f} vs "
        f"{fit['log_likelihood_exponent_0.5']:.1f} at a = 0.5); clipped at {clip:g}"
        + (f"; **fitted on only {users} users (< {MIN_FIT_USERS}): the exponent is not to be "
           "trusted; pass --propensities powerlaw:EXP or a propensity file**" if few else ""),
        dict(zip(items, theta.tolist(), strict=True)), default=unseen, clip=clip, fit=fit,
    )  # fmt: skip
