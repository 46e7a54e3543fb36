"""Estimators of per-user ranking metrics when most feedback is missing.

The setting (Yang et al., RecSys 2018, "Unbiased offline recommender evaluation for
missing-not-at-random implicit feedback"; Saito, RecSys 2020, "Doubly robust estimator for
ranking metrics with post-click conversions"): for user ``u`` a system shows its top-k list
``i_1 .. i_k``. Relevance ``Y_r`` of the item at rank ``r`` is observed (``O_r = 1``) only for
the pairs the log holds, each with an observation propensity ``theta_r = P(O_r = 1) > 0``. A
judge gives ``p_r``, its estimate of ``P(Y_r = 1)`` (the calibrated probability when a
calibration was applied, the raw ``p_yes`` otherwise), and a hard label ``h_r``.

Position-weighted metrics are linear in the labels, ``M_u = sum_r w_r Y_r``:

- ``precision@k``: ``w_r = 1 / k``;
- ``dcg@k``: ``w_r = 1 / log2(r + 1)``;
- ``ndcg_fixed@k``: the DCG weights over the DCG of k relevant items,
  ``w_r = (1 / log2(r + 1)) / sum_{s <= k} 1 / log2(s + 1)`` (a fixed normaliser: the usual
  ideal DCG depends on the unknown number of relevant items, which no estimator here sees).
  It is not ranx's ``ndcg@k`` (ideal DCG of the user's own relevant items), so it has its own
  name everywhere: ``evaluate --metrics ndcg@10`` reports ranx's ``ndcg@10`` and the
  estimators' ``ndcg_fixed@10``.

Estimators of ``M_u`` (``sum_r`` over the list):

- ``logged``: ``sum w_r O_r Y_r`` (unlabelled = irrelevant; today's offline evaluation);
- ``imputed``: ``sum w_r (O_r Y_r + (1 - O_r) h_r)`` (the BRIEF paper's protocol);
- ``dm`` (direct method): ``sum w_r p_r``;
- ``ips``: ``sum w_r O_r Y_r / theta_r`` (unbiased when the propensities are right);
- ``snips``: ``ips_u / n`` with ``n = mean over every user and rank of O_r / theta_r`` (self-
  normalised over the whole evaluation; ``E[n] = 1``);
- ``dr`` (doubly robust): ``sum w_r (p_r + O_r (Y_r - p_r) / theta_r)``: unbiased when either
  the propensities or the judge's probabilities are right.

``hit@k`` and ``mrr@k`` are not linear in the labels: for them ``logged`` and ``imputed`` are
computed on the labels and ``dm`` is the expectation under independent relevance
(``1 - prod (1 - p_r)`` and ``sum_r (1 / r) p_r prod_{s < r} (1 - p_s)``); ``ips``, ``snips``
and ``dr`` are not defined (None): the weighting argument holds for sums of labels only.

Every estimate comes with its per-user values (for paired tests) and a 95 % percentile
interval from resampling users (``_stats.user_draws``). ``judge_share`` is the share of the
metric's position weight that sits on pairs without a logged label (what the judge decides
under ``imputed``, ``dm`` and ``dr``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recjudge._registry import Registry
from recjudge._stats import bootstrap_ci, bootstrap_ranks
from recjudge._util import json_loads

if TYPE_CHECKING:
    from recjudge.evaluators.offline._transport import Refit


@dataclass(frozen=True)
class EstimatorSpec:
    """What an estimator is; the formulas are the module docstring's.

    Attributes:
        name: its ``--estimators`` name.
        linear: ``sum_r w_r (.)`` of a linear metric from ``(w, O, Y, p, h, theta)``, over
            the last axis (one user's list, or a value per user of a users x ranks matrix).
        relevance: for a metric not linear in the labels (hit, mrr), the per-rank relevance
            it is computed on, from ``(O, Y, p, h)``; None where the estimator is defined for
            sums of labels only.
        reads_p: reads the judge's probabilities ``p`` (undefined where a listed pair has
            none; its interval holds the calibration's refits when given).
        judged: the judge decides the unlabelled pairs (``judge_share`` is reported).
        self_normalised: the value is divided by SNIPS's normaliser.
        formula: ``M_u`` under it, as the module docstring writes it.
        reference: where it comes from.
    """

    name: str
    linear: Callable[..., np.ndarray]
    relevance: Callable[..., np.ndarray] | None
    reads_p: bool
    judged: bool
    self_normalised: bool
    formula: str
    reference: str


ESTIMATOR_SPECS: Registry[EstimatorSpec] = Registry("estimator")
for _spec in (
    EstimatorSpec("logged", lambda w, o, y, p, h, th: (o * y) @ w,
                  lambda o, y, p, h: o * y, False, False, False,
                  "sum w_r O_r Y_r", "today's offline evaluation (unlabelled = irrelevant)"),
    EstimatorSpec("imputed", lambda w, o, y, p, h, th: (o * y + (1 - o) * h) @ w,
                  lambda o, y, p, h: o * y + (1 - o) * h, False, True, False,
                  "sum w_r (O_r Y_r + (1 - O_r) h_r)", "the BRIEF paper's protocol"),
    EstimatorSpec("dm", lambda w, o, y, p, h, th: p @ w, lambda o, y, p, h: p, True, True,
                  False, "sum w_r p_r", "the direct method"),
    EstimatorSpec("ips", lambda w, o, y, p, h, th: (o * y / th) @ w, None, False, False, False,
                  "sum w_r O_r Y_r / theta_r", "Yang et al., RecSys 2018"),
    EstimatorSpec("snips", lambda w, o, y, p, h, th: (o * y / th) @ w, None, False, False,
                  True, "ips_u / n, n = mean O_r / theta_r", "Yang et al., RecSys 2018"),
    EstimatorSpec("dr", lambda w, o, y, p, h, th: (p + o * (y - p) / th) @ w, None, True,
                  True, False, "sum w_r (p_r + O_r (Y_r - p_r) / theta_r)",
                  "Saito, RecSys 2020"),
):  # fmt: skip
    ESTIMATOR_SPECS.register(_spec.name, _spec)

ESTIMATORS: tuple[str, ...] = tuple(ESTIMATOR_SPECS)
#: the estimators defined for sums of labels only, as notes name them ("IPS/SNIPS/DR")
_SUMS_ONLY = "/".join(n.upper() for n in ESTIMATORS if ESTIMATOR_SPECS.get(n).relevance is None)


def estimator_spec(name: str) -> EstimatorSpec:
    """The record of estimator ``name``.

    Raises:
        ValueError: an unknown name (the known ones listed).
    """
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; use one of {', '.join(ESTIMATORS)}")
    return ESTIMATOR_SPECS.get(name)


LINEAR = ("precision", "dcg", "ndcg_fixed")
NONLINEAR = ("hit", "mrr")


def metric_weights(metric: str, k: int) -> np.ndarray:
    """Position weights ``w_1 .. w_k`` of a linear metric (see the module docstring)."""
    from recjudge._metrics import discount

    if metric == "precision":
        return np.full(k, 1.0 / k)
    gain = discount(k)
    if metric == "dcg":
        return gain
    if metric == "ndcg_fixed":
        return gain / gain.sum()
    raise ValueError(f"{metric!r} is not a linear metric; use one of {', '.join(LINEAR)}")


def parse_metric(name: str) -> tuple[str, int]:
    """``"ndcg@10"`` -> ``("ndcg", 10)``.

    Raises:
        ValueError: an unknown metric or a missing/invalid cut-off.
    """
    base, _, cut = name.partition("@")
    if base not in LINEAR + NONLINEAR or not cut.isdigit() or int(cut) < 1:
        raise ValueError(
            f"unknown estimator metric {name!r}; use NAME@K with NAME one of "
            f"{', '.join(LINEAR + NONLINEAR)} (e.g. ndcg_fixed@10)"
        )
    return base, int(cut)


@dataclass(frozen=True)
class ListLabels:
    """One user's top-k list as the estimators see it, rank order.

    Attributes:
        observed: ``O_r``: whether the log holds a label for the pair.
        label: ``Y_r`` where observed (ignored elsewhere).
        p: the judge's ``P(relevant)`` (used where the estimator needs it).
        hard: the judge's hard label (``imputed``).
        propensity: ``theta_r`` in (0, 1] (after clipping).
    """

    observed: np.ndarray
    label: np.ndarray
    p: np.ndarray
    hard: np.ndarray
    propensity: np.ndarray


def linear_values(
    est: str,
    w: np.ndarray,
    o: np.ndarray,
    y: np.ndarray,
    p: np.ndarray,
    h: np.ndarray,
    th: np.ndarray,
) -> np.ndarray:
    """``sum_r w_r (.)`` of a linear metric under ``est`` (the module docstring's formulas),
    over the last axis: one user's list (1-D) or a users x ranks matrix (a value per user).
    ``y`` must be 0 where ``o`` is; for ``snips`` this is the IPS value (``estimate``
    divides by the normaliser)."""
    return estimator_spec(est).linear(w, o, y, p, h, th)


def estimate_user(est: str, metric: str, k: int, x: ListLabels) -> float | None:
    """One user's value of ``metric@k`` under estimator ``est`` (None where undefined).

    For ``snips`` this is the user's IPS value; ``estimate`` divides by the normaliser.
    """
    n = min(k, len(x.observed))
    o, y, p, h, th = (a[:n].astype(float) for a in (x.observed, x.label, x.p, x.hard,
                                                      x.propensity))  # fmt: skip
    y = np.where(o > 0, y, 0.0)
    if metric in LINEAR:
        return float(linear_values(est, metric_weights(metric, k)[:n], o, y, p, h, th))
    relevance = estimator_spec(est).relevance
    if relevance is None:
        return None
    rel = relevance(o, y, p, h)
    miss = np.cumprod(np.concatenate([[1.0], 1.0 - rel]))[:-1]  # P(nothing relevant above r)
    if metric == "hit":
        return float(1.0 - np.prod(1.0 - rel))
    if metric == "mrr":
        return float(np.sum(rel * miss / np.arange(1, n + 1)))
    raise ValueError(f"unknown metric {metric!r}")


def _stack(rows: Sequence[ListLabels], k: int) -> dict[str, np.ndarray]:
    """The users' lists as ``[users, k]`` arrays (``valid`` marks real slots; padding has
    no observation, label, probability or hard label, and propensity 1), with ``label`` 0
    where unobserved, as ``estimate_user`` reads them."""
    n = len(rows)
    m = {f: np.zeros((n, k)) for f in ("observed", "label", "p", "hard", "valid")}
    m["propensity"] = np.ones((n, k))
    for r, x in enumerate(rows):
        j = min(k, len(x.observed))
        for f in ("observed", "label", "p", "hard", "propensity"):
            m[f][r, :j] = np.asarray(getattr(x, f)[:j], dtype=float)
        m["valid"][r, :j] = 1.0
    m["label"] = np.where(m["observed"] > 0, m["label"], 0.0)
    return m


def snips_normaliser(observed: np.ndarray, theta: np.ndarray, valid: np.ndarray) -> float:
    """SNIPS's ``n``: the mean of ``O / theta`` over the real slots (``valid``); 1 when there
    is none or it is not positive."""
    if not valid.sum():
        return 1.0
    ratio = float((observed / theta)[valid > 0].mean())
    return ratio if ratio > 0 else 1.0


def _user_values(est: str, metric: str, k: int, m: Mapping[str, np.ndarray]) -> np.ndarray:
    """Every user's ``estimate_user`` at once, on ``_stack``'s arrays cut to ``k``."""
    o, y, p, h = m["observed"], m["label"], m["p"], m["hard"]
    if metric in LINEAR:
        w = metric_weights(metric, k)[: o.shape[1]]
        p = np.where(m["valid"] > 0, p, 0.0)
        return linear_values(est, w, o, y, p, h, m["propensity"])
    relevance = estimator_spec(est).relevance
    if relevance is None:
        raise ValueError(f"estimator {est!r} is defined for sums of labels only, not {metric}")
    rel = relevance(o, y, np.where(m["valid"] > 0, p, 0.0), h * m["valid"])
    if metric == "hit":
        return 1.0 - np.prod(1.0 - rel, axis=1)
    if metric == "mrr":
        miss = np.cumprod(np.concatenate([np.ones((len(rel), 1)), 1.0 - rel[:, :-1]], axis=1),
                          axis=1)  # fmt: skip
        return (rel * miss / np.arange(1, rel.shape[1] + 1)).sum(axis=1)
    raise ValueError(f"unknown metric {metric!r}")


@dataclass
class Estimate:
    """One estimator's value of one metric for one system, with its uncertainty."""

    estimator: str
    metric: str
    value: float | None
    ci: tuple[float, float] | None
    per_user: list[float] = field(default_factory=list)
    judge_share: float = 0.0
    note: str = ""
    #: the bootstrap draws of the value (shared resamples across systems: rank intervals)
    boot: np.ndarray | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The estimate without its per-user values (what reports and ``--json`` carry)."""
        return {"estimator": self.estimator, "metric": self.metric, "value": self.value,
                "ci": list(self.ci) if self.ci else None, "judge_share": self.judge_share,
                "note": self.note}  # fmt: skip


def estimate(
    lists: Mapping[str, ListLabels],
    metrics: Sequence[str],
    estimators: Sequence[str] = ESTIMATORS,
    *,
    draws: int = 1000,
    seed: int = 0,
    p_draws: Sequence[np.ndarray] | None = None,
    p_clusters: int = 0,
) -> dict[str, dict[str, Estimate]]:
    """Every estimator's value of every metric over the users of ``lists``.

    Args:
        lists: one system's ``ListLabels`` per evaluation user.
        metrics: ``NAME@K`` names (``parse_metric``).
        estimators: a subset of ``ESTIMATORS``.
        draws: user resamples for the 95 % percentile intervals (0: none).
        seed: the resampling seed (the same draws for every metric and estimator).
        p_draws: per draw, ``[users, k]``: the judge's probabilities refitted per resample
            (``_supervised.refit_draws``; users in sorted order): ``dm`` and ``dr``'s draw
            ``b`` then uses resample ``b`` of the users *and* calibration ``b``, so their
            intervals hold the calibration's uncertainty (the OUA bootstrap). The interval
            is then ``value +- t_{0.975, G - 1} sd(draws)`` with ``G = p_clusters``, the gold
            users the calibration was refitted on: a percentile interval over 10-12
            resampled gold users covered 83-88 % on a synthetic world with known truth, the
            t on their number 93 % (``tests/evaluators/test_oua.py``; the few-cluster
            correction of Cameron, Gelbach and Miller, REStat 2008).

    Returns:
        ``{metric: {estimator: Estimate}}``.
    """
    from recjudge._stats import user_draws

    users = sorted(lists)
    if not users:
        raise ValueError("no evaluation user: every system needs at least one ranked list")
    specs = [estimator_spec(e) for e in estimators]
    idx = user_draws(len(users), draws, seed) if draws else None
    t_oua = 0.0
    if p_draws is not None:
        from scipy.stats import t as student

        t_oua = float(student.ppf(0.975, max(p_clusters - 1, 1)))
    kmax = max(parse_metric(m)[1] for m in metrics) if metrics else 0
    m = _stack([lists[u] for u in users], kmax)
    out: dict[str, dict[str, Estimate]] = {}
    for name in metrics:
        metric, k = parse_metric(name)
        cut = {f: a[:, :k] for f, a in m.items()}
        out[name] = {s.name: e for s, e in zip(specs, _metric_estimates(
            name, cut, specs, idx, p_draws, t_oua), strict=True)}  # fmt: skip
    return out


def _metric_estimates(
    name: str,
    cut: dict[str, np.ndarray],
    specs: Sequence[EstimatorSpec],
    idx: np.ndarray | None,
    p_draws: Sequence[np.ndarray] | None,
    t_oua: float,
) -> list[Estimate]:
    """``estimate``'s estimates of one metric (``cut``: ``_stack``'s arrays cut to its k),
    one per spec, in order."""
    metric, k = parse_metric(name)
    valid = cut["valid"]
    n_users = valid.shape[0]
    w = (metric_weights(metric, k) if metric in LINEAR
         else 1.0 / np.arange(1, k + 1))[: valid.shape[1]]  # fmt: skip
    total = (w * valid).sum(axis=1)
    per_share = np.divide((w * valid * (1 - cut["observed"])).sum(axis=1), total,
                          out=np.zeros(n_users), where=total > 0)  # fmt: skip
    share = float(per_share.mean())
    norm = 1.0
    if any(s.self_normalised for s in specs) and metric in LINEAR:
        norm = snips_normaliser(cut["observed"], cut["propensity"], valid)
    unjudged = int((np.isnan(cut["p"]) & (valid > 0)).sum())
    out = []
    for spec in specs:
        est = spec.name
        if spec.reads_p and unjudged:
            note = (f"{unjudged} listed pairs have no judge probability (logged pairs are "
                    "not judged by default): run impute with --judge-logged")  # fmt: skip
            out.append(Estimate(est, name, None, None, note=note))
            continue
        if metric not in LINEAR and spec.relevance is None:
            note = f"not linear in the labels: {_SUMS_ONLY} are defined for sums of labels"
            out.append(Estimate(est, name, None, None, note=note))
            continue
        arr = _user_values(est, metric, k, cut) / (norm if spec.self_normalised else 1.0)
        ci, boot = None, None
        if idx is not None and p_draws is not None and spec.reads_p:
            boot = np.array([
                _user_values(est, metric, k, {**cut, "p": p_draws[b][:, :k]})[idx[b]].mean()
                for b in range(len(idx))])  # fmt: skip
            half = float(t_oua * boot.std(ddof=1))
            ci = (float(arr.mean()) - half, float(arr.mean()) + half)
        elif idx is not None:
            boot = arr[idx].mean(axis=1)
            ci = bootstrap_ci(boot)
        out.append(Estimate(est, name, float(arr.mean()), ci, arr.tolist(),
                            share if spec.judged else 0.0, boot=boot))  # fmt: skip
    return out


# -- propensities -------------------------------------------------------------------------
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
            from recjudge.data import DataError

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
    import pandas as pd

    from recjudge.data import DataError, read_table

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


def list_labels(
    ranking: Sequence[str],
    user: str,
    logged: Mapping[str, int],
    judged: Mapping[str, tuple[float, bool]],
    propensities: Propensities,
    k: int,
) -> tuple[ListLabels, int]:
    """One user's ``ListLabels`` for the top-k of ``ranking``: logged labels where the log
    has them, and the judge's (p, hard label) by item from ``judged``. A pair the judge did not
    answer has p = NaN (``dm`` and ``dr`` are then undefined: their imputation must not depend
    on whether the pair was logged) and hard label 0; and how many propensities were clipped."""
    top = list(ranking[:k])
    rows = np.empty((5, len(top)))
    clipped = 0
    for r, i in enumerate(top):
        j = judged.get(i)
        t, c = propensities.of(user, i)
        clipped += c
        lab = logged.get(i)
        rows[:, r] = (lab is not None, lab or 0.0, j[0] if j else np.nan,
                      j[1] if j else 0.0, t)  # fmt: skip
    return ListLabels(*rows), clipped


@dataclass(frozen=True)
class Refused:
    """What ``imputed_records``' ``parse`` returns for a value it read but refuses."""

    problem: str
    field: str


