"""Two reference profile systems built from a dataset's own genres, for a first run of
``gist verify`` before a team has profiles of its own, and as baselines beside theirs.

Written from the installed dataset on the user's machine (MovieLens' terms forbid shipping
per-user records), in the format ``read_profiles`` reads.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from recjudge._util import atomic_write_text, keep_as_backup
from recjudge.data import DataError, sample_users

__all__ = ["EXAMPLE_SYSTEMS", "example_profiles", "write_example_profiles"]

#: the systems ``example_profiles`` writes, with what each one does
EXAMPLE_SYSTEMS = {
    "genres": "each user's most frequent genres among their positive engagements",
    "popular": "the catalogue's most frequent genres, the same for every user",
}
_POSITIVE = ("explicit_positive", "implicit_positive")


def _genres(value: Any) -> list[str]:
    if not isinstance(value, str):
        return []
    return [g.strip() for g in value.split("|") if g.strip() and g.strip() != "(no genres listed)"]


def example_profiles(
    ds: Any,
    users: int = 3,
    interests: int = 3,
    cite: int = 5,
    min_history: int = 20,
    seed: int = 0,
) -> dict[str, list[dict[str, Any]]]:
    """Profiles of ``users`` users (sha256 order among those with ``min_history``
    interactions) by the two systems of ``EXAMPLE_SYSTEMS``: ``interests`` genres each,
    named "<genre> <domain>", each citing the user's ``cite`` most recent items of that genre
    (positive ones for ``genres``, any for ``popular``). An interest with no such item is
    left out, so a ``popular`` profile may hold fewer.

    Raises:
        DataError: the dataset's items carry no ``genres`` (Book-Crossing).
    """
    items = ds.items
    if "genres" not in items.columns or not items["genres"].map(_genres).map(bool).any():
        raise DataError(
            "no item genres to build example profiles from.",
            source=f"dataset {ds.name!r}",
            fix="use a dataset with genres (ml-100k, ml-1m), or write your own profiles file",
        )
    genres = dict(zip(items["item_id"].astype(str), items["genres"].map(_genres), strict=True))
    lengths = ds.interactions.groupby("user_id", observed=True).size()
    eligible = [str(u) for u, n in lengths.items() if n >= min_history]
    chosen = sample_users(eligible, users, seed)
    catalogue = Counter(g for gs in genres.values() for g in gs)
    popular = [g for g, _ in sorted(catalogue.items(), key=lambda x: (-x[1], x[0]))][:interests]
    word = {"movies": "movies", "books": "books"}.get(ds.domain, "items")
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in EXAMPLE_SYSTEMS}
    for u in chosen:
        h = ds.history(u).iloc[::-1]  # most recent first
        ids = h["item_id"].astype(str).tolist()
        liked = [i for i, e in zip(ids, h["event_type"].astype(str), strict=True)
                 if e in _POSITIVE]  # fmt: skip
        mine = Counter(g for i in liked for g in genres.get(i, []))
        top = [g for g, _ in sorted(mine.items(), key=lambda x: (-x[1], x[0]))][:interests]
        for system, names, pool in (("genres", top, liked), ("popular", popular, ids)):
            profile = []
            for g in names:
                cited = list(dict.fromkeys(i for i in pool if g in genres.get(i, [])))[:cite]
                if cited:
                    profile.append({"name": f"{g} {word}", "object_ids": cited})
            out[system].append({"user_id": u, "interests": profile})
    return out


def write_example_profiles(
    ds: Any, out: str | Path, force: bool = False, **options: Any
) -> dict[str, Path]:
    """``example_profiles`` written to ``out/<system>.jsonl``; an existing file is refused
    unless ``force`` (a team may have edited it), and with ``force`` kept as ``FILE.bak-N``.

    Raises:
        DataError: a file is there already, or ``example_profiles``'s.
    """
    out = Path(out)
    paths = {s: out / f"{s}.jsonl" for s in EXAMPLE_SYSTEMS}
    there = [p for p in paths.values() if p.exists()]
    if there and not force:
        raise DataError(f"already there: {', '.join(p.name for p in there)}.", source=out.name,
                        fix="pass --force to write them anew (the old files are kept as "
                        "FILE.bak-N), or another --out")  # fmt: skip
    profiles = example_profiles(ds, **options)
    for p in there:
        keep_as_backup(p)
    out.mkdir(parents=True, exist_ok=True)
    for s, p in paths.items():
        atomic_write_text(p, "".join(json.dumps(r) + "\n" for r in profiles[s]))
    return paths
