"""The estimators on a whole evaluation: the systems' lists as estimator records
(``list_labels``), every estimator per system and metric (``estimate_runs``,
``estimate_evaluation``: with propensities, a calibration's refits and a gold sample), the
rank intervals, the transport check and the weight diagnostics."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recjudge._stats import bootstrap_ci, bootstrap_ranks
from recjudge._util import json_loads
from recjudge.data import DataError
from recjudge.evaluators.offline._estimators import (
    ESTIMATORS,
    LINEAR,
    Estimate,
    ListLabels,
    estimate,
    metric_weights,
    parse_metric,
)
from recjudge.evaluators.offline._gold import GoldSample, listed_pairs
from recjudge.evaluators.offline._gold_ppi import (
    MIN_TUNED_CLUSTERS,
    every_listed_labelled,
    labels_lists,
    ppi_difference,
    ppi_run,
)
from recjudge.evaluators.offline._propensities import Propensities
from recjudge.evaluators.offline._transport import (
    TRANSPORT_MARGIN,
    bound_levels,
    refuse_levels,
    residual_interval,
    transport_check,
)
from recjudge.evaluators.offline._worth import judge_worth

if TYPE_CHECKING:
    from recjudge.evaluators.offline._transport import Refit


def list_labels(
    ranking: Sequence[str],
    user: str,
    logged: Mapping[str, int],
    judged: Mapping[str, tuple[float, bool]],
    propensities: Propensities,
    k: int,
) -> tuple[ListLabels, int]:
    """One user's ``ListLabels`` for the top-k of ``ranking``: logged labels where the log
    has them, and the judge's (p, hard label) by item from ``judged``. A pair the judge did not
    answer has p = NaN (``dm`` and ``dr`` are then undefined: their imputation must not depend
    on whether the pair was logged) and hard label 0; and how many propensities were clipped."""
    top = list(ranking[:k])
    rows = np.empty((5, len(top)))
    clipped = 0
    for r, i in enumerate(top):
        j = judged.get(i)
        t, c = propensities.of(user, i)
        clipped += c
        lab = logged.get(i)
        rows[:, r] = (lab is not None, lab or 0.0, j[0] if j else np.nan,
                      j[1] if j else 0.0, t)  # fmt: skip
    return ListLabels(*rows), clipped


@dataclass(frozen=True)
class Refused:
    """What ``imputed_records``' ``parse`` returns for a value it read but refuses."""

    problem: str
    field: str


def imputed_records(path: str | Path, parse: Callable[[dict], Any], what: str) -> Iterator[Any]:
    """``parse(record)`` of each judged record of an ``imputed.jsonl`` sidecar (records with
    an error are passed over), in file order.

    Raises:
        DataError: a missing file, or a line ``parse`` cannot read (``what`` it should be,
            the file and line named).
    """
    path = Path(path)
    fix = "pass the --out folder of `recjudge impute` (it holds imputed.jsonl)"
    if not path.is_file():
        raise DataError("no such file.", source=str(path), fix=fix)
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json_loads(line)
            if rec.get("error"):
                continue
            got = parse(rec)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise DataError(f"not {what}.", source=str(path), row=n, fix=fix) from None
        if isinstance(got, Refused):  # a value parse read but refuses (its field named)
            raise DataError(got.problem, source=str(path), row=n, field=got.field, fix=fix)
        yield got


def read_judged(path: str | Path, raw: bool = False) -> dict[tuple[str, str], tuple[float, bool]]:
    """The judge's ``(p, label)`` per (user, item) from an ``imputed.jsonl`` sidecar (pairs
    with an error are left out): ``p`` is ``p_calibrated`` where impute applied a calibration
    map, unless ``raw`` (then always ``p_yes``).

    Raises:
        DataError: a line that is not such a record (names the file and line).
    """

    def parse(rec: dict) -> Any:
        # The calibrated probability when impute applied a calibration map.
        p = float(rec["p_yes"] if raw else rec.get("p_calibrated", rec["p_yes"]))
        key = (str(rec["user_id"]), str(rec["item_id"]))
        if not 0.0 <= p <= 1.0:
            return Refused(f"p_yes {p} is not a probability.", "p_yes")
        return key, (p, bool(rec["label"]))

    what = "an imputed-pair record (user_id, item_id, label, p_yes)"
    return dict(imputed_records(path, parse, what))


