"""Imputers fitted on the gold sample, held against the known truth (``brief-offline-estimators``).

On each evaluation that draws gold samples, every gold sample (size x design, drawn and read
by ``gold sample``'s and ``evaluate --gold``'s code) is used four ways, each estimating every
system's metric with a 95 % interval that is then held against the population truth:

- ``labels-only``: the gold labels alone, design-weighted, clustered by user, as ``evaluate``
  reads them for its "what the judge is worth" line (``ppi_run``'s ``labels_only``: a
  constant 1 for the judge; until 2026-12-07 a constant 0, i.e. Horvitz-Thompson, whose
  t counted only users with a relevant gold pair: wider than the labels allow);
- ``ppi [judge]``: PPI++ on the judge's raw ``p_yes`` (what ``evaluate --gold`` runs today);
- ``ppi [supervised:M]``: PPI++ on the supervised imputer ``M`` (``evaluators.offline._supervised``:
  logistic regression or gradient boosting of the gold label on the judge's log-odds, the
  unbiased LLM's log-odds, sigma and the item's log popularity), cross-fitted over the gold
  users (what ``evaluate --gold --calibration M`` runs);
- ``dr [supervised:M]``: DR on the log with ``evaluate``'s fitted propensities and the
  imputer's probabilities for every listed pair, with the user-bootstrap interval that holds
  the fitted probabilities fixed (so the fit's own variance is not inside it).

The comparison the report draws: interval width relative to ``labels-only`` and to SNIPS (no
judge, no gold) at the coverage each reaches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from recjudge._stats import bootstrap_ci, labelled_auc
from recjudge.bench._offline_estimators import (
    GOLD_DESIGNS,
    _gather,
    _padded_weights,
    draw_gold,
    gold_summary,
    synthetic_name,
)
from recjudge.evaluators import linear_values, listed_pairs, parse_metric, ppi_run
from recjudge.evaluators.offline import (
    apply_map,
    bound_levels,
    fit_imputer,
    fit_isotonic,
    logit,
    refit_draws,
    residual_interval,
    transport_check,
)

#: the supervised imputers compared (``evaluators.offline._supervised`` methods)
SUPERVISED = ("logistic", "boosting")
LABELS_ONLY = "labels-only"


def feature_rows(world: Any, judge: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Per listed pair, the supervised imputer's features the simulated world holds: the
    judge's log-odds, the unbiased LLM's (``judge:no-behavior``, when judged), sigma (the
    judge's CF model) and the item's log training popularity."""
    p = world.imputers[judge][0]
    sem = world.imputers.get("judge:no-behavior", (None, None))[0]
    cf = world.imputers.get("cf", (None, None))[0]
    out = {}
    for n, pair in enumerate(world.pairs):
        out[pair] = {
            "logit_p_yes": logit(p[n]),
            "logit_p_semantic": logit(sem[n]) if sem is not None else None,
            "sigma": float(2 * cf[n] - 1) if cf is not None else None,
            "log_popularity": math.log1p(float(world.popularity[n])),
            "log_history": None,
            "evidence": None,
        }
    return out


def _dr_cells(world: Any, observed: np.ndarray, theta: np.ndarray, p: np.ndarray,
              metric: str, chosen: tuple[np.ndarray, np.ndarray]) -> dict[str, tuple]:  # fmt: skip
    """DR of ``metric`` per system with imputer probabilities ``p`` (hard label p > 0.5) and
    propensities ``theta``: ``(value, lo, hi)`` as ``one_log`` computes its rows."""
    users, idx = chosen
    y_all = world.relevant * observed
    h_all = (p > 0.5).astype(float)
    out = {}
    for name, m in world.slots.items():
        valid = (m >= 0).astype(float)
        o, y = _gather(observed.astype(float), m), _gather(y_all, m)
        t = _gather(theta, m, 1.0)
        w = _padded_weights(metric, m.shape[1])
        vals = linear_values("dr", w, o, y, _gather(p, m) * valid, _gather(h_all, m) * valid,
                             t)[users]  # fmt: skip
        out[name] = (float(vals.mean()), *bootstrap_ci(vals[idx].mean(axis=1)))
    return out


