"""The metric estimators checked where the truth is known: ``bench brief-offline-estimators``.

``brief-offline``'s simulated world knows each user's whole online future and the
logging policy's exposure probabilities, so every estimator ``recjudge evaluate`` runs can
be held against the truth it estimates. The world:

- a population of users, recommenders (trained on the past), their top-k lists and the
  online truth ``R_ui`` (a future interaction rated >= ``positive_rating``) are
  ``brief-offline``'s; the target is each system's metric over the whole population;
- the judges' probabilities ``p_ui`` (and verdicts) are asked for *every* listed pair,
  logged or not, once (they do not depend on the log: the judge sees the past only),
  through the same store as ``brief-offline`` (its committed checkpoint replays them);
- each simulated evaluation **redraws the users** (``users_per_log`` of the population,
  with replacement: what a team that evaluates a sample of its users gets) and then the
  log: every drawn user observes every item of the catalogue independently,
  ``O_ui ~ Bernoulli(theta_i)`` with ``theta_i = (pop_i / max pop)^alpha`` (the exposure model
  of ``brief-offline``; unexposed and exposed-but-irrelevant pairs differ, as in Yang et al.
  2018), and the log reveals ``Y_ui = R_ui`` where observed.

Per evaluation, every estimator (``logged``; ``ips``/``snips`` with the true propensities,
the CLI's default ``--propensities fit`` and the fixed ``powerlaw:EXP``; ``imputed``/``dm``/
``dr`` with each imputation model) estimates each system's metric on the users that
``evaluate``'s user rule picks (``evaluation_users``: ``listed`` by default; a few rows
under the ``logged-positive`` rule show its selection bias) with a 95 % user-bootstrap
interval; over the evaluations: the error against the population metric, the signed
error per system, the lift gap of ``brief-offline``, Kendall's tau of the system order,
the interval's coverage and width. Propensities come from the code ``evaluate`` runs
(``propensities_from`` on the simulated log and the training popularity ``impute``
records). Gold labels are drawn by ``gold sample``'s code (``users`` design: every listed
pair of the drawn users; ``uniform``: pairs) and read by ``ppi_run`` with its default
intervals (clustered by user) and with ``iid`` ones. The judge's sigma source is varied:
the judge's own CF model, the circular case (one of the compared systems' models), and a
model that is none of them; the judgments for the latter two are decided from the
stored decision records of the same greedy pass (``judge_per_user``), no new decoding.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ConfigDict, Field, model_validator
from tqdm.auto import tqdm

from recjudge._stats import bootstrap_ci, labelled_auc, seed_interval, user_draws
from recjudge._util import rng
from recjudge.bench._judging import SIMULATORS, judges_for
from recjudge.bench._offline import (
    OfflineConfig,
    _simulate_log,
    _train_runs,
    exposure_probability,
    gap,
    trained_system,
)
from recjudge.cf_models import SideInfo, calibrate_on, calibrated_cf
from recjudge.data import Dataset, leave_one_out, load_dataset
from recjudge.evaluators import (
    LENIENCY_LIMIT,
    GoldSample,
    RecRun,
    RunCheck,
    apply_map,
    evaluation_users,
    fit_isotonic,
    kendall_tau,
    lenient_systems,
    linear_values,
    list_overlap,
    listed_pairs,
    metric_weights,
    parse_metric,
    ppi_run,
    propensities_from,
    sample_gold,
    snips_normaliser,
)
from recjudge.llm import read_card
from recjudge.reporting import figure, interval, write_report
from recjudge.reward import Population, ResultsStore, judge_per_user, requests_for
from recjudge.tune import TunedLeakageError, gold_overlap

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

ROW_ESTIMATORS = ("imputed", "dm", "dr")
#: propensity sources of the rows: the exposure model itself, ``evaluate``'s default fit,
#: and a fixed power-law exponent (``propensity_exponent``: the earlier default)
THETAS = ("true", "fit", "powerlaw")
#: the model-based rows' DR propensities
DR_THETAS = ("true", "fit")
#: suffix of the rows computed on the users with a logged positive (``logged-positive``)
LOGGED_POSITIVE = "logged-positive users"
GOLD_DESIGNS = ("users", "uniform", "active")
#: the imputer that *is* the truth (``bound``): DR with it has no correction left, so its
#: interval is the users' own sampling variance, the narrowest any imputer can reach
BOUND = "truth (bound)"
GOLD_INTERVALS = ("auto", "iid")


def synthetic_name(auc: float) -> str:
    """The name of the synthetic imputer of discrimination ``auc`` (``synthetic_imputer``)."""
    return f"calibrated, AUC {auc:g} (synthetic)"


class EstimatorCheckConfig(OfflineConfig):
    """Settings of ``brief-offline-estimators`` (``brief-offline``'s, whose judges and store
    it reuses, plus the following).

    Attributes:
        simulated_logs: evaluations drawn (each its own users and observation draw).
        users_per_log: users drawn (with replacement) per evaluation; None: as many as the
            population holds.
        metrics: linear metrics (``precision``, ``dcg``, ``ndcg_fixed`` @k, k <= 20).
        propensity_exponent: the fixed exponent of the ``powerlaw`` rows
            (``--propensities powerlaw:EXP``).
        clip: propensity floor (true, fitted and fixed).
        gold_sizes: gold pairs per sample (``gold sample --n``).
        gold_draws: evaluations (the first ones) that also draw a gold sample per size and
            design.
        calibration_gold: gold pairs that fit the isotonic calibration of the ``+cal``
            imputers (0: none).
        circular_system: a compared system whose own model also serves as the judge's
            sigma source (the circular case; None: not run).
        independent_cf: a CF model that is none of the systems, as an independent sigma
            source (None: not run).
        draws: user resamples of each interval.
        bound: add the truth itself as an imputer (``BOUND``): the rows every imputer's
            interval is held against (no imputer's DR interval can be narrower).
        bound_aucs: with ``bound``, a perfectly calibrated synthetic imputer per AUC
            (``synthetic_imputer``): how good an imputer must be to narrow the interval here.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    simulated_logs: int = Field(200, ge=2)
    users_per_log: int | None = Field(None, ge=10)
    metrics: tuple[str, ...] = ("precision@10", "ndcg_fixed@10", "precision@20", "ndcg_fixed@20")
    propensity_exponent: float = Field(0.5, ge=0, le=10)
    clip: float = Field(0.01, gt=0, le=1)
    gold_sizes: tuple[int, ...] = (100, 300, 1000)
    gold_draws: int = Field(100, ge=0)
    calibration_gold: int = Field(300, ge=0)
    circular_system: str | None = "als"
    independent_cf: str | None = "fm"
    draws: int = Field(500, ge=10)
    bound: bool = True
    bound_aucs: tuple[float, ...] = (0.7, 0.8, 0.9, 0.95)

    @model_validator(mode="after")
    def _sources(self) -> EstimatorCheckConfig:
        if self.circular_system is not None and self.circular_system not in self.systems:
            raise ValueError(f"circular_system {self.circular_system!r} is not one of the "
                             f"systems {list(self.systems)}")  # fmt: skip
        if self.independent_cf is not None and self.independent_cf in self.systems:
            raise ValueError(f"independent_cf {self.independent_cf!r} is one of the systems; "
                             "name a CF model none of them is")  # fmt: skip
        return self


@dataclass
class World:
    """The listed pairs of a set of users and, per system, users x rank indices into them
    (``-1`` past the end of a short list), with what a simulated log needs."""

    users: list[str]
    pairs: list[tuple[str, str]]  # distinct listed (user, item) pairs
    relevant: np.ndarray  # R per pair
    theta: np.ndarray  # true exposure probability per pair (unclipped)
    popularity: np.ndarray  # past count per pair's item
    slots: dict[str, np.ndarray]  # system -> [users, K] pair indices
    imputers: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (p, hard) per pair
    owner: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # user per pair
    column: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # item column
    catalogue: list[str] = field(default_factory=list)  # every item a log can observe
    catalogue_theta: np.ndarray = field(default_factory=lambda: np.zeros(0))
    online: list[frozenset[str]] = field(default_factory=list)  # per user
    item_popularity: dict[str, int] = field(default_factory=dict)  # impute's record


def world_from(
    users: Sequence[str],
    rankings: Mapping[str, Mapping[str, Sequence[str]]],
    online: Mapping[str, Sequence[str]],
    popularity: Mapping[str, int],
    alpha: float,
    k: int,
    catalogue: Sequence[str] | None = None,
) -> World:
    """The listed pairs of every system's top-k for ``users``, their truth and exposure;
    the catalogue (every item a log can observe: ``catalogue``, else the items of
    ``popularity`` and of the lists) with its exposure probabilities."""
    index: dict[tuple[str, str], int] = {}
    slots = {}
    for name, lists in rankings.items():
        m = np.full((len(users), k), -1, dtype=int)
        for r, u in enumerate(users):
            for c, i in enumerate(list(lists.get(u, []))[:k]):
                m[r, c] = index.setdefault((u, i), len(index))
        slots[name] = m
    pairs = list(index)
    top = max(popularity.values()) if popularity else 1
    truth = [frozenset(online.get(u, ())) for u in users]
    row = {u: r for r, u in enumerate(users)}
    pop = np.array([popularity.get(i, 0) for _, i in pairs], dtype=float)
    cat = list(catalogue) if catalogue is not None else sorted(
        set(popularity) | {i for _, i in pairs})  # fmt: skip
    col = {i: c for c, i in enumerate(cat)}
    return World(
        list(users),
        pairs,
        np.array([i in truth[row[u]] for u, i in pairs], dtype=float),
        exposure_probability(pop, top, alpha),
        pop,
        slots,
        {},
        owner=np.array([row[u] for u, _ in pairs], dtype=int),
        column=np.array([col[i] for _, i in pairs], dtype=int),
        catalogue=cat,
        catalogue_theta=exposure_probability(
            np.array([popularity.get(i, 0) for i in cat], dtype=float), top, alpha
        ),
        online=truth,
        item_popularity={str(i): int(n) for i, n in popularity.items()},
    )


def resample(world: World, rows: Sequence[int] | np.ndarray) -> World:
    """``world`` on the users ``rows`` (indices, repeats allowed): a repeated user is a new
    user with the same history, lists and truth (named ``user#row``), observed on its own."""
    rows = np.asarray(rows, dtype=int)
    n_users = len(world.users)
    counts = np.bincount(world.owner, minlength=n_users)
    order = np.argsort(world.owner, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    local = np.empty(len(world.pairs), dtype=int)
    local[order] = np.arange(len(order)) - starts[world.owner[order]]
    offset = np.concatenate([[0], np.cumsum(counts[rows])[:-1]])
    src = np.concatenate([order[starts[s]:starts[s] + counts[s]] for s in rows]) if len(
        rows) else np.zeros(0, dtype=int)  # fmt: skip
    owner = np.repeat(np.arange(len(rows)), counts[rows])
    users = [f"{world.users[s]}#{r}" for r, s in enumerate(rows)]
    slots = {}
    for name, m in world.slots.items():
        mr = m[rows]
        slots[name] = np.where(mr >= 0, offset[:, None] + local[np.maximum(mr, 0)], -1)
    return World(
        users,
        [(users[r], world.pairs[p][1]) for r, p in zip(owner, src, strict=True)],
        world.relevant[src],
        world.theta[src],
        world.popularity[src],
        slots,
        {n: (p[src], h[src]) for n, (p, h) in world.imputers.items()},
        owner=owner,
        column=world.column[src],
        catalogue=world.catalogue,
        catalogue_theta=world.catalogue_theta,
        online=[world.online[s] for s in rows],
        item_popularity=world.item_popularity,
    )


def simulate_log(world: World, g: np.random.Generator) -> tuple[np.ndarray, dict]:
    """One log: every user observes every catalogue item with its exposure probability
    and the log reveals the online label there. Returns whether each listed pair was
    observed, and the log as ``evaluate`` reads it (``{user: {item: label}}``, every user
    present, one with no observation holding ``{}``)."""
    seen = g.random((len(world.users), len(world.catalogue))) < world.catalogue_theta[None]
    observed = seen[world.owner, world.column] if len(world.pairs) else np.zeros(0, bool)
    cat = world.catalogue
    logged = {
        u: {cat[c]: int(cat[c] in world.online[r]) for c in np.flatnonzero(seen[r])}
        for r, u in enumerate(world.users)
    }
    return observed, logged


def propensity_sets(
    world: World, logged: Mapping[str, Mapping[str, int]], clip: float, exponent: float
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Per listed pair, theta clipped to ``[clip, 1]``: ``true`` (the exposure model),
    ``fit`` and ``powerlaw`` (``evaluate``'s ``--propensities fit`` and
    ``powerlaw:EXP``, through ``propensities_from`` on the log). Also the fit's record."""
    out = {"true": np.clip(world.theta, clip, 1.0)}
    fit = propensities_from("fit", logged, clip, world.item_popularity)
    fixed = propensities_from(f"powerlaw:{exponent:g}", logged, clip)
    for name, props in (("fit", fit), ("powerlaw", fixed)):
        out[name] = np.array([props.of(u, i)[0] for u, i in world.pairs], dtype=float)
    return out, dict(fit.fit or {})


def runs_of(world: World, k: int | None = None) -> list[Any]:
    """The world's lists as ``RecRun`` objects (what ``evaluate`` reads from run files)."""
    out = []
    for name, m in world.slots.items():
        m = m if k is None else m[:, :k]
        lists = {u: [world.pairs[j][1] for j in m[r] if j >= 0]
                 for r, u in enumerate(world.users)}  # fmt: skip
        out.append(RecRun(name, f"(simulated: {name})", lists, {}, RunCheck()))
    return out


def selections(
    world: World,
    logged: Mapping[str, Mapping[str, int]],
    draws: int,
    seed: int,
    runs: Sequence[Any] | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The evaluation users under ``evaluate``'s rules (``evaluation_users``: ``listed``,
    and ``logged-positive``) as row indices, each with its bootstrap resamples (``runs``:
    ``runs_of(world)`` when the caller has it)."""
    runs = runs if runs is not None else runs_of(world)
    row = {u: r for r, u in enumerate(world.users)}
    out = {}
    for rule in ("listed", "logged-positive"):
        rows = np.array(sorted(row[u] for u in evaluation_users(runs, logged, rule=rule)))
        out[rule] = (rows, user_draws(len(rows), draws, seed))
    return out


def estimator_rows(imputers: Sequence[str]) -> list[tuple[str, str, str, str, str]]:
    """(row name, estimator, imputer, propensity, user rule) of the comparison, in report
    order: every row on the ``listed`` users, then three under ``logged-positive``."""
    label = {"true": "true theta", "fit": "fit theta", "powerlaw": "powerlaw theta"}
    rows = [("logged", "logged", "", "true", "listed")]
    for th in THETAS:
        rows += [(f"{e} ({label[th]})", e, "", th, "listed") for e in ("ips", "snips")]
    for imp in imputers:
        rows += [(f"imputed [{imp}]", "imputed", imp, "true", "listed"),
                 (f"dm [{imp}]", "dm", imp, "true", "listed")]  # fmt: skip
        rows += [(f"dr [{imp}, {label[th]}]", "dr", imp, th, "listed") for th in DR_THETAS]
    cal = next((i for i in imputers if i.endswith("+cal")), None)
    rows += [
        (f"ips (true theta), {LOGGED_POSITIVE}", "ips", "", "true", "logged-positive"),
        (f"snips (fit theta), {LOGGED_POSITIVE}", "snips", "", "fit", "logged-positive"),
    ]
    if cal:
        rows.append((f"dr [{cal}, fit theta], {LOGGED_POSITIVE}", "dr", cal, "fit",
                     "logged-positive"))  # fmt: skip
    return rows


def _gather(a: np.ndarray, m: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """``a`` at the pair indices ``m`` (``fill`` where ``m`` is -1)."""
    return np.where(m >= 0, a[np.maximum(m, 0)], fill)


def one_log(
    world: World,
    observed: np.ndarray,
    metrics: Sequence[str],
    thetas: Mapping[str, np.ndarray],
    chosen: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> dict[str, dict[str, dict[str, tuple[float, float, float]]]]:
    """Every estimator row on one log: ``{row: {metric: {system: (value, lo, hi)}}}``, each
    the mean over the row's users (``chosen[rule]``: row indices and their [draws, users]
    resamples) with its 95 % percentile interval over the resamples."""
    y_all = world.relevant * observed
    out: dict[str, dict[str, dict[str, tuple[float, float, float]]]] = {}
    rows = estimator_rows(list(world.imputers))
    for name, m in world.slots.items():
        valid = (m >= 0).astype(float)
        o = _gather(observed.astype(float), m)
        y = _gather(y_all, m)
        th = {t: _gather(v, m, 1.0) for t, v in thetas.items()}
        imp = {n: (_gather(p, m), _gather(h, m)) for n, (p, h) in world.imputers.items()}
        zero = np.zeros_like(o)
        for metric in metrics:
            k = parse_metric(metric)[1]
            w = _padded_weights(metric, m.shape[1])
            for row, est, imputer, prop, rule in rows:
                users, idx = chosen[rule]
                p, h = imp.get(imputer, (zero, zero))
                t = th[prop]
                vals = linear_values(est, w, o, y, p * valid, h * valid, t)[users]
                if est == "snips":
                    vals = vals / snips_normaliser(o[users, :k], t[users, :k],
                                                   valid[users, :k])  # fmt: skip
                boot = vals[idx].mean(axis=1)
                cell = (float(vals.mean()), *bootstrap_ci(boot))
                out.setdefault(row, {}).setdefault(metric, {})[name] = cell
    return out


def _padded_weights(metric: str, width: int) -> np.ndarray:
    """``metric``'s position weights over ``width`` ranks (0 past its cut-off)."""
    base, k = parse_metric(metric)
    w = np.zeros(width)
    w[:k] = metric_weights(base, k)[:width]
    return w


def truth_of(world: World, metrics: Sequence[str]) -> dict[str, dict[str, float]]:
    """The online metric per system: the mean over users of ``sum_r w_r R_r``."""
    out: dict[str, dict[str, float]] = {}
    for metric in metrics:
        out[metric] = {}
        for name, m in world.slots.items():
            w = _padded_weights(metric, m.shape[1])
            out[metric][name] = float((_gather(world.relevant, m) @ w).mean())
    return out


def summarise(
    logs: Sequence[Mapping[str, Any]], truth: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per row and metric over the evaluations: mean absolute error against the population
    metric (and relative, in %), the signed error per system, mean lift gap (pp), mean
    Kendall tau of the system order, coverage of the 95 % intervals (overall and per
    system) and their mean width; plus the per-evaluation mean absolute error (for paired
    comparisons)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in logs[0]:
        out[row] = {}
        for metric, tr in truth.items():
            systems = list(tr)
            pairs = list(itertools.combinations(systems, 2))
            err, rel, cover, width, taus, gaps = [], [], [], [], [], []
            signed = {s: [] for s in systems}
            for log in logs:
                cells = log[row][metric]
                e = [abs(cells[s][0] - tr[s]) for s in systems]
                err.append(float(np.mean(e)))
                rel.append(float(np.mean([x / tr[s] for x, s in zip(e, systems, strict=True)
                                          if tr[s]])))  # fmt: skip
                for s in systems:
                    signed[s].append(cells[s][0] - tr[s])
                cover.append([cells[s][1] <= tr[s] <= cells[s][2] for s in systems])
                width += [cells[s][2] - cells[s][1] for s in systems]
                taus.append(kendall_tau([cells[s][0] for s in systems], [tr[s] for s in systems]))
                g = gap({s: {metric: cells[s][0]} for s in systems},
                        {s: {metric: tr[s]} for s in systems}, pairs)[metric]  # fmt: skip
                gaps.append(g)
            cov = np.asarray(cover, dtype=float)
            out[row][metric] = {
                "abs_error": float(np.mean(err)),
                "rel_error_pct": 100 * float(np.mean(rel)),
                "signed_error": {s: float(np.mean(v)) for s, v in signed.items()},
                "lift_gap_pp": _mean(gaps),
                "kendall_tau": _mean(taus),
                "coverage": float(cov.mean()),
                "coverage_by_system": dict(zip(systems, cov.mean(axis=0).tolist(), strict=True)),
                "ci_width": float(np.mean(width)),
                "abs_error_per_log": err,
            }
    return out


def _mean(v: Sequence[float | None]) -> float | None:
    x = [a for a in v if a is not None and a == a]
    return float(np.mean(x)) if x else None


def paired_errors(
    summary: Mapping[str, Mapping[str, Mapping[str, Any]]], a: str, b: str, metric: str
) -> dict[str, float | None]:
    """Mean absolute error of row ``a`` minus row ``b`` over the evaluations, with its 95 %
    t-interval over them (independent draws of users and log; judgments fixed)."""
    d = np.subtract(
        summary[a][metric]["abs_error_per_log"], summary[b][metric]["abs_error_per_log"]
    )
    ci = seed_interval(list(d))
    return {"mean": ci["mean"], "lo": ci["lo"], "hi": ci["hi"]}


def gold_on_log(
    world: World,
    imputer: str,
    metrics: Sequence[str],
    sizes: Sequence[int],
    seed: int,
    truth: Mapping[str, Mapping[str, float]],
    runs: Sequence[Any] | None = None,
) -> dict[tuple[int, str, str, str], list[tuple[float, bool, float, int, int]]]:
    """Gold samples on one evaluation, drawn and read by ``gold sample``'s and
    ``evaluate --gold``'s code: per size and design (``sample_gold``, labels the online
    truth), ``ppi_run`` with its default intervals (``auto``: clustered by user where a user
    holds 2+ gold pairs) and with ``iid`` ones, on ``imputer``'s probabilities. Returns
    ``{(size, design, intervals, metric): [(abs error, covered, width, gold pairs, failed)]}``
    with one entry per system (``failed`` 1 where the estimator refused, e.g. one class);
    ``runs``: ``runs_of(world)`` when the caller has it."""
    p, h = world.imputers[imputer]
    judged = {pair: (float(a), bool(b)) for pair, a, b in zip(world.pairs, p, h, strict=True)}
    index = {pair: n for n, pair in enumerate(world.pairs)}
    runs = runs if runs is not None else runs_of(world)
    k = max(parse_metric(m)[1] for m in metrics)
    frame = len(listed_pairs(runs, world.users, k))
    out: dict[tuple[int, str, str, str], list[tuple[float, bool, float, int, int]]] = {}
    for n in sizes:
        for design in GOLD_DESIGNS:
            gold = draw_gold(world, runs, k, n, design, seed, index, judged)
            labels = gold.labels
            for method in GOLD_INTERVALS:
                for metric in metrics:
                    cell = out.setdefault((n, design, method, metric), [])
                    for run in runs:
                        t = truth[metric][run.name]
                        try:
                            e = ppi_run(run, world.users, judged, gold, metric, frame, method)
                        except ValueError:
                            cell.append((np.nan, False, np.nan, len(labels), 1))
                            continue
                        lo, hi = e.ci if e.ci else (np.nan, np.nan)
                        cell.append((abs(e.value - t), lo <= t <= hi, hi - lo, len(labels), 0))
    return out


def draw_gold(world: World, runs: Sequence[Any], k: int, n: int, design: str, seed: int,
              index: Mapping[tuple[str, str], int],
              judged: Mapping[tuple[str, str], tuple[float, bool]] | None = None,
              ) -> Any:  # fmt: skip
    """``gold sample``'s draw of ``n`` pairs under ``design`` from the runs' top-k, labelled
    with the online truth (``index``: pair -> its row in ``world.pairs``), as the
    ``GoldSample`` ``evaluate --gold`` reads; ``judged``: the judge's probabilities (the
    ``active`` design draws from them)."""
    rows = sample_gold(runs, world.users, k, n, design=design, seed=seed, judged=judged)
    keys = [(r["user_id"], r["item_id"]) for r in rows]
    labels = {key: int(world.relevant[index[key]]) for key in keys}
    pi = {key: float(r["inclusion_prob"]) for key, r in zip(keys, rows, strict=True)}
    return GoldSample(labels, pi, design=design)


def gold_summary(
    per_log: Sequence[Mapping[tuple[int, str, str, str], Sequence[tuple]]],
) -> dict[str, dict[str, dict[str, dict[str, dict[str, Any]]]]]:
    """``{size: {design: {intervals: {metric: {abs_error, coverage, ci_width, gold_pairs,
    intervals, refused}}}}}`` over the evaluations and systems (refused: no estimate)."""
    acc: dict[tuple[int, str, str, str], list[tuple]] = {}
    for log in per_log:
        for key, cells in log.items():
            acc.setdefault(key, []).extend(cells)
    out: dict[str, Any] = {}
    for (n, design, method, metric), cells in acc.items():
        ok = [c for c in cells if not c[4]]
        out.setdefault(str(n), {}).setdefault(design, {}).setdefault(method, {})[metric] = {
            "abs_error": float(np.mean([c[0] for c in ok])) if ok else None,
            "coverage": float(np.mean([c[1] for c in ok])) if ok else None,
            "ci_width": float(np.mean([c[2] for c in ok])) if ok else None,
            "gold_pairs": float(np.mean([c[3] for c in cells])),
            "intervals": len(ok),
            "refused": len(cells) - len(ok),
        }
    return out


def calibrated(world: World, imputer: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``imputer``'s probabilities through an isotonic map fitted on ``n`` gold pairs drawn
    uniformly from the listed pairs (labels: the online truth); hard label p > 0.5."""
    g = np.random.default_rng(seed)
    gold = g.choice(len(world.pairs), min(n, len(world.pairs)), replace=False)
    p = world.imputers[imputer][0]
    xs, ys = fit_isotonic(p[gold], world.relevant[gold])
    pc = np.asarray(apply_map(xs, ys, p), dtype=float)
    return pc, (pc > 0.5).astype(float)


def calibrated_system(config: EstimatorCheckConfig, ds: Any, past: Any, positives: Any,
                      name: str) -> Any:  # fmt: skip
    """The compared system ``name``'s own trained model (``brief-offline``'s, from its
    cache), its sigma scale calibrated like the judge's CF model (validation items of the
    positive past's leave-one-out split and random unseen items): the circular source."""
    return calibrate_on(trained_system(config, ds, past, name), leave_one_out(positives),
                        config.seed)  # fmt: skip


@dataclass
class SigmaSource:
    """A sigma source of the judge: its label, CF model, what it is, and the share of each
    system's top-10 pairs that its own top-10 also holds (``list_overlap``)."""

    label: str
    model: Any
    kind: str  # "judge's CF", "circular", "independent"
    overlap: dict[str, float] = field(default_factory=dict)


def sigma_sources(config: EstimatorCheckConfig, ds: Any, past: Any, positives: Any,
                  cf: Any) -> list[SigmaSource]:  # fmt: skip
    """The judge's own CF model and, as configured, the circular and independent ones."""
    out = [SigmaSource(config.cf, cf, "judge's CF")]
    if config.circular_system:
        model = calibrated_system(config, ds, past, positives, config.circular_system)
        out.append(SigmaSource(f"{config.circular_system}-system", model, "circular"))
    if config.independent_cf:
        model = calibrated_cf(config.independent_cf, positives,
                              ds.items["item_id"].astype(str).tolist(), config.seed,
                              SideInfo.of(ds))  # fmt: skip
        out.append(SigmaSource(config.independent_cf, model, "independent"))
    return out


def judge_world(
    config: EstimatorCheckConfig,
    ds: Any,
    past: Any,
    world: World,
    sources: Sequence[SigmaSource],
    out: Path,
    llm: LLMBackend | None,
    progress: bool,
) -> dict[str, Any]:
    """Every judge mode (sigma from the judge's CF model) and ``brief`` with each other
    sigma source on every listed pair, through the store; fills ``world.imputers``. The
    settings that differ only in their bias are decided from one greedy pass per pair
    (stored decision records replay them without the model)."""
    judged = {"requests": 0, "judged_now": 0, "passes": 0, "replayed": 0, "failed": 0,
              "seconds": 0.0}  # fmt: skip
    if not config.judges:
        return judged
    llm = llm or config.judge_llm(config.model)
    population = Population.of(ds, past) if set(config.judges) & set(SIMULATORS) else None
    judges = judges_for(config, llm, sources[0].model, config.judges, population)
    if "brief" in config.judges:
        judges.update(
            judges_for(
                config,
                llm,
                None,
                [(f"brief/sigma={s.label}", "brief", s.model, config.beta) for s in sources[1:]],
            )
        )
    past_ds = Dataset(ds.name, past, ds.items, ds.users, domain=ds.domain)
    reqs, at = [], []
    for n, r in enumerate(requests_for(past_ds, world.pairs)):
        if not isinstance(r, Exception):
            reqs.append(r)
            at.append(n)
    t1 = time.time()
    with ResultsStore(out / "store.sqlite") as store:
        got, counts, passes, replayed = judge_per_user(reqs, judges, store, progress, "record")
    judged.update(seconds=round(time.time() - t1, 1), passes=passes, replayed=replayed,
                  requests=sum(c["total"] for c in counts.values()),
                  judged_now=sum(c["new"] for c in counts.values()))  # fmt: skip
    for mode, js in got.items():
        p = np.full(len(world.pairs), np.nan)
        h = np.zeros(len(world.pairs))
        for n, j in zip(at, js, strict=True):
            if j is not None and not j.error:
                p[n], h[n] = j.p_yes, float(j.is_relevant)
        judged["failed"] += int(np.isnan(p).sum())
        # A pair the judge could not answer takes the judge's mean probability (counted
        # in the header): dm/dr need a value for every listed pair.
        fill = float(np.nanmean(p)) if np.isfinite(p).any() else 0.5
        world.imputers[f"judge:{mode}"] = (np.where(np.isnan(p), fill, p), h)
    return judged


def tuned_judge(config: EstimatorCheckConfig, users: Sequence[str]) -> dict[str, Any] | None:
    """What the judge's tuned folder (``judge tune``) read of this world, from its card; None
    for a model that is not a tuned folder (or a run without LLM judges).

    Raises:
        TunedLeakageError: the tuning read any of the world's users (its past or future):
            the world's truth would then be what the judge was trained on.
    """
    if not config.judges:
        return None
    found = gold_overlap(config.model, users)
    if found is None:
        return None
    if found["read_by_tuning"]:
        raise TunedLeakageError(
            f"judge model {config.model} was tuned on {found['read_by_tuning']} of this "
            f"world's {found['gold_users']} users (e.g. user {found['example']!r}): its "
            "judgments of their listed pairs are not independent of the truth they are checked "
            "against; tune with --exclude-users naming the world's users"
        )  # fmt: skip
    card = read_card(config.model) or {}
    keep = ("base_model", "steps", "best_step", "validation_auc_before", "validation_auc",
            "precision")  # fmt: skip
    pairs = card.get("pairs") or {}
    return {**{k: card.get(k) for k in keep}, "train_pairs": pairs.get("train"),
            "users_read": (card.get("data") or {}).get("users_read"),
            "world_users": found["gold_users"], "world_users_read": 0}  # fmt: skip


def bench_brief_offline_estimators(
    config: EstimatorCheckConfig,
    out: str | Path = "reports/brief-offline-estimators",
    llm: LLMBackend | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Judge every listed pair (through the store), then run every estimator over
    ``config.simulated_logs`` evaluations (users and log redrawn each time) and the gold
    samples; write report.md, results.json and estimators.png under ``out``."""
    # import cycle: _imputer_gold builds on this module's world and estimators
    from recjudge.bench._imputer_gold import imputer_summary  # noqa: PLC0415

    t0 = time.time()
    (out := Path(out)).mkdir(parents=True, exist_ok=True)
    ds, past, users, world, sources = world_of(config)
    tuned = tuned_judge(config, users)  # a tuning that read the world is refused before judging
    judged = judge_world(config, ds, past, world, sources, out, llm, progress)
    if config.calibration_gold:  # a calibrated twin of every judge's and CF's p
        for name in [n for n in world.imputers if n.startswith(("judge:", "cf"))]:
            world.imputers[f"{name}+cal"] = calibrated(
                world, name, config.calibration_gold, config.seed
            )
    t2 = time.time()
    truth = truth_of(world, config.metrics)
    gold_imputer = "judge:brief" if "judge:brief" in world.imputers else "cf"
    n_draw = config.users_per_log or len(users)
    per_log, gold_logs, fits, kept, imputer_logs, lenient = _evaluations(
        config, world, n_draw, truth, gold_imputer, progress, sources)  # fmt: skip
    summary = summarise(per_log, truth)
    exps = [e for e in fits if e is not None]
    results = {
        "config": config.model_dump(),
        "users": len(users),
        "users_per_log": n_draw,
        "listed_pairs": len(world.pairs),
        "catalogue_items": len(world.catalogue),
        "relevant_share": float(world.relevant.mean()),
        "expected_observed_share": float(np.mean(world.theta)),
        "clipped_true_theta": int((world.theta < config.clip).sum()),
        "propensity_fit": {
            "exponent_mean": float(np.mean(exps)) if exps else None,
            "exponent_range": [float(np.min(exps)), float(np.max(exps))] if exps else None,
            "true_exponent": config.alpha,
        },
        "logged_positive_share": float(np.mean(kept)),
        "sigma_sources": [
            {"label": s.label, "kind": s.kind, "overlap_top10": s.overlap} for s in sources
        ],
        "leniency": leniency_summary(
            config, lenient, [{"label": s.label, "kind": s.kind} for s in sources]
        ),  # fmt: skip
        "imputers": {
            n: {
                "mean_p": float(p.mean()),
                "yes_rate": float(h.mean()),
                "auc_vs_truth": labelled_auc(p, world.relevant),
                **ppi_limit(p, world.relevant),
            }  # fmt: skip
            for n, (p, h) in world.imputers.items()
        },
        "truth": truth,
        "summary": {
            r: {
                m: {k2: v for k2, v in c.items() if k2 != "abs_error_per_log"} for m, c in d.items()
            }
            for r, d in summary.items()
        },  # fmt: skip
        "paired": _paired(summary, [i for i in world.imputers if i in PAIRED], config.metrics),
        "headroom": headroom(summary),
        "gold": gold_summary(gold_logs),
        "gold_imputer": gold_imputer,
        "gold_imputers": imputer_summary(imputer_logs),
        "judging": judged,
        "tuned_judge": tuned,
        "estimating_seconds": round(time.time() - t2, 1),
        "wall_seconds": round(time.time() - t0, 1),
    }
    _plot(summary, config, out / "estimators.png")
    write_report(out, results, _report(config, results))
    return results


def world_of(config: EstimatorCheckConfig) -> tuple[Any, Any, list[str], World, list]:
    """The simulated world: the data, the logs' shared past, the users, every listed pair
    with its truth and propensity, the CF imputers (one per sigma source) and all-yes."""
    k = max(parse_metric(m)[1] for m in config.metrics)
    ds = load_dataset(config.data)
    logs = [_simulate_log(config, ds, s) for s in config.log_seeds()]
    runs = _train_runs(config, ds, logs)
    users = list(dict.fromkeys(u for log in logs for u in log.users))
    online = {u: v for log in logs for u, v in log.online.items()}
    past = logs[0].past
    popularity = past["item_id"].astype(str).value_counts().to_dict()
    world = world_from(users, {r.name: r.rankings for r in runs}, online, popularity,
                       config.alpha, k, ds.items["item_id"].astype(str).tolist())  # fmt: skip
    pos_past = (
        past if config.positive_rating is None else past[past["rating"] >= config.positive_rating]
    )
    cf = calibrated_cf(config.cf, pos_past, ds.items["item_id"].astype(str).tolist(),
                       config.seed, SideInfo.of(ds))  # fmt: skip
    sources = sigma_sources(config, ds, past, pos_past, cf)
    hist = {u: h for log in logs for u, h in log.hist.items()}
    for src in sources:
        own = {u: src.model.recommend(hist[u], 10) for u in users}
        src.overlap = list_overlap(runs, own, users, 10)
        sigma = _sigma_per_user(src.model, hist, world.pairs)
        name = "cf" if src.kind == "judge's CF" else f"cf/{src.label}"
        world.imputers[name] = ((sigma + 1) / 2, (sigma > 0).astype(float))
    world.imputers = {"all-yes": (np.ones(len(world.pairs)), np.ones(len(world.pairs))),
                      **world.imputers}  # fmt: skip
    if config.bound:
        world.imputers[BOUND] = (world.relevant.astype(float), world.relevant.astype(float))
        for auc in config.bound_aucs:
            p = synthetic_imputer(world.relevant, auc, config.seed)
            world.imputers[synthetic_name(auc)] = (p, (p > 0.5).astype(float))
    return ds, past, users, world, sources


def synthetic_imputer(relevant: np.ndarray, auc: float, seed: int) -> np.ndarray:
    """A perfectly calibrated imputer whose AUC against ``relevant`` is ``auc`` in
    expectation: a score ``s = R + tau * z`` (``z`` standard normal, fixed per pair by
    ``seed``) has AUC ``Phi(1 / (tau * sqrt 2))``, so ``tau = 1 / (sqrt 2 * Phi^-1(auc))``;
    the imputer is the posterior ``P(R = 1 | s) = pi phi((s - 1) / tau) / (pi phi((s - 1) /
    tau) + (1 - pi) phi(s / tau))`` with ``pi`` the relevant share. What a judge, tuned or
    supervised imputer with that discrimination and a perfect calibration would give."""
    from scipy.stats import norm

    if not 0.5 < auc < 1:
        raise ValueError(f"bound_aucs: {auc} is not in (0.5, 1)")
    r = np.asarray(relevant, dtype=float)
    tau = 1.0 / (np.sqrt(2.0) * norm.ppf(auc))
    s = r + tau * rng("synthetic-imputer", (seed, auc)).standard_normal(len(r))
    pi = float(r.mean())
    # the log-odds of the two normal densities, so large |s| / tau cannot overflow
    log_odds = np.log(pi / (1 - pi)) + (2 * s - 1) / (2 * tau**2)
    return 1.0 / (1.0 + np.exp(-log_odds))


def _sigma_per_user(model: Any, hist: Mapping[str, Sequence[str]],
                    pairs: Sequence[tuple[str, str]]) -> np.ndarray:  # fmt: skip
    """``model.sigma(hist[u], i, u)`` for every pair, the user's scores computed once for
    all of their candidates (``sigmas``: equal to the per-pair call, one fold-in per user)."""
    at: dict[str, list[int]] = {}
    for n, (u, _) in enumerate(pairs):
        at.setdefault(u, []).append(n)
    out = np.zeros(len(pairs))
    for u, ns in at.items():
        out[ns] = model.sigmas(hist[u], [pairs[n][1] for n in ns], u)
    return out


def _evaluations(config, world, n_draw, truth, gold_imputer, progress, sources=()):
    """``config.simulated_logs`` evaluations, each on ``n_draw`` users drawn again with a
    log simulated again: every estimator's values (and the gold samples' for the first
    ``gold_draws``), the fitted propensity exponents, the share of users kept by the
    logged-positive rule, and the leniency rule's flags per sigma source."""
    # import cycle: _imputer_gold builds on this module's world and estimators
    from recjudge.bench._imputer_gold import imputers_on_gold  # noqa: PLC0415

    per_log, gold_logs, fits, kept, imputer_logs, lenient = [], [], [], [], [], []
    by_source = source_imputers(world, sources)
    bar = _bar(progress, config.simulated_logs)
    for t in range(config.simulated_logs):
        g = rng("estimator-log", (config.seed, t))
        w = resample(world, g.integers(0, len(world.users), n_draw))
        observed, logged = simulate_log(w, g)
        thetas, fit = propensity_sets(w, logged, config.clip, config.propensity_exponent)
        fits.append(fit.get("exponent"))
        runs_w = runs_of(w)  # the drawn users' lists, for the user rule and the gold sample
        chosen = selections(w, logged, config.draws, config.seed + t, runs_w)
        kept.append(len(chosen["logged-positive"][0]) / len(w.users))
        per_log.append(one_log(w, observed, config.metrics, thetas, chosen))
        lenient.append(leniency_flags(w, observed, chosen["listed"][0], by_source))
        if t < config.gold_draws and config.gold_sizes:
            gold_logs.append(gold_on_log(w, gold_imputer, config.metrics, config.gold_sizes,
                                         t, truth, runs_w))  # fmt: skip
            if gold_imputer.startswith("judge:"):  # the supervised imputer needs a judge
                imputer_logs.append(imputers_on_gold(
                    w, gold_imputer, config.metrics, config.gold_sizes, t, truth,
                    (observed, thetas["fit"], chosen["listed"]), runs_w))  # fmt: skip
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return per_log, gold_logs, fits, kept, imputer_logs, lenient


def source_imputers(world: World, sources: Sequence[SigmaSource]) -> dict[str, str]:
    """Per sigma source, the imputer the brief judge made with its sigma (those judged)."""
    out = {s.label: "judge:brief" if s.kind == "judge's CF" else f"judge:brief/sigma={s.label}"
           for s in sources}  # fmt: skip
    return {k: v for k, v in out.items() if v in world.imputers}


def leniency_flags(
    world: World, observed: np.ndarray, users: np.ndarray, imputers: Mapping[str, str], k: int = 10
) -> dict[str, dict[str, bool]]:
    """``evaluate``'s leniency rule (``_circular.lenient_systems``) on one log, per sigma
    source: ``{source: {system: flagged}}``. Per system, over its top-``k`` pairs of the
    ``users`` (row indices): the logged hit rate (relevant among the pairs the log
    observed) and the judge's YES rate on the pairs it did not (``imputers``: source ->
    the imputer judged with that source's sigma)."""
    out: dict[str, dict[str, bool]] = {}
    for source, imputer in imputers.items():
        found = lenient_systems(leniency_rates(world, observed, users, imputer, k))
        out[source] = {name: name in found for name in world.slots}
    return out


def leniency_rates(
    world: World, observed: np.ndarray, users: np.ndarray, imputer: str, k: int = 10
) -> dict[str, dict[str, float | None]]:
    """Per system, over its top-``k`` pairs of the ``users`` (row indices): the logged hit
    rate (relevant among the pairs the log observed) and ``imputer``'s YES rate on the pairs
    it did not (None where there are none): the leniency rule's input."""
    h = world.imputers[imputer][1]
    by_system = {}
    for name, m in world.slots.items():
        idx = m[users, :k]
        idx = idx[idx >= 0]
        seen = observed[idx].astype(bool)
        by_system[name] = {
            "logged_hit_rate": float(world.relevant[idx][seen].mean()) if seen.any() else None,
            "judge_yes_rate": float(h[idx][~seen].mean()) if (~seen).any() else None,
        }  # fmt: skip
    return by_system


def leniency_summary(config: EstimatorCheckConfig, flags: Sequence[Mapping[str, Any]],
                     sources: Sequence[Mapping[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """Per sigma source, the share of evaluations in which the rule flags each system."""
    out: dict[str, Any] = {}
    for s in sources:
        per = [f[s["label"]] for f in flags if s["label"] in f]
        if per:
            out[s["label"]] = {"kind": s["kind"], "logs": len(per),
                               "flagged": {n: float(np.mean([f[n] for f in per]))
                                           for n in config.systems}}  # fmt: skip
    return out


#: the imputers whose DR rows are compared with the alternatives in the report
PAIRED = ("judge:brief", "judge:brief+cal", "cf+cal")


def _bar(progress: bool, total: int) -> Any:
    if not progress:
        return None

    return tqdm(total=total, desc="simulated evaluations", unit="log")


def ppi_limit(p: np.ndarray, y: np.ndarray) -> dict[str, float | None]:
    """An imputer's correlation ``rho`` with the truth over the listed pairs, and the width
    PPI++ with it can reach relative to the gold labels alone: ``sqrt(1 - rho^2)``. With
    power tuning (lambda = cov(y, f) / ((1 + n / N) var f); Angelopoulos, Duchi & Zrnic
    2023, PPI++), the variance of a mean on ``n`` gold and ``N`` unlabelled pairs tends to
    ``(var y - cov(y, f)^2 / var f) / n = var y (1 - rho^2) / n`` as ``N / n`` grows; uniform
    gold pairs, no clustering, the imputer fixed (and ``cov / var f`` at most 1: ``ppi_mean``
    clips lambda to [0, 1], so a sharper imputer than that is held to lambda 1). None for a
    constant imputer."""
    if np.std(p) == 0 or np.std(y) == 0:
        return {"corr_vs_truth": None, "ppi_width_limit": None}
    rho = float(np.corrcoef(p, y)[0, 1])
    return {"corr_vs_truth": rho, "ppi_width_limit": float(np.sqrt(max(0.0, 1 - rho**2)))}


def _paired(
    summary: Mapping[str, Any], imputers: Sequence[str], metrics: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Each model-based DR row against logged, its imputer's ``imputed`` row, ``imputed
    [all-yes]`` and IPS/SNIPS with the same propensities: the difference of mean absolute
    errors per metric."""
    out: dict[str, dict[str, Any]] = {}
    for imp in imputers:
        for th in ("true theta", "fit theta"):
            row = f"dr [{imp}, {th}]"
            others = ("logged", f"imputed [{imp}]", "imputed [all-yes]", f"ips ({th})",
                      f"snips ({th})")  # fmt: skip
            for other in others:
                out.setdefault(row, {})[other] = {
                    m: paired_errors(summary, row, other, m) for m in metrics
                }
    return out


def _f(v: Any, nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.0f} %"


def verdict(cell: Mapping[str, Any]) -> str:
    """One word on a row's intervals: ``holds`` (coverage >= 90 % against the nominal 95 %,
    the slack of a few hundred evaluations), ``under-covers``, or ``misses`` (< 50 %)."""
    c = cell["coverage"]
    return "holds" if c >= 0.9 else ("under-covers" if c >= 0.5 else "misses")


def _report(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    sections = (_report_setup, _report_method, _report_tables, _rule_section,
                _source_section, _dr_section, _bound_section, _gold_section,
                _imputer_section)  # fmt: skip
    lines = [line for section in sections for line in section(config, r)]
    return [*lines, "", "![mean absolute error and coverage per estimator](estimators.png)"]


def _report_setup(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    """The report's title and how the world, the evaluation users and the propensities are
    made."""
    fit = r["propensity_fit"]
    rng_ = fit["exponent_range"]
    return [
        f"# Metric estimators against the known truth ({config.data}, brief-offline's world)",
        "",
        "**Our experiment, not a paper's table.** The online truth, the recommenders and the "
        f"judges are `brief-offline`'s. Each of {config.simulated_logs} simulated evaluations "
        f"redraws {r['users_per_log']} users with replacement from the population of "
        f"{r['users']} and then the log: every drawn user observes each of the "
        f"{r['catalogue_items']} catalogue items independently with the true exposure "
        f"probability theta_i = (pop_i / max pop)^{config.alpha}, and the log reveals the "
        "online label (an observed pair can be irrelevant). The target is each system's "
        "metric over the whole population, so an interval's coverage is what a team that "
        "evaluates a sample of its users gets.",
        "",
        f"- Population: {r['users']} users (the union of logging seeds "
        f"{list(config.log_seeds())} of brief-offline's sample), systems "
        f"{', '.join(config.systems)}"
        f"{' (SASRec ' + str(config.sasrec_epochs) + ' epochs)' if 'sasrec' in config.systems else ''}, "  # noqa: E501
        f"top-{max(int(m.split('@')[1]) for m in config.metrics)}: {r['listed_pairs']} distinct "
        f"listed pairs, {100 * r['relevant_share']:.1f} % relevant online, "
        f"{100 * r['expected_observed_share']:.1f} % of them observed per log in expectation.",
        "- Evaluation users: `evaluate`'s rule (`evaluation_users`): `listed` (every user a "
        "system lists: all drawn users) for every row; the rows marked "
        f"'{LOGGED_POSITIVE}' keep only users with a logged positive (the common offline "
        f"rule; {100 * r['logged_positive_share']:.0f} % of the drawn users on average).",
        "- Propensities: *true* = the exposure model above; *fit* = `evaluate --propensities "
        "fit` (the default: a power law of training popularity fitted to the log by Bernoulli "
        "maximum likelihood, through `propensities_from` on the simulated log and the "
        "training counts `impute` records); fitted exponent "
        + (
            f"{fit['exponent_mean']:.3f} on average (range {rng_[0]:.3f}-{rng_[1]:.3f}) "
            if fit["exponent_mean"] is not None
            else "- "
        )
        + f"against the true {config.alpha}; *powerlaw* = `--propensities "
        f"powerlaw:{config.propensity_exponent:g}` (the fixed exponent of the logged counts, "
        f"the earlier default). All clipped at {config.clip:g} "
        f"({r['clipped_true_theta']} listed pairs have a true theta below it).",
    ]


def _report_method(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    """The imputers, the intervals and what the run cost."""
    j = r["judging"]
    rate = j["judged_now"] / j["seconds"] if j["seconds"] else None
    judges = (
        f"judges `{config.model}` ({', '.join(config.judges)}; {config.sampling_note()}; beta "
        f"{config.beta}, sigma from the judge's `{config.cf}`) with p = p_yes; "
        "`judge:brief/sigma=X` = the brief judge with sigma from source X (below); "
        if config.judges
        else "no LLM judge in this run (`judges` is empty); "
    )
    bound = f"`{BOUND}` = the online truth itself (the bound, below); " if config.bound else ""
    t = r.get("tuned_judge")
    tuned = [] if not t else [
        f"- The judge's model is a folder `judge tune` made (its card): {t['base_model']} "
        f"tuned with LoRA on {t['train_pairs']} pairs of {t['users_read']} users, best step "
        f"{t['best_step']} of {t['steps']}, "
        f"validation AUC {t['validation_auc_before']} -> {t['validation_auc']}; it read none "
        f"of this world's {t['world_users']} users (checked on the card's users record: a "
        "tuning that read any is refused)."
    ]  # fmt: skip
    return [
        *tuned,
        f"- Imputation models: {judges}`cf` = (sigma + 1) / 2 of the judge's CF model "
        f"(`{config.cf}`), `cf/X` of source X; `all-yes` = 1 everywhere; {bound}"
        + (
            f"`+cal` = the imputer's p through an isotonic map fitted on the same "
            f"{config.calibration_gold} gold pairs (uniform over listed pairs, online labels; "
            "hard label p > 0.5)."
            if config.calibration_gold
            else "no calibrated imputer."
        )
        + " Hard labels (for `imputed`): the verdict; cf: sigma > 0.",
        f"- Intervals: 95 % percentile intervals from {config.draws} resamples of the drawn "
        "users per evaluation (the project's bootstrap rule); coverage: the share of "
        "evaluations x systems whose interval holds the population metric; verdict: "
        "`holds` >= 90 %, `under-covers` 50-90 %, `misses` < 50 %; error differences: 95 % "
        "t-intervals over the evaluations.",
        f"- Cost: {j['requests']} judge requests over every listed pair, {j['judged_now']} "
        f"judged in this run in {j['seconds']} s"
        + (f" ({rate:.2f} per second)" if rate else "")
        + f", {j['passes']} decoding passes, {j['replayed']} decided from stored decision "
        f"records without the model, the rest from the store; {j['failed']} pairs without "
        "an answer took the judge's mean p. Estimating: "
        f"{r['estimating_seconds']} s for every evaluation; wall {r['wall_seconds']} s.",
        "",
    ]


def _report_tables(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    """The sigma sources' overlaps, the imputers against the truth, and per metric every
    estimator's error, coverage and verdict."""
    lines = [
        "Sigma sources of the judge (share of each system's top-10 pairs that the source's own "
        "top-10 also holds; the project's circular rule refuses >= 90 % or the system's own "
        "model):",
        "",
        "| source | kind | " + " | ".join(config.systems) + " |",
        "|---|---|" + "---|" * len(config.systems),
    ]
    for s in r["sigma_sources"]:
        lines.append(f"| {s['label']} | {s['kind']} | "
                     + " | ".join(_pct(s["overlap_top10"].get(n)) for n in config.systems)
                     + " |")  # fmt: skip
    lines += [
        "",
        "Imputation models against the online truth over every listed pair:",
        "",
        "| imputer | mean p | YES rate | AUC vs truth | correlation with truth | PPI++ width / "
        "labels-only, limit (`ppi_limit`) |",
        "|---|---|---|---|---|---|",
    ]
    for n, v in r["imputers"].items():
        lines.append(f"| {n} | {_f(v['mean_p'])} | {_f(v['yes_rate'])} | "
                     f"{_f(v['auc_vs_truth'])} | {_f(v.get('corr_vs_truth'))} | "
                     f"{_f(v.get('ppi_width_limit'))} |")  # fmt: skip
    for metric in config.metrics:
        lines += [
            "",
            f"## {metric}",
            "",
            "Population truth: " + ", ".join(f"{s} {v:.4f}" for s, v in r["truth"][metric].items()),
            "",
            "| estimator [imputer, propensity] | mean abs error | rel. error % | lift gap pp "
            "| Kendall tau | 95 % CI coverage | CI width | verdict |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row, d in r["summary"].items():
            c = d[metric]
            lines.append(
                f"| {row} | {c['abs_error']:.4f} | {c['rel_error_pct']:.1f} | "
                f"{_f(c['lift_gap_pp'], 1)} | {_f(c['kendall_tau'], 2)} | "
                f"{100 * c['coverage']:.0f} % | {c['ci_width']:.4f} | {verdict(c)} |"
            )
    return lines


def _dr_section(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    """The doubly robust rows' errors minus the alternatives', with t-intervals."""
    lines = [
        "",
        "## Doubly robust against the alternatives",
        "",
        "Mean absolute error of the DR row minus the other's (below 0: DR is closer to the "
        "truth), 95 % t-interval over the evaluations, per metric:",
        "",
        "| DR row | minus | " + " | ".join(config.metrics) + " |",
        "|---|---|" + "---|" * len(config.metrics),
    ]
    for row, others in r["paired"].items():
        for other, by_m in others.items():
            cells = [interval(c["mean"], c["lo"], c["hi"], nd=4) for c in by_m.values()]
            lines.append(f"| {row} | {other} | " + " | ".join(cells) + " |")
    return lines


def headroom(
    summary: Mapping[str, Mapping[str, Mapping[str, Any]]], reference: str = "snips (fit theta)"
) -> dict[str, dict[str, Any]]:
    """Per metric, how much narrower than ``reference`` (SNIPS, no judge, no gold) any
    imputer's DR interval can get in this world: the width of DR with the truth as its
    imputer (``BOUND``: no correction term is left, only the users' own sampling variance)
    over the reference's, and each DR row's width over the reference's. An imputer meets
    "``x`` % narrower than SNIPS" only if ``1 - x`` is above the bound's ratio."""
    bound_row = f"dr [{BOUND}, fit theta]"
    if bound_row not in summary or reference not in summary:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for metric, cell in summary[bound_row].items():
        ref = summary[reference][metric]["ci_width"]
        if not ref:
            continue
        rows = {row: d[metric]["ci_width"] / ref for row, d in summary.items()
                if row.startswith("dr [") and row.endswith(", fit theta]") and metric in d
                and row != bound_row}  # fmt: skip
        out[metric] = {
            "reference": reference,
            "reference_width": ref,
            "bound_width": cell["ci_width"],
            "bound_ratio": cell["ci_width"] / ref,
            "bound_coverage": cell["coverage"],
            "dr_ratios": rows,
        }
    return out


def _bound_section(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    """How narrow an imputer could make the interval here (``headroom``), and how narrow
    calibrated imputers of a given AUC make it (``synthetic_imputer``)."""
    room = headroom(r["summary"])
    if not room:
        return []
    aucs = config.bound_aucs
    synth = [f"dr [{synthetic_name(a)}, fit theta]" for a in aucs]
    lines = [
        "",
        "## How narrow an imputer could make the interval",
        "",
        f"DR with the truth itself as its imputer (`{BOUND}`) has no correction term left: "
        "its interval is the drawn users' own sampling variance, the narrowest any imputer "
        "(judge, tuned, supervised) can reach in this world. Widths relative to SNIPS with "
        "fitted propensities (no judge, no gold); an imputer can be 30 % narrower than SNIPS "
        "only where the bound's ratio is below 0.70. The synthetic columns are DR with a "
        "perfectly calibrated imputer of the stated AUC against the truth (a noisy score "
        "of the truth through its exact posterior, `synthetic_imputer`): what an imputer "
        "with that discrimination would give, calibration error aside.",
        "",
        "| metric | SNIPS width | bound width (coverage) | bound / SNIPS | best real DR row / "
        "SNIPS | " + " | ".join(f"AUC {a:g} / SNIPS" for a in aucs) + " |",
        "|---|---|---|---|---|" + "---|" * len(aucs),
    ]
    for metric, c in room.items():
        real = {k: v for k, v in c["dr_ratios"].items() if k not in synth}
        best = min(real.items(), key=lambda kv: kv[1], default=None)
        best_cell = f"{best[1]:.3f} ({best[0]})" if best else "-"
        cells = [f"{c['dr_ratios'][row]:.3f}" if row in c["dr_ratios"] else "-"
                 for row in synth]  # fmt: skip
        lines.append(f"| {metric} | {c['reference_width']:.4f} | {c['bound_width']:.4f} "
                     f"({_pct(c['bound_coverage'])}) | {c['bound_ratio']:.3f} | {best_cell} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    return lines


def _rule_section(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    """The same estimators on the ``listed`` users and on the ``logged-positive`` ones."""
    pairs = [(row[: -len(LOGGED_POSITIVE) - 2], row) for row in r["summary"]
             if row.endswith(LOGGED_POSITIVE)]  # fmt: skip
    lines = [
        "",
        "## The evaluation-user rule",
        "",
        "Mean signed error over the systems (estimate minus truth) and coverage, on the users "
        "`evaluate` keeps by default (`listed`) and on the users with a logged positive "
        "(selected on the same observations the weights correct for):",
        "",
        "| estimator | metric | listed: signed error | listed: coverage | logged-positive: "
        "signed error | logged-positive: coverage |",
        "|---|---|---|---|---|---|",
    ]
    for base, sel in pairs:
        for metric in config.metrics:
            a, b = r["summary"][base][metric], r["summary"][sel][metric]
            sa = float(np.mean(list(a["signed_error"].values())))
            sb = float(np.mean(list(b["signed_error"].values())))
            lines.append(f"| {base} | {metric} | {sa:+.4f} | {_pct(a['coverage'])} | "
                         f"{sb:+.4f} | {_pct(b['coverage'])} |")  # fmt: skip
    return lines


def _source_section(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    """Per sigma source, the judge-based rows' signed error per system and their tau."""
    labels = [s["label"] for s in r["sigma_sources"]]
    imputers = []
    for s in r["sigma_sources"]:
        base = "judge:brief" if s["kind"] == "judge's CF" else f"judge:brief/sigma={s['label']}"
        imputers += [(s, base), (s, f"{base}+cal")]
    lines = [
        "",
        "## Sigma source: the judge's CF signal against the compared systems",
        "",
        f"Sources: {', '.join(labels)}. Signed error per system (estimate minus the "
        "population truth; a circular source should inflate its own system), Kendall tau "
        "of the system order and coverage:",
    ]
    for metric in config.metrics[:2]:
        lines += [
            "",
            f"### {metric}",
            "",
            "| row | source | " + " | ".join(config.systems) + " | Kendall tau | coverage |",
            "|---|---|" + "---|" * (len(config.systems) + 2),
        ]
        for s, imp in imputers:
            for row in (f"imputed [{imp}]", f"dm [{imp}]", f"dr [{imp}, fit theta]"):
                c = r["summary"].get(row, {}).get(metric)
                if c is None:
                    continue
                cells = " | ".join(f"{c['signed_error'][n]:+.4f}" for n in config.systems)
                lines.append(f"| {row} | {s['kind']} | {cells} | {_f(c['kendall_tau'], 2)} | "
                             f"{_pct(c['coverage'])} |")  # fmt: skip
    return lines + _leniency_section(config, r)


def _leniency_section(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    """The leniency rule's flags per sigma source and system."""
    got = r.get("leniency") or {}
    if not got:
        return []
    lines = [
        "",
        "### The leniency rule of `evaluate`, measured",
        "",
        "Share of evaluations in which `evaluate`'s rule flags a system (its judge YES rate on "
        "its unlabelled top-10 pairs over its logged hit rate at least "
        f"{LENIENCY_LIMIT:g}x the other systems' median ratio), per sigma source. A circular "
        f"source should flag {config.circular_system}; the others nothing:",
        "",
        "| source | kind | evaluations | " + " | ".join(config.systems) + " |",
        "|---|---|---|" + "---|" * len(config.systems),
    ]
    for label, d in got.items():
        cells = " | ".join(_pct(d["flagged"][n]) for n in config.systems)
        lines.append(f"| {label} | {d['kind']} | {d['logs']} | {cells} |")
    return lines


def _gold_section(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    lines = [
        "",
        f"## Gold samples: PPI++ with `{r['gold_imputer']}`, clustered against iid intervals",
        "",
        f"On each of the first {config.gold_draws} evaluations, `gold sample`'s code draws "
        "each size under each design (`users`: every listed pair of whole users, up to the "
        "size; `uniform`: pairs), labelled with the online truth, and `ppi_run` (what "
        "`evaluate --gold` runs) estimates each system's metric with its default intervals "
        "(`auto`: clustered by user when a user holds 2+ gold pairs) and with `iid` ones "
        "(every pair independent). Coverage is over evaluations x systems; refused: the "
        "estimator gave no interval (e.g. one label class in a system's gold pairs).",
        "",
        "| gold pairs | design | intervals | metric | labelled pairs | mean abs error | "
        "coverage | CI width | refused |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, by_design in r["gold"].items():
        for design, by_method in by_design.items():
            for method, by_m in by_method.items():
                for metric, c in by_m.items():
                    lines.append(
                        f"| {n} | {design} | {method} | {metric} | {c['gold_pairs']:.0f} | "
                        f"{_f(c['abs_error'], 4)} | {_pct(c['coverage'])} | "
                        f"{_f(c['ci_width'], 4)} | {c['refused']} |"
                    )
    return lines


def _imputer_section(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    # import cycle: _imputer_gold builds on this module's world and estimators
    from recjudge.bench._imputer_gold import imputer_section  # noqa: PLC0415

    return imputer_section(r, config.metrics, config.gold_draws)


def _plot(summary: Mapping[str, Any], config: EstimatorCheckConfig, path: Path) -> None:
    metric = config.metrics[-1]
    rows = list(summary)
    err = [summary[r][metric]["abs_error"] for r in rows]
    cov = [summary[r][metric]["coverage"] for r in rows]
    with figure(path, size=(9.0, 0.28 * len(rows) + 1.5)) as ax:
        y = np.arange(len(rows))
        ax.barh(y, err, color=["tab:green" if c >= 0.9 else "tab:red" for c in cov])
        ax.set_yticks(y)
        ax.set_yticklabels(rows, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"mean absolute error of {metric} against the population truth "
                      "(green: 95 % CI covers it in >= 90 % of evaluations)")  # fmt: skip
        ax.set_title(f"Estimators over {config.simulated_logs} simulated evaluations "
                     f"({config.data})")  # fmt: skip