def estimate_runs(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    propensities: Propensities,
    users: Sequence[str],
    metrics: Sequence[str],
    estimators: Sequence[str] = ESTIMATORS,
    *,
    draws: int = 1000,
    seed: int = 0,
    refits: tuple[Mapping[tuple[str, str], int], np.ndarray, int] | None = None,
) -> dict[str, Any]:
    """Every estimator of every metric for each run (``RecRun``) on ``users``; ``refits``
    (``_supervised.refit_draws``: pair -> column, ``[draws, pairs]``, gold users) puts the
    calibration's refits into ``dm`` and ``dr``'s intervals (``estimate``'s ``p_draws``; its
    draws set the number of resamples).

    Returns:
        ``{"systems": {run: {metric: {estimator: Estimate.to_dict()}}}, "clipped": n,
        "propensity": describe}``.
    """
    k = max(parse_metric(m)[1] for m in metrics)
    systems: dict[str, Any] = {}
    raw: dict[str, dict[str, dict[str, Estimate]]] = {}
    clipped = 0
    for run, (lists, c) in zip(runs, run_lists(runs, logged, judged, propensities, users, k),
                               strict=True):  # fmt: skip
        clipped += c
        p_draws = None
        if refits is not None:
            draws = len(refits[1])
            p_draws = _RefitLists(run, sorted(lists), k, refits[0], refits[1])
        got = estimate(lists, metrics, estimators, draws=draws, seed=seed, p_draws=p_draws,
                       p_clusters=refits[2] if refits else 0)  # fmt: skip
        raw[run.name] = got
        systems[run.name] = {m: {e: v.to_dict() for e, v in d.items()} for m, d in got.items()}
    for name, by_metric in rank_intervals(raw).items():
        for m, by_est in by_metric.items():
            for e, r in by_est.items():
                systems[name][m][e].update(r)
    return {"systems": systems, "clipped": clipped, "propensity": propensities.describe,
            "differences": estimator_differences(raw)}  # fmt: skip


def paired_difference(a: Estimate, b: Estimate) -> dict[str, Any]:
    """``a - b`` of two systems' estimates over the same bootstrap resamples (draw ``b`` of
    each holds the same users, and calibration refits): the difference of the values, and the
    interval of the same kind as theirs (``bootstrap_ci`` of the paired draws, or ``+- t
    sd(draws)`` for the OUA bootstrap's). ``ci`` is None where either has no draws."""
    if a.value is None or b.value is None:
        return {"value": None, "ci": None}
    value = a.value - b.value
    if a.boot is None or b.boot is None or len(a.boot) != len(b.boot):
        return {"value": value, "ci": None}
    d = np.asarray(a.boot) - np.asarray(b.boot)
    if a.t_quantile is not None:
        half = float(a.t_quantile * d.std(ddof=1))
        return {"value": value, "ci": [value - half, value + half]}
    return {"value": value, "ci": [float(x) for x in bootstrap_ci(d)]}


def estimator_differences(
    systems: Mapping[str, Mapping[str, Mapping[str, Estimate]]],
) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """``{metric: {estimator: {"a - b": paired_difference}}}`` for every pair of systems
    (in the order given), the verdict table's input."""
    names = list(systems)
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    if len(names) < 2:
        return out
    for m, by_est in systems[names[0]].items():
        for e in by_est:
            cells = {n: systems[n].get(m, {}).get(e) for n in names}
            if any(c is None for c in cells.values()):
                continue
            out.setdefault(m, {})[e] = {
                f"{a} - {b}": paired_difference(cells[a], cells[b])  # type: ignore[arg-type]
                for a, b in itertools.combinations(names, 2)
            }
    return out