def imputers_on_gold(
    world: Any,
    judge: str,
    metrics: Sequence[str],
    sizes: Sequence[int],
    seed: int,
    truth: Mapping[str, Mapping[str, float]],
    log: tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]],
    runs: Sequence[Any],
) -> dict[tuple[int, str, str, str], list[tuple[float, bool, float, int, int]]]:
    """The module's estimators on one evaluation's gold samples. ``log``: (observed per pair,
    fitted propensities per pair, the ``listed`` users and their resamples). Returns
    ``{(size, design, row, metric): [(abs error, covered, width, gold pairs, refused)]}``,
    one entry per system (``gold_on_log``'s form)."""
    observed, theta, chosen = log
    p, h = world.imputers[judge]
    base = {pair: (float(a), bool(b)) for pair, a, b in zip(world.pairs, p, h, strict=True)}
    rows = feature_rows(world, judge)
    index = {pair: n for n, pair in enumerate(world.pairs)}
    k = max(parse_metric(m)[1] for m in metrics)
    frame = len(listed_pairs(runs, world.users, k))
    out: dict[tuple[int, str, str, str], list[tuple[float, bool, float, int, int]]] = {}

    def add(key: tuple, t: float, value: float | None, ci: Any) -> None:
        # gold_summary's cells: (abs error, covered, width, gold pairs, refused)
        if value is None or not ci:
            out.setdefault(key, []).append((np.nan, False, np.nan, len(labels), 1))
            return
        lo, hi = ci
        out.setdefault(key, []).append((abs(value - t), lo <= t <= hi, hi - lo, len(labels), 0))

    for n in sizes:
        for design in GOLD_DESIGNS:
            gold = draw_gold(world, runs, k, n, design, seed, index, base)
            labels = gold.labels
            for key, cells in _oua_cells(world, rows, gold, runs, metrics, truth, observed,
                                         theta, chosen, seed).items():  # fmt: skip
                for t, value, ci in cells:
                    add((n, design, *key), t, value, ci)
            for name in transport_judges(world, judge):
                out.setdefault((n, design, transport_row(name, judge), "-"), []).append(
                    _transport_flags(world, world.imputers[name][0], labels, runs, k, index)
                )
            # labels-only reads no prediction (``ppi_run``'s ``labels_only`` puts a constant
            # in the judge's place): it takes the judge's pairs only for their keys
            judged = {LABELS_ONLY: base, f"judge {judge}": base}
            unlabelled = np.array([pair not in labels for pair in world.pairs])
            for method in SUPERVISED:
                try:
                    fitted = fit_imputer(rows, labels, method, seed=seed)
                except ValueError:  # too few gold users, or one class: no fit, counted
                    continue
                judged[f"supervised:{method}"] = {
                    pair: (fitted.p[pair], fitted.p[pair] > 0.5) for pair in world.pairs
                }
                # its discrimination where it matters: the pairs it imputes, against the truth
                pv = np.array([fitted.p[pair] for pair in world.pairs])
                y = world.relevant[unlabelled]
                out.setdefault((n, design, f"auc [supervised:{method}]", "-"), []).append(
                    (labelled_auc(pv[unlabelled], y), fitted.oof["auc"]))  # fmt: skip
            for metric in metrics:

                def cell(row: str, t: float, v: Any, ci: Any, key=(n, design), m=metric) -> None:
                    add((*key, row, m), t, v, ci)

                _estimate_cells(cell, world, judged, gold, runs, metric, frame, truth,
                                (observed, theta, chosen))  # fmt: skip
    return out


#: calibration refits per gold sample in the bench's OUA rows (evaluate uses 1,000)
OUA_BENCH_DRAWS = 100
#: the logit shift of the planted lenient system's judge probabilities (transport rows)
PLANTED_SHIFT = 1.5
#: the synthetic calibrated imputers (``synthetic_imputer``'s AUC) whose transport check the
#: bench runs beside the judge's: judges whose scores carry the signal, so that a lenient
#: system's shifted scores move its calibrated level (the 1.5B judge's AUC 0.567 barely does)
TRANSPORT_AUCS = (0.8, 0.9)
#: unplanted world: a pooled map whose true mean residual on a system's listed pairs is below
#: this transports to it (the test should pass), at or above ``FAILS_TO_TRANSPORT`` it does
#: not (the test should fail); on a 9 % base rate, 0.005 and 0.02 are ~5 % and ~20 % of it
TRANSPORTS, FAILS_TO_TRANSPORT = 0.005, 0.02


