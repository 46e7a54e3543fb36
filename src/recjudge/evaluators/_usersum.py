"""UserSumBench: user-summary quality measured by future-activity prediction, and the
hierarchy-critique summariser.

After "UserSumBench: A Benchmark Framework for Evaluating User Summarization Approaches"
(Google DeepMind, 2024). No public code exists; this is our reference implementation.

A summariser condenses a user's past activities into a short text. A predictor LLM then
answers four multiple-choice questions about the user's *future* from that summary (the next
item; the next item's category; each once from the summary alone and once with the N_r most
recent activities added). The predictor answers by grammar-constrained choice through the
reward core, so answers always parse. Metrics are pure functions (tested on hand cases).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from recjudge._util import rng, stable_hash

USERSUM_PROMPT_VERSION = "usersum-v1"
LETTERS = ("A", "B", "C", "D", "E")
TASKS = ("t1_item", "t2_item_recent", "t3_category", "t4_category_recent")


# -- multiple choice --------------------------------------------------------------------------
def make_mcq(correct: str, pool: Sequence[str], seed: Any, wrong: int = 4) -> tuple[list[str], str]:
    """Options = ``correct`` plus ``wrong`` distinct random others from ``pool``, shuffled.

    Seeded by sha256 of ``seed`` (same on every machine and process). Returns (options, the
    correct letter). Raises ValueError when the pool has too few alternatives.
    """
    others = sorted({str(p) for p in pool} - {str(correct)})
    if len(others) < wrong:
        raise ValueError(
            f"need {wrong} wrong options besides {correct!r}, the pool has {len(others)}"
        )
    g = rng("usersum-mcq", seed)
    picks = [others[i] for i in g.choice(len(others), size=wrong, replace=False)]
    options = [str(correct), *picks]
    order = g.permutation(len(options))
    options = [options[i] for i in order]
    return options, LETTERS[options.index(str(correct))]


# -- metrics (pure) ---------------------------------------------------------------------------
def word_count(text: str) -> int:
    return len(text.split())


def summary_quality(correct: Sequence[bool], m: int = 3) -> int:
    """Q_s = 1 if at least ``m`` of the summary's tasks are answered correctly, else 0."""
    return int(sum(bool(c) for c in correct) >= m)


def usersum_metrics(
    summaries: Sequence[Mapping[str, Any]], word_limit: int, m: int = 3
) -> dict[str, float]:
    """QM, IFM and IDM over summaries (UserSumBench).

    Each summary record has ``text`` and ``correct`` (one bool per task).
    QM = mean_s Q_s with Q_s = 1[sum(correct) >= m]; IFM = share of summaries with at most
    ``word_limit`` words; IDM = mean_s (mean task accuracy_s / words_s), the accuracy bought
    per word (0 for an empty summary). Higher is better for all three.
    """
    if not summaries:
        return {"qm": 0.0, "ifm": 0.0, "idm": 0.0, "task_accuracy": 0.0}
    qs, within, dens, acc = [], [], [], []
    for s in summaries:
        c = [bool(x) for x in s["correct"]]
        words = word_count(s["text"])
        a = sum(c) / len(c) if c else 0.0
        qs.append(summary_quality(c, m))
        within.append(words <= word_limit)
        dens.append(a / words if words else 0.0)
        acc.append(a)
    return {
        "qm": float(np.mean(qs)),
        "ifm": float(np.mean(within)),
        "idm": float(np.mean(dens)),
        "task_accuracy": float(np.mean(acc)),
    }


