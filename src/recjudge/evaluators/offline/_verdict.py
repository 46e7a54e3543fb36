"""The answer a team acts on: which estimator leads, and per metric which system is better.

**The lead rule** (``choose_lead``), decided from this evaluation's own data, never from a
file elsewhere (docs/trust.md states it):

1. gold labels that label every listed pair: ``labels`` (each evaluated user's metric is
   known; the interval is over resampled users only);
2. gold labels: ``ppi`` (prediction-powered: valid whatever the judge's bias, as long as the
   gold design is the recorded one);
3. propensities fitted to the log or given in a file (not an assumed ``powerlaw:EXP``) and
   inverse-propensity weights that are not fragile (``_evaluation.weight_diagnostics``):
   ``dr`` for a calibrated judge, else ``snips`` (Yang et al. 2018; Saito 2020);
4. otherwise the judge's own estimate, marked **without guarantee**: ``dm`` for a calibrated
   judge, else ``imputed`` (the BRIEF paper's protocol): nothing here bounds its bias.

A step is taken only where its estimator is defined for every system.

**The verdict** (``verdict_table``): per metric and pair of systems, the lead estimator's
paired difference ``a - b`` with its 95 % interval (the same resamples for both systems,
``_evaluation.paired_difference``; PPI's from ``_gold_ppi.ppi_difference``). One rule
decides: an interval above 0 says ``a`` is better, below 0 ``b``, one that holds 0 says
"not separable at this size" with how much more data would separate the observed difference
at 80 % power (two-sided 5 %: a half-width of ``delta * 1.96 / 2.80``, the sample growing as
``(half / target)^2``). Ranks come from the same pairwise intervals: a system's rank interval
is ``[1 + systems surely better, n - systems surely worse]`` (not adjusted for multiplicity).
No p-value is printed beside an interval: the interval is the test.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from recjudge.evaluators.offline._estimators import LINEAR, metric_weights, parse_metric
from recjudge.evaluators.offline._evaluation import metric_range
from recjudge.evaluators.offline._gold import listed_pairs

__all__ = [
    "LEAD_RULE",
    "Advice",
    "choose_lead",
    "judge_spread",
    "verdict_frame",
    "verdict_lines",
    "verdict_table",
]

LEAD_RULE = (
    "gold labels of every listed pair: the labels alone; gold labels: PPI; propensities "
    "fitted (or given) with stable weights: DR for a calibrated judge, else SNIPS; otherwise "
    "the judge's own estimate (DM calibrated, else imputed), without guarantee"
)
#: the smallest difference the advice plans for, as a share of the metric's range: below it
#: "not separable" says what separating this much would take
MIN_EFFECT = 0.01
_Z, _POWER_Z = 1.959964, 1.959964 + 0.841621  # two-sided 5 %; 80 % power


@dataclass(frozen=True)
class Advice:
    """What the "not separable" advice needs to write its command.

    Attributes:
        runs: the ``--runs`` spec as given.
        qrels: the ``--qrels`` folder (None: logged feedback only).
        k: the cut-off.
        gold_pairs: labelled pairs in the gold sample (0: none).
    """

    runs: str
    qrels: str | None
    k: int
    gold_pairs: int = 0


def _defined(systems: Mapping[str, Any], metric: str, e: str) -> bool:
    return bool(systems) and all(
        (by.get(metric, {}).get(e) or {}).get("value") is not None for by in systems.values()
    )


def choose_lead(got: Mapping[str, Any], wanted: Sequence[str], metric: str, calibrated: bool,
                propensities: str) -> dict[str, Any]:  # fmt: skip
    """The estimator that leads ``metric`` under the lead rule (module docstring).

    Returns:
        ``{"estimator", "metric", "guarantee" (bool), "why"}``.
    """
    systems = got.get("systems") or {}
    if _defined(systems, metric, "labels"):
        return _lead("labels", metric, True, "every listed pair is labelled: each evaluated "
                     "user's metric is known; the interval is over resampled users")  # fmt: skip
    has_gold = got.get("gold", "none") != "none"
    if has_gold and _defined(systems, metric, "ppi"):
        return _lead("ppi", metric, True, "gold labels: prediction-powered inference, valid "
                     "whatever the judge's bias under the recorded gold design")  # fmt: skip
    weights = got.get("weights") or {}
    fragile = [n for n, d in weights.items() if d.get("verdict") == "fragile"]
    assumed = propensities.startswith("powerlaw")
    why_not = "PPI is undefined for some system (see its note); " if has_gold else ""
    if not fragile and not assumed:
        for e in ("dr", "snips") if calibrated else ("snips", "dr"):
            if e in wanted and _defined(systems, metric, e):
                return _lead(e, metric, True, f"{why_not}no usable gold labels; propensities "
                             f"{propensities} with stable inverse-propensity weights")  # fmt: skip
    reason = (f"the weights of {', '.join(fragile)} are fragile" if fragile else
              f"the propensities are assumed ({propensities}), not fitted" if assumed else
              "no weighted estimator is defined for every system")  # fmt: skip
    for e in ("dm", "imputed") if calibrated else ("imputed", "dm"):
        if e in wanted and _defined(systems, metric, e):
            return _lead(e, metric, False, f"{why_not}{reason}: the judge's own estimate, "
                         "WITHOUT GUARANTEE (nothing bounds the judge's bias); label gold "
                         "pairs for one with a guarantee")  # fmt: skip
    first = next((e for e in wanted if _defined(systems, metric, e)), wanted[0])
    return _lead(
        first,
        metric,
        first in ("dr", "snips", "ips"),
        f"{why_not}{reason}; the first estimator defined for every system",
    )


def _lead(e: str, metric: str, guarantee: bool, why: str) -> dict[str, Any]:
    return {"estimator": e, "metric": metric, "guarantee": guarantee, "why": why}


def _range(metric: str) -> float:
    """``metric_range``, and 1 for ranx's names (ndcg@10, recall@10) on logged feedback."""
    try:
        return metric_range(metric)
    except ValueError:  # not an estimator's metric name: ranx's, in [0, 1]
        return 1.0


