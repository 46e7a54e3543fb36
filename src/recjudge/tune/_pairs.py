"""The training pairs of ``recjudge judge tune``: built from a team's log, before any evaluation.

Protocol (the one ``bench brief-ratings`` evaluates the judge under, moved inside the log):

- the log is read strictly before ``before`` when given (the evaluated period never enters);
- users are split by a seeded sha256 order (``sample_users``) into training and validation
  users; ``exclude_users`` (the users a team will evaluate or label) never enter either;
- per user, ``timeline_split``: the last ``future_fraction`` of the user's interactions are
  the **positives** (a user's later interactions; ``min_rating`` keeps only those rated at
  least that), everything before them is the history the prompt shows;
- **negatives** are drawn as the evaluation draws them, ``negatives_per_positive`` per
  positive, by one of two stated rules (``negatives``):

  - ``uniform``: uniformly from the catalogue, among items the user never touched in the log
    (the sampled-negatives protocol of ``bench brief-ratings``);
  - ``listed``: from what recommenders would list for the user, which is where offline
    metrics count: the user's **list** is the union of the top ``listed_items`` of an
    item-kNN recommender over the user's whole history (the sum of the candidate's cosine
    with each history item, binary co-occurrence over every readable user's history but the
    validation users', Sarwar et al. 2001) and of the most popular items among those users,
    items the user's history holds left out (every user whose history the lists read is in
    the users record, with that history's last time). The positives are the user's later
    interactions **in its list** (hits), the negatives listed items the user never
    touched; a user without a hit adds no pair. A judge tuned on uniform negatives learns to
    tell a plausible item from a random one, and every listed item is plausible: on the
    known-truth world's listed pairs such a judge ranked hits no better than chance (AUC
    0.512, ``reports/brief-offline-estimators/ml-1m-qwen2.5-coder-0.5b-tuned``);
- the target answer is the evidence-first JSON the grammar allows. YES cites evidence chosen
  by a stated rule (``evidence_for``): the shown history items with the highest item-item
  cosine similarity to the candidate over the training users' interactions (binary
  co-occurrence, Sarwar et al. 2001), at most ``evidence_items``, only those with a positive
  similarity, the most recent shown item when none has; NO cites nothing.

Everything here is numpy/pandas: the pairs are plain records that the tests check for leakage
(no (user, item) of the evaluated future, no excluded user).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.sparse import csr_matrix

from recjudge._util import rng
from recjudge.data import sample_users, timeline_split
from recjudge.reward import JudgeRequest, history_items, request_of


@dataclass(frozen=True)
class TunePair:
    """One training or validation example.

    Attributes:
        request: the judge request (history before the user's later interactions).
        label: 1 for a later interaction of the user, 0 for an item the user never touched.
    """

    request: JudgeRequest
    label: int


@dataclass
class TunePairs:
    """The pairs of one tuning run and what the card records about their source."""

    train: list[TunePair]
    validation: list[TunePair]
    #: the evidence rule of the positives' targets (fitted on the training users' histories)
    rule: EvidenceRule | None = None
    #: user id -> the latest interaction timestamp the tuning read for that user
    users_last_time: dict[str, float] = field(default_factory=dict)
    validation_users: list[str] = field(default_factory=list)
    interactions: int = 0
    first_time: float | None = None
    last_time: float | None = None


def _cooccurrence(log: pd.DataFrame) -> tuple[dict[str, int], Any, np.ndarray]:
    """(item index, binary item x user matrix (CSR), per-item norms) of ``log``."""
    items = {i: n for n, i in enumerate(sorted(log["item_id"].astype(str).unique()))}
    users = {u: n for n, u in enumerate(sorted(log["user_id"].astype(str).unique()))}
    pairs = log[["item_id", "user_id"]].astype(str).drop_duplicates()
    rows = pairs["item_id"].map(items).to_numpy()
    cols = pairs["user_id"].map(users).to_numpy()
    m = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(items), len(users)))
    norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())
    return items, m, norms


class EvidenceRule:
    """The stated rule for a positive's evidence (see the module docstring).

    Args:
        log: the interactions whose co-occurrence defines the similarity (the training
            users' histories: never a validation user's or the evaluated future).
        evidence_items: most titles one target cites.
    """

    def __init__(self, log: pd.DataFrame, evidence_items: int = 2) -> None:
        if evidence_items < 1:
            raise ValueError(f"evidence_items must be >= 1, got {evidence_items}")
        self.items, self.matrix, self.norms = _cooccurrence(log)
        self.evidence_items = evidence_items

    def similarity(self, candidate: str, others: Sequence[str]) -> np.ndarray:
        """Cosine of ``candidate``'s user set with each of ``others``' (0 for unknown items)."""
        c = self.items.get(candidate)
        out = np.zeros(len(others))
        known = [(n, self.items[o]) for n, o in enumerate(others) if o in self.items]
        if c is None or self.norms[c] == 0 or not known:
            return out
        at, rows = (list(x) for x in zip(*known, strict=True))
        # one sparse product: the candidate's co-occurrence with every known shown item
        out[at] = self.cosine(rows, [c])[:, 0]
        return out

    def cosine(self, rows: Sequence[int], cols: Sequence[int]) -> np.ndarray:
        """[rows, cols] cosine of the items at matrix rows ``rows`` with the items at
        ``cols``: shared users over the product of the norms (0 for an item without users).
        The listed rule's kNN does not call it: it needs only each item's sum over a
        history, which ``Lister._knn`` gets from two matrix-vector products."""
        dots = np.asarray((self.matrix[rows] @ self.matrix[cols].T).todense())
        norms = np.outer(self.norms[rows], self.norms[cols])
        return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)

    def choose(self, candidate: str, shown: Sequence[str]) -> tuple[str, ...]:
        """Item ids of ``shown`` (most recent first) to cite for ``candidate``: the highest
        similarities above 0 (ties: the more recent), else the most recent item."""
        if not shown:
            return ()
        sims = self.similarity(candidate, shown)
        order = sorted(range(len(shown)), key=lambda n: (-sims[n], n))
        chosen = [shown[n] for n in order if sims[n] > 0][: self.evidence_items]
        return tuple(chosen) if chosen else (shown[0],)


#: the negatives' rules (``build_pairs``' ``negatives``)
NEGATIVES = ("uniform", "listed")


class Lister:
    """The list a user's negatives are drawn from under ``negatives="listed"``: the top
    ``k`` of item-kNN over the user's history and of popularity (module docstring).

    Args:
        log: the histories the recommenders are fitted on (co-occurrence and popularity).
        k: each recommender's list length.
    """

    def __init__(self, log: pd.DataFrame, k: int) -> None:
        if k < 1:
            raise ValueError(f"listed_items must be >= 1, got {k}")
        # the co-occurrence only: no evidence is chosen from it
        rule = EvidenceRule(log)
        self.rule, self.k = rule, k
        self.names = np.array(sorted(rule.items, key=rule.items.__getitem__), dtype=object)
        # an item's users: its squared norm in the binary co-occurrence matrix; most popular
        # first, ties by item id (a stated, seed-free order)
        users = np.rint(rule.norms**2)
        self.popular = [str(i) for i in self.names[np.lexsort((self.names, -users))]]

    def listed(self, history: pd.DataFrame) -> list[str]:
        """Item-kNN's top ``k`` then popularity's (duplicates once), none of ``history``'s
        items (a recommender lists what the user has not seen yet)."""
        touched = set(history["item_id"].astype(str))
        out = self._knn(touched)
        top = list(itertools.islice((i for i in self.popular if i not in touched), self.k))
        return out + [i for i in top if i not in out]

    def _knn(self, touched: set[str]) -> list[str]:
        """Item-kNN's top ``k`` for a user who touched ``touched``: the items of positive
        score ``s_i = sum_c cos(i, c)`` over the history items ``c``, highest first, ties by
        item id, none of ``touched``.

        ``s_i = (M_i . v) / |M_i|`` with ``v = sum_c M_c / |M_c|``: two sparse
        matrix-vector products, so memory and time grow with the log's non-zeros, not with
        items x history (a catalogue of 10^5 items and a long history stay cheap)."""
        rule = self.rule
        rows = sorted({rule.items[i] for i in touched if i in rule.items})
        if not rows:
            return []
        inv = np.divide(1.0, rule.norms[rows], out=np.zeros(len(rows)), where=rule.norms[rows] > 0)
        v = rule.matrix[rows].T @ inv  # users: the history's normalised co-occurrence
        dots = rule.matrix @ v
        score = np.divide(dots, rule.norms, out=np.zeros_like(dots), where=rule.norms > 0)
        score[rows] = 0.0  # a recommender lists what the user has not seen yet
        keep = np.flatnonzero(score > 0)
        if len(keep) > self.k:  # the k-th highest score, ties with it kept for the id order
            kth = np.partition(score[keep], len(keep) - self.k)[len(keep) - self.k]
            keep = keep[score[keep] >= kth]
        order = keep[np.lexsort((self.names[keep], -score[keep]))][: self.k]
        return [str(n) for n in self.names[order]]


def _positives(
    later: pd.DataFrame, min_rating: float | None, per_user: int, listed: list[str] | None = None
) -> list[str]:
    """The user's first ``per_user`` later interactions (rated >= ``min_rating``; with a
    ``listed`` list, only those in it)."""
    rows = later if min_rating is None else later[later["rating"] >= min_rating]
    items = [str(i) for i in rows["item_id"]]
    if listed is not None:
        keep = set(listed)
        items = [i for i in items if i in keep]
    return items[:per_user]


def _listed_negatives(g: Any, listed: list[str], touched: set[str], want: int) -> list[str]:
    """Up to ``want`` distinct listed items the user never touched, drawn uniformly with
    ``g`` without replacement."""
    pool = [i for i in listed if i not in touched]
    if len(pool) <= want:
        return pool
    return [pool[int(n)] for n in g.choice(len(pool), size=want, replace=False)]


def build_pairs(
    ds: Any,
    *,
    future_fraction: float = 0.2,
    positives_per_user: int = 3,
    negatives_per_positive: int = 1,
    min_rating: float | None = None,
    validation_users: int = 50,
    max_users: int | None = None,
    exclude_users: Sequence[str] = (),
    before: float | None = None,
    min_history: int = 3,
    evidence_items: int = 2,
    seed: int = 0,
    negatives: str = "uniform",
    listed_items: int = 20,
) -> TunePairs:
    """The training and validation pairs of ``ds`` (see the module docstring).

    Args:
        ds: the team's log (a ``recjudge.data.Dataset``); only its interactions strictly
            before ``before`` are read.
        future_fraction: each user's last fraction of interactions that become positives.
        positives_per_user: most positives per user (the earliest later interactions).
        negatives_per_positive: unseen items drawn per positive.
        min_rating: a later interaction is a positive only when rated at least this.
        validation_users: users held out for validation (early stopping).
        max_users: a seeded sample of this many training users (None: all).
        exclude_users: users that enter neither split (those a team evaluates or labels).
        before: a timestamp; interactions at or after it are never read.
        min_history: users with fewer history items are skipped.
        evidence_items: most titles a positive's target cites (``EvidenceRule``).
        seed: the user order, the negatives and the split.
        negatives: ``uniform`` or ``listed`` (the module docstring states both rules).
        listed_items: with ``listed``, each recommender's list length.

    Raises:
        ValueError: an unknown ``negatives``; no user left to tune on (the message says why).
    """
    if negatives not in NEGATIVES:
        raise ValueError(f"negatives must be one of {', '.join(NEGATIVES)}, got {negatives!r}")
    log = _readable_log(ds, before, exclude_users)
    history, later = timeline_split(log, fraction=future_fraction)
    val_users, train_users = _split_users(history, later, min_history, validation_users,
                                          max_users, seed)  # fmt: skip
    hist_by = {str(u): g for u, g in history.groupby("user_id", observed=True)}
    later_by = {str(u): g for u, g in later.groupby("user_id", observed=True)}
    # similarity from the training users' histories only (no validation user, no later item)
    rule_log = history[history["user_id"].astype(str).isin(set(train_users))]
    rule = EvidenceRule(rule_log, evidence_items)
    lister, read = (_listing(history, val_users, listed_items) if negatives == "listed"
                    else (None, {}))  # fmt: skip
    touched = {str(u): set(g["item_id"].astype(str))
               for u, g in log.groupby("user_id", observed=True)}  # fmt: skip
    catalogue = sorted(ds.items["item_id"].astype(str))
    out = TunePairs([], [], rule, users_last_time=read, interactions=int(len(log)),
                    first_time=float(log["timestamp"].min()),
                    last_time=float(log["timestamp"].max()))  # fmt: skip
    for split, users in (("train", train_users), ("validation", val_users)):
        for u in users:
            positives, drawn = _candidates(
                rng("tune-negatives", seed, u), hist_by[u], later_by[u], touched[u], lister,
                catalogue, min_rating, positives_per_user, negatives_per_positive,
            )  # fmt: skip
            if not positives:
                continue
            items = history_items(ds, hist_by[u])
            getattr(out, split).extend(
                TunePair(request_of(ds, u, items, c, None, {"label": y}), y)
                for y, group in ((1, positives), (0, drawn)) for c in group)  # fmt: skip
            # the latest interaction read: a later one (the timeline split keeps time order)
            out.users_last_time[u] = float(later_by[u]["timestamp"].max())
    out.validation_users = list(val_users)
    if not out.train:
        why = " in its list (--negatives listed: raise --listed-items)" if lister else ""
        raise ValueError(f"no training pair was built (every training user lacks a positive "
                         f"under --min-rating{why})")  # fmt: skip
    return out


def _listing(history: pd.DataFrame, val_users: Sequence[str],
             k: int) -> tuple[Lister, dict[str, float]]:  # fmt: skip
    """The ``listed`` rule's recommenders, fitted on every history but the validation users'
    (as a team's recommenders see its whole past; never a later interaction), and each user
    they read with that history's last time (the users record: the leakage checks)."""
    known = history[~history["user_id"].astype(str).isin(set(val_users))]
    last = known.groupby(known["user_id"].astype(str))["timestamp"].max()
    return Lister(known, k), {str(u): float(t) for u, t in last.items()}


def _candidates(
    g: Any, history: pd.DataFrame, later: pd.DataFrame, touched: set[str], lister: Any,
    catalogue: list[str], min_rating: float | None, per_user: int, per_positive: int,
) -> tuple[list[str], list[str]]:  # fmt: skip
    """One user's (positives, negatives) under the rule ``lister`` says (None: uniform;
    module docstring); no positive: no negative either."""
    listed = None if lister is None else lister.listed(history)
    positives = _positives(later, min_rating, per_user, listed)
    if not positives:
        return [], []
    want = len(positives) * per_positive
    if listed is None:
        return positives, _negatives(g, catalogue, touched, want)
    return positives, _listed_negatives(g, listed, touched, want)


def _readable_log(ds: Any, before: float | None, exclude_users: Sequence[str]) -> Any:
    """The interactions the tuning may read: before ``before``, of no excluded user.

    Raises:
        ValueError: none is left.
    """
    log = ds.interactions
    if before is not None:
        log = log[log["timestamp"] < before]
    excluded = {str(u) for u in exclude_users}
    log = log[~log["user_id"].astype(str).isin(excluded)]
    if log.empty:
        raise ValueError("the log holds no interaction to tune on (check --before and "
                         "--exclude-users)")  # fmt: skip
    return log


def _negatives(g: Any, catalogue: list[str], touched: set[str], want: int) -> list[str]:
    """Up to ``want`` distinct items the user never touched, drawn uniformly from the
    catalogue with ``g`` (at most ``100 * want`` draws)."""
    negatives: list[str] = []
    for _ in range(100 * want):
        if len(negatives) == want:
            break
        c = catalogue[int(g.integers(len(catalogue)))]
        if c not in touched and c not in negatives:
            negatives.append(c)
    return negatives


def _split_users(
    history: Any,
    later: Any,
    min_history: int,
    validation_users: int,
    max_users: int | None,
    seed: int,
) -> tuple[list[str], list[str]]:
    """(validation users, training users): the users with ``min_history`` history items and
    a later interaction, in a seeded order; the first ones (at most a fifth) validate.

    Raises:
        ValueError: fewer than two such users.
    """
    n_hist = history.groupby("user_id", observed=True).size()
    n_later = later.groupby("user_id", observed=True).size()
    eligible = [str(u) for u in n_later.index if n_hist.get(u, 0) >= min_history]
    if len(eligible) < 2:
        raise ValueError(f"{len(eligible)} users have >= {min_history} history items and a "
                         "later interaction; tune on a larger log")  # fmt: skip
    order = sample_users(eligible, len(eligible), ("tune", seed))
    n_val = min(validation_users, max(1, len(order) // 5))
    val_users, train_users = order[:n_val], order[n_val:]
    if max_users is not None:
        train_users = train_users[:max_users]
    return list(val_users), list(train_users)
