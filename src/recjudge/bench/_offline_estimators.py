"""The metric estimators checked where the truth is known: ``bench brief-offline-estimators``.

``brief-offline``'s simulated world knows each user's whole online future and the
logging policy's exposure probabilities, so every estimator of
``recjudge.evaluators._estimators`` can be held against the truth it estimates. The world:

- users, recommenders (trained on the past), their top-k lists and the online truth
  ``R_ui`` (a future interaction rated >= ``positive_rating``) are ``brief-offline``'s;
- the judges' probabilities ``p_ui`` (and hard labels) are asked for *every* listed pair,
  logged or not, once (they do not depend on the log: the judge sees the past only), through
  the same store as ``brief-offline`` (its committed checkpoint replays them);
- each simulated log draws, for every listed pair independently, whether the pair was
  observed, ``O_ui ~ Bernoulli(theta_i)`` with ``theta_i = (pop_i / max pop)^alpha`` (the
  exposure model of ``brief-offline``, here applied to every listed pair so that unexposed
  and exposed-but-irrelevant pairs differ, as in Yang et al. 2018), and reveals
  ``Y_ui = R_ui`` where observed.

Per log, every estimator (``logged``, ``ips``/``snips`` with the true or an estimated
propensity, and ``imputed``/``dm``/``dr`` with each imputation model) estimates each system's
metric with a 95 % user-bootstrap interval; over the logs: the error against the online
metric, the lift gap of ``brief-offline``, Kendall's tau of the system order against the
online order, the interval's coverage of the truth and its width. A gold-sample experiment
draws ``n`` listed pairs uniformly, labels them with the online truth, and gives PPI++
(``ppi_mean``) and the gold sample alone (its ``lam = 0``) with their intervals.

Estimated propensities: Yang et al.'s power law of the item's past popularity
``theta_i = c n_i^gamma`` (``gamma = propensity_exponent``; ``n_i`` at least 1), ``c`` fitted
per log so that the expected number of observed listed pairs equals the observed number;
capped at 1, floored at ``clip`` like the true ones. With ``gamma = alpha`` the family holds
the truth; the default 0.5 against alpha 1 is a misspecified model, as a user's would be.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ConfigDict, Field

from recjudge._stats import bootstrap_ci
from recjudge.bench._offline import OfflineConfig, exposure_probability, gap
from recjudge.reporting import interval

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

ROW_ESTIMATORS = ("imputed", "dm", "dr")


class EstimatorCheckConfig(OfflineConfig):
    """Settings of ``brief-offline-estimators`` (``brief-offline``'s, whose judges and store
    it reuses, plus the following).

    Attributes:
        simulated_logs: logs drawn (each its own observation draw over every listed pair).
        metrics: linear metrics (``precision``, ``dcg``, ``ndcg_fixed`` @k, k <= 20).
        propensity_exponent: ``gamma`` of the estimated power-law propensities.
        clip: propensity floor (true and estimated).
        gold_sizes: gold-sample sizes of the PPI experiment.
        gold_draws: gold samples drawn per size.
        calibration_gold: gold pairs that fit the isotonic calibration of the
            ``judge:brief+cal`` and ``cf+cal`` imputers (0: none).
        draws: user resamples of each interval.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    simulated_logs: int = Field(200, ge=2)
    metrics: tuple[str, ...] = ("precision@10", "ndcg_fixed@10", "precision@20", "ndcg_fixed@20")
    propensity_exponent: float = Field(0.5, ge=0)
    clip: float = Field(0.01, gt=0, le=1)
    gold_sizes: tuple[int, ...] = (100, 300, 1000)
    gold_draws: int = Field(100, ge=1)
    calibration_gold: int = Field(300, ge=0)
    draws: int = Field(500, ge=10)


@dataclass
class World:
    """What every log shares: the listed pairs and, per system, users x rank indices into
    them (``-1`` past the end of a short list)."""

    users: list[str]
    pairs: list[tuple[str, str]]  # distinct listed (user, item) pairs
    relevant: np.ndarray  # R per pair
    theta: np.ndarray  # true exposure probability per pair (unclipped)
    popularity: np.ndarray  # past count per pair's item
    slots: dict[str, np.ndarray]  # system -> [users, K] pair indices
    imputers: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (p, hard) per pair


