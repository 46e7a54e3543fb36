"""RecSys Arena: pairwise LLM judging of recommenders, position-bias control, Q and
Bradley-Terry ranking (after "RecSys Arena: Pair-wise Recommender System Evaluation with
Large Language Models", 2024).

Aggregates are pure functions on per-comparison records ``{user_id, system_a, system_b,
aspect, verdict}`` (verdict "A wins"/"B wins"/"Tie" from system_a's side), so
``arena summarize`` works on records alone.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from recjudge._util import rng, stable_hash

ASPECTS = ("accuracy", "satisfaction", "inspiration", "content_quality", "transparency", "impact")
OPTIONS = ("A wins", "B wins", "Tie")
ABSOLUTE = ("awful", "poor", "fair", "good", "excellent")  # distinct first letters
ABSOLUTE_SCORE = dict(zip(ABSOLUTE, (0.0, 0.25, 0.5, 0.75, 1.0), strict=True))
ARENA_PROMPT_VERSION = "arena-v1"

ML_AGE = {
    1: "under 18",
    18: "18-24",
    25: "25-34",
    35: "35-44",
    45: "45-49",
    50: "50-55",
    56: "56 or older",
}
ML_OCCUPATION = [
    "other",
    "academic/educator",
    "artist",
    "clerical/admin",
    "college/grad student",
    "customer service",
    "doctor/health care",
    "executive/managerial",
    "farmer",
    "homemaker",
    "K-12 student",
    "lawyer",
    "programmer",
    "retired",
    "sales/marketing",
    "scientist",
    "self-employed",
    "technician/engineer",
    "tradesman/craftsman",
    "unemployed",
    "writer",
]


class ArenaConfig(BaseModel):
    """Arena settings.

    Attributes:
        model: the judge LLM.
        systems: recommenders under test (CF model names, or ``name=path`` list files).
        users: users judged (sampled by sha256 of the id).
        k: list length shown to the judge.
        history_items: most recent history items in the prompt.
        analysis_chars: bound on the free-text analysis written before the verdicts.
        swap_rule: ``tie``: a verdict that flips with the order counts as a tie;
            ``keep``: keep both orders as separate records.
        bootstrap: Bradley-Terry bootstrap resamples.
        similarity: URD similarity, ``genre`` (Jaccard) or ``embedding`` (item cosine).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "qwen2.5-coder-0.5b"
    systems: tuple[str, ...] = ("pop", "itemknn", "als", "sasrec")
    users: int = Field(100, ge=1)
    k: int = Field(5, ge=1)
    history_items: int = Field(20, ge=1)
    analysis_chars: int = Field(400, ge=1)
    swap_rule: Literal["tie", "keep"] = "tie"
    bootstrap: int = Field(200, ge=0)
    similarity: Literal["genre", "embedding"] = "genre"
    absolute: bool = True
    seed: int = 0
    batch_size: int = Field(8, ge=1)


# -- aggregation (pure) ------------------------------------------------------------------
def q_score(win: float, tie: float, lose: float) -> float:
    """Q = (N_win + N_tie) / (N_lose + N_tie) (RecSys Arena); inf when A never loses or ties
    against a win, nan with no comparisons."""
    num, den = win + tie, lose + tie
    if den == 0:
        return float("inf") if num > 0 else float("nan")
    return num / den


def flip(verdict: str) -> str:
    return {"A wins": "B wins", "B wins": "A wins"}.get(verdict, verdict)


def combine_orders(v_ab: str, v_ba: str, rule: str = "tie") -> list[str]:
    """Verdicts of (A, B) and of the swapped order (B, A), both from their own A's side.

    With ``tie``, agreement keeps the verdict and a flip (position bias) becomes a tie; with
    ``keep``, both orders are returned as separate A-side verdicts.
    """
    back = flip(v_ba)  # the swapped judgment, seen from the original A
    if rule == "keep":
        return [v_ab, back]
    return [v_ab] if v_ab == back else ["Tie"]


def pair_records(
    user: str, a: str, b: str, ab: dict[str, str], ba: dict[str, str], rule: str
) -> list[dict[str, Any]]:
    """Verdict records of one (user, A, B) judged in both orders (``ab``, ``ba``: aspect ->
    verdict, each from its own A's side). Every overall record carries ``order_flip``: the
    overall verdict changed with the order (``keep`` writes two overall records)."""
    flips = flip(ba["overall"]) != ab["overall"]
    out = []
    for aspect in (*ASPECTS, "overall"):
        for v in combine_orders(ab[aspect], ba[aspect], rule):
            rec = {"user_id": user, "system_a": a, "system_b": b, "aspect": aspect, "verdict": v}
            if aspect == "overall":
                rec["order_flip"] = flips
            out.append(rec)
    return out