def imputed_records(path: str | Path, parse: Callable[[dict], Any], what: str) -> Iterator[Any]:
    """``parse(record)`` of each judged record of an ``imputed.jsonl`` sidecar (records with
    an error are passed over), in file order.

    Raises:
        DataError: a missing file, or a line ``parse`` cannot read (``what`` it should be,
            the file and line named).
    """
    import json

    from recjudge.data import DataError

    path = Path(path)
    fix = "pass the --out folder of `recjudge impute` (it holds imputed.jsonl)"
    if not path.is_file():
        raise DataError("no such file.", source=str(path), fix=fix)
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json_loads(line)
            if rec.get("error"):
                continue
            got = parse(rec)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise DataError(f"not {what}.", source=str(path), row=n, fix=fix) from None
        if isinstance(got, Refused):  # a value parse read but refuses (its field named)
            raise DataError(got.problem, source=str(path), row=n, field=got.field, fix=fix)
        yield got


def read_judged(path: str | Path, raw: bool = False) -> dict[tuple[str, str], tuple[float, bool]]:
    """The judge's ``(p, label)`` per (user, item) from an ``imputed.jsonl`` sidecar (pairs
    with an error are left out): ``p`` is ``p_calibrated`` where impute applied a calibration
    map, unless ``raw`` (then always ``p_yes``).

    Raises:
        DataError: a line that is not such a record (names the file and line).
    """

    def parse(rec: dict) -> Any:
        # The calibrated probability when impute applied a calibration map.
        p = float(rec["p_yes"] if raw else rec.get("p_calibrated", rec["p_yes"]))
        key = (str(rec["user_id"]), str(rec["item_id"]))
        if not 0.0 <= p <= 1.0:
            return Refused(f"p_yes {p} is not a probability.", "p_yes")
        return key, (p, bool(rec["label"]))

    what = "an imputed-pair record (user_id, item_id, label, p_yes)"
    return dict(imputed_records(path, parse, what))


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


