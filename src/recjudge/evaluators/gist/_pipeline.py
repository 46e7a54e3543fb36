"""GISTBench pipeline: extraction by the models under test, then verification by the judge
(evidence filter + predicate, taxonomy, specificity) and scoring.

``run_gist`` extracts interests with our models; ``verify_profiles`` takes interest profiles
from the user's own system and runs the same verification, so their records and scores are
the same kind as ``run_gist``'s (``gist score`` reads both).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tqdm.auto import tqdm

from recjudge._util import (
    UserFacingError,
    atomic_write_json,
    atomic_write_text,
    cache_dir,
    json_loads,
    rng,
)
from recjudge.data import (
    DataError,
    TitleScreen,
    clean_text,
    item_title,
    load_dataset,
    render_item,
    sample_users,
)
from recjudge.decoding import Choice, CitedList, Picks
from recjudge.evaluators._cost import AskMeter
from recjudge.evaluators.gist._gist import (
    EVENT_SIGNAL,
    GIST_PROMPT_VERSION,
    SIGNALS,
    GistConfig,
    build_oracle,
    echoes_example,
    embed_texts,
    extraction_messages,
    gist_differences,
    gist_intervals,
    gist_scores,
    global_pool,
    load_categories,
    names_signal,
    normalize_interest,
    relevance_messages,
    shortlist_categories,
    specificity_evidence,
    specificity_messages,
    specificity_options,
    taxonomy_full_messages,
    taxonomy_messages,
)
from recjudge.evaluators.gist._report import gist_report, plot_pr
from recjudge.evaluators.offline._runs import Tally
from recjudge.llm import LLMPool, SamplingConfig, capabilities_of
from recjudge.reporting import write_report
from recjudge.reward import (
    ResultsStore,
    StoredAsk,
    StoreError,
    adopt_former,
    adopt_shared,
    ask_key,
    ask_shared,
    ask_stored,
    choose,
    choose_shared,
    closed_form,
    run_stored,
)

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

log = logging.getLogger(__name__)


@dataclass
class _Interest:
    user_id: str
    model: str
    interest: str
    ids: list[str]
    over_limit_citations: int = 0  # citations of objects already cited max_citations times


def _open_pool(config: GistConfig, llms: Mapping[str, Any] | None, needed: Sequence[str]):
    """The run's backends, checked before any work: a missing model fails, and so does a
    ready backend that batches in its own engine (vLLM, an OpenAI-compatible server) in a
    deterministic run, which could not keep its promise. Models given by name load on
    transformers, so the ready ones are all there is to check."""
    for name, llm in (llms or {}).items():
        if config.deterministic and not capabilities_of(llm).batch_invariant:
            raise UserFacingError(
                f"deterministic runs need transformers backends: {name} runs in its own "
                "engine (vLLM or an OpenAI-compatible server), which batches requests on its "
                "own; drop --deterministic or give the model's preset or path"
            )
    return LLMPool(llms, needed=needed)


@dataclass
class _Run:
    """What every stage needs: settings, data, the store and loaded models."""

    config: GistConfig
    ds: Any
    users: list[str]
    histories: dict[str, list[tuple[str, str]]]  # most recent first: (item_id, event_type)
    text: dict[str, str]
    word: str
    titles: dict[str, str]  # item_id -> title (screens answers bound for a checkpoint)
    store: Any
    progress: bool
    llms: Any  # LLMPool
    cost: AskMeter = field(default_factory=AskMeter)
    #: a question's keys under the LLM settings' earlier forms (``_key``), by its key
    formerly: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: the judge answers every run shares (``GistConfig.share_judge_answers``)
    shared: Any = None

    def close(self) -> None:
        self.store.close()
        if self.shared is not None:
            self.shared.close()

    def llm(self, name: str) -> Any:
        return self.llms.get(name)

    @property
    def judge(self) -> Any:
        return self.llm(self.config.judge)

    def bar(self, total: int, desc: str) -> Any:
        if not (self.progress and total):
            return None

        return tqdm(total=total, desc=desc)


#: GISTBench's settings at the values every key was made under before they were keyed
LEGACY_SETTINGS = {"deterministic": False, "extraction_tokens": 1024}


def _key(run: _Run, model: str, *parts: Any, **settings: Any) -> str:
    """A GISTBench question's key: ``parts`` after the prompt version, the LLM settings of
    ``model`` (the one that answers), the batch-invariant engine, and ``settings`` (the
    extraction budget: a cut answer is another answer)."""
    settings = {"deterministic": run.config.deterministic, **settings}
    key = ask_key(GIST_PROMPT_VERSION, *parts, llm=run.llms.key(model), settings=settings,
                  legacy=LEGACY_SETTINGS)  # fmt: skip
    former = tuple(ask_key(GIST_PROMPT_VERSION, *parts, llm=f, settings=settings,
                           legacy=LEGACY_SETTINGS) for f in run.llms.former(model))  # fmt: skip
    if former:
        run.formerly[key] = former
    return key


def _with_formerly(run: _Run, asks: Sequence[StoredAsk]) -> list[StoredAsk]:
    """``asks`` with the keys ``_key`` recorded for them under former LLM settings as
    ``formerly``."""
    return [replace(a, formerly=(*a.formerly, *run.formerly[a.key])) if a.key in run.formerly
            else a for a in asks]  # fmt: skip


def _adopted(run: _Run, asks: Sequence[StoredAsk]) -> list[StoredAsk]:
    """``_with_formerly``, their former answers adopted in the store at once, and the shared
    judge answers copied in (before the meter counts what it lacks)."""
    out = _with_formerly(run, asks)
    adopt_former(run.store, out)
    if run.shared is not None:
        missing = set(run.store.missing([a.key for a in out]))
        adopt_shared(run.store, run.shared, [a for a in out if a.key in missing])
    return out


def _ask_stored(
    run: _Run,
    llm: LLMBackend,
    asks: Sequence[StoredAsk],
    desc: str,
    sampling: Any,
    kind: str = "judge",
) -> None:
    """The reward core's stored loop with this run's store and batch size, metered under
    ``kind``. A batch decodes its rows together: on extraction answers (1.5B, 8 questions,
    ``recjudge bench run decode-rows``) 8 rows per step were 1.97x faster than 1."""
    asks = _adopted(run, asks)
    run.cost.measure(
        kind,
        run.store,
        [a.key for a in asks],
        lambda: ask_stored(
            llm,
            run.store,
            asks,
            sampling=sampling,
            batch_size=run.config.batch_size,
            desc=desc,
            progress=run.progress,
            deterministic=run.config.deterministic,
            shared=None if kind == "extraction" else run.shared,
        ),
    )


def _judge_stored(
    run: _Run, asks: Sequence[StoredAsk], answer: Any, desc: str, batch_size: int | None = None
) -> dict[str, dict[str, Any]]:
    """``run_stored`` with a custom ``answer(batch) -> results`` (shared prefixes, whole-name
    choices), metered as judge questions; results by key, in the asks' order."""
    asks = _adopted(run, asks)
    return run.cost.measure(
        "judge",
        run.store,
        [q.key for q in asks],
        lambda: run_stored(
            run.store,
            asks,
            answer,
            batch_size=batch_size or run.config.batch_size,
            desc=desc,
            progress=run.progress,
            shared=run.shared,
        ),
    )


