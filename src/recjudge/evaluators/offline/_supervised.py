"""A supervised imputer fitted on gold labels: the judge's signals combined, cross-fitted.

The judge's ``p_yes`` is one signal among several a team already has for a (user, item) pair;
small models fitted on ~100 labels per topic judge more reliably than prompted LLMs (Arabzadeh
& Clarke, ECIR 2026, arXiv 2510.04633), and CJE (arXiv 2512.11150) calibrates judge scores
with covariates against a few per cent of oracle labels. ``fit_imputer`` fits
``P(Y = 1 | x)`` on the gold pairs, where ``x`` is (those the records hold):

- ``logit_p_yes``: the judge's log-odds after the CF bias, ``log p / (1 - p)``;
- ``logit_p_semantic``: its log-odds before the bias (the LLM alone);
- ``sigma``: the CF signal in [-1, 1] the bias used;
- ``log_popularity``: ``log(1 + training count of the item)`` (``impute``'s item counts);
- ``log_history``: ``log(1 + the user's history length)``;
- ``evidence``: how many history titles the judge cited.

Methods: ``logistic`` (L2-regularised logistic regression on standardised features,
scikit-learn's ``LogisticRegression``, C = 1), ``boosting`` (``HistGradientBoostingClassifier``,
depth 3, 100 trees, 20 pairs per leaf) and ``isotonic`` (the PAV map of ``p_yes`` alone, as
``recjudge calibrate``).

**Cross-fitting over users** (cross-prediction, Zrnic & Candes, PNAS 2024): the gold users
are split into ``folds`` groups; a gold pair's probability comes from the model fitted on the
other groups (never on its own label or its user's other labels), and every other pair's is
the mean of the ``folds`` models. So the gold pairs' residuals ``y - f(x)`` are those of a
model that did not see them, which is what PPI's rectifier and DR's correction need to stay
unbiased. What remains outside an interval computed with the fitted probabilities held fixed
is the fit's own variance (see the estimators' notes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from recjudge._stats import auc
from recjudge.data import user_order_key
from recjudge.evaluators.offline._calibrate import apply_map, fit_isotonic
from recjudge.evaluators.offline._evaluation import Refused, imputed_records

METHODS = ("logistic", "boosting", "isotonic")
#: fewest gold users cross-fitting is done on (``brief-offline-estimators``: with 1-5 labelled
#: users, PPI on the cross-fitted imputer gave intervals 10x the labels-only width)
MIN_GOLD_USERS = 10
FEATURES = ("logit_p_yes", "logit_p_semantic", "sigma", "log_popularity", "log_history",
            "evidence")  # fmt: skip
Method = Literal["logistic", "boosting", "isotonic"]
_EPS = 1e-6


def logit(p: float | None) -> float | None:
    """``log p / (1 - p)`` with ``p`` clipped to ``[1e-6, 1 - 1e-6]`` (None for a missing or
    non-finite ``p``)."""
    if p is None or not math.isfinite(float(p)):
        return None
    q = min(max(float(p), _EPS), 1 - _EPS)
    return math.log(q / (1 - q))


def features_of(rec: Mapping[str, Any], popularity: Mapping[str, int] | None) -> dict[str, Any]:
    """The features of one ``imputed.jsonl`` record (None where the record lacks one)."""
    ev = rec.get("evidence")
    hist = rec.get("history_len")
    sigma = rec.get("sigma")
    return {
        "logit_p_yes": logit(rec.get("p_yes")),
        "logit_p_semantic": logit(rec.get("p_yes_semantic")),
        "sigma": float(sigma) if isinstance(sigma, int | float) and math.isfinite(sigma) else None,
        "log_popularity": (
            math.log1p(popularity.get(str(rec["item_id"]), 0)) if popularity is not None else None
        ),  # fmt: skip
        "log_history": math.log1p(hist) if isinstance(hist, int) and hist >= 0 else None,
        "evidence": float(len(ev)) if isinstance(ev, list) else None,
    }


def design_matrix(rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, list[str]]:
    """Features as columns: those present in every row and not constant (a feature missing
    anywhere, or the same everywhere, carries nothing here and is left out, named by
    ``used``)."""
    used = []
    for f in FEATURES:
        vals = [r.get(f) for r in rows]
        if vals and all(v is not None for v in vals) and len(set(vals)) > 1:
            used.append(f)
    x = np.array([[float(r[f]) for f in used] for r in rows], dtype=float).reshape(
        len(rows), len(used)
    )
    return x, used


def _model(method: str, seed: int) -> Any:
    if method == "logistic":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000))
    if method == "boosting":
        from sklearn.ensemble import HistGradientBoostingClassifier

        return HistGradientBoostingClassifier(max_depth=3, max_iter=100, min_samples_leaf=20,
                                              learning_rate=0.1, random_state=seed)  # fmt: skip
    raise ValueError(f"unknown imputer {method!r}; use one of {', '.join(METHODS)}")


class _Isotonic:
    """The PAV map of the first column (``logit_p_yes``), as a model with ``predict_proba``."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> _Isotonic:
        self.xs, self.ys = fit_isotonic(x[:, 0], y)
        return self

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        p = apply_map(self.xs, self.ys, x[:, 0])
        return np.column_stack([1 - p, p])


