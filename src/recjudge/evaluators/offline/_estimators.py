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

Beside this module (the formulas and ``estimate``): the propensities (``_propensities``), the
estimators on a whole evaluation (``_evaluation``: the systems' lists, ``estimate_runs``,
``estimate_evaluation``, rank intervals, diagnostics), estimates from a gold sample
(``_gold_ppi``) and the Open Bandit Pipeline export (``_obp``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recjudge._metrics import discount
from recjudge._registry import Registry
from recjudge._stats import bootstrap_ci, user_draws


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
    #: the Student's t quantile of an interval ``value +- t sd(boot)`` (the OUA bootstrap);
    #: None: the percentile interval of ``boot`` (a paired difference takes the same kind)
    t_quantile: float | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The estimate without its per-user values (what reports and ``--json`` carry);
        every key is present, None where undefined (``rank`` and ``rank_ci`` are filled in
        where the systems share bootstrap draws: ``_evaluation.rank_intervals``)."""
        return {"estimator": self.estimator, "metric": self.metric, "value": self.value,
                "ci": list(self.ci) if self.ci else None, "judge_share": self.judge_share,
                "note": self.note, "rank": None, "rank_ci": None}  # fmt: skip


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
        oua = t_oua if p_draws is not None and spec.reads_p and idx is not None else None
        out.append(Estimate(est, name, float(arr.mean()), ci, arr.tolist(),
                            share if spec.judged else 0.0, boot=boot, t_quantile=oua))  # fmt: skip
    return out
