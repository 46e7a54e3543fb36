"""Impute missing feedback for offline evaluation (BRIEF, Tables 2-3, on the user's own data).

An offline evaluation only knows the feedback its log holds. Items a recommender ranks in its
top-k that the user never saw have no label and count as irrelevant, which favours whatever
policy produced the log. ``impute`` labels exactly those (user, item) pairs with the judge:
each pair once even when several runs rank it, grouped by user so the history prefix is
encoded once, in a crash-safe store. Qrels = logged labels + imputed labels.

Evaluation users: users that appear in at least one run and have at least one logged
positive (the usual offline rule), optionally a seeded sample of them; logged-only and imputed
metrics are computed on this same set.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from recjudge._util import atomic_write_json, atomic_write_text
from recjudge.data import POSITIVE_EVENTS, Dataset, sample_users
from recjudge.evaluators._runs import Qrels, RecRun, write_qrels


class ImputeConfig(BaseModel):
    """What ``impute`` does with the runs (the judge has its own ``JudgeConfig``).

    Attributes:
        k: judge the top-k of every ranking.
        users: evaluate a seeded sample of this many users (None: all eligible users).
        seed: the user sample's seed.
        min_rating: logged relevance is ``rating >= min_rating``; None: a positive event
            (``explicit_positive`` / ``implicit_positive``).
        judge_logged: also judge the top-k pairs the log labels (their logged label stays in
            the qrels): the direct-method and doubly robust estimators of ``evaluate
            --estimators`` need the judge's probability for every listed pair.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(20, ge=1, description="Judge each ranking's top-k.")
    users: int | None = Field(None, ge=1, description="A seeded sample of users.")
    seed: int = Field(0, description="The user sample's seed.")
    min_rating: float | None = Field(
        None, description="Logged relevance: rating >= this (default: positive events)."
    )
    judge_logged: bool = Field(
        False,
        description="Also judge the logged top-k pairs (their logged labels stay in the qrels): "
        "evaluate --estimators dm,dr need the judge's probability for every listed pair.",
    )


def logged_qrels(feedback: Dataset, min_rating: float | None = None) -> Qrels:
    """Binary labels from logged held-out feedback: 1 relevant, 0 logged but not relevant.

    An item logged more than once for a user takes its latest event.
    """
    df = feedback.interactions.sort_values("timestamp", kind="stable")
    if min_rating is None:
        rel = df["event_type"].isin(POSITIVE_EVENTS)
    else:
        rel = df["rating"] >= min_rating
    out: Qrels = {}
    for u, i, r in zip(df["user_id"].astype(str), df["item_id"].astype(str), rel, strict=True):
        out.setdefault(u, {})[i] = int(bool(r))
    return out


def evaluation_users(
    runs: Sequence[RecRun], logged: Qrels, n: int | None = None, seed: int = 0
) -> list[str]:
    """Users in some run with a logged positive; a seeded sample of ``n`` of them if given."""
    in_runs = set().union(*(r.rankings for r in runs))
    eligible = [u for u in in_runs if any(logged.get(u, {}).values())]
    if not eligible:
        raise ValueError(
            "no user of the runs has a logged positive in the feedback; check that --feedback "
            "is the held-out part of the same data (or lower --min-rating)"
        )
    return sample_users(eligible, n or len(eligible), seed)


def pairs_to_impute(
    runs: Sequence[RecRun],
    logged: Qrels,
    users: Sequence[str],
    k: int,
    include_logged: bool = False,
) -> list[tuple[str, str]]:
    """(user, item) in some run's top-k with no logged label (with ``include_logged``, every
    one); each once, grouped by user."""
    out = []
    for u in users:
        seen: set[str] = set()
        for run in runs:
            for item in run.rankings.get(u, [])[:k]:
                if item not in seen and (include_logged or item not in logged.get(u, {})):
                    seen.add(item)
                    out.append((u, item))
    return out


@dataclass
class ImputationPlan:
    """What ``impute`` will judge: the evaluation users, the unlabelled top-k pairs, their
    requests (in pair order) and the pairs whose request cannot be built (with the error).

    Callers that judge with several judges (``bench brief-offline``) build the plan once and
    fill a store for all of them before each ``impute`` reads it back.
    """

    logged: Qrels
    users: list[str]
    pairs: list[tuple[str, str]]
    requests: list[Any]
    unbuildable: list[dict[str, str]]


def imputation_plan(
    data: Dataset, feedback: Dataset, runs: Sequence[RecRun], config: ImputeConfig
) -> ImputationPlan:
    """The users, pairs and requests ``impute`` judges for these runs (deterministic)."""
    from recjudge.reward import requests_for

    logged = logged_qrels(feedback, config.min_rating)
    users = evaluation_users(runs, logged, config.users, config.seed)
    pairs = pairs_to_impute(runs, logged, users, config.k, config.judge_logged)
    reqs, unbuildable = [], []
    for (u, i), r in zip(pairs, requests_for(data, pairs), strict=True):
        if isinstance(r, Exception):  # no history before the item, unknown id
            unbuildable.append({"user_id": u, "candidate_id": i, "error": str(r).strip("'\"")})
        else:
            reqs.append(r)
    return ImputationPlan(logged, users, pairs, reqs, unbuildable)


