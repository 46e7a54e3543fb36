"""The interaction schema every evaluator reads, the Dataset bundle and input validation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow

from recjudge._registry import suggest
from recjudge._util import UserFacingError, atomic_dir, json_loads
from recjudge.data._render import item_title, render_item

EVENT_TYPES: tuple[str, ...] = (
    "explicit_positive",
    "implicit_positive",
    "implicit_negative",
    "explicit_negative",
)
INTERACTION_COLUMNS: tuple[str, ...] = ("user_id", "item_id", "timestamp", "rating", "event_type")
POSITIVE_EVENTS = frozenset({"explicit_positive", "implicit_positive"})


# The domains a dataset can declare: they choose the prompts' words and the item rendering
# (``recjudge.reward``'s prompt words are keyed by the same names).
DOMAINS = ("movies", "books", "generic")


class DataError(UserFacingError, ValueError):
    """Bad input data. The message names the file, row and field, and how to fix it.

    Attributes:
        source: the file (or logical table) the problem is in.
        row: 1-based data row (excluding the header), when one row is at fault.
        field: the column at fault.
        fix: what the user can do about it.
    """

    def __init__(
        self,
        problem: str,
        *,
        source: str,
        row: int | None = None,
        field: str | None = None,
        fix: str = "",
    ) -> None:
        self.source, self.row, self.field, self.fix, self.problem = source, row, field, fix, problem
        where = source
        if row is not None:
            where += f", row {row}"
        if field is not None:
            where += f", field {field!r}"
        msg = f"{where}: {problem}"
        if fix:
            msg += f" Fix: {fix}"
        super().__init__(msg)


def _first_bad(mask: pd.Series) -> int:
    """1-based position of the first True in ``mask``."""
    return int(np.flatnonzero(mask.to_numpy())[0]) + 1


def validate_interactions(
    df: pd.DataFrame,
    source: str,
    item_ids: pd.Index | None = None,
    allow_duplicates: bool = False,
) -> pd.DataFrame:
    """Check an interactions frame against the schema and return it with canonical dtypes.

    Raises:
        DataError: for a missing column, a non-numeric rating or timestamp, an unknown event
            type, an item with no item row, an empty id, or duplicate rows.
    """
    if len(df) == 0:
        raise DataError(
            "no interactions (the file has a header but no data rows).",
            source=source,
            fix="check that this is the right file and that it was written completely.",
        )
    missing = [c for c in INTERACTION_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(
            f"missing column(s) {missing}; found {list(df.columns)}.",
            source=source,
            field=missing[0],
            fix="rename the columns or pass a column mapping (e.g. --mapping user_id=uid).",
        )
    out = df.loc[
        :, list(INTERACTION_COLUMNS) + [c for c in df.columns if c not in INTERACTION_COLUMNS]
    ].copy()
    _check_ids(out, source)
    _check_numbers(out, source)
    et = out["event_type"].astype("string")
    unknown = ~et.isin(EVENT_TYPES)
    if unknown.any():
        r = _first_bad(unknown)
        raise DataError(
            f"unknown event type {et.iloc[r - 1]!r}; expected one of {list(EVENT_TYPES)}.",
            source=source,
            row=r,
            field="event_type",
            fix="map your labels onto these four with --events "
            "'click=implicit_positive,buy=explicit_positive,...' (Python: event_map=).",
        )
    out["event_type"] = pd.Categorical(et, categories=list(EVENT_TYPES))
    if item_ids is not None:
        orphan = ~out["item_id"].isin(item_ids)
        if orphan.any():
            r = _first_bad(orphan)
            raise DataError(
                f"item {out['item_id'].iloc[r - 1]!r} has no row in the items table "
                f"({int(orphan.sum())} interaction(s) affected).",
                source=source,
                row=r,
                field="item_id",
                fix="add the items, or drop these interactions explicitly "
                "(--drop-orphans reports how many were removed).",
            )
    dup = out.duplicated(["user_id", "item_id", "timestamp"], keep="first")
    if dup.any() and not allow_duplicates:
        r = _first_bad(dup)
        raise DataError(
            f"duplicate interaction ({out['user_id'].iloc[r - 1]}, {out['item_id'].iloc[r - 1]}, "
            f"{out['timestamp'].iloc[r - 1]}); {int(dup.sum())} duplicate row(s) in all.",
            source=source,
            row=r,
            field="user_id,item_id,timestamp",
            fix="remove the duplicates, or pass --dedupe to keep the first of each "
            "(the count removed is reported).",
        )
    return out.reset_index(drop=True)


def _check_ids(out: pd.DataFrame, source: str) -> None:
    """``user_id`` and ``item_id`` as strings, none empty (in place)."""
    for col in ("user_id", "item_id"):
        out[col] = out[col].astype("string")
        empty = out[col].isna() | (out[col].str.strip() == "")
        if empty.any():
            raise DataError(
                "empty id.",
                source=source,
                row=_first_bad(empty),
                field=col,
                fix="every interaction needs a user and an item id.",
            )


def _check_numbers(out: pd.DataFrame, source: str) -> None:
    """``rating`` and ``timestamp`` as float64: empty is unknown (NaN); text that is no
    number, or inf, is an error naming the row (in place)."""
    for col in ("rating", "timestamp"):
        raw = out[col]
        num = pd.to_numeric(raw, errors="coerce")
        given = raw.notna() & (raw.astype("string").str.strip() != "")
        # a text that is no number, or a number that is not finite (inf, -inf)
        for bad, what, fix in (
            (num.isna() & given, "is not a number", f"make {col} numeric"),
            (num.notna() & ~np.isfinite(num.astype("float64")), "is not a finite number",
             f"give a finite {col}"),
        ):  # fmt: skip
            if bad.any():
                r = _first_bad(bad)
                raise DataError(
                    f"{col} {raw.iloc[r - 1]!r} {what}.",
                    source=source,
                    row=r,
                    field=col,
                    fix=f"{fix}, or leave it empty where unknown.",
                )
        out[col] = num.astype("float64")


@dataclass
class Dataset:
    """Interactions, items and users in one schema, with a card describing the source.

    Attributes:
        name: dataset name.
        interactions: ``user_id, item_id, timestamp, rating, event_type`` (+ extra columns).
        items: ``item_id, title`` and text fields (genres, year, author, publisher...).
        users: ``user_id`` and demographics, or None.
        card: source, licence note, counts, and what any filter removed.
        domain: ``movies``, ``books`` or ``generic`` (chooses prompts and rendering).
    """

    name: str
    interactions: pd.DataFrame
    items: pd.DataFrame
    users: pd.DataFrame | None = None
    card: dict[str, Any] = field(default_factory=dict)
    domain: str = "generic"

    def __post_init__(self) -> None:
        self.items = self.items.reset_index(drop=True)
        self._item_index = pd.Index(self.items["item_id"].astype(str))
        self._by_user: dict[str, pd.DataFrame] | None = None
        self._ordered: pd.DataFrame | None = None
        # history_columns: per user its rows' positions; item ids, timestamps, ratings
        self._columns: tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray] | None
        self._columns = None
        self._lookups = 0
        self._rendered: dict[str, tuple[str, str]] = {}
        # Where load_dataset found it (a registered name or a folder path); None if built
        # in memory. CF models record it so later commands reload the same data.
        self.location: str | None = None

    # -- lookups ------------------------------------------------------------------------
    def item_row(self, item_id: str) -> pd.Series:
        pos = self._item_index.get_loc(str(item_id))
        return self.items.iloc[pos]

    def rendered(self, item_id: str) -> tuple[str, str]:
        """``(item_title(row), render_item(row, domain))`` of an item, rendered once per
        dataset: a history is every item a user touched, and one judgment batch renders the
        same items for every candidate and user (KeyError for an unknown item)."""
        key = str(item_id)
        got = self._rendered.get(key)
        if got is None:
            row = self.item_row(key).to_dict()
            got = self._rendered[key] = (item_title(row), render_item(row, self.domain))
        return got

    def rendered_many(self, item_ids: list[str]) -> list[tuple[str, str]]:
        """``rendered`` of each of ``item_ids`` (strings), in order; the items not rendered
        yet are read from the table in one pass (a row at a time through ``iloc`` cost
        ~50 us an item: most of a cold batch's request building)."""
        memo = self._rendered
        missing = list(dict.fromkeys(i for i in item_ids if i not in memo))
        if len(missing) > 1:
            pos = self._item_index.get_indexer(missing)
            known = [(i, p) for i, p in zip(missing, pos, strict=True) if p >= 0]
            rows = self.items.iloc[[p for _, p in known]].to_dict("records")
            for (i, _), row in zip(known, rows, strict=True):
                memo[i] = (item_title(row), render_item(row, self.domain))
        return [memo.get(i) or self.rendered(i) for i in item_ids]

    def has_item(self, item_id: str) -> bool:
        return str(item_id) in self._item_index

    def user_ids(self) -> list[str]:
        return sorted(self.interactions["user_id"].astype(str).unique().tolist(), key=_id_key)

    def _sorted(self) -> pd.DataFrame:
        """The interactions by user, oldest first (stable on ties): every user's ``history``."""
        if self._ordered is None:
            self._ordered = self.interactions.sort_values(["user_id", "timestamp"],
                                                          kind="stable")  # fmt: skip
        return self._ordered

    def _groups(self) -> dict[str, pd.DataFrame]:
        if self._by_user is None:
            ordered = self._sorted()
            self._by_user = {
                str(k): g for k, g in ordered.groupby("user_id", sort=False, observed=True)
            }
        return self._by_user

    def history_columns(self, user_id: str) -> tuple[list[str], np.ndarray, list[Any]]:
        """``history(user_id)``'s item ids (as strings), timestamps and ratings (NaN where
        none), the same rows in the same order.

        Past ``SCAN_LOOKUPS`` lookups every user's columns are cut from one pass over the
        sorted table: reading a user's DataFrame column by column cost ~250 us a user, most
        of building a batch's requests (``reward.requests_for``).

        Raises:
            KeyError: the user is not in the dataset (``history``'s message).
        """
        if self._columns is None and self._lookups < self.SCAN_LOOKUPS:
            h = self.history(user_id)
            return ([str(i) for i in h["item_id"].tolist()], h["timestamp"].to_numpy(),
                    h["rating"].tolist())  # fmt: skip
        if self._columns is None:
            ordered = self._sorted()
            groups = ordered.groupby("user_id", sort=False, observed=True)
            at = {str(k): v for k, v in groups.indices.items()}
            ids = np.array([str(i) for i in ordered["item_id"].tolist()], dtype=object)
            self._columns = (at, ids, ordered["timestamp"].to_numpy(),
                             np.array(ordered["rating"].tolist(), dtype=object))  # fmt: skip
        at, ids, ts, ratings = self._columns
        pos = at.get(str(user_id))
        if pos is None:
            self.history(user_id)  # raises the KeyError with the closest ids
            raise KeyError(str(user_id))  # (not reached: the user would be in ``at``)
        return ids[pos].tolist(), ts[pos], ratings[pos].tolist()

    #: lookups answered by a scan before the per-user index is built: one judgment needs
    #: one user (a scan: ~15 ms on ML-1M), a batch needs many (the index: ~0.5 s once)
    SCAN_LOOKUPS = 4

    def history(self, user_id: str) -> pd.DataFrame:
        """The user's interactions, oldest first (stable on ties)."""
        self._lookups += 1
        if self._by_user is None and self._lookups <= self.SCAN_LOOKUPS:
            col = self.interactions["user_id"]
            if not pd.api.types.is_string_dtype(col):
                col = col.astype(str)
            rows = self.interactions[col == str(user_id)]
            if len(rows):  # the same rows in the same order as the index's group
                return rows.sort_values("timestamp", kind="stable")
        groups = self._groups()
        if str(user_id) not in groups:
            close = suggest(str(user_id), list(groups)[:100000])
            hint = f" Closest ids: {', '.join(close)}." if close else ""
            raise KeyError(f"user {user_id!r} is not in dataset {self.name!r}.{hint}")
        return groups[str(user_id)]

    def user_row(self, user_id: str) -> pd.Series | None:
        if self.users is None:
            return None
        hit = self.users[self.users["user_id"].astype(str) == str(user_id)]
        return None if hit.empty else hit.iloc[0]

    # -- summaries ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        ts = self.interactions["timestamp"]
        counts = self.interactions["event_type"].value_counts()
        return {
            "name": self.name,
            "domain": self.domain,
            "interactions": int(len(self.interactions)),
            "users": int(self.interactions["user_id"].nunique()),
            "items": int(len(self.items)),
            "items_rated": int(self.interactions["item_id"].nunique()),
            "event_types": {e: int(counts.get(e, 0)) for e in EVENT_TYPES},
            "time_range": [
                None if pd.isna(ts.min()) else float(ts.min()),
                None if pd.isna(ts.max()) else float(ts.max()),
            ],
            "card": self.card,
        }

    def with_interactions(self, interactions: pd.DataFrame, note: str | None = None) -> Dataset:
        """A copy with other interactions (e.g. after a filter), noting it in the card."""
        card = dict(self.card)
        if note:
            card["filters"] = [*card.get("filters", []), note]
        return Dataset(
            self.name,
            interactions.reset_index(drop=True),
            self.items,
            self.users,
            card,
            self.domain,
        )

    # -- persistence --------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write ``interactions/items/users.parquet`` and ``card.json`` atomically.

        Raises:
            DataError: ``path`` is an existing file (a dataset is a folder).
        """
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise DataError(
                "is a file; a dataset is written as a folder.",
                source=str(path),
                fix="pass --out a folder path (new, or a dataset folder to replace)",
            )
        with atomic_dir(path) as tmp:
            self.interactions.to_parquet(tmp / "interactions.parquet", index=False)
            self.items.to_parquet(tmp / "items.parquet", index=False)
            if self.users is not None:
                self.users.to_parquet(tmp / "users.parquet", index=False)
            (tmp / "card.json").write_text(
                json.dumps(
                    {"name": self.name, "domain": self.domain, "card": self.card},
                    indent=2,
                    default=str,
                )
            )
        return path

    @classmethod
    def load(cls, path: str | Path) -> Dataset:
        """Read a folder written by ``save``.

        Raises:
            DataError: a missing, unreadable or incomplete file, named.
        """
        path = Path(path)
        users = path / "users.parquet"
        current = path / "card.json"
        try:
            meta = json_loads(current.read_text())
            current = path / "interactions.parquet"
            inter = pd.read_parquet(current)
            inter["event_type"] = _event_types(inter["event_type"])
            current = path / "items.parquet"
            items = pd.read_parquet(current)
            current = users
            user_table = pd.read_parquet(users) if users.exists() else None
            current = path / "card.json"
            return cls(meta["name"], inter, items, user_table, meta["card"], meta["domain"])
        except (OSError, ValueError, KeyError, TypeError, pyarrow.ArrowException) as e:
            raise DataError(
                f"cannot read this dataset folder ({type(e).__name__}: {e}).",
                source=str(current),
                fix="write the folder again (Dataset.save, or the command that made it); for "
                "a built-in dataset's cache, delete it and it is rebuilt.",
            ) from None


def _event_types(col: pd.Series) -> pd.Categorical:
    """``col`` as the event-type categorical (``EVENT_TYPES`` order; anything else, missing
    values included, is missing), mapped by its distinct values: converting ML-1M's million
    rows to strings one by one took ~0.6 s of its ~0.9 s load."""
    names = list(EVENT_TYPES)
    codes, uniques = pd.factorize(col)  # missing values get code -1
    lookup = [names.index(str(u)) if str(u) in names else -1 for u in uniques]
    return pd.Categorical.from_codes(np.asarray(lookup + [-1], dtype=np.int64)[codes], names)


def _id_key(s: str) -> tuple[int, int | str]:
    """Sort numeric ids numerically, others lexicographically after them."""
    return (0, int(s)) if s.isdigit() else (1, s)
