"""Retraining recommenders on augmented data (``brief-augment``'s expensive half).

Each retraining is one job: a recommender, a seed and the pairs a method adds. A job trains on
one thread and is seeded, so on a given machine its result does not depend on what runs
beside it (across CPUs with other vector kernels, float rounding differs and 30 epochs of
SASRec carry it into the metrics: compare methods within one machine's run); that
is what lets ``workers`` jobs run at once in separate processes (on a 2-core machine a SASRec
retraining keeps one core busy, so two workers finish the same jobs in about half the time)
without changing a number. Every finished job is kept on disk by content, so an interrupted
run resumes with the jobs it had not finished.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from recjudge._metrics import ranking_metrics
from recjudge._util import atomic_write_json, json_loads, path_component, stable_hash
from recjudge.bench._offline import untrained_system
from recjudge.cf_models import TrainOptions

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


#: the histories a retrained recommender can score a user from (``RetrainJob.score_from``)
SCORE_FROM = ("augmented", "logged")


def other_score_from(score_from: str) -> str:
    """The history of ``SCORE_FROM`` that is not ``score_from``."""
    return next(s for s in SCORE_FROM if s != score_from)


@dataclass(frozen=True)
class RetrainJob:
    """One retraining: ``rec`` on the past plus ``added`` (per user), seeded by ``seed``.

    ``score_from``: the history each user is scored from after training: ``augmented``, the
    logged past followed by the added items (for a sequential model they are the last items
    it conditions on); ``logged``, the logged past alone (the added items shape training only).
    """

    rec: str
    seed: int
    added: Mapping[str, Sequence[str]]
    score_from: str = "augmented"

    def __post_init__(self) -> None:
        if self.score_from not in SCORE_FROM:
            raise ValueError(
                f"score_from must be one of {', '.join(SCORE_FROM)}, got {self.score_from!r}"
            )

    def pairs(self, users: Sequence[str]) -> list[tuple[str, str]]:
        """The added (user, item) pairs, sorted: what the job adds, in a canonical order."""
        return sorted((u, i) for u in users for i in self.added[u])

    def twin(self) -> RetrainJob:
        """The same retraining scored from the other history."""
        return replace(self, score_from=other_score_from(self.score_from))

    def history(self, data: RetrainData, user: str) -> list[str]:
        """The history ``user`` is scored from (``score_from``)."""
        logged = list(data.hist[user])
        return logged + list(self.added[user]) if self.score_from == "augmented" else logged


def _kept_path(config: Any, data: RetrainData, job: RetrainJob, cache: Path) -> Path:
    """Where ``job``'s result is kept: named by everything it depends on (the recommender's
    settings, the data split, the users, the seed and the added pairs), so two methods that
    add the same items share one retraining."""
    model = untrained_system(config, job.rec)
    added = job.pairs(data.users)
    # Scoring from the logged history is named in the key only when something was added:
    # without additions both histories are the same, so the result is too (and is shared),
    # and keys of results kept before the option existed stay valid.
    scoring = ("score_from", job.score_from) if added and job.score_from != "augmented" else ()
    key = stable_hash(
        job.rec, model.config.model_dump(), config.data, config.future_fraction,
        config.min_future, config.positive_rating, len(data.past), data.users, job.seed, added,
        METRICS, *scoring,
    )  # fmt: skip
    return cache / f"{path_component(job.rec)}-{key}.json"


def _kept(path: Path) -> np.ndarray | None:
    """A finished job's per-user metrics, or None (not run, or a damaged file: run again)."""
    if not path.exists():
        return None
    try:
        return np.asarray(json_loads(path.read_text())["per_user"], dtype=float)
    except (ValueError, KeyError):
        return None


def retrain(config: Any, data: RetrainData, job: RetrainJob, path: Path) -> np.ndarray:
    """Train ``job.rec`` on the past plus the added pairs (one thread) and score the augmented
    users from ``job.history``: their metrics ``[users, METRICS]``, also written to ``path``
    (numbers only).

    When the job adds anything, the same model also scores the users from the other history
    (``SCORE_FROM``) and keeps that result under its own key beside ``path``: a run with the
    other ``score_from`` then reads it back instead of training the same model again (a
    scoring costs seconds, a SASRec training minutes), and the two settings compare on one
    trained model.
    """
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
    per_user = _scored(model, data, job)
    _keep(path, job, per_user)
    if added:  # without additions both histories are the same (and so is the key)
        twin = job.twin()
        _keep(_kept_path(config, data, twin, path.parent), twin, _scored(model, data, twin))
    return per_user


def _scored(model: Any, data: RetrainData, job: RetrainJob) -> np.ndarray:
    """A trained model's metrics ``[users, METRICS]`` on the augmented users' future, each
    user scored from ``job.history``."""
    rows = []
    for u in data.users:
        # Only real past interactions are excluded from the list (whatever the history scored
        # from): an added pseudo-positive that the user really consumes later must stay
        # recommendable.
        sc = model.score_history(job.history(data, u), u).astype(float)
        sc[model.encode(data.hist[u])] = -np.inf
        lst = [model.items[i] for i in np.argsort(-sc, kind="stable")[: max(AUG_KS)]]
        m = ranking_metrics([int(i in data.test[u]) for i in lst], len(data.test[u]), AUG_KS)
        rows.append([m[k] for k in METRICS])
    return np.asarray(rows, dtype=float)


def _keep(path: Path, job: RetrainJob, per_user: np.ndarray) -> None:
    """Write a retraining's result to ``path``: numbers only (no ids or titles), so the file
    can travel with a checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"recommender": job.rec, "seed": job.seed, "metrics": list(METRICS),
                             "per_user": per_user.tolist()})  # fmt: skip


def kept_twins(
    config: Any, data: RetrainData, jobs: Sequence[RetrainJob], cache: Path
) -> list[np.ndarray] | None:
    """Every job's result scored from the other history (``SCORE_FROM``), in job order, as
    ``retrain`` kept it beside the job's own; None when any is not kept (never trains)."""
    out = []
    for job in jobs:
        kept = _kept(_kept_path(config, data, job.twin(), cache))
        if kept is None:
            return None
        out.append(kept)
    return out


def _one_thread() -> None:
    """A worker's start: every thread pool (torch, BLAS, OpenMP) on one thread for the whole
    process, not only during training, so workers never compete for the same cores."""
    import torch

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
