"""GISTBench: interest extraction, groundedness (IG precision / recall / F1) and specificity (IS).

After "GISTBench: Evaluating LLM User Understanding via Evidence-Based Interest Verification"
(Meta, 2026, arXiv 2603.29112). A model under test lists a user's interests, each citing
objects from the user's history; a separate judge model keeps the cited objects that really
show the interest, and an interest is *verified* when the surviving evidence passes a
signal-count predicate. Specificity asks the judge to find an interest's evidence among
distractors. Scores are pure functions of per-interest records (``gist score``).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from recjudge._util import rng, stable_hash

GIST_PROMPT_VERSION = "gist-v1"
SIGNALS = ("imp+", "exp+", "imp-", "exp-")
EVENT_SIGNAL = {
    "implicit_positive": "imp+",
    "explicit_positive": "exp+",
    "implicit_negative": "imp-",
    "explicit_negative": "exp-",
}
EVENT_WORDS = (
    "explicit_positive (rated highly / loved), implicit_positive (engaged or liked), "
    "implicit_negative (skipped or abandoned), explicit_negative (rated low / disliked)"
)


# -- taxonomy -----------------------------------------------------------------------------
def load_categories(path: str | Path | None = None) -> dict[int, str]:
    """The 325 GISTBench interest categories (paper appendix, tables 8-9), id -> name.

    Args:
        path: a CSV with ``category_id,category_name`` (default: the shipped taxonomy).
    """
    if path is None:
        text = (
            resources.files("recjudge.evaluators")
            .joinpath("data/gist_categories.csv")
            .read_text(encoding="utf-8")
        )
        source = "recjudge/evaluators/data/gist_categories.csv"
    else:
        text, source = Path(path).read_text(encoding="utf-8"), str(path)
    out: dict[int, str] = {}
    for i, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            out[int(row["category_id"])] = row["category_name"].strip()
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{source}, line {i}: need integer category_id and a category_name "
                f"(header 'category_id,category_name'); got {row!r}"
            ) from None
    if not out:
        raise ValueError(f"{source}: no categories")
    return out


# -- verification predicate ---------------------------------------------------------------
class Predicate(BaseModel):
    """Which surviving evidence verifies an interest (GISTBench defaults).

    Verified if imp+ >= ``imp_pos``, or exp+ >= ``exp_pos``, or (exp+ >= ``mixed_exp`` and
    imp+ >= ``mixed_imp``); rejected if imp- > ``max_imp_neg`` or exp- > ``max_exp_neg`` or no
    cited object survives the judge's relevance filter. Datasets without some signal (e.g.
    no explicit feedback) simply never reach that branch; raise or lower the thresholds to
    fit the signals a dataset has.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    imp_pos: int = Field(3, ge=1)
    exp_pos: int = Field(2, ge=1)
    mixed_exp: int = Field(1, ge=1)
    mixed_imp: int = Field(2, ge=1)
    max_imp_neg: int = Field(3, ge=0)
    max_exp_neg: int = Field(2, ge=0)

    def describe(self) -> str:
        """The rule in words, for the extraction prompt (closed loop with the verifier)."""
        return (
            "An interest is accepted only if the cited objects that really show it include at "
            f"least {self.imp_pos} implicit_positive, or at least {self.exp_pos} "
            f"explicit_positive, or at least {self.mixed_exp} explicit_positive together with "
            f"{self.mixed_imp} implicit_positive. It is rejected if they include more than "
            f"{self.max_imp_neg} implicit_negative or more than {self.max_exp_neg} "
            "explicit_negative."
        )

    def check(self, counts: Mapping[str, int]) -> tuple[bool, list[str]]:
        """(verified, failure reasons) for signal counts of the surviving, distinct objects.

        Reasons: ``no_evidence`` (nothing survived), ``excess_negatives``, and, when the
        positives fall short, ``insufficient_exp+`` if the object set has explicit positives
        (the explicit paths were open) else ``insufficient_imp+``.
        """
        c = {s: int(counts.get(s, 0)) for s in SIGNALS}
        if sum(c.values()) == 0:
            return False, ["no_evidence"]
        reasons = []
        if c["imp-"] > self.max_imp_neg or c["exp-"] > self.max_exp_neg:
            reasons.append("excess_negatives")
        positive = (
            c["imp+"] >= self.imp_pos
            or c["exp+"] >= self.exp_pos
            or (c["exp+"] >= self.mixed_exp and c["imp+"] >= self.mixed_imp)
        )
        if not positive:
            reasons.append("insufficient_exp+" if c["exp+"] > 0 else "insufficient_imp+")
        return not reasons, reasons


