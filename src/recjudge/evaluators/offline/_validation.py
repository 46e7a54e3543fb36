"""What the known-truth bench measured of each estimator, for the report that uses it.

``bench brief-offline-estimators`` holds every estimator against a simulated world whose
truth is known and writes ``reports/brief-offline-estimators/<run>/results.json``; ``evaluate``
quotes the measured error and interval coverage of the estimator it leads with, read from
that file (never written into the code), and says so when no such file is found.

Where it looks, first hit wins: ``$RECJUDGE_VALIDATION`` (a results.json or a folder holding
``*/results.json``), then ``reports/brief-offline-estimators`` under the working folder, then
under the source checkout recjudge runs from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from recjudge._util import json_loads

__all__ = ["validation_of"]


def _candidates() -> list[Path]:
    out: list[Path] = []
    env = os.environ.get("RECJUDGE_VALIDATION")
    if env:
        p = Path(env)
        out += [p] if p.is_file() else sorted(p.glob("*/results.json"))
    for root in (Path.cwd(), Path(__file__).resolve().parents[4]):
        out += sorted((root / "reports" / "brief-offline-estimators").glob("*/results.json"))
    return out


def _key(estimator: str, calibrated: bool) -> list[str]:
    """The bench's summary rows for ``estimator`` as ``evaluate`` runs it (fitted
    propensities, ``--propensities fit``; the judge calibrated or not), best match first;
    the ``est theta`` rows of reports written before the bench ran evaluate's own fit
    come last."""
    cal = "+cal" if calibrated else ""
    if estimator == "dr":
        return [f"dr [judge:brief{cal}, fit theta]", "dr [judge:brief+cal, fit theta]",
                f"dr [judge:brief{cal}, est theta]", "dr [judge:brief+cal, est theta]"]  # fmt: skip
    if estimator in ("dm", "imputed"):
        return [f"{estimator} [judge:brief{cal}]"]
    if estimator in ("ips", "snips"):
        return [f"{estimator} (fit theta)", f"{estimator} (est theta)"]
    return [estimator]


def validation_of(estimator: str, metric: str, calibrated: bool = False) -> dict[str, Any]:
    """The bench's measured relative error and 95 % interval coverage of ``estimator`` on
    ``metric`` (``text`` says it in one sentence), or ``{"found": False, "text": ...}``."""
    base, _, cut = metric.partition("@")
    names = [metric] + ([f"ndcg@{cut}"] if base == "ndcg_fixed" else [])  # older reports
    for path in _candidates():
        try:
            res = json_loads(path.read_text(encoding="utf-8"))
            summary, config = res["summary"], res.get("config", {})
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for row in _key(estimator, calibrated):
            for m in names:
                cell = (summary.get(row) or {}).get(m)
                if not cell:
                    continue
                err, cov = cell.get("rel_error_pct"), cell.get("coverage")
                return {
                    "found": True, "source": str(path), "row": row, "metric": m,
                    "rel_error_pct": err, "coverage": cov,
                    "text": (f"Known-truth bench ({path.parent.name}: {config.get('data')}, "
                             f"judge {config.get('model')}, {config.get('simulated_logs')} "
                             f"simulated logs), row '{row}', {m}: mean relative error "
                             f"{err:.1f} %, 95 % interval coverage {cov:.0%}."),
                }  # fmt: skip
    return {"found": False,
            "text": "No known-truth validation found (run `recjudge bench "
                    "brief-offline-estimators`, or set RECJUDGE_VALIDATION)."}  # fmt: skip
