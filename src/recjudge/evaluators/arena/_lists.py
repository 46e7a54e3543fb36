"""List-level arena: every listed item judged pointwise by the BRIEF judge, lists compared by
their scores (our extension; not in the RecSys Arena paper).

Why: the pairwise judge sees two lists side by side, and a small one answers with the
position (at 1.5B, "A wins" in 1200 of 1200 comparisons, ``reports/arena-fm-1.5b-100-both``).
Here no list is ever shown next to another. Each (user, item) of the union of the systems'
top-k lists is one reward read-out on the reward core (``reward.Judge``, the user's
leave-one-out training history in the prompt), decided for every scorer from one decoding pass
(``reward.judge_per_user``):

- ``brief``: BRIEF (evidence-first, ``delta = beta * (1 + E_n) * sigma``) with sigma from a CF
  model that is none of the compared systems (``sigma_from``, default ItemKNN, trained on the
  same training split and calibrated on the validation items);
- ``llm-only``: the same prompt and grammar without the CF bias (BRIEF's no-behavior
  ablation, beta 0): the LLM alone;
- ``cf-only``: sigma alone, ``P = (1 + sigma) / 2`` (no LLM): what the sigma source says.

A list's score is its position-discounted mean P(YES) (``list_score``); per user, a system
wins, ties or loses against the reference by the difference of the two lists' scores against
a stated tie margin (``list_verdict``); Q per system is the arena's
``(N_win + N_tie) / (N_lose + N_tie)``, and the report asks whether Q and the mean list score
rank the systems as AUC on the held-out item does (Pearson, Spearman over systems).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from recjudge._stats import arm_interval, paired_difference, user_draws
from recjudge._util import atomic_write_text
from recjudge.cf_models import MODELS, SideInfo, calibrated_cf
from recjudge.evaluators._circular import circular_message
from recjudge.evaluators.arena._arena import arena_world, check_systems
from recjudge.evaluators.arena._metrics import (
    correlations,
    list_score,
    list_verdict,
    reference_q,
    reference_q_ci,
)
from recjudge.evaluators.arena._report import arena_lists_report, plot_list_scores
from recjudge.llm import LLMConfig, load_llm
from recjudge.reporting import write_report
from recjudge.reward import Judge, JudgeConfig, ResultsStore, judge_per_user, llm_made, requests_for

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

#: scorer -> the reward mode that gives its P(YES)
LIST_SCORERS: dict[str, str] = {"brief": "brief", "llm-only": "no-behavior", "cf-only": "cf-only"}


class ArenaListConfig(BaseModel):
    """List-level arena settings (our extension; every field is part of the run's config).

    Attributes:
        model: the judge LLM.
        systems: recommenders compared (CF model names, or ``name=path`` saved models or list
            files, as in ``ArenaConfig``).
        reference: the system every other is compared with (default: the first).
        users: users compared (sampled by sha256 of the id, as the pairwise arena samples).
        k: list length judged (the arena paper shows top 5).
        sigma_from: the CF model that gives BRIEF's sigma; must not be a compared system,
            so the judge's CF signal is not one of the contestants.
        beta: BRIEF's bias strength (the paper's best is 25).
        history_items: most recent training interactions shown to the judge.
        discount: position weights of ``list_score``: ``log2`` (1 / log2(rank + 1)) or
            ``none``.
        tie_margin: a user's lists tie when their scores differ by at most this much.
        bootstrap: user bootstrap resamples for every interval.
        seed: user sample, CF training and bootstrap seed.
        decode_rows: requests per engine call and rows per decode step (a user's candidates
            decoded together; never changes a verdict beyond rounding).
        dtype: the judge's compute dtype (``LLMConfig.dtype``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "qwen2.5-coder-0.5b"
    systems: tuple[str, ...] = ("pop", "als", "sasrec")
    reference: str | None = None
    users: int = Field(100, ge=1)
    k: int = Field(5, ge=1)
    sigma_from: str = "itemknn"
    beta: float = Field(25.0, ge=0)
    history_items: int = Field(50, ge=1)
    discount: Literal["log2", "none"] = "log2"
    tie_margin: float = Field(0.01, ge=0, lt=1)
    bootstrap: int = Field(1000, ge=0)
    seed: int = 0
    decode_rows: int = Field(20, ge=1)
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"

    # Every field is classified (tests/evaluators/test_store_keys.py). The store holds the
    # judges' judgments, keyed as any judgment: KEYED are what enters them (the model and
    # its dtype, BRIEF's beta, the history shown, the CF model that gives sigma and its
    # training seed). UNKEYED: which pairs are judged (systems, reference, users, k: an item
    # listed by two systems is one judgment), how lists are scored from the judgments
    # (discount, tie margin, bootstrap), speed (decode_rows).
    KEYED: ClassVar[frozenset[str]] = frozenset(
        {"model", "dtype", "beta", "history_items", "sigma_from", "seed"}
    )
    UNKEYED: ClassVar[frozenset[str]] = frozenset(
        {"systems", "reference", "users", "k", "discount", "tie_margin", "bootstrap",
         "decode_rows"}
    )  # fmt: skip

    @model_validator(mode="after")
    def _check(self) -> ArenaListConfig:
        names = self.system_names
        check_systems(names, self.reference)
        if self.sigma_from in names:
            others = [m for m in ("itemknn", "als", "bpr", "sasrec") if m not in names]

            raise ValueError(
                circular_message(
                    self.sigma_from,
                    "sigma_from names a compared system",
                    f"another CF model as sigma_from ({', '.join(others)})",
                )
            )
        MODELS.get(self.sigma_from)  # a "did you mean" KeyError for an unknown model
        return self

    @property
    def system_names(self) -> tuple[str, ...]:
        return tuple(s.partition("=")[0] for s in self.systems)

    @property
    def reference_name(self) -> str:
        return self.reference or self.system_names[0]