def rank_intervals(
    systems: Mapping[str, Mapping[str, Mapping[str, Estimate]]],
) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Per system, metric and estimator: its rank and rank interval (``_stats.bootstrap_ranks``)
    over the shared bootstrap resamples (the same users, and calibration refits, in draw
    ``b`` for every system). Estimators without draws for every system get none."""
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {n: {} for n in systems}
    names = list(systems)
    if len(names) < 2:
        return out
    first = systems[names[0]]
    for m, by_est in first.items():
        for e in by_est:
            cells = [systems[n].get(m, {}).get(e) for n in names]
            if any(c is None or c.boot is None or c.value is None for c in cells):
                continue
            got = bootstrap_ranks(np.stack([c.boot for c in cells]), [c.value for c in cells])
            for n, r in zip(names, got, strict=True):
                out[n].setdefault(m, {})[e] = r
    return out


class _RefitLists:
    """The refitted probabilities of a run's top-k as ``estimate``'s ``p_draws``: draw ``b``
    is ``[users, k]`` (0 past a short list or for a pair without one, as ``_stack`` pads),
    gathered when asked, so no ``[draws, users, k]`` copy is held per run."""

    def __init__(self, run: Any, users: Sequence[str], k: int,
                 index: Mapping[tuple[str, str], int], probs: np.ndarray) -> None:  # fmt: skip
        self.cols = np.full((len(users), k), -1, dtype=int)
        for r, u in enumerate(users):
            for c, i in enumerate(run.rankings.get(u, [])[:k]):
                self.cols[r, c] = index.get((u, i), -1)
        self.probs = probs

    def __len__(self) -> int:
        return len(self.probs)

    def __getitem__(self, b: int) -> np.ndarray:
        return np.where(self.cols >= 0, self.probs[b][np.maximum(self.cols, 0)], 0.0)


def run_lists(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    propensities: Propensities,
    users: Sequence[str],
    k: int,
) -> list[tuple[dict[str, ListLabels], int]]:
    """Per run (``RecRun``), every user's ``ListLabels`` of its top-k and the number of
    propensity lookups that were clipped."""
    by_user: dict[str, dict[str, tuple[float, bool]]] = {}
    for (u, i), v in judged.items():
        by_user.setdefault(u, {})[i] = v
    out = []
    for run in runs:
        lists, clipped = {}, 0
        for u in users:
            lists[u], c = list_labels(run.rankings.get(u, []), u, logged.get(u, {}),
                                      by_user.get(u, {}), propensities, k)  # fmt: skip
            clipped += c
        out.append((lists, clipped))
    return out


# ranx's metric names (``evaluate --metrics``) -> the estimators' (whose nDCG has a fixed
# normaliser, hence its own name: see the module docstring). Others (recall, map, ...) have no
# estimator: ``evaluate`` refuses them with --estimators instead of computing another metric.
RANX_NAMES = {"precision": "precision", "ndcg": "ndcg_fixed", "mrr": "mrr", "hit_rate": "hit"}


def estimate_evaluation(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    propensities: Propensities,
    users: Sequence[str],
    metrics: Sequence[str],
    estimators: Sequence[str],
    *,
    calibrated: bool = False,
    gold: Any = None,
    gold_name: str = "",
    ppi_intervals: str = "auto",
    refits: tuple[Mapping[tuple[str, str], int], np.ndarray, int] | None = None,
    refit: Refit | None = None,
    transport_margin: float = TRANSPORT_MARGIN,
) -> dict[str, Any]:
    """``estimate_runs`` with what the report header names (calibration, gold sample, the
    propensity fit, the share of inverse-propensity weight on clipped pairs) and, given a gold
    sample (a ``GoldSample``, or ``{(user, item): label}`` taken as uniform), a ``ppi``
    estimate of each linear metric per run (``ppi_run``; an undefined one says why in its
    note). An estimate outside the metric's range is flagged in its note.

    With a calibrated judge and gold, each system's calibration is checked (``_transport``:
    an equivalence test against ``transport_margin``, leave-system-out when ``refit`` refits
    the calibration on given labels, else on the pooled map's residuals): a failing system's
    ``dm``/``dr`` are refused, and every ``dm`` interval becomes the transport-bounded one
    (``bound_levels``).

    ``judge_worth`` (``_worth``): per system and metric, DR's interval width over SNIPS's and,
    with gold, PPI's over the same design's labels-only estimate (``ppi_run``'s
    ``labels_only``)."""
    got = estimate_runs(runs, logged, judged, propensities, users, metrics, estimators,
                        refits=refits)  # fmt: skip
    got["propensity_fit"] = dict(propensities.fit) if propensities.fit else None
    kmax = max(parse_metric(m)[1] for m in metrics)
    diag = weight_diagnostics(runs, logged, propensities, users, kmax, metrics[0])
    got["clipped_weight_share"] = {n: d["clipped_share"] for n, d in diag.items()}
    got["weights"] = diag
    _flag_out_of_range(got["systems"])
    got["calibration"] = (
        "isotonic map from recjudge calibrate (p_calibrated)"
        if calibrated
        else "none: the judge's raw p_yes"
    )
    got["gold"] = "none"
    if gold is None:
        got["judge_worth"] = judge_worth(got["systems"], {}, {})  # DR against SNIPS only
        return got
    if not isinstance(gold, GoldSample):
        gold = GoldSample(dict(gold), design="unknown", source=gold_name)
    k = max(parse_metric(m)[1] for m in metrics)
    frame = len(listed_pairs(runs, users, k))
    got["gold"] = _describe_gold(gold, gold_name)
    if calibrated:  # the calibration checked on each system's own gold pairs
        dm_df = max(refits[2] - 1, 1) if refits is not None else None  # DM's OUA interval
        _check_transport(got, runs, users, judged, gold, metrics, frame, refit, dm_df,
                         transport_margin)  # fmt: skip
    labels_only: dict[str, dict[str, dict]] = {}
    for run in runs:
        for m in (m for m in metrics if parse_metric(m)[0] in LINEAR):
            try:
                e = ppi_run(run, users, judged, gold, m, frame, ppi_intervals)
            except ValueError as err:
                e = Estimate("ppi", m, None, None, note=str(err))
            got["systems"][run.name][m]["ppi"] = e.to_dict()
            if e.value is not None:  # the same design without the judge: its worth's yardstick
                base = ppi_run(run, users, judged, gold, m, frame, ppi_intervals, labels_only=True)
                labels_only.setdefault(run.name, {})[m] = base.to_dict()
    _gold_differences(got, runs, users, judged, gold, metrics, frame)
    held = {run.name: {m: sum((u, i) in gold.labels for u in users
                              for i in run.rankings.get(u, [])[:parse_metric(m)[1]])
                       for m in metrics} for run in runs}  # fmt: skip
    got["judge_worth"] = judge_worth(got["systems"], labels_only, held)
    _flag_out_of_range(got["systems"])  # the gold estimates too
    return got


def _describe_gold(gold: GoldSample, gold_name: str) -> str:
    """The report header's line on the gold sample: size, design, the PPI variant."""
    classes = set(gold.labels.values())
    warn = (f"; every gold label is {classes.pop()}: the PPI interval is not informative"
            if len(classes) == 1 else "")  # fmt: skip
    seq = "" if gold.sequential is None else (
        f" (sequential: the first {gold.sequential[0]} of {gold.sequential[1]} "
        f"{gold.unit} labelled)")  # fmt: skip
    return (f"{gold_name}: {len(gold)} pairs, design {gold.design}{seq}, PPI++ "
            "(Student's t, skewness-corrected (Hall) for pair designs; lambda "
            f"power-tuned from {MIN_TUNED_CLUSTERS} labelled clusters, else 1){warn}")  # fmt: skip