def _oua_cells(world, rows, gold, runs, metrics, truth, observed, theta, chosen,
               seed) -> dict[tuple[str, str], list[tuple]]:  # fmt: skip
    """DM and DR (fit theta) on the isotonic imputer fitted on this gold sample: with the
    fitted map held fixed (user bootstrap), with it refitted in every draw (``refit_draws``,
    CJE's OUA bootstrap; ``value +- t_{G-1} sd``, as ``evaluate``), and DM's OUA interval
    bounded by the calibration's residual on each system's gold pairs (``evaluate``'s
    transport-bounded DM, ``_transport.bound_levels``).
    Returns ``{(row, metric): [(truth, value, ci)]}``, one entry per system."""
    from scipy.stats import t as student

    labels = gold.labels

    try:
        fitted = fit_imputer(rows, labels, "isotonic", seed=seed)
        index, probs, n_gold = refit_draws(rows, labels, "isotonic", OUA_BENCH_DRAWS, seed)
    except ValueError:
        return {}
    cols = np.array([index[pair] for pair in world.pairs])
    p_fix = np.array([fitted.p[pair] for pair in world.pairs])
    users, idx = chosen
    q = float(student.ppf(0.975, max(n_gold - 1, 1)))
    y_all = world.relevant * observed
    out: dict[tuple[str, str], list[tuple]] = {}
    judged = {pair: (float(v), False) for pair, v in zip(world.pairs, p_fix, strict=True)}
    evaluated = [world.users[j] for j in users]
    k = max(parse_metric(m)[1] for m in metrics)
    frame = len(listed_pairs(runs, world.users, k))
    by_name = {run.name: run for run in runs}
    for metric in metrics:
        for name, m in world.slots.items():
            valid = (m >= 0).astype(float)
            o, y = _gather(observed.astype(float), m), _gather(y_all, m)
            t = _gather(theta, m, 1.0)
            w = _padded_weights(metric, m.shape[1])
            zero = np.zeros_like(o)
            cell = (w, o, y, m, valid, zero, t)
            for est in ("dm", "dr"):
                v = _vals(est, cell, p_fix, users)
                label = f"{est} [supervised:isotonic{', fit theta' if est == 'dr' else ''}"
                out.setdefault((f"{label}]", metric), []).append(
                    (truth[metric][name], float(v.mean()), bootstrap_ci(v[idx].mean(axis=1)))
                )
                boot = np.array([_vals(est, cell, probs[b][cols], users)[idx[b]].mean()
                                 for b in range(min(OUA_BENCH_DRAWS, len(idx)))])  # fmt: skip
                half = q * float(boot.std(ddof=1))
                ci = (v.mean() - half, v.mean() + half)
                out.setdefault((f"{label}, OUA]", metric), []).append(
                    (truth[metric][name], float(v.mean()), ci)
                )
                if est != "dm":
                    continue
                cell_dm = {name: {metric: {"dm": {"value": float(v.mean()), "ci": list(ci)}}}}
                bound = residual_interval(by_name[name], evaluated, judged, gold, metric, frame,
                                          alpha=0.025)  # fmt: skip
                bound_levels(cell_dm, {name: {metric: bound}}, df=max(n_gold - 1, 1))
                out.setdefault((f"{label}, OUA, transport-bounded]", metric), []).append(
                    (truth[metric][name], float(v.mean()), cell_dm[name][metric]["dm"]["ci"])
                )
    return out


def _vals(est: str, cell: tuple, p: np.ndarray, users: np.ndarray) -> np.ndarray:
    """Per chosen user, ``est``'s value of a system's metric with imputer probabilities ``p``
    (``cell``: the system's weights, observations, labels, slots, valid mask, zeros, theta)."""
    w, o, y, m, valid, zero, t = cell
    return linear_values(est, w, o, y, _gather(p, m) * valid, zero, t)[users]


