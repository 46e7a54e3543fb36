"""Evaluation protocols, ranking metrics, and the train-evaluate-calibrate pipeline."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recjudge._metrics import discount, rel_from_ranks
from recjudge._metrics import ndcg as ndcg_at
from recjudge._util import (
    atomic_write_json,
    cache_dir,
    path_component,
    rng,
    sha256_file,
    stable_hash,
)
from recjudge.cf_models._base import (
    MODELS,
    CFModel,
    SideInfo,
    SignalConfig,
    TrainOptions,
    load_model,
)
from recjudge.cf_models._classic import ItemItemConfig, ItemItemSimilarity
from recjudge.data import Dataset, leave_one_out


def rank_of_target(target: float, others: np.ndarray) -> int:
    """0-based rank of ``target`` among ``others``; ties count against the target."""
    return int(np.sum(others >= target))


def hit_ndcg(ranks: np.ndarray, k: int) -> tuple[float, float]:
    """HR@k = mean[rank < k]; NDCG@k = mean[discount at rank if rank < k] (one target each:
    its ideal DCG is 1; ``recjudge._metrics``)."""
    ranks = np.asarray(ranks, dtype=int)
    hit = ranks < k
    gain = discount(k)[np.minimum(ranks, k - 1)] if k > 0 else np.zeros(len(ranks))
    return float(hit.mean()), float(np.where(hit, gain, 0.0).mean())


def _histories(train: pd.DataFrame) -> dict[str, list[str]]:
    t = train.sort_values(["user_id", "timestamp"], kind="stable")
    return {str(u): g.astype(str).tolist() for u, g in t.groupby("user_id", sort=False)["item_id"]}


def evaluate_sampled(
    model: CFModel,
    train: pd.DataFrame,
    test: pd.DataFrame,
    n_neg: int = 100,
    ks: Sequence[int] = (10,),
    seed: int = 0,
    extra_seen: pd.DataFrame | None = None,
    max_users: int | None = None,
) -> dict[str, float]:
    """Leave-one-out with ``n_neg`` sampled negatives (Kang & McAuley 2018; Krichene & Rendle
    2020 caution that sampled metrics can mis-rank models: report ``full`` too).

    Negatives are items the user never interacted with (train, the test item, and
    ``extra_seen`` such as validation), drawn per user from a sha256-seeded generator.
    """
    hist = _histories(train)
    seen_extra = _histories(extra_seen) if extra_seen is not None else {}
    users = test["user_id"].astype(str).tolist()
    targets = test["item_id"].astype(str).tolist()
    if max_users is not None:
        users, targets = users[:max_users], targets[:max_users]
    n = len(model.items)
    ranks = []
    for b in range(0, len(users), 256):
        bu, bt = users[b : b + 256], targets[b : b + 256]
        scores = model.score_many([hist.get(u, []) for u in bu], bu)
        for row, (u, t) in enumerate(zip(bu, bt, strict=True)):
            if t not in model.item_index:
                ranks.append(n)  # an unknown target is a miss
                continue
            seen = set(model.encode(hist.get(u, []) + seen_extra.get(u, []) + [t]))
            g = rng("sampled", seed, u)
            neg: list[int] = []
            while len(neg) < n_neg:
                cand = g.integers(0, n, size=2 * n_neg)
                neg.extend(int(c) for c in cand if c not in seen and c not in neg)
                if len(seen) + n_neg > n:
                    break
            neg = neg[:n_neg]
            s = scores[row]
            ranks.append(rank_of_target(s[model.item_index[t]], s[neg]))
    out: dict[str, float] = {"users": float(len(ranks))}
    for k in ks:
        out[f"hr@{k}"], out[f"ndcg@{k}"] = hit_ndcg(np.array(ranks), k)
    return out


def evaluate_full(
    model: CFModel,
    train: pd.DataFrame,
    test: pd.DataFrame,
    ks: Sequence[int] = (10, 20),
    extra_seen: pd.DataFrame | None = None,
    max_users: int | None = None,
) -> dict[str, float]:
    """Full ranking over the catalogue minus the user's seen items: Recall@k, NDCG@k.

    With one held-out item per user, Recall@k equals HR@k.
    """
    hist = _histories(train)
    seen_extra = _histories(extra_seen) if extra_seen is not None else {}
    tests = test.groupby(test["user_id"].astype(str))["item_id"].apply(
        lambda s: s.astype(str).tolist()
    )
    users = tests.index.tolist()[:max_users]
    recall = {k: [] for k in ks}
    ndcg = {k: [] for k in ks}
    for b in range(0, len(users), 256):
        bu = users[b : b + 256]
        scores = model.score_many([hist.get(u, []) for u in bu], bu).astype(np.float64)
        for row, u in enumerate(bu):
            s = scores[row]
            s[model.encode(hist.get(u, []) + seen_extra.get(u, []))] = -np.inf
            targets = [model.item_index[t] for t in tests[u] if t in model.item_index]
            if not targets:
                for k in ks:
                    recall[k].append(0.0)
                    ndcg[k].append(0.0)
                continue
            # 0-based position of each target in the ranked list; ties go against it
            ranks = np.array([int(np.sum(s >= s[t])) - 1 for t in targets])
            for k in ks:
                recall[k].append(np.sum(ranks < k) / len(targets))
                ndcg[k].append(ndcg_at(rel_from_ranks(ranks, k), len(targets), k))
    out: dict[str, float] = {"users": float(len(users))}
    for k in ks:
        out[f"recall@{k}"] = float(np.mean(recall[k]))
        out[f"ndcg@{k}"] = float(np.mean(ndcg[k]))
    return out


def calibration_pairs(
    split_train: pd.DataFrame,
    valid: pd.DataFrame,
    items: Sequence[str],
    seed: int = 0,
    max_users: int = 2000,
) -> tuple[list[list[str]], list[str], list[str]]:
    """(history, candidate, user) triples: each validation item and one random unseen item."""
    hist = _histories(split_train)
    users = valid["user_id"].astype(str).tolist()[:max_users]
    targets = valid["item_id"].astype(str).tolist()[:max_users]
    g = rng("calibration", seed)
    hs, cs, us = [], [], []
    for u, t in zip(users, targets, strict=True):
        h = hist.get(u, [])
        seen = set(h) | {t}
        while True:
            r = items[int(g.integers(len(items)))]
            if r not in seen:
                break
        for c in (t, r):
            hs.append(h)
            cs.append(c)
            us.append(u)
    return hs, cs, us


def training_seconds(train_info: dict[str, Any]) -> float | None:
    """The whole training time: the per-epoch seconds when every epoch has them (a run
    resumed from its checkpoint saw only its last epochs in this process), else the
    recorded ``train_seconds``."""
    epochs = train_info.get("epochs") or []
    if epochs and all("seconds" in e for e in epochs):
        return float(sum(e["seconds"] for e in epochs))
    return train_info.get("train_seconds")


def train_cf(
    name: str,
    dataset: Dataset,
    out: str | Path | None = None,
    config: dict[str, Any] | None = None,
    options: TrainOptions | None = None,
    signal: SignalConfig | None = None,
    eval_every: int = 0,
) -> CFModel:
    """Leave-one-out split, train on train, calibrate sigma on validation, save to ``out``.

    For SASRec, ``out/checkpoint`` holds per-epoch checkpoints and training resumes there;
    ``eval_every`` > 0 reports validation HR@10 (sampled) every that many epochs.
    """
    options = options or TrainOptions()
    cls = MODELS.get(name)
    model = cls(cls.Config(**(config or {})))
    split = leave_one_out(dataset.interactions)
    items = dataset.items["item_id"].astype(str).tolist()
    if hasattr(model, "checkpoint_dir") and out is not None:
        model.checkpoint_dir = Path(out).with_name(Path(out).name + ".checkpoint")
    if eval_every and hasattr(model, "on_epoch"):

        def on_epoch(epoch: int, loss: float, m: CFModel) -> dict[str, float] | None:
            if epoch % eval_every:
                return None
            r = evaluate_sampled(m, split.train, split.valid, max_users=1000)
            return {"val_hr@10": r["hr@10"], "val_ndcg@10": r["ndcg@10"]}

        model.on_epoch = on_epoch
    t0 = time.perf_counter()
    model.train(split.train, options, items=items, side=SideInfo.of(dataset))
    model.train_info["train_seconds"] = time.perf_counter() - t0
    model.train_info["train_seconds"] = training_seconds(model.train_info)
    model.train_info["dataset"] = dataset.name
    model.train_info["dataset_location"] = dataset.location or dataset.name
    hs, cs, us = calibration_pairs(split.train, split.valid, model.items, options.seed)
    model.calibrate(hs, cs, us, signal)
    if out is not None:
        model.save(out)
    return model


def cached_cf(
    name: str,
    dataset: Dataset,
    config: dict[str, Any] | None = None,
    seed: int = 0,
    threads: int = 2,
) -> tuple[CFModel, Path, bool]:
    """A CF model trained once per (model, dataset, config, seed), then loaded from the cache.

    Returns (model, its folder under ``$RECJUDGE_CACHE/cf``, whether it was trained now). A
    folder that does not load (an interrupted save) is trained again.
    """
    config = dict(config or {})
    tag = stable_hash(name, dataset.name, len(dataset.interactions), config, seed, length=10)
    path = cache_dir() / "cf" / f"{path_component(name)}-{path_component(dataset.name)}-{tag}"
    if (path / "model.json").exists():
        try:
            return load_model(path), path, False
        except (FileNotFoundError, ValueError):  # CFModelError: a half-written folder
            shutil.rmtree(path, ignore_errors=True)
    model = train_cf(name, dataset, path, config, TrainOptions(seed=seed, threads=threads))
    return model, path, True


def calibrated_cf(
    name: str, interactions: Any, items: Sequence[str], seed: int, side: Any = None
) -> Any:
    """CF model ``name`` trained on the leave-one-out train part of ``interactions``, its
    sigma scale calibrated on the held-out validation items (and random unseen items).
    ``side``: the dataset's ``SideInfo``, for models that use item/user attributes."""
    split = leave_one_out(interactions)
    cls = MODELS.get(name)
    model = cls(cls.Config())
    model.train(split.train, TrainOptions(seed=seed, progress=False), items=list(items), side=side)
    return calibrate_on(model, split, seed)