def estimate_runs(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    propensities: Propensities,
    users: Sequence[str],
    metrics: Sequence[str],
    estimators: Sequence[str] = ESTIMATORS,
    *,
    draws: int = 1000,
    seed: int = 0,
    refits: tuple[Mapping[tuple[str, str], int], np.ndarray, int] | None = None,
) -> dict[str, Any]:
    """Every estimator of every metric for each run (``RecRun``) on ``users``; ``refits``
    (``_supervised.refit_draws``: pair -> column, ``[draws, pairs]``, gold users) puts the
    calibration's refits into ``dm`` and ``dr``'s intervals (``estimate``'s ``p_draws``; its
    draws set the number of resamples).

    Returns:
        ``{"systems": {run: {metric: {estimator: Estimate.to_dict()}}}, "clipped": n,
        "propensity": describe}``.
    """
    k = max(parse_metric(m)[1] for m in metrics)
    systems: dict[str, Any] = {}
    raw: dict[str, dict[str, dict[str, Estimate]]] = {}
    clipped = 0
    for run, (lists, c) in zip(runs, run_lists(runs, logged, judged, propensities, users, k),
                               strict=True):  # fmt: skip
        clipped += c
        p_draws = None
        if refits is not None:
            draws = len(refits[1])
            p_draws = _RefitLists(run, sorted(lists), k, refits[0], refits[1])
        got = estimate(lists, metrics, estimators, draws=draws, seed=seed, p_draws=p_draws,
                       p_clusters=refits[2] if refits else 0)  # fmt: skip
        raw[run.name] = got
        systems[run.name] = {m: {e: v.to_dict() for e, v in d.items()} for m, d in got.items()}
    for name, by_metric in rank_intervals(raw).items():
        for m, by_est in by_metric.items():
            for e, r in by_est.items():
                systems[name][m][e].update(r)
    return {"systems": systems, "clipped": clipped, "propensity": propensities.describe}


