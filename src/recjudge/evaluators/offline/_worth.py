"""What the judge is worth on the team's own data: how much narrower its intervals are than
what the team has without it, per system and metric (issue 88's question, asked of every
evaluation rather than of one bench).

Two comparisons, each on the same users, lists and gold sample:

- **PPI against the gold labels alone.** ``ppi`` (the judge's predictions rectified by the
  gold labels) against the same design's estimate from the labels alone (``ppi_run`` with
  ``labels_only``: the judge replaced by a constant, which knows nothing of any pair; for a
  pair design it still takes out the variance of how many gold pairs each user drew, so a
  blind judge scores about 1x, not a gain). Widths scale as ``1 / sqrt(n)``, so the gold
  labels alone would need ``n (w_labels / w_ppi)^2`` pairs for PPI's width: the judge is
  worth ``n ((w_labels / w_ppi)^2 - 1)`` more gold pairs (the effective sample size reading
  of Angelopoulos et al., "Prediction-powered inference", Science 2023, and PPI++, 2023).
- **DR against SNIPS.** DR (the judge imputes every listed pair, the logged labels correct
  it with inverse-propensity weights) against SNIPS (the logged labels alone, self-normalised
  weights, no judge): what the judge adds to propensity weighting of the log.

A ratio below 1 is the share of the interval the judge removed; above 1 it made the interval
wider (PPI with lambda 1 on few labelled clusters can; DR with a judge far from the labels
can). These describe this evaluation's intervals, not a population quantity: the same
judge on another sample gives other ratios.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["judge_worth", "worth_lines"]


def _width(e: Mapping[str, Any] | None) -> float | None:
    """The width of an estimate's interval (None: undefined or no interval)."""
    if not e or e.get("value") is None or not e.get("ci"):
        return None
    lo, hi = e["ci"]
    return float(hi - lo)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den


def judge_worth(
    systems: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]],
    labels_only: Mapping[str, Mapping[str, Mapping[str, Any]]],
    gold_pairs: Mapping[str, Mapping[str, int]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per system and metric, the judge's intervals against those without it.

    Args:
        systems: ``estimate_evaluation``'s ``systems`` (system -> metric -> estimator ->
            ``Estimate.to_dict()``), with ``ppi`` where gold was given.
        labels_only: system -> metric -> the labels-only estimate (``ppi_run`` with
            ``labels_only=True``) as ``Estimate.to_dict()``.
        gold_pairs: system -> metric -> gold pairs in its top-k lists at the metric's k
            (``n`` of the label equivalent).

    Returns:
        system -> metric -> ``{"ppi_over_labels": w_ppi / w_labels, "label_equivalent":
        n (w_labels / w_ppi)^2, "gold_pairs": n, "dr_over_snips": w_dr / w_snips,
        "labels_only": the labels-only estimate}``; a ratio is None where either interval is
        undefined (a labels-only interval of width 0: every listed pair labelled), and a system
        or metric with neither PPI nor a DR ratio is left out.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, by_metric in systems.items():
        for metric, by_est in by_metric.items():
            w_ppi = _width(by_est.get("ppi"))
            w_lab = _width((labels_only.get(name) or {}).get(metric))
            n = (gold_pairs.get(name) or {}).get(metric, 0)
            ppi = _ratio(w_ppi, w_lab)
            row = {
                "ppi_over_labels": ppi,
                "gold_pairs": n,
                "label_equivalent": None if not ppi else n / ppi**2,
                "dr_over_snips": _ratio(_width(by_est.get("dr")), _width(by_est.get("snips"))),
                "labels_only": (labels_only.get(name) or {}).get(metric),
            }
            if w_ppi is not None or row["dr_over_snips"] is not None:
                out.setdefault(name, {})[metric] = row
    return out


def _pct(r: float) -> str:
    """A width ratio as the change it made: ``-23 %`` narrower, ``+5 %`` wider."""
    return f"{r - 1:+.0%}".replace("%", " %")


def worth_lines(worth: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """The report's section: one table row per system and metric, and a plain sentence."""
    if not worth:
        return []
    f = lambda r: "n/a" if r is None else f"{r:.2f}x ({_pct(r)})"  # noqa: E731
    lines = ["", "## What the judge is worth here", "",
             "Each interval with the judge against the same one without it, on these users and "
             "this gold sample: PPI against the gold labels alone, DR against SNIPS "
             "(the logged labels alone). Below 1x the judge narrowed the interval; the label "
             "equivalent is how many gold pairs the labels alone would need for PPI's width.",
             "", "| system | metric | PPI width / labels-only | label equivalent | "
             "DR width / SNIPS |", "|---|---|---|---|---|"]  # fmt: skip
    for name, by_metric in worth.items():
        for metric, r in by_metric.items():
            eq = ("n/a" if r["label_equivalent"] is None else
                  f"{r['label_equivalent']:.0f} (has {r['gold_pairs']})")  # fmt: skip
            lines.append(f"| {name} | {metric} | {f(r['ppi_over_labels'])} | {eq} | "
                         f"{f(r['dr_over_snips'])} |")  # fmt: skip
    return lines
