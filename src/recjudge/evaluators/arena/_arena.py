"""RecSys Arena: pairwise LLM judging of recommenders (after "RecSys Arena: Pair-wise
Recommender System Evaluation with Large Language Models", Wu et al., 2024).

The paper's protocol is the default (``design="reference"``): every system is compared with
one reference system once per user, the system under test in position A and the reference in
position B (Table 2: "RS = A and FM = B"; the official script's ``--rec_a`` is the tested
system, ``--rec_b`` FM); Q per system against the reference is the paper's Table 2.
``reference_position="A"`` swaps them (not the paper's). Our controls are options, each named
in the report header:
``both_orders`` also judges the swapped order and reports both swap rules side by side, and
``design="round-robin"`` judges every pair in both orders.

This module is the pipeline: prompts in ``_arena_prompts``, aggregates in
``_arena_metrics``, systems and offline metrics in ``_arena_systems``, the report in
``_arena_report``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from recjudge._registry import suggest
from recjudge.data import leave_one_out, load_dataset, render_item, sample_users
from recjudge.decoding import Choice, Verdicts
from recjudge.evaluators.arena._metrics import (
    ASPECTS,
    OPTIONS,
    SWAP_RULES,
    correlations,
    order_stats,
    position_shares,
    reference_q,
    reference_q_ci,
    summarize,
    swap_rule_records,
)
from recjudge.evaluators.arena._prompts import (
    ABSOLUTE,
    ABSOLUTE_SCORE,
    ARENA_PROMPT_VERSION,
    absolute_messages,
    arena_messages,
    user_profile,
)
from recjudge.evaluators.arena._report import arena_report, plot_winrates
from recjudge.evaluators.arena._systems import build_systems, offline_metrics
from recjudge.llm import SamplingConfig, former_llm_settings_of, llm_settings_of, load_llm
from recjudge.reporting import write_report
from recjudge.reward import (
    ResultsStore,
    StoredAsk,
    adopt_former,
    ask_key,
    ask_stored,
    default_result,
)

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

DOMAIN_WORD = {"movies": "movies", "books": "books"}


def check_systems(names: Sequence[str], reference: str | None) -> None:
    """The compared systems' names: distinct, at least two, and ``reference`` (when given)
    one of them ("did you mean" otherwise). Raises ValueError."""
    if len(set(names)) != len(names):
        raise ValueError(f"systems: a name is listed twice in {list(names)}")
    if len(names) < 2:
        raise ValueError("systems: at least two systems are needed to compare")
    if reference is not None and reference not in names:
        close = suggest(reference, list(names))
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"reference {reference!r} is not one of the systems {list(names)}{hint}")


class ArenaConfig(BaseModel):
    """Arena settings. Defaults are the paper's protocol.

    Attributes:
        model: the judge LLM.
        systems: recommenders under test (CF model names, or ``name=path`` list files).
        design: ``reference`` (the paper: each system vs ``reference``) or ``round-robin``
            (every pair, both orders; our extension).
        reference: the reference system's name (default: the first of ``systems``).
        reference_position: where the reference is shown: ``B`` (the paper: the system under
            test in A, the reference in B) or ``A``. With ``both_orders`` it names the order
            that is the headline.
        both_orders: with ``reference``, also judge the swapped order and report the swap
            rules ``tie`` and ``keep`` next to the paper's one-order result (a position-bias
            control; twice the judgments).
        users: users judged (sampled by sha256 of the id).
        k: list length shown to the judge (the paper: top 5).
        history_items: most recent liked items in the prompt (the paper: 5).
        history_min_rating: a history item is "liked" at this rating or above (the paper
            uses its positive label); ``None`` uses every interaction. A user with no liked
            item is shown their most recent interactions.
        analysis: ``per-aspect`` (the paper: a specific analysis for each aspect, then the
            verdicts) or ``joint`` (one analysis text).
        analysis_chars: bound on each analysis text (per aspect, or the joint one).
        swap_rule: round-robin only: ``tie`` (a verdict that flips with the order counts as
            a tie) or ``keep`` (both orders as separate records).
        bootstrap: Bradley-Terry bootstrap resamples.
        similarity: URD similarity, ``genre`` (Jaccard) or ``embedding`` (item cosine).
        absolute: also ask a 5-level absolute rating of each list (our extension).
        seed: user-sampling, CF-training and bootstrap seed.
        batch_size: judgments decoded together in one engine call (speed and memory).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "qwen2.5-coder-0.5b"
    systems: tuple[str, ...] = ("pop", "itemknn", "als", "sasrec")
    design: Literal["reference", "round-robin"] = "reference"
    reference: str | None = None
    reference_position: Literal["B", "A"] = "B"
    both_orders: bool = False
    users: int = Field(100, ge=1)
    k: int = Field(5, ge=1)
    history_items: int = Field(5, ge=1)
    history_min_rating: float | None = 4.0
    analysis: Literal["per-aspect", "joint"] = "per-aspect"
    analysis_chars: int = Field(150, ge=1)
    swap_rule: Literal["tie", "keep"] = "tie"
    bootstrap: int = Field(200, ge=0)
    similarity: Literal["genre", "embedding"] = "genre"
    absolute: bool = False
    seed: int = 0
    batch_size: int = Field(8, ge=1)

    # Every field is classified (tests/evaluators/test_store_keys.py). KEYED: in a comparison's key,
    # as a part (the judge model, the sampling budget from analysis_chars) or through the
    # messages and schema hashed into it (the lists: systems, k, seed; the history shown;
    # the analysis form). UNKEYED: which comparisons are asked (design, reference, its
    # position, both orders, users, absolute ratings), how verdicts are scored (swap rule,
    # similarity, bootstrap), speed.
    KEYED: ClassVar[frozenset[str]] = frozenset(
        {"model", "systems", "k", "history_items", "history_min_rating", "analysis",
         "analysis_chars", "seed"}
    )  # fmt: skip
    UNKEYED: ClassVar[frozenset[str]] = frozenset(
        {"design", "reference", "reference_position", "both_orders", "users", "swap_rule",
         "bootstrap", "similarity", "absolute", "batch_size"}
    )  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> ArenaConfig:
        check_systems(self.system_names, self.reference)
        return self

    @property
    def system_names(self) -> tuple[str, ...]:
        return tuple(s.partition("=")[0] for s in self.systems)

    @property
    def reference_name(self) -> str | None:
        """The reference system (``None`` in the round-robin design)."""
        if self.design != "reference":
            return None
        return self.reference or self.system_names[0]

    def orders(self) -> list[tuple[str, str]]:
        """The (position A, position B) orders judged for each user."""
        ref = self.reference_name
        if ref is None:
            pairs = itertools.combinations(sorted(self.system_names), 2)
            return [o for a, b in pairs for o in ((a, b), (b, a))]
        others = [s for s in self.system_names if s != ref]
        headline = [(s, ref) if self.reference_position == "B" else (ref, s) for s in others]
        if self.both_orders:
            return [o for h in headline for o in (h, h[::-1])]
        return headline

    def is_headline(self, record: dict[str, Any]) -> bool:
        """Whether a verdict record is of the headline order (the reference in
        ``reference_position``)."""
        ref = self.reference_name
        return record["system_b" if self.reference_position == "B" else "system_a"] == ref

    def deviations(self) -> list[str]:
        """How this run departs from the paper's protocol (for the report header)."""
        out = []
        if self.design == "round-robin":
            out.append(
                "round-robin over every pair in both orders, swap rule "
                f"'{self.swap_rule}' (the paper compares each system with one reference in "
                "position A, one order)"
            )
        elif self.both_orders:
            out.append(
                "both orders judged as a position-bias control (the paper's one-order result "
                "is the headline; both swap rules are reported beside it)"
            )
        if self.design == "reference" and self.reference_position == "A":
            out.append(
                "the reference in position A and the system under test in B (the paper: the "
                "system under test in A, the reference in B)"
            )
        if self.analysis == "joint":
            out.append("one joint analysis (the paper asks for an analysis of each aspect)")
        if self.history_items != 5:
            out.append(f"{self.history_items} history items (the paper: 5)")
        if self.history_min_rating is None:
            out.append("history of all interactions (the paper: positive ones)")
        if self.k != 5:
            out.append(f"top-{self.k} lists (the paper: top 5)")
        if self.absolute:
            out.append("an absolute 5-level rating per list is asked as well (not in the paper)")
        return out