def judge_answers_path() -> Path:
    """The store of judge answers every GISTBench run shares (``share_judge_answers``)."""
    return cache_dir() / "gist" / "judge-answers.sqlite"


def _open_run(config, ds, users, out: Path, pool, progress, max_history, answers=None) -> _Run:
    histories, text, word, titles = _texts(ds, users, max_history)
    out.mkdir(parents=True, exist_ok=True)
    store = ResultsStore(out / "store.sqlite")
    shared = None
    if config.share_judge_answers:
        try:
            shared = ResultsStore(answers if answers is not None else judge_answers_path())
        except (StoreError, OSError) as e:  # a speed-up only: the run goes on without it
            log.warning("the shared GISTBench judge answers are not used (%s); this run asks "
                        "everything its own store lacks", e)  # fmt: skip
    return _Run(config, ds, users, histories, text, word, titles, store, progress, pool,
                shared=shared)  # fmt: skip


def _texts(ds, users, max_history) -> tuple[dict[str, list[tuple[str, str]]], dict, str, dict]:
    """Each user's history (most recent first), every item's text, the domain's word and
    every item's title."""
    histories = {}
    for u in users:
        h = ds.history(u).iloc[::-1]
        if max_history:
            h = h.iloc[:max_history]
        histories[u] = list(zip(h["item_id"].astype(str), h["event_type"].astype(str), strict=True))
    records = dict(zip(ds.items["item_id"].astype(str), ds.items.to_dict("records"), strict=True))
    text = {i: render_item(r, ds.domain) for i, r in records.items()}
    titles = {i: item_title(r) for i, r in records.items()}  # the title as the prompt shows it
    word = {"movies": "movies", "books": "books"}.get(ds.domain, "items")
    return histories, text, word, titles


def _sampled_users(config: GistConfig, ds: Any) -> list[str]:
    """``config.users`` users with at least ``min_history`` interactions (sha256 order)."""
    lengths = ds.interactions.groupby("user_id", observed=True).size()
    eligible = sorted(str(u) for u, n in lengths.items() if n >= config.min_history)
    return sample_users(eligible, config.users, config.seed)


def gist_extraction_asks(config: GistConfig, data: str = "ml-1m") -> list[StoredAsk]:
    """The extraction questions ``run_gist`` asks for ``config`` on ``data`` (every model,
    sampled user and history chunk), for benchmarks that time the engine on GISTBench's
    longest answers. Nothing is asked or stored."""
    ds = load_dataset(data)
    users = _sampled_users(config, ds)
    histories, text, word, titles = _texts(ds, users, config.max_history)
    run = _Run(config, ds, users, histories, text, word, titles, None, False, LLMPool())
    return _with_formerly(run, _extraction_asks(run))


# -- 1. extraction -------------------------------------------------------------------------
def _extracted(a: Any) -> dict[str, Any]:
    return {"value": a.value, "text": a.text, "complete": a.value is not None}


_INTEREST_TEXT = re.compile(r'"interest": "([^"]*)')  # the grammar's words have no quotes