def order_flip_rate(records: Sequence[dict[str, Any]]) -> float:
    """Share of judged (user, A, B) pairs whose overall verdict flips when the order is
    swapped: one vote per pair, whatever the swap rule writes per pair."""
    pairs = {(r["user_id"], r["system_a"], r["system_b"]): bool(r.get("order_flip"))
             for r in records if r["aspect"] == "overall"}  # fmt: skip
    return sum(pairs.values()) / len(pairs) if pairs else 0.0


def pair_counts(
    records: Sequence[dict[str, Any]], aspect: str = "overall"
) -> dict[tuple[str, str], dict[str, float]]:
    """Win/tie/lose counts, percentages and Q per unordered pair, from the first system's
    side (pairs are keyed in sorted order)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for r in records:
        if r["aspect"] != aspect:
            continue
        a, b, v = r["system_a"], r["system_b"], r["verdict"]
        if a > b:
            a, b, v = b, a, flip(v)
        c = out.setdefault((a, b), {"win": 0, "tie": 0, "lose": 0})
        c[{"A wins": "win", "B wins": "lose", "Tie": "tie"}[v]] += 1
    for c in out.values():
        n = c["win"] + c["tie"] + c["lose"]
        c["n"] = n
        for k in ("win", "tie", "lose"):
            c[f"{k}_pct"] = 100.0 * c[k] / n if n else 0.0
        c["q"] = q_score(c["win"], c["tie"], c["lose"])
    return out


def system_q(records: Sequence[dict[str, Any]], aspect: str = "overall") -> dict[str, float]:
    """Each system's Q over all its comparisons."""
    tally: dict[str, list[float]] = {}
    for r in records:
        if r["aspect"] != aspect:
            continue
        for sys_, v in ((r["system_a"], r["verdict"]), (r["system_b"], flip(r["verdict"]))):
            t = tally.setdefault(sys_, [0, 0, 0])
            t[{"A wins": 0, "Tie": 1, "B wins": 2}[v]] += 1
    return {s: q_score(*t) for s, t in tally.items()}


def bradley_terry(
    records: Sequence[dict[str, Any]], aspect: str = "overall", iters: int = 500, tol: float = 1e-10
) -> dict[str, float]:
    """Bradley-Terry log-strengths by Hunter's MM algorithm (ties count half a win each),
    centred to mean 0. P(i beats j) = 1 / (1 + exp(s_j - s_i))."""
    recs = [r for r in records if r["aspect"] == aspect]
    systems = sorted({r["system_a"] for r in recs} | {r["system_b"] for r in recs})
    if not systems:
        return {}
    ix = {s: i for i, s in enumerate(systems)}
    n = len(systems)
    wins = np.zeros((n, n))
    for r in recs:
        a, b = ix[r["system_a"]], ix[r["system_b"]]
        v = r["verdict"]
        if v == "A wins":
            wins[a, b] += 1
        elif v == "B wins":
            wins[b, a] += 1
        else:
            wins[a, b] += 0.5
            wins[b, a] += 0.5
    games = wins + wins.T
    w = wins.sum(1) + 1e-3  # a tiny prior keeps a winless system finite
    p = np.ones(n)
    for _ in range(iters):
        denom = (games / (p[:, None] + p[None, :] + 1e-300)).sum(1) + 2e-3 / (p + 1)
        new = w / denom
        new /= np.exp(np.log(new).mean())
        if np.max(np.abs(new - p)) < tol:
            p = new
            break
        p = new
    s = np.log(p)
    return {sys_: float(s[i] - s.mean()) for sys_, i in ix.items()}


def bt_bootstrap(
    records: Sequence[dict[str, Any]], n: int = 200, seed: int = 0, aspect: str = "overall"
) -> dict[str, tuple[float, float]]:
    """95 % CIs of Bradley-Terry strengths by resampling comparisons (Chatbot Arena style)."""
    recs = [r for r in records if r["aspect"] == aspect]
    if not recs or n == 0:
        return {}
    g = rng("bt-bootstrap", seed)
    draws: dict[str, list[float]] = {}
    for _ in range(n):
        sample = [recs[i] for i in g.integers(0, len(recs), len(recs))]
        for s, v in bradley_terry(sample, aspect).items():
            draws.setdefault(s, []).append(v)
    return {
        s: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))) for s, v in draws.items()
    }


