"""Tables for a paper from a report's ``results.json``: ``recjudge report latex RUN``.

An ``evaluate`` report holds, per system and metric, either the estimators' values with
their intervals (``estimators.systems``; the lead estimator by default) or the ranx metrics
of a qrels kind with user-bootstrap intervals (``scores`` + ``intervals``). ``paper_table``
reads either into rows ``(system, metric, value, lo, hi)``; ``to_latex`` writes a booktabs
table (systems x metrics, ``value [lo, hi]``, the best value of each metric in bold, the
estimator named in the caption) and ``to_csv`` the same rows. System and metric names are
untrusted text: LaTeX's special characters are escaped.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recjudge._util import json_loads
from recjudge.reporting._results import bad_cells, estimates_grid, scores_grid

__all__ = ["PaperTable", "latex_escape", "paper_table", "read_results", "to_csv", "to_latex"]

_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
          "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
          "^": r"\textasciicircum{}", "<": r"\textless{}", ">": r"\textgreater{}"}  # fmt: skip


def latex_escape(text: Any) -> str:
    """``text`` with LaTeX's special characters escaped (and control characters dropped)."""
    return "".join(_LATEX.get(c, c) for c in str(text) if c >= " " or c == "\t")


@dataclass(frozen=True)
class PaperTable:
    """Rows ``(system, metric, value, lo, hi)`` and what they are (for the caption)."""

    rows: list[tuple[str, str, float | None, float | None, float | None]]
    source: str  # e.g. "estimator snips" or "ranx metrics on imputed feedback"
    interval: str  # how the intervals were made


def paper_table(results: Mapping[str, Any], estimator: str | None = None,
                kind: str | None = None) -> PaperTable:  # fmt: skip
    """The systems x metrics rows of an ``evaluate`` results.json (``reporting._results``).

    Args:
        estimator: an estimator of ``estimators.systems`` (default: the report's lead);
            ignored when the report has no estimators or ``kind`` is given.
        kind: a qrels kind of ``scores`` (``logged``, ``imputed``) instead of an estimator.

    Raises:
        ValueError: the results hold no such table (not an ``evaluate`` report), or the
            estimator / kind named is not in them (the ones there are listed).
    """
    estimates = estimates_grid(results)
    if kind is None and estimates:
        names = sorted({e for _, _, e, *_ in estimates})
        est = results.get("estimators")
        lead = est.get("lead") if isinstance(est.get("lead"), Mapping) else {}
        name = estimator or lead.get("estimator") or names[0]
        if name not in names:
            raise ValueError(f"estimator {name!r} is not in this report; it has "
                             f"{', '.join(names)}")  # fmt: skip
        cells = {(s, m): (v, lo, hi) for s, m, e, v, lo, hi in estimates if e == name}
        rows = [(s, m, *cells.get((s, m), (None, None, None)))
                for s, m in dict.fromkeys((s, m) for s, m, *_ in estimates)]  # fmt: skip
        note = " (the report's lead)" if name == lead.get("estimator") else ""
        return PaperTable(rows, f"estimator {name}{note}", "95 % interval of the estimator")
    if estimator is not None and kind is None:
        raise ValueError(f"estimator {estimator!r}: this report has no estimators (`evaluate "
                         "--qrels` runs them); omit --estimator for its ranx metrics")  # fmt: skip
    bad = bad_cells(results)
    if bad:
        raise ValueError(f"{bad[0]}, not a number"
                         + (f" (and {len(bad) - 1} more such entries)" if len(bad) > 1 else "")
                         + "; a value in scores is a number or null: fix or remove it, or "
                         "write the report again with `recjudge evaluate`")  # fmt: skip
    scores = scores_grid(results)
    if not scores:
        raise ValueError("these results hold no systems x metrics table (an `evaluate` "
                         "report's results.json has one)")  # fmt: skip
    kinds = list(dict.fromkeys(k for k, *_ in scores))
    kind = kind or ("imputed" if "imputed" in kinds else kinds[0])
    if kind not in kinds:
        raise ValueError(f"qrels kind {kind!r} is not in this report; it has {', '.join(kinds)}")
    rows = [(s, m, v, lo, hi) for k, s, m, v, lo, hi in scores if k == kind]
    biased = " (the BRIEF protocol: biased)" if kind == "imputed" else ""
    return PaperTable(rows, f"ranx metrics on {kind} feedback{biased}",
                      "95 % user-bootstrap interval")  # fmt: skip


