"""Gold labels a person can make: ``recjudge gold sample`` and ``evaluate --gold``.

``sample_gold`` draws (user, item) pairs for a person to label from the evaluated top-k
lists, under one of three designs, and records each pair's inclusion probability ``pi`` so
the estimators weight it correctly (``_ppi``):

- ``users`` (the default): a seeded sample of evaluation users, drawn without looking at any
  label, added until the sample holds at least ``n`` pairs; every pair any system lists for
  them is labelled (a labeller reads one history for several candidates). ``pi = m / U``
  for the ``m`` sampled of ``U`` users. Estimated with clustered PPI (``clustered_ppi_mean``).
- ``uniform``: ``n`` of the ``S`` distinct listed pairs, uniformly without replacement;
  ``pi = n / S``.
- ``stratified``: the listed pairs partitioned by the first system (in ``--runs`` order)
  that lists them and by the judge's ``p_yes`` quartile within it; ``n`` spread equally over
  the strata (capped by their sizes); ``pi_h = n_h / N_h``. Rare strata (a weak system's
  lists, the judge's confident YES) get more labels than uniform sampling would give them.
- ``active``: each listed pair is drawn independently (Poisson sampling) with probability
  ``pi_i`` proportional to ``0.5 + 0.5 a_i / mean(a)``, ``a_i = sqrt(p_i (1 - p_i))`` the
  judge's uncertainty about the pair, scaled so that ``sum pi = n`` (capped at 1). The
  variance of the PPI rectifier ``sum (Y - p) / pi`` is smallest with ``pi`` proportional to
  the residual's standard deviation, ``sqrt(E[(Y - p)^2 | x])``, which is ``a_i`` for a
  calibrated ``p`` (Zrnic and Candes, "Active statistical inference", ICML 2024); the uniform
  half bounds the weights where the judge is confident and wrong. Pairs the judge is sure of
  are labelled less, those it hesitates on more; the estimators weight each by ``1 / pi``.

``--sequential`` orders every listed pair (every evaluation user) so that the labeller
labels from the top and stops when ``evaluate`` says the interval is narrow enough; a
labelled prefix of ``m`` is read as the design at ``m``: ``users`` and ``uniform`` a random
order (``pi = m / N``), ``stratified`` the strata in turn (``pi = m_h / N_h``), and
``active`` **priority sampling** (Duffield, Lund and Thorup, "Priority sampling for
estimation of arbitrary subset sums", J. ACM 54(6), 2007): each pair gets the active
design's score ``lambda_i`` and a key ``xi_i = U_i / lambda_i`` (``U_i`` uniform on (0, 1]),
the order is ``xi`` ascending, and the first ``m`` pairs have ``pi_i = min(1, lambda_i
xi_(m+1))``, ``xi_(m+1)`` the first unlabelled pair's key (``pi = 1`` once all are
labelled). Given the other pairs' keys a pair is in the prefix exactly when ``U_i <
lambda_i xi'``, ``xi'`` their ``m``-th smallest, which is ``xi_(m+1)`` whenever it is in; so
``1 / pi`` weights are exactly unbiased and distinct pairs' weighted terms are uncorrelated
(the theorem), as under Poisson sampling, whatever ``m`` the labeller stops at.

Pair designs are estimated with the design-based user-total PPI (``ppi_user_totals``).

The file is CSV: ``user_id, item_id, label`` (empty, for the labeller), ``inclusion_prob``,
``design``, and context for the labeller (``title``, ``history``: the user's most recent
titles). ``GOLD.design.json`` beside it records the design, seed, frame and lists. ``read_gold``
reads the labelled file back: unlabelled, repeated or unlisted pairs are refused by row.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recjudge._util import atomic_write_json, atomic_write_text, json_loads, rng
from recjudge.data import DataError, clean_text
from recjudge.evaluators.offline._calibrate import label_table, labels_of

__all__ = ["GOLD_DESIGNS", "GoldSample", "listed_pairs", "read_gold", "sample_gold",
           "write_gold"]  # fmt: skip

GOLD_DESIGNS = ("users", "uniform", "stratified", "active")
#: the designs a sequential file can follow: a prefix of a random order of users (of pairs)
#: is a uniform sample of them, whatever its length; the stratified order takes one pair of
#: each stratum in turn, so a prefix is a uniform sample within each stratum; the active
#: order is priority sampling's (module docstring)
SEQUENTIAL_DESIGNS = ("users", "uniform", "stratified", "active")
#: share of the active design's inclusion probability spread uniformly (the rest follows the
#: judge's uncertainty): keeps every weight 1 / pi within 1 / ACTIVE_FLOOR of uniform's
ACTIVE_FLOOR = 0.5


@dataclass(frozen=True)
class GoldSample:
    """Labelled pairs and the design they were drawn under.

    Attributes:
        labels: ``{(user, item): 0/1}``.
        inclusion: ``{(user, item): pi}`` (empty: not recorded; uniform over the listed
            pairs is assumed, ``pi = n / S``).
        design: ``users``, ``uniform``, ``stratified``, or ``unknown`` (a hand-made file).
        source: the file.
    """

    labels: Mapping[tuple[str, str], int]
    inclusion: Mapping[tuple[str, str], float] = field(default_factory=dict)
    design: str = "unknown"
    source: str = ""
    #: a sequential file's (users labelled, users in its order); None for a fixed sample
    sequential: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def unit(self) -> str:
        """What a sequential file labels one by one: ``users`` (whole users: the users
        design) or ``pairs`` (the uniform and stratified designs)."""
        return "users" if self.design == "users" else "pairs"


def listed_pairs(runs: Sequence[Any], users: Sequence[str], k: int) -> list[tuple[str, str]]:
    """Every distinct (user, item) some run lists in its top-k for ``users`` (user order,
    then first appearance): the sampling frame."""
    out: list[tuple[str, str]] = []
    for u in users:
        seen: set[str] = set()
        for run in runs:
            for i in run.rankings.get(u, [])[:k]:
                if i not in seen:
                    seen.add(i)
                    out.append((u, i))
    return out


def sample_gold(
    runs: Sequence[Any],
    users: Sequence[str],
    k: int,
    n: int,
    *,
    design: str = "users",
    seed: int = 0,
    judged: Mapping[tuple[str, str], tuple[float, bool]] | None = None,
    sequential: bool = False,
) -> list[dict[str, Any]]:
    """Rows ``{user_id, item_id, inclusion_prob, stratum}`` under ``design`` (module
    docstring); ``judged`` (``read_judged``) is needed by ``stratified`` and ``active``.
    ``sequential``: every user (every listed pair) in a seeded order, each row with its
    user's (its own) ``order`` (1, 2, ...) and no inclusion probability yet (``read_gold``
    computes it from how many are labelled); ``n`` is then the first batch the labeller is
    told. The stratified order visits the strata in turn (each its members in a random
    order, an exhausted one skipped), so its first ``m`` pairs hold the equal allocation
    ``_stratified`` draws at ``n = m``; the active order is priority sampling's, each row
    with its ``weight`` (``lambda``) and ``priority`` (``xi``).

    Raises:
        ValueError: an unknown design, ``n`` < 2, or no listed pair.
    """
    if design not in GOLD_DESIGNS:
        raise ValueError(f"unknown gold design {design!r}; use one of {', '.join(GOLD_DESIGNS)}")
    if sequential and design not in SEQUENTIAL_DESIGNS:
        raise ValueError(f"--sequential takes the {', '.join(SEQUENTIAL_DESIGNS)} designs, "
                         f"not {design!r}")  # fmt: skip
    if n < 2:
        raise ValueError("a gold sample needs at least 2 pairs (--n)")
    frame = listed_pairs(runs, users, k)
    if not frame:
        raise ValueError("the runs list no pair for the evaluation users")
    g = rng("gold", design, seed)
    if design == "users":
        return _by_users(frame, users, len(frame) if sequential else n, g, sequential)
    if design == "uniform" and sequential:
        return [{"user_id": frame[j][0], "item_id": frame[j][1], "inclusion_prob": None,
                 "stratum": "all", "order": n}
                for n, j in enumerate(g.permutation(len(frame)).tolist(), 1)]  # fmt: skip
    if design == "uniform":
        take = min(n, len(frame))
        pick = sorted(g.choice(len(frame), take, replace=False).tolist())
        return [{"user_id": frame[j][0], "item_id": frame[j][1],
                 "inclusion_prob": take / len(frame), "stratum": "all"} for j in pick]  # fmt: skip
    if judged is None:
        raise ValueError(f"the {design} design needs the judge's probabilities (--qrels DIR)")
    if design == "active":
        p = [judged.get(pair, (0.5, False))[0] for pair in frame]
        return _priority_order(frame, p, g) if sequential else _active(frame, n, g, judged)
    strata = _strata(frame, runs, users, k, judged)
    if sequential:
        return _stratified_order(frame, strata, g)
    return _stratified(frame, strata, n, g)


def active_score(p: Sequence[float]) -> np.ndarray:
    """The ``active`` design's relative inclusion scores (module docstring): ``0.5 + 0.5
    a_i / mean(a)``, ``a_i = sqrt(p_i (1 - p_i))``; each in [0.5, ...), mean 1."""
    q = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    a = np.sqrt(q * (1 - q))
    # a judge certain of every pair (p 0 or 1 everywhere) leaves the uniform design
    rel = a / a.mean() if a.mean() > 0 else np.ones(len(q))
    return ACTIVE_FLOOR + (1 - ACTIVE_FLOOR) * rel


def active_inclusion(p: Sequence[float], n: int) -> np.ndarray:
    """The ``active`` design's inclusion probabilities (module docstring): ``sum = min(n,
    len(p))``, each in (0, 1]."""
    q = np.asarray(p, dtype=float)
    score = active_score(q)
    target = float(min(n, len(q)))
    pi = np.zeros(len(q))
    capped = np.zeros(len(q), dtype=bool)
    for _ in range(len(q)):  # scale the uncapped ones until the capped ones are settled
        free = target - capped.sum()
        pi = np.where(capped, 1.0, score * free / score[~capped].sum())
        over = (pi > 1.0) & ~capped
        if not over.any():
            break
        capped |= over
    return np.minimum(pi, 1.0)


def _active(frame, n, g, judged) -> list[dict[str, Any]]:
    """Poisson sampling with ``active_inclusion``'s probabilities (the ``active`` design)."""
    pi = active_inclusion([judged.get(pair, (0.5, False))[0] for pair in frame], n)
    pick = np.flatnonzero(g.random(len(frame)) < pi)
    return [{"user_id": frame[j][0], "item_id": frame[j][1], "inclusion_prob": float(pi[j]),
             "stratum": "active"} for j in pick]  # fmt: skip