def _title_free_extraction(screen: Any) -> Any:
    """``StoredAsk.portable`` of an extraction answer: the answer itself if none of its
    interest phrases (a cut-off last one included) names a title of the user's history,
    else ``None`` (it stays on this machine and a resumed run elsewhere asks it again).
    The cited ids are history positions, not item ids."""

    def form(result: dict[str, Any]) -> dict[str, Any] | None:
        phrases = _INTEREST_TEXT.findall(result.get("text") or "")
        phrases += [str(e.get("interest", "")) for e in result.get("value") or []]
        return None if any(screen.names_title(p) for p in phrases) else dict(result)

    return form


def _extraction_asks(run: _Run) -> list[StoredAsk]:
    """One stored extraction question per (model, user, chunk of ``chunk_size``); the
    request records model and user."""
    c = run.config
    screens = {
        u: _title_free_extraction(
            TitleScreen(run.titles.get(i, i) for i in run.ds.history(u)["item_id"].astype(str))
        )
        for u in run.users
    }
    asks = []
    for m in c.models:
        for u in run.users:
            h = run.histories[u]
            for start in range(0, len(h), c.chunk_size):
                chunk = h[start : start + c.chunk_size]
                # Object ids are positions in the user's history (most recent = 1): short,
                # and unique across the user's chunks.
                ids = [str(start + k + 1) for k in range(len(chunk))]
                lines = [f"[{o}] {e} - {run.text[i]}" for o, (i, e) in zip(ids, chunk, strict=True)]
                msgs = extraction_messages(lines, run.word, c)
                schema = CitedList(
                    ids,
                    max_words=c.words[1],
                    min_words=c.words[0],
                    max_items=c.max_interests,
                    max_ids=c.max_ids,
                )
                key = _key(
                    run, m, "extract", m, msgs, schema.key(), extraction_tokens=c.extraction_tokens
                )
                req = {"kind": "extract", "model": m, "user_id": u, "chunk_start": start}
                asks.append(StoredAsk(key, req, msgs, schema, _extracted, screens[u]))
    return asks


def _extract(run: _Run) -> tuple[list[_Interest], int]:
    """Interests per (model, user), merged over chunks; and how many answers were cut."""
    c = run.config
    asks = _extraction_asks(run)
    budget = SamplingConfig(max_new_tokens=c.extraction_tokens)
    for m in c.models:
        mine = [a for a in asks if a.request["model"] == m]
        _ask_stored(run, run.llm(m), mine, f"extract {m}", budget, kind="extraction")
        if m != c.judge:
            run.llms.release(m)  # free memory before the next model
    done = run.store.get_many([a.key for a in asks])
    incomplete = 0
    merged: dict[tuple[str, str, str], _Interest] = {}
    for a in asks:
        m, u = a.request["model"], a.request["user_id"]
        value = done[a.key]["value"]
        if value is None:  # token budget ran out mid-answer: salvage complete entries
            incomplete += 1
            value = _salvage(done[a.key]["text"])
        for entry in value:
            name = " ".join(str(entry.get("interest", "")).split())
            if not name:
                continue
            it = merged.setdefault((m, u, normalize_interest(name)), _Interest(u, m, name, []))
            cited = [run.histories[u][int(o) - 1][0] for o in entry.get("ids", [])]
            it.ids = list(dict.fromkeys([*it.ids, *cited]))
    return list(merged.values()), incomplete


def _salvage(text: str) -> list[dict[str, Any]]:
    """Complete ``{"interest": ..., "ids": [...]}`` entries of a cut-off answer."""
    out = []
    for m in re.finditer(r'\{"interest": "([^"]*)", "ids": \[([^\]]*)\]\}', text):
        ids = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2))
        out.append({"interest": m.group(1), "ids": [json.loads(f'"{i}"') for i in ids]})
    return out


def _count_citations(interests: list[_Interest], max_citations: int, enforce: bool) -> None:
    """The paper's rule "cite an object in at most ``max_citations`` interests" (per model
    and user) is instructed in the prompt; here each citation beyond it is counted on its
    interest, and dropped only with ``enforce``."""
    uses: dict[tuple[str, str, str], int] = {}
    for it in interests:
        kept = []
        for i in it.ids:
            k = (it.model, it.user_id, i)
            uses[k] = uses.get(k, 0) + 1
            if uses[k] > max_citations:
                it.over_limit_citations += 1
                if enforce:
                    continue
            kept.append(i)
        it.ids = kept