# -- scoring (pure) -----------------------------------------------------------------------
def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if len(values) else 0.0


def user_scores(records: Sequence[Mapping[str, Any]], oracle: set[Any]) -> dict[str, float | int]:
    """One model's scores for one user from its per-interest records.

    Per category c: G_c = verified / interests and S_c = sum(correct) / sum(backing).
    IG_P = sum_c G_c / |categories the model's interests fall in|; IG_R = sum over oracle
    categories of G_c / |oracle| (oracle = categories with a verified interest from any
    evaluated model); IG_F1 = 2 P R / (P + R); IS = mean S_c over categories with G_c > 0
    (0 if none). All 0 for a user with no interests.
    """
    cats: dict[Any, list[Mapping[str, Any]]] = {}
    for r in records:
        cats.setdefault(r["category_id"], []).append(r)
    g = {c: sum(bool(r["verified"]) for r in rs) / len(rs) for c, rs in cats.items()}
    s = {}
    for c, rs in cats.items():
        backing = sum(int(r.get("backing") or 0) for r in rs)
        s[c] = sum(int(r.get("correct") or 0) for r in rs) / backing if backing else 0.0
    p = sum(g.values()) / len(g) if g else 0.0
    r_ = sum(g.get(c, 0.0) for c in oracle) / len(oracle) if oracle else 0.0
    f1 = 2 * p * r_ / (p + r_) if p + r_ > 0 else 0.0
    specific = [s[c] for c in g if g[c] > 0]
    return {
        "ig_p": p,
        "ig_r": r_,
        "ig_f1": f1,
        "is": float(np.mean(specific)) if specific else 0.0,
        "interests": len(records),
        "categories": len(g),
        "oracle": len(oracle),
    }


