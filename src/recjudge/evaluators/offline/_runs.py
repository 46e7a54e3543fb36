"""Recommendation runs and qrels in the formats other libraries write, with input checks.

Runs: TREC (``qid Q0 doc rank score tag``), ranx JSON (``{user: {item: score}}``), JSONL or
Parquet rows ``{user_id, item_id, score}`` (or ``rank`` instead of ``score``, as
``recjudge cf recommend`` writes). Qrels: TREC (``qid 0 doc rel``) and ranx JSON.

Documented rules for imperfect runs (each counted per file, with examples, never silent):
- a ranking is ordered by score, descending; rows with equal scores keep their file order
  (``ties`` counts rankings where that decided an order);
- an item listed twice in one ranking keeps its best-ranked entry (``duplicates``);
- users and items the dataset does not know are left out (``unknown_users``,
  ``unknown_items``): the judge has no history or text for them;
- a ranking shorter than k is used as it is (``short_lists``).
A file that cannot be parsed, or holds no ranking at all, is an error naming the file and line.

Ids in TREC files. TREC lines are whitespace-separated, so an id with a space (ML-1M's items
are titles), a tab or a newline would shift or add fields for every reader (ranx, trec_eval,
pytrec_eval, ir_measures). recjudge writes such ids percent-encoded (RFC 3986 style, UTF-8
bytes): whitespace, control characters and ``%`` itself become ``%XX``; every other id is
written as it is. recjudge's TREC readers decode ``%XX`` again, so a file it wrote reads back
identically; other tools see the encoded ids, consistently in runs and qrels. The ranx JSON
files beside them keep the ids as they are.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote

import pandas as pd

from recjudge._util import atomic_write_json, atomic_write_text, json_loads
from recjudge.data import DataError

RUN_FORMATS = ("auto", "trec", "ranx", "jsonl", "parquet")
_FIX = (
    "write the run as TREC lines 'user Q0 item rank score tag', ranx JSON "
    '{"user": {"item": score}}, or JSONL/Parquet rows with user_id, item_id and score (or rank)'
)


_TREC_UNSAFE = re.compile(r"[%\s\x00-\x1f\x7f-\x9f]")


def trec_id(value: str) -> str:
    """``value`` as one TREC field: whitespace, control characters and ``%`` percent-encoded.

    Raises:
        ValueError: an empty id (no field can hold it).
    """
    if value == "":
        raise ValueError("an empty id cannot be written as a TREC field")
    return _TREC_UNSAFE.sub(
        lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8")), value
    )


def from_trec_id(field: str) -> str:
    """The id a TREC field written by ``trec_id`` stands for (``%XX`` decoded)."""
    if "%" not in field:
        return field

    try:
        return unquote(field, errors="strict")
    except UnicodeDecodeError:  # not our encoding (another tool's id with a literal %): as is
        return field


@dataclass
class Tally:
    """Counts of what documented rules did to an input file, with up to three examples of
    each (subclasses add the counters)."""

    examples: dict[str, list[str]] = field(default_factory=dict)
    # The counters ``problems`` names, in order (each subclass lists its own).
    RULES: ClassVar[tuple[str, ...]] = ()

    def problems(self) -> str:
        """One line naming every non-zero rule count with an example (empty if none)."""
        parts = []
        for what in self.RULES:
            n = getattr(self, what)
            if n:
                parts.append(f"{n} {what.replace('_', ' ')} (e.g. {self.examples[what][0]})")
        return "; ".join(parts)

    def note(self, what: str, example: str, n: int = 1) -> None:
        setattr(self, what, getattr(self, what) + n)
        ex = self.examples.setdefault(what, [])
        if len(ex) < 3:
            ex.append(example)


@dataclass
class RunCheck(Tally):
    """What a run file held and what the documented rules did with it (counts + examples)."""

    rows: int = 0
    users: int = 0
    duplicates: int = 0
    ties: int = 0
    unknown_users: int = 0
    unknown_items: int = 0
    short_lists: int = 0
    RULES: ClassVar[tuple[str, ...]] = (
        "duplicates",
        "ties",
        "unknown_users",
        "unknown_items",
        "short_lists",
    )

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items() if k != "examples"},
                "examples": self.examples}  # fmt: skip


@dataclass
class RecRun:
    """One system's rankings: ``rankings[user] = [item, ...]`` best first, and its check."""

    name: str
    path: str
    rankings: dict[str, list[str]]
    scores: dict[str, list[float]]
    check: RunCheck
    #: ``RUN.provenance.json`` as ``recjudge cf recommend`` wrote it (None: not recorded)
    provenance: dict[str, Any] | None = None

    def top(self, k: int) -> dict[str, list[str]]:
        return {u: items[:k] for u, items in self.rankings.items()}

    def to_ranx(self, k: int, users: Iterable[str] | None = None) -> dict[str, dict[str, float]]:
        """ranx/TREC form of the top-k: score = k - rank + 1, so ranx's order is ours."""
        keep = self.rankings if users is None else {u: self.rankings.get(u, []) for u in users}
        return {u: {i: float(k - r) for r, i in enumerate(items[:k])} for u, items in keep.items()}


