"""UserSumBench: user-summary quality measured by future-activity prediction, and the
time-hierarchy summariser with its self-critique verifier.

After "UserSumBench: A Benchmark Framework for Evaluating User Summarization Approaches"
(Wang et al., 2024). No public code exists; this is our reference implementation.

A summariser condenses a user's past activities into a short text. A predictor LLM then
answers four multiple-choice questions about the user's *future* from that summary (the next
item; the next item's category; each once from the summary alone and once with the N_r most
recent activities added). The predictor answers by grammar-constrained choice through the
reward core, so answers always parse. This module is the pipeline; prompts in
``_usersum_prompts``, metrics in ``_usersum_metrics``, the report in ``_usersum_report``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from recjudge._stats import arm_interval, paired_comparisons, user_draws
from recjudge._util import rng
from recjudge.data import load_dataset, render_item, sample_users
from recjudge.decoding import Choice, QAPairs, Verdicts
from recjudge.evaluators._cost import AskMeter
from recjudge.evaluators.usersum._metrics import (
    LETTERS,
    TASKS,
    bleu,
    make_mcq,
    rouge_l,
    rouge_n,
    segment,
    time_segments,
    usersum_metrics,
    word_count,
)
from recjudge.evaluators.usersum._prompts import (
    USERSUM_PROMPT_VERSION,
    combine_messages,
    predict_messages,
    qa_messages,
    qg_messages,
    query_check_messages,
    regenerate_messages,
    summary_messages,
)
from recjudge.evaluators.usersum._report import plot_metrics, usersum_report
from recjudge.llm import LLMPool, SamplingConfig
from recjudge.reporting import write_report
from recjudge.reward import (
    ResultsStore,
    StoredAsk,
    adopt_former,
    ask_key,
    ask_stored,
    generate_stored,
)


# -- configuration ------------------------------------------------------------------------------
class UserSumConfig(BaseModel):
    """UserSumBench settings.

    Attributes:
        summarizers: ``single`` (one prompt) and/or ``hierarchy`` (hierarchy-critique).
        model: the summariser LLM.
        predictor: the LLM answering the multiple-choice tasks.
        users: users evaluated (sampled by sha256 of the id among eligible users).
        min_activities: users need at least this many activities.
        max_activities: the most recent activities kept per user.
        future: activities at the end of the timeline held out as the future.
        word_limit: the summary's word limit X.
        query: the summarisation query.
        segmentation: ``time`` (the paper: windows of equal duration, merged until each
            holds ``min_segment`` activities; prompts carry the time range) or ``count``
            (equal activity counts; our former rule).
        min_segment: fewest activities per hierarchy segment.
        max_segments: most segments.
        critique_rounds: regeneration rounds K when the verifier finds inconsistencies; a
            regeneration sees the previous summary and the failed checks (A.3).
        qa_pairs: question-answer pairs generated per segment summary.
        recent: N_r, recent activities shown in tasks t2 and t4.
        runs: prediction runs (different option samples and orders) for mean +- sd.
        m: tasks that must be right for Q_s = 1.
        seed: base seed.
        batch_size: prompts decoded together in one engine call (speed and memory).
        bootstrap: user resamples for the intervals over users (``recjudge._stats``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    summarizers: tuple[Literal["single", "hierarchy"], ...] = Field(
        ("single", "hierarchy"), min_length=1, json_schema_extra={"cli": ["--summarizer"]}
    )
    model: str = "qwen2.5-coder-0.5b"
    predictor: str = "qwen2.5-coder-0.5b"
    users: int = Field(30, ge=1)
    min_activities: int = Field(50, ge=2)
    max_activities: int = Field(200, ge=2)
    future: int = Field(10, ge=1)
    word_limit: int = Field(150, ge=5)
    query: str = "Summarize my long-term {domain} preference"
    segmentation: Literal["time", "count"] = "time"
    min_segment: int = Field(40, ge=2)
    max_segments: int = Field(4, ge=1)
    critique_rounds: int = Field(2, ge=0)
    qa_pairs: int = Field(3, ge=1)
    recent: int = Field(20, ge=1)
    runs: int = Field(3, ge=1)
    m: int = Field(3, ge=1, le=4)
    seed: int = 0
    batch_size: int = Field(4, ge=1)
    bootstrap: int = Field(1000, ge=100)

    # Every field is classified (tests/evaluators/test_store_keys.py). KEYED: in a stored
    # question's key, as a part (the two models, the summary budget from word_limit) or
    # through the messages and schemas hashed into it (timeline cut, query, segments,
    # critique rounds, QA pairs, recent items, option samples by seed). UNKEYED: which
    # summaries, users and prediction runs are asked (run r's options are drawn from
    # (seed, r, user) whatever the number of runs), how answers are scored (m), speed,
    # intervals.
    KEYED: ClassVar[frozenset[str]] = frozenset(
        {"model", "predictor", "max_activities", "future", "word_limit", "query",
         "segmentation", "min_segment", "max_segments", "critique_rounds", "qa_pairs",
         "recent", "seed"}
    )  # fmt: skip
    UNKEYED: ClassVar[frozenset[str]] = frozenset(
        {"summarizers", "users", "min_activities", "m", "batch_size", "bootstrap", "runs"}
    )

    def deviations(self) -> list[str]:
        """How this configuration departs from the paper's protocol."""
        out = []
        if self.segmentation == "count":
            out.append("count-based segments (the paper splits the timeline by time)")
        return out


# -- the run ------------------------------------------------------------------------------------
@dataclass
class _Sum:
    """What every stage needs: settings, users' timelines, item texts, the store, models."""

    config: UserSumConfig
    users: list[str]
    timelines: dict[str, tuple[list[dict], list[dict]]]  # user -> (past, future)
    text: dict[str, str]
    genres: dict[str, list[str]]
    query: str
    what_item: str
    store: Any
    progress: bool
    llms: Any  # LLMPool
    cost: AskMeter = field(default_factory=AskMeter)

    def llm(self, name: str) -> Any:
        return self.llms.get(name)


def _load(config: UserSumConfig, data: str, out: Path, llms: Any, progress: bool) -> _Sum:
    pool = LLMPool(llms, needed=(config.model, config.predictor))  # fail before any work
    world = _world(config, data)
    out.mkdir(parents=True, exist_ok=True)
    return _Sum(config, *world, ResultsStore(out / "store.sqlite"), progress, pool)


def _world(config: UserSumConfig, data: str) -> tuple[Any, ...]:
    """``_Sum``'s users, timelines, item texts, genres, query and item word, from ``data``."""
    ds = load_dataset(data)
    if "genres" not in ds.items or ds.items["genres"].isna().all():
        raise ValueError(
            f"dataset {data!r} has no item categories (items column 'genres'); the category "
            "tasks t3/t4 need them. Add a 'genres' column ('|'-separated) to the items file."
        )
    domain = {"movies": "movie watching", "books": "reading"}.get(ds.domain, "activity")
    items = ds.items.set_index(ds.items["item_id"].astype(str))
    text = {i: render_item(r, ds.domain) for i, r in items.to_dict("index").items()}
    genres = {
        i: [g for g in str(r).split("|") if g] if r == r and r is not None else []
        for i, r in items["genres"].items()
    }
    lengths = ds.interactions.groupby("user_id", observed=True).size()
    eligible = sorted(str(u) for u, n in lengths.items() if n >= config.min_activities)
    users = sample_users(eligible, config.users, config.seed)
    timelines = {}
    for u in users:
        h = ds.history(u).iloc[-config.max_activities :]
        acts = [
            {"item_id": str(i), "text": text[str(i)], "rating": float(r), "t": float(t)}
            for i, r, t in zip(h["item_id"], h["rating"], h["timestamp"], strict=True)
        ]
        timelines[u] = (acts[: -config.future], acts[-config.future :])
    return (
        users,
        timelines,
        text,
        genres,
        config.query.format(domain=domain),
        {"movies": "movie", "books": "book"}.get(ds.domain, "item"),
    )


def usersum_summary_asks(config: UserSumConfig, data: str) -> list[Any]:
    """The first questions ``run_usersum`` asks (each user's single summary), without a
    model: nothing is asked or stored. The later stages' questions need these answers."""
    users, timelines, text, genres, query, word = _world(config, data)
    run = _Sum(config, users, timelines, text, genres, query, word, None, False, LLMPool())
    return _gen_asks(run, _single_prompts(run), _single_requests(run))


def _gen_asks(
    run: _Sum, prompts: Sequence[list[dict[str, str]]], requests: Sequence[dict[str, Any]]
) -> list[Any]:
    """A stored free-text question per prompt, keyed with the summariser's settings and the
    summary budget (and the key's form until 2026-12-02 as ``formerly``); ``requests`` say
    which summary each is (user, stage, segment, round: stored beside it, in no key)."""
    c = run.config
    budget = _gen_budget(c)

    def key(m: list[dict[str, str]], sampling_key: dict[str, Any], llm: dict[str, Any]) -> str:
        return ask_key(USERSUM_PROMPT_VERSION, "gen", c.model, m, sampling_key, llm=llm)

    # formerly: the greedy sampling key's form until 2026-12-02 (SamplingConfig.former_key),
    # and the LLM settings' earlier forms (a server's key held the client's dtype guess)
    now, before = run.llms.key(c.model), run.llms.former(c.model)
    forms = [(s, f) for s in (budget.key(), budget.former_key()) for f in (now, *before)][1:]
    return [StoredAsk(key(m, budget.key(), now), {"kind": "gen", **r}, m,
                      formerly=tuple(key(m, s, f) for s, f in forms))
            for m, r in zip(prompts, requests, strict=True)]  # fmt: skip


def _gen_budget(c: UserSumConfig) -> Any:
    return SamplingConfig(max_new_tokens=int(c.word_limit * 1.6) + 32)


def _generate(
    run: _Sum,
    prompts: Sequence[list[dict[str, str]]],
    requests: Sequence[dict[str, Any]],
    desc: str,
) -> list[str]:
    """Free-text generation by the summariser, stored per prompt (``requests``: what each
    is, stored beside it)."""
    c = run.config
    budget = _gen_budget(c)
    asks = _gen_asks(run, prompts, requests)
    adopt_former(run.store, asks)  # before the meter counts what the store lacks
    got = run.cost.measure(
        "free_text",
        run.store,
        [a.key for a in asks],
        lambda: generate_stored(
            run.llm(c.model),
            run.store,
            asks,
            sampling=budget,
            batch_size=c.batch_size,
            desc=desc,
            progress=run.progress,
        ),
    )
    return [got[a.key]["text"] for a in asks]


def _closed(
    run: _Sum,
    model: str,
    prompts: Sequence[Any],
    schemas: Sequence[Any],
    requests: Sequence[dict[str, Any]],
    kind: str,
    budget: int,
) -> list[Any]:
    """Grammar-constrained questions to ``model``, stored; the parsed values in order
    (``requests``: which user, segment, round or task each is, stored beside it)."""
    asks = [
        StoredAsk(
            # the budget is no part: one constant per kind of question, with its schema
            ask_key(USERSUM_PROMPT_VERSION, "ask", model, m, s.key(), llm=run.llms.key(model)),
            {"kind": kind, **r},
            m,
            s,
            _value_result,
            formerly=tuple(
                ask_key(USERSUM_PROMPT_VERSION, "ask", model, m, s.key(), llm=f)
                for f in run.llms.former(model)
            ),  # fmt: skip
        )
        for m, s, r in zip(prompts, schemas, requests, strict=True)
    ]
    # A batch's eight rows decode together (ask_stored's default): each step streams the
    # weights once for all of them (the fast engine keeps per-row buffers, so prompts of
    # different lengths need no padding). Measured on 8 check questions with the 1.5B: 1.67x
    # faster than one row at a time, same verdicts.
    got = run.cost.measure(
        "closed",
        run.store,
        [a.key for a in asks],
        lambda: ask_stored(
            run.llm(model),
            run.store,
            asks,
            sampling=SamplingConfig(max_new_tokens=budget),
            batch_size=8,
            sort_by_length=True,
            desc=kind,
            progress=run.progress,
        ),
    )
    return [got[a.key]["value"] for a in asks]


def _value_result(answer: Any) -> dict[str, Any]:
    """The parsed value, and the branch probabilities when the schema has a decision."""
    rec = answer.record
    return {"value": answer.value, "p": None if rec is None else list(rec.p_before)}


# -- summarisers ---------------------------------------------------------------------------------
def time_range(acts: Sequence[Mapping[str, Any]]) -> str:
    """The segment's dates (``YYYY-MM-DD to YYYY-MM-DD``) when timestamps are Unix seconds;
    otherwise its position in the timeline (datasets without real time, e.g. Book-Crossing)."""
    a, b = acts[0]["t"], acts[-1]["t"]
    if a > 1e8:  # Unix seconds (after 1973)
        day = [datetime.fromtimestamp(x, UTC).strftime("%Y-%m-%d") for x in (a, b)]
        return day[0] if day[0] == day[1] else f"{day[0]} to {day[1]}"
    return ""


def _segments(run: _Sum, u: str) -> list[list[dict]]:
    c, past = run.config, run.timelines[u][0]
    if c.segmentation == "time":
        bounds = time_segments([a["t"] for a in past], c.min_segment, c.max_segments)
    else:
        bounds = segment(len(past), c.min_segment, c.max_segments)
    return [past[a:b] for a, b in bounds]


def _single_prompts(run: _Sum) -> list[list[dict[str, str]]]:
    c = run.config
    return [summary_messages(run.timelines[u][0], run.query, c.word_limit) for u in run.users]


def _single_requests(run: _Sum) -> list[dict[str, Any]]:
    return [{"stage": "single", "user_id": u} for u in run.users]


def _single(run: _Sum) -> dict[str, dict[str, Any]]:
    texts = _generate(run, _single_prompts(run), _single_requests(run), "summarise: single")
    return {u: {"text": t} for u, t in zip(run.users, texts, strict=True)}


def _verify(run: _Sum, segs: dict, jobs: list, seg_text: dict, rnd: int) -> tuple[dict, list]:
    """The self-critique verifier on the pending segment summaries (critique round
    ``rnd``): the query check and the question-answer checks. Returns (job -> failed checks
    as lines, audit rows)."""
    c = run.config
    reqs = [{"user_id": u, "segment": s, "round": rnd} for u, s in jobs]
    qc = _closed(
        run,
        c.model,
        [query_check_messages(seg_text[j], run.query) for j in jobs],
        [Choice(["consistent", "inconsistent"], answer_key="verdict")] * len(jobs),
        reqs,
        "query_check",
        64,
    )
    qas = _closed(
        run,
        c.model,
        [qg_messages(seg_text[j], c.qa_pairs) for j in jobs],
        [QAPairs(c.qa_pairs)] * len(jobs),
        reqs,
        "qg",
        90 * c.qa_pairs,
    )
    flat = [(j, qa) for j, pairs in zip(jobs, qas, strict=True) for qa in (pairs or [])]
    verdict = Verdicts(["verdict"], ["consistent", "inconsistent"], analysis_chars=100)
    checks = _closed(
        run,
        c.model,
        [qa_messages(segs[j[0]][j[1]], qa["question"], qa["answer"]) for j, qa in flat],
        [verdict] * len(flat),
        [
            {"user_id": j[0], "segment": j[1], "round": rnd, "qa": n}
            for j, pairs in zip(jobs, qas, strict=True)
            for n, _ in enumerate(pairs or [])
        ],
        "qa_check",
        160,
    )
    failed: dict[tuple[str, int], list[str]] = {}
    for (j, qa), chk in zip(flat, checks, strict=True):
        if chk is not None and chk["verdict"] == "inconsistent":
            failed.setdefault(j, []).append(
                f"- Question: {qa['question']} Your summary's answer: '{qa['answer']}'. "
                f"The log says: {chk['analysis']}"
            )
    audit = []
    for j, q in zip(jobs, qc, strict=True):
        ok = q is not None and q["verdict"] == "consistent"
        audit.append(
            {
                "job": j,
                "query_consistent": ok,
                "qa": sum(1 for x in flat if x[0] == j),
                "qa_inconsistent": len(failed.get(j, [])),
            }
        )
        if not ok:
            failed.setdefault(j, []).insert(0, f"- It does not answer the request: {run.query}.")
    return failed, audit


def _hierarchy(run: _Sum) -> dict[str, dict[str, Any]]:
    """Segment summaries (time ranges in the prompt), verified and regenerated up to K times
    from the previous summary and its failed checks, then combined."""
    c = run.config
    segs = {u: _segments(run, u) for u in run.users}
    ranges = {(u, s): time_range(acts) for u in run.users for s, acts in enumerate(segs[u])}
    jobs = list(ranges)
    seg_text = dict(
        zip(
            jobs,
            _generate(
                run,
                [
                    summary_messages(segs[u][s], run.query, c.word_limit, ranges[(u, s)])
                    for u, s in jobs
                ],
                [{"stage": "segment", "user_id": u, "segment": s} for u, s in jobs],
                "summarise: segments",
            ),
            strict=True,
        )
    )
    audit: dict[tuple[str, int], list[dict]] = {j: [] for j in jobs}
    regenerated: set[tuple[str, int]] = set()
    pending = jobs
    for rnd in range(c.critique_rounds):
        failed, rows = _verify(run, segs, pending, seg_text, rnd)
        for row in rows:
            audit[row.pop("job")].append({"round": rnd, **row})
        pending = [j for j in pending if j in failed]
        if not pending:
            break
        prompts = [
            regenerate_messages(
                segs[u][s],
                run.query,
                c.word_limit,
                ranges[(u, s)],
                seg_text[(u, s)],
                failed[(u, s)],
            )
            for u, s in pending
        ]
        for j, t in zip(
            pending,
            _generate(
                run,
                prompts,
                [
                    {"stage": "regenerate", "user_id": u, "segment": s, "round": rnd + 1}
                    for u, s in pending
                ],
                f"regenerate (round {rnd + 1})",
            ),
            strict=True,
        ):
            seg_text[j] = t
            regenerated.add(j)
    prompts = [
        combine_messages(
            [seg_text[(u, s)] for s in range(len(segs[u]))],
            [ranges[(u, s)] for s in range(len(segs[u]))],
            run.query,
            c.word_limit,
        )
        for u in run.users
    ]
    combined = _generate(
        run, prompts, [{"stage": "combine", "user_id": u} for u in run.users], "summarise: combine"
    )
    return {
        u: {
            "text": t,
            "segments": len(segs[u]),
            "time_ranges": [ranges[(u, s)] for s in range(len(segs[u]))],
            "audit": [audit[(u, s)] for s in range(len(segs[u]))],
            "regenerated": sum((u, s) in regenerated for s in range(len(segs[u]))),
        }
        for u, t in zip(run.users, combined, strict=True)
    }


# -- prediction and scoring -------------------------------------------------------------------
@dataclass(frozen=True)
class _Question:
    user_id: str
    summarizer: str
    run: int
    task: str
    messages: list[dict[str, str]]
    answer: str


def _questions(run: _Sum, summaries: Mapping[tuple[str, str], Mapping[str, Any]]) -> list:
    """The four tasks x ``runs`` per summary (different option samples and orders)."""
    c = run.config
    all_genres = sorted({g for gs in run.genres.values() for g in gs})
    item_pool = sorted(run.text)
    out = []
    for (u, name), s in summaries.items():
        past, future = run.timelines[u]
        seen = {a["item_id"] for a in past + future}
        nxt = future[0]
        recent = past[::-1][: c.recent]
        cat = (run.genres.get(nxt["item_id"]) or ["(none)"])[0]
        for r in range(c.runs):
            seed = (c.seed, r, u)
            unseen = [i for i in _sample(item_pool, 60, (seed, "items")) if i not in seen]
            i_opts, i_ans = make_mcq(nxt["item_id"], unseen, (seed, "item"))
            c_pool = [g for g in all_genres if g not in run.genres.get(nxt["item_id"], [])]
            c_opts, c_ans = make_mcq(cat, c_pool, (seed, "category"))
            i_text = [run.text[i] for i in i_opts]
            for task, opts, ans, rec in (
                ("t1_item", i_text, i_ans, None),
                ("t2_item_recent", i_text, i_ans, recent),
                ("t3_category", c_opts, c_ans, None),
                ("t4_category_recent", c_opts, c_ans, recent),
            ):
                what = run.what_item if task < "t3" else f"{run.what_item} genre"
                msgs = predict_messages(s["text"], opts, what, rec)
                out.append(_Question(u, name, r, task, msgs, ans))
    return out


#: per-summary metrics kept per user for the intervals (``usersum_metrics`` of one summary)
USER_METRICS = ("qm", "ifm", "idm", "task_accuracy")


def _score(run: _Sum, summaries: Mapping, questions: Sequence[_Question], letters: Sequence[Any]):
    """(table per summariser, per-run metrics, per-question rows, per summariser one
    [users, USER_METRICS] array per prediction run)."""
    c = run.config
    correct = {
        (q.user_id, q.summarizer, q.run, q.task): v is not None and v["answer"] == q.answer
        for q, v in zip(questions, letters, strict=True)
    }
    per_run: dict[str, list[dict[str, float]]] = {}
    per_user: dict[str, list[np.ndarray]] = {}
    rows = []
    for name in c.summarizers:
        for r in range(c.runs):
            recs = []
            for u in run.users:
                got = {t: correct[(u, name, r, t)] for t in TASKS}
                recs.append({"text": summaries[(u, name)]["text"], "correct": list(got.values())})
                rows.append({"user_id": u, "summarizer": name, "run": r, **got})
            per_run.setdefault(name, []).append(usersum_metrics(recs, c.word_limit, c.m))
            # QM, IFM and IDM are means over summaries, so each user's own summary gives
            # that user's term and the mean over users is the table's value.
            one = [usersum_metrics([x], c.word_limit, c.m) for x in recs]
            per_user.setdefault(name, []).append(
                np.array([[m[k] for k in USER_METRICS] for m in one])
            )
    table = {}
    for name, runs in per_run.items():
        table[name] = {
            k: {
                "mean": float(np.mean([x[k] for x in runs])),
                "sd": float(np.std([x[k] for x in runs], ddof=1)) if len(runs) > 1 else 0.0,
            }
            for k in runs[0]
        }
        ref = [
            (summaries[(u, name)]["text"], "\n".join(a["text"] for a in run.timelines[u][0]))
            for u in run.users
        ]
        table[name]["rouge2"] = float(np.mean([rouge_n(x, y, 2) for x, y in ref]))
        table[name]["rougeL"] = float(np.mean([rouge_l(x, y) for x, y in ref]))
        table[name]["bleu"] = float(np.mean([bleu(x, y) for x, y in ref]))
        table[name]["words"] = float(np.mean([word_count(x) for x, _ in ref]))
        table[name]["per_task_accuracy"] = {
            t: float(np.mean([x[t] for x in rows if x["summarizer"] == name])) for t in TASKS
        }
    return table, per_run, rows, per_user


def _uncertainty(config: UserSumConfig, per_user: Mapping[str, list[np.ndarray]]) -> dict:
    """Each summariser's metrics with intervals over prediction runs and over users, and
    hierarchy minus single paired on both (``recjudge._stats``)."""
    n_users = next(iter(per_user.values()))[0].shape[0]
    idx = user_draws(n_users, config.bootstrap, config.seed)
    out: dict[str, Any] = {
        "intervals": {n: arm_interval(per_user, n, USER_METRICS, idx) for n in per_user}
    }
    if {"single", "hierarchy"} <= set(per_user):
        out["paired"] = paired_comparisons(
            per_user, USER_METRICS, config.bootstrap, config.seed, "single", "hierarchy"
        )
    return out


def _ask_all(run: _Sum) -> tuple[dict[tuple[str, str], dict[str, Any]], list, list]:
    """Every question of the run, stage by stage: each summariser's summaries, the four
    tasks' questions on them and the predictor's answers (letters)."""
    config = run.config
    summaries: dict[tuple[str, str], dict[str, Any]] = {}
    if "single" in config.summarizers:
        summaries.update({(u, "single"): s for u, s in _single(run).items()})
    if "hierarchy" in config.summarizers:
        summaries.update({(u, "hierarchy"): s for u, s in _hierarchy(run).items()})
    questions = _questions(run, summaries)
    letters = _closed(
        run,
        config.predictor,
        [q.messages for q in questions],
        [Choice(LETTERS)] * len(questions),
        [
            {"user_id": q.user_id, "summarizer": q.summarizer, "run": q.run, "task": q.task}
            for q in questions
        ],
        "predict",
        16,
    )
    return summaries, questions, letters


def run_usersum(
    config: UserSumConfig,
    data: str = "ml-1m",
    out: str | Path = "reports/usersum",
    llms: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Summarise each sampled user's past with every summariser, answer the four tasks
    ``config.runs`` times, and write ``summaries.jsonl``, ``results.json``, ``report.md`` and
    ``metrics.png`` under ``out``. Every LLM answer is stored (``out/store.sqlite``), so a
    rerun resumes."""
    t0 = time.time()
    out = Path(out)
    run = _load(config, data, out, llms, progress)
    try:
        summaries, questions, letters = _ask_all(run)
    finally:
        run.store.close()
    table, per_run, rows, per_user = _score(run, summaries, questions, letters)
    with open(out / "summaries.jsonl", "w", encoding="utf-8") as f:
        for (u, name), s in summaries.items():
            f.write(json.dumps({"user_id": u, "summarizer": name, **s}, ensure_ascii=False) + "\n")
    results = {
        "config": config.model_dump(),
        "deviations": config.deviations(),
        "data": data,
        "users": run.users,
        "wall_seconds": round(time.time() - t0, 1),
        "cost": run.cost.summary(),
        "table": table,
        **_uncertainty(config, per_user),
        "per_run": per_run,
        "answers": rows,
    }
    plot_metrics(table, out / "metrics.png")
    write_report(out, results, usersum_report(config, data, results))
    return results


def _sample(pool: Sequence[str], n: int, seed: Any) -> list[str]:
    idx = rng("usersum-pool", seed).choice(len(pool), size=min(n, len(pool)), replace=False)
    return [pool[i] for i in idx]