@dataclass
class _Arena:
    """What the judging needs: users, their prompt parts, and the systems' lists."""

    config: ArenaConfig
    users: list[str]
    profiles: dict[str, str]
    history: dict[str, list[str]]  # user -> rendered liked items, newest first
    lists: dict[str, dict[str, list[str]]]  # system -> user -> rendered top-k
    word: str


def _liked_history(train: Any, n: int, min_rating: float | None) -> dict[str, list[str]]:
    """Per user, the ids of the ``n`` most recent liked interactions, newest first."""
    df = train.sort_values(["user_id", "timestamp"], kind="stable")
    df = df.assign(user_id=df["user_id"].astype(str), item_id=df["item_id"].astype(str))
    everything = df.groupby("user_id")["item_id"].apply(list)
    liked = everything
    if min_rating is not None and "rating" in df and df["rating"].notna().any():
        liked = df[df["rating"] >= min_rating].groupby("user_id")["item_id"].apply(list)
    out = {}
    for u, items in everything.items():
        chosen = liked.get(u) or items  # no liked item: the most recent interactions
        out[u] = chosen[-n:][::-1]
    return out


@dataclass
class ArenaWorld:
    """The data, users and systems an arena compares (pairwise or list-level)."""

    ds: Any
    split: Any  # leave-one-out: the systems train on ``split.train``, AUC on ``split.test``
    users: list[str]
    systems: dict[str, Any]  # name -> RecSystem
    offline: dict[str, dict[str, float | None]]  # name -> AUC, nDCG@k, URD