def _fmt_of(path: Path, fmt: str) -> str:
    if fmt not in RUN_FORMATS:
        raise DataError(f"unknown run format {fmt!r}.", source=str(path),
                        fix=f"use one of {', '.join(RUN_FORMATS)}")  # fmt: skip
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".json":
        return "ranx"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    return "trec"


def _rows_trec(path: Path) -> Iterable[tuple[int, str, str, float]]:
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 6:
            raise DataError(f"a TREC run line has 6 fields, this one {len(parts)}.",
                            source=str(path), row=n, fix=_FIX)  # fmt: skip
        try:
            score = float(parts[4])
        except ValueError:
            raise DataError(f"score {parts[4]!r} is not a number.", source=str(path), row=n,
                            field="score", fix=_FIX) from None  # fmt: skip
        yield n, from_trec_id(parts[0]), from_trec_id(parts[2]), score


def _rows_records(path: Path, records: Iterable[tuple[int, Any]]):
    for n, rec in records:
        if not isinstance(rec, dict):
            raise DataError(f"a JSON {type(rec).__name__}, not an object.", source=str(path),
                            row=n, fix=_FIX)  # fmt: skip
        for col in ("user_id", "item_id"):
            if rec.get(col) is None:
                raise DataError(f"no {col}.", source=str(path), row=n, field=col, fix=_FIX)
        if rec.get("score") is not None:
            value, col = rec["score"], "score"
        elif rec.get("rank") is not None:
            value, col = rec["rank"], "rank"
        else:
            raise DataError("neither score nor rank.", source=str(path), row=n, fix=_FIX)
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise DataError(f"{col} {value!r} is not a number.", source=str(path), row=n,
                            field=col, fix=_FIX) from None  # fmt: skip
        yield n, str(rec["user_id"]), str(rec["item_id"]), -score if col == "rank" else score


def _raw_rows(path: Path, fmt: str) -> Iterable[tuple[int, str, str, float]]:
    if fmt == "trec":
        return _rows_trec(path)
    if fmt == "jsonl":
        recs = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    recs.append((n, json_loads(line)))
                except json.JSONDecodeError as e:
                    raise DataError(f"not JSON ({e.msg}).", source=str(path), row=n,
                                    fix=_FIX) from None  # fmt: skip
        return _rows_records(path, recs)
    if fmt == "parquet":
        try:
            df = pd.read_parquet(path)
        except Exception as e:  # pyarrow raises many types for a damaged file
            raise DataError(f"cannot read Parquet ({type(e).__name__}).", source=str(path),
                            fix=_FIX) from None  # fmt: skip
        return _rows_records(path, enumerate(df.to_dict("records"), 1))
    try:
        obj = json_loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"not JSON ({e.msg}, line {e.lineno}).", source=str(path),
                        fix=_FIX) from None  # fmt: skip
    if not isinstance(obj, dict) or not all(isinstance(v, dict) for v in obj.values()):
        raise DataError("a ranx run is an object {user: {item: score}}.", source=str(path),
                        fix=_FIX)  # fmt: skip
    recs = [(n, {"user_id": u, "item_id": i, "score": s})
            for n, (u, d) in enumerate(obj.items(), 1) for i, s in d.items()]  # fmt: skip
    return _rows_records(path, recs)