@dataclass(frozen=True)
class ListRun:
    """What a list-arena run judges, built without a model: the world (users, systems and
    their offline metrics), each system's top-k per user, the distinct (user, item) pairs,
    their requests on the train part (and the pairs that could not be built, with why) and
    BRIEF's CF model."""

    world: Any
    lists: dict[str, dict[str, list[str]]]
    pairs: list[tuple[str, str]]
    reqs: list[Any]
    unbuilt: list[dict[str, str]]
    cf: Any


def list_run(config: ArenaListConfig, data: str) -> ListRun:
    """The model-free part of ``run_arena_lists`` (see ``ListRun``). BRIEF's CF model is
    trained on the leave-one-out train part, as the compared systems are: trained on every
    interaction, its sigma would know each user's held-out item, which the offline metrics
    the list scores are compared with are computed on."""
    world = arena_world(data, config.systems, config.users, config.k, "genre", config.seed)
    ds, users = world.ds, world.users
    lists = {s: {u: r.lists[u][: config.k] for u in users} for s, r in world.systems.items()}
    pairs = list(dict.fromkeys((u, i) for u in users for s in lists for i in lists[s][u]))
    past = ds.with_interactions(world.split.train, note="leave-one-out train part")
    built = requests_for(past, pairs)
    reqs = [r for r in built if not isinstance(r, Exception)]
    unbuilt = [
        {"user_id": u, "item_id": i, "error": str(r)}
        for (u, i), r in zip(pairs, built, strict=True)
        if isinstance(r, Exception)
    ]
    items = ds.items["item_id"].astype(str).tolist()
    cf = calibrated_cf(config.sigma_from, world.split.train, items, config.seed,
                       SideInfo.of(ds))  # fmt: skip
    return ListRun(world, lists, pairs, reqs, unbuilt, cf)


def _judges(config: ArenaListConfig, llm: Any, cf: Any) -> dict[str, Any]:
    """A judge per scorer (``LIST_SCORERS``) on ``llm``, a loaded backend, or, where it is
    None, on ``LLMConfig(model, dtype)`` loaded at first use (their keys need no model)."""
    out = {}
    for name, mode in LIST_SCORERS.items():
        jc = JudgeConfig(
            model=config.model,
            mode=mode,
            beta=config.beta,
            need_evidence=False,  # the score is P(YES) at the decision: a read-out
            max_history=config.history_items,
            # a user's candidates share the prefix: decode them together (never changes a
            # verdict beyond rounding; neither field is part of a result key here)
            batch_size=config.decode_rows,
            decode_rows=config.decode_rows,
        )
        where = {"llm": llm} if llm is not None else {
            "llm_config": LLMConfig(model=config.model, dtype=config.dtype)}  # fmt: skip
        out[name] = Judge(jc, cf=cf if jc.uses_cf() else None, **where)
    return out


def list_scores(
    lists: dict[str, dict[str, list[str]]],
    p: dict[str, dict[tuple[str, str], float | None]],
    users: list[str],
    discount: str,
) -> dict[str, dict[str, dict[str, float | None]]]:
    """scorer -> system -> user -> ``list_score`` of the user's list under that scorer's
    per-item P(YES) ``p[scorer][(user, item)]`` (None where the item was not judged)."""
    return {
        scorer: {
            s: {u: list_score([pk.get((u, i)) for i in lists[s][u]], discount) for u in users}
            for s in lists
        }
        for scorer, pk in p.items()
    }


def list_records(
    scores: dict[str, dict[str, dict[str, float | None]]], reference: str, margin: float
) -> list[dict[str, Any]]:
    """One verdict record per (scorer, user, system other than ``reference``), in the
    arena's record shape (``aspect`` is the scorer; the system in A, the reference in B)."""
    out = []
    for scorer, per_system in scores.items():
        ref = per_system[reference]
        for s, per_user in per_system.items():
            if s == reference:
                continue
            for u, v in per_user.items():
                if v is None or ref[u] is None:
                    continue
                out.append({
                    "user_id": u, "system_a": s, "system_b": reference, "aspect": scorer,
                    "verdict": list_verdict(v, ref[u], margin), "score_a": v, "score_b": ref[u],
                })  # fmt: skip
    return out