def impute(
    judge: Any,
    data: Dataset,
    feedback: Dataset,
    runs: Sequence[RecRun],
    config: ImputeConfig,
    out: str | Path,
    *,
    store: Any = None,
    progress: bool = False,
    plan: ImputationPlan | None = None,
    calibration: tuple[Sequence[float], Sequence[float]] | None = None,
) -> dict[str, Any]:
    """Judge every unlabelled top-k pair and write qrels and a sidecar to ``out``.

    Args:
        judge: a ``recjudge.reward.Judge``.
        data: what the recommenders were trained on; the judge sees each user's history here.
        feedback: the logged held-out feedback (the labels offline evaluation has).
        runs: the recommenders' runs (``read_run`` + ``restrict_to``).
        store: a ``ResultsStore``; finished pairs are reused, so a rerun resumes.
        plan: ``imputation_plan(data, feedback, runs, config)`` when the caller has built it
            already (several judges on the same runs); None builds it here.
        calibration: an isotonic map ``(x, y)`` from ``recjudge calibrate`` (``load_map``
            checks it was made for this judge): each pair also gets ``p_calibrated``.

    Writes:
        ``qrels_logged.{trec,json}``, ``qrels_imputed.{trec,json}`` (logged + imputed),
        ``imputed.jsonl`` (per judged pair: label, p_yes, sigma, delta, evidence and its
        item ids, or the error), ``summary.json``.

    Returns:
        The summary: users, pairs judged/failed/reused, YES rate, seconds per pair, per-run
        checks.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan or imputation_plan(data, feedback, runs, config)
    logged, users, pairs = plan.logged, plan.users, plan.pairs
    reqs, unbuildable = plan.requests, plan.unbuildable
    t0 = time.perf_counter()
    judged = judge.judge_many(reqs, store=store, progress=progress, errors="record")
    seconds = time.perf_counter() - t0
    labels = {(j.user_id, j.candidate_id): j for j in judged if j.error is None}
    base = {u: dict(logged.get(u, {})) for u in users}
    imputed = {u: dict(d) for u, d in base.items()}
    for (u, i), j in labels.items():
        if i not in base[u]:  # a logged label is never replaced by the judge's
            imputed[u][i] = int(j.is_relevant)
    write_qrels(base, out / "qrels_logged")
    write_qrels(imputed, out / "qrels_imputed")
    _write_sidecar(out / "imputed.jsonl", judged, unbuildable, calibration)
    run = judge.last_run
    summary = {
        "users": len(users),
        "pairs": len(pairs),
        "judged_now": run.judged if run else len(judged),
        "reused": run.reused if run else 0,
        "reused_from_checkpoint": run.imported if run else 0,
        "failed": len(judged) - len(labels) + len(unbuildable),
        "imputed_yes": sum(j.is_relevant for (u, i), j in labels.items() if i not in base[u]),
        "imputed_no": sum(not j.is_relevant for (u, i), j in labels.items() if i not in base[u]),
        "judged_logged": sum(1 for (u, i) in labels if i in base[u]),
        "logged_labels_in_topk": sum(
            1
            for u in users
            for r in runs
            for i in r.rankings.get(u, [])[: config.k]
            if i in logged.get(u, {})
        ),  # fmt: skip
        "seconds": round(seconds, 2),
        "seconds_per_judged_pair": round(seconds / run.judged, 3) if run and run.judged else None,
        "config": config.model_dump(),
        "judge": judge.config.model_dump(mode="json"),
        "calibrated": calibration is not None,
        "runs": {r.name: {"path": r.path, **r.check.to_dict()} for r in runs},
    }
    atomic_write_json(out / "summary.json", summary)
    return summary


def _write_sidecar(
    path: Path, judged: Sequence[Any], unbuildable: Sequence[Mapping], calibration=None
) -> None:
    import json

    from recjudge.evaluators._calibrate import apply_map

    lines = []
    for j in judged:
        if j.error is not None:
            rec: dict[str, Any] = {"user_id": j.user_id, "item_id": j.candidate_id,
                                   "error": j.error}  # fmt: skip
        else:
            rec = {
                "user_id": j.user_id,
                "item_id": j.candidate_id,
                "label": int(j.is_relevant),
                "p_yes": j.p_yes,
                "p_yes_semantic": j.p_yes_semantic,
                "sigma": j.sigma,
                "delta": j.delta,
                "evidence": j.evidence,
                "evidence_ids": j.evidence_ids,
            }
            if calibration is not None:
                rec["p_calibrated"] = float(apply_map(*calibration, j.p_yes))
        lines.append(json.dumps(rec, ensure_ascii=False))
    for u in unbuildable:
        lines.append(json.dumps({"user_id": u["user_id"], "item_id": u["candidate_id"],
                                 "error": u["error"]}, ensure_ascii=False))  # fmt: skip
    atomic_write_text(path, "".join(line + "\n" for line in lines))