def transport_judges(world: Any, judge: str) -> list[str]:
    """The imputers the bench's transport check runs on: the judge and the synthetic
    calibrated imputers of ``TRANSPORT_AUCS`` the world holds (``bound``)."""
    synth = [synthetic_name(auc) for auc in TRANSPORT_AUCS]
    return [judge, *(name for name in synth if name in world.imputers)]


def transport_row(name: str, judge: str) -> str:
    """The results' row of the transport check on imputer ``name``: ``transport`` for the
    bench's judge (the key older results have), ``transport [name]`` for the others."""
    return "transport" if name == judge else f"transport [{name}]"


def oracle_power(residuals: np.ndarray, n: int, alpha: float = 0.05) -> float:
    """The power of the best test of a mean residual on ``n`` gold pairs drawn independently
    from ``residuals`` (a system's every listed pair, ``Y - p_cal`` under the map its check
    uses), the residuals' mean and spread known: ``Phi(|d| / se - z) + Phi(-|d| / se - z)``
    with ``d`` their mean, ``se = sd / sqrt(n)`` and ``z`` the two-sided normal quantile
    (the mean of ``n`` pairs taken as normal: for 0/1 labels at a few dozen pairs, a
    few points off either way).
    No check on these pairs can do better (the map's own error and the users' clustering
    only add variance), so where it is below 90 % the goal is out of reach at this size."""
    from scipy.stats import norm

    if n < 2 or len(residuals) == 0:
        return float("nan")
    d = abs(float(np.mean(residuals)))
    se = float(np.std(residuals)) / math.sqrt(n)
    if se == 0:
        return float(d > 0)
    z = float(norm.ppf(1 - alpha / 2))
    return float(norm.cdf(d / se - z) + norm.cdf(-d / se - z))


def _transport_flags(world, p, labels, runs, k, index) -> tuple[float, ...]:
    """The transport check on this gold sample: with the judge's probabilities of the first
    system's pairs shifted by ``PLANTED_SHIFT`` on the logit scale (a lenient system) and each
    system checked against an isotonic map fitted on the other systems' gold pairs
    (``evaluate``'s leave-system-out check), whether that system fails and the share of the
    other systems that fail; and, unplanted, the share of systems that fail, overall and
    split by the pooled map's true bias on the system (``TRANSPORTS``, ``FAILS_TO_TRANSPORT``).
    Returns (planted flagged, others flagged, honest world flagged, flagged where it
    transports, such systems, flagged where it does not, such systems, the planted system's
    true bias under its leave-system-out map, the residual its check could detect at 80 %
    power, and the power of the best test on its gold pairs, ``oracle_power``)."""
    target = runs[0].name
    mine = np.zeros(len(world.pairs), dtype=bool)
    m = world.slots[target]
    mine[m[m >= 0]] = True
    z = np.log(np.clip(p, 1e-6, 1 - 1e-6) / np.clip(1 - p, 1e-6, 1))
    planted = np.where(mine, 1 / (1 + np.exp(-(z + PLANTED_SHIFT))), p)
    gi = [index[key] for key in labels]
    y = [labels[key] for key in labels]
    got = []
    for probs in (planted, p):
        xs, ys = fit_isotonic(probs[gi], y)
        cal = apply_map(xs, ys, probs)
        judged = {pair: (float(c), False) for pair, c in zip(world.pairs, cal, strict=True)}

        def refit(train: Mapping[tuple[str, str], int], probs: np.ndarray = probs) -> dict:
            # evaluate's leave-system-out map: isotonic on the other systems' gold pairs
            # (the check reads the gold pairs only)
            fx, fy = fit_isotonic(probs[[index[key] for key in train]], list(train.values()))
            return dict(zip(labels, apply_map(fx, fy, probs[gi]).tolist(), strict=True))

        got.append(transport_check(runs, world.users, judged, labels, k, refit=refit))
    # what the plant does to the level the check tests: the map fitted on the other systems'
    # gold pairs, applied to every listed pair of the planted system, against the truth
    target_pairs = m[m >= 0]
    others_gold = {key: v for key, v in labels.items() if not mine[index[key]]}
    try:
        fx, fy = fit_isotonic(planted[[index[key] for key in others_gold]],
                              list(others_gold.values()))  # fmt: skip
        resid = world.relevant[target_pairs] - apply_map(fx, fy, planted[target_pairs])
        planted_bias = abs(float(np.mean(resid)))
        oracle = oracle_power(resid, len(labels) - len(others_gold))  # its gold pairs
    except ValueError:
        planted_bias = oracle = np.nan
    detectable = got[0][target].get("detectable")
    flagged = {n: d["verdict"] == "fail" for n, d in got[0].items()}
    others = [v for n, v in flagged.items() if n != target]
    honest = [d["verdict"] == "fail" for d in got[1].values()]
    # unplanted: does the pooled map really transport to each system? Its true mean residual
    # over the system's listed pairs (the truth the test estimates), beside its verdict
    xs, ys = fit_isotonic(p[gi], y)
    cal = apply_map(xs, ys, p)
    cells: dict[str, list[float]] = {"small": [], "big": []}
    for name, d in got[1].items():
        m = world.slots[name]
        idx = m[m >= 0]
        bias = abs(float(np.mean(world.relevant[idx] - cal[idx])))
        if bias < TRANSPORTS:
            cells["small"].append(float(d["verdict"] == "fail"))
        elif bias >= FAILS_TO_TRANSPORT:
            cells["big"].append(float(d["verdict"] == "fail"))
    mean = {c: float(np.mean(v)) if v else np.nan for c, v in cells.items()}
    return (float(flagged[target]), float(np.mean(others)) if others else np.nan,
            float(np.mean(honest)), mean["small"], len(cells["small"]), mean["big"],
            len(cells["big"]), planted_bias,
            float(detectable) if detectable is not None else np.nan, oracle)  # fmt: skip


