"""A crash-safe results store: SQLite in WAL mode, one transaction per finished batch."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from recjudge._util import RunFault, json_loads

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    request TEXT NOT NULL,
    result TEXT NOT NULL,
    created REAL NOT NULL,
    digest TEXT
);
CREATE TABLE IF NOT EXISTS failures (
    key TEXT PRIMARY KEY,
    request TEXT NOT NULL,
    error TEXT NOT NULL,
    created REAL NOT NULL
);
"""


def decisions_path(store: Path) -> Path:
    """Where the unbiased decision records of a store's sweeps live: ``<store>.decisions``
    beside it (never in it: the store's rows are all judgments)."""
    return store.with_name(store.name + ".decisions")


def personas_path(store: Path) -> Path:
    """Where the user simulators' personas of a store's runs live: ``<store>.personas``
    beside it (never in it: the store's rows are all judgments)."""
    return store.with_name(store.name + ".personas")


class StoreError(RunFault, ValueError):
    """A results store that cannot be read (not SQLite, truncated, another schema)."""


def row_digest(key: str, request: str, result: str) -> str:
    """sha256 over a row's key, request and result text. It detects a row changed after it
    was written (a hand edit, a damaged page), not an attacker who recomputes it."""
    h = hashlib.sha256()
    for part in (key, request, result):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def _intact(key: str, request: str, result: str, digest: str | None) -> bool:
    # Rows written before digests existed (NULL) cannot be checked and are accepted.
    return digest is None or digest == row_digest(key, request, result)


def salvage(src: str | Path, dst: str | Path) -> tuple[int, int]:
    """Copy every readable (key, request, result) row of a damaged store ``src`` into a new
    store ``dst``; returns (rows copied, rows lost). Rows are read one by one, so one
    damaged page loses only the rows on it."""
    src, dst = Path(src), Path(dst)
    lost = 0
    try:
        db = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
        rowids = [r for (r,) in db.execute("SELECT rowid FROM results ORDER BY rowid")]
        cols = {c[1] for c in db.execute("PRAGMA table_info(results)")}
    except sqlite3.DatabaseError:
        return 0, 0  # not a database at all: nothing to read
    rows = []
    try:
        for rid in rowids:
            try:
                digest = "digest" if "digest" in cols else "NULL"
                k, req, res, dg = db.execute(
                    f"SELECT key, request, result, {digest} FROM results WHERE rowid = ?", (rid,)
                ).fetchone()
                if not _intact(k, req, res, dg):
                    raise ValueError("changed after it was written")
                rows.append((k, json_loads(req), json_loads(res)))
            except (sqlite3.DatabaseError, TypeError, ValueError):
                lost += 1
    finally:
        db.close()
    with ResultsStore(dst) as out:
        out.put_many(rows)  # one transaction for all of them
    return len(rows), lost


def repair_store(path: Path) -> str:
    """Replace a damaged store by a new one with its readable rows (the old file is kept);
    what was done, as a line."""
    fresh = path.with_name(path.name + ".repaired")
    fresh.unlink(missing_ok=True)
    copied, lost = salvage(path, fresh)
    if not fresh.exists():  # nothing readable at all (not a database): start an empty store
        ResultsStore(fresh).close()
    broken = path.with_name(path.name + ".broken")
    path.replace(broken)
    for suffix in ("-wal", "-shm"):  # they belong to the old file
        side = Path(f"{path}{suffix}")
        if side.exists():
            side.replace(f"{broken}{suffix}")
    fresh.replace(path)
    return f"repaired {path}: {copied} rows kept, {lost} unreadable (old file: {broken})"


# How the request of a row that `store import` wrote begins (its origin record, put_many's JSON).
_ORIGIN = '{"imported_from": '