def build_oracle(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """user_id -> sorted categories with a verified interest from any model (the union)."""
    out: dict[str, set[Any]] = {}
    for r in records:
        out.setdefault(str(r["user_id"]), set())
        if r["verified"]:
            out[str(r["user_id"])].add(r["category_id"])
    return {u: sorted(c, key=str) for u, c in out.items()}


def gist_scores(
    records: Sequence[Mapping[str, Any]],
    oracle: Mapping[str, Sequence[Any]] | None = None,
    users: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Per model: medians over users of ig_p, ig_r, ig_f1, is, plus per-user values and
    failure-mode percentages.

    Args:
        records: per-interest records with ``user_id, model, interest, category_id,
            verified, correct, backing`` (and optionally ``reasons``).
        oracle: ``{user_id: [category_ids]}``; default: the union over ``records``.
        users: users every model is scored on (a model with no interest for a user scores
            0 there); default: every user in ``records``.
    """
    for i, r in enumerate(records):
        missing = [k for k in ("user_id", "model", "category_id", "verified") if k not in r]
        if missing:
            raise ValueError(
                f"interest record {i} lacks {missing}; each record needs user_id, model, "
                "interest, category_id, verified, correct, backing"
            )
    oracle = build_oracle(records) if oracle is None else oracle
    oracle_sets = {str(u): set(c) for u, c in oracle.items()}
    users = (
        [str(u) for u in users]
        if users is not None
        else sorted({str(r["user_id"]) for r in records})
    )
    models = sorted({str(r["model"]) for r in records})
    out: dict[str, Any] = {}
    for m in models:
        mine = [r for r in records if str(r["model"]) == m]
        per_user = {}
        for u in users:
            rs = [r for r in mine if str(r["user_id"]) == u]
            per_user[u] = user_scores(rs, oracle_sets.get(u, set()))
        reasons: dict[str, int] = {}
        for r in mine:
            for why in r.get("reasons") or []:
                reasons[why] = reasons.get(why, 0) + 1
        n = len(mine)
        out[m] = {
            **{
                k: _median([v[k] for v in per_user.values()])
                for k in ("ig_p", "ig_r", "ig_f1", "is")
            },
            "interests": n,
            "verified_pct": 100 * sum(bool(r["verified"]) for r in mine) / n if n else 0.0,
            "failure_pct": {k: 100 * v / n for k, v in sorted(reasons.items())},
            "users": per_user,
        }
    return out


def read_interest_records(path: str | Path) -> list[dict[str, Any]]:
    """Per-interest records from a JSONL file, with a clear error naming the bad line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {i}: not JSON ({e}); one record per line") from None
    return out


def read_oracle(path: str | Path) -> dict[str, list[Any]]:
    """``{"oracle": {user_id: [category_ids]}}`` from a JSON file."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("oracle"), dict):
        raise ValueError(f'{path}: expected {{"oracle": {{user_id: [category_ids]}}}}')
    return {str(u): list(c) for u, c in obj["oracle"].items()}


# -- specificity sampling ------------------------------------------------------------------
def global_pool(
    histories: Mapping[str, Sequence[str]], size: int = 1000, seed: int = 0
) -> list[str]:
    """``size`` distinct objects sampled uniformly across users: a user uniformly at random,
    then one of that user's objects uniformly (seeded by sha256, not Python's ``hash``)."""
    users = sorted(u for u, h in histories.items() if len(h))
    total = len({o for u in users for o in histories[u]})
    size = min(size, total)
    g = rng("gist-pool", seed)
    pool: dict[str, None] = {}
    while len(pool) < size:
        u = users[int(g.integers(len(users)))]
        h = histories[u]
        pool.setdefault(str(h[int(g.integers(len(h)))]), None)
    return list(pool)


def specificity_options(
    evidence: Sequence[str], distractors: Sequence[str], seed: Any
) -> tuple[list[str], list[bool]]:
    """The shuffled option list and which entries are evidence (seeded, process-independent)."""
    items = [(o, True) for o in evidence] + [(o, False) for o in distractors]
    order = rng("gist-options", seed).permutation(len(items))
    return [items[i][0] for i in order], [items[i][1] for i in order]


def normalize_interest(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


# -- configuration ------------------------------------------------------------------------
class GistConfig(BaseModel):
    """GISTBench settings.

    Attributes:
        models: models under test (presets, paths or Hugging Face ids).
        judge: the verifying judge model (separate from the models under test).
        users: users evaluated (sampled by sha256 of the id).
        min_history: users with fewer interactions are not sampled.
        max_history: most recent engagements considered (None: all).
        chunk_size: engagements per extraction prompt (the paper: 100).
        max_interests: most interests per chunk.
        max_ids: most cited objects per interest.
        words: interest length in words (min, max).
        max_citations: an object may support at most this many interests (extra citations
            are dropped and counted).
        predicate: the verification rule.
        evidence_for_specificity: n = min(cited, this).
        options: evidence + distractors shown per specificity question.
        pool_size: global distractor pool size.
        taxonomy: map interests to the 325 categories (False: each interest is its own
            category).
        shortlist: categories offered per interest after the embedding shortlist.
        batch_size: questions per engine call (never changes a result).
        seed: sampling seed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: tuple[str, ...] = ("smollm2-135m",)
    judge: str = "qwen2.5-coder-0.5b"
    users: int = Field(30, ge=1)
    min_history: int = Field(20, ge=1)
    max_history: int | None = Field(100, ge=1)
    chunk_size: int = Field(100, ge=5)
    max_interests: int = Field(8, ge=1)
    max_ids: int = Field(10, ge=1)
    words: tuple[int, int] = (2, 5)
    max_citations: int = Field(2, ge=1)
    predicate: Predicate = Predicate()
    evidence_for_specificity: int = Field(5, ge=1)
    options: int = Field(50, ge=2)
    pool_size: int = Field(1000, ge=10)
    taxonomy: bool = True
    shortlist: int = Field(24, ge=2)
    batch_size: int = Field(8, ge=1)
    seed: int = 0


# -- prompts ---------------------------------------------------------------------------------
def extraction_messages(
    lines: Sequence[str], domain_word: str, config: GistConfig
) -> list[dict[str, str]]:
    lo, hi = config.words
    return [
        {
            "role": "system",
            "content": "You study a user's activity history and list their specific interests.",
        },
        {
            "role": "user",
            "content": (
                f"Below are the user's {len(lines)} most recent engagements with {domain_word}, "
                "most recent first. Each line is `[object_id] event_type - object`. Event "
                f"types: {EVENT_WORDS}.\n\n"
                + "\n".join(lines)
                + f"\n\nList the user's specific interests, each {lo} to {hi} words (for "
                'example "1990s crime thrillers", not "movies"), each citing the ids of the '
                "objects above that show it. Cite each object in at most "
                f"{config.max_citations} interests. {config.predicate.describe()} So cite "
                "enough positive evidence for each interest and do not list things the "
                'user dislikes. Answer as JSON: [{"interest": "...", "ids": ["...", ...]}, ...]'
            ),
        },
    ]


def relevance_messages(interest: str, domain_word: str) -> list[dict[str, str]]:
    """Judge prompt with the object in the slot at the very end (shared prefix per interest)."""
    from recjudge.reward import SLOT

    return [
        {"role": "system", "content": "You check evidence for a person's interests."},
        {
            "role": "user",
            "content": (
                f'Interest: "{interest}".\nIs the following one of the {domain_word} a clear '
                "example of this interest? Answer YES or NO as JSON.\n"
                f"Object: {SLOT}"
            ),
        },
    ]


def specificity_messages(
    interest: str, options: Sequence[str], n: int, domain_word: str
) -> list[dict[str, str]]:
    lines = [f"{i + 1}. {o}" for i, o in enumerate(options)]
    return [
        {"role": "system", "content": "You match interests to the objects that show them."},
        {
            "role": "user",
            "content": (
                f'A user has the interest "{interest}". Exactly {n} of the following '
                f"{len(options)} {domain_word} come from this user's history as evidence of "
                "that interest; the others are unrelated.\n\n"
                + "\n".join(lines)
                + f"\n\nPick the {n} numbers of the evidence. Answer as JSON: "
                '{"picks": ["<number>", ...]}'
            ),
        },
    ]


def taxonomy_messages(interest: str, names: Sequence[str]) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You file interests under a category."},
        {
            "role": "user",
            "content": (
                f'Interest: "{interest}".\nCategories:\n'
                + "\n".join(f"- {n}" for n in names)
                + "\n\nWhich single category fits this interest best? Answer as JSON: "
                '{"category": "<category>"}'
            ),
        },
    ]