def rank_intervals(
    systems: Mapping[str, Mapping[str, Mapping[str, Estimate]]],
) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Per system, metric and estimator: its rank and rank interval (``_stats.bootstrap_ranks``)
    over the shared bootstrap resamples (the same users, and calibration refits, in draw
    ``b`` for every system). Estimators without draws for every system get none."""
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {n: {} for n in systems}
    names = list(systems)
    if len(names) < 2:
        return out
    first = systems[names[0]]
    for m, by_est in first.items():
        for e in by_est:
            cells = [systems[n].get(m, {}).get(e) for n in names]
            if any(c is None or c.boot is None or c.value is None for c in cells):
                continue
            got = bootstrap_ranks(np.stack([c.boot for c in cells]), [c.value for c in cells])
            for n, r in zip(names, got, strict=True):
                out[n].setdefault(m, {})[e] = r
    return out


class _RefitLists:
    """The refitted probabilities of a run's top-k as ``estimate``'s ``p_draws``: draw ``b``
    is ``[users, k]`` (0 past a short list or for a pair without one, as ``_stack`` pads),
    gathered when asked, so no ``[draws, users, k]`` copy is held per run."""

    def __init__(self, run: Any, users: Sequence[str], k: int,
                 index: Mapping[tuple[str, str], int], probs: np.ndarray) -> None:  # fmt: skip
        self.cols = np.full((len(users), k), -1, dtype=int)
        for r, u in enumerate(users):
            for c, i in enumerate(run.rankings.get(u, [])[:k]):
                self.cols[r, c] = index.get((u, i), -1)
        self.probs = probs

    def __len__(self) -> int:
        return len(self.probs)

    def __getitem__(self, b: int) -> np.ndarray:
        return np.where(self.cols >= 0, self.probs[b][np.maximum(self.cols, 0)], 0.0)


def run_lists(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    propensities: Propensities,
    users: Sequence[str],
    k: int,
) -> list[tuple[dict[str, ListLabels], int]]:
    """Per run (``RecRun``), every user's ``ListLabels`` of its top-k and the number of
    propensity lookups that were clipped."""
    by_user: dict[str, dict[str, tuple[float, bool]]] = {}
    for (u, i), v in judged.items():
        by_user.setdefault(u, {})[i] = v
    out = []
    for run in runs:
        lists, clipped = {}, 0
        for u in users:
            lists[u], c = list_labels(run.rankings.get(u, []), u, logged.get(u, {}),
                                      by_user.get(u, {}), propensities, k)  # fmt: skip
            clipped += c
        out.append((lists, clipped))
    return out


# -- interop: Open Bandit Pipeline ---------------------------------------------------------
def to_obp(lists: Mapping[str, ListLabels], metric: str) -> dict[str, np.ndarray]:
    """One system's lists as the logged bandit feedback of Open Bandit Pipeline (``obp``,
    Saito et al., NeurIPS 2021 datasets track), so that obp's ``DirectMethod``,
    ``InverseProbabilityWeighting``, ``SelfNormalizedInverseProbabilityWeighting`` and
    ``DoublyRobust`` give this module's ``dm``, ``ips``, ``snips`` and ``dr`` of a linear
    ``metric@k`` (equal to rounding; ``tests/evaluators/test_obp.py`` checks it against obp's
    own output).

    The mapping: every top-k slot ``(u, r)`` of the ``U`` users is one round (``R`` rounds
    in all); its two actions are "the listed item's label is observed" (0) and "it is not"
    (1). The logging policy chose the logged action with probability ``pscore = theta_r``
    (observed) or ``1 - theta_r`` (not; floored at 1e-12 where ``theta_r = 1``, which the true
    propensities never give an unobserved slot); the evaluation policy always picks action
    0 (``action_dist[:, 0, 0] = 1``). The reward of an observed slot is ``s_r Y_r``, 0
    otherwise; ``estimated_rewards_by_reg_model[:, 0, 0] = s_r p_r`` (the judge), with
    ``s_r = (R / U) w_r`` so that obp's mean over rounds is the mean over users of
    ``sum_r w_r (.)``. Unobserved slots then add nothing to IPS and no correction to DR.

    Returns:
        ``action_dist`` (R, 2, 1), ``action``, ``reward``, ``pscore``, ``position`` (R,),
        ``estimated_rewards_by_reg_model`` (R, 2, 1): the keyword arguments of obp's
        ``estimate_policy_value``.

    Raises:
        ValueError: a nonlinear metric, or a slot without the judge's probability.
    """
    base, k = parse_metric(metric)
    if base not in LINEAR:
        raise ValueError(f"obp's estimators weigh sums of labels: use one of {', '.join(LINEAR)}")
    w = metric_weights(base, k)
    slots = [(x, r) for u in sorted(lists) for x in [lists[u]]
             for r in range(min(k, len(x.observed)))]  # fmt: skip
    n_rounds, n_users = len(slots), len(lists)
    if not n_rounds:
        raise ValueError("no listed slot to export")
    scale = np.array([n_rounds / n_users * w[r] for _, r in slots])
    obs = np.array([bool(x.observed[r]) for x, r in slots])
    theta = np.array([float(x.propensity[r]) for x, r in slots])
    p = np.array([float(x.p[r]) for x, r in slots])
    if np.isnan(p).any():
        raise ValueError(f"{int(np.isnan(p).sum())} listed pairs have no judge probability: "
                         "run impute with --judge-logged")  # fmt: skip
    y = np.array([float(x.label[r]) if x.observed[r] else 0.0 for x, r in slots])
    action_dist = np.zeros((n_rounds, 2, 1))
    action_dist[:, 0, 0] = 1.0
    q = np.zeros((n_rounds, 2, 1))
    q[:, 0, 0] = scale * p
    return {
        "action_dist": action_dist,
        "action": np.where(obs, 0, 1).astype(int),
        "reward": scale * y * obs,
        "pscore": np.where(obs, theta, np.maximum(1.0 - theta, 1e-12)),
        "position": np.zeros(n_rounds, dtype=int),
        "estimated_rewards_by_reg_model": q,
    }


def export_obp(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    propensities: Propensities,
    users: Sequence[str],
    metrics: Sequence[str],
    folder: str | Path,
) -> list[Path]:
    """``to_obp`` for every run and linear metric, one ``.npz`` each in ``folder`` (numpy's
    archive: load it with ``np.load(path, allow_pickle=False)`` and pass its arrays to obp's
    ``estimate_policy_value``), listed in ``folder/index.json`` with the run name, metric and
    propensity model. File names percent-encode the run name (any id is safe)."""
    import io
    import json

    from recjudge._util import atomic_write_bytes, atomic_write_text, path_component

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    linear = [m for m in metrics if parse_metric(m)[0] in LINEAR]
    if not linear:
        raise ValueError("obp export needs a linear metric (precision, dcg or ndcg@K)")
    k = max(parse_metric(m)[1] for m in linear)
    index, written = [], []
    for run, (lists, _) in zip(runs, run_lists(runs, logged, judged, propensities, users, k),
                               strict=True):  # fmt: skip
        for m in linear:
            path = folder / f"{path_component(run.name)}__{m.replace('@', '_at_')}.npz"
            buf = io.BytesIO()  # whole, then renamed in: a kill never leaves half an archive
            np.savez(buf, **to_obp(lists, m))
            atomic_write_bytes(path, buf.getvalue())
            index.append({"run": run.name, "metric": m, "file": path.name,
                          "propensity": propensities.describe})  # fmt: skip
            written.append(path)
    atomic_write_text(folder / "index.json", json.dumps(index, indent=1) + "\n")
    return written


# -- gold samples: prediction-powered inference ---------------------------------------------
def ppi_mean(
    y: np.ndarray,
    yhat: np.ndarray,
    yhat_unlabeled: np.ndarray,
    *,
    lam: float | None = None,
    alpha: float = 0.05,
) -> dict[str, float]:
    """Prediction-powered estimate of a mean with its ``1 - alpha`` interval (Angelopoulos et
    al., Science 2023; power tuning PPI++, Angelopoulos, Duchi and Zrnic 2023), as
    ``ppi_py.ppi_mean_pointestimate`` / ``ppi_mean_ci`` compute it in one dimension:

    ``theta = mean(lam * yhat_unlabeled) + mean(y - lam * yhat)`` with interval
    ``theta +- z_{1-alpha/2} sqrt(var(lam * yhat_unlabeled) / N + var(y - lam * yhat) / n)``
    (population variances). ``lam = 1`` is classic PPI, ``lam = 0`` the gold sample alone;
    ``None`` picks ``lam = cov(g, g_hat) / ((1 + n/N) var(g_hat over both sets))`` at the
    ``lam = 1`` estimate, clipped to [0, 1]. Valid whatever the predictions' bias, as long as
    the gold pairs are a uniform random sample of the population.
    """
    from scipy.stats import norm

    y, yhat, yu = (np.asarray(a, dtype=float) for a in (y, yhat, yhat_unlabeled))
    n, big_n = len(y), len(yu)
    if n < 2 or big_n < 1:
        raise ValueError(f"PPI needs at least 2 gold pairs and 1 prediction (got {n}, {big_n})")
    if lam is None:
        pe = yu.mean() + (y - yhat).mean()
        g, gh, ghu = y - pe, yhat - pe, yu - pe
        cov = (2.0 / n) * float(((g - g.mean()) * (gh - gh.mean())).sum())
        var = float(np.cov(np.concatenate([gh, ghu])))
        lam = float(np.clip(cov / (2 * (1 + n / big_n) * var), 0, 1)) if var > 0 else 1.0
    theta = float((lam * yu).mean() + (y - lam * yhat).mean())
    se = math.sqrt((lam * yu).std() ** 2 / big_n + (y - lam * yhat).std() ** 2 / n)
    z = float(norm.ppf(1 - alpha / 2))
    return {"value": theta, "lo": theta - z * se, "hi": theta + z * se, "se": se, "lam": lam,
            "n": n, "N": big_n}  # fmt: skip


def read_gold(path: str | Path, users: Sequence[str], listed: set[tuple[str, str]]):
    """Gold pairs ``(user_id, item_id, label)`` (``calibrate``'s label file format), each of a
    user and item the evaluated runs list.

    Raises:
        DataError: a bad label, or a pair for a user or item outside the evaluated runs
            (file and row named).
    """
    from recjudge.data import DataError
    from recjudge.evaluators.offline._calibrate import read_labels

    gold = read_labels(path)
    known = set(users)
    items = {i for _, i in listed}
    for r, (u, i) in enumerate(gold, 1):
        if u not in known or i not in items:
            what = f"user {u!r}" if u not in known else f"item {i!r}"
            raise DataError(
                f"gold pair ({u!r}, {i!r}): {what} is not in the evaluated runs' top-k lists.",
                source=str(path),
                row=r,
                fix="draw gold pairs uniformly from the pairs the evaluated runs list (top-k "
                "of the evaluation users); a pair outside them cannot be weighed",
            )
    return gold


def require_judged(pairs: Sequence[tuple[str, str]], judged: Mapping[tuple[str, str], Any]):
    """Raise ValueError naming how many of ``pairs`` the judge did not answer (PPI and DR
    need its probability on every listed pair)."""
    missing = [pair for pair in pairs if pair not in judged]
    if missing:
        raise ValueError(f"{len(missing)} listed pairs have no judge probability (e.g. "
                         f"{missing[0]}): run impute with --judge-logged")  # fmt: skip


def ppi_metric(
    run: Any,
    users: Sequence[str],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    gold: Mapping[tuple[str, str], int],
    metric: str,
    *,
    lam: float | None = None,
) -> dict[str, Any]:
    """PPI estimate of a linear ``metric@k`` for one run, with its 95 % interval.

    The metric is a mean over list slots: ``M = (S / |U|) mean_slots w_r Y`` for the ``S``
    top-k slots of the ``|U|`` users, so ``ppi_mean`` applies to ``c w_r Y`` (gold slots) and
    ``c w_r p`` (the judge on every slot), ``c = S / |U|``. The gold pairs this run lists are
    a uniform sample of its slots when the gold sample is uniform over the listed pairs.

    Raises:
        ValueError: a nonlinear metric, a slot without the judge's probability, or fewer than
            two gold pairs in this run's lists.
    """
    base, k = parse_metric(metric)
    if base not in LINEAR:
        raise ValueError(f"PPI here is for the linear metrics ({', '.join(LINEAR)}): {metric}")
    w = metric_weights(base, k)
    slots = [(u, i, w[r]) for u in users for r, i in enumerate(run.rankings.get(u, [])[:k])]
    c = len(slots) / max(len(users), 1)
    require_judged([(u, i) for u, i, _ in slots], judged)
    yu = np.array([c * wr * judged[(u, i)][0] for u, i, wr in slots])
    mine = [(u, i, wr) for u, i, wr in slots if (u, i) in gold]
    if len(mine) < 2:
        raise ValueError(f"{run.name}: {len(mine)} gold pairs in its top-{k} lists (need 2+)")
    y = np.array([c * wr * gold[(u, i)] for u, i, wr in mine])
    yhat = np.array([c * wr * judged[(u, i)][0] for u, i, wr in mine])
    return ppi_mean(y, yhat, yu, lam=lam)


# ranx's metric names (``evaluate --metrics``) -> the estimators' (whose nDCG has a fixed
# normaliser, hence its own name: see the module docstring). Others (recall, map, ...) have no
# estimator: ``evaluate`` refuses them with --estimators instead of computing another metric.
RANX_NAMES = {"precision": "precision", "ndcg": "ndcg_fixed", "mrr": "mrr", "hit_rate": "hit"}


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


def estimate_evaluation(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    propensities: Propensities,
    users: Sequence[str],
    metrics: Sequence[str],
    estimators: Sequence[str],
    *,
    calibrated: bool = False,
    gold: Any = None,
    gold_name: str = "",
    ppi_intervals: str = "auto",
    refits: tuple[Mapping[tuple[str, str], int], np.ndarray, int] | None = None,
    refit: Refit | None = None,
) -> dict[str, Any]:
    """``estimate_runs`` with what the report header names (calibration, gold sample, the
    propensity fit, the share of inverse-propensity weight on clipped pairs) and, given a gold
    sample (a ``GoldSample``, or ``{(user, item): label}`` taken as uniform), a ``ppi``
    estimate of each linear metric per run (``ppi_run``; an undefined one says why in its
    note). An estimate outside the metric's range is flagged in its note.

    With a calibrated judge and gold, each system's calibration is checked (``_transport``:
    leave-system-out when ``refit`` refits the calibration on given labels, else on the pooled
    map's residuals): a failing system's ``dm``/``dr`` are refused, and every ``dm`` interval
    becomes the transport-bounded one (``bound_levels``)."""
    from recjudge.evaluators.offline._gold import GoldSample, listed_pairs

    got = estimate_runs(runs, logged, judged, propensities, users, metrics, estimators,
                        refits=refits)  # fmt: skip
    got["propensity_fit"] = dict(propensities.fit) if propensities.fit else None
    kmax = max(parse_metric(m)[1] for m in metrics)
    diag = weight_diagnostics(runs, logged, propensities, users, kmax, metrics[0])
    got["clipped_weight_share"] = {n: d["clipped_share"] for n, d in diag.items()}
    got["weights"] = diag
    _flag_out_of_range(got["systems"])
    got["calibration"] = (
        "isotonic map from recjudge calibrate (p_calibrated)"
        if calibrated
        else "none: the judge's raw p_yes"
    )
    got["gold"] = "none"
    if gold is None:
        return got
    if not isinstance(gold, GoldSample):
        gold = GoldSample(dict(gold), design="unknown", source=gold_name)
    k = max(parse_metric(m)[1] for m in metrics)
    frame = len(listed_pairs(runs, users, k))
    classes = set(gold.labels.values())
    warn = (f"; every gold label is {classes.pop()}: the PPI interval is not informative"
            if len(classes) == 1 else "")  # fmt: skip
    got["gold"] = (f"{gold_name}: {len(gold)} pairs, design {gold.design}, PPI++ (Student's t; "
                   f"lambda power-tuned from {MIN_TUNED_CLUSTERS} labelled clusters, else 1)"
                   f"{warn}")  # fmt: skip
    if calibrated:  # the calibration checked on each system's own gold pairs
        dm_df = max(refits[2] - 1, 1) if refits is not None else None  # DM's OUA interval
        _check_transport(got, runs, users, judged, gold, metrics, frame, refit, dm_df)
    for run in runs:
        for m in (m for m in metrics if parse_metric(m)[0] in LINEAR):
            try:
                e = ppi_run(run, users, judged, gold, m, frame, ppi_intervals)
            except ValueError as err:
                e = Estimate("ppi", m, None, None, note=str(err))
            got["systems"][run.name][m]["ppi"] = e.to_dict()
    return got


def _check_transport(got: dict[str, Any], runs: Sequence[Any], users: Sequence[str],
                     judged: Mapping[tuple[str, str], tuple[float, bool]], gold: Any,
                     metrics: Sequence[str], frame: int, refit: Refit | None,
                     dm_df: float | None) -> None:  # fmt: skip
    """``estimate_evaluation``'s transport step (its docstring), in place on ``got``."""
    from recjudge.evaluators.offline._transport import (
        bound_levels,
        refuse_levels,
        residual_interval,
        transport_check,
    )

    k = max(parse_metric(m)[1] for m in metrics)
    got["transport"] = transport_check(runs, users, judged, gold.labels, k, refit=refit)
    refuse_levels(got["systems"], got["transport"])
    nonlinear = "a nonlinear metric: the calibration's bias on it has no bound from gold pairs"
    bounds = {
        run.name: {
            m: (residual_interval(run, users, judged, gold, m, frame, alpha=0.025)
                if parse_metric(m)[0] in LINEAR else nonlinear)
            for m in metrics
        }
        for run in runs
    }  # fmt: skip
    bound_levels(got["systems"], bounds, df=dm_df)


def _flag_out_of_range(systems: Mapping[str, Mapping[str, Mapping[str, dict]]]) -> None:
    """Add to the note of every estimate outside its metric's range why that happens and
    that it is not to be trusted."""
    for by_metric in systems.values():
        for m, by_est in by_metric.items():
            top = metric_range(m)
            for e in by_est.values():
                v = e["value"]
                if v is not None and not -1e-12 <= v <= top + 1e-12:
                    e["note"] = (e["note"] + "; " if e["note"] else "") + (
                        f"outside the metric's range [0, {top:g}]: inverse-propensity weights "
                        "(small or clipped propensities) or a judge far from the labels; "
                        "treat it as unreliable")  # fmt: skip


def metric_range(metric: str) -> float:
    """The largest value ``metric@k`` can take (its smallest is 0)."""
    base, k = parse_metric(metric)
    return float(metric_weights(base, k).sum()) if base in LINEAR else 1.0


#: below this effective sample size of a system's inverse-propensity weights, or with more
#: than ``FRAGILE_TOP_SHARE`` of its IPS estimate on the top 1 % of weights, the weighted
#: estimates (IPS, SNIPS, DR) are ``fragile`` and may not lead the report: a normal interval
#: over fewer than ~30 effective observations is not to be trusted (the usual rule for a mean),
#: and an estimate most of which rests on a handful of pairs moves with any one of them.
MIN_ESS = 30
FRAGILE_TOP_SHARE = 0.5


def weight_diagnostics(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    propensities: Propensities,
    users: Sequence[str],
    k: int,
    metric: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Per run, the inverse-propensity weights ``v_r = w_r / theta_r`` of its logged top-k
    pairs (``w_r`` the position weights of ``metric``, 1 without one) and what they say:

    - ``ess``: Kish's effective sample size ``(sum v)^2 / sum v^2`` (Kish 1965; Owen 2013,
      sec. 9.3), the number of equally weighted pairs that would be as precise;
    - ``top1_share``: the share of the IPS numerator ``sum v_r Y_r`` carried by the largest
      1 % of the weights (at least one pair; None when no logged pair is relevant);
    - ``clipped_share``: the share of ``sum 1 / theta`` on pairs whose propensity was clipped;
    - ``verdict``: ``fragile`` when ``ess < MIN_ESS`` or ``top1_share > FRAGILE_TOP_SHARE``,
      else ``stable``.
    """
    w_pos = np.ones(k)
    if metric is not None and parse_metric(metric)[0] in LINEAR:
        base, mk = parse_metric(metric)
        w_pos = np.zeros(k)
        w_pos[: min(k, mk)] = metric_weights(base, mk)[: min(k, mk)]
    out = {}
    for run in runs:
        v, y, inv, clipped = [], [], 0.0, 0.0
        for u in users:
            labels = logged.get(u, {})
            for r, i in enumerate(run.rankings.get(u, [])[:k]):
                if i in labels:
                    t, c = propensities.of(u, i)
                    inv += 1.0 / t
                    clipped += (1.0 / t) if c else 0.0
                    if w_pos[r] > 0:
                        v.append(w_pos[r] / t)
                        y.append(float(labels[i] > 0))
        va, ya = np.asarray(v), np.asarray(y)
        ess = float(va.sum() ** 2 / (va**2).sum()) if len(va) else 0.0
        top = None
        if len(va) and (va * ya).sum() > 0:
            n_top = max(1, int(math.ceil(0.01 * len(va))))
            order = np.argsort(-va, kind="stable")[:n_top]
            top = float((va[order] * ya[order]).sum() / (va * ya).sum())
        fragile = ess < MIN_ESS or (top is not None and top > FRAGILE_TOP_SHARE)
        out[run.name] = {"logged_pairs": len(va), "ess": ess, "top1_share": top,
                         "clipped_share": clipped / inv if inv else 0.0,
                         "verdict": "fragile" if fragile else "stable"}  # fmt: skip
    return out


def clipped_weight_share(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    propensities: Propensities,
    users: Sequence[str],
    k: int,
) -> dict[str, float]:
    """Per run, the share of the inverse-propensity weight ``sum 1 / theta`` over its logged
    top-k pairs that sits on pairs whose propensity was clipped: how much of IPS/SNIPS/DR
    rests on the clip rather than the propensity model (``weight_diagnostics``)."""
    got = weight_diagnostics(runs, logged, propensities, users, k)
    return {n: d["clipped_share"] for n, d in got.items()}


#: fewest labelled clusters (users holding gold pairs of a run; gold pairs for the iid
#: interval) at which PPI++'s power-tuned lambda is used; below it lambda = 1 (classic PPI).
#: The tuned lambda is fitted on the same few clusters whose residual variance it minimises,
#: so the interval is too narrow: on a synthetic world with known truth (users design, 3-11
#: labelled users) clustered PPI with the tuned lambda covered 87-89 % of 95 % intervals, with
#: lambda = 1 and t quantiles 92-94 % at the same mean width (``tests/evaluators/
#: test_small_sample.py``); the asymptotics of PPI++ (Angelopoulos, Duchi and Zrnic 2023)
#: say nothing at these sizes.
MIN_TUNED_CLUSTERS = 20
#: fewest gold labels of each class among a run's gold pairs for a PPI interval: a one-class
#: sample (every pair relevant, or none) has no observed residual spread on one side and gives
#: zero-width or one-sided intervals (``1.0 [1.0, 1.0]``).
MIN_CLASS_LABELS = 1
#: fewest labelled users of the ``users`` design for a PPI interval: with 3-4 (about 100 gold
#: pairs) the clustered t interval covered 86.6 % of 95 % intervals on the known-truth bench
#: (``brief-offline-estimators``, ML-1M, 9 % relevant, skewed across users), 93.9 % with
#: ~11; few, skewed clusters are where cluster-robust intervals fail (Cameron and Miller
#: 2015). On the milder synthetic world of the tests 2-6 users covered 93-96 %.
MIN_USER_CLUSTERS = 5


def ppi_run(
    run: Any,
    users: Sequence[str],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    gold: Any,
    metric: str,
    frame: int,
    intervals: str = "auto",
) -> Estimate:
    """The PPI estimate of a linear ``metric@k`` for one run, by the gold sample's design:
    ``users`` -> ``clustered_ppi_mean`` on the users' metric values; a pair design in which
    some user holds 2+ gold pairs of this run's lists -> ``ppi_user_totals`` (users as
    clusters, each pair weighted by ``1 / pi``); otherwise (or ``intervals="iid"``) the iid
    ``ppi_metric``.

    Small samples (what a team labels: 100-300 pairs): every interval uses Student's t on
    its degrees of freedom (labelled clusters - 1, Welch-Satterthwaite for the clustered
    one; gold pairs - 1 for the iid one) instead of z, and lambda is power-tuned only with
    ``MIN_TUNED_CLUSTERS`` or more labelled clusters (else 1, classic PPI).

    Raises:
        ValueError: as the estimator chosen does (too few gold pairs), or a run whose gold
            pairs are all of one class (the message says how many more pairs to label).
    """
    from recjudge.evaluators.offline._ppi import clustered_ppi_mean, ppi_user_totals

    base, k = parse_metric(metric)
    w = metric_weights(base, k)
    labels = gold.labels
    per_user_gold: dict[str, int] = {}
    mine: list[int] = []
    for u in users:
        for i in run.rankings.get(u, [])[:k]:
            if (u, i) in labels:
                per_user_gold[u] = per_user_gold.get(u, 0) + 1
                mine.append(int(labels[(u, i)]))
    _require_both_classes(run, users, judged, mine, k)
    # unequal inclusion probabilities (stratified, active) are only weighed by the design-based
    # estimator: the iid one would take them as uniform
    weighted = gold.design in ("stratified", "active")
    clustered = weighted or (intervals != "iid" and (
        gold.design == "users" or max(per_user_gold.values(), default=0) > 1))  # fmt: skip
    tuned = (len(mine) if not clustered else len(per_user_gold)) >= MIN_TUNED_CLUSTERS
    lam = None if tuned else 1.0
    how = "power-tuned lambda" if tuned else (
        f"lambda 1: fewer than {MIN_TUNED_CLUSTERS} labelled clusters to tune it")  # fmt: skip
    if not clustered:
        p = _t_interval(ppi_metric(run, users, judged, labels, metric, lam=lam), p_df(len(mine)))
        return _ppi_estimate(metric, p, f"{p['n']} gold pairs, iid interval, t({p['df']:.0f}), "
                             f"{how}")  # fmt: skip
    require_judged([(u, i) for u in users for i in run.rankings.get(u, [])[:k]], judged)
    if gold.design == "users":
        _require_user_clusters(run, users, labels)
        c = clustered_ppi_mean(*_user_design_rows(run, users, judged, labels, k, w), lam=lam)
        return _ppi_estimate(
            metric,
            c,
            f"{c['n']} gold pairs of {c['clusters_labelled']} "
            f"users, clustered by user (GLIDE's clustered PPI++), t({c['df'] or 0:.1f}), {how}",
        )
    c = ppi_user_totals(*_weighted_user_totals(run, users, judged, gold, k, w, frame), lam=lam)
    return _ppi_estimate(
        metric,
        c,
        f"{sum(per_user_gold.values())} gold pairs of {c['gold_users']} users in its lists, "
        f"clustered by user (design-based, 1/pi weights), t({c['df']:.0f}), {how}",
    )


def p_df(n: int) -> float:
    """Degrees of freedom of an interval over ``n`` independent units: ``n - 1`` (at least
    1)."""
    return float(max(n - 1, 1))


def _t_interval(got: Mapping[str, Any], df: float, alpha: float = 0.05) -> dict[str, Any]:
    """``ppi_mean``'s normal interval (ppi-python's, kept equal to it) widened to Student's
    t on ``df`` degrees of freedom: the same standard error times ``t_{1-alpha/2, df}``."""
    from scipy.stats import t

    q = float(t.ppf(1 - alpha / 2, df))
    return {**got, "lo": got["value"] - q * got["se"], "hi": got["value"] + q * got["se"],
            "df": df}  # fmt: skip


def _require_both_classes(run: Any, users: Sequence[str], judged: Any, labels: Sequence[int],
                          k: int) -> None:  # fmt: skip
    """Refuse a run whose gold labels are one class (``MIN_CLASS_LABELS``), saying how many
    gold pairs would hold both: about ``5 / q`` for the rarer class's share ``q`` (the
    judge's mean probability on the run's lists; 5 expected labels of the rarer class, the
    normal approximation's usual rule)."""
    pos = int(sum(labels))
    neg = len(labels) - pos
    if len(labels) < 2 or min(pos, neg) >= MIN_CLASS_LABELS:
        return  # too few pairs: the estimator chosen says so in its own words
    p = [judged[(u, i)][0] for u in users for i in run.rankings.get(u, [])[:k]
         if (u, i) in judged]  # fmt: skip
    rate = float(np.mean(p)) if p else 0.5
    q = min(max(min(rate, 1 - rate), 1e-3), 0.5)
    need = int(math.ceil(5 / q))
    cls = "relevant (1)" if pos else "not relevant (0)"
    raise ValueError(
        f"{run.name}: all {len(labels)} gold pairs in its top-{k} lists are labelled {cls}: a "
        f"one-class sample gives no valid interval; label about {need} of its pairs (5 of the "
        f"rarer class at the judge's rate {rate:.2f}): `gold sample --n` with more pairs"
    )


