"""BRIEF training-data augmentation (Tables 4-5).

For each augmented user, the candidates are the top-N items of a CF model trained on the
user's past (seen items removed). Every labelling method scores the candidates; its top-M
(the same M for every method, chosen by the method's own score) are added to the training
data as positives; recommenders are retrained and evaluated on the untouched future of the
augmented users. Mean and sd over seeds (the seed drives model initialisation and the random
method; greedy judge labels do not depend on it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, field_validator

from recjudge._registry import suggest
from recjudge._stats import paired_comparisons, paired_difference, user_draws, verdict
from recjudge._util import rng
from recjudge.bench._judging import SIMULATORS, JudgeSampling, judges_for
from recjudge.bench._retrain import (
    METRICS,
    RetrainData,
    RetrainJob,
    kept_twins,
    other_score_from,
    retrain_all,
)
from recjudge.cf_models import SideInfo, calibrated_cf, item_item_for
from recjudge.data import Dataset, load_dataset, sample_users, timeline_split
from recjudge.evaluators import AugmentConfig as EvalAugmentConfig
from recjudge.evaluators import RecRun, RunCheck, augment, augment_plan
from recjudge.reporting import figure, interval, write_report
from recjudge.reward import SIMULATOR_MODES, Population, ResultsStore, judge_per_user, llm_made

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

# Methods that label candidates: they add only what they label positive (the LLM judges'
# YES, cf-only's sigma > 0), the top-M of those; the heuristics (random, popularity) rank.
LABELLING = (
    "cf-only",
    "zero-shot",
    "non-adaptive",
    "no-behavior",
    "item-item",
    "brief",
    *SIMULATOR_MODES,
)
METHODS = ("none", "random", "popularity", *LABELLING)


class AugmentBenchConfig(JudgeSampling):
    """Settings of ``brief-augment``.

    Attributes:
        model: judge LLM for the LLM methods.
        data: dataset.
        users: augmented users (sampled among users with >= ``min_future`` future items).
        candidates: N, top-N CF candidates per user.
        add: M, the most positives a method adds per user: a labelling method adds the
            top-M (by its score) of the candidates it labels positive, so possibly fewer.
        methods: labelling methods compared.
        retrain: recommenders retrained on the augmented data (``als``, ``sasrec``, ...).
        sasrec_epochs: epochs when SASRec is retrained.
        score_from: the history a retrained recommender scores each augmented user from:
            ``augmented``, the logged past followed by the added items (SASRec then conditions
            on them as the user's latest items); ``logged``, the logged past alone, so the
            added items shape training only. Comparing the two separates the added items'
            effect on the model from their effect as the last items of the scored sequence.
            Models that score a user from their trained factor (ALS) do not depend on it.
        seeds: number of seeds (0..seeds-1).
        future_fraction: last fraction of each timeline held out (the test items).
        min_future: users need at least this many future items.
        positive_rating: a rating at least this counts as positive.
        cf: candidate generator and sigma source (trained on positive past interactions).
        history_items: history shown to the judge.
        beta: the BRIEF bias strength of the LLM methods.
        seed: user-sampling and candidate-generator training seed.
        decode_rows: candidates decoded together in one engine call (speed and memory).
        bootstrap: user resamples for the paired intervals (``recjudge._stats``).
        workers: retrainings run at once, each in its own process on one thread (never
            changes a result: every retraining is seeded and single-threaded). A retraining
            keeps one core busy, so set it to the cores the machine can spare.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "qwen2.5-coder-1.5b"
    data: str = "ml-1m"
    users: int = Field(30, ge=1)
    candidates: int = Field(8, ge=2)
    add: int = Field(2, ge=1)
    methods: tuple[str, ...] = METHODS
    retrain: tuple[str, ...] = ("als",)
    sasrec_epochs: int = Field(30, ge=1)
    score_from: Literal["augmented", "logged"] = "augmented"
    seeds: int = Field(3, ge=1)
    future_fraction: float = Field(0.2, gt=0, lt=1)
    min_future: int = Field(5, ge=1)
    positive_rating: float = 4.0
    cf: str = "als"
    history_items: int = Field(50, ge=1)
    beta: float = Field(25.0, ge=0)
    seed: int = 0
    decode_rows: int = Field(8, ge=1)
    bootstrap: int = Field(1000, ge=100)
    workers: int = Field(1, ge=1)

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for m in v:
            if m not in METHODS:
                near = suggest(m, list(METHODS))
                hint = f"; did you mean {near[0]!r}?" if near else "."
                raise ValueError(f"unknown method {m!r}{hint} Choose from {', '.join(METHODS)}")
        if len(set(v)) != len(v):
            raise ValueError("a method is listed twice")
        return v


def choose(
    user: str,
    candidates: list[str],
    scores: Mapping[tuple[str, str], float],
    positive: set[tuple[str, str]] | None,
    add: int,
) -> list[str]:
    """The items a method adds for ``user``: its top-``add`` candidates by score (ties: the
    candidate order), among those it labels positive if it labels (``positive``)."""
    pool = candidates if positive is None else [i for i in candidates if (user, i) in positive]
    return sorted(pool, key=lambda i: -scores[(user, i)])[:add]


@dataclass
class _World:
    """Past, the augmented users' future positives, and their CF candidates."""

    ds: Any
    past: Any
    users: list[str]
    hist: dict[str, list[str]]
    test: dict[str, set[str]]
    cands: dict[str, list[str]]
    items: list[str]
    cf: Any

    def retrain_data(self) -> RetrainData:
        """What every retraining trains and scores on (``recjudge.bench._retrain``)."""
        return RetrainData(
            self.past, self.items, SideInfo.of(self.ds), self.users, self.hist, self.test
        )


def _world(config: AugmentBenchConfig) -> _World:
    ds = load_dataset(config.data)
    past, future = timeline_split(ds.interactions, fraction=config.future_fraction)
    test = future[future["rating"] >= config.positive_rating]
    test_by = {
        str(u): set(g["item_id"].astype(str)) for u, g in test.groupby("user_id", observed=True)
    }
    past_by = {
        str(u): g["item_id"].astype(str).tolist() for u, g in past.groupby("user_id", observed=True)
    }
    eligible = sorted(u for u, t in test_by.items() if len(t) >= config.min_future and u in past_by)
    users = sample_users(eligible, config.users, config.seed)
    items = ds.items["item_id"].astype(str).tolist()
    # candidate generator and sigma source: CF on positive past interactions
    cf = calibrated_cf(
        config.cf,
        past[past["rating"] >= config.positive_rating],
        items,
        config.seed,
        SideInfo.of(ds),
    )
    hist = {u: past_by[u] for u in users}
    cands = {u: cf.recommend(hist[u], config.candidates) for u in users}
    return _World(ds, past, users, hist, {u: test_by[u] for u in users}, cands, items, cf)


def _judge_choices(
    config: AugmentBenchConfig, w: _World, llm: LLMBackend, out: Path, progress: bool
) -> tuple[dict[str, dict[str, list[str]]], dict[str, Any]]:
    """Per LLM method, the pseudo-positives ``recjudge.evaluators.augment`` adds (the top-M
    YES by p_yes, then log-odds, among the candidates; a NO is never added), read back from
    the dataset folder it writes under ``out/augment/<method>``. The store is filled first for every
    method together, user by user, so the methods that differ only in their bias share one
    decoding pass per candidate (``judge_per_user``); each ``augment`` then reads it back.

    Returns:
        The choices per method, and the judging cost: ``{"seconds", "judged_now",
        "requests", "passes", "per_second"}`` (LLM judgments made in this call, requests,
        decoding passes).
    """
    methods = [m for m in config.methods if m in LABELLING and m != "cf-only"]
    cost: dict[str, Any] = {"seconds": 0.0, "judged_now": 0, "requests": 0, "passes": 0,
                            "per_second": None}  # fmt: skip
    if not methods:
        return {}, cost
    t0 = time.time()
    llm = llm or config.judge_llm(config.model)
    past_ds = Dataset(w.ds.name, w.past, w.ds.items, w.ds.users, domain=w.ds.domain)
    run = RecRun(
        f"{config.cf} candidates",
        "(trained on the past)",
        w.cands,
        {u: [float(len(c) - r) for r in range(len(c))] for u, c in w.cands.items()},
        RunCheck(),
    )
    settings = [
        (m, m, item_item_for(w.cf, past_ds, seed=config.seed), config.beta)
        if m == "item-item"
        else m
        for m in methods
    ]
    chosen: dict[str, dict[str, list[str]]] = {}
    ecfg = EvalAugmentConfig(k=config.candidates, top_m=config.add)
    plan = augment_plan(past_ds, run, ecfg)
    with ResultsStore(out / "store.sqlite") as store:
        population = Population.of(past_ds) if set(methods) & set(SIMULATORS) else None
        judges = judges_for(config, llm, w.cf, settings, population)
        _, counts, passes, _ = judge_per_user(
            plan.requests, judges, store, progress, errors="record"
        )
        for m, judge in judges.items():
            folder = out / "augment" / m
            augment(judge, past_ds, run, ecfg, folder, store=store, plan=plan)
            inter = load_dataset(str(folder)).interactions
            added = inter[inter["source"] == "judge"]
            chosen[m] = {u: [] for u in w.users}
            for u, i in zip(
                added["user_id"].astype(str), added["item_id"].astype(str), strict=True
            ):
                chosen[m][u].append(i)
    seconds = time.time() - t0
    made = llm_made(judges, counts)
    cost = {
        "seconds": round(seconds, 1),
        **made,
        "passes": passes,
        "per_second": round(made["judged_now"] / seconds, 4) if seconds > 0 else None,
    }
    return chosen, cost


def _heuristic_choice(config: AugmentBenchConfig, w: _World, method: str, seed: int) -> dict:
    """What a non-LLM method adds per user (random and popularity rank; cf-only labels by
    sigma > 0 and adds its top-M by sigma)."""
    if method == "none":
        return {u: [] for u in w.users}
    if method == "random":
        return {
            u: [
                w.cands[u][i]
                for i in rng("augment-random", seed, u).permutation(len(w.cands[u]))[: config.add]
            ]
            for u in w.users
        }
    if method == "popularity":
        pop = w.past["item_id"].astype(str).value_counts()
        scores = {(u, i): float(pop.get(i, 0)) for u in w.users for i in w.cands[u]}
        return {u: choose(u, w.cands[u], scores, None, config.add) for u in w.users}
    scores = {(u, i): w.cf.sigma(w.hist[u], i, u) for u in w.users for i in w.cands[u]}
    positive = {k for k, v in scores.items() if v > 0}
    return {u: choose(u, w.cands[u], scores, positive, config.add) for u in w.users}


Runs = dict[str, dict[str, list[np.ndarray]]]  # per recommender and method, one array a seed


def _retrain_all(
    config: AugmentBenchConfig, w: _World, added: Mapping[tuple[int, str], dict], out: Path,
    progress: bool,
) -> tuple[Runs, Runs]:  # fmt: skip
    """Per recommender and method, one [users, METRICS] array per seed (``retrain_all``);
    ``added[(seed, method)]``: what the method adds per user under that seed.

    Returns:
        The runs, and for each recommender whose every retraining also kept its result
        scored from the other history (``kept_twins``), those runs.
    """
    data = w.retrain_data()
    # One recommender at a time: the cheap one (listed first) finishes before a long SASRec
    # run starts, so an interrupted run has kept every result of the former.
    keys = [(s, m) for s in range(config.seeds) for m in config.methods]
    runs: Runs = {}
    twins: Runs = {}
    for rec in config.retrain:
        jobs = [RetrainJob(rec, s, added[(s, m)], config.score_from) for s, m in keys]
        got = retrain_all(config, data, jobs, out / "retrain", config.workers, progress)
        other = kept_twins(config, data, jobs, out / "retrain")
        for n, (_, method) in enumerate(keys):
            runs.setdefault(rec, {}).setdefault(method, []).append(got[n])
            if other is not None:
                twins.setdefault(rec, {}).setdefault(method, []).append(other[n])
    return runs, twins


def _summary(runs: Runs) -> dict[str, Any]:
    """Per recommender, method and metric: the mean over users, then its mean and sd over
    seeds."""
    return {
        rec: {
            method: {
                k: {
                    "mean": float(np.mean([a[:, j].mean() for a in arrs])),
                    "sd": float(np.std([a[:, j].mean() for a in arrs], ddof=1))
                    if len(arrs) > 1
                    else 0.0,
                }
                for j, k in enumerate(METRICS)
            }
            for method, arrs in by_method.items()
        }
        for rec, by_method in runs.items()
    }


def _other_history(config: AugmentBenchConfig, runs: Runs, twins: Runs) -> dict[str, Any] | None:
    """The same trained models scored from the other history: their table, every method
    minus no augmentation, and per method this run's history minus the other (paired on
    seeds and users; one set of user resamples for all)."""
    if not twins:
        return None
    other = other_score_from(config.score_from)
    diff: dict[str, Any] = {}
    for rec, by_method in twins.items():
        idx = user_draws(by_method[config.methods[0]][0].shape[0], config.bootstrap, config.seed)
        diff[rec] = {
            m: paired_difference(
                {"this": runs[rec][m], "other": arrs}, "this", "other", METRICS, idx
            )
            for m, arrs in by_method.items()
            # a method that adds nothing is scored from the same history either way
            if not all(np.array_equal(a, b) for a, b in zip(arrs, runs[rec][m], strict=True))
        }
    return {
        "score_from": other,
        "table": _summary(twins),
        "paired": {
            rec: paired_comparisons(by_method, METRICS, config.bootstrap, config.seed)
            for rec, by_method in twins.items()
        },
        "this_minus_other": diff,
    }


def bench_brief_augment(
    config: AugmentBenchConfig,
    out: str | Path = "reports/brief-augment",
    llm: LLMBackend | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the augmentation experiment; write report.md, results.json and augment.png. The
    LLM methods label through ``recjudge.evaluators.augment`` (the code ``recjudge augment``
    runs; its dataset folders are under ``out/augment/<method>``); the judgments are kept in
    ``out/store.sqlite`` and each retraining's per-user metrics under ``out/retrain``, so an
    interrupted run resumes where it stopped."""
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    w = _world(config)
    judged, judging = _judge_choices(config, w, llm, out, progress)
    added_hits: dict[str, float] = {}
    added_count: dict[str, int] = {}
    # What each method adds per seed (the judges' labels do not depend on it).
    added_by = {
        (s, m): judged.get(m) or _heuristic_choice(config, w, m, s)
        for s in range(config.seeds)
        for m in config.methods
    }
    for method in config.methods:  # counted on seed 0's draw (the random method's)
        pairs = [(u, i) for u in w.users for i in added_by[(0, method)][u]]
        added_count[method] = len(pairs)
        added_hits[method] = sum(i in w.test[u] for u, i in pairs) / len(pairs) if pairs else 0.0
    t_retrain = time.time()
    runs, twins = _retrain_all(config, w, added_by, out, progress)
    t_retrain = time.time() - t_retrain
    table = _summary(runs)
    res_all = {
        "config": config.model_dump(),
        "users": w.users,
        "added_items_in_future_share": added_hits,
        "added_items": added_count,
        "table": table,
        "paired": {
            rec: paired_comparisons(by_method, METRICS, config.bootstrap, config.seed)
            for rec, by_method in runs.items()
        },
        "other_history": _other_history(config, runs, twins),
        "judging": judging,
        "retrain_seconds": round(t_retrain, 1),
        "wall_seconds": round(time.time() - t0, 1),
    }
    _plot(table, out / "augment.png", config)
    write_report(out, res_all, _report(config, res_all))
    return res_all


def _deviations_note(config: AugmentBenchConfig) -> str:
    """The protocol choices the paper's text (not readable here) may not share."""
    scored = (
        "trains on them and scores from them as the last items of the user's sequence"
        if config.score_from == "augmented"
        else "trains on them as the last items of the user's sequence but scores from the "
        "logged history alone (`score_from: logged`)"
    )
    notes = [
        "the added items carry the user's last training timestamp, so a sequential "
        f"recommender (SASRec) {scored} (the paper's placement could not be read)"
    ]
    if "sasrec" in config.retrain:
        notes.append(f"SASRec trained for {config.sasrec_epochs} epochs")
    left = [m for m in SIMULATOR_MODES if m not in config.methods]
    if left:
        notes.append(f"user-simulator baselines not run: {', '.join(left)}")
    return "Other deviations: " + "; ".join(notes) + "."


def _report(config: AugmentBenchConfig, r: Mapping[str, Any]) -> list[str]:
    lines = [
        f"# BRIEF training-data augmentation on {config.data} (Tables 4-5)",
        "",
        f"Judge decoding: {config.sampling_note()}.",
        "",
        _deviations_note(config),
        "",
        f"{len(r['users'])} augmented users; candidates = top-{config.candidates} of `{config.cf}` "
        f"(trained on past ratings >= {config.positive_rating}) minus seen; each method adds its "
        f"top-{config.add} per user as positives (a labelling method only among the candidates "
        "it labels positive: judge YES, ranked by p_yes and equal p_yes by the log-odds, which "
        "does not saturate at 1.0 under a strong bias; cf-only sigma > 0, ranked by sigma); "
        "retrained: "
        f"{', '.join(config.retrain)}; test = "
        f"the users' future items rated >= {config.positive_rating} (last "
        f"{int(config.future_fraction * 100)} % of each timeline); judge `{config.model}`, beta "
        f"{config.beta}; mean +- sd over {config.seeds} seeds.",
        "",
        _cost_note(r),
        "",
        "Items added (all users): " + ", ".join(f"{m} {n}" for m, n in r["added_items"].items()),
        "",
        "Share of added items that the user really consumed (and liked) later: "
        + ", ".join(f"{m} {100 * v:.1f} %" for m, v in r["added_items_in_future_share"].items()),
        "",
    ]
    for rec, by_method in r["table"].items():
        keys = list(next(iter(by_method.values())))
        lines += [
            f"## {rec}",
            "",
            "| method | " + " | ".join(keys) + " |",
            "|---|" + "---|" * len(keys),
        ]
        for m, v in by_method.items():
            lines.append(
                f"| {m} | "
                + " | ".join(f"{v[k]['mean']:.4f} +- {v[k]['sd']:.4f}" for k in keys)
                + " |"
            )
        lines.append("")
    for rec, paired in r.get("paired", {}).items():
        lines += _paired_lines(rec, paired)
    if r.get("other_history"):
        lines += _other_history_lines(config, r["other_history"])
    lines += ["![Recall@10 by method](augment.png)"]
    return lines


def _cost_note(r: Mapping[str, Any]) -> str:
    """The header's cost sentence: wall time, judging speed, retraining time."""
    j = r["judging"]
    return (
        f"Wall time {r['wall_seconds']} s: labelling {j['seconds']} s ({j['judged_now']} LLM "
        f"judgments made in this run for {j['requests']} requests, {j['per_second']} per "
        f"second, from {j['passes']} decoding passes; the rest were read from the store), "
        f"retraining {r['retrain_seconds']} s with {r['config'].get('workers', 1)} at once (a "
        "retraining finished before is read from `retrain/`)."
    )


def _ci(c: Mapping[str, Any]) -> str:
    return interval(None, c["lo"], c["hi"], nd=4, signed=True)


def _paired_lines(rec: str, paired: Mapping[str, Any], keys=("recall@10", "ndcg@10")) -> list:
    """The paired comparisons of one retrained recommender as two tables."""
    lines = []
    for key, title in (
        ("minus_none", "each method minus no augmentation"),
        ("brief_minus", "brief minus each other method"),
    ):
        rows = paired.get(key) or {}
        if not rows:
            continue
        lines += [
            f"### {rec}: {title} (paired on seeds and users; {paired['users']} users, "
            f"{paired['draws']} user resamples)",
            "",
            *_diff_table(rows, keys),
            "",
        ]
    return lines


def _diff_table(rows: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    """Per row, each metric's difference with its seed and user intervals, and the verdict
    on the first metric's user interval."""
    head = (
        "| method | "
        + " | ".join(f"{k} diff | seeds 95 % CI | users 95 % CI" for k in keys)
        + f" | {keys[0]} (users CI) |"
    )
    lines = [head, "|---|" + "---|---|---|" * len(keys) + "---|"]
    for m, cells in rows.items():
        parts = [
            f"{c['estimate']:+.4f} | {_ci(c['repeats'])} | {_ci(c['users'])}"
            for c in (cells[k] for k in keys)
        ]
        lines.append(f"| {m} | " + " | ".join(parts) + f" | {verdict(cells[keys[0]])} |")
    return lines


def _other_history_lines(config: AugmentBenchConfig, oh: Mapping[str, Any]) -> list[str]:
    """The report section on the same trained models scored from the other history."""
    other, keys = oh["score_from"], ("recall@10", "ndcg@10")
    lines = [
        f"## The same models scored from the {other} history",
        "",
        f"Every retraining above that adds items also scored the users from the {other} "
        f"history (`score_from: {other}`; this run's is `{config.score_from}`), so the two "
        "compare on the same trained models, seeds and users.",
        "",
    ]
    for rec, by_method in oh["table"].items():
        lines += [
            f"### {rec} scored from the {other} history",
            "",
            "| method | " + " | ".join(keys) + " |",
            "|---|" + "---|" * len(keys),
            *(
                f"| {m} | "
                + " | ".join(f"{v[k]['mean']:.4f} +- {v[k]['sd']:.4f}" for k in keys)
                + " |"
                for m, v in by_method.items()
            ),
            "",
            *_paired_lines(f"{rec} scored from the {other} history", oh["paired"][rec], keys),
        ]
        rows = oh["this_minus_other"].get(rec) or {}
        if rows:
            lines += [
                f"### {rec}: scored from the {config.score_from} minus the {other} history "
                "(paired on the same models and users)",
                "",
                *_diff_table(rows, keys),
                "",
            ]
    return lines


def _plot(table: Mapping[str, Any], path: Path, config: AugmentBenchConfig) -> None:
    recs = list(table)
    with figure(path, size=(6 * len(recs), 4.5), dpi=120, grid=(1, len(recs))) as axes:
        for ax, rec in zip(axes[0], recs, strict=True):
            methods = list(table[rec])
            vals = [table[rec][m]["recall@10"]["mean"] for m in methods]
            errs = [table[rec][m]["recall@10"]["sd"] for m in methods]
            ax.bar(methods, vals, yerr=errs, capsize=3, color="#4c72b0")
            ax.set_ylabel("Recall@10 on augmented users (mean +- sd)")
            ax.set_title(f"{rec} retrained on augmented data")
            ax.tick_params(axis="x", rotation=35)