# -- running -------------------------------------------------------------------------------
@dataclass
class _Interest:
    user_id: str
    model: str
    interest: str
    ids: list[str]
    dropped_citations: int = 0


def embed_texts(llm: Any, texts: Sequence[str], batch: int = 32) -> np.ndarray:
    """Mean-pooled last hidden states of ``llm`` for ``texts``, L2-normalised (a cheap
    shortlist embedding from the judge model itself; no extra download)."""
    import torch

    tok = llm.tokenizer
    out = []
    for b in range(0, len(texts), batch):
        enc = tok(list(texts[b : b + batch]), return_tensors="pt", padding=True)
        with torch.inference_mode():
            h = llm.model.base_model(**enc).last_hidden_state.float()
        m = enc["attention_mask"][..., None].float()
        v = (h * m).sum(1) / m.sum(1)
        out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
    return np.concatenate(out) if out else np.zeros((0, 1))


def _trigrams(text: str) -> set[str]:
    t = f"  {text.lower()} "
    return {t[i : i + 3] for i in range(len(t) - 2)}


def shortlist_categories(
    interest_vecs: np.ndarray,
    interests: Sequence[str],
    cat_vecs: np.ndarray,
    cat_names: Sequence[str],
    k: int,
) -> list[list[int]]:
    """Per interest, indices of ``k`` categories: the best by embedding cosine, with a quarter
    of the slots given to the best character-trigram matches (catches literal overlaps the
    small model's embedding misses)."""
    sims = interest_vecs @ cat_vecs.T
    cat_grams = [_trigrams(n) for n in cat_names]
    lexical_k = max(1, k // 4)
    out = []
    for i, text in enumerate(interests):
        g = _trigrams(text)
        lex = np.array([len(g & c) / (len(g | c) or 1) for c in cat_grams])
        chosen = list(dict.fromkeys(np.argsort(-lex, kind="stable")[:lexical_k].tolist()))
        for j in np.argsort(-sims[i], kind="stable").tolist():
            if len(chosen) >= k:
                break
            if j not in chosen:
                chosen.append(j)
        out.append(sorted(chosen))
    return out


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc)