class ResultsStore:
    """Results keyed by a hash of everything that changes them.

    Every ``put_many`` is one transaction, so a run killed at any point keeps exactly the
    batches it finished; rerunning skips their keys (``missing``) and ends with one row per
    request. Safe to open from several processes (WAL, busy timeout).

    Args:
        path: the SQLite file (created with its folder if missing).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise StoreError(f"results store {self.path} is a folder; name a store file "
                             "(e.g. DIR/store.sqlite)")  # fmt: skip
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
        except sqlite3.OperationalError as e:
            raise StoreError(f"results store {self.path} cannot be opened ({e}); check that "
                             "its folder is writable") from None  # fmt: skip
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            cols = {c[1] for c in self._db.execute("PRAGMA table_info(results)")}
            if "digest" not in cols:  # a store from before row digests
                self._db.execute("ALTER TABLE results ADD COLUMN digest TEXT")
            self._db.execute("SELECT key, request, result, created, digest FROM results LIMIT 1")
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise StoreError(
                f"results store {self.path} cannot be read ({e}). Salvage its readable rows "
                "with --repair (the file is kept as .broken), or remove it to start over"
            ) from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def put_many(
        self,
        rows: Iterable[tuple[str, dict[str, Any], dict[str, Any]]],
        failures: Iterable[tuple[str, dict[str, Any], str]] = (),
    ) -> int:
        """Insert (key, request, result) rows and (key, request, error) failures in one
        transaction. Existing result keys are kept; a result clears its key's failure, and a
        failure is recorded (or its error replaced) only for a key without a result."""
        now = time.time()

        def dumps(x: Any) -> str:
            return json.dumps(x, default=str, ensure_ascii=False)

        data = []
        for k, req, res in rows:
            req_s, res_s = dumps(req), dumps(res)
            data.append((k, req_s, res_s, now, row_digest(k, req_s, res_s)))
        failed = [(k, dumps(req), str(err), now) for k, req, err in failures]
        cur = self._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.executemany(
                "INSERT OR IGNORE INTO results (key, request, result, created, digest) "
                "VALUES (?, ?, ?, ?, ?)",
                data,
            )
            cur.executemany("DELETE FROM failures WHERE key = ?", [(k,) for k, *_ in data])
            cur.executemany(
                "INSERT OR REPLACE INTO failures SELECT ?, ?, ?, ? "
                "WHERE NOT EXISTS (SELECT 1 FROM results WHERE key = ?)",
                [(*f, f[0]) for f in failed],
            )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return len(data)

    def failures(self, keys: Sequence[str] | None = None) -> dict[str, str]:
        """Recorded errors by key (all of them, or those of ``keys``)."""
        if keys is None:
            return dict(self._db.execute("SELECT key, error FROM failures ORDER BY rowid"))
        out: dict[str, str] = {}
        for b in range(0, len(keys), 500):
            chunk = list(keys[b : b + 500])
            q = f"SELECT key, error FROM failures WHERE key IN ({','.join('?' * len(chunk))})"
            out.update(dict(self._db.execute(q, chunk)))
        return out

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for b in range(0, len(keys), 500):
            chunk = list(keys[b : b + 500])
            q = (
                "SELECT key, request, result, digest FROM results "
                f"WHERE key IN ({','.join('?' * len(chunk))})"
            )
            for k, req, res, digest in self._db.execute(q, chunk):
                if not _intact(k, req, res, digest):
                    raise StoreError(
                        f"results store {self.path}: the row under key {k!r} was changed "
                        "after it was written (its checksum does not match). Rerun with "
                        "--resume --repair to keep only intact rows (that one is judged "
                        "again), or remove the store"
                    )
                out[k] = json_loads(res)
        return out

    def imported(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` hold a row that ``store import`` brought from a checkpoint, so a
        summary can say what it reused. Such a row's request is the import's origin record
        (``{"imported_from": ...}``, written first), matched by its prefix in SQL: the rows'
        requests (histories) are never read into Python."""
        out: set[str] = set()
        for b in range(0, len(keys), 500):
            chunk = list(keys[b : b + 500])
            q = (
                f"SELECT key FROM results WHERE key IN ({','.join('?' * len(chunk))}) "
                "AND substr(request, 1, ?) = ?"
            )
            out.update(k for (k,) in self._db.execute(q, [*chunk, len(_ORIGIN), _ORIGIN]))
        return out

    def missing(self, keys: Sequence[str]) -> list[str]:
        have = self.get_many(keys)
        return [k for k in keys if k not in have]

    def rows(self) -> Iterable[dict[str, Any]]:
        for k, req, res, created in self._db.execute(
            "SELECT key, request, result, created FROM results ORDER BY rowid"
        ):
            yield {
                "key": k,
                "request": json_loads(req),
                "result": json_loads(res),
                "created": created,
            }

    def export_jsonl(self, path: str | Path) -> Path:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in self.rows():
                f.write(
                    json.dumps(
                        {"key": row["key"], **row["request"], **row["result"]},
                        ensure_ascii=False,
                        default=str,
                    )
                    + "\n"
                )
        tmp.replace(path)
        return path

    def export_parquet(self, path: str | Path) -> Path:
        path = Path(path)
        flat = [
            {
                "key": r["key"],
                **r["request"],
                **{
                    k: (json.dumps(v) if isinstance(v, list | dict) else v)
                    for k, v in r["result"].items()
                },
            }
            for r in self.rows()
        ]
        tmp = path.with_name(path.name + ".tmp")
        pd.DataFrame(flat).to_parquet(tmp, index=False)
        tmp.replace(path)
        return path