def _gold_differences(got: dict[str, Any], runs: Sequence[Any], users: Sequence[str],
                      judged: Mapping[tuple[str, str], tuple[float, bool]], gold: Any,
                      metrics: Sequence[str], frame: int) -> None:  # fmt: skip
    """In place on ``got``: the paired differences of the gold-based estimates, ``ppi``
    (``ppi_difference``, where both systems' PPI is defined) and, when the gold sample labels
    every listed pair, ``labels`` (each user's metric is then known: the labels alone, with
    an interval over resampled users, ranks and differences on the shared resamples)."""
    linear = [m for m in metrics if parse_metric(m)[0] in LINEAR]
    diffs = got.setdefault("differences", {})
    for m in linear:
        for a, b in itertools.combinations(runs, 2):
            ea, eb = (got["systems"][r.name][m]["ppi"] for r in (a, b))
            if ea["value"] is None or eb["value"] is None:
                d = {"value": None, "ci": None, "note": "PPI undefined for a system"}
            else:
                try:
                    d = ppi_difference(a, b, users, judged, gold, m, frame)
                except ValueError as err:
                    d = {"value": None, "ci": None, "note": str(err)}
            diffs.setdefault(m, {}).setdefault("ppi", {})[f"{a.name} - {b.name}"] = d
    k = max(parse_metric(m)[1] for m in metrics)
    if not every_listed_labelled(runs, users, gold, k):
        return
    raw: dict[str, dict[str, dict[str, Estimate]]] = {}
    note = ("every listed pair is labelled: the metric from the gold labels alone (no judge), "
            "95 % interval over resampled users")  # fmt: skip
    for run in runs:
        got_run = estimate(labels_lists(run, users, gold.labels, k), list(metrics), ["logged"])
        for m, by_est in got_run.items():
            e = replace(by_est["logged"], estimator="labels", note=note)
            raw.setdefault(run.name, {})[m] = {"labels": e}
            got["systems"][run.name][m]["labels"] = e.to_dict()
    for name, by_metric in rank_intervals(raw).items():
        for m, by_est in by_metric.items():
            got["systems"][name][m]["labels"].update(by_est["labels"])
    for m, by_est in estimator_differences(raw).items():
        diffs.setdefault(m, {}).update(by_est)