def unique_labels(names: list[str], render: Any) -> dict[str, str]:
    """Each name as ``render`` shows it, unique by construction: two names that render alike
    (control characters dropped, a name cut) each get `` #`` and 6 hex digits of the sha256
    of the whole name, so no row of a table stands for two systems."""
    out = {n: render(n) for n in names}
    seen: dict[str, int] = {}
    for v in out.values():
        seen[v] = seen.get(v, 0) + 1
    for n, v in out.items():
        if seen[v] > 1:
            out[n] = f"{v} \\#{hashlib.sha256(n.encode('utf-8')).hexdigest()[:6]}"
    return out


def _grid(t: PaperTable) -> tuple[list[str], list[str], dict[tuple[str, str], tuple]]:
    systems = list(dict.fromkeys(r[0] for r in t.rows))
    metrics = list(dict.fromkeys(r[1] for r in t.rows))
    return systems, metrics, {(r[0], r[1]): r[2:] for r in t.rows}


def to_latex(t: PaperTable, caption: str | None = None, label: str = "tab:recjudge",
             digits: int = 3) -> str:  # fmt: skip
    """A booktabs ``table``: one row per system, one column per metric, ``value [lo, hi]``,
    the best (largest) value of each metric in bold only where its interval lies wholly above
    every other system's (a "best" whose interval overlaps another's is not shown as one);
    the caption names the estimator."""
    systems, metrics, cell = _grid(t)
    shown = unique_labels(systems, latex_escape)
    best = {m: _separated_best([cell[(s, m)] for s in systems if (s, m) in cell])
            for m in metrics}  # fmt: skip
    lines = [r"\begin{table}[t]", r"\centering",
             r"\begin{tabular}{l" + "c" * len(metrics) + "}", r"\toprule",
             "System & " + " & ".join(latex_escape(m) for m in metrics) + r" \\",
             r"\midrule"]  # fmt: skip
    for s in systems:
        cells = []
        for m in metrics:
            v, lo, hi = cell.get((s, m), (None, None, None))
            if v is None:
                cells.append("--")
                continue
            text = f"{v:.{digits}f}"
            if best[m] is not None and v == best[m]:
                text = rf"\textbf{{{text}}}"
            if lo is not None and hi is not None:
                text += rf" {{\scriptsize [{lo:.{digits}f}, {hi:.{digits}f}]}}"
            cells.append(text)
        lines.append(shown[s] + " & " + " & ".join(cells) + r" \\")
    cap = caption or (f"Per system and metric: {t.source}, with its {t.interval} in brackets; "
                      "the best value of each metric in bold where its interval lies above "
                      "every other system's.")  # fmt: skip
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{latex_escape(cap)}}}",
              rf"\label{{{latex_escape(label)}}}", r"\end{table}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _separated_best(cells: list[tuple]) -> float | None:
    """The largest value when its interval's lower end is above every other interval's upper
    end (None otherwise, or when an interval is missing)."""
    vals = [c for c in cells if c[0] is not None]
    if len(vals) < 2:
        return None
    top = max(vals, key=lambda c: c[0])
    if top[1] is None or any(c[2] is None for c in vals if c is not top):
        return None
    return top[0] if all(top[1] > c[2] for c in vals if c is not top) else None


def to_csv(t: PaperTable) -> str:
    """The rows as CSV: ``system,metric,value,lo,hi,source``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["system", "metric", "value", "lo", "hi", "source"])
    for s, m, v, lo, hi in t.rows:
        w.writerow([s, m, "" if v is None else repr(v), "" if lo is None else repr(lo),
                    "" if hi is None else repr(hi), t.source])  # fmt: skip
    return buf.getvalue()


def read_results(run: str) -> dict[str, Any]:
    """A report's results.json: ``run`` is the file or the report folder holding it.

    Raises:
        ValueError: no results.json there, or one that is not a JSON object (named).
    """
    path = Path(run)
    if path.is_dir():
        path = path / "results.json"
    try:
        got = json_loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; give a report folder (it holds "
                         "results.json) or the file itself") from None  # fmt: skip
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON results file ({e})") from None
    if not isinstance(got, dict):
        raise ValueError(f"{path}: not a JSON object (a report's results.json is one)")
    return got
