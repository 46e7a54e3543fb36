"""Bias audit of a judgments file: does the judge say YES more for popular items, long
histories or long titles than the labels justify?

For each factor the judged pairs are cut into (up to) ``bins`` quantile bins of the factor's
value, and per bin the audit reports the pairs, the judge's YES rate and mean ``p_yes`` and,
where labels are given (``calibrate``'s file format), the observed rate of relevant labels and
the gap ``mean p_yes - observed rate`` (the bin's calibration error, signed). A YES rate that
climbs with popularity while the labels do not is a popularity bias of the judge.

Factors: ``item_popularity`` (the item's interactions in the dataset), ``history_length``
(the user's interactions) and ``title_length`` (characters of the item's title).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

FACTORS = ("item_popularity", "history_length", "title_length")


def quantile_bins(values: np.ndarray, bins: int) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Bin index of each value by quantiles (ties kept together, so fewer bins may result)
    and each bin's value range."""
    edges = np.unique(np.quantile(values, np.linspace(0, 1, bins + 1)))
    if len(edges) < 2:
        return np.zeros(len(values), dtype=int), [(float(values.min()), float(values.max()))]
    which = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, len(edges) - 2)
    used = sorted(set(which.tolist()))
    remap = {b: j for j, b in enumerate(used)}
    which = np.array([remap[b] for b in which])
    ranges = [(float(values[which == j].min()), float(values[which == j].max()))
              for j in range(len(used))]  # fmt: skip
    return which, ranges


def audit(
    pairs: Sequence[tuple[str, str]],
    p_yes: Sequence[float],
    yes: Sequence[bool],
    factors: Mapping[str, Sequence[float]],
    labels: Sequence[int | None] | None = None,
    bins: int = 10,
) -> dict[str, list[dict[str, Any]]]:
    """Per factor, per bin: its range, pairs, YES rate, mean p_yes and, for the labelled
    pairs of the bin, their number, observed rate and ``mean p_yes - observed`` gap.

    Args:
        pairs: the judged (user, item) pairs.
        p_yes / yes: the judge's probability and verdict per pair.
        factors: per factor name, one value per pair.
        labels: a trusted label per pair, or None where there is none.
        bins: quantile bins per factor.
    """
    p = np.asarray(p_yes, dtype=float)
    y = np.asarray(yes, dtype=float)
    lab = None if labels is None else np.array([np.nan if v is None else v for v in labels],
                                                dtype=float)  # fmt: skip
    out: dict[str, list[dict[str, Any]]] = {}
    for name, vals in factors.items():
        v = np.asarray(vals, dtype=float)
        which, ranges = quantile_bins(v, bins)
        rows = []
        for b, (lo, hi) in enumerate(ranges):
            m = which == b
            row: dict[str, Any] = {"lo": lo, "hi": hi, "pairs": int(m.sum()),
                                   "yes_rate": float(y[m].mean()),
                                   "mean_p_yes": float(p[m].mean())}  # fmt: skip
            if lab is not None:
                lm = m & ~np.isnan(lab)
                row["labelled"] = int(lm.sum())
                if lm.any():
                    row["observed_rate"] = float(lab[lm].mean())
                    row["gap"] = float(p[lm].mean() - lab[lm].mean())
            rows.append(row)
        out[name] = rows
    return out


def audit_factors(ds: Any, pairs: Sequence[tuple[str, str]]) -> dict[str, list[float]]:
    """The audit's factor values for each pair, from the dataset the judge read."""
    from recjudge.data import item_title

    inter = ds.interactions
    pop = inter["item_id"].astype(str).value_counts().to_dict()
    hist = inter["user_id"].astype(str).value_counts().to_dict()
    titles = {str(r["item_id"]): item_title(r) for r in ds.items.to_dict("records")}
    return {
        "item_popularity": [float(pop.get(i, 0)) for _, i in pairs],
        "history_length": [float(hist.get(u, 0)) for u, _ in pairs],
        "title_length": [float(len(titles.get(i, i))) for _, i in pairs],
    }


def audit_lines(result: Mapping[str, Any], header: Sequence[str]) -> list[str]:
    """The audit report: one table per factor."""
    lines = list(header)
    for name, rows in result.items():
        labelled = any("labelled" in r for r in rows)
        lines += ["", f"## {name.replace('_', ' ')}", ""]
        cols = "| bin | pairs | YES rate | mean p_yes |"
        sep = "|---|---|---|---|"
        if labelled:
            cols += " labelled | observed rate | p_yes - observed |"
            sep += "---|---|---|"
        lines += [cols, sep]
        for r in rows:
            line = (f"| {r['lo']:g}-{r['hi']:g} | {r['pairs']} | {r['yes_rate']:.3f} | "
                    f"{r['mean_p_yes']:.3f} |")  # fmt: skip
            if labelled:
                obs = f"{r['observed_rate']:.3f}" if "observed_rate" in r else "-"
                gap = f"{r['gap']:+.3f}" if "gap" in r else "-"
                line += f" {r['labelled']} | {obs} | {gap} |"
            lines.append(line)
    return lines


def plot_audit(result: Mapping[str, Any], path: str | Path) -> None:
    """YES rate (and observed rate where labelled) per bin, one line per factor."""
    from recjudge.reporting import figure

    with figure(path, size=(6.5, 4)) as ax:
        for name, rows in result.items():
            x = np.arange(1, len(rows) + 1)
            (line,) = ax.plot(x, [r["yes_rate"] for r in rows], marker="o",
                              label=f"{name}: YES rate")  # fmt: skip
            obs = [(i + 1, r["observed_rate"]) for i, r in enumerate(rows) if "observed_rate" in r]
            if obs:
                ax.plot(*zip(*obs, strict=True), ls="--", color=line.get_color(),
                        label=f"{name}: observed")  # fmt: skip
        ax.set_xlabel("quantile bin of the factor (low to high)")
        ax.set_ylabel("rate")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
