"""Categorical fields for feature models: vocabularies and padded index tables.

A field is one attribute column (``gender``, ``genres``, ...). Its values are strings; a value
holding ``|`` is a set (``Comedy|Romance``), as in the data schema's ``genres``. Index 0 is
"missing or unknown", so a value never seen in training contributes nothing at scoring time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from recjudge._util import UserFacingError


class FeatureError(UserFacingError, ValueError):
    """A configured attribute column that the data does not have."""


def _values(cell: Any) -> list[str]:
    if cell is None or (not isinstance(cell, str) and pd.isna(cell)):
        return []
    text = str(cell).strip()
    return [v for v in (p.strip() for p in text.split("|")) if v]


@dataclass
class Field:
    """One attribute column: its vocabulary (index 0 = missing/unknown)."""

    name: str
    vocab: list[str]

    @classmethod
    def fit(cls, name: str, column: pd.Series) -> Field:
        seen = sorted({v for cell in column for v in _values(cell)})
        return cls(name, seen)

    @property
    def size(self) -> int:
        return len(self.vocab) + 1

    def encode(self, column: Sequence[Any]) -> np.ndarray:
        """``[rows, width]`` indices (0-padded), width = the most values in one cell (>= 1)."""
        index = {v: i + 1 for i, v in enumerate(self.vocab)}
        rows = [[index.get(v, 0) for v in _values(cell)] for cell in column]
        width = max([len(r) for r in rows] + [1])
        out = np.zeros((len(rows), width), dtype=np.int64)
        for r, ids in enumerate(rows):
            out[r, : len(ids)] = ids
        return out


def fit_fields(
    table: pd.DataFrame | None, columns: Sequence[str], what: str, source: str
) -> list[Field]:
    """Fields for ``columns`` of ``table``; a missing column is an error naming it."""
    if not columns:
        return []
    if table is None:
        raise FeatureError(
            f"{source} has no {what} table, but the model uses {what} attributes "
            f"{list(columns)}. Fix: import a {what} file (`recjudge data import --{what} FILE`) "
            f"or train with no {what} attributes (config {what[:-1]}_fields: [])"
        )
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise FeatureError(
            f"{source}: the {what} table has no column(s) {missing} (it has "
            f"{sorted(map(str, table.columns))}). Fix: set the config's {what[:-1]}_fields to "
            "columns that exist"
        )
    return [Field.fit(c, table[c]) for c in columns]


def field_table(
    table: pd.DataFrame | None, key: str, ids: Sequence[str], fields: Sequence[Field]
) -> list[np.ndarray]:
    """Per field, the ``[len(ids), width]`` index table of the rows of ``ids`` (an id with no
    row gets 0s: its attributes are unknown)."""
    if not fields:
        return []
    assert table is not None
    rows = table.assign(_key=table[key].astype(str)).drop_duplicates("_key").set_index("_key")
    out = []
    for f in fields:
        column = rows[f.name].reindex(list(ids))
        out.append(f.encode(column.tolist()))
    return out


def fields_meta(fields: Sequence[Field]) -> list[dict[str, Any]]:
    return [{"name": f.name, "vocab": f.vocab} for f in fields]


def fields_from_meta(meta: Sequence[dict[str, Any]]) -> list[Field]:
    return [Field(m["name"], list(m["vocab"])) for m in meta]
