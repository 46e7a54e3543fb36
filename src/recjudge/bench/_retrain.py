"""Retraining recommenders on augmented data (``brief-augment``'s expensive half).

Each retraining is one job: a recommender, a seed and the pairs a method adds. A job trains on
one thread and is seeded, so its result does not depend on where or beside what it runs; that
is what lets ``workers`` jobs run at once in separate processes (on a 2-core machine a SASRec
retraining keeps one core busy, so two workers finish the same jobs in about half the time)
without changing a number. Every finished job is kept on disk by content, so an interrupted
run resumes with the jobs it had not finished.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

AUG_KS = (5, 10, 15, 20)
#: the retrained recommenders' metrics on the augmented users' future
METRICS = tuple(f"{m}@{k}" for k in AUG_KS for m in ("recall", "p", "ndcg"))


@dataclass(frozen=True)
class RetrainData:
    """What every retraining shares (plain tables: it is sent to worker processes).

    Attributes:
        past: the interactions before the split (the training data before augmentation).
        items: the catalogue.
        side: item/user attributes for the recommenders that use them.
        users: the augmented users, in report order.
        hist: each augmented user's past items, in time order.
        test: each augmented user's future positives (the test set).
    """

    past: pd.DataFrame
    items: list[str]
    side: Any
    users: list[str]
    hist: dict[str, list[str]]
    test: dict[str, set[str]]


@dataclass(frozen=True)
class RetrainJob:
    """One retraining: ``rec`` on the past plus ``added`` (per user), seeded by ``seed``."""

    rec: str
    seed: int
    added: Mapping[str, Sequence[str]]

    def pairs(self, users: Sequence[str]) -> list[tuple[str, str]]:
        """The added (user, item) pairs, sorted: what the job adds, in a canonical order."""
        return sorted((u, i) for u in users for i in self.added[u])


def _kept_path(config: Any, data: RetrainData, job: RetrainJob, cache: Path) -> Path:
    """Where ``job``'s result is kept: named by everything it depends on (the recommender's
    settings, the data split, the users, the seed and the added pairs), so two methods that
    add the same items share one retraining."""
    from recjudge._util import stable_hash
    from recjudge.bench._offline import untrained_system

    model = untrained_system(config, job.rec)
    added = job.pairs(data.users)
    key = stable_hash(
        job.rec, model.config.model_dump(), config.data, config.future_fraction,
        config.min_future, config.positive_rating, len(data.past), data.users, job.seed, added,
        METRICS,
    )  # fmt: skip
    return cache / f"{job.rec}-{key}.json"


def _kept(path: Path) -> np.ndarray | None:
    """A finished job's per-user metrics, or None (not run, or a damaged file: run again)."""
    if not path.exists():
        return None
    try:
        return np.asarray(json.loads(path.read_text())["per_user"], dtype=float)
    except (ValueError, KeyError):
        return None


def retrain(config: Any, data: RetrainData, job: RetrainJob, path: Path) -> np.ndarray:
    """Train ``job.rec`` on the past plus the added pairs (one thread) and score the augmented
    users: their metrics ``[users, METRICS]``, also written to ``path`` (numbers only)."""
    from recjudge._util import atomic_write_json
    from recjudge.bench._offline import ranking_metrics, untrained_system
    from recjudge.cf_models import TrainOptions

    model = untrained_system(config, job.rec)
    added = job.pairs(data.users)
    extra = pd.DataFrame(
        {
            "user_id": [u for u, _ in added],
            "item_id": [i for _, i in added],
            "timestamp": float(data.past["timestamp"].max()) + 1.0,
            "rating": config.positive_rating,
            "event_type": "implicit_positive",
        }
    )
    train = pd.concat([data.past, extra], ignore_index=True) if added else data.past
    model.train(
        train,
        TrainOptions(seed=job.seed, progress=False, threads=1),
        items=data.items,
        side=data.side,
    )
    rows = []
    for u in data.users:
        # Scored from the augmented history, but only real past interactions are excluded
        # from the list: an added pseudo-positive that the user really consumes later must
        # stay recommendable.
        sc = model.score_history(list(data.hist[u]) + list(job.added[u]), u).astype(float)
        sc[model.encode(data.hist[u])] = -np.inf
        lst = [model.items[i] for i in np.argsort(-sc, kind="stable")[: max(AUG_KS)]]
        m = ranking_metrics([int(i in data.test[u]) for i in lst], len(data.test[u]), AUG_KS)
        rows.append([m[k] for k in METRICS])
    per_user = np.asarray(rows, dtype=float)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Numbers only (no ids or titles): the file can travel with a checkpoint.
    atomic_write_json(path, {"recommender": job.rec, "seed": job.seed, "metrics": list(METRICS),
                             "per_user": per_user.tolist()})  # fmt: skip
    return per_user


def _one_thread() -> None:
    """A worker's start: every thread pool (torch, BLAS, OpenMP) on one thread for the whole
    process, not only during training, so workers never compete for the same cores."""
    import torch
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    torch.set_num_threads(1)


def _run_pending(
    config: Any,
    data: RetrainData,
    pending: Mapping[Path, RetrainJob],
    workers: int,
    done: Callable[[Path, np.ndarray], None],
) -> None:
    """Run the ``pending`` jobs (one per result path), ``workers`` at a time, calling
    ``done(path, per_user)`` as each finishes (in order with one worker)."""
    if workers == 1 or len(pending) <= 1:
        for path, job in pending.items():
            done(path, retrain(config, data, job, path))
        return
    # spawn, not fork: a forked child of a process whose OpenMP/BLAS pools have run can hang.
    ctx = multiprocessing.get_context("spawn")
    n = min(workers, len(pending))
    with ProcessPoolExecutor(n, mp_context=ctx, initializer=_one_thread) as pool:
        futures = {pool.submit(retrain, config, data, job, path): path
                   for path, job in pending.items()}  # fmt: skip
        for fut in as_completed(futures):
            done(futures[fut], fut.result())


def retrain_all(
    config: Any,
    data: RetrainData,
    jobs: Sequence[RetrainJob],
    cache: Path,
    workers: int = 1,
    progress: bool = False,
) -> list[np.ndarray]:
    """Every job's per-user metrics, in job order: kept results are read back, the rest run
    ``workers`` at a time (each in its own process, on one thread: the results are the same
    for any ``workers``). A job's result is on disk as soon as it finishes.

    Args:
        config: the bench's settings (``data``, ``future_fraction``, ``min_future``,
            ``positive_rating``, ``sasrec_epochs``).
        data: what every job trains and scores on.
        jobs: the retrainings.
        cache: folder of kept results.
        workers: jobs at once.
        progress: show a progress bar with ETA.

    Raises:
        ValueError: ``workers`` < 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    paths = [_kept_path(config, data, job, cache) for job in jobs]
    results: dict[Path, np.ndarray] = {}
    pending: dict[Path, RetrainJob] = {}
    for path, job in zip(paths, jobs, strict=True):
        kept = _kept(path)
        if kept is not None:
            results[path] = kept
        else:
            pending.setdefault(path, job)  # identical jobs (the same added pairs) train once
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(set(paths)), initial=len(results), desc="retrain", unit="model")

    def done(path: Path, per_user: np.ndarray) -> None:
        results[path] = per_user
        if bar is not None:
            bar.update(1)

    try:
        _run_pending(config, data, pending, workers, done)
    finally:
        if bar is not None:
            bar.close()
    return [results[p] for p in paths]
