"""Bias audit of a judgments file: does the judge say YES more for popular items, long
histories or long titles than the labels justify?

For each factor the judged pairs are cut into (up to) ``bins`` quantile bins of the factor's
value, and per bin the audit reports the pairs, the judge's YES rate and mean ``p_yes`` and,
where labels are given (``calibrate``'s file format), the observed rate of relevant labels and
the gap ``mean p_yes - observed rate`` (the bin's calibration error, signed). A YES rate that
climbs with popularity while the labels do not is a popularity bias of the judge.

Factors: ``item_popularity`` (the item's interactions in the dataset), ``history_length``
(the user's interactions) and ``title_length`` (characters of the item's title).

For a RecSys Arena run the factor is the list's position (``position_audit``): per aspect,
the share of verdicts for position A, B and a tie over every judged order, and, where both
orders were judged, how often the verdict changes when the lists swap places; per system,
how often it wins in A and in B. A judge that reads the lists, not their places, wins a
system about as often in A as in B.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from recjudge._util import json_loads
from recjudge.data import (
    DataError,
    describe_suspicious,
    item_title,
    load_dataset,
    suspicious_items,
    suspicious_summary,
)
from recjudge.evaluators.arena._metrics import OPTIONS, order_flip_rate, position_shares
from recjudge.evaluators.offline._calibrate import read_labels
from recjudge.evaluators.offline._evaluation import read_judged
from recjudge.evaluators.offline._impute import ITEM_POPULARITY, read_item_popularity
from recjudge.reporting import figure, write_report

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


def position_audit(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The list-position audit of per-order arena verdict records (``verdicts.jsonl``):
    ``aspects``: per aspect, verdicts, shares of "A wins" / "B wins" / "Tie" and the order-flip
    rate (None without pairs judged in both orders); ``systems``: per system, its verdicts in
    each position and the share it won there (a tie counts half).

    Raises:
        ValueError: a record without ``system_a``, ``system_b``, ``aspect`` or a known
            ``verdict`` (names the record).
    """
    recs = [dict(r) for r in records]
    for n, r in enumerate(recs, 1):
        if not {"system_a", "system_b", "aspect", "verdict"} <= set(r) or (
            not isinstance(r["verdict"], str) or r["verdict"] not in OPTIONS
        ):
            raise ValueError(f"record {n}: an arena verdict record needs system_a, system_b, "
                             f"aspect and a verdict in {list(OPTIONS)}")  # fmt: skip
        for name in ("system_a", "system_b", "aspect", "user_id"):
            if name in r and not isinstance(r[name], str):
                raise ValueError(f"record {n}: field {name!r} is a JSON "
                                 f"{type(r[name]).__name__} ({str(r[name])[:40]}), not a string; "
                                 "an arena run writes every name and id as a string")  # fmt: skip
    aspects = list(dict.fromkeys(r["aspect"] for r in recs))
    out: dict[str, Any] = {"aspects": {}, "systems": {}}
    for a in aspects:
        n = sum(1 for r in recs if r["aspect"] == a)
        out["aspects"][a] = {"verdicts": n, **position_shares(recs, a),
                             "order_flip_rate": order_flip_rate(recs, a)}  # fmt: skip
    won = {"A wins": (1.0, 0.0), "B wins": (0.0, 1.0), "Tie": (0.5, 0.5)}
    for r in recs:
        if r["aspect"] != "overall":
            continue
        wa, wb = won[r["verdict"]]
        for system, pos, w in ((r["system_a"], "A", wa), (r["system_b"], "B", wb)):
            c = out["systems"].setdefault(system, {"A": [0, 0.0], "B": [0, 0.0]})
            c[pos][0] += 1
            c[pos][1] += w
    out["systems"] = {
        s: {f"in_{p}": c[p][0] for p in "AB"}
        | {f"won_in_{p}": (c[p][1] / c[p][0] if c[p][0] else None) for p in "AB"}
        for s, c in sorted(out["systems"].items())
    }
    return out