def correlations(x: dict[str, float], y: dict[str, float]) -> dict[str, float | None]:
    """Pearson and Spearman between two per-system scores (finite, shared systems only)."""
    from scipy.stats import pearsonr, spearmanr

    keys = [k for k in x if k in y and np.isfinite(x[k]) and y[k] is not None and np.isfinite(y[k])]
    if len(keys) < 3:
        return {"pearson": None, "spearman": None, "n": len(keys)}
    a, b = [x[k] for k in keys], [y[k] for k in keys]
    return {
        "pearson": float(pearsonr(a, b)[0]),
        "spearman": float(spearmanr(a, b)[0]),
        "n": len(keys),
    }


def summarize(
    records: Sequence[dict[str, Any]],
    auc: dict[str, float] | None = None,
    bootstrap: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Every aggregate from per-comparison records."""
    for i, r in enumerate(records):
        missing = {"user_id", "system_a", "system_b", "aspect", "verdict"} - set(r)
        if missing:
            raise ValueError(f"record {i + 1}: missing field(s) {sorted(missing)}")
        if r["verdict"] not in OPTIONS:
            raise ValueError(f"record {i + 1}: verdict {r['verdict']!r} is not one of {OPTIONS}")
    aspects = sorted({r["aspect"] for r in records}, key=lambda a: (a != "overall", a))
    pairs = {
        a: {f"{x} vs {y}": c for (x, y), c in pair_counts(records, a).items()} for a in aspects
    }
    bt = bradley_terry(records)
    ci = bt_bootstrap(records, bootstrap, seed)
    q = system_q(records)
    out: dict[str, Any] = {
        "comparisons": sum(1 for r in records if r["aspect"] == "overall"),
        "pairs": pairs,
        "system_q": q,
        "bradley_terry": {
            s: {"strength": v, "ci95": ci.get(s)}
            for s, v in sorted(bt.items(), key=lambda kv: -kv[1])
        },
    }
    if auc:
        out["corr_q_auc"] = correlations(q, auc)
        out["corr_bt_auc"] = correlations(bt, auc)
    return out


# -- systems and offline metrics -----------------------------------------------------------
@dataclass
class RecSystem:
    """A recommender under test: per-user top-k lists, and scores when the model has them."""

    name: str
    lists: dict[str, list[str]]
    scorer: Callable[[list[str], str], np.ndarray] | None = None
    items: list[str] | None = None


def system_from_file(name: str, path: str | Path) -> RecSystem:
    """Lists from ``user_id, rank, item_id`` rows (JSONL or CSV)."""
    import pandas as pd

    path = Path(path)
    df = (
        pd.read_json(path, lines=True, dtype=False)
        if path.suffix == ".jsonl"
        else pd.read_csv(path, dtype=str)
    )
    missing = {"user_id", "rank", "item_id"} - set(df.columns)
    if missing:
        from recjudge.data import DataError

        raise DataError(
            f"missing column(s) {sorted(missing)}",
            source=str(path),
            field=sorted(missing)[0],
            fix="write user_id, rank, item_id per row",
        )
    df["rank"] = pd.to_numeric(df["rank"])
    lists = {
        str(u): g.sort_values("rank")["item_id"].astype(str).tolist()
        for u, g in df.groupby("user_id")
    }
    return RecSystem(name, lists)


def genre_similarity(ds: Any) -> Callable[[str, str], float]:
    genres = {
        str(i): set(str(g).split("|")) - {""}
        for i, g in zip(
            ds.items["item_id"], ds.items.get("genres", [""] * len(ds.items)), strict=True
        )
    }

    def sim(a: str, b: str) -> float:
        ga, gb = genres.get(a, set()), genres.get(b, set())
        return len(ga & gb) / len(ga | gb) if ga | gb else 0.0

    return sim


def embedding_similarity(model: Any) -> Callable[[str, str], float]:
    """Cosine between l2-normalised item embeddings of a trained CF model."""
    emb = np.asarray(model.item_embeddings(), dtype=np.float64)
    norm = np.linalg.norm(emb, axis=1, keepdims=True)
    emb = np.divide(emb, norm, out=np.zeros_like(emb), where=norm > 0)
    index = model.item_index

    def sim(a: str, b: str) -> float:
        if a not in index or b not in index:
            return 0.0
        return float(emb[index[a]] @ emb[index[b]])

    return sim


def urd(items: Sequence[str], sim: Callable[[str, str], float]) -> float:
    """URD = 1 - mean pairwise similarity within the list (list diversity)."""
    pairs = list(itertools.combinations(items, 2))
    return 1.0 - float(np.mean([sim(a, b) for a, b in pairs])) if pairs else 0.0


def ndcg_at(items: Sequence[str], targets: set[str], k: int = 5) -> float:
    """nDCG@k with binary relevance: sum 1/log2(rank+1) over hits / ideal."""
    dcg = sum(1 / np.log2(r + 2) for r, it in enumerate(items[:k]) if it in targets)
    ideal = sum(1 / np.log2(r + 2) for r in range(min(k, len(targets))))
    return dcg / ideal if ideal else 0.0


def auc_of(scores: np.ndarray, target: int, exclude: Sequence[int]) -> float:
    """Share of candidate negatives scored below the target (ties count half)."""
    mask = np.ones(len(scores), dtype=bool)
    mask[list(exclude)] = False
    mask[target] = False
    neg = scores[mask]
    t = scores[target]
    return float((np.sum(neg < t) + 0.5 * np.sum(neg == t)) / max(len(neg), 1))


# -- prompts and judging -------------------------------------------------------------------
def user_profile(ds: Any, user_id: str) -> str:
    row = ds.user_row(user_id)
    if row is None:
        return ""
    parts = []
    age = row.get("age")
    if age is not None and age == age:
        parts.append(
            f"age {ML_AGE.get(int(age), int(age))}" if ds.name == "ml-1m" else f"age {int(age)}"
        )
    if row.get("gender") in ("M", "F"):
        parts.append("male" if row["gender"] == "M" else "female")
    occ = row.get("occupation")
    if occ is not None and occ == occ:
        try:
            parts.append(ML_OCCUPATION[int(float(occ))])
        except (ValueError, IndexError):
            parts.append(str(occ))
    return ", ".join(parts)


def arena_messages(
    profile: str,
    history: Sequence[str],
    list_a: Sequence[str],
    list_b: Sequence[str],
    analysis_chars: int,
    domain: str = "movies",
) -> list[dict[str, str]]:
    hist = "\n".join(f"- {h}" for h in history)
    la = "\n".join(f"{i + 1}. {x}" for i, x in enumerate(list_a))
    lb = "\n".join(f"{i + 1}. {x}" for i, x in enumerate(list_b))
    who = f"You are a {domain} fan ({profile})." if profile else f"You are a {domain} fan."
    system = (
        f"{who} Two recommender systems, A and B, each suggest a list for you. Judge "
        "them honestly as this user."
    )
    user = (
        f"Your most recent {domain}, newest first:\n{hist}\n\nList A:\n{la}\n\nList B:\n"
        f"{lb}\n\nFirst write a short analysis (at most {analysis_chars} characters) of "
        "both lists on six aspects: accuracy, satisfaction, inspiration, content quality, "
        "transparency and impact on you. Then give a verdict for each aspect and an "
        'overall verdict, each "A wins", "B wins" or "Tie". Answer in JSON: {"analysis": '
        '"...", "accuracy": ..., "satisfaction": ..., "inspiration": ..., '
        '"content_quality": ..., "transparency": ..., "impact": ..., "overall": ...}'
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def absolute_messages(
    profile: str, history: Sequence[str], items: Sequence[str], domain: str = "movies"
) -> list[dict[str, str]]:
    hist = "\n".join(f"- {h}" for h in history)
    lst = "\n".join(f"{i + 1}. {x}" for i, x in enumerate(items))
    who = f"You are a {domain} fan ({profile})." if profile else f"You are a {domain} fan."
    return [
        {"role": "system", "content": f"{who} Rate a recommendation list for yourself."},
        {
            "role": "user",
            "content": f"Your most recent {domain}, newest first:\n{hist}\n\n"
            f"Recommended list:\n{lst}\n\nHow good is this list for you? Answer in JSON: "
            '{"rating": "awful", "poor", "fair", "good" or "excellent"}',
        },
    ]


# -- the run ------------------------------------------------------------------------------
def build_systems(
    ds: Any,
    specs: Sequence[str],
    split: Any,
    users: Sequence[str],
    k: int,
    seed: int = 0,
    threads: int = 2,
) -> dict[str, RecSystem]:
    """Systems from specs: a CF model name (trained here on the train split), ``name=DIR``
    (a saved CF model) or ``name=FILE`` (lists as user_id, rank, item_id)."""
    from recjudge.cf_models import MODELS, TrainOptions, load_model

    hist = (
        split.train.sort_values(["user_id", "timestamp"], kind="stable")
        .groupby("user_id")["item_id"]
        .apply(lambda s: s.astype(str).tolist())
    )
    out = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        if path and Path(path).is_file():
            out[name] = system_from_file(name, path)
            continue
        if path:
            model = load_model(path)
        else:
            cls = MODELS.get(name)
            cfg = {"epochs": 30, "max_len": 100} if name == "sasrec" else {}
            model = cls(cls.Config(**cfg)).train(
                split.train,
                TrainOptions(seed=seed, threads=threads, progress=False),
                items=ds.items["item_id"].astype(str).tolist(),
            )
        lists = {}
        for u in users:
            h = hist.get(u, [])
            lists[u] = model.recommend(h, k=k, user_id=u)
        out[name] = RecSystem(name, lists, lambda h, u, m=model: m.score_history(h, u), model.items)
    return out


def offline_metrics(
    ds: Any,
    systems: dict[str, RecSystem],
    split: Any,
    users: Sequence[str],
    k: int = 5,
    similarity: str = "genre",
    seed: int = 0,
) -> dict[str, dict[str, float | None]]:
    """AUC (held-out item vs unseen items), nDCG@k of the list, URD (1 - mean pairwise
    similarity: genre Jaccard, or cosine of ALS item embeddings trained on the train split)."""
    if similarity == "genre":
        sim = genre_similarity(ds)
    elif similarity == "embedding":
        from recjudge.cf_models import ALS, TrainOptions

        als = ALS().train(
            split.train,
            TrainOptions(seed=seed, progress=False),
            items=ds.items["item_id"].astype(str).tolist(),
        )
        sim = embedding_similarity(als)
    else:
        raise ValueError(f"unknown similarity {similarity!r}; use genre or embedding")
    hist = split.train.groupby("user_id")["item_id"].apply(lambda s: s.astype(str).tolist())
    valid = dict(
        zip(split.valid["user_id"].astype(str), split.valid["item_id"].astype(str), strict=True)
    )
    test = dict(
        zip(split.test["user_id"].astype(str), split.test["item_id"].astype(str), strict=True)
    )
    out = {}
    for name, s in systems.items():
        aucs, ndcgs, urds = [], [], []
        for u in users:
            items = s.lists.get(u, [])
            ndcgs.append(ndcg_at(items, {test[u]}, k))
            urds.append(urd(items[:k], sim))
            if s.scorer is not None and s.items is not None:
                idx = {it: i for i, it in enumerate(s.items)}
                if test[u] in idx:
                    seen = [idx[x] for x in hist.get(u, []) + [valid.get(u, "")] if x in idx]
                    aucs.append(
                        auc_of(np.asarray(s.scorer(hist.get(u, []), u), float), idx[test[u]], seen)
                    )
        out[name] = {
            "auc": float(np.mean(aucs)) if aucs else None,
            f"ndcg@{k}": float(np.mean(ndcgs)),
            "urd": float(np.mean(urds)),
        }
    return out


def run_arena(
    config: ArenaConfig,
    data: str = "ml-1m",
    out: str | Path = "reports/arena",
    llm: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Judge every pair of systems for ``config.users`` users in both orders; write
    ``verdicts.jsonl``, ``results.json``, ``report.md`` and ``winrates.png`` under ``out``.
    Judgments are stored in ``out/store.sqlite``; a rerun resumes."""
    from recjudge.data import leave_one_out, load_dataset, render_item, sample_users
    from recjudge.decoding import Choice, Verdicts
    from recjudge.llm import SamplingConfig, load_llm
    from recjudge.reporting import write_report
    from recjudge.reward import ResultsStore
    from recjudge.reward._ask import ask

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(data)
    split = leave_one_out(ds.interactions)
    eligible = set(split.test["user_id"].astype(str))
    users = [
        u for u in sample_users(ds.user_ids(), config.users * 3, config.seed) if u in eligible
    ][: config.users]
    systems = build_systems(ds, config.systems, split, users, config.k, config.seed)
    offline = offline_metrics(ds, systems, split, users, config.k, config.similarity, config.seed)
    llm = llm or load_llm(config.model)
    text = {
        str(i): render_item(r, ds.domain)
        for i, r in zip(ds.items["item_id"], ds.items.to_dict("records"), strict=True)
    }
    hist = (
        split.train.sort_values(["user_id", "timestamp"], kind="stable")
        .groupby("user_id")["item_id"]
        .apply(lambda s: s.astype(str).tolist())
    )
    schema = Verdicts([*ASPECTS, "overall"], OPTIONS, config.analysis_chars)
    sampling = SamplingConfig(max_new_tokens=config.analysis_chars + 120)
    jobs = []  # (key, messages, meta)
    for u in users:
        recent = [text[i] for i in hist.get(u, [])[-config.history_items :]][::-1]
        profile = user_profile(ds, u)
        for a, b in itertools.combinations(sorted(systems), 2):
            for x, y in ((a, b), (b, a)):
                la = [text[i] for i in systems[x].lists[u][: config.k]]
                lb = [text[i] for i in systems[y].lists[u][: config.k]]
                msgs = arena_messages(
                    profile,
                    recent,
                    la,
                    lb,
                    config.analysis_chars,
                    DOMAIN_WORD.get(ds.domain, "items"),
                )
                key = stable_hash(
                    ARENA_PROMPT_VERSION,
                    config.model,
                    msgs,
                    sampling.key(),
                    schema.key(),
                    length=32,
                )
                jobs.append((key, msgs, {"user_id": u, "system_a": x, "system_b": y}))
    if config.absolute:
        ab_schema = Choice(ABSOLUTE, answer_key="rating")
        for u in users:
            recent = [text[i] for i in hist.get(u, [])[-config.history_items :]][::-1]
            for s in sorted(systems):
                msgs = absolute_messages(
                    user_profile(ds, u),
                    recent,
                    [text[i] for i in systems[s].lists[u][: config.k]],
                    DOMAIN_WORD.get(ds.domain, "items"),
                )
                key = stable_hash(ARENA_PROMPT_VERSION, "absolute", config.model, msgs, length=32)
                jobs.append((key, msgs, {"user_id": u, "system": s, "absolute": True}))
    with ResultsStore(out / "store.sqlite") as store:
        have = store.get_many([j[0] for j in jobs])
        todo = [j for j in jobs if j[0] not in have]
        # Batches of similar prompt length share a padding bucket, so the engine decodes
        # them together instead of one bucket group at a time.
        length = {j[0]: len(llm.encode(llm.chat_prompt(j[1]))) for j in todo}
        todo.sort(key=lambda j: length[j[0]])
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="arena")
        for b in range(0, len(todo), config.batch_size):
            chunk = todo[b : b + config.batch_size]
            schemas = [ab_schema if j[2].get("absolute") else schema for j in chunk]
            answers = ask(llm, [j[1] for j in chunk], schemas, sampling=sampling)
            rows = []
            for (key, _, meta), ans in zip(chunk, answers, strict=True):
                rec = ans.record
                rows.append(
                    (
                        key,
                        meta,
                        {
                            "value": ans.value,
                            "branches": list(rec.branches),
                            "p": list(rec.p_before),
                        },
                    )
                )
            store.put_many(rows)
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        done = store.get_many([j[0] for j in jobs])
    by_order = {}
    absolute: dict[str, list[float]] = {}
    for key, _, meta in jobs:
        res = done[key]
        if meta.get("absolute"):
            p = dict(zip(res["branches"], res["p"], strict=True))
            absolute.setdefault(meta["system"], []).append(
                sum(ABSOLUTE_SCORE[o] * p.get(o, 0.0) for o in ABSOLUTE)
            )
        else:
            by_order[(meta["user_id"], meta["system_a"], meta["system_b"])] = res
    records = []
    for u in users:
        for a, b in itertools.combinations(sorted(systems), 2):
            ab, ba = by_order[(u, a, b)], by_order[(u, b, a)]
            for r in pair_records(u, a, b, ab["value"], ba["value"], config.swap_rule):
                if r["aspect"] == "overall":
                    r.update(p_overall_ab=ab["p"], p_overall_ba=ba["p"])
                records.append(r)
    with open(out / "verdicts.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    auc = {s: m["auc"] for s, m in offline.items() if m["auc"] is not None}
    summary = summarize(records, auc, config.bootstrap, config.seed)
    abs_mean = {s: float(np.mean(v)) for s, v in absolute.items()}
    if abs_mean:
        summary["absolute_score"] = abs_mean
        summary["corr_absolute_auc"] = correlations(abs_mean, auc)
    summary["order_flip_rate"] = order_flip_rate(records)
    results = {
        "config": config.model_dump(),
        "data": data,
        "users": users,
        "offline": offline,
        **summary,
    }
    _plot_winrates(summary["pairs"]["overall"], out / "winrates.png")
    write_report(out, results, _arena_report(config, data, offline, summary))
    return results


DOMAIN_WORD = {"movies": "movies", "books": "books"}


def _plot_winrates(pairs: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(pairs)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.5))
    left = np.zeros(len(names))
    for key, color in (("win_pct", "#4c9a2a"), ("tie_pct", "#bbbbbb"), ("lose_pct", "#c0392b")):
        vals = np.array([pairs[n][key] for n in names])
        ax.barh(names, vals, left=left, color=color, label=key.split("_")[0])
        left += vals
    ax.set_xlabel("% of comparisons (first system's win / tie / lose)")
    ax.set_xlim(0, 100)
    ax.legend(loc="lower right")
    ax.set_title("RecSys Arena: overall verdicts per pair")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "inf" if v == float("inf") else f"{v:.3f}"
    return str(v)