def calibrate_on(
    model: CFModel, split: Any, seed: int, signal: SignalConfig | None = None
) -> CFModel:
    """``model``'s sigma scale calibrated on a leave-one-out split's validation items (and
    random unseen items), with ``signal`` (``CFModel.calibrate``'s default when None);
    returns the model."""
    hs, cs, us = calibration_pairs(split.train, split.valid, model.items, seed)
    model.calibrate(hs, cs, us, signal)
    return model


def item_item_for(
    base: CFModel,
    dataset: Dataset,
    top_k: int = 5,
    seed: int = 0,
    signal: SignalConfig | None = None,
) -> CFModel:
    """The item-item sigma model on ``base``'s item embeddings, calibrated like the others
    (validation items and random unseen items of the leave-one-out split)."""
    model = ItemItemSimilarity.from_model(base, ItemItemConfig(top_k=top_k))
    return calibrate_on(model, leave_one_out(dataset.interactions), seed, signal)


def history_at_test(split: Any, include_valid: bool = True) -> tuple[pd.DataFrame, Any]:
    """(history the model sees at test time, extra seen items excluded from candidates).

    Kang & McAuley (2018) feed the training sequence plus the validation item when
    predicting the test item (``include_valid``, the default). Without it the validation
    item is only excluded from the candidates, a harder protocol than the paper's.
    """
    if include_valid:
        both = pd.concat([split.train, split.valid], ignore_index=True)
        return both.sort_values(["user_id", "timestamp"], kind="stable"), None
    return split.train, split.valid


