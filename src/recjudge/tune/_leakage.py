"""Leakage of a tuned judge into the evaluation it serves (``recjudge judge tune``'s card).

A judge tuned on the period it is asked to judge, or on the users whose gold labels check it,
has seen the answers: its imputed metrics and its PPI/DR estimates are then optimistic. The
card of a tuned folder (``llm._card``) carries the users the tuning read (sha256 of each id)
with the latest timestamp read per user, so two rules can be checked without the log:

- **evaluated period**: an evaluated user whose held-out feedback starts before the latest
  interaction the tuning read for that user (the tuning read past the start of that user's
  evaluated future; an interaction at the very same timestamp is not counted, since a
  per-user time split puts tied interactions on both sides);
- **gold users**: a user of the gold sample whom the tuning read at all.

``impute`` checks the first (it has the feedback) and records the outcome; ``evaluate --gold``
checks the second. Either refuses in one line unless ``--allow-tuned-overlap`` is given, in
which case the report's header names it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from recjudge._util import UserFacingError, json_loads, sha256_file
from recjudge.llm import USERS_FILE, read_card, user_hash

FIX = ("tune with --exclude-users FILE (the users you evaluate or label) and --before "
       "TIMESTAMP (the start of the evaluated period), or pass --allow-tuned-overlap to go on "
       "(the report names it)")  # fmt: skip


class TunedLeakageError(UserFacingError, ValueError):
    """The judge's tuning read what the evaluation holds out (the message says what)."""


def tuning_users(model: str | Path) -> dict[str, Any] | None:
    """The users record of a tuned folder, checked against its card (None: not tuned).

    Raises:
        TunedLeakageError: the record is missing or is not the one the card lists.
    """
    card = read_card(model)
    if card is None:
        return None
    path = Path(str(model)) / USERS_FILE
    if not path.is_file() or sha256_file(path) != card.get("users_sha256"):
        raise TunedLeakageError(f"{model}: its tuning users record ({USERS_FILE}) is missing or "
                                "not the one its card lists; leakage cannot be checked. "
                                "Restore the folder or tune again")  # fmt: skip
    try:
        rec = json_loads(path.read_text(encoding="utf-8"))
        last = {str(k): float(v) for k, v in rec["last_time"].items()}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise TunedLeakageError(f"{path}: not a tuning users record; tune again") from None
    return {"last_time": last, "card": card}


def period_overlap(model: str | Path, feedback: Any, users: Iterable[str]) -> dict[str, Any] | None:
    """How many evaluated ``users`` the tuning read at or after their first held-out
    interaction in ``feedback`` (a Dataset); None when ``model`` is not a tuned folder."""
    rec = tuning_users(model)
    if rec is None:
        return None
    fb = feedback.interactions
    first = fb.groupby(fb["user_id"].astype(str), observed=True)["timestamp"].min()
    users = [str(u) for u in users]
    hit = [u for u in users if u in first.index
           and rec["last_time"].get(user_hash(u), float("-inf")) > float(first[u])]  # fmt: skip
    read = sum(user_hash(u) in rec["last_time"] for u in users)
    return {"evaluated_users": len(users), "read_by_tuning": read, "period_overlap": len(hit),
            "example": hit[0] if hit else None}  # fmt: skip


def gold_overlap(model: str | Path, gold_users: Iterable[str]) -> dict[str, Any] | None:
    """How many gold users the tuning read; None when ``model`` is not a tuned folder."""
    rec = tuning_users(model)
    if rec is None:
        return None
    gold = sorted({str(u) for u in gold_users})
    hit = [u for u in gold if user_hash(u) in rec["last_time"]]
    return {"gold_users": len(gold), "read_by_tuning": len(hit), "example": hit[0] if hit else None}


def refuse_period(found: Mapping[str, Any] | None, model: str, allow: bool) -> None:
    """Refuse a tuned judge that read evaluated users' held-out period (see the module)."""
    if found and found["period_overlap"] and not allow:
        raise TunedLeakageError(
            f"judge model {model} was tuned on the evaluated period: for "
            f"{found['period_overlap']} of the {found['evaluated_users']} evaluated users "
            f"(e.g. user {found['example']!r}) the tuning read interactions after their first "
            f"held-out one; {FIX}"
        )


def refuse_gold(found: Mapping[str, Any] | None, model: str, allow: bool) -> None:
    """Refuse a tuned judge that read users of the gold sample (see the module)."""
    if found and found["read_by_tuning"] and not allow:
        raise TunedLeakageError(
            f"judge model {model} was tuned on gold users: {found['read_by_tuning']} of the "
            f"{found['gold_users']} users of the gold sample (e.g. user {found['example']!r}) "
            f"were read by the tuning, so the gold labels do not check it independently; {FIX}"
        )
