"""RecSys Arena's systems under test and their offline metrics (AUC, nDCG@k, URD)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recjudge.cf_models import ALS, MODELS, SideInfo, TrainOptions, load_model
from recjudge.data import DataError
from recjudge.evaluators.arena._metrics import auc_of, ndcg_at, urd


# -- systems -------------------------------------------------------------------------------
@dataclass
class RecSystem:
    """A recommender under test: per-user top-k lists, and scores when the model has them."""

    name: str
    lists: dict[str, list[str]]
    scorer: Callable[[list[str], str], np.ndarray] | None = None
    items: list[str] | None = None


def system_from_file(name: str, path: str | Path) -> RecSystem:
    """Lists from ``user_id, rank, item_id`` rows (JSONL or CSV)."""
    path = Path(path)
    df = (
        pd.read_json(path, lines=True, dtype=False)
        if path.suffix == ".jsonl"
        else pd.read_csv(path, dtype=str)
    )
    missing = {"user_id", "rank", "item_id"} - set(df.columns)
    if missing:
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
                side=SideInfo.of(ds),
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