def _arena_report(
    config: ArenaConfig, data: str, offline: dict[str, Any], summary: dict[str, Any]
) -> list[str]:
    lines = [
        f"# RecSys Arena ({data}, judge {config.model})",
        "",
        f"{config.users} users, systems {', '.join(config.systems)}, top-{config.k} lists,"
        f" both orders judged, swap rule '{config.swap_rule}', order-flip rate "
        f"{100 * summary['order_flip_rate']:.1f} %.",
        "",
        "## Offline metrics",
        "",
        f"| system | AUC | nDCG@{config.k} | URD |",
        "|---|---|---|---|",
    ]
    for s, m in offline.items():
        lines.append(
            f"| {s} | {_fmt(m['auc'])} | {_fmt(m[f'ndcg@{config.k}'])} | {_fmt(m['urd'])} |"
        )
    lines += [
        "",
        "## Pairs (overall)",
        "",
        "| pair | win % | tie % | lose % | Q |",
        "|---|---|---|---|---|",
    ]
    for p, c in summary["pairs"]["overall"].items():
        lines.append(
            f"| {p} | {c['win_pct']:.1f} | {c['tie_pct']:.1f} | {c['lose_pct']:.1f} | "
            f"{_fmt(c['q'])} |"
        )
    lines += [
        "",
        "## Q per aspect",
        "",
        "| pair | " + " | ".join(summary["pairs"]) + " |",
        "|---|" + "---|" * len(summary["pairs"]),
    ]
    for p in summary["pairs"]["overall"]:
        lines.append(
            f"| {p} | "
            + " | ".join(_fmt(summary["pairs"][a][p]["q"]) for a in summary["pairs"])
            + " |"
        )
    lines += [
        "",
        "## Bradley-Terry (overall)",
        "",
        "| system | strength | 95 % CI | Q | AUC |",
        "|---|---|---|---|---|",
    ]
    for s, v in summary["bradley_terry"].items():
        ci = v["ci95"]
        lines.append(
            f"| {s} | {v['strength']:+.3f} | "
            f"{'-' if ci is None else f'[{ci[0]:+.2f}, {ci[1]:+.2f}]'} | "
            f"{_fmt(summary['system_q'].get(s))} | {_fmt(offline[s]['auc'])} |"
        )
    for name in ("corr_q_auc", "corr_bt_auc", "corr_absolute_auc"):
        if name in summary:
            c = summary[name]
            lines.append(
                f"- {name}: Pearson {_fmt(c['pearson'])}, Spearman "
                f"{_fmt(c['spearman'])} (n = {c['n']})"
            )
    if "absolute_score" in summary:
        lines.append(
            "- absolute score (0-1, expected from the rating branch probabilities): "
            + ", ".join(f"{s} {v:.3f}" for s, v in summary["absolute_score"].items())
        )
    lines += ["", "![win/tie/lose](winrates.png)"]
    return lines
