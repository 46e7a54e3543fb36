"""GISTBench's verification predicate and scores: pure functions of per-interest records
(``gist score``): IG precision / recall / F1 per user, medians, user-bootstrap intervals and
paired differences between models."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from recjudge._stats import bootstrap_ci, user_draws
from recjudge._util import json_loads

if TYPE_CHECKING:
    pass

SIGNALS = ("imp+", "exp+", "imp-", "exp-")
EVENT_SIGNAL = {
    "implicit_positive": "imp+",
    "explicit_positive": "exp+",
    "implicit_negative": "imp-",
    "explicit_negative": "exp-",
}


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
        """(verified, failure modes) for signal counts of the surviving objects.

        Failure modes are not exclusive and, as GISTBench Table 7 counts them, each is named
        by its own condition on every unverified interest: ``no_evidence`` (no cited object
        survived the judge's filter), ``insufficient_imp+`` (fewer than ``imp_pos`` implicit
        positives), ``insufficient_exp+`` (fewer than ``exp_pos`` explicit positives),
        ``excess_imp-`` and ``excess_exp-`` (more negatives than allowed). A verified
        interest has none.
        """
        c = {s: int(counts.get(s, 0)) for s in SIGNALS}
        positive = (
            c["imp+"] >= self.imp_pos
            or c["exp+"] >= self.exp_pos
            or (c["exp+"] >= self.mixed_exp and c["imp+"] >= self.mixed_imp)
        )
        excess = c["imp-"] > self.max_imp_neg or c["exp-"] > self.max_exp_neg
        if positive and not excess:
            return True, []
        reasons = []
        if sum(c.values()) == 0:
            reasons.append("no_evidence")
        if c["imp+"] < self.imp_pos:
            reasons.append("insufficient_imp+")
        if c["exp+"] < self.exp_pos:
            reasons.append("insufficient_exp+")
        if c["imp-"] > self.max_imp_neg:
            reasons.append("excess_imp-")
        if c["exp-"] > self.max_exp_neg:
            reasons.append("excess_exp-")
        return False, reasons


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
    models: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Per model: medians over users of ig_p, ig_r, ig_f1, is, plus per-user values and
    failure-mode percentages.

    Args:
        records: per-interest records with ``user_id, model, interest, category_id,
            verified, correct, backing`` (and optionally ``reasons``).
        oracle: ``{user_id: [category_ids]}``; default: the union over ``records``.
        users: users every model is scored on (a model with no interest for a user scores
            0 there); default: every user in ``records``.
        models: models under test scored even without any interest (0 everywhere, so a
            model that wrote nothing stays in the table); the models in ``records`` always are.
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
    models = sorted({str(r["model"]) for r in records} | {str(m) for m in models or ()})
    out: dict[str, Any] = {}
    for m in models:
        mine = [r for r in records if str(r["model"]) == m]
        per_user = {}
        for u in users:
            rs = [r for r in mine if str(r["user_id"]) == u]
            per_user[u] = user_scores(rs, oracle_sets.get(u, set()))
        # Failure modes over unverified interests; one interest may show several.
        unverified = [r for r in mine if not r["verified"]]
        reasons: dict[str, int] = {}
        for r in unverified:
            for why in dict.fromkeys(r.get("reasons") or []):
                reasons[why] = reasons.get(why, 0) + 1
        n = len(mine)
        out[m] = {
            **{
                k: _median([v[k] for v in per_user.values()])
                for k in ("ig_p", "ig_r", "ig_f1", "is")
            },
            "interests": n,
            "verified_pct": 100 * sum(bool(r["verified"]) for r in mine) / n if n else 0.0,
            "echoes_example": sum(bool(r.get("echoes_example")) for r in mine),
            "echoes_verified": sum(bool(r.get("echoes_example") and r["verified"]) for r in mine),
            "signal_names": sum(bool(r.get("names_signal")) for r in mine),
            "signal_names_verified": sum(
                bool(r.get("names_signal") and r["verified"]) for r in mine
            ),
            "unverified": len(unverified),
            "failure_pct": {k: 100 * v / len(unverified) for k, v in sorted(reasons.items())},
            "users": per_user,
        }
    return out


GIST_METRICS = ("ig_p", "ig_r", "ig_f1", "is")


def gist_intervals(
    scores: Mapping[str, Any], draws: int = 1000, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """95 % percentile intervals over users for ``gist_scores``' medians, and each model's
    precision minus recall.

    Users are resampled with replacement (the same draws for every model and metric, so the
    models' intervals are comparable); each draw takes the median over the drawn users, as
    the table does. ``p_minus_r`` is the mean over users of IG_P(u) - IG_R(u) with its
    bootstrap interval: the paper's finding that coverage (recall), not hallucination
    (precision), is the bottleneck predicts it above 0.

    Args:
        scores: ``gist_scores`` output (its per-user values under ``"users"``).
        draws: bootstrap resamples (0: no intervals).
        seed: resampling seed.

    Returns:
        ``{model: {metric: {"lo", "hi"}, "p_minus_r": {"estimate", "lo", "hi"}}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    per_user = _per_user_values(scores)
    if not per_user or draws <= 0:
        return out
    idx = user_draws(len(next(iter(per_user.values()))), draws, seed)
    for m, vals in per_user.items():
        med = np.median(vals[idx], axis=1)  # [draws, metrics]
        lo, hi = bootstrap_ci(med)
        d = vals[:, 0] - vals[:, 1]
        dl, dh = bootstrap_ci(d[idx].mean(axis=1))
        out[m] = {
            **{k: {"lo": float(lo[j]), "hi": float(hi[j])} for j, k in enumerate(GIST_METRICS)},
            "p_minus_r": {"estimate": float(d.mean()), "lo": float(dl), "hi": float(dh)},
        }
    return out


def _per_user_values(scores: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``{model: [users, GIST_METRICS]}`` in the first model's user order ({} if no users).

    Raises:
        ValueError: a model is scored on other users than the first (nothing to pair).
    """
    if not scores:
        return {}
    users = list(next(iter(scores.values()))["users"])
    if not users:
        return {}
    out = {}
    for m, s in scores.items():
        if list(s["users"]) != users:
            raise ValueError(f"model {m!r} is scored on other users than the first model")
        out[m] = np.array([[s["users"][u][k] for k in GIST_METRICS] for u in users], dtype=float)
    return out


def gist_differences(
    scores: Mapping[str, Any], draws: int = 1000, seed: int = 0
) -> dict[str, dict[str, dict[str, float]]]:
    """Each pair of models' difference of medians over users, with a paired 95 % interval.

    ``A minus B`` on metric k is median_u k_A(u) - median_u k_B(u), the gap a reader of the
    table sees (GISTBench ranks models by these medians). The interval resamples users with
    replacement, the same draws for both models (they answered for the same users), so it
    tests whether the ranking holds beyond the users sampled; an interval containing 0 means
    the two models are not separated at this size.

    Args:
        scores: ``gist_scores`` output (its per-user values under ``"users"``).
        draws: bootstrap resamples (0: no differences).
        seed: resampling seed (``gist_intervals`` with the same seed draws the same users).

    Returns:
        ``{"A minus B": {metric: {"estimate", "lo", "hi"}}}`` for every pair in ``scores``'
        order (A before B).
    """
    per_user = _per_user_values(scores)
    if not per_user or draws <= 0:
        return {}
    idx = user_draws(len(next(iter(per_user.values()))), draws, seed)
    models = list(per_user)
    out = {}
    for i, a in enumerate(models):
        for b in models[i + 1 :]:
            point = np.median(per_user[a], axis=0) - np.median(per_user[b], axis=0)
            boot = np.median(per_user[a][idx], axis=1) - np.median(per_user[b][idx], axis=1)
            lo, hi = bootstrap_ci(boot)
            out[f"{a} minus {b}"] = {
                k: {"estimate": float(point[j]), "lo": float(lo[j]), "hi": float(hi[j])}
                for j, k in enumerate(GIST_METRICS)
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
                out.append(json_loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {i}: not JSON ({e}); one record per line") from None
    return out


def read_oracle(path: str | Path) -> dict[str, list[Any]]:
    """``{"oracle": {user_id: [category_ids]}}`` from a JSON file."""
    try:
        obj = json_loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("oracle"), dict):
        raise ValueError(f'{path}: expected {{"oracle": {{user_id: [category_ids]}}}}')
    return {str(u): list(c) for u, c in obj["oracle"].items()}


# -- specificity sampling ------------------------------------------------------------------