def _summarize_scorer(
    per_system: dict[str, dict[str, float | None]],
    records: list[dict[str, Any]],
    scorer: str,
    config: ArenaListConfig,
    auc: dict[str, float],
) -> dict[str, Any]:
    """Mean list score per system and each system minus the reference (user bootstrap over
    the users every system has a score for), Q with its CI, and both against AUC."""
    ref = config.reference_name
    users = [u for u in per_system[ref] if all(v[u] is not None for v in per_system.values())]
    arrays = {s: [np.array([[v[u]] for u in users], dtype=float)] for s, v in per_system.items()}
    idx = user_draws(len(users), max(config.bootstrap, 1), config.seed)
    mean = {s: arm_interval(arrays, s, ["score"], idx)["score"] for s in arrays} if users else {}
    minus = {
        s: paired_difference(arrays, s, ref, ["score"], idx)["score"]
        for s in arrays
        if s != ref and users
    }
    q = reference_q(records, ref, scorer)
    q_ci = reference_q_ci(records, ref, config.bootstrap, config.seed, aspect=scorer)
    return {
        "users_scored": len(users),
        "mean_score": mean,
        "minus_reference": minus,
        "q": q,
        "q_ci": q_ci,
        "corr_q_auc": correlations({s: c["q"] for s, c in q.items()}, auc),
        "corr_score_auc": correlations({s: m["estimate"] for s, m in mean.items()}, auc),
    }


def _p_yes_by_scorer(got: Mapping[str, list[Any]], reqs: list[Any]) -> tuple[dict, dict]:
    """Per scorer, P(YES) by (user, item) (None for a failed judgment), and the failures'
    count per scorer."""
    p: dict[str, dict[tuple[str, str], float | None]] = {}
    failed = dict.fromkeys(got, 0)
    for name, js in got.items():
        p[name] = {}
        for r, j in zip(reqs, js, strict=True):
            ok = j is not None and j.error is None
            failed[name] += not ok
            p[name][(r.user_id, r.candidate_id)] = j.p_yes if ok else None
    return p, failed


def _write_scores(path: Path, scores: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> None:
    """``scores.jsonl``: one line per (user, system, scorer) list score, ids only; written
    to a temp name and renamed (a killed run leaves no half file under the name)."""
    atomic_write_text(path, "".join(
        json.dumps({"user_id": u, "system": s, "scorer": scorer, "score": v}) + "\n"
        for scorer, per_system in scores.items()
        for s, per_user in per_system.items()
        for u, v in per_user.items()
    ))  # fmt: skip


def run_arena_lists(
    config: ArenaListConfig,
    data: str = "ml-1m",
    out: str | Path = "reports/arena-lists",
    llm: LLMBackend | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Judge every listed item of ``config.users`` users, compare the lists per scorer, write
    ``scores.jsonl`` (per user, system and scorer: the list score; ids only),
    ``results.json``, ``report.md`` and ``scores.png`` under ``out``. Judgments are stored in
    ``out/store.sqlite`` (their decision records beside it); a rerun resumes, and one failed
    item is recorded and counted, its list scored over the items that were judged."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    run = list_run(config, data)
    world, users, lists, pairs, reqs, unbuilt = (
        run.world, run.world.users, run.lists, run.pairs, run.reqs, run.unbuilt
    )  # fmt: skip
    setup = time.perf_counter() - t0
    llm = llm or load_llm(LLMConfig(model=config.model, dtype=config.dtype))
    judges = _judges(config, llm, run.cf)
    t1 = time.perf_counter()
    with ResultsStore(out / "store.sqlite") as store:
        got, counts, passes, replayed = judge_per_user(
            reqs, judges, store, progress, errors="record"
        )
    judging = time.perf_counter() - t1
    p, failed = _p_yes_by_scorer(got, reqs)
    scores = list_scores(lists, p, users, config.discount)
    records = list_records(scores, config.reference_name, config.tie_margin)
    _write_scores(out / "scores.jsonl", scores)
    auc = {s: m["auc"] for s, m in world.offline.items() if m["auc"] is not None}
    summary = {
        scorer: _summarize_scorer(scores[scorer], records, scorer, config, auc)
        for scorer in LIST_SCORERS
    }
    made = llm_made(judges, counts)
    cost = {
        "pairs": len(pairs),
        "unbuilt": len(unbuilt),
        "failed": failed,
        "llm_requests": made["requests"],
        "judged_now": made["judged_now"],
        "decoding_passes": passes,
        "replayed": replayed,
        "setup_seconds": round(setup, 1),
        "judging_seconds": round(judging, 1),
        "passes_per_second": round(passes / judging, 3) if passes and judging > 0 else None,
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    results = {
        "config": config.model_dump(),
        "data": data,
        "users": users,
        "reference": config.reference_name,
        "offline": world.offline,
        "summary": summary,
        "unbuilt": unbuilt[:20],
        "cost": cost,
    }
    plot_list_scores(results, out / "scores.png")
    write_report(out, results, arena_lists_report(config, data, results))
    return results