def _require_user_clusters(run: Any, users: Sequence[str], labels: Mapping) -> None:
    """Refuse a ``users``-design interval from fewer than ``MIN_USER_CLUSTERS`` labelled
    users, saying how many more to label."""
    evaluated = set(users)
    g = len({u for u, _ in labels if u in evaluated})
    if g >= MIN_USER_CLUSTERS:
        return
    per_user = len(labels) / max(g, 1)
    raise ValueError(
        f"{run.name}: gold labels of {g} users; an interval from whole labelled users needs "
        f"{MIN_USER_CLUSTERS} (with 3-4 it covered 87 % of 95 % intervals on the known-truth "
        f"bench): label {MIN_USER_CLUSTERS - g} more users (about "
        f"{int(math.ceil((MIN_USER_CLUSTERS - g) * per_user))} pairs: `gold sample --design "
        "users --n` with more pairs), or draw pairs (`--design uniform`)"
    )


def _user_design_rows(run, users, judged, labels, k, w) -> tuple[list, list, list]:
    """(gold value or NaN, judge's value, user) per listed pair, scaled so that a user's
    mean is the user's metric: the rows ``clustered_ppi_mean`` takes (the ``users``
    design: a sampled user's pairs are all labelled; a sampled user without a list has a
    known 0)."""
    sampled = {u for u, _ in labels}
    y, yp, cl = [], [], []
    for u in users:
        top = run.rankings.get(u, [])[:k]
        if not top:  # no list: the metric is 0, known for a sampled user
            y.append(0.0 if u in sampled else np.nan)
            yp.append(0.0)
            cl.append(u)
        for r, i in enumerate(top):
            scale = len(top) * w[r]  # the cluster mean is then the user's metric
            y.append(scale * labels[(u, i)] if (u, i) in labels else np.nan)
            yp.append(scale * judged[(u, i)][0])
            cl.append(u)
    return y, yp, cl


