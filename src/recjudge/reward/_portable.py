"""Title-free checkpoints of a results store, to carry a long run to another machine.

A store's rows hold the requests (histories, candidate text) and answers that may cite
titles; datasets such as MovieLens forbid redistributing those, and on ML-1M the item ids
*are* the titles. A checkpoint keeps only what the model computed and nothing that names an
item or a user:

- judgments whose answer holds no item text (read-out verdicts: no evidence, a raw answer of
  JSON punctuation and the words ``evidence``/``is_relevant``/``YES``/``NO`` only), without
  their user and candidate ids;
- the unbiased decision records beside the store (``<store>.decisions``: branch names and the
  scores at each decision step), from which every bias setting is replayed without the model.

Rows that would carry text (answers with evidence) are left out and counted, so the run
judges them again. An evaluator's question (``StoredAsk``) is exported only through the
title-free form it declared when it was stored (``StoredAsk.portable``: e.g. an arena
comparison's verdicts and probabilities without its free-text analyses, a GISTBench judge's
closed answer, or a GISTBench interest list whose phrases name no title of the user's
history, ``recjudge.data.TitleScreen``); an answer whose form is ``None`` and other free-text
answers (personas, summaries) are left out.

A row is tied to its request by its key alone (a sha256 over the prompt version, the
settings, the dtype, the request's ids, texts and history), so an imported row is used
exactly when a later run asks the same question with the same settings; a judgment whose key
names a CF model is reused only if that model is identical (a retrained one gives new keys,
and its verdicts are replayed from the decision records). ``Judge.judge_many``
puts the request's ids back when it reads an imported judgment.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recjudge._util import UserFacingError

PORTABLE_FORMAT = "recjudge-portable-store"
PORTABLE_VERSION = 1
# An answer of JSON punctuation and the schema's own words names no item.
_SKELETON = re.compile(r'(?:[\s{}\[\]":,]|evidence|is_relevant|YES|NO)*')
_IDS = ("user_id", "candidate_id")


class PortableError(UserFacingError, ValueError):
    """A checkpoint file that is not one (another format, version or a damaged line)."""


@dataclass(frozen=True)
class PortableCount:
    """What an export or import did.

    Attributes:
        results / decisions: judgments and decision records written.
        left_out: rows not exported because their answer holds item text (judged again).
        present: rows an import skipped because the store already had their key.
    """

    results: int
    decisions: int
    left_out: int = 0
    present: int = 0


def _title_free(text: Any) -> bool:
    return isinstance(text, str) and _SKELETON.fullmatch(text) is not None


def portable_result(result: dict[str, Any]) -> dict[str, Any] | None:
    """A judgment without its ids, an evaluator answer's declared title-free form, or None
    if the answer holds item text."""
    from recjudge.reward._stored import PORTABLE_FORM

    if PORTABLE_FORM in result:  # declared by the question itself (StoredAsk.portable)
        form = result[PORTABLE_FORM]
        return {**form, PORTABLE_FORM: form} if isinstance(form, dict) else None
    if "value" in result:  # an evaluator's answer with no declared form: free text
        return None
    if (
        result.get("evidence")
        or result.get("evidence_ids")
        or not _title_free(result.get("raw_text"))
    ):
        return None
    return {k: v for k, v in result.items() if k not in (*_IDS, "evidence", "evidence_ids")}


def portable_decision(record: dict[str, Any]) -> dict[str, Any] | None:
    """A decision record (numbers and branch names), or None if its answer text names items."""
    return record if _title_free(record.get("text", "")) else None


def export_portable(store: str | Path, out: str | Path) -> PortableCount:
    """Write the title-free rows of ``store`` (and of ``<store>.decisions`` if it exists)
    to ``out`` (gzip JSON lines; a header line, then one row per line)."""
    from recjudge._util import atomic_write_bytes
    from recjudge.reward._store import ResultsStore, decisions_path

    store = Path(store)
    if not store.exists():
        raise PortableError(f"{store}: no such results store; pass the store.sqlite of a run")
    lines: list[str] = []
    counts = {"results": 0, "decisions": 0, "left_out": 0}
    tables = [("results", store, portable_result)]
    decisions = decisions_path(store)
    if decisions.exists():
        tables.append(("decisions", decisions, portable_decision))
    for table, path, keep in tables:
        with ResultsStore(path) as s:
            for row in s.rows():
                got = keep(row["result"])
                if got is None:
                    counts["left_out"] += 1
                    continue
                lines.append(json.dumps({"table": table, "key": row["key"], "result": got}))
                counts[table] += 1
    header = {"format": PORTABLE_FORMAT, "version": PORTABLE_VERSION, **counts}
    body = "\n".join([json.dumps(header), *lines]) + "\n"
    atomic_write_bytes(Path(out), gzip.compress(body.encode("utf-8"), mtime=0))
    return PortableCount(**counts)


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        text = gzip.decompress(path.read_bytes()).decode("utf-8")
    except FileNotFoundError:
        raise PortableError(
            f"{path}: no such file; pass a file `recjudge store export` wrote"
        ) from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise PortableError(f"{path}: not a gzip checkpoint ({e}); export it again") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise PortableError(f"{path}, line {n}: not JSON ({e.msg}); export it again") from None
    head = rows[0] if rows else {}
    if head.get("format") != PORTABLE_FORMAT or head.get("version") != PORTABLE_VERSION:
        raise PortableError(
            f"{path}: not a recjudge checkpoint of version {PORTABLE_VERSION} (header "
            f"{str(head)[:80]!r}); write it with `recjudge store export`"
        )
    for n, row in enumerate(rows[1:], 2):
        ok = isinstance(row, dict) and row.get("table") in ("results", "decisions")
        if not ok or not isinstance(row.get("key"), str) or not isinstance(row.get("result"), dict):
            raise PortableError(f"{path}, line {n}: not a checkpoint row; export it again")
    return rows[1:]


def import_portable(path: str | Path, store: str | Path) -> PortableCount:
    """Add a checkpoint's rows to ``store`` and ``<store>.decisions`` (created if missing);
    keys the store already has are kept as they are. Judgments are written without ids
    (``user_id``/``candidate_id`` null): the judge fills them from the request that asks
    for the key."""
    from recjudge.reward._store import ResultsStore, decisions_path
    from recjudge.reward._stored import PORTABLE_FORM

    path, store = Path(path), Path(store)
    rows = _read(path)
    origin = {"imported_from": path.name}
    written = {"results": 0, "decisions": 0}
    present = 0
    targets = {"results": store, "decisions": decisions_path(store)}
    for table, target in targets.items():
        mine = [r for r in rows if r["table"] == table]
        if not mine:
            continue
        with ResultsStore(target) as s:
            have = s.get_many([r["key"] for r in mine])
            new = []
            for r in mine:
                if r["key"] in have:
                    present += 1
                    continue
                res = r["result"]
                if table == "results" and PORTABLE_FORM not in res:  # a judgment
                    res = {**res, "user_id": None, "candidate_id": None, "evidence": []}
                new.append((r["key"], origin, res))
            written[table] = s.put_many(new)
    return PortableCount(written["results"], written["decisions"], 0, present)