def _check_transport(got: dict[str, Any], runs: Sequence[Any], users: Sequence[str],
                     judged: Mapping[tuple[str, str], tuple[float, bool]], gold: Any,
                     metrics: Sequence[str], frame: int, refit: Refit | None,
                     dm_df: float | None, margin: float) -> None:  # fmt: skip
    """``estimate_evaluation``'s transport step (its docstring), in place on ``got``."""
    k = max(parse_metric(m)[1] for m in metrics)
    got["transport"] = transport_check(runs, users, judged, gold.labels, k, refit=refit,
                                       margin=margin)  # fmt: skip
    refuse_levels(got["systems"], got["transport"])
    nonlinear = "a nonlinear metric: the calibration's bias on it has no bound from gold pairs"
    bounds = {
        run.name: {
            m: (residual_interval(run, users, judged, gold, m, frame, alpha=0.025)
                if parse_metric(m)[0] in LINEAR else nonlinear)
            for m in metrics
        }
        for run in runs
    }  # fmt: skip
    bound_levels(got["systems"], bounds, df=dm_df)


def _flag_out_of_range(systems: Mapping[str, Mapping[str, Mapping[str, dict]]]) -> None:
    """Add to the note of every estimate outside its metric's range, or whose interval
    reaches outside it, why that happens and that it is not to be trusted (``out_of_range``
    set on the estimate: ``value`` or ``interval``)."""
    for by_metric in systems.values():
        for m, by_est in by_metric.items():
            top = metric_range(m)

            def inside(x: float, top: float = top) -> bool:
                return -1e-9 <= x <= top + 1e-9

            for e in by_est.values():
                v, ci = e["value"], e.get("ci")
                if e.get("out_of_range"):
                    continue  # flagged by an earlier call
                if v is not None and not inside(v):
                    what = "outside the metric's range"
                    e["out_of_range"] = "value"
                elif v is not None and ci and not (inside(ci[0]) and inside(ci[1])):
                    what = f"its interval [{ci[0]:.3g}, {ci[1]:.3g}] reaches outside the range"
                    e["out_of_range"] = "interval"
                else:
                    continue
                e["note"] = (e["note"] + "; " if e["note"] else "") + (
                    f"{what} [0, {top:g}]: inverse-propensity weights (small or clipped "
                    "propensities), few gold labels or a judge far from the labels; treat it "
                    "as unreliable")  # fmt: skip