def imputer_summary(
    per_log: Sequence[Mapping[tuple[int, str, str, str], Sequence[tuple]]],
) -> dict[str, Any]:
    """``{size: {design: {row: {metric: {abs_error, coverage, ci_width, gold_pairs,
    intervals, refused}}}}}`` over the evaluations and systems (``gold_summary``'s form),
    and per size and design each supervised imputer's mean AUC against the truth on the
    pairs it imputed (``auc``) and out of fold on the gold pairs (``auc_gold``)."""
    out = gold_summary([{k: v for k, v in log.items() if k[3] != "-"} for log in per_log])
    aucs: dict[tuple[str, str, str], list[tuple]] = {}
    transport: dict[tuple[str, str], list[tuple]] = {}
    for log in per_log:
        for (n, design, row, metric), vals in log.items():
            if row.startswith("transport"):
                transport.setdefault((str(n), design, row), []).extend(vals)
            elif metric == "-":
                aucs.setdefault((str(n), design, row), []).extend(vals)
    for (n, design, row), vals in transport.items():
        a = np.array(vals, dtype=float)
        transports, transports_n = _share(a, 3, 4)
        fails, fails_n = _share(a, 5, 6)
        out.setdefault(n, {}).setdefault(design, {})[row] = {
            "planted_flagged": float(np.nanmean(a[:, 0])),
            "others_flagged": float(np.nanmean(a[:, 1])),
            "honest_world_flagged": float(np.nanmean(a[:, 2])), "samples": len(a),
            "flagged_where_it_transports": transports, "systems_where_it_transports": transports_n,
            "flagged_where_it_does_not": fails, "systems_where_it_does_not": fails_n,
            "planted_true_bias": _nanmean(a, 7), "planted_detectable": _nanmean(a, 8),
            "planted_oracle_power": _nanmean(a, 9)}  # fmt: skip
    for (n, design, row), vals in aucs.items():
        a = [v[0] for v in vals if v[0] is not None]
        g = [v[1] for v in vals if v[1] is not None]
        out.setdefault(n, {}).setdefault(design, {})[row] = {
            "auc": float(np.mean(a)) if a else None,
            "auc_gold": float(np.mean(g)) if g else None,
            "fits": len(vals),
        }
    return out


def _share(a: np.ndarray, col: int, count: int) -> tuple[float | None, int]:
    """The mean of column ``col`` (a per-sample share) weighted by column ``count`` (how
    many systems it is over), and their total: the share over every such system."""
    n_cells = int(np.sum(a[:, count]))
    if n_cells == 0:
        return None, 0
    ok = ~np.isnan(a[:, col])
    return float(np.sum(a[ok, col] * a[ok, count]) / n_cells), n_cells


