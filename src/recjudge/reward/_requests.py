"""Judge requests from a dataset (``request_for``, ``requests_for``: a user's history before
the candidate, the candidate resolved by id or title) and their stored form
(``stored_request``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from recjudge._registry import suggest
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


def _user_history(ds: Any, user_id: str) -> Any:
    try:
        return ds.history(user_id)
    except KeyError:
        raise KeyError(_closest(user_id, ds.user_ids(), "user", ds.name)) from None


def _history_items(ds: Any, h: Any) -> list[HistoryItem]:
    from recjudge.data import item_title, render_item

    rows = ds.items.set_index("item_id").loc[h["item_id"].astype(str)].reset_index()
    return [
        HistoryItem(str(r["item_id"]), item_title(r), render_item(r, ds.domain),
                    float(rt) if rt == rt else None)
        for r, rt in zip(rows.to_dict("records"), h["rating"].tolist(), strict=True)
    ]  # fmt: skip


def _request(ds, user_id, items, candidate, sigma, meta) -> JudgeRequest:
    from recjudge.data import item_title, render_item

    if not items:
        raise ValueError(
            f"user {user_id!r} has no history before {candidate!r}; the judge needs"
            " at least one past item"
        )
    cand_row = ds.item_row(candidate).to_dict()
    return JudgeRequest(user_id, items, candidate, render_item(cand_row, ds.domain),
                        item_title(cand_row), sigma, ds.domain, meta or {})  # fmt: skip


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
    h = _user_history(ds, user_id)
    candidate = _resolve_candidate(ds, candidate)
    ids = h["item_id"].astype(str)
    if history == "before" and (ids == candidate).any():
        t = h.loc[ids == candidate, "timestamp"].iloc[0]
        pos = int(np.flatnonzero((ids == candidate).to_numpy())[0])
        h = h[(h["timestamp"] < t) | ((h["timestamp"] == t) & (np.arange(len(h)) < pos))]
    h = h[h["item_id"].astype(str) != candidate]
    return _request(ds, user_id, _history_items(ds, h), candidate, sigma, meta)


def requests_for(
    ds: Any, pairs: Sequence[tuple[str, str]], history: str = "all"
) -> list[JudgeRequest | Exception]:
    """``request_for`` for many (user, candidate) pairs, in order; a pair that cannot be
    built comes back as its exception (KeyError / ValueError).

    A user's history is rendered once and shared by every candidate the user has not
    interacted with (those see the whole history under either ``history`` rule); a
    candidate in the history goes through ``request_for``.
    """
    shared: dict[str, tuple[set[str], list[HistoryItem]] | Exception] = {}
    out: list[JudgeRequest | Exception] = []
    for user, cand in pairs:
        user = str(user)
        try:
            if user not in shared:
                try:
                    h = _user_history(ds, user)
                    shared[user] = (set(h["item_id"].astype(str)), _history_items(ds, h))
                except KeyError as e:
                    shared[user] = e
            got = shared[user]
            if isinstance(got, Exception):
                raise got
            item = _resolve_candidate(ds, cand)
            seen, items = got
            if item in seen:
                out.append(request_for(ds, user, item, history=history))
            else:
                out.append(_request(ds, user, items, item, None, None))
        except (KeyError, ValueError) as e:
            out.append(e)
    return out