def judge_spread(
    terms: Sequence[tuple[float, Any]],
    users: Sequence[str],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    metric: str,
) -> tuple[float, float]:
    """Per user, ``sum_s sign_s M_s(u)`` under the judge's probabilities (``terms``: ``(sign,
    run)``; one run for its metric, ``(1, a), (-1, b)`` for a difference): its mean over the
    users and one labelled user's standard deviation (the spread of the judge's values plus
    the Bernoulli variance of its labels), to plan a gold sample. A pair the judge did not
    answer counts as p = 0.5."""
    base, k = parse_metric(metric)
    w = metric_weights(base, k) if base in LINEAR else 1.0 / np.arange(1, k + 1)
    vals, within = [], []
    for u in users:
        v = var = 0.0
        for sign, run in terms:
            p = np.array([judged.get((u, i), (0.5, False))[0]
                          for i in run.rankings.get(u, [])[:k]])  # fmt: skip
            v += sign * float(p @ w[: len(p)])
            var += float((p * (1 - p)) @ (w[: len(p)] ** 2))
        vals.append(v)
        within.append(var)
    if len(vals) < 2:
        return (float(vals[0]) if vals else 0.0), 0.0
    return float(np.mean(vals)), float(np.sqrt(np.var(vals, ddof=1) + np.mean(within)))


def _advice(d: Mapping[str, Any], metric: str, lead: str, pair: tuple[str, str], ctx: Advice,
            runs: Mapping[str, Any], users: Sequence[str],
            judged: Mapping[tuple[str, str], tuple[float, bool]]) -> dict[str, Any]:  # fmt: skip
    """How much more data would separate the observed difference (module docstring)."""
    delta = max(abs(d["value"]), MIN_EFFECT * _range(metric))
    target = delta * _Z / _POWER_Z
    half = (d["ci"][1] - d["ci"][0]) / 2
    scale = (half / target) ** 2
    what = f"to separate a difference of {delta:.4f} at 80 % power"
    sample = f"recjudge gold sample --runs {ctx.runs} --qrels {ctx.qrels} --k {ctx.k}"
    if ctx.qrels is None or lead == "labels":
        more = int(math.ceil(len(users) * scale))
        how = ("evaluate more users: every listed pair is already labelled" if lead == "labels"
               else "evaluate more users (a longer or wider log)")  # fmt: skip
        return {"users": more, "text": f"{what}, about {more} users ({len(users)} now): {how}"}
    frame = len(listed_pairs([runs[pair[0]], runs[pair[1]]], users, ctx.k))
    if lead == "ppi" and ctx.gold_pairs:
        total = int(math.ceil(ctx.gold_pairs * scale))
        if total <= frame:
            return {"pairs": total, "command": f"{sample} --n {total} --out gold.csv",
                    "text": f"{what}, about {total} gold pairs ({ctx.gold_pairs} now): label "
                            f"about {total - ctx.gold_pairs} more"}  # fmt: skip
        return {"pairs": frame, "text": f"{what}, more gold pairs than these lists hold "
                f"({frame}): impute more users (--users) and label their pairs"}  # fmt: skip
    _, sd = judge_spread([(1.0, runs[pair[0]]), (-1.0, runs[pair[1]])], users, judged, metric)
    need = int(math.ceil((_POWER_Z * sd / delta) ** 2)) if sd > 0 else 0
    if need <= 1:
        return {"text": f"{what}: gold labels would decide it (the judge's lists differ "
                        "too little to plan a size)"}  # fmt: skip
    if need > len(users):
        return {"users": need, "text": f"{what}, about {need} labelled users, more than the "
                f"{len(users)} evaluated: impute more users (--users {need}), then label "
                "gold pairs"}  # fmt: skip
    pairs = int(math.ceil(need * frame / max(len(users), 1)))
    return {"pairs": pairs, "command": f"{sample} --n {pairs} --out gold.csv",
            "text": f"{what}, label about {pairs} gold pairs (the labels alone; PPI needs "
                    "fewer the better the judge agrees)"}  # fmt: skip


