"""BRIEF offline evaluation with imputed feedback (Tables 2-3), on a simulated
offline-online gap.

The future part of each sampled user's timeline is the "online" truth. The logged future
keeps only the items a popularity-biased logging policy exposed (exposure probability
(pop / max pop)^alpha), which is what an offline evaluation sees. Recommenders trained on the
past are scored three ways: on the logged truth alone, and with the top-k items that have
no logged feedback labelled by a CF model or by the judge. The gap is the mean absolute error
between offline and online relative lifts over recommender pairs.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from pydantic import ConfigDict, Field

from recjudge._metrics import ranking_metrics  # one function per formula, shared
from recjudge._stats import seed_interval
from recjudge._util import cache_dir, path_component, rng, stable_hash
from recjudge.bench._judging import SIMULATORS, JudgeSampling, judges_for
from recjudge.bench._offline_stats import gap_intervals
from recjudge.cf_models import MODELS, SideInfo, TrainOptions, calibrated_cf, load_model
from recjudge.data import Dataset, load_dataset, sample_users, timeline_split
from recjudge.evaluators import ImputeConfig, RecRun, RunCheck, imputation_plan, impute, read_qrels
from recjudge.reporting import figure, interval, write_report
from recjudge.reward import Population, ResultsStore, judge_per_user, llm_made

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

KS = (10, 20)


def lift(a: float, b: float) -> float | None:
    """Relative lift of B over A in percent: 100 (M_B - M_A) / M_A (None if M_A = 0)."""
    return None if a == 0 else 100.0 * (b - a) / a


def gap(
    offline: Mapping[str, Mapping[str, float]],
    online: Mapping[str, Mapping[str, float]],
    pairs: Sequence[tuple[str, str]],
) -> dict[str, float | None]:
    """Per metric: mean absolute error between offline and online lifts over ``pairs``
    (pairs whose lift is undefined on either side are skipped)."""
    out = {}
    for m in next(iter(online.values())):
        errs = []
        for a, b in pairs:
            lo, ln = lift(offline[a][m], offline[b][m]), lift(online[a][m], online[b][m])
            if lo is not None and ln is not None:
                errs.append(abs(lo - ln))
        out[m] = float(np.mean(errs)) if errs else None
    return out


def exposure_probability(pop: Any, top: float, alpha: float) -> Any:
    """The logging policy's exposure probability ``(pop / max pop)^alpha`` (1 with
    ``alpha = 0``), of a count or an array of counts."""
    return (np.asarray(pop, dtype=float) / top) ** alpha if alpha > 0 else np.ones_like(
        np.asarray(pop, dtype=float))  # fmt: skip


def exposure_mask(
    items: Sequence[str], popularity: Mapping[str, int], alpha: float, seed: Any
) -> list[bool]:
    """Which items a popularity-biased logging policy exposed (``exposure_probability``)."""
    top = max(popularity.values()) if popularity else 1
    g = rng("exposure", seed)
    return [
        bool(g.random() < exposure_probability(popularity.get(i, 0), top, alpha))
        if alpha > 0
        else True
        for i in items
    ]


class OfflineConfig(JudgeSampling):
    """Settings of ``brief-offline``.

    Attributes:
        model: judge LLM.
        data: dataset.
        users: users sampled among those with at least ``min_future`` future items.
        systems: recommenders (CF model names) trained on the past; every pair is compared.
        sasrec_epochs: epochs when SASRec is one of the systems (its 200-epoch default takes
            ~5000 s on a 2-core CPU; the report names the cut).
        alpha: popularity exponent of the logging policy.
        future_fraction: last fraction of each timeline = the online truth.
        positive_rating: only future items rated at least this count as relevant (None:
            every future interaction).
        min_future: users need at least this many future items.
        cf: the CF imputer and the judges' sigma source (trained on positive past
            interactions): ``als``, ``sasrec``, ``bpr``, ...
        judges: judge modes used as imputers.
        history_items: history shown to the judge.
        beta: the BRIEF bias strength of the judge imputers.
        seed: user-sampling and training seed.
        decode_rows: pairs decoded together in one engine call (speed and memory).
        logging_seeds: seeds of the logging policy's exposure draws; each is its own
            simulated log with its own gap, and the report gives the mean gap over them with
            a 95 % t-interval (the recommenders are trained once: the past does not depend on
            the log). None: ``(seed,)``.
        bootstrap: resamples of the paired user bootstrap of the gaps
            (``_offline_stats.gap_intervals``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "qwen2.5-coder-1.5b"
    data: str = "ml-1m"
    users: int = Field(30, ge=1)
    systems: tuple[str, ...] = ("pop", "itemknn", "als", "bpr")
    sasrec_epochs: int = Field(30, ge=1)
    alpha: float = Field(1.0, ge=0)
    future_fraction: float = Field(0.2, gt=0, lt=1)
    min_future: int = Field(5, ge=1)
    positive_rating: float | None = 4.0
    cf: str = "als"
    judges: tuple[str, ...] = Field(
        ("brief", "non-adaptive", "no-behavior", "zero-shot"),
        json_schema_extra={"cli": ["--imputers"]},  # the option's name before it was a field's
    )
    history_items: int = Field(50, ge=1)
    beta: float = Field(25.0, ge=0)
    seed: int = 0
    logging_seeds: tuple[int, ...] | None = Field(None, min_length=1)
    decode_rows: int = Field(8, ge=1)
    bootstrap: int = Field(1000, ge=10)

    def log_seeds(self) -> tuple[int, ...]:
        """The logging seeds in effect."""
        return self.logging_seeds or (self.seed,)


@dataclass
class _Log:
    """The simulated world: the past, the online truth and what the logging policy kept."""

    past: Any  # interactions before each user's cut
    online: dict[str, list[str]]  # user -> future relevant items
    logged: dict[str, list[str]]  # user -> the exposed ones
    users: list[str]
    hist: dict[str, list[str]]  # user -> past items, oldest first


def _simulate_log(config: OfflineConfig, ds: Any, log_seed: int) -> _Log:
    """Timeline split, relevant future, popularity-biased exposure drawn with ``log_seed``;
    users (sampled with ``config.seed``) need ``min_future`` relevant future items and at
    least one of them logged (the offline rule ``impute`` applies: a user with no logged
    positive is not evaluated)."""
    past, future = timeline_split(ds.interactions, fraction=config.future_fraction)
    if config.positive_rating is not None:
        future = future[future["rating"] >= config.positive_rating]
    online = {
        str(u): g["item_id"].astype(str).tolist()
        for u, g in future.groupby("user_id", observed=True)
    }
    in_past = set(past["user_id"].astype(str))
    popularity = past["item_id"].astype(str).value_counts().to_dict()
    logged = {
        u: [
            i
            for i, e in zip(
                f, exposure_mask(f, popularity, config.alpha, (log_seed, u)), strict=True
            )
            if e
        ]
        for u, f in online.items()
    }
    eligible = sorted(
        u for u, f in online.items() if len(f) >= config.min_future and u in in_past and logged[u]
    )
    users = sample_users(eligible, config.users, config.seed)
    chosen = set(users)
    hist = {
        str(u): g["item_id"].astype(str).tolist()
        for u, g in past.groupby("user_id", observed=True)
        if str(u) in chosen
    }
    return _Log(past, {u: online[u] for u in users}, {u: logged[u] for u in users}, users, hist)


def untrained_system(config: OfflineConfig, name: str) -> Any:
    """A recommender under test with its default settings, but SASRec cut to
    ``config.sasrec_epochs``."""
    cls = MODELS.get(name)
    return cls(cls.Config(epochs=config.sasrec_epochs) if name == "sasrec" else cls.Config())


def trained_system(config: OfflineConfig, ds: Any, past: Any, name: str) -> Any:
    """A recommender under test trained on the past, once per (model settings, data, past,
    seed); a resumed or extended run loads it from ``$RECJUDGE_CACHE/cf`` (SASRec trains for
    minutes). A folder that does not load (an interrupted save) is trained again."""
    model = untrained_system(config, name)
    tag = stable_hash(
        name, model.config.model_dump(), config.data, len(past), config.future_fraction,
        config.seed, length=10,
    )  # fmt: skip
    path = cache_dir() / "cf" / f"{path_component(name)}-{path_component(config.data)}-past-{tag}"
    if (path / "model.json").exists():
        try:
            return load_model(path)
        except (FileNotFoundError, ValueError):  # CFModelError: a half-written folder
            shutil.rmtree(path, ignore_errors=True)
    items = ds.items["item_id"].astype(str).tolist()
    model.train(past, TrainOptions(seed=config.seed, progress=False), items=items,
                side=SideInfo.of(ds))  # fmt: skip
    model.save(path)
    return model


def _train_runs(config: OfflineConfig, ds: Any, logs: Sequence[_Log]) -> list[Any]:
    """The recommenders under test, trained on the past (the same under every log), as runs
    (top ``max(KS)``) for the users of every log."""
    hist = {u: h for log in logs for u, h in log.hist.items()}
    runs = []
    for name in config.systems:
        model = trained_system(config, ds, logs[0].past, name)
        lists = {u: model.recommend(hist[u], max(KS)) for u in hist}
        scores = {u: [float(len(v) - r) for r in range(len(v))] for u, v in lists.items()}
        runs.append(RecRun(name, f"(trained on the past: {name})", lists, scores, RunCheck()))
    return runs


def _impute_all(
    config: OfflineConfig,
    ds: Any,
    log: _Log,
    runs: list,
    cf: Any,
    judges: Mapping[str, Any],
    store: Any,
    folder: Path,
    progress: bool,
) -> tuple[dict[str, dict[tuple[str, str], bool]], dict[str, int]]:
    """Labels of every unlogged top-k pair: ``all-yes`` (every pair positive: the
    no-model reference), the CF imputer (sigma > 0) and each judge mode
    through ``recjudge.evaluators.impute`` (the code ``recjudge impute`` runs), its files in
    ``folder/<mode>``. The store is filled first for all judges together, user by user, so
    the settings that differ only in their bias share one decoding pass per pair
    (``judge_per_user``); each ``impute`` then reads its judgments back.

    Returns:
        The labels per imputer, and ``{"judged_now", "requests", "passes"}``: the judge
        modes' judgments made in this call, their requests, and the decoding passes made.
    """
    past_ds = Dataset(ds.name, log.past, ds.items, ds.users, domain=ds.domain)
    rows = [(u, i) for u in log.users for i in log.logged[u]]
    fb = pd.DataFrame(
        {
            "user_id": [u for u, _ in rows],
            "item_id": [i for _, i in rows],
            "timestamp": 0.0,
            "rating": 5.0,
            "event_type": "explicit_positive",
        }
    )
    feedback = Dataset(ds.name + "-logged", fb, ds.items, ds.users, domain=ds.domain)
    # The BRIEF paper's protocol (Tables 2-3): only unlogged pairs are judged, on the usual
    # offline users (a logged positive each). ImputeConfig's defaults moved to what the
    # estimators need (judge logged pairs too, users chosen without looking at labels), so
    # the paper's settings are stated here.
    icfg = ImputeConfig(k=max(KS), min_rating=None, judge_logged=False,
                        user_rule="logged-positive")  # fmt: skip
    plan = imputation_plan(past_ds, feedback, runs, icfg)
    imputed = {
        # The reference an imputer must beat to show it discriminates: every unlogged pair
        # positive (no model). It flattens every system's offline metrics alike.
        "all-yes": dict.fromkeys(plan.pairs, True),
        "cf": {(u, i): cf.sigma(log.hist[u], i, u) > 0 for u, i in plan.pairs},
    }
    if not judges:
        return imputed, {"judged_now": 0, "requests": 0, "passes": 0}
    _, counts, passes, _ = judge_per_user(plan.requests, judges, store, progress, errors="record")
    made = {**llm_made(judges, counts), "passes": passes}
    for mode, judge in judges.items():
        impute(judge, past_ds, feedback, runs, icfg, folder / mode, store=store, plan=plan)
        qrels = read_qrels(folder / mode / "qrels_imputed.json")
        imputed[f"judge:{mode}"] = {(u, i): bool(qrels.get(u, {}).get(i, 0)) for u, i in plan.pairs}
    return imputed, made


METRICS = tuple(ranking_metrics([0], 1))  # the columns of the per-user arrays


def per_user_metrics(
    runs: list, log: _Log, truth: str, imputed: Mapping[str, Mapping]
) -> dict[str, np.ndarray]:
    """Per system, the ranking metrics of every user (``[users, METRICS]``, users in
    ``log.users`` order) against the online truth, the logged truth, or the logged truth plus
    an imputer's labels."""
    out = {}
    for run in runs:
        rows = []
        for u in log.users:
            lg, online, lst = set(log.logged[u]), set(log.online[u]), run.rankings[u]
            if truth == "online":
                rel, n_rel = [int(i in online) for i in lst], len(online)
            elif truth == "logged":
                rel, n_rel = [int(i in lg) for i in lst], len(lg)
            else:
                lab = imputed[truth]
                rel = [int(i in lg or lab.get((u, i), False)) for i in lst]
                n_rel = len(lg) + sum(1 for i in lst if i not in lg and lab.get((u, i), False))
            m = ranking_metrics(rel, n_rel)
            rows.append([m[k] for k in METRICS])
        out[run.name] = np.asarray(rows, dtype=float)
    return out


def _means(per_user: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Mean metrics per system."""
    return {
        s: dict(zip(METRICS, map(float, a.mean(axis=0)), strict=True)) for s, a in per_user.items()
    }


def _imputer_accuracy(
    imputed: Mapping[str, Mapping], online: Mapping[str, Sequence[str]]
) -> dict[str, dict]:
    """Agreement of each imputer with the online truth on the pairs it labelled."""
    out = {}
    truth = {u: set(v) for u, v in online.items()}
    for m, lab in imputed.items():
        ys = [(v, k[1] in truth[k[0]]) for k, v in lab.items()]
        tp = sum(1 for v, t in ys if v and t)
        out[m] = {
            "labelled": len(ys),
            "positive_rate": float(np.mean([v for v, _ in ys])) if ys else None,
            "precision_vs_online": tp / max(1, sum(1 for v, _ in ys if v)),
            "recall_vs_online": tp / max(1, sum(1 for _, t in ys if t)),
        }
    return out


def _seed_result(
    config: OfflineConfig, runs: list, log: _Log, imputed: Mapping[str, Mapping]
) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """One simulated log: online and offline metrics per system, the gap per method; and the
    per-user metrics under every truth (for the user bootstrap)."""
    truths = ["online", "logged", *imputed]
    per_user = {t: per_user_metrics(runs, log, t, imputed) for t in truths}
    online = _means(per_user["online"])
    offline = {m: _means(per_user[m]) for m in truths[1:]}
    methods = truths[1:]
    # Recall needs the number of relevant items, which imputation cannot know (BRIEF, 4.2):
    # it stays in the per-system tables as information, never in a gap.
    online_gap = {
        s: {k: v for k, v in d.items() if not k.startswith("recall@")} for s, d in online.items()
    }
    pairs = list(itertools.combinations(config.systems, 2))
    gaps = {m: gap(offline[m], online_gap, pairs) for m in methods}
    mean_gap = {
        m: float(np.mean([v for v in g.values() if v is not None]))
        if any(v is not None for v in g.values())
        else None
        for m, g in gaps.items()
    }
    n_logged = sum(len(log.logged[u]) for u in log.users)
    return {
        "users": log.users,
        "logged_share": float(n_logged / max(1, sum(len(log.online[u]) for u in log.users))),
        "online": online,
        "offline": offline,
        "gap": gaps,
        "mean_gap": mean_gap,
        "imputers": _imputer_accuracy(imputed, log.online),
    }, per_user


def _over_seeds(per_seed: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Gaps averaged over the logging seeds and the mean gap's t-interval over them."""
    seeds = list(per_seed.values())
    methods, metrics = list(seeds[0]["gap"]), list(next(iter(seeds[0]["gap"].values())))
    gaps = {
        m: {k: seed_interval([r["gap"][m][k] for r in seeds])["mean"] for k in metrics}
        for m in methods
    }
    ci = {m: seed_interval([r["mean_gap"][m] for r in seeds]) for m in methods}
    return {
        "gap": gaps,
        "mean_gap": {m: ci[m]["mean"] for m in methods},
        "mean_gap_ci": ci,
    }


def bench_brief_offline(
    config: OfflineConfig,
    out: str | Path = "reports/brief-offline",
    llm: LLMBackend | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the simulation under every logging seed; write report.md, results.json and
    gap.png under ``out``. The judges impute through ``recjudge.evaluators.impute`` (qrels
    under ``out/impute/seed-<s>/<mode>``), all seeds through one store (a pair two logs
    share is judged once)."""
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(config.data)
    logs = {s: _simulate_log(config, ds, s) for s in config.log_seeds()}
    first = next(iter(logs.values()))
    runs = _train_runs(config, ds, list(logs.values()))
    # CF imputer on positive past interactions, sigma calibrated on its validation items
    past = first.past
    pos_past = (
        past if config.positive_rating is None else past[past["rating"] >= config.positive_rating]
    )
    cf = calibrated_cf(
        config.cf,
        pos_past,
        ds.items["item_id"].astype(str).tolist(),
        config.seed,
        SideInfo.of(ds),
    )
    judges = _imputer_judges(config, ds, first.past, cf, llm)
    per_seed, imputed, per_user = {}, {}, {}
    made = {"judged_now": 0, "requests": 0, "passes": 0}
    t_judge = time.time()
    with ResultsStore(out / "store.sqlite") as store:
        for s, log in logs.items():
            imputed[s], m = _impute_all(
                config, ds, log, runs, cf, judges, store, out / "impute" / f"seed-{s}", progress
            )
            made = {k: made[k] + m[k] for k in made}
            per_seed[s], per_user[s] = _seed_result(config, runs, log, imputed[s])
    t_judge = time.time() - t_judge
    pooled = {m: {k: v for lab in imputed.values() for k, v in lab[m].items()}
              for m in next(iter(imputed.values()))}  # fmt: skip
    users = list(dict.fromkeys(u for log in logs.values() for u in log.users))
    online = {u: h for log in logs.values() for u, h in log.online.items()}
    results = {
        "config": config.model_dump(),
        "logging_seeds": list(logs),
        "users": users,
        **_over_seeds(per_seed),
        "user_bootstrap": gap_intervals(
            list(per_user.values()), config.systems, METRICS, config.bootstrap, config.seed
        ),
        "imputers": _imputer_accuracy(pooled, online),
        "seeds": {str(s): r for s, r in per_seed.items()},
        "wall_seconds": round(time.time() - t0, 1),
        "judging_seconds": round(t_judge, 1),
        "llm_judgments": made["requests"],
        "judged_now": made["judged_now"],
        "judgments_per_second": round(made["judged_now"] / t_judge, 4) if t_judge > 0 else None,
        "decoding_passes": made["passes"],
    }
    pairs = list(itertools.combinations(config.systems, 2))
    _plot_gap(results["gap"], out / "gap.png", config)
    write_report(out, results, _report(config, results, pairs))
    return results


def _imputer_judges(config: OfflineConfig, ds: Any, past: Any, cf: Any, llm: LLMBackend) -> dict:
    """The judge modes that impute (none: no model is loaded)."""
    if not config.judges:
        return {}

    llm = llm or config.judge_llm(config.model)
    population = Population.of(ds, past) if set(config.judges) & set(SIMULATORS) else None
    return judges_for(config, llm, cf, config.judges, population)


def _fmt(v: Any, nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _sasrec_note(config: OfflineConfig) -> str:
    """The training cut of SASRec, when it is a system (a deviation the header names)."""
    if "sasrec" not in config.systems:
        return ""
    return f" (SASRec {config.sasrec_epochs} epochs, not its default 200: a CPU cut)"


def _report(config: OfflineConfig, r: Mapping[str, Any], pairs: Sequence[tuple]) -> list[str]:
    metrics = list(next(iter(r["gap"].values())))
    seeds = r["seeds"]
    share = np.mean([v["logged_share"] for v in seeds.values()])
    lines = [
        f"# BRIEF offline evaluation with imputed feedback on {config.data} (after Tables 2-3)",
        "",
        "**Not the paper's protocol:** the paper measures the offline-online gap against real "
        "online results; here the log is *simulated*: a popularity-biased exposure policy "
        "decides which of each user's future items were logged. Recall is not in the gap "
        "table (imputation cannot know the number of relevant items); it is listed in the "
        "per-system tables only. Judge decoding: " + config.sampling_note() + ".",
        "",
        f"{config.users} users per logging seed, {len(r['users'])} distinct over "
        f"{len(seeds)} seed(s) ({', '.join(seeds)}; users sampled with seed {config.seed} "
        f"among those with a logged positive under each log); the last "
        f"{int(config.future_fraction * 100)} % of each timeline (ratings >= "
        f"{config.positive_rating}) is the online truth; a popularity-biased "
        f"logging policy (alpha {config.alpha}) kept {100 * share:.1f} % of it as logged "
        f"feedback (mean over seeds). Recommenders {', '.join(config.systems)} trained on the "
        f"past{_sasrec_note(config)}; {len(pairs)} pairs. Imputers label top-{max(KS)} items "
        "without logged feedback: all-yes = every such item positive (no model: what an "
        "imputer that does not discriminate scores); "
        f"CF = `{config.cf}` on positive past interactions (sigma > 0); judges = "
        f"`{config.model}` ({', '.join(config.judges)}), beta {config.beta}. Wall time "
        f"{r['wall_seconds']} s, of which imputing {r['judging_seconds']} s: "
        f"{r['judged_now']} judgments made in this run for {r['llm_judgments']} requests "
        f"({r['judgments_per_second']} per second) from {r['decoding_passes']} decoding passes "
        "(the modes that differ only in their bias share one pass per pair; the rest were read "
        "from the store).",
        "",
        "Gap = mean absolute error (percentage points) between offline and online relative "
        "lift over recommender pairs; lower is better. Each metric's gap is the mean over the "
        "logging seeds; the last column is the mean gap with its 95 % t-interval over seeds "
        f"(none with one seed). Sigma source and CF imputer: `{config.cf}`.",
        "",
        "| method | " + " | ".join(metrics) + " | mean [95 % CI over seeds] |",
        "|---|" + "---|" * (len(metrics) + 1),
    ]
    for m, g in r["gap"].items():
        ci = r["mean_gap_ci"][m]
        lines.append(
            f"| {m} | "
            + " | ".join(_fmt(g[k], 1) for k in metrics)
            + f" | {interval(ci['mean'], ci['lo'], ci['hi'], nd=1)} |"
        )
    if len(seeds) > 1:
        lines += ["", "Mean gap per logging seed:", "", "| method | " + " | ".join(
            f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]  # fmt: skip
        for m in r["gap"]:
            lines.append(
                f"| {m} | " + " | ".join(_fmt(v["mean_gap"][m], 1) for v in seeds.values()) + " |"
            )
    lines += _bootstrap_lines(r["user_bootstrap"])
    s0, first = next(iter(seeds.items()))
    lines += ["", f"Metric values under logging seed {s0} (online truth, then each offline "
              "method; every seed's are in results.json):", ""]  # fmt: skip
    for name, table in [("online", first["online"]), *first["offline"].items()]:
        lines += [
            f"**{name}**",
            "",
            "| system | " + " | ".join(metrics) + " |",
            "|---|" + "---|" * len(metrics),
        ]
        for sname, v in table.items():
            lines.append(f"| {sname} | " + " | ".join(_fmt(v[k]) for k in metrics) + " |")
        lines.append("")
    lines += ["Imputers against the online truth on the items they labelled (all seeds):", ""]
    for m, a in r["imputers"].items():
        lines.append(
            f"- {m}: {a['labelled']} labelled, {100 * (a['positive_rate'] or 0):.1f} % positive, "
            f"precision {a['precision_vs_online']:.3f}, recall {a['recall_vs_online']:.3f}"
        )
    lines += ["", "![gap per metric](gap.png)"]
    return lines


def _bootstrap_lines(b: Mapping[str, Any]) -> list[str]:
    """The paired user bootstrap: each method's mean gap, imputers against the logged data,
    BRIEF against the other imputers."""

    def ci(c: Mapping[str, Any]) -> str:
        return interval(c["estimate"], c["lo"], c["hi"], nd=1)

    def seeds(c: Mapping[str, Any]) -> str:
        return " / ".join(_fmt(v, 1) for v in c["per_seed"])

    lines = [
        "",
        f"**Paired bootstrap over users** ({b['draws']} resamples: users drawn with "
        "replacement within each logging seed, the same draw for every method, gaps averaged "
        "over seeds). A difference below 0 means the first method's offline lifts are closer "
        "to the online ones; a CI that excludes 0 separates the two methods on these users "
        "and logs (the t-interval above is the spread over logs).",
        "",
        "| method | mean gap [95 % CI] | minus logged [95 % CI] | minus logged, per seed |",
        "|---|---|---|---|",
    ]
    for m, c in b["mean_gap"].items():
        d = b["minus_logged"].get(m)
        lines.append(f"| {m} | {ci(c)} | {ci(d) if d else '-'} | {seeds(d) if d else '-'} |")
    if b["brief_minus"]:
        lines += ["", "| judge:brief minus | difference [95 % CI] | per seed |", "|---|---|---|"]
        lines += [f"| {m} | {ci(c)} | {seeds(c)} |" for m, c in b["brief_minus"].items()]
    return lines


def _plot_gap(
    gaps: Mapping[str, Mapping[str, float | None]], path: Path, config: OfflineConfig
) -> None:
    methods = list(gaps)
    metrics = list(next(iter(gaps.values())))
    with figure(path, size=(10, 4.5), dpi=120) as ax:
        w = 0.8 / len(methods)
        for k, m in enumerate(methods):
            ax.bar(
                np.arange(len(metrics)) + k * w,
                [np.nan if gaps[m][x] is None else gaps[m][x] for x in metrics],
                w,
                label=m,
            )
        ax.set_xticks(np.arange(len(metrics)) + w * (len(methods) - 1) / 2)
        ax.set_xticklabels(metrics, rotation=30)
        ax.set_ylabel("offline-online lift gap (pp, lower is better)")
        ax.set_title(f"Offline evaluation gap ({config.data}, alpha {config.alpha})")
        ax.legend(fontsize=8)
