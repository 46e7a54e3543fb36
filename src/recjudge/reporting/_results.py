"""Reading a report's results.json: the ``evaluate``-shaped tables every report writer
(HTML page, MLflow, paper tables) shows, parsed once and defensively (other reports use the
same keys, ``scores``, ``intervals``, ``estimators``, for other shapes)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["estimates_grid", "finite", "scores_grid"]

Row = tuple[str, str, str, float | None, float | None, float | None]


def finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _pair(ci: Any) -> tuple[float | None, float | None]:
    if isinstance(ci, list | tuple) and len(ci) == 2:
        return finite(ci[0]), finite(ci[1])
    return None, None


def _number_or_none(v: Any) -> bool:
    """A value a table cell can hold: null, or a number (NaN and infinities included, shown
    as undefined), not a bool."""
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


def bad_cells(results: Mapping[str, Any]) -> list[str]:
    """Where ``scores`` holds something that is neither a number nor null (a string, a list,
    a bool): ``scores.KIND.SYSTEM.METRIC is 'x' (str)``, for an error that names the entry."""
    out = []
    scores = results.get("scores")
    for kind, by_sys in scores.items() if isinstance(scores, Mapping) else ():
        for system, by_m in by_sys.items() if isinstance(by_sys, Mapping) else ():
            for m, v in by_m.items() if isinstance(by_m, Mapping) else ():
                if not _number_or_none(v):
                    out.append(f"scores.{kind}.{system}.{m} is {str(v)[:40]!r} "
                               f"({type(v).__name__})")  # fmt: skip
    return out


def scores_grid(results: Mapping[str, Any]) -> list[Row]:
    """``(kind, system, metric, value, lo, hi)`` of ``scores[kind][system][metric]`` with
    ``intervals`` alike as ``[lo, hi]``: a value that is a number or null is a row (NaN and
    infinities as None: undefined, so a table never drops a system without a word); entries
    of another shape are left out (``bad_cells`` names them)."""
    out: list[Row] = []
    scores, ints = results.get("scores"), results.get("intervals")
    if not isinstance(scores, Mapping):
        return out
    ints = ints if isinstance(ints, Mapping) else {}
    for kind, by_sys in scores.items():
        if not isinstance(by_sys, Mapping):
            continue
        for system, by_m in by_sys.items():
            if not isinstance(by_m, Mapping):
                continue
            for m, v in by_m.items():
                if not _number_or_none(v):
                    continue  # not a number at all: ``bad_cells`` names it
                ci: Any = ints.get(kind)
                for part in (system, m):
                    ci = ci.get(part) if isinstance(ci, Mapping) else None
                out.append((str(kind), str(system), str(m), finite(v), *_pair(ci)))
    return out


def estimates_grid(results: Mapping[str, Any]) -> list[Row]:
    """``(system, metric, estimator, value, lo, hi)`` of ``estimators.systems`` (evaluate
    with ``--qrels``): every estimate is a row, its value None where it is null, NaN or
    infinite; entries of another shape are left out."""
    out: list[Row] = []
    est = results.get("estimators")
    systems = est.get("systems") if isinstance(est, Mapping) else None
    if not isinstance(systems, Mapping):
        return out
    for system, by_m in systems.items():
        for m, by_e in by_m.items() if isinstance(by_m, Mapping) else ():
            for name, e in by_e.items() if isinstance(by_e, Mapping) else ():
                if not isinstance(e, Mapping):
                    continue
                # a NaN or infinite value stays a row, shown as undefined ("--"), so a table
                # never drops a system without a word
                out.append((str(system), str(m), str(name), finite(e.get("value")),
                            *_pair(e.get("ci"))))  # fmt: skip
    return out