def _priority_order(frame, p, g) -> list[dict[str, Any]]:
    """Every listed pair in priority sampling's order (module docstring): key ``xi = U /
    lambda`` ascending, ``lambda`` the active score of the judge's ``p``."""
    lam = active_score(p)
    xi = (1.0 - g.random(len(frame))) / lam  # U in (0, 1]: no key is 0
    return [{"user_id": frame[j][0], "item_id": frame[j][1], "inclusion_prob": None,
             "stratum": "active", "order": n, "weight": float(lam[j]), "priority": float(xi[j])}
            for n, j in enumerate(np.argsort(xi, kind="stable").tolist(), 1)]  # fmt: skip


def priority_inclusion(weight: Sequence[float], priority: Sequence[float],
                       m: int) -> np.ndarray:  # fmt: skip
    """Priority sampling's inclusion probabilities of the first ``m`` pairs of an order
    sorted by ``priority`` (module docstring): ``min(1, weight_i * priority[m])``, 1 for
    every pair once all are in."""
    w = np.asarray(weight, dtype=float)[:m]
    if m >= len(priority):
        return np.ones(m)
    return np.minimum(1.0, w * float(priority[m]))


def _by_users(
    frame: list[tuple[str, str]], users: Sequence[str], n: int, g: Any, sequential: bool = False
) -> list:
    """Whole users in a random order until ``n`` pairs are reached (the ``users`` design);
    ``sequential``: every user, rows in that order, each with its user's ``order``."""
    by_user: dict[str, list[str]] = {}
    for u, i in frame:
        by_user.setdefault(u, []).append(i)
    order = [users[j] for j in g.permutation(len(users)) if users[j] in by_user]
    chosen, total = [], 0
    for u in order:
        if total >= n:
            break
        chosen.append(u)
        total += len(by_user[u])
    if sequential:
        return [{"user_id": u, "item_id": i, "inclusion_prob": None, "stratum": "users",
                 "order": n} for n, u in enumerate(chosen, 1) for i in by_user[u]]  # fmt: skip
    pi = len(chosen) / len(by_user)
    keep = set(chosen)
    return [{"user_id": u, "item_id": i, "inclusion_prob": pi, "stratum": "users"}
            for u in by_user if u in keep for i in by_user[u]]  # fmt: skip


