"""Splits, filters and user sampling. All deterministic; nothing is dropped silently."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from recjudge.data._schema import Dataset


@dataclass
class Split:
    """Train/validation/test interactions plus a report of what went where."""

    train: pd.DataFrame
    valid: pd.DataFrame
    test: pd.DataFrame
    report: dict[str, int] = field(default_factory=dict)


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    """Per-user chronological order; ties keep file order (stable sort)."""
    return df.reset_index(drop=True).sort_values(["user_id", "timestamp"], kind="stable")


def leave_one_out(df: pd.DataFrame, min_items: int = 4) -> Split:
    """Last interaction -> test, second last -> validation, the rest -> train.

    Users with fewer than ``min_items`` interactions stay entirely in train.
    """
    d = _ordered(df)
    pos_from_end = d.groupby("user_id", observed=True).cumcount(ascending=False)
    size = d.groupby("user_id", observed=True)["item_id"].transform("size")
    eligible = size >= min_items
    test = d[eligible & (pos_from_end == 0)]
    valid = d[eligible & (pos_from_end == 1)]
    train = d[~eligible | (pos_from_end >= 2)]
    return Split(
        train,
        valid,
        test,
        {
            "users_split": int(test["user_id"].nunique()),
            "users_train_only": int(d.loc[~eligible, "user_id"].nunique()),
        },
    )


def timeline_split(
    df: pd.DataFrame, *, fraction: float | None = None, future_count: int | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-user past/future split: the last ``fraction`` (or last ``future_count``) -> future.

    Every user keeps at least one past interaction.
    """
    if (fraction is None) == (future_count is None):
        raise ValueError("give exactly one of fraction or future_count")
    if fraction is not None and not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    d = _ordered(df)
    pos_from_end = d.groupby("user_id", observed=True).cumcount(ascending=False)
    size = d.groupby("user_id", observed=True)["item_id"].transform("size")
    if fraction is not None:
        n_future = np.floor(size * fraction).astype(int)
    else:
        n_future = pd.Series(future_count, index=d.index)
    n_future = np.minimum(n_future, size - 1)
    is_future = pos_from_end < n_future
    return d[~is_future], d[is_future]


def temporal_split(
    df: pd.DataFrame, cutoff: float | None = None, quantile: float = 0.8
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Global split: interactions before ``cutoff`` (default: the ``quantile`` of timestamps)
    -> past, the rest -> future."""
    if cutoff is None:
        cutoff = float(df["timestamp"].quantile(quantile))
    before = df["timestamp"] < cutoff
    return df[before].reset_index(drop=True), df[~before].reset_index(drop=True)


def kcore(df: pd.DataFrame, k: int = 5) -> tuple[pd.DataFrame, dict[str, int]]:
    """Iteratively keep users and items with at least ``k`` interactions.

    Returns the filtered frame and the counts removed (rows, users, items, iterations).
    """
    d = df
    rounds = 0
    while True:
        rounds += 1
        uc = d.groupby("user_id", observed=True)["item_id"].transform("size")
        ic = d.groupby("item_id", observed=True)["user_id"].transform("size")
        keep = (uc >= k) & (ic >= k)
        if keep.all():
            break
        d = d[keep]
    return d.reset_index(drop=True), {
        "rows_removed": int(len(df) - len(d)),
        "users_removed": int(df["user_id"].nunique() - d["user_id"].nunique()),
        "items_removed": int(df["item_id"].nunique() - d["item_id"].nunique()),
        "iterations": rounds,
    }


def user_order_key(user_id: str, seed: int | str = 0) -> str:
    """sha256 of (seed, id): a process-independent random order (never Python's ``hash``)."""
    return hashlib.sha256(f"{seed}\x00{user_id}".encode()).hexdigest()


def sample_users(user_ids: list[str] | pd.Series, n: int, seed: int | str = 0) -> list[str]:
    """``n`` users chosen by sha256 order; the same on every machine and process.

    Taking a larger ``n`` extends, never reshuffles, a smaller sample.
    """
    ids = sorted({str(u) for u in user_ids}, key=lambda u: user_order_key(u, seed))
    return ids[:n]


def split_dataset(ds: Dataset, min_items: int = 4) -> Split:
    return leave_one_out(ds.interactions, min_items=min_items)