def arena_world(
    data: str, systems: Sequence[str], users: int, k: int, similarity: str, seed: int
) -> ArenaWorld:
    """Load ``data``, sample ``users`` users with a held-out test item (sha256 of the id and
    ``seed``), build ``systems`` on the leave-one-out train split and their offline metrics
    on those users."""
    ds = load_dataset(data)
    split = leave_one_out(ds.interactions)
    eligible = set(split.test["user_id"].astype(str))
    chosen = [u for u in sample_users(ds.user_ids(), users * 3, seed) if u in eligible][:users]
    built = build_systems(ds, systems, split, chosen, k, seed)
    offline = offline_metrics(ds, built, split, chosen, k, similarity, seed)
    return ArenaWorld(ds, split, chosen, built, offline)


def _prepare(config: ArenaConfig, data: str) -> tuple[_Arena, dict[str, Any], list[str]]:
    world = arena_world(
        data, config.systems, config.users, config.k, config.similarity, config.seed
    )
    ds, split, users, systems, offline = (
        world.ds, world.split, world.users, world.systems, world.offline
    )  # fmt: skip
    text = {
        str(i): render_item(r, ds.domain)
        for i, r in zip(ds.items["item_id"], ds.items.to_dict("records"), strict=True)
    }
    hist = _liked_history(split.train, config.history_items, config.history_min_rating)
    arena = _Arena(
        config,
        users,
        {u: user_profile(ds, u) for u in users},
        {u: [text[i] for i in hist.get(u, [])] for u in users},
        {
            s: {u: [text[i] for i in r.lists[u][: config.k]] for u in users}
            for s, r in systems.items()
        },
        DOMAIN_WORD.get(ds.domain, "items"),
    )
    return arena, offline, users