# -- 2. verification -----------------------------------------------------------------------
def _relevant(
    run: _Run, pairs: Sequence[tuple[str, str]], desc: str
) -> dict[tuple[str, str], tuple[bool, float]]:
    """(interest, item_id) -> the judge's YES/NO and P(YES); shared prefix per interest."""
    c = run.config
    asks = sorted(
        (
            StoredAsk(
                _key(run, c.judge, "relevant", c.judge, p[0], run.text[p[1]]),
                {"kind": "relevant", "interest": p[0], "item_id": p[1]},
                relevance_messages(p[0], run.word),
                portable=closed_form,
            )
            for p in dict.fromkeys(pairs)
        ),
        key=lambda q: q.request["interest"],
    )

    def answer(part: list[StoredAsk]) -> list[dict[str, Any]]:
        out = []  # one shared prefix per interest: the batch is grouped by interest
        for _, grp in itertools.groupby(part, key=lambda q: q.request["interest"]):
            group = list(grp)
            answers = ask_shared(
                run.judge,
                group[0].messages,
                [run.text[q.request["item_id"]] for q in group],
                Choice(["YES", "NO"]),
                sampling=SamplingConfig(max_new_tokens=16),
                decode_rows=c.batch_size,
                deterministic=c.deterministic,
            )
            out += [
                {"yes": x.value["answer"] == "YES", "p": list(x.record.p_before)} for x in answers
            ]
        return out

    # asks are sorted by interest and run_stored keeps their order
    got = _judge_stored(run, asks, answer, desc, batch_size=8 * c.batch_size)
    return {
        (q.request["interest"], q.request["item_id"]): (
            bool(got[q.key]["yes"]),
            float(got[q.key]["p"][0]),
        )
        for q in asks
    }


def _ground(run: _Run, interests: Sequence[_Interest]) -> list[dict[str, Any]]:
    """Evidence filter by the judge, then the signal-count predicate: one record each."""
    rel = _relevant(
        run, [(it.interest, i) for it in interests for i in it.ids], "judge: evidence filter"
    )
    # An object the user engaged with more than once (a view, then a rating) counts under
    # every event type it has in the shown history, as GISTBench's official code counts it;
    # a dict over the history would keep only one of its events.
    events_of: dict[str, dict[str, list[str]]] = {}
    for u, h in run.histories.items():
        mine = events_of.setdefault(u, {})
        for i, e in h:
            if e not in mine.setdefault(i, []):
                mine[i].append(e)
    records = []
    for it in interests:
        surviving = [i for i in it.ids if rel[(it.interest, i)][0]]
        counts = {s: 0 for s in SIGNALS}
        for i in surviving:
            for e in events_of[it.user_id][i]:
                counts[EVENT_SIGNAL[e]] += 1
        verified, reasons = run.config.predicate.check(counts)
        records.append(
            {
                "user_id": it.user_id,
                "model": it.model,
                "interest": it.interest,
                "cited": it.ids,
                "surviving": surviving,
                "counts": counts,
                "verified": verified,
                "reasons": reasons,
                "over_limit_citations": it.over_limit_citations,
            }
        )
    return records


