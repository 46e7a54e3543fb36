"""Estimates from a gold sample (labels a person gave): prediction-powered inference on a
metric per system (``ppi_run``, ``ppi_metric``) and the checks a design needs (both classes,
enough labelled users); the gold file reader is ``_gold.read_gold``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from recjudge.evaluators.offline._estimators import (
    LINEAR,
    Estimate,
    ListLabels,
    metric_weights,
    parse_metric,
)
from recjudge.evaluators.offline._ppi import clustered_ppi_mean, ppi_user_totals


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
#: zero-width or one-sided intervals (``1.0 [1.0, 1.0]``); with one label of the rarer class
#: the spread and skewness rest on that one pair: on the known-truth bench
#: (``brief-offline-estimators``, pair designs, 100-1,000 gold pairs; ``scripts/
#: ppi_interval_diag.py``) such intervals covered 80.6 % (symmetric t) and 92.3 % (Hall's,
#: ``_ppi.hall_interval``), and with them the active design's @20 cells at 100 gold pairs
#: covered 87.8-88.3 % (91.0-91.3 % without them).
MIN_CLASS_LABELS = 2


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
    labels_only: bool = False,
) -> Estimate:
    """The PPI estimate of a linear ``metric@k`` for one run, by the gold sample's design:
    ``users`` -> ``clustered_ppi_mean`` on the users' metric values; a pair design in which
    some user holds 2+ gold pairs of this run's lists -> ``ppi_user_totals`` (users as
    clusters, each pair weighted by ``1 / pi``); otherwise (or ``intervals="iid"``) the iid
    ``ppi_metric``.

    Small samples (what a team labels: 100-300 pairs): every interval uses Student's t on
    its degrees of freedom (labelled clusters - 1, Welch-Satterthwaite for the clustered
    one; gold pairs - 1 for the iid one) instead of z, and lambda is power-tuned only with
    ``MIN_TUNED_CLUSTERS`` or more labelled clusters (else 1, classic PPI). The design-based
    interval is Hall's skewness-corrected one (``_ppi``); ``MIN_CLASS_LABELS`` of each class.

    ``labels_only``: the same design's estimate from the gold labels alone, what the team has
    without a judge (the yardstick of the judge's worth, ``_worth``): the judge replaced by
    the constant 1, a control variate that carries no information on any pair but takes out
    the variance of how many gold pairs a user drew (the ratio estimator's efficiency;
    lambda power-tuned as above, 0 (Horvitz-Thompson) below the cluster floor). For the iid
    and users designs it is the plain (cluster) mean of the gold labels.

    Raises:
        ValueError: as the estimator chosen does (too few gold pairs), or a run with fewer
            than ``MIN_CLASS_LABELS`` gold labels of a class (the message says how many more
            pairs to label).
    """
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
    lam = None if tuned else 0.0 if labels_only else 1.0
    how = "power-tuned lambda" if tuned else (
        f"lambda 1: fewer than {MIN_TUNED_CLUSTERS} labelled clusters to tune it")  # fmt: skip
    if labels_only:
        judged = {key: (1.0, hard) for key, (_, hard) in judged.items()}
        how = f"the gold labels alone (a constant 1 for the judge), {how.replace(' 1:', ' 0:')}"
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
    c = ppi_user_totals(*_weighted_user_totals(run, users, judged, gold, k, w, frame), lam=lam,
                        holders=len(per_user_gold))  # fmt: skip
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
    """Refuse a run with fewer than ``MIN_CLASS_LABELS`` gold labels of either class,
    saying how many gold pairs would hold enough: about ``5 / q`` for the rarer class's share
    ``q`` (its share in the sample; with none of it, the judge's mean probability on the
    run's lists; 5 expected labels of the rarer class, the normal approximation's usual
    rule)."""
    pos = int(sum(labels))
    neg = len(labels) - pos
    rarer = min(pos, neg)
    if len(labels) < 2 or rarer >= MIN_CLASS_LABELS:
        return  # too few pairs: the estimator chosen says so in its own words
    source = "sample"
    if rarer:  # the sample's own rate of the rarer class says more than the judge's
        rate = pos / len(labels)
    else:
        p = [judged[(u, i)][0] for u in users for i in run.rankings.get(u, [])[:k]
             if (u, i) in judged]  # fmt: skip
        rate, source = (float(np.mean(p)) if p else 0.5), "judge"
        # none of n labels in the rarer class: its share is below 3 / n with 95 % confidence
        # (the rule of three), whatever the judge says
        bound = 3 / len(labels)
        if min(rate, 1 - rate) > bound:
            rate, source = (bound if pos == 0 else 1 - bound), "rule of three"
    q = min(max(min(rate, 1 - rate), 1e-3), 0.5)
    need = int(math.ceil(5 / q))
    more = max(need - len(labels), 1)
    if rarer == 0:
        cls = "relevant (1)" if pos else "not relevant (0)"
        what = (f"all {len(labels)} gold pairs in its top-{k} lists are labelled {cls}: a "
                "one-class sample gives no valid interval")  # fmt: skip
    else:
        cls = "relevant (1)" if pos < neg else "not relevant (0)"
        few = "that one pair" if rarer == 1 else f"those {rarer} pairs"
        what = (f"{rarer} of its {len(labels)} gold pairs in its top-{k} lists "
                f"{'is' if rarer == 1 else 'are'} labelled {cls}: the interval's spread would "
                f"rest on {few} (with one it covered 81-92 % of 95 % intervals on the "
                f"known-truth bench); {MIN_CLASS_LABELS} of each class are needed")  # fmt: skip
    why = {"sample": f"the sample's rate {rate:.3f}", "judge": f"the judge's rate {rate:.3f}",
           "rule of three": f"a rate below {min(rate, 1 - rate):.3f}, the rule of three on "
                            f"{len(labels)} pairs without one"}[source]  # fmt: skip
    raise ValueError(
        f"{run.name}: {what}; about {need} of its pairs hold 5 of the rarer class at {why}: "
        f"label about {more} more ({len(labels)} labelled now; `gold sample --n` with more "
        "pairs)"
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


def _user_value(run: Any, u: str, values: Mapping[tuple[str, str], float], k: int,
                w: np.ndarray) -> float | None:  # fmt: skip
    """``sum_r w_r values[(u, i_r)]`` over ``run``'s top-k for ``u`` (0 for no list); None
    when a listed pair has no value."""
    total = 0.0
    for r, i in enumerate(run.rankings.get(u, [])[:k]):
        v = values.get((u, i))
        if v is None:
            return None
        total += w[r] * v
    return total


def ppi_difference(
    run_a: Any,
    run_b: Any,
    users: Sequence[str],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    gold: Any,
    metric: str,
    frame: int,
) -> dict[str, Any]:
    """The PPI estimate of ``M_a - M_b`` (a linear ``metric@k`` of two runs on the same
    users and the same gold sample) with its 95 % interval, by the gold design: a linear
    metric's difference is itself linear in the labels, so the estimators of ``ppi_run``
    apply to the per-user differences. ``users``: ``clustered_ppi_mean`` with one row per
    user (``M_a(u) - M_b(u)`` from the labels where the user was sampled, the judge's
    difference everywhere); a pair design: ``ppi_user_totals`` on the differences of the two
    runs' weighted totals (``_weighted_user_totals``), users as clusters, Hall's interval;
    lambda power-tuned from ``MIN_TUNED_CLUSTERS`` labelled users, else 1.

    Returns:
        ``{"value", "ci": [lo, hi], "note"}``.

    Raises:
        ValueError: too few labelled users, a partly labelled sampled user, or no spread.
    """
    base, k = parse_metric(metric)
    if base not in LINEAR:
        raise ValueError(f"PPI here is for the linear metrics ({', '.join(LINEAR)}): {metric}")
    w = metric_weights(base, k)
    labels = gold.labels
    for run in (run_a, run_b):
        require_judged([(u, i) for u in users for i in run.rankings.get(u, [])[:k]], judged)
    probs = {key: p for key, (p, _) in judged.items()}
    if gold.design == "users":
        sampled = {u for u, _ in labels}
        y, yp = [], []
        for u in users:
            ja = _user_value(run_a, u, probs, k, w) or 0.0
            jb = _user_value(run_b, u, probs, k, w) or 0.0
            yp.append(ja - jb)
            if u not in sampled:
                y.append(np.nan)
                continue
            ga, gb = (_user_value(r, u, labels, k, w) for r in (run_a, run_b))
            if ga is None or gb is None:
                raise ValueError(f"user {u} of the users design has listed pairs without a "
                                 "gold label: label every pair of a sampled user")  # fmt: skip
            y.append(ga - gb)
        n_lab = int(np.sum(~np.isnan(y)))
        lam = None if n_lab >= MIN_TUNED_CLUSTERS else 1.0
        c = clustered_ppi_mean(y, yp, list(users), lam=lam)
        return {"value": c["value"], "ci": [c["lo"], c["hi"]],
                "note": f"clustered PPI++ on the per-user differences, {n_lab} labelled users, "
                        f"t({c['df'] or 0:.1f}), lambda {c['lam']:.2f}"}  # fmt: skip
    ta = _weighted_user_totals(run_a, users, judged, gold, k, w, frame)
    tb = _weighted_user_totals(run_b, users, judged, gold, k, w, frame)
    p, g, h = (np.asarray(x) - np.asarray(y) for x, y in zip(ta, tb, strict=True))
    holders = sum(any((u, i) in labels for r in (run_a, run_b)
                      for i in r.rankings.get(u, [])[:k]) for u in users)  # fmt: skip
    lam = None if holders >= MIN_TUNED_CLUSTERS else 1.0
    c = ppi_user_totals(p, g, h, lam=lam, holders=holders)
    return {"value": c["value"], "ci": [c["lo"], c["hi"]],
            "note": f"design-based PPI on the per-user differences (1/pi weights), "
                    f"{holders} users with gold pairs, t({c['df']:.0f}), Hall's interval, "
                    f"lambda {c['lam']:.2f}"}  # fmt: skip


def every_listed_labelled(runs: Sequence[Any], users: Sequence[str], gold: Any, k: int) -> bool:
    """Whether the gold sample labels every top-k pair any run lists for ``users`` (then
    each user's metric is known exactly and the labels alone give the estimate)."""
    labels = gold.labels
    return all((u, i) in labels for run in runs for u in users
               for i in run.rankings.get(u, [])[:k])  # fmt: skip


def labels_lists(run: Any, users: Sequence[str], labels: Mapping[tuple[str, str], int],
                 k: int) -> dict[str, ListLabels]:  # fmt: skip
    """One run's lists with every listed pair's gold label as an observed label of
    propensity 1: ``estimate``'s ``logged`` on them is the metric itself, per user."""
    out = {}
    for u in users:
        y = np.array([float(labels[(u, i)]) for i in run.rankings.get(u, [])[:k]])
        ones = np.ones(len(y))
        out[u] = ListLabels(ones, y, y, y, ones)
    return out