def run_gist(
    config: GistConfig,
    data: str = "ml-1m",
    out: str | Path = "reports/gist",
    llms: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run GISTBench for every model in ``config.models`` on ``data``; write
    ``interests.jsonl``, ``oracle.json``, ``results.json``, ``report.md`` and ``pr.png``.

    Every model and judge answer is stored in ``out/store.sqlite`` under a key of its
    prompt and settings, so a rerun resumes and a second model reuses the judge's answers.

    Args:
        llms: already loaded backends by model name (tests); others are loaded on demand.
    """
    import time

    from recjudge.data import load_dataset, render_item, sample_users
    from recjudge.decoding import Choice, CitedList, Picks
    from recjudge.llm import SamplingConfig, load_llm
    from recjudge.reporting import write_report
    from recjudge.reward import ResultsStore, ask, ask_shared

    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(data)
    word = {"movies": "movies", "books": "books"}.get(ds.domain, "items")
    lengths = ds.interactions.groupby("user_id", observed=True).size()
    eligible = {str(u) for u, n in lengths.items() if n >= config.min_history}
    users = [u for u in sample_users(sorted(eligible), config.users, config.seed)]
    text = {
        str(i): render_item(r, ds.domain)
        for i, r in zip(ds.items["item_id"], ds.items.to_dict("records"), strict=True)
    }
    llms = dict(llms or {})

    def get_llm(name: str) -> Any:
        if name not in llms:
            llms[name] = load_llm(name)
        return llms[name]

    histories = {}  # most recent first: (item_id, event_type)
    for u in users:
        h = ds.history(u).iloc[::-1]
        if config.max_history:
            h = h.iloc[: config.max_history]
        histories[u] = list(zip(h["item_id"].astype(str), h["event_type"].astype(str), strict=True))

    store = ResultsStore(out / "store.sqlite")
    try:
        # 1. extraction by each model under test
        interests: list[_Interest] = []
        jobs = []
        for m in config.models:
            for u in users:
                h = histories[u]
                for c in range(0, len(h), config.chunk_size):
                    # Object ids are positions in the user's history (most recent = 1):
                    # short, and unique across the user's chunks.
                    ids = [str(c + k + 1) for k in range(len(h[c : c + config.chunk_size]))]
                    chunk = h[c : c + config.chunk_size]
                    lines = [f"[{o}] {e} - {text[i]}" for o, (i, e) in zip(ids, chunk, strict=True)]
                    msgs = extraction_messages(lines, word, config)
                    schema = CitedList(
                        ids,
                        max_words=config.words[1],
                        min_words=config.words[0],
                        max_items=config.max_interests,
                        max_ids=config.max_ids,
                    )
                    key = stable_hash(GIST_PROMPT_VERSION, "extract", m, msgs, schema.key())
                    jobs.append((key, m, u, msgs, schema))
        budget = SamplingConfig(max_new_tokens=config.max_interests * (12 + 6 * config.max_ids))
        have = store.get_many([j[0] for j in jobs])
        for m in config.models:
            todo = [j for j in jobs if j[1] == m and j[0] not in have]
            bar = _progress(len(todo), f"extract {m}", progress and bool(todo))
            for b in range(0, len(todo), config.batch_size):
                chunk_jobs = todo[b : b + config.batch_size]
                answers = ask(
                    get_llm(m),
                    [j[3] for j in chunk_jobs],
                    [j[4] for j in chunk_jobs],
                    sampling=budget,
                    decode_rows=1,  # long prompts, long answers: each decodes alone
                )
                store.put_many(
                    (
                        j[0],
                        {"kind": "extract", "model": m, "user_id": j[2]},
                        {"value": a.value, "text": a.text, "complete": a.value is not None},
                    )
                    for j, a in zip(chunk_jobs, answers, strict=True)
                )
                if bar is not None:
                    bar.update(len(chunk_jobs))
            if bar is not None:
                bar.close()
            if m != config.judge:
                llms.pop(m, None)  # free memory before the next model
        done = store.get_many([j[0] for j in jobs])
        incomplete = 0
        merged: dict[tuple[str, str, str], _Interest] = {}
        for key, m, u, _, _ in jobs:
            res = done[key]
            value = res["value"]
            if value is None:  # token budget ran out mid-answer: salvage complete entries
                incomplete += 1
                value = _salvage(res["text"])
            for entry in value:
                name = " ".join(str(entry.get("interest", "")).split())
                if not name:
                    continue
                k = (m, u, normalize_interest(name))
                it = merged.setdefault(k, _Interest(u, m, name, []))
                cited = [histories[u][int(o) - 1][0] for o in entry.get("ids", [])]
                it.ids = list(dict.fromkeys([*it.ids, *cited]))
        # an object supports at most max_citations interests (per model and user)
        uses: dict[tuple[str, str, str], int] = {}
        for it in merged.values():
            kept = []
            for i in it.ids:
                k = (it.model, it.user_id, i)
                if uses.get(k, 0) < config.max_citations:
                    uses[k] = uses.get(k, 0) + 1
                    kept.append(i)
                else:
                    it.dropped_citations += 1
            it.ids = kept
            interests.append(it)

        judge = get_llm(config.judge)
        yes_no = Choice(["YES", "NO"])

        def relevant(pairs: Sequence[tuple[str, str]], desc: str) -> dict[tuple[str, str], bool]:
            """(interest, item_id) -> the judge's YES/NO; shared prefix per interest."""
            keys = {
                p: stable_hash(GIST_PROMPT_VERSION, "relevant", config.judge, p[0], text[p[1]])
                for p in dict.fromkeys(pairs)
            }
            have = store.get_many(list(keys.values()))
            todo: dict[str, list[tuple[str, str]]] = {}
            for p, k in keys.items():
                if k not in have:
                    todo.setdefault(p[0], []).append(p)
            bar = _progress(sum(map(len, todo.values())), desc, progress and bool(todo))
            for interest, ps in todo.items():
                answers = ask_shared(
                    judge,
                    relevance_messages(interest, word),
                    [text[i] for _, i in ps],
                    yes_no,
                    sampling=SamplingConfig(max_new_tokens=16),
                    decode_rows=config.batch_size,
                )
                store.put_many(
                    (
                        keys[p],
                        {"kind": "relevant", "interest": p[0], "item_id": p[1]},
                        {"yes": a.value["answer"] == "YES", "p": list(a.record.p_before)},
                    )
                    for p, a in zip(ps, answers, strict=True)
                )
                if bar is not None:
                    bar.update(len(ps))
            if bar is not None:
                bar.close()
            got = store.get_many(list(keys.values()))
            return {p: (bool(got[k]["yes"]), float(got[k]["p"][0])) for p, k in keys.items()}

        # 2. groundedness: filter cited objects, then the predicate
        rel = relevant(
            [(it.interest, i) for it in interests for i in it.ids], "judge: evidence filter"
        )
        event_of = {u: dict(h) for u, h in histories.items()}
        records = []
        for it in interests:
            surviving = [i for i in it.ids if rel[(it.interest, i)][0]]
            counts = {s: 0 for s in SIGNALS}
            for i in surviving:
                counts[EVENT_SIGNAL[event_of[it.user_id][i]]] += 1
            verified, reasons = config.predicate.check(counts)
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
                    "dropped_citations": it.dropped_citations,
                }
            )

        # 3. taxonomy: each unique interest string -> one category, shared by all models
        categories = load_categories()
        cat_ids, cat_names = list(categories), list(categories.values())
        uniq = sorted({r["interest"] for r in records})
        category_of: dict[str, Any] = {}
        if config.taxonomy and uniq:
            tkeys = {
                s: stable_hash(GIST_PROMPT_VERSION, "taxonomy", config.judge, s, config.shortlist)
                for s in uniq
            }
            have = store.get_many(list(tkeys.values()))
            todo_s = [s for s in uniq if tkeys[s] not in have]
            if todo_s:
                short = shortlist_categories(
                    embed_texts(judge, todo_s),
                    todo_s,
                    embed_texts(judge, cat_names),
                    cat_names,
                    config.shortlist,
                )
                bar = _progress(len(todo_s), "judge: taxonomy", progress)
                for b in range(0, len(todo_s), config.batch_size):
                    part = list(range(b, min(b + config.batch_size, len(todo_s))))
                    names = [[cat_names[j] for j in short[i]] for i in part]
                    answers = ask(
                        judge,
                        [
                            taxonomy_messages(todo_s[i], nm)
                            for i, nm in zip(part, names, strict=True)
                        ],
                        [Choice(nm, answer_key="category") for nm in names],
                        sampling=SamplingConfig(max_new_tokens=48),
                        decode_rows=1,
                    )
                    store.put_many(
                        (
                            tkeys[todo_s[i]],
                            {"kind": "taxonomy", "interest": todo_s[i]},
                            {
                                "category_id": cat_ids[cat_names.index(a.value["category"])],
                                "category": a.value["category"],
                            },
                        )
                        for i, a in zip(part, answers, strict=True)
                    )
                    if bar is not None:
                        bar.update(len(part))
                if bar is not None:
                    bar.close()
            got = store.get_many(list(tkeys.values()))
            category_of = {s: got[k]["category_id"] for s, k in tkeys.items()}
        for r in records:
            if config.taxonomy:
                r["category_id"] = category_of[r["interest"]]
                r["category"] = categories[r["category_id"]]
            else:
                r["category_id"] = normalize_interest(r["interest"])

        # 4. specificity: find n evidence objects among distractors
        by_user = ds.interactions.groupby("user_id", observed=True)["item_id"]
        pool = global_pool(
            {str(u): sorted(map(str, s)) for u, s in by_user}, config.pool_size, config.seed
        )
        spec_jobs = []
        for r in records:
            evidence = (r["surviving"] or r["cited"])[: config.evidence_for_specificity]
            n = len(evidence)
            if n == 0 or n >= config.options:
                r["correct"], r["backing"] = 0, 0
                continue
            seen = set(event_of[r["user_id"]])
            seed = (config.seed, r["user_id"], r["model"], r["interest"])
            candidates = [
                pool[i]
                for i in rng("gist-distractors", seed).permutation(len(pool))
                if pool[i] not in seen
            ]
            spec_jobs.append((r, evidence, candidates, seed))
        # Distractor filter: the judge removes pool objects that show the interest. A judge
        # that calls (nearly) everything related would exhaust the pool, so at most
        # ``4 * options`` candidates are examined; if too few pass, the gap is filled with
        # the examined objects the judge found least related (counted as ``filled``).
        need = {id(j[0]): config.options - len(j[1]) for j in spec_jobs}
        chosen: dict[int, list[str]] = {id(j[0]): [] for j in spec_jobs}
        rejected: dict[int, list[tuple[float, str]]] = {id(j[0]): [] for j in spec_jobs}
        offset = {id(j[0]): 0 for j in spec_jobs}
        limit = 4 * config.options
        while True:
            asks = []
            for r, _, cands, _ in spec_jobs:
                k = id(r)
                short_by = need[k] - len(chosen[k])
                if short_by <= 0 or offset[k] >= min(len(cands), limit):
                    continue
                take = cands[offset[k] : min(offset[k] + short_by + max(2, short_by // 5), limit)]
                asks.append((r, take))
            if not asks:
                break
            verdicts = relevant(
                [(r["interest"], i) for r, take in asks for i in take], "judge: distractors"
            )
            for r, take in asks:
                k = id(r)
                offset[k] += len(take)
                for i in take:
                    yes, p_yes = verdicts[(r["interest"], i)]
                    if yes:
                        rejected[k].append((p_yes, i))
                    elif len(chosen[k]) < need[k]:
                        chosen[k].append(i)
        for r, _, _, _ in spec_jobs:
            k = id(r)
            gap = need[k] - len(chosen[k])
            r["filled"] = max(gap, 0)
            if gap > 0:
                chosen[k] += [i for _, i in sorted(rejected[k])[:gap]]
        pkeys = []
        for r, evidence, _, seed in spec_jobs:
            opts, is_ev = specificity_options(evidence, chosen[id(r)], seed)
            msgs = specificity_messages(r["interest"], [text[o] for o in opts], len(evidence), word)
            labels = [str(i + 1) for i in range(len(opts))]
            schema = Picks(labels, len(evidence))
            key = stable_hash(GIST_PROMPT_VERSION, "specificity", config.judge, msgs, schema.key())
            pkeys.append((key, r, msgs, schema, is_ev))
        have = store.get_many([p[0] for p in pkeys])
        todo_p = [p for p in pkeys if p[0] not in have]
        todo_p.sort(key=lambda p: len(p[2][1]["content"]))
        bar = _progress(len(todo_p), "judge: specificity", progress and bool(todo_p))
        for b in range(0, len(todo_p), config.batch_size):
            part = todo_p[b : b + config.batch_size]
            answers = ask(
                judge,
                [p[2] for p in part],
                [p[3] for p in part],
                sampling=SamplingConfig(max_new_tokens=8 * config.evidence_for_specificity + 16),
                decode_rows=1,
            )
            store.put_many(
                (p[0], {"kind": "specificity", "interest": p[1]["interest"]}, {"picks": a.value})
                for p, a in zip(part, answers, strict=True)
            )
            if bar is not None:
                bar.update(len(part))
        if bar is not None:
            bar.close()
        got = store.get_many([p[0] for p in pkeys])
        for key, r, _, _, is_ev in pkeys:
            picks = got[key]["picks"]
            r["correct"] = sum(bool(is_ev[int(x) - 1]) for x in picks)
            r["backing"] = int(sum(is_ev))
            r["distractors"] = len(is_ev) - int(sum(is_ev))
    finally:
        store.close()

    oracle = build_oracle(records)
    scores = gist_scores(records, oracle, users)
    with open(out / "interests.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    (out / "oracle.json").write_text(json.dumps({"oracle": oracle}, indent=1), encoding="utf-8")
    results = {
        "config": config.model_dump(),
        "data": data,
        "users": users,
        "pool_size": len(pool),
        "incomplete_extractions": incomplete,
        "dropped_citations": sum(r["dropped_citations"] for r in records),
        "filled_distractors": sum(r.get("filled", 0) for r in records),
        "wall_seconds": round(time.time() - t0, 1),
        "scores": scores,
    }
    _plot_pr(scores, out / "pr.png", data)
    write_report(out, results, _gist_report(config, data, results))
    return results


def _salvage(text: str) -> list[dict[str, Any]]:
    """Complete ``{"interest": ..., "ids": [...]}`` entries of a cut-off answer."""
    out = []
    for m in re.finditer(r'\{"interest": "([^"]*)", "ids": \[([^\]]*)\]\}', text):
        ids = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2))
        out.append({"interest": m.group(1), "ids": [json.loads(f'"{i}"') for i in ids]})
    return out


def _plot_pr(scores: Mapping[str, Any], path: Path, data: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for m, s in scores.items():
        ps = [v["ig_p"] for v in s["users"].values()]
        rs = [v["ig_r"] for v in s["users"].values()]
        ax.scatter(rs, ps, alpha=0.35, s=18)
        ax.scatter(
            [s["ig_r"]], [s["ig_p"]], marker="*", s=220, edgecolor="k", label=f"{m} (median)"
        )
    ax.set_xlabel("IG recall (per user)")
    ax.set_ylabel("IG precision (per user)")
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(f"GISTBench groundedness on {data}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _gist_report(config: GistConfig, data: str, results: Mapping[str, Any]) -> list[str]:
    s = results["scores"]
    lines = [
        f"# GISTBench on {data}",
        "",
        f"Judge: `{config.judge}`; {len(results['users'])} users (>= {config.min_history} "
        f"interactions, most recent {config.max_history or 'all'}), chunks of "
        f"{config.chunk_size}, {config.options} options per specificity question, pool of "
        f"{results['pool_size']}, taxonomy {'on' if config.taxonomy else 'off'}, seed "
        f"{config.seed}. Wall time {results['wall_seconds']} s.",
        "",
        "Medians over users (higher is better).",
        "",
        "| model | IG_P | IG_R | IG_F1 | IS | interests | verified % |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, v in s.items():
        lines.append(
            f"| {m} | {v['ig_p']:.3f} | {v['ig_r']:.3f} | {v['ig_f1']:.3f} | {v['is']:.3f} | "
            f"{v['interests']} | {v['verified_pct']:.1f} |"
        )
    lines += ["", "Failure modes (% of each model's interests; one interest can have two):", ""]
    for m, v in s.items():
        fm = ", ".join(f"{k} {p:.1f}%" for k, p in v["failure_pct"].items()) or "none"
        lines.append(f"- {m}: {fm}")
    lines += [
        "",
        f"Extraction answers cut by the token budget (complete entries kept): "
        f"{results['incomplete_extractions']}; citations dropped by the "
        f"{config.max_citations}-interests-per-object rule: {results['dropped_citations']}; "
        "distractors the judge called related but used to fill the option list (least "
        f"related first): {results['filled_distractors']}.",
        "",
        "![precision-recall](pr.png)",
    ]
    return lines