def position_lines(result: Mapping[str, Any], header: Sequence[str]) -> list[str]:
    """The list-position audit as markdown."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f} %"

    lines = [*header, "", "## Verdicts by position, per aspect", "",
             "| aspect | verdicts | A wins | B wins | Tie | order-flip rate |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for a, c in result["aspects"].items():
        lines.append(f"| {a} | {c['verdicts']} | {pct(c.get('A wins'))} | "
                     f"{pct(c.get('B wins'))} | {pct(c.get('Tie'))} | "
                     f"{pct(c['order_flip_rate'])} |")  # fmt: skip
    lines += ["", "## Overall verdicts per system and position (a tie counts half)", "",
              "| system | in A | won in A | in B | won in B |",
              "|---|---|---|---|---|"]  # fmt: skip
    for s, c in result["systems"].items():
        lines.append(f"| {s} | {c['in_A']} | {pct(c['won_in_A'])} | {c['in_B']} | "
                     f"{pct(c['won_in_B'])} |")  # fmt: skip
    return lines


def plot_positions(result: Mapping[str, Any], path: str | Path) -> None:
    """Shares of "A wins", "B wins" and "Tie" per aspect, stacked."""
    aspects = list(result["aspects"])
    with figure(path, size=(7, 3.5)) as ax:
        left = np.zeros(len(aspects))
        for option, colour in (("A wins", "tab:blue"), ("B wins", "tab:orange"),
                               ("Tie", "tab:gray")):  # fmt: skip
            v = np.array([result["aspects"][a].get(option, 0.0) for a in aspects])
            ax.barh(aspects, v, left=left, color=colour, label=option)
            left += v
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of verdicts (every judged order)")
        ax.legend(fontsize=8, loc="lower right")


def run_audit(
    judgments: str | Path,
    data: str,
    out: str | Path,
    labels: str | Path | None = None,
    bins: int = 10,
) -> tuple[dict[str, Any], list[str]]:
    """``recjudge audit``: YES rate (and, with labels, calibration) of an ``impute`` folder's
    judgments by item popularity, history length and title length; writes the report and
    audit.png into ``out``. Returns (results, report lines)."""
    judged = read_judged(Path(judgments) / "imputed.jsonl", raw=True)
    if not judged:
        raise DataError("no judged pair in it.", source=str(Path(judgments) / "imputed.jsonl"),
                        fix="pass the --out folder of a finished `recjudge impute`")  # fmt: skip
    pairs = sorted(judged)
    gold = read_labels(labels) if labels else None
    ds = load_dataset(data)
    check_audit_data(ds, pairs, str(data), str(Path(judgments) / "imputed.jsonl"))
    res = audit(
        pairs,
        [judged[k][0] for k in pairs],
        [judged[k][1] for k in pairs],
        audit_factors(ds, pairs),
        [gold.get(k) for k in pairs] if gold is not None else None,
        bins=bins,
    )
    told = f"labels: {labels}" if labels else "no labels (YES rates only)"
    header = ["# Judge bias audit", "",
              f"{len(pairs)} judged pairs from {judgments}; dataset {data}; {told}."]  # fmt: skip
    flagged = suspicious_pairs(ds, pairs, [judged[k][1] for k in pairs])
    lines = audit_lines(res, header) + suspicious_lines(flagged)
    Path(out).mkdir(parents=True, exist_ok=True)
    plot_audit(res, Path(out) / "audit.png")  # first: report.html embeds it
    results = {"factors": res, "pairs": len(pairs), "suspicious_text": flagged}
    write_report(out, results, lines)
    return results, lines


def suspicious_pairs(
    ds: Any, pairs: Sequence[tuple[str, str]], yes: Sequence[bool]
) -> dict[str, Any]:
    """How many judged pairs rest on item text shaped like an instruction or an answer
    (``data.suspicious_items``): the candidate's own text, or an item of the user's history,
    with the YES rate on those pairs and on the others."""
    flagged = suspicious_items(ds.items.to_dict("records"))
    if not flagged:
        return {"items": 0}
    users = {u for u, _ in pairs}
    inter = ds.interactions
    hit = inter[inter["item_id"].astype(str).isin(set(flagged))]
    touched = set(hit["user_id"].astype(str)) & users
    cand = np.array([i in flagged for _, i in pairs])
    hist = np.array([u in touched for u, _ in pairs])
    y = np.asarray(yes, dtype=float)

    def rate(m: np.ndarray) -> float | None:
        return float(y[m].mean()) if m.any() else None

    return {**suspicious_summary(flagged), "candidate_pairs": int(cand.sum()),
            "candidate_yes_rate": rate(cand), "history_pairs": int(hist.sum()),
            "history_yes_rate": rate(hist), "other_yes_rate": rate(~cand & ~hist)}  # fmt: skip


def suspicious_lines(s: Mapping[str, Any]) -> list[str]:
    """The audit's section on suspicious item text."""
    lines = ["", "## Item text shaped like an instruction or an answer", ""]
    if not s.get("items"):
        return lines + ["No item of the dataset holds such text."]

    def r(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    return lines + [
        f"Of the dataset's items, {describe_suspicious(s)}. Of the judged pairs, "
        f"{s['candidate_pairs']} have such a candidate (YES rate {r(s['candidate_yes_rate'])}) and "
        f"{s['history_pairs']} a user whose history holds one (YES rate "
        f"{r(s['history_yes_rate'])}); the other pairs' YES rate is {r(s['other_yes_rate'])}. "
        "Imputed labels on these pairs rest on text a third party wrote: check them, or "
        "leave those items out of the evaluation.",
    ]


_AUDIT_FIX = "pass the --data the impute run used (its results.json names it)"


def check_audit_data(ds: Any, pairs: Sequence[tuple[str, str]], data: str, source: str) -> None:
    """Refuse a ``--data`` that is not the dataset the judgments were made on: every factor
    (popularity, history and title length) is read from it, so another dataset gives a
    complete-looking report of wrong numbers (all pairs in one popularity bin).

    Raises:
        DataError: a judged user without a history in ``ds``, or a judged item it lacks
            (counted, with an example).
    """
    users = set(ds.interactions["user_id"].astype(str))
    items = set(ds.items["item_id"].astype(str))
    bad_u = [u for u, _ in pairs if u not in users]
    bad_i = [i for _, i in pairs if i not in items]

    counts = read_item_popularity(Path(source).parent / ITEM_POPULARITY)
    if counts is not None and not (bad_u or bad_i):
        have = ds.interactions["item_id"].astype(str).value_counts().to_dict()
        differ = [i for _, i in pairs if int(have.get(i, 0)) != int(counts.get(i, 0))]
        if differ:
            raise DataError(
                f"--data {data} is not the dataset these judgments were made on: the item "
                f"counts of {len(set(differ))} judged items differ from the training data "
                f"impute recorded ({ITEM_POPULARITY}; e.g. {differ[0]!r}: "
                f"{have.get(differ[0], 0)} here, {counts.get(differ[0], 0)} there).",
                source=source, fix=_AUDIT_FIX)  # fmt: skip
    if bad_u or bad_i:
        what = []
        if bad_u:
            what.append(f"{len(bad_u)} of {len(pairs)} judged pairs have a user it does not "
                        f"hold (e.g. {bad_u[0]!r})")  # fmt: skip
        if bad_i:
            what.append(f"{len(bad_i)} an item it does not hold (e.g. {bad_i[0]!r})")
        raise DataError(f"--data {data} is not the dataset these judgments were made on: "
                        + "; ".join(what) + ".", source=source, fix=_AUDIT_FIX)  # fmt: skip


def read_verdicts(run: str | Path) -> list[dict[str, Any]]:
    """An arena run's ``verdicts.jsonl`` as records; ``DataError`` names the file, the row
    and the fix."""

    path = Path(run) / "verdicts.jsonl"
    fix = "pass the --out folder of a finished `recjudge arena run` (it holds verdicts.jsonl)"
    if not path.is_file():
        raise DataError("no such file.", source=str(path), fix=fix)
    records, _ = verdict_records(path, fix)
    if not records:
        raise DataError("no verdict in it.", source=str(path), fix=fix)
    return records


def verdict_records(path: str | Path, fix: str) -> tuple[list[dict[str, Any]], int]:
    """Verdict records of a JSONL file, each checked (``system_a``, ``system_b``, ``aspect``
    and ``verdict`` strings where present), and how many exact repeats were dropped (a
    record written twice is one comparison, not two).

    Raises:
        DataError: a file that is not UTF-8, a line that is not JSON or not a record, or a
            field of the wrong type (file, row and field named).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 text (byte {e.start}).", source=str(path),
                        fix="write the verdicts as UTF-8 JSONL") from None  # fmt: skip
    except OSError as e:
        raise DataError(f"cannot be read ({e.strerror}).", source=str(path), fix=fix) from None
    records, seen, repeats = [], set(), 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json_loads(line)
        except json.JSONDecodeError:
            raise DataError("not a JSON line.", source=str(path), row=n, fix=fix) from None
        if not isinstance(rec, dict):
            raise DataError("not a verdict record.", source=str(path), row=n, fix=fix)
        for name in ("system_a", "system_b", "aspect", "verdict"):
            if name in rec and not isinstance(rec[name], str):
                raise DataError(f"{name} is {type(rec[name]).__name__} {rec[name]!r}, not a "
                                "string.", source=str(path), row=n, field=name,
                                fix=f"write {name} as a string (e.g. \"als\")")  # fmt: skip
        key = json.dumps(rec, sort_keys=True, default=str)
        if key in seen:
            repeats += 1
            continue
        seen.add(key)
        records.append(rec)
    return records, repeats


def run_position_audit(run: str | Path, out: str | Path) -> tuple[dict[str, Any], list[str]]:
    """``recjudge audit --arena``: an arena run's verdicts by list position per aspect and
    the order-flip rates; writes the report and audit.png into ``out``."""
    path = Path(run) / "verdicts.jsonl"
    records = read_verdicts(run)
    try:
        res = position_audit(records)
    except ValueError as e:
        fix = "pass the --out folder of a finished `recjudge arena run` (it holds verdicts.jsonl)"
        raise DataError(str(e), source=str(path), fix=fix) from None
    header = ["# Arena list-position audit", "",
              f"{len(records)} verdicts from {path}: per aspect, the share of verdicts for "
              "each position over every judged order and, for pairs judged in both orders, "
              "how often the verdict changes when the lists swap places."]  # fmt: skip
    Path(out).mkdir(parents=True, exist_ok=True)
    plot_positions(res, Path(out) / "audit.png")  # first: report.html embeds it
    write_report(out, res, position_lines(res, header))
    return res, position_lines(res, header)
