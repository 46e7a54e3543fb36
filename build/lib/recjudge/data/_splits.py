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

    Users with fewer than ``min_items`` interactions stay entirely in train. With a
    ``source`` column (``recjudge augment``), only ``logged`` rows are held out and counted:
    added pseudo-positives always train.
    """
    d = _ordered(df)
    logged = d["source"].eq("logged") if "source" in d.columns else pd.Series(True, d.index)
    lg = d[logged]
    pos_from_end = lg.groupby("user_id", observed=True).cumcount(ascending=False)
    pos_from_end = pos_from_end.reindex(d.index, fill_value=2)
    size = lg.groupby("user_id", observed=True)["item_id"].size()
    size = d["user_id"].map(size).fillna(0)
    eligible = size >= min_items
    test = d[logged & eligible & (pos_from_end == 0)]
    valid = d[logged & eligible & (pos_from_end == 1)]
    train = d[~(logged & eligible & (pos_from_end <= 1))]
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


def split_past_future(
    ds: Dataset, by: str = "user-time", fraction: float = 0.2
) -> tuple[Dataset, Dataset]:
    """Past (train the recommenders, the judge's histories) and future (held-out logged
    feedback) datasets, noted in their cards.

    Args:
        by: ``user-time``: each user's last ``fraction`` of interactions (every user keeps
            one past item); ``global-time``: everything after the ``1 - fraction`` quantile
            of timestamps (users with no past item are dropped from the future, counted).
    """
    if by == "user-time":
        past, future = timeline_split(ds.interactions, fraction=fraction)
        dropped = 0
    elif by == "global-time":
        past, future = temporal_split(ds.interactions, quantile=1 - fraction)
        known = future["user_id"].isin(set(past["user_id"]))
        dropped = int((~known).sum())
        future = future[known]
    else:
        raise ValueError(f"unknown split {by!r}; use user-time or global-time")
    note = f"split {by}, fraction {fraction}"
    extra = f" ({dropped} future rows of users with no past dropped)" if dropped else ""
    return (ds.with_interactions(past, f"{note}: past"),
            ds.with_interactions(future, f"{note}: future{extra}"))  # fmt: skip