def _weighted_user_totals(run, users, judged, gold, k, w, frame) -> tuple[list, list, list]:
    """Per user: the judge's metric, and the gold and judge's totals over the user's gold
    pairs weighted by 1 / inclusion probability (``ppi_user_totals``' inputs; a pair
    without one is taken as drawn uniformly, n_gold / frame)."""
    labels = gold.labels
    n_gold = len(labels)
    p_tot, g_tot, h_tot = [], [], []
    for u in users:
        pt = gt = ht = 0.0
        for r, i in enumerate(run.rankings.get(u, [])[:k]):
            p = judged[(u, i)][0]
            pt += w[r] * p
            if (u, i) in labels:
                pi = gold.inclusion.get((u, i), n_gold / frame)
                gt += w[r] * labels[(u, i)] / pi
                ht += w[r] * p / pi
        p_tot.append(pt)
        g_tot.append(gt)
        h_tot.append(ht)
    return p_tot, g_tot, h_tot


def _ppi_estimate(metric: str, got: Mapping[str, Any], note: str) -> Estimate:
    """A PPI estimator's result as the report's ``Estimate`` (its lambda in the note)."""
    return Estimate("ppi", metric, got["value"], (got["lo"], got["hi"]), judge_share=1.0,
                    note=f"{note}, lambda {got['lam']:.2f}")  # fmt: skip
