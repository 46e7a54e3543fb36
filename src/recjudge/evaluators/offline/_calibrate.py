"""Calibration of a judge against labels the user trusts (a human audit, or any labels).

``calibrate`` joins the judge's answers (``imputed.jsonl`` of ``recjudge impute``: per pair its
``p_yes`` and hard label) with labelled pairs ``(user_id, item_id, label)`` and reports:

- discrimination: AUC of ``p_yes`` against the labels (Mann-Whitney, ties one half);
- probability quality: Brier score ``mean (p - y)^2`` and the expected calibration error over
  ten equal-width bins, ``ECE = sum_b (n_b / N) |mean_b p - mean_b y|``, with a reliability
  diagram (PNG);
- agreement of the hard labels: Cohen's kappa ``(p_o - p_e) / (1 - p_e)`` with the labels'
  base rate and the judge's YES rate beside it;
- a map from ``p_yes`` to ``P(relevant)``: isotonic regression (pool-adjacent-violators,
  ``scipy.optimize.isotonic_regression``). Its quality is measured cross-fitted: each of
  ``folds`` folds is mapped by the isotonic fit on the other folds, and Brier/ECE are
  reported on those out-of-fold probabilities; the saved map is the fit on every pair.

The map is saved as JSON with the judge's settings (model, mode, beta, evidence rule) it was
made for; ``impute --calibration FILE`` refuses a map made for another judge, and writes
``p_calibrated`` beside ``p_yes`` so ``evaluate --estimators`` (``dm``, ``dr``) use
probabilities on the labels' scale.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from recjudge._stats import auc
from recjudge._util import atomic_write_json, json_loads
from recjudge.data import DataError, read_table
from recjudge.reporting import figure, write_report

CALIBRATION_FORMAT = "recjudge-calibration"
# The judge settings a calibration map is only valid for.
JUDGE_FIELDS = ("model", "mode", "beta", "need_evidence", "max_evidence", "dtype")


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error over ``bins`` equal-width bins of ``p`` (see the module)."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        mask = which == b
        if mask.any():
            total += mask.mean() * abs(p[mask].mean() - y[mask].mean())
    return float(total)


def reliability(p: np.ndarray, y: np.ndarray, bins: int = 10) -> list[dict[str, float]]:
    """Per non-empty bin: its range, count, mean predicted probability and observed rate."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    out = []
    for b in range(bins):
        mask = which == b
        if mask.any():
            out.append(
                {
                    "lo": float(edges[b]),
                    "hi": float(edges[b + 1]),
                    "n": int(mask.sum()),
                    "mean_p": float(p[mask].mean()),
                    "rate": float(y[mask].mean()),
                }
            )
    return out


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float | None:
    """Cohen's kappa of two binary label vectors (None when chance agreement is 1)."""
    po = float((a == b).mean())
    pa, pb = float(a.mean()), float(b.mean())
    pe = pa * pb + (1 - pa) * (1 - pb)
    return None if pe >= 1.0 else (po - pe) / (1 - pe)