def _estimate_cells(
    add: Any,
    world: Any,
    judged: Mapping[str, Mapping[Any, tuple[float, bool]]],
    gold: Any,
    runs: Sequence[Any],
    metric: str,
    frame: int,
    truth: Mapping[str, Mapping[str, float]],
    log: tuple[np.ndarray, np.ndarray, Any],
) -> None:
    """``imputers_on_gold``'s cells of one gold sample and metric: PPI++ on each imputer
    (labels alone included) and DR with fitted propensities on each judge's probabilities,
    per system; ``add(row, truth, value, ci)`` (a refused estimate: value and ci None)."""
    observed, theta, chosen = log
    for name, jd in judged.items():
        for run in runs:
            t = truth[metric][run.name]
            try:
                e = ppi_run(run, world.users, jd, gold, metric, frame, "auto",
                            labels_only=name == LABELS_ONLY)  # fmt: skip
                add(f"ppi [{name}]", t, e.value, e.ci)
            except ValueError:
                add(f"ppi [{name}]", t, None, None)
        if name == LABELS_ONLY:
            continue
        pv = np.array([jd[pair][0] for pair in world.pairs])
        for system, (v, lo, hi) in _dr_cells(world, observed, theta, pv, metric, chosen).items():
            add(f"dr [{name}, fit theta]", truth[metric][system], v, (lo, hi))
    for method in SUPERVISED:  # a sample the fit refused: counted for its rows
        if f"supervised:{method}" not in judged:
            for row in (f"ppi [supervised:{method}]", f"dr [supervised:{method}, fit theta]"):
                for _ in runs:
                    add(row, 0.0, None, None)