def read_run(path: str | Path, fmt: str = "auto", name: str | None = None) -> RecRun:
    """Read one run file into rankings (best first), applying the module's documented rules.

    Raises:
        DataError: a missing, unparsable or empty file (names the file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(
            "no such file.",
            source=str(path),
            fix="give the path of a run file (e.g. from `recjudge cf recommend`)",
        )
    fmt = _fmt_of(path, fmt)
    try:
        rows = list(_raw_rows(path, fmt))
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 text ({e.reason}).", source=str(path), fix=_FIX) from None
    if not rows:
        raise DataError("the run holds no ranking.", source=str(path), fix=_FIX)
    check = RunCheck(rows=len(rows))
    by_user: dict[str, list[tuple[float, int, str]]] = {}
    for n, user, item, score in rows:
        if not math.isfinite(score):
            raise DataError(f"score {score} is not finite.", source=str(path), row=n,
                            field="score", fix=_FIX)  # fmt: skip
        by_user.setdefault(user, []).append((-score, n, item))
    rankings, scores = {}, {}
    for user, entries in by_user.items():
        entries.sort()  # by score descending, then file order
        seen: set[str] = set()
        items, vals = [], []
        for neg, _, item in entries:
            if item in seen:
                check.note("duplicates", f"user {user!r} item {item!r}")
                continue
            seen.add(item)
            items.append(item)
            vals.append(-neg)
        if len(set(vals)) < len(vals):
            check.note("ties", f"user {user!r}")
        rankings[user], scores[user] = items, vals
    check.users = len(rankings)
    return RecRun(name or path.stem, str(path), rankings, scores, check, _provenance(path))


def _provenance(path: Path) -> dict[str, Any] | None:
    """The run's provenance record, if one was written beside it (``cf recommend``)."""
    side = Path(f"{path}.provenance.json")
    if not side.is_file():
        return None
    try:
        rec = json_loads(side.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        raise DataError("not a provenance record (JSON written by `recjudge cf recommend`).",
                        source=str(side), fix="delete it, or write the run again with "
                        "`recjudge cf recommend`") from None  # fmt: skip
    return rec if isinstance(rec, dict) else None


def restrict_to(run: RecRun, dataset: Any, k: int | None = None) -> RecRun:
    """Top-k per user (None: whole rankings), without users/items ``dataset`` lacks;
    counts what was left out."""
    known_users = set(dataset.interactions["user_id"].astype(str).unique())
    out: dict[str, list[str]] = {}
    check = run.check
    for user, items in run.rankings.items():
        if user not in known_users:
            check.note("unknown_users", repr(user))
            continue
        keep = []
        for item in items:
            if k is not None and len(keep) == k:
                break
            if dataset.has_item(item):
                keep.append(item)
            else:
                check.note("unknown_items", f"user {user!r} item {item!r}")
        if k is not None and len(keep) < k:
            check.note("short_lists", f"user {user!r} has {len(keep)}")
        if keep:
            out[user] = keep
    if not out:
        raise DataError(
            f"no ranking names a user and item of dataset {dataset.name!r} ({check.problems()}).",
            source=run.path,
            fix="pass the --data the recommender was trained on (the ids must match)",
        )
    return RecRun(run.name, run.path, out, {u: run.scores[u][: len(v)] for u, v in out.items()},
                  check, run.provenance)  # fmt: skip


# -- qrels --------------------------------------------------------------------------------
Qrels = dict[str, dict[str, int]]


def write_qrels(qrels: Mapping[str, Mapping[str, int]], stem: str | Path) -> list[Path]:
    """Write ``stem.trec`` (``user 0 item rel``) and ``stem.json`` (ranx) atomically.

    TREC ids with whitespace, control characters or ``%`` are percent-encoded (see the module
    docstring): every line has exactly four fields whatever the ids hold, and ``read_qrels``
    gives back the ids as they were.
    """
    stem = Path(stem)
    lines = "".join(
        f"{trec_id(str(u))} 0 {trec_id(str(i))} {int(r)}\n"
        for u, d in qrels.items()
        for i, r in d.items()
    )
    trec = stem.with_suffix(".trec")
    atomic_write_text(trec, lines)
    js = stem.with_suffix(".json")
    atomic_write_json(js, {u: {i: int(r) for i, r in d.items()} for u, d in qrels.items()})
    return [trec, js]


def _relevance(value: Any) -> int:
    """A qrels relevance grade: an integer (an integral float such as 1.0 too); 1.5, inf or a
    string is refused rather than truncated."""
    integral = isinstance(value, int) or (  # bool is an int: true/false read as 1/0
        isinstance(value, float) and math.isfinite(value) and value.is_integer()
    )
    if not integral:
        raise ValueError(f"relevance {value!r} is not an integer")
    return int(value)


def read_qrels(path: str | Path) -> Qrels:
    """TREC qrels (``user 0 item rel``, ids percent-decoded) or ranx JSON, by suffix.

    Raises:
        DataError: a missing or malformed file, named with its line.
    """
    path = Path(path)
    fix = 'qrels are TREC lines \'user 0 item rel\' or ranx JSON {"user": {"item": rel}}'
    if not path.is_file():
        raise DataError("no such file.", source=str(path), fix=fix)
    out: Qrels = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 text (byte {e.start}).", source=str(path), fix=fix) from None
    if path.suffix.lower() == ".json":
        try:
            obj = json_loads(text)
            return {str(u): {str(i): _relevance(r) for i, r in d.items()} for u, d in obj.items()}
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as e:
            raise DataError(f"not ranx qrels ({e}).", source=str(path), fix=fix) from None
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 4 or not parts[3].lstrip("-").isdecimal() or not parts[3].isascii():
            raise DataError("a qrels line is 'user 0 item rel' (rel an integer).",
                            source=str(path), row=n, fix=fix)  # fmt: skip
        out.setdefault(from_trec_id(parts[0]), {})[from_trec_id(parts[2])] = int(parts[3])
    return out
