"""Judge requests from a dataset (``request_for``, ``requests_for``: a user's history before
the candidate, the candidate resolved by id or title) and their stored form
(``stored_request``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from recjudge._registry import suggest
from recjudge._util import gc_paused
from recjudge.reward._judge_config import JudgeConfig
from recjudge.reward._judgment import JudgeRequest
from recjudge.reward._prompt import HistoryItem

if TYPE_CHECKING:
    pass


def stored_request(req: JudgeRequest, config: JudgeConfig) -> dict[str, Any]:
    """What the store keeps beside a judgment, for people and ``salvage`` (ids, the
    candidate's text, the history's length, the model), never in its key."""
    return {
        "user_id": req.user_id,
        "candidate_id": req.candidate_id,
        "candidate_text": req.candidate_text,
        "history_len": len(req.history),
        "model": config.model,
        "mode": config.mode,
        "beta": config.effective_beta(),
        **req.meta,
    }


# -- building requests from a dataset ----------------------------------------------------
def _closest(name: str, choices: Sequence[str], what: str, dataset: str) -> str:
    close = suggest(name, list(choices))
    hint = f" Closest matches: {', '.join(repr(c) for c in close)}." if close else ""
    return f"{what} {name!r} is not in dataset {dataset!r}.{hint}"


def _resolve_candidate(ds: Any, candidate: str) -> str:
    """An item id from an item id or an exact title (KeyError / ValueError otherwise)."""
    if ds.has_item(candidate):
        return candidate
    by_title = ds.items.index[ds.items["title"].astype(str) == candidate]
    if len(by_title) > 1:
        ids = ds.items.iloc[by_title[:5]]["item_id"].astype(str).tolist()
        raise ValueError(
            f"title {candidate!r} names {len(by_title)} items in dataset {ds.name!r} "
            f"(ids {', '.join(repr(i) for i in ids)}); give the item id instead"
        )
    if len(by_title):
        return str(ds.items.iloc[by_title[0]]["item_id"])
    titles = ds.items["title"].astype(str).tolist()
    raise KeyError(_closest(candidate, titles, "item", ds.name))


def _of_user(read: Callable[[str], Any], ds: Any, user_id: str) -> Any:
    """``read(user_id)`` (``ds.history`` or ``ds.history_columns``); an unknown user's
    KeyError names the closest ids."""
    try:
        return read(user_id)
    except KeyError:
        raise KeyError(_closest(user_id, ds.user_ids(), "user", ds.name)) from None


def history_items(ds: Any, h: Any) -> list[HistoryItem]:
    """The history rows ``h`` as prompt items (each item rendered once per dataset)."""
    # str() per value, not Series.astype(str): that builds a string dtype per call, which
    # was a third of building a batch's requests
    return _items_of(ds, [str(i) for i in h["item_id"].tolist()], h["rating"].tolist())


def _items_of(ds: Any, ids: list[str], ratings: list[Any]) -> list[HistoryItem]:
    """Prompt items of a history's item ids and ratings (NaN: none)."""
    return [HistoryItem(i, title, text, float(rt) if rt == rt else None)
            for i, (title, text), rt in zip(ids, ds.rendered_many(ids), ratings,
                                            strict=True)]  # fmt: skip


def request_of(ds, user_id, items, candidate, sigma=None, meta=None) -> JudgeRequest:
    """The request for ``candidate`` against the prompt items ``items`` (``history_items``)
    of ``user_id`` in ``ds``.

    Raises:
        ValueError: an empty history (the judge needs at least one past item).
    """
    if not items:
        raise ValueError(
            f"user {user_id!r} has no history before {candidate!r}; the judge needs"
            " at least one past item"
        )
    title, text = ds.rendered(candidate)
    return JudgeRequest(user_id, items, candidate, text, title, sigma, ds.domain,
                        meta or {})  # fmt: skip


def _shown(ids: np.ndarray, ts: np.ndarray, candidate: str, history: str) -> np.ndarray:
    """Which of a user's history rows (``ids``, ``ts`` oldest first) a request for
    ``candidate`` shows: ``before``: those before the candidate's first interaction if the
    user had one (ties in time: earlier rows), else all; ``all``: all; never the candidate."""
    hit = ids == candidate
    keep = ~hit
    if history == "before" and hit.any():
        pos = int(np.flatnonzero(hit)[0])
        t = ts[pos]
        keep &= (ts < t) | ((ts == t) & (np.arange(len(ids)) < pos))
    return keep


def request_for(
    ds: Any,
    user_id: str,
    candidate: str,
    sigma: float | None = None,
    history: str = "before",
    meta: dict[str, Any] | None = None,
) -> JudgeRequest:
    """A request for ``user_id`` and ``candidate`` (an item id or exact title) in ``ds``.

    Args:
        history: ``before``: the user's items before the candidate's timestamp if the user
            interacted with it, else all of them; ``all``: everything except the candidate.
    """
    user_id = str(user_id)
    h = _of_user(ds.history, ds, user_id)
    candidate = _resolve_candidate(ds, candidate)
    ids = h["item_id"].astype(str).to_numpy()
    h = h[_shown(ids, h["timestamp"].to_numpy(), candidate, history)]
    return request_of(ds, user_id, history_items(ds, h), candidate, sigma, meta)


def requests_for(
    ds: Any, pairs: Sequence[tuple[str, str]], history: str = "all"
) -> list[JudgeRequest | Exception]:
    """``request_for`` for many (user, candidate) pairs, in order; a pair that cannot be
    built comes back as its exception (KeyError / ValueError).

    A user's history is rendered once and shared by every candidate the user has not
    interacted with (those see the whole history under either ``history`` rule); a
    candidate in the history gets the rows ``request_for`` would show, taken from it.
    """
    with gc_paused():  # a burst of history items (see gc_paused)
        return _requests_for(ds, pairs, history)


def _requests_for(
    ds: Any, pairs: Sequence[tuple[str, str]], history: str
) -> list[JudgeRequest | Exception]:
    shared: dict[str, Any] = {}
    out: list[JudgeRequest | Exception] = []
    # the candidates rendered in one pass over the item table (one at a time, a cold batch
    # spent most of its time reading rows)
    ds.rendered_many([c for c in dict.fromkeys(str(c) for _, c in pairs) if ds.has_item(c)])
    for user, cand in pairs:
        user = str(user)
        try:
            if user not in shared:
                try:
                    ids, ts, ratings = _of_user(ds.history_columns, ds, user)
                    shared[user] = (ids, ts, set(ids), _items_of(ds, ids, ratings))
                except KeyError as e:
                    shared[user] = e
            got = shared[user]
            if isinstance(got, Exception):
                raise got
            item = _resolve_candidate(ds, cand)
            ids, ts, seen, items = got
            if item in seen:
                keep = _shown(np.array(ids, dtype=object), ts, item, history)
                shown = [x for x, k in zip(items, keep.tolist(), strict=True) if k]
                out.append(request_of(ds, user, shown, item, None, None))
            else:
                out.append(request_of(ds, user, items, item, None, None))
        except (KeyError, ValueError) as e:
            out.append(e)
    return out
