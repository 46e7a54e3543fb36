"""Impute missing feedback for offline evaluation (BRIEF, Tables 2-3, on the user's own data).

An offline evaluation only knows the feedback its log holds. Items a recommender ranks in its
top-k that the user never saw have no label and count as irrelevant, which favours whatever
policy produced the log. ``impute`` labels exactly those (user, item) pairs with the judge:
each pair once even when several runs rank it, grouped by user so the history prefix is
encoded once, in a crash-safe store. Qrels = logged labels + imputed labels.

Evaluation users (``user_rule``): by default every user some run lists (``listed``),
optionally a seeded sample of them, chosen without looking at the logged labels. The common
offline rule, users with a logged positive (``logged-positive``), selects users on the very
observations the inverse-propensity weights correct for, so IPS, SNIPS and DR run high under it
even with the true propensities (+36 % to +60 % on a sparse simulated log; a test holds it):
it stays as an option for comparison with other tools. Logged-only and imputed metrics are
computed on this same set.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from recjudge._util import UserFacingError, atomic_write_json, atomic_write_text, json_loads
from recjudge.cf_models import CFModel, top_k_lists
from recjudge.data import POSITIVE_EVENTS, DataError, Dataset, sample_users
from recjudge.evaluators._circular import circular_systems, list_overlap, refuse_circular
from recjudge.evaluators.offline._calibrate import apply_map
from recjudge.evaluators.offline._runs import Qrels, RecRun, write_qrels
from recjudge.reward import MODE_SPECS, PROMPT_VERSION, requests_for


class ImputeConfig(BaseModel):
    """What ``impute`` does with the runs (the judge has its own ``JudgeConfig``).

    Attributes:
        k: judge the top-k of every ranking.
        users: evaluate a seeded sample of this many users (None: all eligible users).
        seed: the user sample's seed.
        min_rating: logged relevance is ``rating >= min_rating``; None: a positive event
            (``explicit_positive`` / ``implicit_positive``).
        judge_logged: also judge the top-k pairs the log labels (their logged label stays in
            the qrels): the direct-method and doubly robust estimators of ``evaluate``
            need the judge's probability for every listed pair (the default; it costs one
            judgment per logged listed pair, ``summary.json``'s ``judged_logged``).
        user_rule: ``listed`` (every user some run lists) or ``logged-positive`` (only users
            with a logged positive: biases IPS/SNIPS/DR; see the module docstring).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(20, ge=1, description="Judge each ranking's top-k.")
    users: int | None = Field(None, ge=1, description="A seeded sample of users.")
    seed: int = Field(0, description="The user sample's seed.")
    min_rating: float | None = Field(
        None, description="Logged relevance: rating >= this (default: positive events)."
    )
    judge_logged: bool = Field(
        True,
        description="Also judge the logged top-k pairs (their logged labels stay in the qrels): "
        "evaluate's dm and dr need the judge's probability for every listed pair "
        "(--no-judge-logged: fewer judgments, IPS/SNIPS only).",
    )
    user_rule: Literal["listed", "logged-positive"] = Field(
        "listed",
        description="Evaluation users: listed (every user a run lists, chosen without looking "
        "at labels) or logged-positive (users with a logged positive: biases IPS/SNIPS/DR).",
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
    runs: Sequence[RecRun],
    logged: Qrels,
    n: int | None = None,
    seed: int = 0,
    rule: str = "listed",
) -> list[str]:
    """The evaluation users under ``rule`` (the module docstring), a seeded sample of ``n``
    of them if given. ``listed`` never reads the labels, so the sample is independent of
    what the log observed."""
    in_runs = set().union(*(r.rankings for r in runs))
    if rule == "listed":
        eligible = list(in_runs)
    elif rule == "logged-positive":
        eligible = [u for u in in_runs if any(logged.get(u, {}).values())]
    else:
        raise ValueError(f"unknown user rule {rule!r}; use listed or logged-positive")
    # Whatever the rule, a log with no positive for any listed user measures nothing (every
    # metric 0): that is a wrong input, not an evaluation.
    if not any(any(logged.get(u, {}).values()) for u in eligible):
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
    logged = logged_qrels(feedback, config.min_rating)
    users = evaluation_users(runs, logged, config.users, config.seed, config.user_rule)
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
    sigma_source: Mapping[str, Any] | None = None,
    allow_circular: bool = False,
    circular: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Judge every unlabelled top-k pair and write qrels and a sidecar to ``out``.

    Args:
        judge: a ``recjudge.reward.Judge``.
        data: what the recommenders were trained on; the judge sees each user's history here.
        feedback: the logged held-out feedback (the labels offline evaluation has).
        runs: the recommenders' runs (``read_run`` + ``restrict_to``).
        store: a ``ResultsStore``; finished pairs are reused, so a rerun resumes.
        plan: ``imputation_plan(data, feedback, runs, config)`` if built already, else None.
        calibration: ``recjudge calibrate``'s map (``load_map``): adds ``p_calibrated``.
        sigma_source: the judge's CF source (``_circular.sigma_source``), held against the
            runs' provenance; its own top-k against the runs' lists (``list_overlap``).
        allow_circular: go on when a run is the judge's own CF signal (named in the summary).
        circular: ``circular_check``'s result when the caller ran it already.

    Raises:
        CircularJudgeError: a run is the judge's CF signal (``_circular``), without
            ``allow_circular``; nothing is judged.
        JobFailedError: every pair failed (the most common error named); no qrels written.

    Writes:
        ``qrels_logged.{trec,json}``, ``qrels_imputed.{trec,json}`` (logged + imputed),
        ``imputed.jsonl`` (per judged pair: label, p_yes, sigma, delta, evidence and its
        item ids, the history's length, or the error), ``summary.json``, and the judge's CF
        model's own top-k lists (``JUDGE_CF_LISTS``, for evaluate's circular guard).

    Returns:
        The summary: users, pairs judged/failed/reused, YES rate, seconds per pair, per-run
        checks.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan or imputation_plan(data, feedback, runs, config)
    logged, users = plan.logged, plan.users
    reqs, unbuildable = plan.requests, plan.unbuildable
    if circular is None:
        circular = circular_check(judge, data, runs, users, config.k, sigma_source,
                                  allow_circular)  # fmt: skip
    circular, circular_lists = _without_lists(circular)
    t0 = time.perf_counter()
    judged = judge.judge_many(reqs, store=store, progress=progress, errors="record")
    seconds = time.perf_counter() - t0
    require_some_judged(judged, [u["error"] for u in unbuildable], "pair")
    labels = {(j.user_id, j.candidate_id): j for j in judged if j.error is None}
    base = {u: dict(logged.get(u, {})) for u in users}
    _write_labels(out, data, base, labels)
    history = {(r.user_id, r.candidate_id): len(r.history) for r in reqs}
    _write_sidecar(out / "imputed.jsonl", judged, unbuildable, calibration, history)
    summary = {
        **_counts(judge, plan, runs, config, judged, labels, base),
        "seconds": round(seconds, 2),
        "seconds_per_judged_pair": (round(seconds / judge.last_run.judged, 3)
                                    if judge.last_run and judge.last_run.judged else None),
        "config": config.model_dump(),
        "judge": judge_record(judge.config),
        "prompt_version": _prompt_version(),
        "calibrated": calibration is not None,
        "sigma_source": dict(sigma_source) if sigma_source else None,
        **circular,
        "runs": {r.name: {"path": r.path, **r.check.to_dict()} for r in runs},
    }  # fmt: skip
    _write_cf_lists(out, circular_lists)
    atomic_write_json(out / "summary.json", summary)
    return summary