def _categorize(run: _Run, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each unique interest string -> one of the 325 categories (shared by all models):
    chosen among all of them (``full``, the paper) or among a shortlist, whose agreement with
    the full choice is then measured on a seeded sample and returned."""
    c = run.config
    if c.taxonomy == "off":
        for r in records:
            r["category_id"] = normalize_interest(r["interest"])
        return {}
    categories = load_categories()
    uniq = sorted({r["interest"] for r in records})
    extra: dict[str, Any] = {"taxonomy_rule": taxonomy_rule(run.judge)}
    if c.taxonomy == "full":
        chosen = _taxonomy_full(run, uniq, categories)
    else:
        chosen = _taxonomy_shortlist(run, uniq, categories)
        order = rng("gist-taxonomy-agreement", c.seed).permutation(len(uniq))
        sample = [uniq[i] for i in order[: c.agreement_sample]]
        if sample:
            full = _taxonomy_full(run, sample, categories)
            agree = sum(full[s] == chosen[s] for s in sample)
            extra["taxonomy_agreement"] = {
                "n": len(sample),
                "agree": agree,
                "agree_pct": 100.0 * agree / len(sample),
            }
    for r in records:
        r["category_id"] = chosen[r["interest"]]
        r["category"] = categories[r["category_id"]]
    return extra


def _category_result(cat_ids: list[int], cat_names: list[str]) -> Any:
    def result(a: Any) -> dict[str, Any]:
        return {
            "category_id": cat_ids[cat_names.index(a.value["category"])],
            "category": a.value["category"],
        }

    return result


def _taxonomy_full(run: _Run, interests: Sequence[str], categories: dict[int, str]) -> dict:
    """The judge picks one of all the categories; the category list is a prefix shared by
    every interest (encoded once), the interest sits at the end.

    The pick is the category whose whole answer is most likely (``choose_shared``: exact,
    lm-eval's multiple-choice rule) on a judge the fast engine runs. Decoding the name under
    a grammar instead commits to its first letters: the judge starts the interest's own word
    and is forced into whichever category begins so ('Drama and Romance' -> 'Diving', every
    'Comedy and ...' -> 'Comedy Challenges'); that rule is left only for other judges
    (vLLM, ...), with a warning, and ``taxonomy_rule`` in the results says which ran.
    """
    c = run.config
    cat_ids, cat_names = list(categories), list(categories.values())
    msgs = taxonomy_full_messages(cat_names)
    rule = taxonomy_rule(run.judge)
    kind = "taxonomy-likelihood" if rule == "likelihood" else "taxonomy-full"
    asks = [
        StoredAsk(
            _key(run, c.judge, kind, c.judge, msgs, s),
            {"kind": kind, "interest": s},
            msgs,
            portable=closed_form,
        )
        for s in interests
    ]
    schema, result = Choice(cat_names, answer_key="category"), _category_result(cat_ids, cat_names)

    def answer(part: list[StoredAsk]) -> list[dict[str, Any]]:
        fills = [q.request["interest"] for q in part]
        if rule == "likelihood":
            return [
                _likelihood_result(cat_ids, cat_names, b.index, b)
                for b in choose_shared(run.judge, msgs, fills, cat_names, answer_key="category")
            ]
        return [
            result(a)
            for a in ask_shared(
                run.judge,
                msgs,
                fills,
                schema,
                sampling=SamplingConfig(max_new_tokens=48),
                decode_rows=len(part),
            )
        ]

    if rule == "greedy" and interests:
        log.warning(
            "%s: the taxonomy is decoded token by token (this judge has no whole-option "
            "scoring): interests fall into categories that share their first letters",
            c.judge,
        )
    got = _judge_stored(run, asks, answer, f"judge: taxonomy ({len(cat_names)})")
    return {q.request["interest"]: got[q.key]["category_id"] for q in asks}


def taxonomy_rule(judge: Any) -> str:
    """How the full taxonomy picks a category with this judge: ``likelihood`` (whole names,
    where the backend scores whole options) or ``greedy`` (grammar-constrained decoding)."""
    return "likelihood" if capabilities_of(judge).option_scoring else "greedy"


def _taxonomy_shortlist(run: _Run, interests: Sequence[str], categories: dict[int, str]) -> dict:
    """The judge picks among ``shortlist`` categories preselected by similarity (faster; a
    deviation from the paper), by the rule of ``taxonomy_rule`` as the full choice."""
    c = run.config
    cat_ids, cat_names = list(categories), list(categories.values())
    rule = taxonomy_rule(run.judge)
    kind = "taxonomy" if rule == "greedy" else "taxonomy-likelihood-shortlist"
    keys = {s: _key(run, c.judge, kind, c.judge, s, c.shortlist) for s in interests}
    have = run.store.get_many(list(keys.values()))
    todo = [s for s in interests if keys[s] not in have]
    if todo:
        short = shortlist_categories(
            embed_texts(run.judge, todo),
            todo,
            embed_texts(run.judge, cat_names),
            cat_names,
            c.shortlist,
        )
        asks = []
        for i, name in enumerate(todo):
            names = [cat_names[j] for j in short[i]]
            asks.append(
                StoredAsk(
                    keys[name],
                    {"kind": kind, "interest": name, "options": names},
                    taxonomy_messages(name, names),
                    Choice(names, answer_key="category"),
                    _category_result(cat_ids, cat_names),
                    closed_form,
                )
            )
        if rule == "greedy":
            _ask_stored(run, run.judge, asks, "judge: taxonomy", SamplingConfig(max_new_tokens=48))
        else:
            _choose_stored(run, asks, cat_ids, cat_names)
    got = run.store.get_many(list(keys.values()))
    return {s: got[keys[s]]["category_id"] for s in interests}


def _choose_stored(run: _Run, asks: list[StoredAsk], cat_ids: list[int], cat_names: list[str]):
    """Each shortlist question answered by whole-name likelihood (``reward.choose``)."""

    def answer(part: list[StoredAsk]) -> list[dict[str, Any]]:
        got = choose(
            run.judge,
            [q.messages for q in part],
            [q.request["options"] for q in part],
            answer_key="category",
        )
        return [
            _likelihood_result(
                cat_ids, cat_names, cat_names.index(q.request["options"][b.index]), b
            )
            for q, b in zip(part, got, strict=True)
        ]

    _judge_stored(run, asks, answer, "judge: taxonomy")


def _likelihood_result(cat_ids: list[int], cat_names: list[str], i: int, best: Any) -> dict:
    return {"category_id": cat_ids[i], "category": cat_names[i], "logprob": best.logprob}


# -- 3. specificity ------------------------------------------------------------------------
@dataclass
class _SpecJob:
    """One interest's specificity question before its distractors are chosen."""

    record: dict[str, Any]
    evidence: list[str]  # sampled from the cited set
    candidates: list[str]  # distractor candidates in seeded order (never the user's items)
    seed: Any


@dataclass
class _Pick:
    """The asked question and which options were evidence."""

    ask: StoredAsk
    record: dict[str, Any]
    is_evidence: list[bool]


def _distractors(run: _Run, jobs: Sequence[_SpecJob]) -> list[tuple[list[str], int]]:
    """Per job: distractors the judge calls unrelated to the interest, and how many had to
    be filled.

    At most ``4 * options`` candidates are examined per interest: a judge that calls (nearly)
    everything related would exhaust the pool. If too few pass, the gap is filled with the
    examined objects the judge found least related (counted as ``filled``).
    """
    c = run.config
    need = [c.options - len(j.evidence) for j in jobs]
    chosen: list[list[str]] = [[] for _ in jobs]
    rejected: list[list[tuple[float, str]]] = [[] for _ in jobs]
    offset = [0] * len(jobs)
    limit = 4 * c.options
    while True:
        asks = []
        for n, job in enumerate(jobs):
            short_by = need[n] - len(chosen[n])
            if short_by <= 0 or offset[n] >= min(len(job.candidates), limit):
                continue
            end = min(offset[n] + short_by + max(2, short_by // 5), limit)
            asks.append((n, job.candidates[offset[n] : end]))
        if not asks:
            break
        verdicts = _relevant(
            run,
            [(jobs[n].record["interest"], i) for n, take in asks for i in take],
            "judge: distractors",
        )
        for n, take in asks:
            offset[n] += len(take)
            for i in take:
                yes, p_yes = verdicts[(jobs[n].record["interest"], i)]
                if yes:
                    rejected[n].append((p_yes, i))
                elif len(chosen[n]) < need[n]:
                    chosen[n].append(i)
    out = []
    for n in range(len(jobs)):
        gap = max(need[n] - len(chosen[n]), 0)
        out.append((chosen[n] + [i for _, i in sorted(rejected[n])[:gap]], gap))
    return out


def _spec_jobs(run: _Run, records: list[dict[str, Any]], pool: Sequence[str]) -> list[_SpecJob]:
    c = run.config
    jobs = []
    for r in records:
        seed = (c.seed, r["user_id"], r["model"], r["interest"])
        # n = min(|O_j|, 5) objects sampled from the cited set O_j (GISTBench 4.3).
        evidence = specificity_evidence(r["cited"], c.evidence_for_specificity, seed)
        if not evidence or len(evidence) >= c.options:
            r["correct"], r["backing"] = 0, 0
            continue
        # Distractors are never the user's own items, however old (GISTBench 4.3).
        seen = set(run.ds.history(r["user_id"])["item_id"].astype(str))
        # The candidates' order depends on the interest alone: the judge's verdicts are
        # stored per (interest, object), so every user and model naming the same interest
        # reuses them (ML-1M at size: 258 cited interests, 147 distinct strings).
        order = rng("gist-distractors", (c.seed, r["interest"])).permutation(len(pool))
        jobs.append(_SpecJob(r, evidence, [pool[i] for i in order if pool[i] not in seen], seed))
    return jobs


def _specificity(run: _Run, records: list[dict[str, Any]]) -> int:
    """Ask the judge to find each interest's n evidence objects among distractors; sets
    ``correct``, ``backing``, ``distractors``, ``filled``. Returns the pool size."""
    c = run.config
    by_user = run.ds.interactions.groupby("user_id", observed=True)["item_id"]
    pool = global_pool({str(u): sorted(map(str, s)) for u, s in by_user}, c.pool_size, c.seed)
    jobs = _spec_jobs(run, records, pool)
    picks = []
    for job, (distract, filled) in zip(jobs, _distractors(run, jobs), strict=True):
        r = job.record
        r["filled"] = filled
        opts, is_ev = specificity_options(job.evidence, distract, job.seed)
        msgs = specificity_messages(
            r["interest"], [run.text[o] for o in opts], len(job.evidence), run.word
        )
        schema = Picks([str(i + 1) for i in range(len(opts))], len(job.evidence))
        key = _key(run, c.judge, "specificity", c.judge, msgs, schema.key())
        ask = StoredAsk(
            key,
            {"kind": "specificity", "interest": r["interest"]},
            msgs,
            schema,
            lambda a: {"picks": a.value},
            closed_form,
        )
        picks.append(_Pick(ask, r, is_ev))
    budget = SamplingConfig(max_new_tokens=8 * c.evidence_for_specificity + 16)
    asks = sorted((p.ask for p in picks), key=lambda a: len(a.messages[1]["content"]))
    _ask_stored(run, run.judge, asks, "judge: specificity", budget)
    got = run.store.get_many([p.ask.key for p in picks])
    for p in picks:
        p.record["correct"] = sum(bool(p.is_evidence[int(x) - 1]) for x in got[p.ask.key]["picks"])
        p.record["backing"] = int(sum(p.is_evidence))
        p.record["distractors"] = len(p.is_evidence) - int(sum(p.is_evidence))
    return len(pool)


def _verify(run: _Run, interests: list[_Interest]) -> tuple[list[dict[str, Any]], dict]:
    """Ground, categorize and test specificity; the records and run-level facts."""
    _count_citations(interests, run.config.max_citations, run.config.enforce_citations)
    records = _ground(run, interests)
    extra = _categorize(run, records)
    return records, {"pool_size": _specificity(run, records), **extra}


def _finish(
    run: _Run, records, out: Path, data: str, oracle, extra: dict, t0: float, models=()
) -> dict:
    """Scores, ``interests.jsonl``, ``oracle.json``, ``results.json``, report and PNG.

    ``models``: the models under test, scored even if they wrote no interest at all.
    """
    oracle = build_oracle(records) if oracle is None else oracle
    scores = gist_scores(records, oracle, run.users, models)
    atomic_write_text(
        out / "interests.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    )
    atomic_write_json(out / "oracle.json", {"oracle": oracle})
    results = {
        "config": run.config.model_dump(),
        "deviations": run.config.deviations(),
        "data": data,
        "users": run.users,
        **extra,
        "over_limit_citations": sum(r.get("over_limit_citations", 0) for r in records),
        "filled_distractors": sum(r.get("filled", 0) for r in records),
        "wall_seconds": round(time.time() - t0, 1),
        "cost": run.cost.summary(),
        "scores": scores,
        "intervals": gist_intervals(scores, run.config.bootstrap, run.config.seed),
        "differences": gist_differences(scores, run.config.bootstrap, run.config.seed),
    }
    plot_pr(scores, out / "pr.png", data)
    write_report(out, results, gist_report(run.config, data, results))
    return results


def run_gist(
    config: GistConfig,
    data: str = "ml-1m",
    out: str | Path = "reports/gist",
    llms: Mapping[str, Any] | None = None,
    progress: bool = True,
    answers: str | Path | None = None,
) -> dict[str, Any]:
    """Run GISTBench for every model in ``config.models`` on ``data``; write
    ``interests.jsonl``, ``oracle.json``, ``results.json``, ``report.md`` and ``pr.png``.

    Every model and judge answer is stored in ``out/store.sqlite`` under a key of its
    prompt and settings, so a rerun resumes and a second model reuses the judge's answers.

    Args:
        llms: already loaded backends by model name (tests); others are loaded on demand.
        answers: the store of judge answers every run shares (default
            ``judge_answers_path()``; unused without ``config.share_judge_answers``).
    """
    t0 = time.time()
    out = Path(out)
    pool = _open_pool(config, llms, (*config.models, config.judge))
    ds = load_dataset(data)
    users = _sampled_users(config, ds)
    run = _open_run(config, ds, users, out, pool, progress, config.max_history, answers)
    try:
        interests, incomplete = _extract(run)
        records, facts = _verify(run, interests)
    finally:
        run.close()
    for r in records:  # only answers to our prompt can echo its example (not ``gist verify``)
        r["echoes_example"] = echoes_example(r["interest"], config.interest_example)
        r["names_signal"] = names_signal(r["interest"])
    facts |= {"incomplete_extractions": incomplete, "prompt_example": config.interest_example}
    return _finish(run, records, out, data, None, facts, t0, config.models)


# -- profiles from the user's own system ---------------------------------------------------
_PROFILE_FIX = (
    'one JSON object per line: {"user_id": "...", "interests": [{"name": "...", '
    '"object_ids": ["item id", ...]}]} (object ids from the user\'s history)'
)


PROFILE_INTEREST_CAP = 200  # interests verified per profile (GISTBench's models write ~10)


@dataclass
class ProfileCheck(Tally):
    """What a profile file held and what the documented rules did (counts + examples):
    users the dataset lacks are skipped; a profile with no interest is counted (it scores 0
    like a model that wrote none); object ids outside the user's history are dropped from
    their interest; a repeated interest of one user is merged into the first; interests past
    the first ``PROFILE_INTEREST_CAP`` of one profile are left out (each costs judge
    questions: 10,000 would take hours) and counted."""

    profiles: int = 0
    interests: int = 0
    unknown_users: int = 0
    empty_profiles: int = 0
    outside_history: int = 0
    merged: int = 0
    capped: int = 0
    questions: int = 0  # evidence-filter questions the kept interests ask (one per citation)
    RULES: ClassVar[tuple[str, ...]] = (
        "unknown_users",
        "empty_profiles",
        "outside_history",
        "merged",
        "capped",
    )


def _profile_line(path: Path, n: int, line: str) -> tuple[str, list[Any]]:
    """Line ``n`` of a profile file as (user id, its interests), or a DataError naming it."""
    try:
        rec = json_loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"not JSON ({e.msg}).", source=str(path), row=n, fix=_PROFILE_FIX) from None
    if not isinstance(rec, dict) or rec.get("user_id") is None:
        raise DataError("not an object with a user_id.", source=str(path), row=n,
                        field="user_id", fix=_PROFILE_FIX)  # fmt: skip
    interests = rec.get("interests")
    if not isinstance(interests, list):
        raise DataError("interests must be a list.", source=str(path), row=n,
                        field="interests", fix=_PROFILE_FIX)  # fmt: skip
    return str(rec["user_id"]), interests


def _merge_interest(path, n, k, entry, user, model, history, merged, check) -> None:
    """Interest ``k`` of line ``n`` merged into ``merged`` (same user, same normalised name:
    one interest), its objects kept where they are in the user's history (counted if not)."""
    # a profile is untrusted text like a title: the one renderer's cleaning and neutralising
    name = clean_text(entry.get("name", "")) if isinstance(entry, dict) else ""
    ids = entry.get("object_ids", []) if isinstance(entry, dict) else None
    if not name or not isinstance(ids, list):
        raise DataError(f"interest {k} needs a name and an object_ids list.", source=str(path),
                        row=n, field="interests", fix=_PROFILE_FIX)  # fmt: skip
    check.interests += 1
    key = (user, normalize_interest(name))
    if key in merged:
        check.note("merged", f"user {user!r}: {name!r}")
    it = merged.setdefault(key, _Interest(user, model, name, []))
    for o in map(str, ids):
        if o not in history:
            check.note("outside_history", f"user {user!r} object {o!r}")
        elif o not in it.ids:
            it.ids.append(o)


def read_profiles(
    path: str | Path, ds: Any, model: str | None = None
) -> tuple[list[_Interest], ProfileCheck]:
    """Interests from a JSONL profile file, checked against ``ds`` (rules: ``ProfileCheck``).

    Raises:
        DataError: a line that is not a profile (names the file, line and field).
    """
    path = Path(path)
    model = model or path.stem
    check = ProfileCheck()
    merged: dict[tuple[str, str], _Interest] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(
            f"cannot read it ({type(e).__name__}).", source=str(path), fix=_PROFILE_FIX
        ) from None
    known = set(ds.interactions["user_id"].astype(str).unique())
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        user, interests = _profile_line(path, n, line)
        check.profiles += 1
        if user not in known:
            check.note("unknown_users", repr(user))
            continue
        if not interests:
            check.note("empty_profiles", repr(user))
        if len(interests) > PROFILE_INTEREST_CAP:
            check.note(
                "capped",
                f"user {user!r}: {len(interests)} interests, the first {PROFILE_INTEREST_CAP} kept",
                len(interests) - PROFILE_INTEREST_CAP,
            )
            interests = interests[:PROFILE_INTEREST_CAP]
        history = set(ds.history(user)["item_id"].astype(str))
        for k, entry in enumerate(interests):
            _merge_interest(path, n, k, entry, user, model, history, merged, check)
    if not check.profiles:
        raise DataError("no profile in the file.", source=str(path), fix=_PROFILE_FIX)
    check.questions = sum(len(it.ids) for it in merged.values())
    return list(merged.values()), check


def verify_profiles(
    config: GistConfig,
    data: str,
    profiles: Sequence[str | Path],
    out: str | Path,
    oracle: Mapping[str, Sequence[Any]] | None = None,
    llms: Mapping[str, Any] | None = None,
    progress: bool = True,
    users: int | None = None,
    answers: str | Path | None = None,
) -> dict[str, Any]:
    """Verify interest profiles from your own system with GISTBench's judge stages.

    Each file is one system (named by its stem); its interests go through the same evidence
    filter, predicate, taxonomy and specificity as ``run_gist``'s, and the same records and
    scores come out (``interests.jsonl``, ``oracle.json``, ``results.json``, ``report.md``).
    IG recall is against ``oracle`` if given, else the union of verified categories over the
    given files. ``config.models`` and the extraction settings are not used.

    Args:
        users: score only this many users, sampled in sha256 order (``config.seed``) among
            those with interests in every file, so the systems are compared on the same
            users; a larger number extends the sample (a rerun into the same ``out`` keeps
            every answer). ``None`` (the default): every user of the files.
        answers: ``run_gist``'s.
    """
    t0 = time.time()
    out = Path(out)
    pool = _open_pool(config, llms, (config.judge,))
    ds = load_dataset(data)
    interests, checks = [], {}
    for p in profiles:
        its, check = read_profiles(p, ds)
        if check.unknown_users == check.profiles:
            raise DataError(
                f"no user of it is in dataset {ds.name!r} "
                f"(e.g. {check.examples['unknown_users'][0]}).",
                source=str(p),
                fix="pass the --data the profiles were built from",
            )
        interests += its
        checks[Path(p).stem] = check.__dict__
        if progress and (check.problems() or check.questions > 2000):
            # Said before any judging: what the rules changed, and what the run will ask.
            print(f"{p}: {check.profiles} profiles, {check.interests} interests, "
                  f"{check.questions} evidence-filter questions"
                  f"{'; ' + check.problems() if check.problems() else ''}",
                  file=sys.stderr)  # fmt: skip
    sample = None
    if users is not None:
        interests, sample = _user_sample(interests, len(profiles), users, config.seed)
        sampled = set(sample["sampled"])
        oracle = {u: c for u, c in (oracle or {}).items() if u in sampled}
    chosen = sorted({it.user_id for it in interests} | set(oracle or {}))
    run = _open_run(config, ds, chosen, out, pool, progress, None, answers)
    try:
        records, facts = _verify(run, interests)
    finally:
        run.close()
    return _finish(
        run,
        records,
        out,
        data,
        dict(oracle) if oracle else None,
        {**facts, "incomplete_extractions": 0, "profiles": checks,
         **({"user_sample": sample} if sample else {})},
        t0,
    )  # fmt: skip


def _user_sample(
    interests: list[_Interest], files: int, n: int, seed: int
) -> tuple[list[_Interest], dict[str, Any]]:
    """The interests of ``n`` users sampled (sha256 order) among those with interests in
    every one of the ``files`` systems, and what was sampled from what."""
    systems: dict[str, set[str]] = {}
    for it in interests:
        systems.setdefault(it.user_id, set()).add(it.model)
    every = sorted(u for u, m in systems.items() if len(m) == files)
    if not every:
        raise UserFacingError(
            "--users samples users with interests in every profile file, and no user has: "
            "give files about the same users, or leave --users out to score every user"
        )
    sampled = sample_users(every, n, seed)
    keep = set(sampled)
    sample = {"users": len(sampled), "asked": n, "in_every_file": len(every),
              "profiled": len(systems), "sampled": sampled}  # fmt: skip
    return [it for it in interests if it.user_id in keep], sample