def metric_range(metric: str) -> float:
    """The largest value ``metric@k`` can take (its smallest is 0)."""
    base, k = parse_metric(metric)
    return float(metric_weights(base, k).sum()) if base in LINEAR else 1.0


#: below this effective sample size of a system's inverse-propensity weights, or with more
#: than ``FRAGILE_TOP_SHARE`` of its IPS estimate on the top 1 % of weights, the weighted
#: estimates (IPS, SNIPS, DR) are ``fragile`` and may not lead the report: a normal interval
#: over fewer than ~30 effective observations is not to be trusted (the usual rule for a mean),
#: and an estimate most of which rests on a handful of pairs moves with any one of them.
MIN_ESS = 30


FRAGILE_TOP_SHARE = 0.5


def weight_diagnostics(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    propensities: Propensities,
    users: Sequence[str],
    k: int,
    metric: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Per run, the inverse-propensity weights ``v_r = w_r / theta_r`` of its logged top-k
    pairs (``w_r`` the position weights of ``metric``, 1 without one) and what they say:

    - ``ess``: Kish's effective sample size ``(sum v)^2 / sum v^2`` (Kish 1965; Owen 2013,
      sec. 9.3), the number of equally weighted pairs that would be as precise;
    - ``top1_share``: the share of the IPS numerator ``sum v_r Y_r`` carried by the largest
      1 % of the weights (at least one pair; None when no logged pair is relevant);
    - ``clipped_share``: the share of ``sum 1 / theta`` on pairs whose propensity was clipped;
    - ``verdict``: ``fragile`` when ``ess < MIN_ESS`` or ``top1_share > FRAGILE_TOP_SHARE``,
      else ``stable``.
    """
    w_pos = np.ones(k)
    if metric is not None and parse_metric(metric)[0] in LINEAR:
        base, mk = parse_metric(metric)
        w_pos = np.zeros(k)
        w_pos[: min(k, mk)] = metric_weights(base, mk)[: min(k, mk)]
    out = {}
    for run in runs:
        v, y, inv, clipped = [], [], 0.0, 0.0
        for u in users:
            labels = logged.get(u, {})
            for r, i in enumerate(run.rankings.get(u, [])[:k]):
                if i in labels:
                    t, c = propensities.of(u, i)
                    inv += 1.0 / t
                    clipped += (1.0 / t) if c else 0.0
                    if w_pos[r] > 0:
                        v.append(w_pos[r] / t)
                        y.append(float(labels[i] > 0))
        va, ya = np.asarray(v), np.asarray(y)
        ess = float(va.sum() ** 2 / (va**2).sum()) if len(va) else 0.0
        top = None
        if len(va) and (va * ya).sum() > 0:
            n_top = max(1, int(math.ceil(0.01 * len(va))))
            order = np.argsort(-va, kind="stable")[:n_top]
            top = float((va[order] * ya[order]).sum() / (va * ya).sum())
        fragile = ess < MIN_ESS or (top is not None and top > FRAGILE_TOP_SHARE)
        out[run.name] = {"logged_pairs": len(va), "ess": ess, "top1_share": top,
                         "clipped_share": clipped / inv if inv else 0.0,
                         "verdict": "fragile" if fragile else "stable"}  # fmt: skip
    return out


def clipped_weight_share(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    propensities: Propensities,
    users: Sequence[str],
    k: int,
) -> dict[str, float]:
    """Per run, the share of the inverse-propensity weight ``sum 1 / theta`` over its logged
    top-k pairs that sits on pairs whose propensity was clipped: how much of IPS/SNIPS/DR
    rests on the clip rather than the propensity model (``weight_diagnostics``)."""
    got = weight_diagnostics(runs, logged, propensities, users, k)
    return {n: d["clipped_share"] for n, d in got.items()}