def imputer_section(r: Mapping[str, Any], metrics: Sequence[str], draws: int) -> list[str]:
    """The report's section: per gold size, design and metric, each row's coverage and width,
    the width relative to labels-only and to SNIPS (fit theta, no gold), and whether the
    goal (>= 30 % narrower than both at >= 90 % coverage) is met."""
    got = r.get("gold_imputers")
    if not got:
        return []
    snips = r["summary"].get("snips (fit theta)", {})
    lines = [
        "",
        "## Imputers fitted on the gold sample (the supervised imputer)",
        "",
        f"On each of the first {draws} evaluations and each gold sample: labels alone "
        "(`labels-only`: a constant 1 for the judge, as `evaluate`'s worth line reads them), "
        "PPI++ on the judge's raw p_yes, and "
        "PPI++ and DR (fitted propensities) on the supervised imputers fitted on that sample "
        "(`evaluate --gold --calibration logistic|boosting`: the judge's log-odds, the "
        "unbiased LLM's log-odds, sigma and the item's log popularity, cross-fitted over the "
        "gold users). `vs labels` and `vs SNIPS`: the interval's width relative to labels-only "
        "and to SNIPS (fit theta; no judge, no gold) on the same metric. Goal: >= 30 % narrower "
        "than both at >= 90 % coverage. The DR interval holds the fitted probabilities fixed "
        "(the fit's variance is not inside it).",
        "",
        "| gold pairs | design | metric | row | coverage | CI width | vs labels | vs SNIPS "
        "| mean abs error | refused | goal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += _width_rows(got, metrics, snips)
    lines += ["", f"The transport check (`evaluate`'s, per system): the first system's judge "
              f"probabilities shifted by {PLANTED_SHIFT:g} on the logit scale (a lenient "
              "system), each system's gold residuals taken from an isotonic map fitted on the "
              "other systems' gold pairs (leave-system-out, its own error by a delete-a-group "
              "jackknife); the share of samples in "
              "which that system fails (goal >= 90 %), in which the other systems fail (the "
              "lenient one pulls the map they are checked against, so their levels move too), "
              "and in which any system fails without the plant (goal <= 10 %). The judge: "
              "the bench's, and synthetic calibrated imputers of a known AUC in its place "
              "(`synthetic_imputer`: scores that carry the signal, so the plant moves the "
              "calibrated level). `best test's power`: no check on the planted system's "
              "gold pairs can flag it more often (`oracle_power`: its pairs independent, "
              "the residuals' mean and spread known):", "",
              "| judge | gold pairs | design | samples | planted flagged | others flagged | "
              "honest world flagged | of them: where the map transports (true bias < "
              f"{TRANSPORTS:g}) | where it does not (>= {FAILS_TO_TRANSPORT:g}) | planted: "
              "true bias of its calibrated level | planted: residual its check detects at "
              "80 % power | planted: best test's power |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += _transport_rows(got, r["gold_imputer"])
    lines += ["", "The supervised imputers' discrimination (mean over the samples it was fitted "
              "on; the judge's own AUC against the truth over every listed pair: "
              f"{_num(r['imputers'][r['gold_imputer']]['auc_vs_truth'], 3)}):", "",
              "| gold pairs | design | imputer | fits | AUC on the pairs it imputed | "
              "out-of-fold AUC on the gold |", "|---|---|---|---|---|---|"]  # fmt: skip
    for n, by_design in got.items():
        for design, by_row in by_design.items():
            for row, c in by_row.items():
                if row.startswith("auc ["):
                    lines.append(f"| {n} | {design} | {row[5:-1]} | {c['fits']} | "
                                 f"{_num(c['auc'], 3)} | {_num(c['auc_gold'], 3)} |")  # fmt: skip
    return lines


def _width_rows(got: Mapping[str, Any], metrics: Sequence[str], snips: Mapping) -> list[str]:
    """``imputer_section``'s width table rows: per gold size, design, metric and row."""
    out: list[str] = []
    for n, by_design in got.items():
        for design, by_row in by_design.items():
            for metric in metrics:
                ref = (by_row.get(f"ppi [{LABELS_ONLY}]") or {}).get(metric) or {}
                sn = (snips.get(metric) or {}).get("ci_width")
                for row, by_m in by_row.items():
                    if row.startswith(("auc [", "transport")):
                        continue
                    c = by_m.get(metric)
                    if not c:
                        continue
                    rel = _ratio(c["ci_width"], ref.get("ci_width"))
                    rs = _ratio(c["ci_width"], sn)
                    goal = ("yes" if c["coverage"] is not None and c["coverage"] >= 0.9
                            and rel is not None and rs is not None and rel <= 0.7 and rs <= 0.7
                            else "no")  # fmt: skip
                    out.append(
                        f"| {n} | {design} | {metric} | {row} | {_pct(c['coverage'])} | "
                        f"{_num(c['ci_width'])} | {_num(rel, 2)} | {_num(rs, 2)} | "
                        f"{_num(c['abs_error'])} | {c['refused']} | {goal} |"
                    )
    return out


def _nanmean(a: np.ndarray, col: int) -> float | None:
    """The mean of column ``col`` over the samples that have it (None: none has; older
    results have fewer columns)."""
    if a.ndim != 2 or a.shape[1] <= col or not np.isfinite(a[:, col]).any():
        return None
    return float(np.nanmean(a[:, col]))


def _transport_rows(got: Mapping[str, Any], judge: str) -> list[str]:
    """``imputer_section``'s transport table rows: per judge, gold size and design."""
    cells: dict[str, list[tuple[str, str, Mapping[str, Any]]]] = {}
    for n, by_design in got.items():
        for design, by_row in by_design.items():
            for row, c in by_row.items():
                if row.startswith("transport"):
                    name = (
                        judge
                        if row == "transport"
                        else row.removeprefix("transport [").removesuffix("]")
                    )
                    cells.setdefault(name, []).append((n, design, c))
    out: list[str] = []
    for name, rows in cells.items():
        for n, design, c in rows:
            out.append(f"| {name} | {n} | {design} | {c['samples']} | "
                       f"{_pct(c['planted_flagged'])} | {_pct(c['others_flagged'])} | "
                       f"{_pct(c['honest_world_flagged'])} | "
                       f"{_pct(c.get('flagged_where_it_transports'))} of "
                       f"{c.get('systems_where_it_transports', 0)} | "
                       f"{_pct(c.get('flagged_where_it_does_not'))} of "
                       f"{c.get('systems_where_it_does_not', 0)} | "
                       f"{_num(c.get('planted_true_bias'))} | "
                       f"{_num(c.get('planted_detectable'))} | "
                       f"{_pct(c.get('planted_oracle_power'))} |")  # fmt: skip
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _num(v: float | None, nd: int = 4) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"