def _fit(method: str, x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    if len(set(y.tolist())) < 2:  # a fold with one class: its rate, whatever x says
        rate = float(y.mean())

        class _Const:
            def predict_proba(self, z: np.ndarray) -> np.ndarray:
                return np.column_stack([np.full(len(z), 1 - rate), np.full(len(z), rate)])

        return _Const()
    if method == "isotonic":
        return _Isotonic().fit(x, y)
    return _model(method, seed).fit(x, y)


@dataclass
class FittedImputer:
    """Cross-fitted probabilities for every pair, and how they were made.

    Attributes:
        p: ``{(user, item): probability}`` for every pair with features.
        method, features, folds: the model, the features it used, the user folds.
        gold_pairs, gold_users: what it was fitted on.
        oof: out-of-fold quality on the gold pairs (AUC, Brier, and the same of raw p_yes).
    """

    p: dict[tuple[str, str], float]
    method: str
    features: list[str]
    folds: int
    gold_pairs: int
    gold_users: int
    oof: dict[str, float | None]

    def describe(self) -> str:
        """One line for a report header."""
        o = self.oof
        auc = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        return (f"supervised imputer: {self.method} on {', '.join(self.features)}, fitted on "
                f"{self.gold_pairs} gold pairs of {self.gold_users} users, cross-fitted over "
                f"{self.folds} user folds (out-of-fold AUC {auc(o['auc'])} vs raw p_yes "
                f"{auc(o['auc_raw'])}; Brier {o['brier']:.4f} vs "
                f"{o['brier_raw']:.4f})")  # fmt: skip


def fit_imputer(
    rows: Mapping[tuple[str, str], Mapping[str, Any]],
    gold: Mapping[tuple[str, str], int],
    method: Method = "logistic",
    folds: int = 5,
    seed: int = 0,
) -> FittedImputer:
    """Cross-fitted ``P(Y = 1 | features)`` for every pair of ``rows`` (see the module).

    Args:
        rows: per (user, item), its features (``features_of``).
        gold: per labelled (user, item), its label 0/1; pairs outside ``rows`` are ignored.
        method: ``logistic``, ``boosting`` or ``isotonic``.
        folds: user folds (at most the number of gold users).
        seed: the users' fold assignment (and boosting's).

    Raises:
        ValueError: fewer than ``MIN_GOLD_USERS`` gold users or 10 gold pairs among ``rows``,
            one class only,
            an unknown method, or no usable feature.
    """
    if method not in METHODS:
        raise ValueError(f"unknown imputer {method!r}; use one of {', '.join(METHODS)}")
    keys = list(rows)
    x, used = _features(rows, keys, method)
    if not used:
        raise ValueError("no feature varies across the judged pairs; the supervised imputer "
                         "has nothing to learn from (use --calibration isotonic)")  # fmt: skip
    index = {k: n for n, k in enumerate(keys)}
    labelled = [k for k in gold if k in index]
    users = sorted({u for u, _ in labelled}, key=lambda u: user_order_key(u, ("folds", seed)))
    if len(labelled) < 10 or len(users) < MIN_GOLD_USERS:
        raise ValueError(
            f"{len(labelled)} gold pairs of {len(users)} users are among the judged pairs; the "
            f"supervised imputer needs at least 10 pairs of {MIN_GOLD_USERS} users (each fold "
            "is fitted on the other users: with fewer, a fold learns a few users' labels, and "
            "the known-truth bench measured PPI intervals 10x wider); label more users"
        )
    y_all = np.array([gold[k] for k in labelled], dtype=float)
    if y_all.min() == y_all.max():
        raise ValueError(f"every gold label is {int(y_all[0])}: the imputer needs both classes")
    k_folds = max(2, min(folds, len(users)))
    fold_of = {u: n % k_folds for n, u in enumerate(users)}
    gi = np.array([index[k] for k in labelled])
    gf = np.array([fold_of[k[0]] for k in labelled])
    p = np.zeros(len(keys))
    oof = np.zeros(len(labelled))
    rest = np.ones(len(keys), dtype=bool)
    rest[gi] = False
    for f in range(k_folds):
        train = gf != f
        model = _fit(method, x[gi[train]], y_all[train], seed)
        oof[~train] = model.predict_proba(x[gi[~train]])[:, 1]
        p[rest] += model.predict_proba(x[rest])[:, 1] / k_folds
    p[gi] = oof
    raw = np.array([1 / (1 + math.exp(-rows[k]["logit_p_yes"])) for k in labelled])
    quality = {
        "auc": auc(oof[y_all == 1].tolist(), oof[y_all == 0].tolist()),
        "auc_raw": auc(raw[y_all == 1].tolist(), raw[y_all == 0].tolist()),
        "brier": float(np.mean((oof - y_all) ** 2)),
        "brier_raw": float(np.mean((raw - y_all) ** 2)),
    }
    return FittedImputer(
        p={k: float(v) for k, v in zip(keys, np.clip(p, 0.0, 1.0), strict=True)},
        method=method, features=used, folds=k_folds, gold_pairs=len(labelled),
        gold_users=len(users), oof=quality,
    )  # fmt: skip


def _features(rows: Mapping[tuple[str, str], Mapping[str, Any]], keys: Sequence[tuple[str, str]],
              method: str) -> tuple[np.ndarray, list[str]]:  # fmt: skip
    """The design matrix of ``keys`` for ``method`` (isotonic: the judge's own score alone,
    whatever else varies)."""
    if method == "isotonic":
        return np.array([[rows[k]["logit_p_yes"]] for k in keys], dtype=float), ["logit_p_yes"]
    return design_matrix([rows[k] for k in keys])


def refit_draws(
    rows: Mapping[tuple[str, str], Mapping[str, Any]],
    gold: Mapping[tuple[str, str], int],
    method: Method,
    draws: int,
    seed: int = 0,
) -> tuple[dict[tuple[str, str], int], np.ndarray, int]:
    """The imputer refitted on ``draws`` resamples of the gold users (whole users with
    replacement, as the gold design drew them): the calibration's own uncertainty, which an
    interval that holds the fitted probabilities fixed leaves out. This is the
    oracle-uncertainty-aware (OUA) bootstrap of CJE (arXiv 2512.11150, ``cje-eval``):
    each draw refits the calibration and recomputes the estimate, so the interval's spread
    holds both the evaluation users' and the gold labels' sampling.

    Returns:
        (pair -> column, ``[draws, pairs]`` probabilities, the number of gold users). A
        resample with one class predicts its rate.

    Raises:
        ValueError: fewer than ``MIN_GOLD_USERS`` gold users among ``rows``, or no feature
            that varies.
    """
    keys = list(rows)
    index = {k: n for n, k in enumerate(keys)}
    x, used = _features(rows, keys, method)
    if not used:
        raise ValueError("no feature varies across the judged pairs (use --calibration "
                         "isotonic)")  # fmt: skip
    by_user: dict[str, list[int]] = {}
    labels: dict[int, int] = {}
    for key, y in gold.items():
        if key in index:
            by_user.setdefault(key[0], []).append(index[key])
            labels[index[key]] = int(y)
    users = sorted(by_user)
    if len(users) < MIN_GOLD_USERS:
        raise ValueError(f"{len(users)} gold users among the judged pairs; refitting the "
                         f"imputer needs {MIN_GOLD_USERS}")  # fmt: skip
    g = np.random.default_rng(seed)
    out = np.empty((draws, len(keys)))
    for b in range(draws):
        pick = [j for u in g.choice(len(users), len(users)) for j in by_user[users[u]]]
        y = np.array([labels[j] for j in pick], dtype=float)
        out[b] = np.clip(_fit(method, x[pick], y, seed).predict_proba(x)[:, 1], 0.0, 1.0)
    return index, out, len(users)


def read_feature_rows(
    path: str | Path, popularity: Mapping[str, int] | None
) -> dict[tuple[str, str], dict[str, Any]]:
    """Per judged (user, item) of an ``imputed.jsonl`` sidecar, its features (``features_of``);
    pairs with an error are left out.

    Raises:
        DataError: a line that is not such a record (file and line named).
    """

    def parse(rec: dict) -> Any:
        feats = features_of(rec, popularity)
        if feats["logit_p_yes"] is None:
            return Refused("p_yes is missing or not a number.", "p_yes")
        return (str(rec["user_id"]), str(rec["item_id"])), feats

    what = "an imputed-pair record (user_id, item_id, p_yes, ...)"
    return dict(imputed_records(path, parse, what))