def _verdict(d: Mapping[str, Any], a: str, b: str) -> tuple[str, str]:
    """(``a``, ``b``, ``tie`` or ``undefined``; the sentence)."""
    v, ci = d.get("value"), d.get("ci")
    if v is None or not ci or ci[0] is None:
        return "undefined", f"{a} vs {b}: undefined ({d.get('note') or 'no interval'})"
    lo, hi = ci
    if lo > 0:
        return a, f"{a} better than {b} by {v:.4f} [{lo:.4f}, {hi:.4f}]"
    if hi < 0:
        return b, f"{b} better than {a} by {-v:.4f} [{-hi:.4f}, {-lo:.4f}]"
    return "tie", f"{a} vs {b}: not separable at this size ({v:+.4f} [{lo:+.4f}, {hi:+.4f}])"


def verdict_table(
    differences: Mapping[str, Mapping[str, Mapping[str, Any]]],
    leads: Mapping[str, Mapping[str, Any]],
    runs: Sequence[Any],
    users: Sequence[str],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    ctx: Advice,
) -> dict[str, dict[str, Any]]:
    """Per metric: the lead estimator (``leads[metric]``, ``choose_lead``'s), one row per pair
    of systems (the difference, its interval, ``better`` and the sentence, and for a pair
    not separable how much more data would separate it), and each system's rank with its
    interval from the same pairwise intervals.

    Args:
        differences: ``{metric: {estimator: {"a - b": {"value", "ci"}}}}``.
        leads: ``{metric: choose_lead(...)}``.
    """
    by_name = {r.name: r for r in runs}
    names = list(by_name)
    out: dict[str, dict[str, Any]] = {}
    for metric, lead in leads.items():
        e = lead["estimator"]
        diffs = (differences.get(metric) or {}).get(e) or {}
        rows, better, worse = [], {n: 0 for n in names}, {n: 0 for n in names}
        above = {n: 0 for n in names}
        for a, b in itertools.combinations(names, 2):
            d = dict(diffs.get(f"{a} - {b}") or {"value": None, "ci": None})
            who, text = _verdict(d, a, b)
            row = {"a": a, "b": b, "value": d.get("value"), "ci": d.get("ci"),
                   "better": None if who in ("tie", "undefined") else who,
                   "separable": who not in ("tie", "undefined"), "text": text}  # fmt: skip
            if who == "tie":
                row["advice"] = _advice(d, metric, e, (a, b), ctx, by_name, users, judged)
                row["text"] += f": {row['advice']['text']}"
            elif who != "undefined":
                loser = b if who == a else a
                better[loser] += 1
                worse[who] += 1
            if d.get("value") is not None:
                above[b if d["value"] > 0 else a] += d["value"] != 0
            rows.append(row)
        n = len(names)
        ranks = {s: {"rank": 1 + above[s], "rank_ci": [1 + better[s], n - worse[s]]}
                 for s in names}  # fmt: skip
        out[metric] = {**lead, "rows": rows, "ranks": ranks}
    return out


def verdict_lines(verdicts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's opening section: per metric, the lead estimator and why, the verdict per
    pair of systems, and the ranks with their intervals."""
    if not verdicts:
        return []
    lines = ["", "## Verdict", ""]
    for metric, v in verdicts.items():
        mark = "" if v.get("guarantee") else " **(without guarantee)**"
        lines += [
            f"### {metric}: {v['estimator']}{mark}",
            "",
            f"Lead estimator: {v['why']}.",
            "",
            "| systems | difference a - b [95 % CI] | verdict |",
            "|---|---|---|",
        ]
        for r in v["rows"]:
            shown = ("undefined" if r["value"] is None or not r["ci"] else
                     f"{r['value']:+.4f} [{r['ci'][0]:+.4f}, {r['ci'][1]:+.4f}]")  # fmt: skip
            lines.append(f"| {r['a']} - {r['b']} | {shown} | {r['text']} |")
        lines += ["", "Ranks (1 = best; 95 % interval from the pairwise intervals above): "
                  + "; ".join(f"{s} {x['rank']} [{x['rank_ci'][0]}, {x['rank_ci'][1]}]"
                              for s, x in v["ranks"].items()), ""]  # fmt: skip
    return lines


def verdict_frame(res: Mapping[str, Any]) -> Any:
    """The verdict table of an ``evaluate`` result as a pandas DataFrame: one row per metric
    and pair of systems (``metric, estimator, guarantee, a, b, difference, ci_low, ci_high,
    better, verdict``)."""
    rows = []
    for metric, v in (res.get("verdicts") or {}).items():
        for r in v["rows"]:
            ci = r.get("ci") or [None, None]
            rows.append({"metric": metric, "estimator": v["estimator"],
                         "guarantee": v.get("guarantee"), "a": r["a"], "b": r["b"],
                         "difference": r["value"], "ci_low": ci[0], "ci_high": ci[1],
                         "better": r["better"], "verdict": r["text"]})  # fmt: skip
    cols = ["metric", "estimator", "guarantee", "a", "b", "difference", "ci_low", "ci_high",
            "better", "verdict"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)