def world_from(
    users: Sequence[str],
    rankings: Mapping[str, Mapping[str, Sequence[str]]],
    online: Mapping[str, Sequence[str]],
    popularity: Mapping[str, int],
    alpha: float,
    k: int,
) -> World:
    """The listed pairs of every system's top-k for ``users``, their truth and exposure."""
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
    truth = {u: set(v) for u, v in online.items()}
    pop = np.array([popularity.get(i, 0) for _, i in pairs], dtype=float)
    return World(
        list(users),
        pairs,
        np.array([i in truth.get(u, ()) for u, i in pairs], dtype=float),
        exposure_probability(pop, top, alpha),
        pop,
        slots,
        {},
    )


def estimated_theta(world: World, observed: np.ndarray, gamma: float) -> np.ndarray:
    """Yang et al.'s power law ``c n_i^gamma`` per listed pair, ``c`` matching the observed
    count over the listed pairs (capped at 1; the caller clips)."""
    base = np.maximum(world.popularity, 1.0) ** gamma
    c = observed.sum() / base.sum() if base.sum() else 0.0
    return np.minimum(1.0, c * base)


def _gather(a: np.ndarray, m: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """``a`` at the pair indices ``m`` (``fill`` where ``m`` is -1)."""
    return np.where(m >= 0, a[np.maximum(m, 0)], fill)


def estimator_rows(imputers: Sequence[str]) -> list[tuple[str, str, str]]:
    """(row name, estimator, imputer or propensity) of the comparison, in report order."""
    rows = [("logged", "logged", "")]
    for th in ("true", "est"):
        rows += [(f"ips ({th} theta)", "ips", th), (f"snips ({th} theta)", "snips", th)]
    for imp in imputers:
        rows += [
            (f"imputed [{imp}]", "imputed", imp),
            (f"dm [{imp}]", "dm", imp),
            (f"dr [{imp}, true theta]", "dr", f"{imp}|true"),
            (f"dr [{imp}, est theta]", "dr", f"{imp}|est"),
        ]
    return rows


def one_log(
    world: World,
    observed: np.ndarray,
    metrics: Sequence[str],
    clip: float,
    gamma: float,
    idx: np.ndarray,
) -> dict[str, dict[str, dict[str, tuple[float, float, float]]]]:
    """Every estimator row on one log: ``{row: {metric: {system: (value, lo, hi)}}}`` with
    95 % percentile intervals over the user resamples ``idx`` ([draws, users])."""
    from recjudge.evaluators._estimators import linear_values, parse_metric, snips_normaliser

    y_all = world.relevant * observed
    thetas = {
        "true": np.maximum(world.theta, clip),
        "est": np.maximum(estimated_theta(world, observed, gamma), clip),
    }
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
            for row, est, arg in rows:
                imputer, _, prop = arg.partition("|")
                p, h = imp.get(imputer, (zero, zero))
                t = th.get(prop or arg, th["true"])
                vals = linear_values(est, w, o, y, p * valid, h * valid, t)
                if est == "snips":
                    vals = vals / snips_normaliser(o[:, :k], t[:, :k], valid[:, :k])
                boot = vals[idx].mean(axis=1)
                cell = (float(vals.mean()), *bootstrap_ci(boot))
                out.setdefault(row, {}).setdefault(metric, {})[name] = cell
    return out


def _padded_weights(metric: str, width: int) -> np.ndarray:
    """``metric``'s position weights over ``width`` ranks (0 past its cut-off)."""
    from recjudge.evaluators._estimators import metric_weights, parse_metric

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
    """Per row and metric over the logs: mean absolute error against the online metric (and
    relative, in %), mean lift gap (pp), mean Kendall tau of the system order, coverage of
    the 95 % intervals and their mean width; plus the per-log mean absolute error (for
    paired comparisons)."""
    from recjudge.evaluators import kendall_tau

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in logs[0]:
        out[row] = {}
        for metric, tr in truth.items():
            systems = list(tr)
            pairs = list(itertools.combinations(systems, 2))
            err, rel, cover, width, taus, gaps = [], [], [], [], [], []
            for log in logs:
                cells = log[row][metric]
                e = [abs(cells[s][0] - tr[s]) for s in systems]
                err.append(float(np.mean(e)))
                rel.append(float(np.mean([x / tr[s] for x, s in zip(e, systems, strict=True)
                                          if tr[s]])))  # fmt: skip
                cover += [cells[s][1] <= tr[s] <= cells[s][2] for s in systems]
                width += [cells[s][2] - cells[s][1] for s in systems]
                taus.append(kendall_tau([cells[s][0] for s in systems], [tr[s] for s in systems]))
                g = gap({s: {metric: cells[s][0]} for s in systems},
                        {s: {metric: tr[s]} for s in systems}, pairs)[metric]  # fmt: skip
                gaps.append(g)
            out[row][metric] = {
                "abs_error": float(np.mean(err)),
                "rel_error_pct": 100 * float(np.mean(rel)),
                "lift_gap_pp": _mean(gaps),
                "kendall_tau": _mean(taus),
                "coverage": float(np.mean(cover)),
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
    """Mean absolute error of row ``a`` minus row ``b`` over the logs, with its 95 %
    t-interval over logs (the logs are independent draws; users and judgments are fixed)."""
    from recjudge._stats import seed_interval

    d = np.subtract(
        summary[a][metric]["abs_error_per_log"], summary[b][metric]["abs_error_per_log"]
    )
    ci = seed_interval(list(d))
    return {"mean": ci["mean"], "lo": ci["lo"], "hi": ci["hi"]}


def gold_experiment(
    world: World,
    imputer: str,
    metrics: Sequence[str],
    sizes: Sequence[int],
    draws: int,
    seed: int,
) -> dict[str, dict[str, dict[str, Any]]]:
    """PPI++ and the gold sample alone, per size and metric: gold pairs drawn uniformly
    from the listed pairs and labelled with the online truth; per system the gold pairs in
    its lists feed ``ppi_mean`` (``c w_r R`` on gold slots, ``c w_r p`` everywhere, ``c`` = its
    slots per user). Returns coverage, mean absolute error and mean width per method."""
    from recjudge.evaluators._estimators import metric_weights, parse_metric, ppi_mean

    p_all = world.imputers[imputer][0]
    truth = truth_of(world, metrics)
    g = np.random.default_rng(seed)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for n in sizes:
        n_eff = min(n, len(world.pairs))
        acc: dict[str, dict[str, list]] = {}
        for _ in range(draws):
            gold = np.zeros(len(world.pairs), dtype=bool)
            gold[g.choice(len(world.pairs), n_eff, replace=False)] = True
            for metric in metrics:
                base, k = parse_metric(metric)
                w = metric_weights(base, k)
                for name, m in world.slots.items():
                    mk = m[:, :k]
                    flat = mk[mk >= 0]
                    wr = np.broadcast_to(w[: mk.shape[1]], mk.shape)[mk >= 0]
                    c = len(flat) / len(world.users)
                    yu = c * wr * p_all[flat]
                    sel = gold[flat]
                    if sel.sum() < 2:
                        continue
                    y = c * wr[sel] * world.relevant[flat][sel]
                    for method, lam in (("ppi++", None), ("gold only", 0.0)):
                        r = ppi_mean(y, yu[sel], yu, lam=lam)
                        t = truth[metric][name]
                        cell = acc.setdefault(method, {}).setdefault(metric, [])
                        cell.append((abs(r["value"] - t), r["lo"] <= t <= r["hi"],
                                     r["hi"] - r["lo"], int(sel.sum())))  # fmt: skip
        out[str(n)] = {
            method: {
                metric: {
                    "abs_error": float(np.mean([c[0] for c in v])),
                    "coverage": float(np.mean([c[1] for c in v])),
                    "ci_width": float(np.mean([c[2] for c in v])),
                    "gold_per_system": float(np.mean([c[3] for c in v])),
                    "intervals": len(v),
                }
                for metric, v in by_metric.items()
            }
            for method, by_metric in acc.items()
        }
    return out


def calibrated(world: World, imputer: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``imputer``'s probabilities through an isotonic map fitted on ``n`` gold pairs drawn
    uniformly from the listed pairs (labels: the online truth); hard label p > 0.5."""
    from recjudge.evaluators._calibrate import apply_map, fit_isotonic

    g = np.random.default_rng(seed)
    gold = g.choice(len(world.pairs), min(n, len(world.pairs)), replace=False)
    p = world.imputers[imputer][0]
    xs, ys = fit_isotonic(p[gold], world.relevant[gold])
    pc = np.asarray(apply_map(xs, ys, p), dtype=float)
    return pc, (pc > 0.5).astype(float)


def bench_brief_offline_estimators(
    config: EstimatorCheckConfig,
    out: str | Path = "reports/brief-offline-estimators",
    llm: LLMBackend | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Judge every listed pair (through the store), then run every estimator over
    ``config.simulated_logs`` logs and the gold-sample experiment; write report.md,
    results.json and estimators.png under ``out``."""
    from recjudge._stats import user_draws
    from recjudge._util import rng
    from recjudge.bench._offline import _imputer_judges, _simulate_log, _train_runs
    from recjudge.cf_models import SideInfo, calibrated_cf
    from recjudge.data import Dataset, load_dataset
    from recjudge.evaluators._estimators import parse_metric
    from recjudge.reporting import write_report
    from recjudge.reward import ResultsStore, judge_per_user, requests_for

    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    k = max(parse_metric(m)[1] for m in config.metrics)
    ds = load_dataset(config.data)
    logs = [_simulate_log(config, ds, s) for s in config.log_seeds()]
    runs = _train_runs(config, ds, logs)
    users = list(dict.fromkeys(u for log in logs for u in log.users))
    online = {u: v for log in logs for u, v in log.online.items()}
    past = logs[0].past
    popularity = past["item_id"].astype(str).value_counts().to_dict()
    world = world_from(users, {r.name: r.rankings for r in runs}, online, popularity,
                       config.alpha, k)  # fmt: skip
    pos_past = (
        past if config.positive_rating is None else past[past["rating"] >= config.positive_rating]
    )
    cf = calibrated_cf(config.cf, pos_past, ds.items["item_id"].astype(str).tolist(),
                       config.seed, SideInfo.of(ds))  # fmt: skip
    hist = {u: h for log in logs for u, h in log.hist.items()}
    sigma = np.array([cf.sigma(hist[u], i, u) for u, i in world.pairs])
    world.imputers["all-yes"] = (np.ones(len(world.pairs)), np.ones(len(world.pairs)))
    world.imputers["cf"] = ((sigma + 1) / 2, (sigma > 0).astype(float))
    judged = {"requests": 0, "judged_now": 0, "passes": 0, "failed": 0, "seconds": 0.0}
    judges = _imputer_judges(config, ds, past, cf, llm)
    if judges:
        past_ds = Dataset(ds.name, past, ds.items, ds.users, domain=ds.domain)
        reqs, at = [], []
        for n, r in enumerate(requests_for(past_ds, world.pairs)):
            if not isinstance(r, Exception):
                reqs.append(r)
                at.append(n)
        t1 = time.time()
        with ResultsStore(out / "store.sqlite") as store:
            got, counts, passes, _ = judge_per_user(reqs, judges, store, progress, "record")
        judged.update(seconds=round(time.time() - t1, 1), passes=passes,
                      requests=sum(c["total"] for c in counts.values()),
                      judged_now=sum(c["new"] for c in counts.values()))  # fmt: skip
        for mode, js in got.items():
            p = np.full(len(world.pairs), np.nan)
            h = np.zeros(len(world.pairs))
            for n, j in zip(at, js, strict=True):
                if j is not None and not getattr(j, "error", None):
                    p[n], h[n] = j.p_yes, float(j.is_relevant)
            judged["failed"] += int(np.isnan(p).sum())
            # A pair the judge could not answer takes the judge's mean probability (counted
            # in the header): dm/dr need a value for every listed pair.
            fill = float(np.nanmean(p)) if np.isfinite(p).any() else 0.5
            world.imputers[f"judge:{mode}"] = (np.where(np.isnan(p), fill, p), h)
    if config.calibration_gold:
        for name in ("judge:brief", "cf"):
            if name in world.imputers:
                world.imputers[f"{name}+cal"] = calibrated(
                    world, name, config.calibration_gold, config.seed
                )
    t2 = time.time()
    truth = truth_of(world, config.metrics)
    per_log = []
    for t in range(config.simulated_logs):
        g = rng("estimator-log", (config.seed, t))
        observed = g.random(len(world.pairs)) < world.theta
        idx = user_draws(len(users), config.draws, config.seed + t)
        per_log.append(one_log(world, observed, config.metrics, config.clip,
                               config.propensity_exponent, idx))  # fmt: skip
    summary = summarise(per_log, truth)
    gold_imputer = "judge:brief" if "judge:brief" in world.imputers else "cf"
    gold = gold_experiment(world, gold_imputer, config.metrics, config.gold_sizes,
                           config.gold_draws, config.seed)  # fmt: skip
    observed_share = float(np.mean(world.theta))
    results = {
        "config": config.model_dump(),
        "users": len(users),
        "listed_pairs": len(world.pairs),
        "relevant_share": float(world.relevant.mean()),
        "expected_observed_share": observed_share,
        "clipped_true_theta": int((world.theta < config.clip).sum()),
        "imputers": {
            n: {
                "mean_p": float(p.mean()),
                "yes_rate": float(h.mean()),
                "auc_vs_truth": _auc(p, world.relevant),
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
        "paired": _paired(summary, list(world.imputers), config.metrics),
        "gold": gold,
        "gold_imputer": gold_imputer,
        "judging": judged,
        "estimating_seconds": round(time.time() - t2, 1),
        "wall_seconds": round(time.time() - t0, 1),
    }
    _plot(summary, config, out / "estimators.png")
    write_report(out, results, _report(config, results))
    return results


def _auc(p: np.ndarray, y: np.ndarray) -> float | None:
    from recjudge._stats import auc

    return auc(p[y > 0].tolist(), p[y == 0].tolist())


def _paired(
    summary: Mapping[str, Any], imputers: Sequence[str], metrics: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Each model-based DR row against logged, its imputer's ``imputed`` row, ``imputed
    [all-yes]`` and IPS/SNIPS with the same propensities: the difference of mean absolute
    errors per metric."""
    out: dict[str, dict[str, Any]] = {}
    for imp in imputers:
        if imp == "all-yes":
            continue
        for th in ("true", "est"):
            row = f"dr [{imp}, {th} theta]"
            others = ("logged", f"imputed [{imp}]", "imputed [all-yes]", f"ips ({th} theta)",
                      f"snips ({th} theta)")  # fmt: skip
            for other in others:
                out.setdefault(row, {})[other] = {
                    m: paired_errors(summary, row, other, m) for m in metrics
                }
    return out


def _f(v: Any, nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _report(config: EstimatorCheckConfig, r: Mapping[str, Any]) -> list[str]:
    j = r["judging"]
    rate = j["judged_now"] / j["seconds"] if j["seconds"] else None
    lines = [
        f"# Metric estimators against the known truth ({config.data}, brief-offline's world)",
        "",
        "**Our experiment, not a paper's table.** The online truth, the recommenders and the "
        "judges are `brief-offline`'s; each of "
        f"{config.simulated_logs} simulated logs observes every listed pair independently with "
        f"the true exposure probability theta_i = (pop_i / max pop)^{config.alpha} and reveals "
        "its online label (an observed pair can be irrelevant: unlike `brief-offline`'s log, "
        "which records exposed positives only).",
        "",
        f"- {r['users']} users (the union of logging seeds {list(config.log_seeds())} of "
        f"brief-offline's sample), systems {', '.join(config.systems)}"
        f"{' (SASRec ' + str(config.sasrec_epochs) + ' epochs)' if 'sasrec' in config.systems else ''}, "  # noqa: E501
        f"top-{max(int(m.split('@')[1]) for m in config.metrics)}: {r['listed_pairs']} distinct "
        f"listed pairs, {100 * r['relevant_share']:.1f} % relevant online, "
        f"{100 * r['expected_observed_share']:.1f} % observed per log in expectation.",
        f"- Propensities: *true* = the exposure model above; *est* = Yang et al.'s power law of "
        f"past popularity, theta_i = c n_i^{config.propensity_exponent:g}, c fitted per log to "
        "the observed count (misspecified unless the exponent equals alpha). Both clipped at "
        f"{config.clip:g} ({r['clipped_true_theta']} listed pairs have a true theta below it: "
        "they can hardly be observed, and IPS cannot see their relevance).",
        f"- Imputation models: judges `{config.model}` ({', '.join(config.judges)}; "
        f"{config.sampling_note()}; beta {config.beta}, sigma from `{config.cf}`) with p = "
        f"p_yes; `cf` = (sigma + 1) / 2 of `{config.cf}`; `all-yes` = 1 everywhere; "
        + (
            f"`+cal` = the imputer's p through an isotonic map fitted on the same "
            f"{config.calibration_gold} gold pairs (uniform over listed pairs, online labels; "
            "hard label p > 0.5)."
            if config.calibration_gold
            else "no calibrated imputer."
        )
        + " Hard labels (for `imputed`): the verdict; cf: sigma > 0.",
        f"- Intervals: 95 % percentile intervals from {config.draws} user resamples per log; "
        "error differences: 95 % t-intervals over the logs (users and judgments fixed).",
        f"- Cost: {j['requests']} judge requests over every listed pair, {j['judged_now']} "
        f"judged in this run in {j['seconds']} s"
        + (f" ({rate:.2f} per second)" if rate else "")
        + f", {j['passes']} decoding passes, the rest from the store; {j['failed']} pairs "
        "without an answer took the judge's mean p. Estimating: "
        f"{r['estimating_seconds']} s for every row, metric, system and log; wall "
        f"{r['wall_seconds']} s.",
        "",
        "Imputation models against the online truth over every listed pair:",
        "",
        "| imputer | mean p | YES rate | AUC vs truth |",
        "|---|---|---|---|",
    ]
    for n, v in r["imputers"].items():
        lines.append(f"| {n} | {_f(v['mean_p'])} | {_f(v['yes_rate'])} | "
                     f"{_f(v['auc_vs_truth'])} |")  # fmt: skip
    for metric in config.metrics:
        lines += [
            "",
            f"## {metric}",
            "",
            "Online truth: " + ", ".join(f"{s} {v:.4f}" for s, v in r["truth"][metric].items()),
            "",
            "| estimator [imputer, propensity] | mean abs error | rel. error % | lift gap pp "
            "| Kendall tau | 95 % CI coverage | CI width |",
            "|---|---|---|---|---|---|---|",
        ]
        for row, d in r["summary"].items():
            c = d[metric]
            lines.append(
                f"| {row} | {c['abs_error']:.4f} | {c['rel_error_pct']:.1f} | "
                f"{_f(c['lift_gap_pp'], 1)} | {_f(c['kendall_tau'], 2)} | "
                f"{100 * c['coverage']:.0f} % | {c['ci_width']:.4f} |"
            )
    lines += [
        "",
        "## Doubly robust against the alternatives",
        "",
        "Mean absolute error of the DR row minus the other's (below 0: DR is closer to the "
        "truth), 95 % t-interval over the logs, per metric:",
        "",
        "| DR row | minus | " + " | ".join(config.metrics) + " |",
        "|---|---|" + "---|" * len(config.metrics),
    ]
    for row, others in r["paired"].items():
        for other, by_m in others.items():
            cells = [interval(c["mean"], c["lo"], c["hi"], nd=4) for c in by_m.values()]
            lines.append(f"| {row} | {other} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## Gold samples: PPI++ with `{r['gold_imputer']}` against the gold sample alone",
        "",
        f"{config.gold_draws} gold samples per size, pairs uniform over the listed pairs, "
        "labelled with the online truth (no log is used).",
        "",
        "| gold pairs | method | metric | gold pairs per system | mean abs error | coverage "
        "| CI width |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, by_method in r["gold"].items():
        for method, by_m in by_method.items():
            for metric, c in by_m.items():
                lines.append(
                    f"| {n} | {method} | {metric} | {c['gold_per_system']:.0f} | "
                    f"{c['abs_error']:.4f} | {100 * c['coverage']:.0f} % | {c['ci_width']:.4f} |"
                )
    lines += ["", "![mean absolute error and coverage per estimator](estimators.png)"]
    return lines


def _plot(summary: Mapping[str, Any], config: EstimatorCheckConfig, path: Path) -> None:
    from recjudge.reporting import figure

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
        ax.set_xlabel(f"mean absolute error of {metric} against the online truth "
                      "(green: 95 % CI covers it in >= 90 % of logs)")  # fmt: skip
        ax.set_title(f"Estimators over {config.simulated_logs} simulated logs ({config.data})")