def eval_saved(
    path: str | Path,
    dataset: Dataset,
    protocol: str = "sampled100",
    max_users: int | None = None,
    seed: int = 0,
    include_valid: bool = True,
) -> dict[str, Any]:
    """Evaluate a saved model on the dataset's leave-one-out test split (test-time history:
    ``history_at_test``)."""
    model = load_model(path)
    split = leave_one_out(dataset.interactions)
    hist, extra = history_at_test(split, include_valid)
    if protocol == "sampled100":
        res = evaluate_sampled(
            model, hist, split.test, extra_seen=extra, max_users=max_users, seed=seed
        )
    elif protocol == "full":
        res = evaluate_full(model, hist, split.test, extra_seen=extra, max_users=max_users)
    else:
        raise ValueError(f"unknown protocol {protocol!r}; use sampled100 or full")
    return {"model": model.name, "protocol": protocol, "dataset": dataset.name,
            "test_history": "train+valid" if include_valid else "train", **res}  # fmt: skip


def top_k_lists(
    model: Any, dataset: Dataset, k: int, users: Sequence[str] | None = None
) -> dict[str, list[str]]:
    """Each user's top-k items under ``model`` from their history in ``dataset``, seen items
    excluded (best first; ties keep the model's item order)."""
    hist = _histories(dataset.interactions)
    users = list(users) if users is not None else list(hist)
    out: dict[str, list[str]] = {}
    for b in range(0, len(users), 256):
        bu = users[b : b + 256]
        scores = model.score_many([hist.get(u, []) for u in bu], bu).astype(np.float64)
        for row, u in enumerate(bu):
            s = scores[row]
            s[model.encode(hist.get(u, []))] = -np.inf
            out[u] = [model.items[i] for i in np.argsort(-s, kind="stable")[:k]]
    return out


