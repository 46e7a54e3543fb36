"""Augment training data with judge-labelled pseudo-positives (BRIEF, Tables 4-5).

For each user, the candidates are the top-k of a recommender's run that the user has not
interacted with. The judge labels every candidate; the pseudo-positives are the candidates it
says YES to, the top-M of those by p_yes, equal p_yes by log-odds (fewer when it says YES to
fewer: a NO is never added). They are appended to the interactions with ``source = "judge"``
(logged rows get ``source = "logged"``) and the judge's ``p_yes``. The result is a dataset
folder that ``recjudge cf train`` accepts; its leave-one-out split holds out logged rows only,
so a pseudo-positive is never a validation or test item.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from recjudge.data import Dataset, sample_users
from recjudge.evaluators.offline._impute import require_some_judged
from recjudge.evaluators.offline._runs import RecRun
from recjudge.reward import requests_for


class AugmentConfig(BaseModel):
    """``augment`` settings.

    Attributes:
        k: candidates per user: the run's top-k, minus items the user already has.
        top_m: at most this many pseudo-positives per user (top by p_yes among the YES).
        users: augment a seeded sample of this many users of the run (None: all).
        seed: the user sample's seed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(10, ge=1, description="Candidates judged per user.")
    top_m: int = Field(2, ge=1, description="Most pseudo-positives added per user.")
    users: int | None = Field(None, ge=1, description="A seeded sample of the run's users.")
    seed: int = Field(0, description="The user sample's seed.")


def select_positives(judgments: Sequence[Any], top_m: int) -> dict[str, list[Any]]:
    """Per user, the YES judgments, best p_yes first, at most top_m.

    Equal p_yes are ordered by the judgment's ``log_odds`` (then candidate order): a strong
    bias saturates p_yes at exactly 1.0 for many candidates, and without the log-odds the
    candidate recommender's order, not the judge, would pick among them. Failed judgments
    (``error`` set) carry no verdict and are never selected.
    """
    by_user: dict[str, list[tuple[int, Any]]] = {}
    for n, j in enumerate(judgments):
        if j.error is None and j.is_relevant:
            by_user.setdefault(j.user_id, []).append((n, j))
    return {
        u: [j for _, j in sorted(js, key=lambda t: (-t[1].p_yes, -t[1].log_odds, t[0]))[:top_m]]
        for u, js in by_user.items()
    }


def augmented_interactions(ds: Dataset, chosen: dict[str, list[Any]]) -> pd.DataFrame:
    """Logged rows (``source`` logged) + one implicit positive per chosen judgment, stamped
    with the user's last timestamp so it sorts after the logged rows (stable order)."""
    inter = ds.interactions.copy()
    if "source" not in inter.columns:
        inter["source"] = "logged"
    if "p_yes" not in inter.columns:
        inter["p_yes"] = np.nan
    last = inter.groupby("user_id", observed=True)["timestamp"].max()
    last.index = last.index.astype(str)
    rows = [
        {"user_id": u, "item_id": j.candidate_id, "timestamp": last.get(u, 0.0),
         "rating": np.nan, "event_type": "implicit_positive", "source": "judge",
         "p_yes": float(j.p_yes)}
        for u, js in chosen.items() for j in js
    ]  # fmt: skip
    if not rows:
        return inter
    add = pd.DataFrame(rows)
    add["user_id"] = add["user_id"].astype(inter["user_id"].dtype)
    add["item_id"] = add["item_id"].astype(inter["item_id"].dtype)
    add["event_type"] = pd.Categorical(add["event_type"],
                                       categories=inter["event_type"].cat.categories)  # fmt: skip
    return pd.concat([inter, add], ignore_index=True)


@dataclass
class AugmentPlan:
    """What ``augment`` will judge: the sampled users, the candidate requests (in candidate
    order) and how many candidates' requests could not be built.

    Callers that label with several judges (``bench brief-augment``) build the plan once and
    fill a store for all of them before each ``augment`` reads it back.
    """

    users: list[str]
    requests: list[Any]
    unbuildable: int


def augment_plan(data: Dataset, candidates: RecRun, config: AugmentConfig) -> AugmentPlan:
    """The users and candidate requests ``augment`` judges (deterministic): per sampled user,
    the run's top-``k`` items the user has not interacted with."""
    users = sample_users(list(candidates.rankings), config.users or len(candidates.rankings),
                         config.seed)  # fmt: skip
    pairs = []
    for u in users:
        seen = set(data.history(u)["item_id"].astype(str))
        pairs += [(u, i) for i in candidates.rankings[u] if i not in seen][: config.k]
    built = requests_for(data, pairs)
    reqs = [r for r in built if not isinstance(r, Exception)]
    return AugmentPlan(users, reqs, len(built) - len(reqs))


def augment(
    judge: Any,
    data: Dataset,
    candidates: RecRun,
    config: AugmentConfig,
    out: str | Path,
    *,
    store: Any = None,
    progress: bool = False,
    plan: AugmentPlan | None = None,
) -> dict[str, Any]:
    """Judge each user's candidates, add the top-M YES as pseudo-positives, save to ``out``.

    ``plan``: ``augment_plan(data, candidates, config)`` built once by a caller that labels
    with several judges through one store (built here when not given).

    Returns:
        The summary: users, candidates judged/failed, pseudo-positives added (total and
        the distribution per user), YES rate, seconds per judged pair.

    Raises:
        JobFailedError: every candidate failed (the most common error named); nothing saved.
    """
    plan = plan or augment_plan(data, candidates, config)
    users, reqs, unbuildable = plan.users, plan.requests, plan.unbuildable
    t0 = time.perf_counter()
    judged = judge.judge_many(reqs, store=store, progress=progress, errors="record")
    seconds = time.perf_counter() - t0
    # Nothing judged: an augmented dataset equal to the input would look finished.
    require_some_judged(judged, ["a request that could not be built"] * unbuildable,
                        "candidate")  # fmt: skip
    chosen = select_positives(judged, config.top_m)
    inter = augmented_interactions(data, chosen)
    note = (f"augmented: {sum(map(len, chosen.values()))} judge pseudo-positives "
            f"(top-{config.top_m} YES of {config.k} candidates from {candidates.name}, "
            f"judge {judge.config.model}/{judge.config.mode})")  # fmt: skip
    data.with_interactions(inter, note).save(out)
    per_user = [len(chosen.get(u, [])) for u in users]
    run = judge.last_run
    return {
        "users": len(users),
        "candidates": len(reqs),
        "failed": sum(j.error is not None for j in judged) + unbuildable,
        "yes": sum(j.error is None and j.is_relevant for j in judged),
        "added": int(sum(per_user)),
        "added_per_user": {str(n): per_user.count(n) for n in sorted(set(per_user))},
        "seconds": round(seconds, 2),
        "seconds_per_judged_pair": round(seconds / run.judged, 3) if run and run.judged else None,
        "out": str(out),
        "config": config.model_dump(),
    }