def _without_lists(circular: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """``circular_check``'s summary fields, and the CF model's lists it carries apart."""
    return {n: v for n, v in circular.items() if n != JUDGE_CF_LISTS}, circular.get(
        JUDGE_CF_LISTS)  # fmt: skip


def _write_cf_lists(out: Path, own: Mapping[str, Sequence[str]] | None) -> None:
    """The judge's CF model's own top-k lists beside the qrels (``JUDGE_CF_LISTS``)."""
    if own is not None:
        atomic_write_json(out / JUDGE_CF_LISTS, {u: list(v) for u, v in own.items()})


def _write_labels(out: Path, data: Dataset, base: dict, labels: dict) -> None:
    """The logged qrels, the logged + imputed qrels, and the training data's item counts."""
    imputed = {u: dict(d) for u, d in base.items()}
    for (u, i), j in labels.items():
        if i not in base[u]:  # a logged label is never replaced by the judge's
            imputed[u][i] = int(j.is_relevant)
    write_qrels(base, out / "qrels_logged")
    write_qrels(imputed, out / "qrels_imputed")
    # the training log's item counts: `evaluate --propensities fit` regresses the held-out
    # observations on them (the held-out labels themselves are not looked at)
    pop = data.interactions["item_id"].astype(str).value_counts()
    atomic_write_json(out / ITEM_POPULARITY, {str(i): int(n) for i, n in pop.items()})


def _counts(judge, plan, runs, config, judged, labels, base) -> dict[str, Any]:
    """``impute``'s summary counts: users, pairs, what was judged now, reused or failed, and
    the imputed labels by verdict (a logged label is never replaced)."""
    run = judge.last_run
    new = [j for (u, i), j in labels.items() if i not in base[u]]
    return {
        "users": len(plan.users),
        "pairs": len(plan.pairs),
        "judged_now": run.judged if run else len(judged),
        "reused": run.reused if run else 0,
        "workers": dict(run.workers) if run else {},  # pairs per Ray actor (--ray)
        "reused_from_checkpoint": run.imported if run else 0,
        "failed": len(judged) - len(labels) + len(plan.unbuildable),
        "imputed_yes": sum(j.is_relevant for j in new),
        "imputed_no": sum(not j.is_relevant for j in new),
        "judged_logged": sum(1 for (u, i) in labels if i in base[u]),
        "logged_labels_in_topk": sum(
            1
            for u in plan.users
            for r in runs
            for i in r.rankings.get(u, [])[: config.k]
            if i in plan.logged.get(u, {})
        ),
    }


#: the file in an impute folder with the training data's item counts (``read_item_popularity``)
ITEM_POPULARITY = "item_popularity.json"
#: the judge's CF model's own top-k lists of the evaluation users (item ids), beside the qrels
JUDGE_CF_LISTS = "judge_cf_topk.json"


def read_item_popularity(path: str | Path) -> dict[str, int] | None:
    """``impute``'s record of the training data's item counts (``ITEM_POPULARITY``; None: an
    older impute folder without it), read by ``evaluate --propensities fit`` and ``audit``.

    Raises:
        DataError: a file that is not ``{item_id: count}`` with non-negative integer counts.
    """
    path = Path(path)
    if not path.is_file():
        return None
    fix = "delete it and rerun `recjudge impute --resume` into this folder (it writes it again)"
    try:
        got = json_loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DataError("not impute's item counts (JSON).", source=str(path), fix=fix) from None
    if not isinstance(got, dict):
        raise DataError("not an {item_id: count} object.", source=str(path), fix=fix)
    for item, n in got.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise DataError(f"item {item!r} has count {n!r}, not a non-negative integer.",
                            source=str(path), field=str(item), fix=fix)  # fmt: skip
    return got


class JobFailedError(UserFacingError, RuntimeError):
    """A run in which every item failed: nothing to report, so the job ends non-zero."""


def require_some_judged(judged: Sequence[Any], unbuilt: Sequence[str], what: str) -> None:
    """End a run in which nothing was judged: every judgment of ``judged`` failed and every
    request of ``unbuilt`` (their errors) could not be built, and there was at least one.
    The line names the most common error once, with its count (``impute``, ``augment``).

    Raises:
        JobFailedError: nothing judged; an output from this run would look finished.
    """
    errors = [j.error for j in judged] + list(unbuilt)
    if not errors or any(j.error is None for j in judged):
        return
    counts = Counter(str(e) for e in errors if e)
    top, n = counts.most_common(1)[0] if counts else ("unknown error", len(errors))
    raise JobFailedError(
        f"every one of the {len(errors)} {what}s failed, nothing was judged (no output "
        f"written); the most common error ({n} of {len(errors)}): {top}"
    )


def circular_check(
    judge: Any,
    data: Dataset,
    runs: Sequence[RecRun],
    users: Sequence[str],
    k: int,
    source: Mapping[str, Any] | None,
    allow: bool,
) -> dict[str, Any]:
    """``_circular``'s rule for this judge and these runs: the summary's fields
    (``circular``, ``allow_circular``, ``overlap_with_judge_cf``), or the refusal
    (``CircularJudgeError``)."""
    overlap, own = None, None
    if judge.config.uses_cf() and isinstance(judge.cf, CFModel):
        # the evaluation users are users the runs list, so these are the lists compared
        own = top_k_lists(judge.cf, data, k, users)
        overlap = list_overlap(runs, own, users, k)
    found = circular_systems(source, runs, overlap)
    refuse_circular(found, allow)
    return {
        "circular": found,
        "allow_circular": bool(allow and found),
        "overlap_with_judge_cf": overlap,
        # not for the summary: impute writes it beside the qrels (JUDGE_CF_LISTS), so that
        # evaluate compares any run's lists with the judge's CF model, whatever it is called
        JUDGE_CF_LISTS: own,
    }


def _write_sidecar(
    path: Path,
    judged: Sequence[Any],
    unbuildable: Sequence[Mapping],
    calibration=None,
    history: Mapping[tuple[str, str], int] | None = None,
) -> None:
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
            if history and (j.user_id, j.candidate_id) in history:
                # the history's length: a feature of the supervised imputer (evaluate)
                rec["history_len"] = history[(j.user_id, j.candidate_id)]
            if calibration is not None:
                rec["p_calibrated"] = float(apply_map(*calibration, j.p_yes))
        lines.append(json.dumps(rec, ensure_ascii=False))
    for u in unbuildable:
        lines.append(json.dumps({"user_id": u["user_id"], "item_id": u["candidate_id"],
                                 "error": u["error"]}, ensure_ascii=False))  # fmt: skip
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def _prompt_version() -> str:
    """The judge prompts' version, part of every result key (the report names it)."""
    return PROMPT_VERSION


def judge_record(config: Any) -> dict[str, Any]:
    """The judge's config as the summary (and every report header built on it) records it;
    a mode without an LLM (``cf-only``) records ``model: None`` and ``llm: "none"``, so no
    header names a model that was never run."""
    rec = config.model_dump(mode="json")
    if not MODE_SPECS.get(rec["mode"]).uses_llm:
        rec.update(model=None, llm="none (the CF signal alone decides)")
    return rec