_TOKEN = re.compile(r"[a-z0-9]+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def rouge_n(candidate: str, reference: str, n: int = 2) -> float:
    """ROUGE-N F1 (Lin, 2004) on lower-cased alphanumeric tokens."""
    c, r = _ngrams(_tokens(candidate), n), _ngrams(_tokens(reference), n)
    overlap = sum((c & r).values())
    if not overlap:
        return 0.0
    p, rec = overlap / sum(c.values()), overlap / sum(r.values())
    return 2 * p * rec / (p + rec)


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1: longest common subsequence of tokens (Lin, 2004)."""
    c, r = _tokens(candidate), _tokens(reference)
    lcs = _lcs(c, r) if c and r else 0
    if not lcs:
        return 0.0
    p, rec = lcs / len(c), lcs / len(r)
    return 2 * p * rec / (p + rec)


def bleu(candidate: str, reference: str, max_n: int = 4) -> float:
    """Sentence BLEU-4 (Papineni et al., 2002) with add-one smoothing for n > 1 (Lin & Och,
    2004) and the brevity penalty."""
    c, r = _tokens(candidate), _tokens(reference)
    if not c or not r:
        return 0.0
    logs = []
    for n in range(1, max_n + 1):
        cn, rn = _ngrams(c, n), _ngrams(r, n)
        match, total = sum((cn & rn).values()), max(sum(cn.values()), 0)
        if n > 1:
            match, total = match + 1, total + 1
        if match == 0 or total == 0:
            return 0.0
        logs.append(math.log(match / total))
    bp = 1.0 if len(c) > len(r) else math.exp(1 - len(r) / len(c))
    return bp * math.exp(sum(logs) / max_n)


# -- segmentation -------------------------------------------------------------------------------
def segment(n: int, min_size: int, max_segments: int | None = None) -> list[tuple[int, int]]:
    """Split ``n`` chronological activities into contiguous ``[start, end)`` segments of at
    least ``min_size`` each (one segment if ``n < 2 * min_size``), sizes differing by at most
    one, at most ``max_segments`` of them."""
    if n <= 0:
        return []
    k = max(1, n // min_size)
    if max_segments:
        k = min(k, max_segments)
    bounds = np.linspace(0, n, k + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


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
        min_segment: fewest activities per hierarchy segment.
        max_segments: most segments.
        critique_rounds: regeneration rounds K when the verifier finds inconsistencies.
        qa_pairs: question-answer pairs generated per segment summary.
        recent: N_r, recent activities shown in tasks t2 and t4.
        runs: prediction runs (different option samples and orders) for mean +- sd.
        m: tasks that must be right for Q_s = 1.
        seed: base seed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    summarizers: tuple[Literal["single", "hierarchy"], ...] = ("single", "hierarchy")
    model: str = "qwen2.5-coder-0.5b"
    predictor: str = "qwen2.5-coder-0.5b"
    users: int = Field(30, ge=1)
    min_activities: int = Field(50, ge=2)
    max_activities: int = Field(200, ge=2)
    future: int = Field(10, ge=1)
    word_limit: int = Field(150, ge=5)
    query: str = "Summarize my long-term {domain} preference"
    min_segment: int = Field(40, ge=2)
    max_segments: int = Field(4, ge=1)
    critique_rounds: int = Field(2, ge=0)
    qa_pairs: int = Field(3, ge=1)
    recent: int = Field(20, ge=1)
    runs: int = Field(3, ge=1)
    m: int = Field(3, ge=1, le=4)
    seed: int = 0
    batch_size: int = Field(4, ge=1)


# -- prompts ------------------------------------------------------------------------------------
def _activity_lines(acts: Sequence[Mapping[str, Any]]) -> list[str]:
    # ratings are floats from the dataset; NaN (no rating) is the only value unequal to itself
    return [
        f"- {a['text']} (rated {a['rating']:g})" if a["rating"] == a["rating"] else f"- {a['text']}"
        for a in acts
    ]


def summary_messages(
    acts: Sequence[Mapping[str, Any]], query: str, word_limit: int, feedback: str = ""
) -> list[dict[str, str]]:
    extra = (
        f"\n\nA reviewer found problems in your previous summary:\n{feedback}\nFix them."
        if (feedback)
        else ""
    )
    return [
        {"role": "system", "content": "You write faithful, concise user preference summaries."},
        {
            "role": "user",
            "content": (
                "My activities, oldest first:\n"
                + "\n".join(_activity_lines(acts))
                + f"\n\n{query}. Write two parts, 'Summary:' and 'Insights:', together at most "
                f"{word_limit} words. Only state what the activities support.{extra}"
            ),
        },
    ]


def combine_messages(parts: Sequence[str], query: str, word_limit: int) -> list[dict[str, str]]:
    body = "\n\n".join(f"Period {i + 1} (older first):\n{p}" for i, p in enumerate(parts))
    return [
        {"role": "system", "content": "You write faithful, concise user preference summaries."},
        {
            "role": "user",
            "content": (
                f"Summaries of my activity in consecutive periods:\n\n{body}\n\n{query}. "
                "Combine them into one summary that keeps long-term patterns and focuses on my "
                "recent interests. Write two parts, 'Summary:' and 'Insights:', together at "
                f"most {word_limit} words."
            ),
        },
    ]


def query_check_messages(summary: str, query: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You verify summaries."},
        {
            "role": "user",
            "content": (
                f'Request: "{query}".\nSummary:\n{summary}\n\nDoes the summary answer the '
                "request (about the user's preferences, in the requested form)? Answer "
                "consistent or inconsistent as JSON."
            ),
        },
    ]


def qg_messages(summary: str, n: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You write fact-checking questions."},
        {
            "role": "user",
            "content": (
                f"Summary:\n{summary}\n\nExtract the {n} most important key entities (titles, "
                "genres, people, periods) from the summary. For each, write a question whose "
                f"answer is that entity. Answer as JSON: "
                '[{"question": "...", "answer": "<entity>"}, ...]'
            ),
        },
    ]


def qa_messages(
    acts: Sequence[Mapping[str, Any]], question: str, answer: str
) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You check claims against activity logs."},
        {
            "role": "user",
            "content": (
                "Activity log:\n"
                + "\n".join(_activity_lines(acts))
                + f'\n\nQuestion: {question}\nProposed answer: "{answer}".\nAnswer the question '
                "from the log yourself in a few words, then say whether the proposed answer is "
                "consistent with the log."
            ),
        },
    ]


def predict_messages(
    summary: str,
    options: Sequence[str],
    what: str,
    recent: Sequence[Mapping[str, Any]] | None,
) -> list[dict[str, str]]:
    recent_part = (
        "\n\nTheir most recent activities, newest first:\n" + "\n".join(_activity_lines(recent))
        if recent
        else ""
    )
    opts = "\n".join(f"{letter}. {o}" for letter, o in zip(LETTERS, options, strict=False))
    return [
        {"role": "system", "content": "You predict what a user does next."},
        {
            "role": "user",
            "content": (
                f"Summary of the user's preferences:\n{summary}{recent_part}\n\n"
                f"Which {what} comes next for this user?\n{opts}\n\nAnswer with the letter."
            ),
        },
    ]


# -- running ---------------------------------------------------------------------------------
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
    from recjudge.data import load_dataset, render_item, sample_users
    from recjudge.decoding import Choice, QAPairs, Verdicts
    from recjudge.llm import SamplingConfig, load_llm
    from recjudge.reporting import write_report
    from recjudge.reward import ResultsStore, ask

    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(data)
    if "genres" not in ds.items or ds.items["genres"].isna().all():
        raise ValueError(
            f"dataset {data!r} has no item categories (items column 'genres'); the category "
            "tasks t3/t4 need them. Add a 'genres' column ('|'-separated) to the items file."
        )
    domain = {"movies": "movie watching", "books": "reading"}.get(ds.domain, "activity")
    what_item = {"movies": "movie", "books": "book"}.get(ds.domain, "item")
    query = config.query.format(domain=domain)
    items = ds.items.set_index(ds.items["item_id"].astype(str))
    text = {i: render_item(r, ds.domain) for i, r in items.to_dict("index").items()}
    genres = {
        i: [g for g in str(r).split("|") if g] if r == r and r is not None else []
        for i, r in items["genres"].items()
    }
    all_genres = sorted({g for gs in genres.values() for g in gs})
    lengths = ds.interactions.groupby("user_id", observed=True).size()
    eligible = sorted(str(u) for u, n in lengths.items() if n >= config.min_activities)
    users = sample_users(eligible, config.users, config.seed)
    llms = dict(llms or {})

    def get_llm(name: str) -> Any:
        if name not in llms:
            llms[name] = load_llm(name)
        return llms[name]

    timelines = {}
    for u in users:
        h = ds.history(u).iloc[-config.max_activities :]
        acts = [
            {"item_id": str(i), "text": text[str(i)], "rating": float(r)}
            for i, r in zip(h["item_id"], h["rating"], strict=True)
        ]
        timelines[u] = (acts[: -config.future], acts[-config.future :])

    gen_budget = SamplingConfig(max_new_tokens=int(config.word_limit * 1.6) + 32)
    store = ResultsStore(out / "store.sqlite")
    summaries: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        llm = get_llm(config.model)

        def generate(msgs_list: list[list[dict[str, str]]], desc: str) -> list[str]:
            """Free-text generation, stored per prompt; batches of equal-length prompts."""
            keys = [
                stable_hash(USERSUM_PROMPT_VERSION, "gen", config.model, m, gen_budget.key())
                for m in msgs_list
            ]
            have = store.get_many(keys)
            todo = sorted(
                {k: m for k, m in zip(keys, msgs_list, strict=True) if k not in have}.items(),
                key=lambda km: len(json.dumps(km[1])),
            )
            bar = None
            if progress and todo:
                from tqdm.auto import tqdm

                bar = tqdm(total=len(todo), desc=desc)
            for b in range(0, len(todo), config.batch_size):
                part = todo[b : b + config.batch_size]
                gens = llm.generate([llm.chat_prompt(m) for _, m in part], sampling=gen_budget)
                store.put_many(
                    (k, {"kind": "gen"}, {"text": g.text.strip()})
                    for (k, _), g in zip(part, gens, strict=True)
                )
                if bar is not None:
                    bar.update(len(part))
            if bar is not None:
                bar.close()
            got = store.get_many(keys)
            return [got[k]["text"] for k in keys]

        def closed(msgs_list, schemas, desc, budget=64) -> list[Any]:
            keys = [
                stable_hash(USERSUM_PROMPT_VERSION, "ask", config.model, m, s.key())
                for m, s in zip(msgs_list, schemas, strict=True)
            ]
            have = store.get_many(keys)
            todo = [i for i, k in enumerate(keys) if k not in have]
            for b in range(0, len(todo), config.batch_size):
                part = todo[b : b + config.batch_size]
                answers = ask(
                    llm,
                    [msgs_list[i] for i in part],
                    [schemas[i] for i in part],
                    sampling=SamplingConfig(max_new_tokens=budget),
                    decode_rows=1,  # long prompts of different lengths: decode each alone
                )
                store.put_many(
                    (keys[i], {"kind": desc}, {"value": a.value})
                    for i, a in zip(part, answers, strict=True)
                )
            got = store.get_many(keys)
            return [got[k]["value"] for k in keys]

        if "single" in config.summarizers:
            texts = generate(
                [summary_messages(timelines[u][0], query, config.word_limit) for u in users],
                "summarise: single",
            )
            for u, t in zip(users, texts, strict=True):
                summaries[(u, "single")] = {"text": t}

        if "hierarchy" in config.summarizers:
            segs = {
                u: [
                    timelines[u][0][a:b]
                    for a, b in segment(
                        len(timelines[u][0]), config.min_segment, config.max_segments
                    )
                ]
                for u in users
            }
            jobs = [(u, s) for u in users for s in range(len(segs[u]))]
            feedback = {j: "" for j in jobs}
            seg_text: dict[tuple[str, int], str] = {}
            audit: dict[tuple[str, int], list[dict[str, Any]]] = {j: [] for j in jobs}
            pending = list(jobs)
            verdict = Verdicts(["verdict"], ["consistent", "inconsistent"], analysis_chars=100)
            query_schema = Choice(["consistent", "inconsistent"], answer_key="verdict")
            for rnd in range(config.critique_rounds + 1):
                texts = generate(
                    [
                        summary_messages(segs[u][s], query, config.word_limit, feedback[(u, s)])
                        for u, s in pending
                    ],
                    f"summarise: segments (round {rnd})",
                )
                for j, t in zip(pending, texts, strict=True):
                    seg_text[j] = t
                if rnd == config.critique_rounds:
                    break
                qc = closed(
                    [query_check_messages(seg_text[j], query) for j in pending],
                    [query_schema] * len(pending),
                    "query_check",
                )
                qas = closed(
                    [qg_messages(seg_text[j], config.qa_pairs) for j in pending],
                    [QAPairs(config.qa_pairs)] * len(pending),
                    "qg",
                    budget=90 * config.qa_pairs,
                )
                flat = [
                    (j, qa) for j, pairs in zip(pending, qas, strict=True) for qa in (pairs or [])
                ]
                checks = closed(
                    [qa_messages(segs[j[0]][j[1]], qa["question"], qa["answer"]) for j, qa in flat],
                    [verdict] * len(flat),
                    "qa_check",
                    budget=160,
                )
                bad: dict[tuple[str, int], list[str]] = {}
                for (j, qa), c in zip(flat, checks, strict=True):
                    if c is not None and c["verdict"] == "inconsistent":
                        bad.setdefault(j, []).append(
                            f"- '{qa['answer']}' (for: {qa['question']}) is not supported; "
                            f"the log suggests: {c['analysis']}"
                        )
                for j, q in zip(pending, qc, strict=True):
                    audit[j].append(
                        {
                            "round": rnd,
                            "query_consistent": q is not None and q["verdict"] == "consistent",
                            "qa": len([1 for x in flat if x[0] == j]),
                            "qa_inconsistent": len(bad.get(j, [])),
                        }
                    )
                    if q is not None and q["verdict"] == "inconsistent":
                        bad.setdefault(j, []).insert(
                            0, f"- The summary does not answer the request: {query}."
                        )
                pending = [j for j in pending if j in bad]
                for j in pending:
                    feedback[j] = "\n".join(bad[j])
                if not pending:
                    break
            combined = generate(
                [
                    combine_messages(
                        [seg_text[(u, s)] for s in range(len(segs[u]))], query, config.word_limit
                    )
                    for u in users
                ],
                "summarise: combine",
            )
            for u, t in zip(users, combined, strict=True):
                summaries[(u, "hierarchy")] = {
                    "text": t,
                    "segments": len(segs[u]),
                    "audit": [audit[(u, s)] for s in range(len(segs[u]))],
                    "regenerated": sum(1 for s in range(len(segs[u])) if feedback[(u, s)]),
                }

        # prediction: four tasks x runs, by the predictor's constrained choice
        llm = get_llm(config.predictor)
        letter = Choice(LETTERS)
        seen_items = {u: {a["item_id"] for a in timelines[u][0] + timelines[u][1]} for u in users}
        item_pool = sorted(text)
        qjobs = []
        for (u, name), s in summaries.items():
            past, future = timelines[u]
            nxt = future[0]
            recent = past[::-1][: config.recent]
            cat = (genres.get(nxt["item_id"]) or ["(none)"])[0]
            for r in range(config.runs):
                seed = (config.seed, r, u)
                unseen = [
                    i for i in _sample(item_pool, 60, (seed, "items")) if i not in seen_items[u]
                ]
                i_opts, i_ans = make_mcq(nxt["item_id"], unseen, (seed, "item"))
                c_pool = [g for g in all_genres if g not in genres.get(nxt["item_id"], [])]
                c_opts, c_ans = make_mcq(cat, c_pool, (seed, "category"))
                i_text = [text[i] for i in i_opts]
                for task, opts, ans, rec in (
                    ("t1_item", i_text, i_ans, None),
                    ("t2_item_recent", i_text, i_ans, recent),
                    ("t3_category", c_opts, c_ans, None),
                    ("t4_category_recent", c_opts, c_ans, recent),
                ):
                    what = what_item if task.startswith(("t1", "t2")) else f"{what_item} genre"
                    msgs = predict_messages(s["text"], opts, what, rec)
                    key = stable_hash(
                        USERSUM_PROMPT_VERSION, "predict", config.predictor, msgs, letter.key()
                    )
                    qjobs.append((key, u, name, r, task, msgs, ans))
        have = store.get_many([q[0] for q in qjobs])
        todo = [q for q in dict((q[0], q) for q in qjobs if q[0] not in have).values()]
        todo.sort(key=lambda q: len(json.dumps(q[5])))
        bar = None
        if progress and todo:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(todo), desc="predict")
        for b in range(0, len(todo), 8):
            part = todo[b : b + 8]
            answers = ask(
                llm,
                [q[5] for q in part],
                letter,
                sampling=SamplingConfig(max_new_tokens=16),
                decode_rows=1,
            )
            store.put_many(
                (
                    q[0],
                    {"kind": "predict", "task": q[4]},
                    {"letter": a.value["answer"], "p": list(a.record.p_before)},
                )
                for q, a in zip(part, answers, strict=True)
            )
            if bar is not None:
                bar.update(len(part))
        if bar is not None:
            bar.close()
        got = store.get_many([q[0] for q in qjobs])
    finally:
        store.close()

    per_run: dict[str, list[dict[str, float]]] = {}
    rows = []
    for name in config.summarizers:
        for r in range(config.runs):
            recs = []
            for u in users:
                correct = {}
                for key, qu, qn, qr, task, _, ans in qjobs:
                    if (qu, qn, qr) == (u, name, r):
                        correct[task] = got[key]["letter"] == ans
                s = summaries[(u, name)]
                recs.append({"text": s["text"], "correct": [correct[t] for t in TASKS]})
                rows.append({"user_id": u, "summarizer": name, "run": r, **correct})
            per_run.setdefault(name, []).append(usersum_metrics(recs, config.word_limit, config.m))
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
            (summaries[(u, name)]["text"], "\n".join(a["text"] for a in timelines[u][0]))
            for u in users
        ]
        table[name]["rouge2"] = float(np.mean([rouge_n(c, r_, 2) for c, r_ in ref]))
        table[name]["rougeL"] = float(np.mean([rouge_l(c, r_) for c, r_ in ref]))
        table[name]["bleu"] = float(np.mean([bleu(c, r_) for c, r_ in ref]))
        table[name]["words"] = float(np.mean([word_count(c) for c, _ in ref]))
        table[name]["per_task_accuracy"] = {
            t: float(np.mean([x[t] for x in rows if x["summarizer"] == name])) for t in TASKS
        }
    with open(out / "summaries.jsonl", "w", encoding="utf-8") as f:
        for (u, name), s in summaries.items():
            f.write(json.dumps({"user_id": u, "summarizer": name, **s}, ensure_ascii=False) + "\n")
    results = {
        "config": config.model_dump(),
        "data": data,
        "users": users,
        "wall_seconds": round(time.time() - t0, 1),
        "table": table,
        "per_run": per_run,
        "answers": rows,
    }
    _plot(table, out / "metrics.png")
    write_report(out, results, _report(config, data, results))
    return results


def _sample(pool: Sequence[str], n: int, seed: Any) -> list[str]:
    idx = rng("usersum-pool", seed).choice(len(pool), size=min(n, len(pool)), replace=False)
    return [pool[i] for i in idx]


def _plot(table: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    metrics = ("qm", "ifm", "task_accuracy")
    fig, ax = plt.subplots(figsize=(7, 4))
    w = 0.8 / max(len(names), 1)
    for k, n in enumerate(names):
        xs = np.arange(len(metrics)) + k * w
        ax.bar(
            xs,
            [table[n][m]["mean"] for m in metrics],
            w,
            yerr=[table[n][m]["sd"] for m in metrics],
            capsize=3,
            label=n,
        )
    ax.set_xticks(np.arange(len(metrics)) + w * (len(names) - 1) / 2)
    ax.set_xticklabels(["QM", "IFM", "mean task accuracy"])
    ax.set_ylabel("score (mean +- sd over prediction runs)")
    ax.set_ylim(0, 1.05)
    ax.axhline(0.2, color="grey", ls=":", lw=1, label="chance per task (1/5)")
    ax.legend()
    ax.set_title("UserSumBench: summariser comparison")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _report(config: UserSumConfig, data: str, results: Mapping[str, Any]) -> list[str]:
    t = results["table"]
    lines = [
        f"# UserSumBench on {data}",
        "",
        f"Summariser `{config.model}`, predictor `{config.predictor}`; {len(results['users'])} "
        f"users with >= {config.min_activities} activities (most recent {config.max_activities}, "
        f"last {config.future} held out as the future); word limit {config.word_limit}; "
        f"N_r = {config.recent}; Q_s needs {config.m}/4 tasks; {config.runs} prediction runs "
        f"(different option samples and orders), seed {config.seed}. Hierarchy: segments of >= "
        f"{config.min_segment} activities (at most {config.max_segments}), "
        f"{config.critique_rounds} critique rounds, {config.qa_pairs} QA pairs per segment. "
        f"Wall time {results['wall_seconds']} s.",
        "",
        "| summariser | QM | IFM | IDM (x1000) | task acc. | words | ROUGE-2 | ROUGE-L | BLEU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, v in t.items():
        lines.append(
            f"| {n} | {v['qm']['mean']:.3f} +- {v['qm']['sd']:.3f} | {v['ifm']['mean']:.3f} +- "
            f"{v['ifm']['sd']:.3f} | {1000 * v['idm']['mean']:.2f} +- {1000 * v['idm']['sd']:.2f} "
            f"| {v['task_accuracy']['mean']:.3f} | {v['words']:.0f} | {v['rouge2']:.3f} | "
            f"{v['rougeL']:.3f} | {v['bleu']:.3f} |"
        )
    lines += ["", "Per-task accuracy (all runs; chance = 0.2):", ""]
    for n, v in t.items():
        lines.append(
            f"- {n}: " + ", ".join(f"{k} {a:.3f}" for k, a in v["per_task_accuracy"].items())
        )
    lines += ["", "![metrics](metrics.png)"]
    return lines