def _verdicts_only(result: dict[str, Any]) -> dict[str, Any]:
    """A comparison's title-free form for checkpoints: its closed verdicts (or rating) and
    their probabilities, without the free-text analyses, which may name items."""
    value = {k: v for k, v in result["value"].items() if k != "analysis"}
    return {"value": value, "branches": result["branches"], "p": result["p"]}


def _asks(
    arena: _Arena,
    sampling: Any,
    llm_settings: dict[str, Any],
    former_llm: Sequence[dict[str, Any]] = (),
) -> list[Any]:
    """Every stored question: one per (user, order), and the absolute ratings, keyed with
    the answering LLM's settings (``llm_key``; ``former_llm``: their earlier forms, under
    which a store may hold the answer)."""
    c = arena.config
    per_aspect = c.analysis == "per-aspect"
    schema = Verdicts(
        [*ASPECTS, "overall"],
        OPTIONS,
        c.analysis_chars,
        analysis_fields=ASPECTS if per_aspect else None,
    )
    # the sampling key, then the form keys had until 2026-12-02 (SamplingConfig.former_key)
    budgets = [sampling.key(), *[f for f in [sampling.former_key()] if f != sampling.key()]]
    forms = [(b, f) for b in budgets for f in (llm_settings, *former_llm)]
    asks = []
    for u, (a, b) in itertools.product(arena.users, c.orders()):
        msgs = arena_messages(
            arena.profiles[u],
            arena.history[u],
            arena.lists[a][u],
            arena.lists[b][u],
            c.analysis_chars,
            arena.word,
            per_aspect,
        )
        key, *formerly = (
            ask_key(
                ARENA_PROMPT_VERSION,
                c.model,
                msgs,
                budget,
                schema.key(),
                llm=llm,
                length=32,
            )
            for budget, llm in forms
        )
        req = {"user_id": u, "system_a": a, "system_b": b}
        asks.append(StoredAsk(key, req, msgs, schema, default_result, _verdicts_only,
                              formerly=tuple(formerly)))  # fmt: skip
    if c.absolute:
        rating = Choice(ABSOLUTE, answer_key="rating")
        for u, s in itertools.product(arena.users, sorted(c.system_names)):
            msgs = absolute_messages(
                arena.profiles[u], arena.history[u], arena.lists[s][u], arena.word
            )
            key, *formerly = (
                ask_key(ARENA_PROMPT_VERSION, "absolute", c.model, msgs, llm=llm, length=32)
                for llm in (llm_settings, *former_llm)
            )
            req = {"user_id": u, "system": s, "absolute": True}
            asks.append(StoredAsk(key, req, msgs, rating, default_result, _verdicts_only,
                                  formerly=tuple(formerly)))  # fmt: skip
    return asks


def arena_sampling(config: ArenaConfig) -> Any:
    """The greedy budget of a comparison: each analysis text's bound plus the JSON around."""
    n_texts = len(ASPECTS) if config.analysis == "per-aspect" else 1
    return SamplingConfig(max_new_tokens=n_texts * config.analysis_chars + 120)


def arena_asks(
    config: ArenaConfig,
    data: str,
    llm_settings: dict[str, Any],
    former_llm: Sequence[dict[str, Any]] = (),
) -> tuple[list[Any], dict[str, Any], list[str]]:
    """Every stored question of a run, without a model (the world built, the lists drawn,
    the prompts and keys made): the asks, the systems' offline metrics and the users. The
    LLM's part of each key is ``llm_settings`` (``llm_key`` of the answering model;
    ``former_llm``: its earlier forms, ``former_llm_keys``)."""
    arena, offline, users = _prepare(config, data)
    return _asks(arena, arena_sampling(config), llm_settings, former_llm), offline, users