def fit_isotonic(p: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
    """A non-decreasing map from ``p`` to P(y = 1): knots (x, value) of the PAV fit on the
    distinct values of ``p`` (weighted by their counts)."""
    from scipy.optimize import isotonic_regression

    xs, inverse = np.unique(p, return_inverse=True)
    weights = np.bincount(inverse).astype(float)
    means = np.bincount(inverse, weights=y) / weights
    fitted = isotonic_regression(means, weights=weights, increasing=True).x
    return xs.tolist(), [float(v) for v in fitted]


def apply_map(xs: Sequence[float], ys: Sequence[float], p: np.ndarray | float) -> np.ndarray:
    """The isotonic map at ``p``: linear between knots, constant beyond the ends."""
    return np.interp(np.asarray(p, dtype=float), np.asarray(xs), np.asarray(ys))


def cross_fitted(p: np.ndarray, y: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Out-of-fold calibrated probabilities: fold f mapped by the fit on the other folds."""
    g = np.random.default_rng(seed)
    fold = g.permutation(len(p)) % folds
    out = np.empty(len(p))
    for f in range(folds):
        test = fold == f
        if not test.any():
            continue
        if (~test).sum() == 0:
            out[test] = p[test]
            continue
        xs, ys = fit_isotonic(p[~test], y[~test])
        out[test] = apply_map(xs, ys, p[test])
    return out


def read_labels(path: str | Path, skip_unlabelled: bool = False) -> dict[tuple[str, str], int]:
    """Labelled pairs from CSV or JSONL with ``user_id, item_id, label`` (label 0 or 1);
    ``skip_unlabelled``: rows with an empty label are left out (a sequential gold file,
    labelled from the top), not refused.

    Raises:
        DataError: a missing file or column, or a label that is not 0/1 (file and row named).
    """
    return labels_of(label_table(path), path, skip_unlabelled)


LABELS_FIX = "write user_id,item_id,label rows with label 0 or 1"


def label_table(path: str | Path) -> Any:
    """A labels file read as a table (``DataError`` naming a missing file)."""
    if not Path(path).is_file():
        raise DataError("no such labels file.", source=str(path), fix=LABELS_FIX)
    return read_table(path)


def labels_of(
    df: Any, path: str | Path, skip_unlabelled: bool = False
) -> dict[tuple[str, str], int]:
    """``read_labels`` on a table already read from ``path`` (named in the errors): a reader
    that needs the file's other columns too reads it once."""
    fix = LABELS_FIX
    for col in ("user_id", "item_id", "label"):
        if col not in df.columns:
            raise DataError(f"no {col} column; found {list(df.columns)}.", source=str(path),
                            field=col, fix=fix)  # fmt: skip
    df = df.reset_index(drop=True)  # index + 1: the file's row (a parquet keeps its own)
    blank = df["label"].map(lambda v: str(v).strip() in ("", "nan", "None", "<NA>"))
    if skip_unlabelled:
        df, blank = df[~blank], blank[~blank]
    for r, v, empty in zip(df.index + 1, df["label"].tolist(), blank, strict=True):
        text = str(v).strip()
        if empty:
            raise DataError("this row has no label yet.", source=str(path), row=r,
                            field="label", fix="label every row 0 or 1 (a row left out "
                            "changes what the sample represents)")  # fmt: skip
        if text not in ("0", "1", "0.0", "1.0", "True", "False", "true", "false"):
            raise DataError(f"label {v!r} is not 0 or 1.", source=str(path), row=r,
                            field="label", fix=fix)  # fmt: skip
    keys = list(zip(df["user_id"].astype(str), df["item_id"].astype(str), strict=True))
    seen: dict[tuple[str, str], int] = {}
    for r, key in zip(df.index + 1, keys, strict=True):
        if key in seen:
            raise DataError(f"pair {key} is labelled twice (rows {seen[key]} and {r}); which "
                            "label holds is ambiguous.", source=str(path), row=r,
                            fix="keep one row per (user_id, item_id)")  # fmt: skip
        seen[key] = r
    labels = df["label"].map(lambda v: int(str(v).strip() in ("1", "1.0", "True", "true")))
    return dict(zip(keys, labels.astype(int), strict=True))


def judge_settings(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a calibration map is tied to, from an impute ``summary.json``."""
    judge = summary.get("judge") or {}
    return {f: judge.get(f) for f in JUDGE_FIELDS if f in judge}


def calibrate(
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    labels: Mapping[tuple[str, str], int],
    judge: Mapping[str, Any],
    *,
    folds: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """Everything the module docstring lists, on the pairs both sides hold.

    Raises:
        ValueError: fewer than 10 shared pairs, or labels of one class only.
    """
    shared = sorted(set(judged) & set(labels))
    if len(shared) < 10:
        raise ValueError(
            f"only {len(shared)} labelled pairs are among the judged ones (at least 10 are "
            "needed): label pairs from the same impute run (same users and items)"
        )
    p = np.array([judged[k][0] for k in shared])
    hard = np.array([int(judged[k][1]) for k in shared])
    y = np.array([labels[k] for k in shared], dtype=float)
    if y.min() == y.max():
        raise ValueError(f"every shared label is {int(y[0])}: calibration needs both classes")
    xs, ys = fit_isotonic(p, y)
    oof = cross_fitted(p, y, min(folds, len(shared)), seed)
    return {
        "format": CALIBRATION_FORMAT,
        "judge": dict(judge),
        "pairs": len(shared),
        "unmatched_labels": len(labels) - len(shared),
        "base_rate": float(y.mean()),
        "judge_yes_rate": float(hard.mean()),
        "auc": auc(p[y == 1], p[y == 0]),
        "brier": float(np.mean((p - y) ** 2)),
        "ece": ece(p, y),
        "kappa": cohen_kappa(hard, y.astype(int)),
        "cross_fitted": {
            "folds": min(folds, len(shared)),
            "seed": seed,
            "brier": float(np.mean((oof - y) ** 2)),
            "ece": ece(oof, y),
        },  # fmt: skip
        "reliability": reliability(p, y),
        "reliability_calibrated": reliability(oof, y),
        "map": {"x": xs, "y": ys},
    }


def load_map(path: str | Path, judge: Mapping[str, Any]) -> tuple[list[float], list[float]]:
    """A saved calibration map, checked against the judge it is applied to.

    Raises:
        DataError: not a calibration file, or one made for other judge settings (named).
    """
    path = Path(path)
    fix = "make one for this judge: recjudge calibrate --judgments DIR --labels FILE --out FILE"
    try:
        obj = json_loads(path.read_text(encoding="utf-8"))
        assert obj["format"] == CALIBRATION_FORMAT
        xs, ys = [float(v) for v in obj["map"]["x"]], [float(v) for v in obj["map"]["y"]]
    except FileNotFoundError:
        raise DataError("no such calibration file.", source=str(path), fix=fix) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AssertionError,
            UnicodeDecodeError):  # fmt: skip
        raise DataError("not a calibration file of recjudge calibrate.", source=str(path),
                        fix=fix) from None  # fmt: skip
    if len(xs) != len(ys) or not xs or any(b < a for a, b in zip(ys, ys[1:], strict=False)):
        raise DataError("its map is not a non-decreasing function.", source=str(path), fix=fix)
    made_for = obj.get("judge") or {}
    wanted = {f: judge.get(f) for f in JUDGE_FIELDS if f in judge}
    differs = [f for f in JUDGE_FIELDS if f in made_for and f in wanted
               and made_for[f] != wanted[f]]  # fmt: skip
    if differs:
        f = differs[0]
        raise DataError(
            f"made for a judge with {f}={made_for[f]!r}, this one has {f}={wanted[f]!r}.",
            source=str(path),
            field=f,
            fix=fix,
        )
    return xs, ys


def plot_reliability(result: Mapping[str, Any], path: str | Path) -> None:
    """The reliability diagram: observed rate against mean p_yes per bin, raw and
    cross-fitted calibrated, with the diagonal."""
    with figure(path, size=(5, 5)) as ax:
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect")
        for key, name in (("reliability", "raw p_yes"),
                          ("reliability_calibrated", "isotonic (cross-fitted)")):  # fmt: skip
            pts = result[key]
            ax.plot([b["mean_p"] for b in pts], [b["rate"] for b in pts], marker="o", label=name)
        ax.set_xlabel("predicted P(relevant)")
        ax.set_ylabel("observed rate of relevant labels")
        ax.set_title(f"{result['pairs']} labelled pairs")
        ax.legend(loc="upper left")


def calibration_lines(res: Mapping[str, Any]) -> list[str]:
    """The calibration report."""
    cf = res["cross_fitted"]
    kappa = "undefined" if res["kappa"] is None else f"{res['kappa']:.3f}"
    return [
        "# Judge calibration against labels",
        "",
        f"Judge: {res['judge']}. {res['pairs']} labelled pairs among the judged ones "
        f"({res['unmatched_labels']} labels matched no judged pair).",
        "",
        f"- base rate of relevant labels {res['base_rate']:.3f}; judge YES rate "
        f"{res['judge_yes_rate']:.3f}",
        f"- AUC of p_yes {res['auc']:.3f}; Cohen's kappa of the hard labels {kappa}",
        f"- raw p_yes: Brier {res['brier']:.4f}, ECE {res['ece']:.4f}",
        f"- isotonic map, cross-fitted over {cf['folds']} folds: Brier {cf['brier']:.4f}, "
        f"ECE {cf['ece']:.4f}",
        "",
        "The map (fit on every pair) is calibration.json: `recjudge impute --calibration "
        "calibration.json` writes p_calibrated, which `evaluate --estimators` uses.",
        "",
        "![reliability](reliability.png)",
    ]


def run_calibration(
    judgments: str | Path, labels: str | Path, out: str | Path, folds: int = 5, seed: int = 0
) -> dict[str, Any]:
    """``recjudge calibrate``: the judgments of an ``impute`` folder against labelled pairs;
    writes calibration.json (the map ``impute --calibration`` reads), reliability.png and
    the report into ``out``. Raises ``DataError`` naming the file and the fix."""
    # import cycle: _evaluation reads its gold labels through this module (via _gold)
    from recjudge.evaluators.offline._evaluation import read_judged  # noqa: PLC0415

    folder = Path(judgments)
    summary_path = folder / "summary.json"
    if not summary_path.exists():
        raise DataError("no summary.json here.", source=str(folder),
                        fix="pass the --out folder of `recjudge impute`")  # fmt: skip
    judge = judge_settings(json_loads(summary_path.read_text()))
    res = calibrate(read_judged(folder / "imputed.jsonl", raw=True), read_labels(labels),
                    judge, folds=folds, seed=seed)  # fmt: skip
    outp = Path(out)
    atomic_write_json(outp / "calibration.json", res)
    plot_reliability(res, outp / "reliability.png")
    write_report(outp, res, calibration_lines(res))
    return res
