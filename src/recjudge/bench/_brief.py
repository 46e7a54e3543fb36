"""BRIEF experiments: rating correlation (Table 6), beta sweep (Figure 3).

Held-out pairs come from the last part of each sampled user's timeline; the judge sees the
user's earlier activity only. CF signals come from models trained on that earlier activity
(all of it, and positive interactions only, since a model of *watching* is not a model of
*liking*). Every judgment goes through the results store, so a rerun resumes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from pydantic import ConfigDict, Field, field_validator

from recjudge._stats import bootstrap_ci
from recjudge._util import path_component, rng, stable_hash
from recjudge.bench._brief_stats import auc, level_ci, setting_difference, spearman_or_none
from recjudge.bench._judging import (
    CF_MODES,
    SIMULATORS,
    JudgeSampling,
    judges_for,
)
from recjudge.cf_models import (
    CFModelError,
    ItemItemSimilarity,
    SideInfo,
    calibrated_cf,
    calibration_pairs,
    load_model,
)
from recjudge.data import (
    item_title,
    leave_one_out,
    load_dataset,
    render_item,
    sample_users,
    timeline_split,
)
from recjudge.reporting import figure, interval, write_report
from recjudge.reward import (
    JUDGES,
    MODES,
    HistoryItem,
    JudgeRequest,
    Population,
    ResultsStore,
    judge_per_user,
)
from recjudge.reward import LLM_MODES as _LLM_MODES

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

LLM_MODES = _LLM_MODES  # every mode an LLM answers (from the mode records)
ALL_MODES = MODES  # every judge mode, the simulators included


class BriefExperimentConfig(JudgeSampling):
    """Settings shared by the BRIEF experiments.

    Attributes:
        model: the judge LLM.
        data: dataset name.
        users: users sampled (sha256 order) among those with enough held-out ratings.
        per_level: most held-out pairs per rating level per user (levels are then balanced
            by subsampling every level to the rarest level's count).
        relevance_pairs: per user, this many held-out future items and as many random items
            the user never rated (the relevance form of the question).
        future_fraction: the last fraction of each timeline held out.
        min_past: users need at least this many earlier interactions.
        history_items: most recent earlier items shown to the judge.
        cf: the CF model giving sigma (``als``, ``bpr``, ``itemknn``, ...).
        positive_rating: rating threshold of the positive-only CF model (None: 4 on a 1-5
            scale, 8 on Book-Crossing's 1-10).
        sigma_source: CF model used for the beta sweep: ``positive`` or ``all``.
        beta: the bias strength of the main comparison.
        betas: the sweep.
        bootstrap: resamples for confidence intervals.
        seed: sampling and training seed.
        decode_rows: pairs decoded together in one engine call (speed and memory).
        modes: the rows of the ratings table (every judge mode and the user simulators).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "qwen2.5-coder-1.5b"
    data: str = "ml-1m"
    users: int = Field(30, ge=1)
    per_level: int = Field(1, ge=1)
    relevance_pairs: int = Field(2, ge=0)
    future_fraction: float = Field(0.2, gt=0, lt=1)
    min_past: int = Field(20, ge=2)
    history_items: int = Field(50, ge=1)
    cf: str = "als"
    positive_rating: float | None = None
    sigma_source: str = Field("positive", pattern="^(positive|all)$")
    beta: float = Field(25.0, ge=0)
    betas: tuple[float, ...] = (0, 5, 10, 15, 20, 25, 30, 35, 40)
    bootstrap: int = Field(1000, ge=0)
    seed: int = 0
    decode_rows: int = Field(8, ge=1)
    modes: tuple[str, ...] = ALL_MODES

    @field_validator("modes")
    @classmethod
    def _known_modes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for m in v:
            JUDGES.get(m)  # an unknown mode is an error with a did-you-mean
        return v


def rating_level(rating: float, scale_max: float) -> int:
    """Ratings on 1-5 stay; on a 1-10 scale two points make one level (ceil(r / 2))."""
    return int(rating) if scale_max <= 5 else int(np.ceil(rating / 2))


# -- statistics (pure) ------------------------------------------------------------------------
def level_table(levels: Sequence[int], positive: Sequence[float]) -> dict[int, float]:
    """Percentage of positive rewards per rating level (``positive``: a verdict per pair, or
    the share of YES samples per pair)."""
    out: dict[int, float] = {}
    lv, pos = np.asarray(levels), np.asarray(positive, dtype=float)
    for v in sorted(set(lv.tolist())):
        out[int(v)] = float(100 * pos[lv == v].mean())
    return out


def level_correlations(table: Mapping[int, float]) -> dict[str, float | None]:
    """Spearman rho and Kendall tau between rating level and % positive (as BRIEF's Table 6,
    n = number of levels)."""
    from scipy.stats import kendalltau, spearmanr

    x, y = list(table), list(table.values())
    if len(x) < 3 or len(set(y)) < 2:
        return {"spearman": None, "kendall": None}
    return {
        "spearman": float(spearmanr(x, y).statistic),
        "kendall": float(kendalltau(x, y).statistic),
    }


def spearman_ci(
    x: Sequence[float], y: Sequence[float], bootstrap: int, seed: Any
) -> dict[str, float | None]:
    """Per-pair Spearman rho with a percentile bootstrap 95 % CI (resampling pairs)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = spearman_or_none(x, y)
    if rho is None:
        return {"rho": None, "lo": None, "hi": None, "n": int(len(x))}
    g = rng("spearman-ci", seed)
    boots = []
    for _ in range(bootstrap):
        i = g.integers(len(x), size=len(x))
        if (b := spearman_or_none(x[i], y[i])) is not None:
            boots.append(b)
    lo, hi = bootstrap_ci(boots)
    return {"rho": rho, "lo": lo, "hi": hi, "n": int(len(x))}


def auc_ci(
    pos: Sequence[float], neg: Sequence[float], bootstrap: int, seed: Any
) -> dict[str, float | None]:
    """AUC with a percentile bootstrap 95 % CI (positives and negatives resampled apart)."""
    a = auc(pos, neg)
    if a is None:
        return {"auc": None, "lo": None, "hi": None}
    p, n = np.asarray(pos, float), np.asarray(neg, float)
    g = rng("auc-ci", seed)
    boots = [
        auc(p[g.integers(len(p), size=len(p))], n[g.integers(len(n), size=len(n))])
        for _ in range(bootstrap)
    ]
    lo, hi = bootstrap_ci(boots)
    return {"auc": a, "lo": lo, "hi": hi}


# -- preparation --------------------------------------------------------------------------------
def item_texts(ds: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(prompt text, citable title) per item id."""
    rows = ds.items.set_index(ds.items["item_id"].astype(str)).to_dict("index")
    return (
        {i: render_item(r, ds.domain) for i, r in rows.items()},
        {i: item_title(r) for i, r in rows.items()},
    )


def history_of(rows: Any, text: Mapping[str, str], titles: Mapping[str, str]) -> list[Any]:
    """HistoryItems of interaction rows (ratings of 0, i.e. implicit, are not shown)."""
    return [
        HistoryItem(str(i), titles[str(i)], text[str(i)], float(r) if r > 0 else None)
        for i, r in zip(rows["item_id"], rows["rating"], strict=True)
    ]


def candidate_requests(
    ds: Any,
    past_by: Mapping[str, Any],
    candidates: Mapping[str, Sequence[str]],
    history_items: int,
) -> list[Any]:
    """One JudgeRequest per (user, candidate), the history being the user's most recent
    ``history_items`` past interactions."""
    text, titles = item_texts(ds)
    reqs = []
    for u, cands in candidates.items():
        history = history_of(past_by[u].tail(history_items), text, titles)
        reqs += [JudgeRequest(u, history, i, text[i], titles[i], domain=ds.domain) for i in cands]
    return reqs


def _requests(config: BriefExperimentConfig, ds: Any) -> tuple[list[Any], dict[str, Any]]:
    """Held-out rating pairs and relevance pairs for the sampled users, as JudgeRequests."""
    inter = ds.interactions
    explicit = inter[inter["rating"] > 0] if ds.name.startswith("bookcrossing") else inter
    scale_max = float(explicit["rating"].max())
    past, future = timeline_split(inter, fraction=config.future_fraction)
    future = future[future["rating"] > 0] if ds.name.startswith("bookcrossing") else future
    n_past = past.groupby("user_id", observed=True).size()
    n_fut = future.groupby("user_id", observed=True).size()
    eligible = sorted(
        str(u) for u in n_fut.index if n_fut[u] >= 3 and n_past.get(u, 0) >= config.min_past
    )
    users = sample_users(eligible, config.users, config.seed)
    text, titles = item_texts(ds)
    all_items = sorted(text)
    past_by = {str(u): g for u, g in past.groupby("user_id", observed=True)}
    fut_by = {str(u): g for u, g in future.groupby("user_id", observed=True)}
    rated = {
        str(u): set(g["item_id"].astype(str)) for u, g in inter.groupby("user_id", observed=True)
    }
    reqs, by_level = [], {}
    for u in users:
        history = history_of(past_by[u].tail(config.history_items), text, titles)

        def req(item: str, meta: dict[str, Any], u: str = u, history: list = history) -> Any:
            return JudgeRequest(
                u, history, item, text[item], titles[item], domain=ds.domain, meta=meta
            )

        f = fut_by[u]
        g = rng("brief-heldout", config.seed, u)
        for lvl in range(1, 6):
            cand = [
                str(i)
                for i, r in zip(f["item_id"], f["rating"], strict=True)
                if r > 0 and rating_level(r, scale_max) == lvl
            ]
            for i in g.permutation(len(cand))[: config.per_level]:
                by_level.setdefault(lvl, []).append(
                    req(
                        cand[i],
                        {
                            "kind": "rating",
                            "level": lvl,
                            "rating": float(
                                f.loc[f["item_id"].astype(str) == cand[i], "rating"].iloc[0]
                            ),
                        },
                    )
                )
        first = [str(i) for i in f["item_id"]][: config.relevance_pairs]
        for i in first:
            reqs.append(req(i, {"kind": "relevance", "label": 1}))
        k = 0
        while k < len(first):
            c = all_items[int(g.integers(len(all_items)))]
            if c not in rated[u]:
                reqs.append(req(c, {"kind": "relevance", "label": 0}))
                k += 1
    # balance: every level subsampled to the rarest level's count
    counts = {lvl: len(v) for lvl, v in by_level.items()}
    keep = min(counts.values()) if counts else 0
    g = rng("brief-balance", config.seed)
    for lvl in sorted(by_level):
        v = by_level[lvl]
        reqs += [v[i] for i in sorted(g.permutation(len(v))[:keep])]
    info = {
        "users": users,
        "scale_max": scale_max,
        "level_counts_before_balance": counts,
        "pairs_per_level": keep,
        "relevance_pairs": sum(r.meta["kind"] == "relevance" for r in reqs),
        "past_interactions": int(len(past)),
    }
    return reqs, info | {"past": past}


def _train_sigma_models(
    config: BriefExperimentConfig, ds: Any, past: Any, folder: Path | None = None
) -> dict[str, dict[str, Any]]:
    """Per source (all / positive): the CF model and its item-item companion, trained on the
    earlier activity, sigma calibrated on its own leave-one-out validation items.

    With ``folder`` (the run's), both are saved under ``folder/cf`` keyed by what they were
    trained on and loaded by a resumed run instead of trained again (Book-Crossing's took
    ~24 CPU minutes of each restart of a 450-user run)."""
    scale_max = float(ds.interactions["rating"].max())
    pos = config.positive_rating or (4.0 if scale_max <= 5 else 8.0)
    out = {}
    items = ds.items["item_id"].astype(str).tolist()
    for source, min_rating in (("all", None), ("positive", pos)):
        df = past if min_rating is None else past[past["rating"] >= min_rating]
        saved = None if folder is None else _sigma_folder(folder, config, source, df, items)
        if saved is not None:
            try:
                model, ii = load_model(saved / "cf"), load_model(saved / "item-item")
                out[source] = {"cf": model, "item-item": ii, "min_rating": min_rating}
                continue
            except (FileNotFoundError, CFModelError):
                pass  # not saved yet, or half written: train
        model = calibrated_cf(config.cf, df, items, config.seed, SideInfo.of(ds))
        model.train_info["source"] = source
        split = leave_one_out(df)
        hs, cs, us = calibration_pairs(split.train, split.valid, model.items, config.seed)
        ii = ItemItemSimilarity.from_model(model)
        ii.train_info["source"] = source
        ii.calibrate(hs, cs, us)
        if saved is not None:
            model.save(saved / "cf")
            ii.save(saved / "item-item")
        out[source] = {"cf": model, "item-item": ii, "min_rating": min_rating}
    return out


def _sigma_folder(
    folder: Path, config: BriefExperimentConfig, source: str, df: Any, items: Sequence[str]
) -> Path:
    """Where one source's sigma models are saved: keyed by the CF model, the seed and the
    content of the interactions and item list they were trained on."""
    cols = df[["user_id", "item_id", "rating"]].astype(str)
    content = int(pd.util.hash_pandas_object(cols, index=False).sum())
    tag = stable_hash(config.cf, config.seed, source, len(df), content, list(items), length=12)
    return folder / "cf" / f"{path_component(config.cf)}-{path_component(source)}-{tag}"


def _settings(cf: Mapping[str, Any], named: Sequence[tuple[str, str, str, float]]) -> list[tuple]:
    """(name, mode, source, beta) -> (name, mode, CF model of that source, beta)."""
    out = []
    for name, mode, source, beta in named:
        model = cf[source]["item-item" if mode == "item-item" else "cf"] if source in cf else None
        out.append((name, mode, model, beta))
    return out


def _analyse(
    reqs: Sequence[Any], results: Mapping[str, Sequence[Any]], config: BriefExperimentConfig
) -> dict[str, Any]:
    rating_idx = [i for i, r in enumerate(reqs) if r.meta["kind"] == "rating"]
    levels = [reqs[i].meta["level"] for i in rating_idx]
    ratings, labels = _targets(reqs)
    # Sampled: the share of YES samples (the paper's % positive over samples).
    sampled = config.sampled
    out = {}
    for name, js in results.items():
        positive = [js[i].p_yes if sampled else float(js[i].is_relevant) for i in rating_idx]
        table = level_table(levels, positive)
        score = _scores(reqs, js, sampled)
        pos = [x for x, lab in zip(score["relevance"], labels, strict=True) if lab == 1]
        neg = [x for x, lab in zip(score["relevance"], labels, strict=True) if lab == 0]
        out[name] = {
            "pct_positive_by_level": table,
            "pct_positive_ci": level_ci(levels, positive, config.bootstrap, (config.seed, name)),
            **level_correlations(table),
            "pair_spearman": spearman_ci(
                score["rating"], ratings, config.bootstrap, (config.seed, name)
            ),
            "relevance_auc": auc_ci(pos, neg, config.bootstrap, (config.seed, name)),
            "mean_p_yes": float(np.mean([js[i].p_yes for i in rating_idx])) if rating_idx else None,
        }
    return out


def paired_against_brief(
    reqs: Sequence[Any],
    results: Mapping[str, Sequence[Any]],
    settings: Sequence[tuple[str, str, str, float]],
    config: BriefExperimentConfig,
) -> dict[str, dict[str, Any]]:
    """Each BRIEF row minus every other row that shares its sigma source (or has none), and
    minus the BRIEF row of the other source: ``setting_difference`` on the same pairs.
    ``settings``: the rows as ``(name, mode, source, beta)``, source ``"-"`` for none.

    Returns:
        ``{"brief [cf:all] - zero-shot": {"pair_spearman": {...}, "relevance_auc": {...}}}``.
    """
    ratings, labels = _targets(reqs)
    sampled = config.sampled
    out: dict[str, dict[str, Any]] = {}
    briefs = [(n, src) for n, mode, src, _ in settings if mode == "brief"]
    for k, (ref, ref_src) in enumerate(briefs):
        for other, mode, src, _ in settings:
            if mode == "brief":  # each pair of BRIEF rows once
                if [b for b, _ in briefs].index(other) <= k:
                    continue
            elif src not in ("-", ref_src):
                continue
            out[f"{ref} - {other}"] = setting_difference(
                _scores(reqs, results[ref], sampled), _scores(reqs, results[other], sampled),
                ratings, labels,
                config.bootstrap, (config.seed, ref, other),
            )  # fmt: skip
    return out


def _targets(reqs: Sequence[Any]) -> tuple[list[float], list[int]]:
    """The rating of each rating pair and the label of each relevance pair, in order."""
    ratings = [r.meta["rating"] for r in reqs if r.meta["kind"] == "rating"]
    labels = [r.meta["label"] for r in reqs if r.meta["kind"] == "relevance"]
    return ratings, labels


def _rank_score(j: Any, sampled: bool) -> float:
    """What the rank statistics (pair Spearman, relevance AUC) order a judgment by: p_yes's
    order. Greedy: the log-odds, because under a strong bias p_yes is exactly 0.0 or 1.0 in
    float64 for many pairs (13 % of brief's at beta 25) and those would tie; it orders as
    p_yes wherever p_yes is not saturated. Sampled: p_yes, the share of YES samples."""
    return float(j.p_yes) if sampled else j.log_odds


def _scores(reqs: Sequence[Any], js: Sequence[Any], sampled: bool) -> dict[str, list[float]]:
    """The rank scores of the rating pairs and of the relevance pairs (``setting_difference``'s
    input)."""
    return {
        kind: [_rank_score(j, sampled) for r, j in zip(reqs, js, strict=True)
               if r.meta["kind"] == kind]
        for kind in ("rating", "relevance")
    }  # fmt: skip


def beta_optimum(
    reqs: Sequence[Any],
    results: Mapping[str, Sequence[Any]],
    analysis: Mapping[str, Any],
    config: BriefExperimentConfig,
) -> dict[str, Any]:
    """Where the beta sweep peaks, per measure (pair Spearman, relevance AUC; ties go to the
    smaller beta), and that beta against beta 0 (the LLM alone) by a paired bootstrap on the
    same pairs (``setting_difference``).

    Returns:
        ``{"pair_spearman": {"beta", "value", "vs_beta0"}, "relevance_auc": {...}}``;
        ``vs_beta0`` is None when the best beta is 0 or 0 is not in the sweep.
    """
    ratings, labels = _targets(reqs)
    sampled = config.sampled
    zero = next((n for n in analysis if _beta_of(n) == 0), None)
    out: dict[str, Any] = {}
    for measure, field in (("pair_spearman", "rho"), ("relevance_auc", "auc")):
        values = [(a[measure][field], n) for n, a in analysis.items()]
        values = [(v, n) for v, n in values if v is not None]
        if not values:
            out[measure] = {"beta": None, "value": None, "vs_beta0": None}
            continue
        best_v = max(v for v, _ in values)
        name = min((n for v, n in values if v == best_v), key=_beta_of)
        vs = None
        if zero is not None and name != zero:
            vs = setting_difference(
                _scores(reqs, results[name], sampled), _scores(reqs, results[zero], sampled),
                ratings, labels,
                config.bootstrap, (config.seed, name, zero),
            )[measure]  # fmt: skip
        out[measure] = {"beta": _beta_of(name), "value": best_v, "vs_beta0": vs}
    return out


def _beta_of(name: str) -> float:
    """The beta of a sweep setting's name (``beta=25`` -> 25.0; ``bench_brief_beta``)."""
    return float(name.split("=")[1])


def _diff_cell(d: Mapping[str, Any] | None) -> str:
    """A paired difference as ``+0.123 [+0.01, +0.2] (p 0.010) *`` (* : the CI excludes 0)."""
    if d is None or d["diff"] is None or d["lo"] is None:
        return "-"
    star = " *" if d["lo"] > 0 or d["hi"] < 0 else ""
    return f"{interval(d['diff'], d['lo'], d['hi'], signed=True)} (p {d['p']:.3f}){star}"


def _paired_lines(paired: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The paired comparison as a markdown table (a CI that excludes 0 is marked)."""
    lines = [
        "## BRIEF against each other setting (paired bootstrap on the same pairs)",
        "",
        "Difference = BRIEF minus the other setting; * marks a 95 % CI that excludes 0.",
        "",
        "| comparison | pair Spearman difference [95 % CI] | relevance AUC difference [95 % CI] |",
        "|---|---|---|",
    ]
    for name, d in paired.items():
        lines.append(
            f"| {name} | {_diff_cell(d['pair_spearman'])} | {_diff_cell(d['relevance_auc'])} |"
        )
    return lines


def _fmt(v: Any, nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


@dataclass
class _Judged:
    """What ``_run`` produced: the held-out pairs and every setting's judgments, analysed.

    ``judged_now`` counts the LLM judgments made in this call, ``llm_judgments`` the LLM
    settings' requests (some read from the store, some repeated): judgments per second uses
    the former. ``passes``: the LLM decoding passes that made them (one pass decides every
    bias setting of a request, ``reward.judge_sweep``).
    """

    info: dict[str, Any]
    cf: dict[str, Any]
    analysis: dict[str, Any]
    reqs: list[Any]
    results: dict[str, list[Any]]
    judged_now: int
    llm_judgments: int
    passes: int
    replayed: int = 0


def _run(
    config: BriefExperimentConfig,
    out: Path,
    llm: LLMBackend,
    progress: bool,
    named: Any,
) -> _Judged:
    """Shared by the ratings and beta experiments: build the held-out requests, train the
    sigma models, judge every request under each ``(name, mode, source, beta)`` setting
    (through ``out/store.sqlite``) and analyse."""
    out.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(config.data)
    reqs, info = _requests(config, ds)
    past = info.pop("past")
    cf = _train_sigma_models(config, ds, past, out)
    llm = llm or config.judge_llm(config.model)
    # bf16 and fp32 round differently (the dtype "auto" picks by CPU): the header says which.
    info["dtype"] = llm.config.resolved_dtype() if hasattr(llm, "config") else None
    # The simulators' traits and item means come from the past only, like sigma.
    population = Population.of(ds, past) if any(s[1] in SIMULATORS for s in named) else None
    judges = judges_for(config, llm, None, _settings(cf, named), population)
    with ResultsStore(out / "store.sqlite") as store:
        results, counts, passes, replayed = judge_per_user(reqs, judges, store, progress)
    # cf-only reads sigma, no LLM: its rows are not judgments of the model.
    llm_names = [name for name, mode, _, _ in named if mode != "cf-only"]
    return _Judged(
        info, cf, _analyse(reqs, results, config), list(reqs), results,
        sum(counts[n]["new"] for n in llm_names), sum(counts[n]["total"] for n in llm_names),
        passes, replayed,
    )  # fmt: skip


def _speed_note(res: Mapping[str, Any]) -> str:
    """The header's speed sentence (one wording for the ratings and beta reports)."""
    return (
        f"{res['judged_now']} LLM judgments made in this run for {res['llm_judgments']} "
        f"requests ({res['judgments_per_second']} per second) from {res['decoding_passes']} "
        f"decoding passes and {res['replayed_requests']} requests replayed from stored decision "
        "records without the model (the settings that differ only in their bias are decided "
        "from one pass per pair); the others were read from the store or repeat a request (a "
        "held-out item can be both a rating and a relevance pair)."
    )


def _speed(j: _Judged, wall: float) -> dict[str, Any]:
    """Judgments made now, from the store, and per second of this call's wall time."""
    return {
        "llm_judgments": j.llm_judgments,
        "judged_now": j.judged_now,
        "judgments_per_second": round(j.judged_now / wall, 4) if wall > 0 else None,
        "decoding_passes": j.passes,
        "replayed_requests": j.replayed,
    }


def bench_brief_ratings(
    config: BriefExperimentConfig,
    out: str | Path = "reports/brief-ratings",
    llm: LLMBackend | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """BRIEF Table 6 on held-out ratings, plus the relevance AUC, for every mode and both CF
    sources; writes report.md, results.json and ratings.png under ``out``."""
    t0 = time.time()
    out = Path(out)
    settings = []
    for mode in config.modes:
        for source in ("all", "positive") if mode in CF_MODES else ("-",):
            name = mode if source == "-" else f"{mode} [cf:{source}]"
            settings.append((name, mode, source, config.beta))
    j = _run(config, out, llm, progress, settings)
    paired = paired_against_brief(j.reqs, j.results, settings, config)
    wall = time.time() - t0
    res = {
        "config": config.model_dump(),
        **j.info,
        "cf": {s: dict(v["cf"].train_info) for s, v in j.cf.items()},
        "wall_seconds": round(wall, 1),
        **_speed(j, wall),
        "modes": j.analysis,
        "paired_vs_brief": paired,
    }
    _plot_levels(j.analysis, out / "ratings.png", config)
    write_report(out, res, _ratings_lines(config, res, j) + [""] + _paired_lines(paired))
    return res


def _ratings_lines(config: BriefExperimentConfig, res: Mapping[str, Any], j: _Judged) -> list[str]:
    """The ratings report above the paired comparison: header, table, per-level CIs."""
    info, cf, analysis = j.info, j.cf, j.analysis
    lines = [
        f"# BRIEF rating correlation on {config.data} (Table 6)",
        "",
        f"Judge `{config.model}` ({info.get('dtype') or 'dtype unknown'}), beta {config.beta}, "
        f"CF `{config.cf}` trained on the earlier "
        f"{int((1 - config.future_fraction) * 100)} % of each timeline (all ratings, or only "
        f"ratings >= {cf['positive']['min_rating']}); {len(info['users'])} users, "
        f"{info['pairs_per_level']} held-out pairs per rating level (balanced), "
        f"{info['relevance_pairs']} relevance pairs (held-out future item vs. never-rated item, "
        f"1:1); {config.history_items} history items shown; {config.sampling_note()}; "
        f"bootstrap {config.bootstrap}; seed {config.seed}. Wall time {res['wall_seconds']} s; "
        f"{_speed_note(res)}",
        "",
        "| mode | % positive at level 1..5 | rho (levels) | tau (levels) | pair Spearman "
        "[95 % CI] | relevance AUC [95 % CI] | mean p_yes |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, a in analysis.items():
        pct = " / ".join(f"{v:.0f}" for v in a["pct_positive_by_level"].values())
        ps, ra = a["pair_spearman"], a["relevance_auc"]
        lines.append(
            f"| {name} | {pct} | {_fmt(a['spearman'])} | {_fmt(a['kendall'])} | "
            f"{interval(ps['rho'], ps['lo'], ps['hi'])} | "
            f"{interval(ra['auc'], ra['lo'], ra['hi'])} | {_fmt(a['mean_p_yes'])} |"
        )
    lines += [
        "",
        "rho/tau use the 5 level percentages (n = 5, as the paper); the pair Spearman and the "
        "relevance AUC order pairs by p_yes (greedy: by its log-odds, the same order without "
        "the ties of p_yes saturated at exactly 0 or 1 under a strong bias). cf-only's p_yes is "
        "(sigma + 1) / 2.",
        "",
        "% positive per level with a 95 % bootstrap CI (pairs of the level resampled):",
        "",
        "| mode | " + " | ".join(f"level {lvl}" for lvl in range(1, 6)) + " |",
        "|---|" + "---|" * 5,
    ]
    for name, a in analysis.items():
        ci = a["pct_positive_ci"]
        cells = [
            interval(ci[lvl]["pct"], ci[lvl]["lo"], ci[lvl]["hi"], nd=0) if lvl in ci else "-"
            for lvl in range(1, 6)
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "![positive rate by rating level](ratings.png)"]
    return lines


def bench_brief_beta(
    config: BriefExperimentConfig,
    out: str | Path = "reports/brief-beta",
    llm: LLMBackend | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """BRIEF Figure 3: Spearman (and relevance AUC) against beta for the brief judge."""
    t0 = time.time()
    out = Path(out)
    settings = [(f"beta={b:g}", "brief", config.sigma_source, float(b)) for b in config.betas]
    j = _run(config, out, llm, progress, settings)
    info, analysis = j.info, j.analysis
    wall = time.time() - t0
    res = {
        "config": config.model_dump(),
        **info,
        "wall_seconds": round(wall, 1),
        **_speed(j, wall),
        "betas": dict(analysis),
    }
    res["optimum"] = beta_optimum(j.reqs, j.results, analysis, config)
    _plot_beta(config, analysis, out / "beta.png")
    lines = [
        f"# BRIEF beta sweep on {config.data} (Figure 3)",
        "",
        f"Judge `{config.model}` ({info.get('dtype') or 'dtype unknown'}) in brief mode, "
        f"sigma from `{config.cf}` "
        f"[{config.sigma_source}]; {len(info['users'])} users, {info['pairs_per_level']} pairs "
        f"per rating level, {info['relevance_pairs']} relevance pairs; {config.sampling_note()};"
        f" seed {config.seed}. Wall time {res['wall_seconds']} s; {_speed_note(res)}",
        "",
        "| beta | rho (levels) | tau (levels) | pair Spearman [95 % CI] | relevance AUC [95 % CI] "
        "| % positive |",
        "|---|---|---|---|---|---|",
    ]
    for name, a in analysis.items():
        ps, ra = a["pair_spearman"], a["relevance_auc"]
        allpos = np.mean(list(a["pct_positive_by_level"].values()))
        lines.append(
            f"| {_beta_of(name):g} | {_fmt(a['spearman'])} | {_fmt(a['kendall'])} | "
            f"{interval(ps['rho'], ps['lo'], ps['hi'])} | "
            f"{interval(ra['auc'], ra['lo'], ra['hi'])} | {allpos:.1f} |"
        )
    lines += ["", *_optimum_lines(res["optimum"])]
    lines += [
        "",
        "Left panel as the paper's Figure 3: Spearman rho and Kendall tau between the rating "
        "level and the % of positive rewards at that level (n = 5 levels). Right: per-pair "
        "measures (Spearman of p_yes, greedy: of its log-odds, with the rating, 95 % CI; "
        "relevance AUC - 0.5).",
        "",
        "![rho and tau vs beta](beta.png)",
    ]
    write_report(out, res, lines)
    return res


def _optimum_lines(opt: Mapping[str, Any]) -> list[str]:
    """Where the sweep peaks, and the peak against beta 0 on the same pairs."""
    lines = [
        "**Optimum** (ties go to the smaller beta; against beta 0, the LLM alone, by a paired "
        "bootstrap on the same pairs; * marks a 95 % CI that excludes 0):",
        "",
    ]
    for measure, label in (("pair_spearman", "pair Spearman"), ("relevance_auc", "relevance AUC")):
        o = opt[measure]
        if o["beta"] is None:
            lines.append(f"- {label}: undefined at every beta")
            continue
        vs = "beta 0 is the best" if o["vs_beta0"] is None else (
            f"minus beta 0: {_diff_cell(o['vs_beta0'])}")  # fmt: skip
        lines.append(f"- {label}: highest at beta {o['beta']:g} ({o['value']:.3f}); {vs}")
    return lines


def _plot_levels(analysis: Mapping[str, Any], path: Path, config: BriefExperimentConfig) -> None:
    with figure(path, size=(9, 5), dpi=120) as ax:
        n = len(analysis)
        for k, (name, a) in enumerate(analysis.items()):
            t = a["pct_positive_by_level"]
            dx = (k - (n - 1) / 2) * 0.025  # small offsets so identical lines stay visible
            style = "-" if k < 10 else "--"
            ax.plot([x + dx for x in t], list(t.values()), style, marker="o", ms=4, label=name)
        ax.set_xlabel("rating level")
        ax.set_ylabel("% positive rewards")
        ax.set_xticks([1, 2, 3, 4, 5])
        ax.set_ylim(-2, 102)
        ax.set_title(f"Positive rewards by held-out rating ({config.model}, {config.data})")
        ax.legend(fontsize=7, ncol=2)


def _plot_beta(config: BriefExperimentConfig, analysis: Mapping[str, Any], path: Path) -> None:
    """Figure 3: level rho and tau against beta; per-pair measures in a second panel."""

    def nan(values: Sequence[float | None]) -> list[float]:
        return [np.nan if v is None else v for v in values]

    betas = [_beta_of(n) for n in analysis]
    a = list(analysis.values())
    with figure(path, size=(11, 4.5), dpi=120, grid=(1, 2), sharex=True) as _axes:
        left, right = _axes[0]
        left.plot(betas, nan([x["spearman"] for x in a]), marker="o", label="Spearman rho (levels)")
        left.plot(betas, nan([x["kendall"] for x in a]), marker="s", label="Kendall tau (levels)")
        left.set_title("Figure 3: rating level vs % positive")
        left.set_ylabel("correlation")
        rho = nan([x["pair_spearman"]["rho"] for x in a])
        lo, hi = (
            nan([x["pair_spearman"]["lo"] for x in a]),
            nan([x["pair_spearman"]["hi"] for x in a]),
        )
        right.plot(betas, rho, marker="o", label="pair Spearman")
        if not np.isnan(lo + hi).any():
            right.fill_between(betas, lo, hi, alpha=0.2, label="95 % CI")
        aucs = [x["relevance_auc"]["auc"] for x in a]
        right.plot(
            betas,
            nan([None if v is None else v - 0.5 for v in aucs]),
            marker="s",
            label="relevance AUC - 0.5",
        )
        right.set_title("per-pair measures")
        for ax in (left, right):
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xlabel("beta")
            ax.legend(fontsize=8)
        left.figure.suptitle(f"BRIEF beta sweep ({config.model}, {config.data})")