def model_fingerprint(path: str | Path) -> str:
    """A saved CF model's identity: sha256 over its ``model.json`` and ``model.safetensors``
    (the same bytes give the same fingerprint, wherever the folder is)."""
    path = Path(path)
    h = hashlib.sha256()
    for name in ("model.json", "model.safetensors"):
        h.update(sha256_file(path / name).encode())
    return h.hexdigest()


def provenance_path(run: str | Path) -> Path:
    """Where a run file's provenance record lives: ``RUN.provenance.json`` beside it."""
    return Path(f"{run}.provenance.json")


def recommend_saved(
    path: str | Path,
    dataset: Dataset,
    k: int = 10,
    out: str | Path = "",
    users: Sequence[str] | None = None,
) -> Path:
    """Top-k lists (``user_id, rank, item_id`` JSONL) for each user, excluding seen items, and
    ``OUT.provenance.json`` saying which model wrote them (its folder, name and
    ``model_fingerprint``), so that a judge whose sigma comes from the same model is caught
    when the run is evaluated (``evaluators.circular_systems``)."""
    model = load_model(path)
    lists = top_k_lists(model, dataset, k, users)
    rows = [{"user_id": u, "rank": r + 1, "item_id": i}
            for u, top in lists.items() for r, i in enumerate(top)]  # fmt: skip
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tmp.replace(out)
    atomic_write_json(provenance_path(out), {
        "written_by": "recjudge cf recommend", "model": model.name,
        "model_folder": str(path), "model_fingerprint": model_fingerprint(path),
        "dataset": dataset.name, "k": k,
    })  # fmt: skip
    return out


def save_eval(path: str | Path, results: dict[str, Any]) -> None:
    atomic_write_json(path, results)
