"""RecSys Arena aggregates: pure functions on per-comparison records.

A record is ``{user_id, system_a, system_b, aspect, verdict}`` with the verdict ("A wins",
"B wins" or "Tie") from the side of the system shown in position A, so ``arena summarize``
works on records alone (after "RecSys Arena: Pair-wise Recommender System Evaluation with
Large Language Models", Wu et al., 2024).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from recjudge._metrics import ndcg
from recjudge._registry import suggest
from recjudge._stats import bootstrap_ci
from recjudge._util import rng

ASPECTS = ("accuracy", "satisfaction", "inspiration", "content_quality", "transparency", "impact")
OPTIONS = ("A wins", "B wins", "Tie")
SWAP_RULES = ("tie", "keep")


# -- the order swap ------------------------------------------------------------------------
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


def order_flip_rate(records: Sequence[dict[str, Any]], aspect: str = "overall") -> float | None:
    """Share of (user, A, B) pairs judged in both orders whose ``aspect`` verdict changes
    with the order (position bias); one vote per pair. Works on combined records that carry
    ``order_flip`` (``pair_records``, overall only) and on per-order records (each order its
    own record, paired here). ``None`` when no pair was judged in both orders."""
    overall = [r for r in records if r["aspect"] == aspect]
    if aspect == "overall" and any("order_flip" in r for r in overall):
        pairs = {(r["user_id"], r["system_a"], r["system_b"]): bool(r.get("order_flip"))
                 for r in overall}  # fmt: skip
        return sum(pairs.values()) / len(pairs) if pairs else None
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    flips = []
    for r in overall:
        key = (r["user_id"], *sorted((r["system_a"], r["system_b"])))
        if key not in seen:
            seen[key] = r
        elif r["system_a"] != seen[key]["system_a"]:  # the swapped order
            flips.append(flip(r["verdict"]) != seen[key]["verdict"])
    return sum(flips) / len(flips) if flips else None


def order_flip_by_system(
    records: Sequence[dict[str, Any]], reference: str
) -> dict[str, float | None]:
    """``order_flip_rate`` of each system's pairs with ``reference`` (per-order or combined
    records; other pairs are ignored), so a judge that reads one system's list rather than
    the position shows up as that system's lower rate. ``None`` for a system with no pair in
    both orders."""
    overall = [r for r in records if r["aspect"] == "overall"]
    others = {r["system_b"] if r["system_a"] == reference else r["system_a"] for r in overall}
    return {
        s: order_flip_rate([r for r in overall if {r["system_a"], r["system_b"]} == {reference, s}])
        for s in sorted(others - {reference})
    }


def _p_overall(r: dict[str, Any], i: int) -> dict[str, float]:
    """Record ``i``'s overall verdict probabilities by option: a dict, or (verdict files
    written before 2026-11-27) a list in ``OPTIONS`` order, the order the judge's branches
    had. Anything else is a ValueError naming the record."""
    p = r["p_overall"]
    values = p.values() if isinstance(p, dict) else p if isinstance(p, list) else [None]
    numbers = all(isinstance(v, float | int) and not isinstance(v, bool) for v in values)
    if not (numbers and (isinstance(p, dict) or len(p) == len(OPTIONS))):
        raise ValueError(
            f"record {i}: p_overall must map each verdict to its probability "
            f'(e.g. {{"A wins": 0.9, "B wins": 0.05, "Tie": 0.05}}), got {p!r}'
        )
    if isinstance(p, dict):
        return {str(k): float(v) for k, v in p.items()}
    return dict(zip(OPTIONS, map(float, p), strict=True))


def order_averaged_preference(
    records: Sequence[dict[str, Any]], reference: str
) -> dict[str, float | None]:
    """Each system's probability of beating ``reference`` with the position averaged out.

    For a user and a system judged in both orders, from the judge's overall probabilities:
    ``s = 1/2 [(P(B wins) + P(Tie)/2 | reference in A) + (P(A wins) + P(Tie)/2 | system in A)]``,
    averaged over users; 0.5 means no preference. Swapping the positions and averaging is
    the usual control for an LLM judge's position bias (Zheng et al. 2023, "Judging
    LLM-as-a-judge"); here it is applied to probabilities, so a judge whose verdicts only
    follow the position can still order the systems. Records need ``p_overall``; a pair
    judged in one order only is skipped (``None`` for a system without a complete pair).
    """
    sides: dict[tuple[str, str], dict[str, float]] = {}
    for i, r in enumerate(records, 1):
        a, b = r["system_a"], r["system_b"]
        if r["aspect"] != "overall" or r.get("p_overall") is None or reference not in (a, b):
            continue
        p = _p_overall(r, i)
        tie = p.get("Tie", 0.0) / 2
        if a == reference:
            sides.setdefault((str(r["user_id"]), b), {})["B"] = p.get("B wins", 0.0) + tie
        else:
            sides.setdefault((str(r["user_id"]), a), {})["A"] = p.get("A wins", 0.0) + tie
    per: dict[str, list[float]] = {}
    for (_, system), d in sides.items():
        per.setdefault(system, [])
        if len(d) == 2:
            per[system].append((d["A"] + d["B"]) / 2)
    return {s: float(np.mean(v)) if v else None for s, v in sorted(per.items())}


def position_shares(records: Sequence[dict[str, Any]], aspect: str = "overall") -> dict[str, float]:
    """Share of ``aspect`` verdicts that are "A wins", "B wins" and "Tie" over the judged
    orders (per-order records, verdicts from position A's side): with both orders judged, a
    share far from one half for "A wins" against "B wins" is position bias, whichever
    systems sit there. Empty without such records."""
    overall = [r["verdict"] for r in records if r["aspect"] == aspect]
    return {o: overall.count(o) / len(overall) for o in OPTIONS} if overall else {}


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


def reference_q(
    records: Sequence[dict[str, Any]], reference: str, aspect: str = "overall"
) -> dict[str, dict[str, float]]:
    """Each system against ``reference`` (RecSys Arena Table 2): win/tie/lose counts from the
    system's side, and Q = (N_win + N_tie) / (N_lose + N_tie). Records between two
    non-reference systems are ignored; a record may show the reference in either position."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        if r["aspect"] != aspect or reference not in (r["system_a"], r["system_b"]):
            continue
        if r["system_a"] == reference:
            other, v = r["system_b"], flip(r["verdict"])  # seen from the other system
        else:
            other, v = r["system_a"], r["verdict"]
        c = out.setdefault(other, {"win": 0, "tie": 0, "lose": 0})
        c[{"A wins": "win", "B wins": "lose", "Tie": "tie"}[v]] += 1
    for c in out.values():
        c["n"] = c["win"] + c["tie"] + c["lose"]
        c["q"] = q_score(c["win"], c["tie"], c["lose"])
    return dict(sorted(out.items()))


def swap_rule_records(records: Sequence[dict[str, Any]], rule: str) -> list[dict[str, Any]]:
    """Per-order records (each judged order its own record, verdict from its own A's side)
    combined under a swap rule: ``keep`` returns them as they are; ``tie`` keeps one record
    per (user, pair, aspect) in the first-seen order, a tie where the two orders disagree
    (position bias). A pair judged in one order only is kept as it is."""
    if rule not in SWAP_RULES:
        raise ValueError(f"unknown swap rule {rule!r}; use one of {SWAP_RULES}")
    if rule == "keep":
        return list(records)
    first: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    second: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for r in records:
        a, b = r["system_a"], r["system_b"]
        key = (r["user_id"], *sorted((a, b)), r["aspect"])
        (second if key in first else first)[key] = r
    out = []
    for key, r in first.items():
        back = second.get(key)
        if back is None:
            out.append(dict(r))
            continue
        v = combine_orders(r["verdict"], back["verdict"], "tie")[0]
        out.append({**r, "verdict": v})
    return out


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
    return {s: bootstrap_ci(v) for s, v in draws.items()}


def user_bootstrap(
    records: Sequence[dict[str, Any]],
    stat: Callable[[list[dict[str, Any]]], dict[str, float | None]],
    n: int = 1000,
    seed: int = 0,
) -> dict[str, tuple[float, float] | None]:
    """95 % percentile intervals of ``stat`` (name -> value) over users resampled with
    replacement: a user's comparisons (every system, order and aspect) stay together, since
    one judge reads one user's profile for all of them. A drawn user's copies are relabelled
    so that statistics pairing records by user (the order-flip rate) keep them apart.
    Undefined draws (nan, or Q without a lose or tie) are dropped; a name defined in fewer
    than half the draws gets ``None``."""
    by_user: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_user.setdefault(str(r["user_id"]), []).append(r)
    users = sorted(by_user)
    if not users or n == 0:
        return {}
    g = rng("arena-user-bootstrap", seed)
    draws: dict[str, list[float]] = {}
    for _ in range(n):
        sample = [
            {**r, "user_id": f"{users[i]}#{j}"}
            for j, i in enumerate(g.integers(0, len(users), len(users)))
            for r in by_user[users[i]]
        ]
        for name, v in stat(sample).items():
            draws.setdefault(name, [])
            if v is not None and np.isfinite(v):
                draws[name].append(float(v))
    return {name: bootstrap_ci(v) if len(v) >= n / 2 else None for name, v in draws.items()}


def reference_q_ci(
    records: Sequence[dict[str, Any]],
    reference: str,
    n: int = 1000,
    seed: int = 0,
    aspect: str = "overall",
) -> dict[str, tuple[float, float] | None]:
    """User-bootstrap 95 % CIs of each system's Q against ``reference`` on ``aspect``."""

    def stat(recs: list[dict[str, Any]]) -> dict[str, float | None]:
        return {s: c["q"] for s, c in reference_q(recs, reference, aspect).items()}

    return user_bootstrap([r for r in records if r["aspect"] == aspect], stat, n, seed)


def order_flip_ci(
    records: Sequence[dict[str, Any]], n: int = 1000, seed: int = 0
) -> tuple[float, float] | None:
    """User-bootstrap 95 % CI of ``order_flip_rate`` (None when no pair has both orders)."""
    overall = [r for r in records if r["aspect"] == "overall"]
    return user_bootstrap(overall, lambda r: {"flip": order_flip_rate(r)}, n, seed).get("flip")


def order_flip_by_system_ci(
    records: Sequence[dict[str, Any]], reference: str, n: int = 1000, seed: int = 0
) -> dict[str, tuple[float, float] | None]:
    """User-bootstrap 95 % CIs of ``order_flip_by_system``."""
    overall = [r for r in records if r["aspect"] == "overall"]
    return user_bootstrap(overall, lambda r: order_flip_by_system(r, reference), n, seed)


def order_averaged_preference_ci(
    records: Sequence[dict[str, Any]], reference: str, n: int = 1000, seed: int = 0
) -> dict[str, tuple[float, float] | None]:
    """User-bootstrap 95 % CIs of ``order_averaged_preference``."""
    overall = [r for r in records if r["aspect"] == "overall"]
    return user_bootstrap(overall, lambda r: order_averaged_preference(r, reference), n, seed)


def order_stats(
    records: Sequence[dict[str, Any]],
    reference: str | None = None,
    auc: dict[str, float] | None = None,
    n: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """The order-swap statistics of per-order records, each with its user-bootstrap CI: the
    order-flip rate; with ``reference``, each system's flip rate against it and its
    order-averaged probability of beating it (records with ``p_overall``), the latter's
    correlation with ``auc`` when given. ``None`` (or ``{}``) where no pair has both
    orders."""
    out: dict[str, Any] = {
        "order_flip_rate": order_flip_rate(records),
        "order_flip_ci": order_flip_ci(records, n, seed),
    }
    if reference is None:
        return out
    pref = order_averaged_preference(records, reference)
    out |= {
        "order_flip_by_system": order_flip_by_system(records, reference),
        "order_flip_by_system_ci": order_flip_by_system_ci(records, reference, n, seed),
        "order_averaged": pref,
        "order_averaged_ci": order_averaged_preference_ci(records, reference, n, seed),
    }
    if auc is not None:
        out["corr_order_averaged_auc"] = correlations(
            {s: v for s, v in pref.items() if v is not None}, auc
        )
    return out


def correlations(x: dict[str, float], y: dict[str, float]) -> dict[str, float | None]:
    """Pearson r and Spearman rho between two per-system scores, each with its two-sided
    p-value (the paper reports Pearson with p; with a handful of systems a p-value is what
    says whether r means anything). Finite values of shared systems only; fewer than three
    give ``None``."""
    from scipy.stats import pearsonr, spearmanr

    keys = [k for k in x if k in y and _finite(x[k]) and _finite(y[k])]
    none = {"pearson": None, "pearson_p": None, "spearman": None, "spearman_p": None}
    a, b = [x[k] for k in keys], [y[k] for k in keys]
    if len(keys) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:  # r is undefined on a constant
        return {**none, "n": len(keys)}
    pr, sr = pearsonr(a, b), spearmanr(a, b)
    return {
        "pearson": float(pr[0]),
        "pearson_p": float(pr[1]),
        "spearman": float(sr[0]),
        "spearman_p": float(sr[1]),
        "n": len(keys),
    }


def _finite(v: Any) -> bool:
    return v is not None and bool(np.isfinite(v))


def summarize(
    records: Sequence[dict[str, Any]],
    auc: dict[str, float] | None = None,
    bootstrap: int = 200,
    seed: int = 0,
    reference: str | None = None,
) -> dict[str, Any]:
    """Every aggregate from per-comparison records; with ``reference``, also each system's Q
    against it per aspect (``reference_q``) and its correlation with AUC."""
    for i, r in enumerate(records):
        missing = {"user_id", "system_a", "system_b", "aspect", "verdict"} - set(r)
        if missing:
            raise ValueError(f"record {i + 1}: missing field(s) {sorted(missing)}")
        if r["verdict"] not in OPTIONS:
            raise ValueError(f"record {i + 1}: verdict {r['verdict']!r} is not one of {OPTIONS}")
    if reference is not None:
        systems = sorted({s for r in records for s in (r["system_a"], r["system_b"])})
        if reference not in systems:
            close = suggest(reference, systems)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(
                f"reference {reference!r} is not a system of the records {systems}{hint}"
            )
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
    if reference is not None:
        out["reference"] = reference
        out["reference_q"] = {a: reference_q(records, reference, a) for a in aspects}
    if auc:
        out["corr_q_auc"] = correlations(q, auc)
        out["corr_bt_auc"] = correlations(bt, auc)
        if reference is not None:
            ref_q = {s: c["q"] for s, c in out["reference_q"].get("overall", {}).items()}
            out["corr_reference_q_auc"] = correlations(ref_q, auc)
    return out


# -- offline list metrics -------------------------------------------------------------
def urd(items: Sequence[str], sim: Callable[[str, str], float]) -> float:
    """URD = 1 - mean pairwise similarity within the list (list diversity)."""
    pairs = list(itertools.combinations(items, 2))
    return 1.0 - float(np.mean([sim(a, b) for a, b in pairs])) if pairs else 0.0


def ndcg_at(items: Sequence[str], targets: set[str], k: int = 5) -> float:
    """nDCG@k with binary relevance (``recjudge._metrics.ndcg``)."""
    return ndcg([int(it in targets) for it in items], len(targets), k)


def auc_of(scores: np.ndarray, target: int, exclude: Sequence[int]) -> float:
    """Share of candidate negatives scored below the target (ties count half)."""
    mask = np.ones(len(scores), dtype=bool)
    mask[list(exclude)] = False
    mask[target] = False
    neg = scores[mask]
    t = scores[target]
    return float((np.sum(neg < t) + 0.5 * np.sum(neg == t)) / max(len(neg), 1))


# -- list-level comparison (our extension) -------------------------------------------------
LIST_DISCOUNTS = ("log2", "none")


def list_score(p: Sequence[float | None], discount: str = "log2") -> float | None:
    """A list's position-discounted mean judged relevance.

    ``S = sum_r w_r p_r / sum_r w_r`` over the list's ranks ``r = 1..k`` whose item was judged
    (``p_r`` not None), with ``w_r = 1 / log2(r + 1)`` (``log2``, the DCG discount of
    Jarvelin & Kekalainen, 2002) or ``w_r = 1`` (``none``). With ``p_r`` the judge's P(YES),
    S is the list's expected discounted relevance normalised by the list's own discount mass:
    in [0, 1], comparable across lists of different lengths. ``None`` when no item was judged.
    """
    if discount not in LIST_DISCOUNTS:
        raise ValueError(f"unknown discount {discount!r}; use one of {LIST_DISCOUNTS}")
    num = den = 0.0
    for r, v in enumerate(p, start=1):
        if v is None:
            continue
        w = 1.0 / float(np.log2(r + 1)) if discount == "log2" else 1.0
        num += w * float(v)
        den += w
    return num / den if den > 0 else None


def list_verdict(score_a: float, score_b: float, margin: float) -> str:
    """``A wins`` when ``S_A - S_B > margin``, ``B wins`` when ``S_B - S_A > margin``, else
    ``Tie`` (the same verdict whichever list is called A: no position enters)."""
    d = score_a - score_b
    if d > margin:
        return "A wins"
    if d < -margin:
        return "B wins"
    return "Tie"