def _strata(frame, runs, users, k, judged) -> dict[str, list[int]]:
    """The ``stratified`` design's strata, each a list of indices into ``frame``: (first
    system that lists the pair, quartile of the judge's p_yes within that system)."""
    owner = {}
    for run in runs:
        for u in users:
            for i in run.rankings.get(u, [])[:k]:
                owner.setdefault((u, i), run.name)
    strata: dict[str, list[int]] = {}
    for run in runs:
        mine = [j for j, pair in enumerate(frame) if owner[pair] == run.name]
        if not mine:
            continue
        p = np.array([judged.get(frame[j], (0.5, False))[0] for j in mine])
        cuts = np.quantile(p, [0.25, 0.5, 0.75]) if len(p) > 3 else np.array([])
        for j, q in zip(mine, np.searchsorted(cuts, p, side="right"), strict=True):
            strata.setdefault(f"{run.name}/q{int(q) + 1}", []).append(j)
    return strata


def _stratified(frame, strata, n, g) -> list[dict[str, Any]]:
    """The same number of pairs drawn from each stratum (the ``stratified`` design)."""
    per = max(1, n // len(strata))
    rows = []
    for name, members in sorted(strata.items()):
        take = min(per, len(members))
        for j in sorted(g.choice(len(members), take, replace=False).tolist()):
            u, i = frame[members[j]]
            rows.append({"user_id": u, "item_id": i, "inclusion_prob": take / len(members),
                         "stratum": name})  # fmt: skip
    return rows


def _stratified_order(frame, strata, g) -> list[dict[str, Any]]:
    """Every listed pair in the sequential stratified order (``sample_gold``): the strata
    in turn, one pair each, each stratum's members in a random order."""
    queues = [(name, [members[j] for j in g.permutation(len(members))])
              for name, members in sorted(strata.items())]  # fmt: skip
    rows: list[dict[str, Any]] = []
    for depth in range(max(len(q) for _, q in queues)):
        for name, queue in queues:
            if depth < len(queue):
                u, i = frame[queue[depth]]
                rows.append({"user_id": u, "item_id": i, "inclusion_prob": None,
                             "stratum": name, "order": len(rows) + 1})  # fmt: skip
    return rows


def write_gold(
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    design: Mapping[str, Any],
    data: Any = None,
    history: int = 10,
) -> Path:
    """The labeller's CSV (module docstring) and ``PATH.design.json``, each written then
    renamed. ``data`` (a ``Dataset``) adds the item's title and the user's recent titles."""
    path = Path(path)
    titles: dict[str, str] = {}
    hist: dict[str, list[str]] = {}
    if data is not None:
        # through the one renderer's cleaning: no control or bidi character reaches the file
        # a person reads (a title that displays as another)
        titles = dict(zip(data.items["item_id"].astype(str),
                          (clean_text(t) for t in data.items["title"].astype(str)),
                          strict=True))  # fmt: skip
        wanted = {r["user_id"] for r in rows}
        df = data.interactions[data.interactions["user_id"].astype(str).isin(wanted)]
        for u, part in df.sort_values("timestamp", kind="stable").groupby("user_id"):
            hist[str(u)] = part["item_id"].astype(str).tolist()[-history:]
    table = pd.DataFrame([{
        "user_id": r["user_id"], "item_id": r["item_id"], "label": "",
        # a sequential file's: known once the labeller stops (read_gold)
        "inclusion_prob": "" if r["inclusion_prob"] is None
        else repr(float(r["inclusion_prob"])), "design": design["design"],
        "stratum": r.get("stratum", ""), **({"order": r["order"]} if "order" in r else {}),
        "title": titles.get(r["item_id"], ""),
        "history": " | ".join(titles.get(i, i) for i in reversed(hist.get(r["user_id"], []))),
    } for r in rows])  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    # csv quoting keeps titles with commas, quotes or newlines in one field
    atomic_write_text(path, table.to_csv(index=False))
    atomic_write_json(Path(f"{path}.design.json"), {**design, "pairs": len(rows)})
    return path


def read_gold(
    path: str | Path,
    users: Sequence[str],
    listed: set[tuple[str, str]],
    runs: Sequence[str] | None = None,
    k: int | None = None,
) -> GoldSample:
    """A labelled gold file (``gold sample``'s, or any ``user_id,item_id,label`` file) with
    its design, checked against its design record (``PATH.design.json``) where there is one:
    the pairs it drew (a deleted row would be weighed as if never drawn), and the ``runs``
    and ``k`` it was drawn for (gold drawn for one system's lists, or at another k, weighs
    the others' pairs wrongly).

    Raises:
        DataError: a missing label, a label that is not 0/1, a repeated pair, a pair the
            evaluated runs do not list together, a bad inclusion probability (file and
            row named), or a file that does not match its design record.
    """
    record = _design_record(Path(path))
    if record is not None and record.get("sequential"):
        return _read_sequential(Path(path), record, users, listed, runs, k)
    df = label_table(path)  # read once: the labels and the inclusion column
    labels = labels_of(df, path)  # refuses unlabelled, non-binary and repeated rows by row
    _check_listed(Path(path), labels, users, listed)
    inclusion, design = _inclusion_and_design(Path(path), df, record)
    if record is not None:
        _check_record(Path(path), record, len(labels), runs, k, len(users))
    return GoldSample(labels, inclusion, design, str(path))


def _check_listed(path: Path, labels: Mapping[tuple[str, str], int], users: Sequence[str],
                  listed: set[tuple[str, str]]) -> None:  # fmt: skip
    """Refuse an empty gold file, and a pair the evaluated runs do not list (row named)."""
    if not labels:
        raise DataError("the gold file holds no labelled pair.", source=str(path),
                        fix="label the rows of `recjudge gold sample`'s file")  # fmt: skip
    known = set(users)
    for r, (u, i) in enumerate(labels, 1):
        if (u, i) not in listed:
            what = (f"user {u!r} is not an evaluation user" if u not in known
                    else f"no evaluated run lists item {i!r} in user {u!r}'s top-k")  # fmt: skip
            raise DataError(
                f"gold pair ({u!r}, {i!r}): {what}.",
                source=str(path),
                row=r,
                fix="draw gold pairs from the evaluated lists (`recjudge gold sample --runs "
                "... --k K`, the same runs and k as evaluate); a pair outside them cannot be "
                "weighed",
            )


def _read_sequential(path: Path, record: dict[str, Any], users: Sequence[str],
                     listed: set[tuple[str, str]], runs: Sequence[str] | None,
                     k: int | None) -> GoldSample:  # fmt: skip
    """A sequential file (``gold sample --sequential``), labelled from the top: the labelled
    units (users for the ``users`` design, each wholly labelled; pairs for ``uniform``) must
    be the first ``m`` of its random order; they are then a uniform random sample of ``m`` of
    its ``N`` units, ``pi = m / N`` for each labelled pair (the design at ``m``). The
    stratified design's order (``[user, item, stratum]`` each) takes the strata in turn: its
    first ``m`` pairs hold ``m_h`` of stratum ``h``'s ``N_h``, a uniform sample within it,
    ``pi = m_h / N_h``. The active design's (``[user, item, weight, priority]``) is priority
    sampling's: ``pi = min(1, weight * priority_(m+1))`` (``priority_inclusion``)."""
    df = label_table(path)
    labels = labels_of(df, path, skip_unlabelled=True)
    _check_listed(path, labels, users, listed)
    design = record.get("design")
    by_pair = design in ("uniform", "stratified", "active")
    what = "pair" if by_pair else "user"
    order, stratum, keys = _sequential_order(path, record, by_pair)
    pairs = list(zip(df["user_id"].astype(str), df["item_id"].astype(str), strict=True))
    first_row: dict[Any, int] = {}
    for r, (u, i) in enumerate(pairs, 1):
        first_row.setdefault((u, i) if by_pair else u, r)
    done = set(labels) if by_pair else {u for u, _ in labels}
    m = len(done)
    if stray := sorted(done - set(order)):
        raise DataError(
            f"{what} {stray[0]!r} is labelled but not in the file's order: it was not drawn "
            "by this design.",
            source=str(path), row=first_row.get(stray[0]), field="user_id",
            fix=f"delete the rows of {what} {stray[0]!r} (they cannot be weighed)",
        )  # fmt: skip
    if done != set(order[:m]):
        gap = next(x for x in order if x not in done)
        late = max(done - set(order[:m]), key=order.index)
        raise DataError(
            f"{what} {late!r} (order {order.index(late) + 1}) is labelled but {what} "
            f"{gap!r} (order {order.index(gap) + 1}) is not: a sequential gold file is "
            f"labelled {what} by {what} from the top, which keeps the labelled {what}s a "
            "random sample.",
            source=str(path), row=first_row.get(late), field="label",
            fix=f"label {what} {gap!r} first (or clear the labels of {what} {late!r})",
        )  # fmt: skip
    for r, (u, i) in enumerate(pairs, 1):  # labels_of left out exactly the empty rows
        if not by_pair and u in done and (u, i) not in labels:
            raise DataError(
                f"user {u!r} is partly labelled: a user's rows are one cluster of the "
                "sample and count only whole.",
                source=str(path), row=r, field="label",
                fix=f"label every row of user {u!r} (or clear its labels)",
            )  # fmt: skip
    _check_record(path, {**record, "pairs": None}, len(labels), runs, k, len(users))
    if design == "stratified":
        inclusion = _stratum_inclusion(path, order, stratum, m)
    elif design == "active":
        pi = priority_inclusion(keys[:, 0], keys[:, 1], m)
        inclusion = {pair: float(v) for pair, v in zip(order[:m], pi, strict=True)}
    else:
        inclusion = dict.fromkeys(labels, m / len(order))
    return GoldSample(labels, inclusion, design if by_pair else "users", str(path),
                      sequential=(m, len(order)))  # fmt: skip


def order_record(design: str, rows: Sequence[Mapping[str, Any]]) -> list:
    """A sequential sample's order as its design record keeps it (``_sequential_order``
    reads it back): users once each for ``users``; per pair ``[user, item]`` for
    ``uniform``, ``[user, item, stratum]`` for ``stratified``, ``[user, item, weight,
    priority]`` for ``active``."""
    if design == "users":
        return list(dict.fromkeys(r["user_id"] for r in rows))
    extra = {"stratified": ("stratum",), "active": ("weight", "priority")}.get(design, ())
    return [[r["user_id"], r["item_id"], *(r[f] for f in extra)] for r in rows]


def _sequential_order(path: Path, record: dict[str, Any],
                      by_pair: bool) -> tuple[list, dict[Any, str], np.ndarray]:  # fmt: skip
    """A sequential record's order (users, or (user, item) pairs), the stratified design's
    stratum per pair and the active design's [weight, priority] per pair.

    Raises:
        DataError: an order that is not the design's (each unit once; the active design's
            keys positive and ascending).
    """
    design = record.get("design")
    what = "pair" if by_pair else "user"
    width = {"stratified": 3, "active": 4}.get(str(design), 2)
    raw = record.get("order") or []
    stratum: dict[Any, str] = {}
    keys = np.zeros((0, 2))
    try:
        order = [(str(x[0]), str(x[1])) if by_pair and len(x) == width else str(x) for x in raw]
        if design == "stratified":
            stratum = {(str(x[0]), str(x[1])): str(x[2]) for x in raw}
        if design == "active":  # [user, item, weight, priority], priorities ascending
            keys = np.array([[float(x[2]), float(x[3])] for x in raw])
        ok = bool(order) and len(set(order)) == len(order) and all(
            isinstance(x, tuple) == by_pair for x in order)  # fmt: skip
        if design == "active":
            ok = ok and bool(np.isfinite(keys).all() and (keys > 0).all()
                             and (np.diff(keys[:, 1]) >= 0).all())  # fmt: skip
    except (TypeError, KeyError, IndexError, ValueError):
        ok = False
    if not ok:
        keyed = ", each with its weight and priority, priorities ascending" if (
            design == "active") else ""  # fmt: skip
        raise DataError(
            f"a sequential design record needs the {what}s' order (each {what} once{keyed}).",
            source=f"{path}.design.json", field="order",
            fix="keep the record as `gold sample --sequential` wrote it, or draw again",
        )  # fmt: skip
    return order, stratum, keys


def _stratum_inclusion(path: Path, order: list, stratum: Mapping[Any, str],
                       m: int) -> dict[tuple[str, str], float]:  # fmt: skip
    """Per labelled pair of a sequential stratified file's first ``m``: ``m_h / N_h`` of its
    stratum. A stratum with no labelled pair would leave its pairs out of the estimate
    (every pair's ``pi`` must be > 0), so the first pair of every stratum must be labelled."""
    size = Counter(stratum[pair] for pair in order)
    done = Counter(stratum[pair] for pair in order[:m])
    if len(done) < len(size):
        first = next(n for n, pair in enumerate(order, 1) if stratum[pair] not in done)
        raise DataError(
            f"{m} pairs labelled, but {len(size) - len(done)} of the {len(size)} strata have "
            f"none yet: the estimate needs at least one labelled pair of every stratum.",
            source=str(path), field="label",
            fix=f"label from the top down to order {max(first, len(size))} at least (the "
            "order takes one pair of each stratum in turn)",
        )  # fmt: skip
    return {pair: done[stratum[pair]] / size[stratum[pair]] for pair in order[:m]}


def _check_record(path: Path, rec: dict[str, Any], labelled: int, runs: Sequence[str] | None,
                  k: int | None, users: int | None = None) -> None:  # fmt: skip
    """The gold file against ``gold sample``'s design record beside it (``rec``); ``users``:
    how many evaluation users evaluate has."""
    sidecar = Path(f"{path}.design.json")
    drawn_users = rec.get("evaluation_users")
    if users is not None and isinstance(drawn_users, int) and drawn_users != users:
        raise DataError(
            f"drawn among {drawn_users} evaluation users but evaluate has {users}: the pairs "
            f"of the other {abs(users - drawn_users)} users "
            f"{'could never be drawn' if users > drawn_users else 'are not evaluated'}, so "
            "the inclusion probabilities are wrong for this evaluation (such intervals covered "
            "77-86 % at 1,000 gold pairs in simulation).",
            source=str(path), field="evaluation_users",
            fix="draw the gold sample again from this --qrels folder (`recjudge gold sample "
            "--qrels` of the same impute --out folder evaluate reads)",
        )  # fmt: skip
    drawn = rec.get("pairs")
    redraw = (f"`recjudge gold sample` with --seed {rec.get('seed')} --n {rec.get('n')} "
              f"--design {rec.get('design')} redraws the same pairs")  # fmt: skip
    if isinstance(drawn, int) and labelled != drawn:
        raise DataError(
            f"the file holds {labelled} labelled pairs but its design record drew {drawn}: "
            f"{'missing' if labelled < drawn else 'added'} rows would be weighed as if the "
            "design had drawn them (or not).",
            source=str(path), field="pairs",
            fix=f"label every drawn row and delete none ({redraw}); or delete {sidecar.name} "
            "to read the file as a hand-made sample (design unknown, uniform assumed)",
        )  # fmt: skip
    drawn_runs = rec.get("runs")
    if runs is not None and isinstance(drawn_runs, dict) and set(drawn_runs) != set(runs):
        raise DataError(
            f"drawn from the lists of {sorted(drawn_runs)} but evaluate compares "
            f"{sorted(runs)}: the inclusion probabilities hold for the lists they were drawn "
            "from, and a run whose lists were not in the frame gets too few gold pairs.",
            source=str(path), field="runs",
            fix="draw the gold sample with the same --runs as evaluate",
        )  # fmt: skip
    drawn_k = rec.get("k")
    if k is not None and isinstance(drawn_k, int) and drawn_k != k:
        raise DataError(
            f"drawn from the top-{drawn_k} lists but evaluate's metrics reach top-{k}: pairs "
            f"at ranks beyond {min(drawn_k, k)} "
            f"{'were never drawn' if k > drawn_k else 'are not evaluated'}.",
            source=str(path), field="k",
            fix=f"draw the gold sample with --k {k} (the largest cut-off of --metrics)",
        )  # fmt: skip


def _inclusion_and_design(
    path: Path, df: Any, record: dict[str, Any] | None
) -> tuple[dict[tuple[str, str], float], str]:
    """A gold file's inclusion probabilities (its ``inclusion_prob`` column, each in (0, 1])
    and its design (its design ``record``, the ``.design.json`` beside it, else the file's
    ``design`` column, else ``unknown``); ``df`` is the file as read from ``path``."""
    inclusion: dict[tuple[str, str], float] = {}
    design = "unknown"
    if "inclusion_prob" in df.columns:
        for r, (u, i, v) in enumerate(zip(df["user_id"].astype(str), df["item_id"].astype(str),
                                          df["inclusion_prob"], strict=True), 1):  # fmt: skip
            try:
                pi = float(v)
            except (TypeError, ValueError):
                pi = float("nan")
            if not 0.0 < pi <= 1.0:
                raise DataError(f"inclusion_prob {v!r} is not in (0, 1].", source=str(path),
                                row=r, field="inclusion_prob",
                                fix="keep the column as `gold sample` wrote it")  # fmt: skip
            inclusion[(u, i)] = pi
        if "design" in df.columns and len(df):
            values = set(df["design"].astype(str))
            design = values.pop() if len(values) == 1 else "unknown"
    if record is not None:
        design = str(record.get("design", design))
    if design not in GOLD_DESIGNS:
        design = "unknown"
    return inclusion, design


def _design_record(path: Path) -> dict[str, Any] | None:
    """``PATH.design.json`` (``gold sample``'s record of the design), None without one."""
    sidecar = Path(f"{path}.design.json")
    if not sidecar.is_file():
        return None
    try:
        record = json_loads(sidecar.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        record = None
    if not isinstance(record, dict):
        raise DataError(
            "not a gold design record (JSON).",
            source=str(sidecar),
            fix="delete it; the CSV's design column is used then",
        )
    return record


def check_redraw(
    path: str | Path,
    gold: GoldSample,
    runs: Sequence[Any],
    users: Sequence[str],
    judged: Mapping[tuple[str, str], tuple[float, bool]] | None = None,
) -> None:
    """A fixed gold file against what its design record redraws: ``sample_gold`` with the
    record's design, seed, ``n`` and ``k`` on the same runs (in the record's order) and
    users must give every labelled pair and its inclusion probability. An edited
    ``inclusion_prob`` (the 1/pi weights would come from it), a pair the design never drew,
    or a stratum moved, is refused naming the row. A file without a record, or a sequential
    one (checked against its own order), is left as it is.

    Raises:
        DataError: the first row that differs, its field and the redrawn value.
    """
    path = Path(path)
    record = _design_record(path)
    if record is None or record.get("sequential") or gold.sequential is not None:
        return
    design, seed, n, k = (record.get(f) for f in ("design", "seed", "n", "k"))
    if design not in GOLD_DESIGNS or not isinstance(n, int) or not isinstance(k, int):
        return
    order = list(record.get("runs") or {})
    by_name = {r.name: r for r in runs}
    ordered = [by_name[x] for x in order if x in by_name] or list(runs)
    rows = sample_gold(
        ordered,
        users,
        k,
        n,
        design=design,
        seed=seed if isinstance(seed, int) else 0,
        judged=judged if design in ("stratified", "active") else None,
    )
    drawn = {(r["user_id"], r["item_id"]): r for r in rows}
    redraw = (f"`recjudge gold sample --design {design} --seed {seed} --n {n} --k {k}` with "
              "the same --runs and --qrels redraws it")  # fmt: skip
    table = label_table(path)
    for r, (u, i) in enumerate(zip(table["user_id"].astype(str), table["item_id"].astype(str),
                                   strict=True), 1):  # fmt: skip
        if (u, i) not in gold.labels:
            continue
        want = drawn.get((u, i))
        if want is None:
            raise DataError(f"pair ({u!r}, {i!r}) is not one the design record draws: the file "
                            "was edited or drawn from other lists.", source=str(path), row=r,
                            field="item_id", fix=f"label the file as drawn ({redraw})")  # fmt: skip
        got, pi = gold.inclusion.get((u, i)), want.get("inclusion_prob")
        if pi is not None and (got is None or abs(got - float(pi)) > 1e-9 * max(1.0, pi)):
            raise DataError(
                f"inclusion_prob {got} of pair ({u!r}, {i!r}) is not what its design drew "
                f"({float(pi)!r}): its 1/pi weight would come from the edited value.",
                source=str(path), row=r, field="inclusion_prob",
                fix=f"restore the column ({redraw}); labels are the only column to edit",
            )  # fmt: skip