def _records(asks: list[Any], done: dict[str, Any]) -> tuple[list[dict], dict[str, list[float]]]:
    """Per-order verdict records (each from its own A's side) and absolute scores."""
    records: list[dict[str, Any]] = []
    absolute: dict[str, list[float]] = {}
    for q in asks:
        res, req = done[q.key], q.request
        if req.get("absolute"):
            p = dict(zip(res["branches"], res["p"], strict=True))
            score = sum(ABSOLUTE_SCORE[o] * p.get(o, 0.0) for o in ABSOLUTE)
            absolute.setdefault(req["system"], []).append(score)
            continue
        for aspect in (*ASPECTS, "overall"):
            r = {**req, "aspect": aspect, "verdict": res["value"][aspect]}
            if aspect == "overall" and res["p"] is not None:
                r["p_overall"] = dict(zip(res["branches"], res["p"], strict=True))
            records.append(r)
    return records, absolute


def _summaries(
    config: ArenaConfig, records: list[dict], absolute: dict, offline: dict
) -> dict[str, Any]:
    """The headline summary under the configured design, plus the swap-rule controls."""
    auc = {s: m["auc"] for s, m in offline.items() if m["auc"] is not None}
    ref = config.reference_name
    if ref is None:
        primary = swap_rule_records(records, config.swap_rule)
    else:
        primary = [r for r in records if config.is_headline(r)]  # the paper's one order
    summary = summarize(primary, auc, config.bootstrap, config.seed, reference=ref)
    both = ref if config.both_orders else None  # per-system swap statistics need both
    summary |= order_stats(records, both, auc, config.bootstrap, config.seed)
    if ref is not None:
        summary["reference_q_ci"] = reference_q_ci(primary, ref, config.bootstrap, config.seed)
    summary["position_shares"] = position_shares(records)
    if both is not None:
        aspects = summary["pairs"].keys()
        summary["swap_rules"] = {
            rule: {a: reference_q(swap_rule_records(records, rule), ref, a) for a in aspects}
            for rule in SWAP_RULES
        }
    abs_mean = {s: float(np.mean(v)) for s, v in absolute.items()}
    if abs_mean:
        summary["absolute_score"] = abs_mean
        summary["corr_absolute_auc"] = correlations(abs_mean, auc)
    return summary


def run_arena(
    config: ArenaConfig,
    data: str = "ml-1m",
    out: str | Path = "reports/arena",
    llm: LLMBackend | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Judge the configured orders for ``config.users`` users; write ``verdicts.jsonl`` (one
    record per judged order and aspect), ``results.json``, ``report.md`` and
    ``winrates.png`` under ``out``. Judgments are stored in ``out/store.sqlite``; a rerun
    resumes."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    llm = llm or load_llm(config.model)
    asks, offline, users = arena_asks(config, data, llm_settings_of(llm, config.model),
                                      former_llm_settings_of(llm, config.model))  # fmt: skip
    sampling = arena_sampling(config)
    t0 = time.perf_counter()
    with ResultsStore(out / "store.sqlite") as store:
        keys = list({a.key for a in asks})
        adopt_former(store, asks)  # answers stored under an earlier key are not asked again
        asked_now = len(store.missing(keys))
        # Prompts of similar length share a padding bucket, so a batch decodes together.
        done = ask_stored(
            llm,
            store,
            asks,
            sampling=sampling,
            batch_size=config.batch_size,
            sort_by_length=True,
            desc="arena",
            progress=progress,
        )
    asking = time.perf_counter() - t0
    records, absolute = _records(asks, done)
    with open(out / "verdicts.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    summary = _summaries(config, records, absolute, offline)
    wall = time.perf_counter() - t0
    summary["cost"] = {
        "wall_seconds": round(wall, 1),
        "questions": len(keys),
        "asked_now": asked_now,
        "asking_seconds": round(asking, 1),
        "per_second": round(asked_now / asking, 4) if asking > 0 else None,
    }
    results = {
        "config": config.model_dump(),
        "data": data,
        "users": users,
        "offline": offline,
        **summary,
    }
    plot_winrates(summary, out / "winrates.png")
    write_report(out, results, arena_report(config, data, offline, summary, len(users)))
    return results
