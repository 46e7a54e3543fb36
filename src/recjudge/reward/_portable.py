"""Title-free checkpoints of a results store, to carry a long run to another machine.

A store's rows hold the requests (histories, candidate text) and answers that may cite
titles; datasets such as MovieLens forbid redistributing those, and on ML-1M the item ids
*are* the titles. A checkpoint keeps only what the model computed and nothing that names an
item or a user:

- judgments whose answer holds no item text (read-out verdicts: no evidence, a raw answer of
  JSON punctuation and the words ``evidence``/``is_relevant``/``YES``/``NO`` only), without
  their user and candidate ids;
- the unbiased decision records beside the store (``<store>.decisions``: branch names and the
  scores at each decision step), from which every bias setting is replayed without the model;
- the user simulators' personas beside the store (``<store>.personas``) that name no title of
  the history they were written from (``reward._simulators.title_free_persona``), so a
  simulator run longer than one sitting does not write them all again.

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
import hashlib
import hmac
import io
import json
import math
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recjudge import __version__
from recjudge._signing import TRUSTED_KEYS_ENV, SignatureError, sign, trusted_keys, verify
from recjudge._util import UserFacingError, atomic_write_bytes, json_loads
from recjudge.reward._store import ResultsStore, decisions_path, personas_path
from recjudge.reward._stored import PORTABLE_FORM

PORTABLE_FORMAT = "recjudge-portable-store"
PORTABLE_VERSION = 2  # 2: a manifest with a digest (and an optional signature) in the header
KEY_ENV = "RECJUDGE_CHECKPOINT_KEY"
#: the header field of a checkpoint's Ed25519 signature (``recjudge._signing``)
ED25519 = "ed25519"
#: what that signature signs: this prefix and the manifest digest (never a model card's)
CHECKPOINT_PURPOSE = "recjudge-checkpoint"
MAX_INFLATED = 512 * 2**20  # bytes a checkpoint may inflate to (the largest committed: 37 MB)
MAX_LINE = 4 * 2**20  # bytes of one row
MAX_PERSONA = 20_000  # characters of one imported persona (ours: at most persona_tokens tokens)
#: chat-template markup (ChatML/Llama 3/Phi ``<|...|>``, Llama 2/Mistral ``[INST]``,
#: ``<<SYS>>``, ``<s>``): a persona is a description of a user, never a turn of a chat. It
#: would be escaped where it is used (``escape_special``), but a persona holding it is neither
#: exported nor imported: it is what a forged checkpoint looks like.
CHAT_MARKUP = re.compile(r"<\|[^<>|\s]{1,48}\|>|\[/?INST\]|<</?SYS>>|</?s>")
TABLES = ("results", "decisions", "personas")
# An answer of JSON punctuation and the schema's own words names no item.
_SKELETON = re.compile(r'(?:[\s{}\[\]":,]|evidence|is_relevant|YES|NO)*')
_IDS = ("user_id", "candidate_id")
_KEY = re.compile(r"[!-~]{1,128}")  # printable ASCII, no space (ours: 16-32 hex digits)


#: the manifest field that marks a checkpoint resealed from a file that did not verify
#: (``store reseal --trust-unsigned``): covered by its digest like every field, and kept by
#: every later reseal, so such a file needs ``--trust-unsigned`` at every import
RESEALED = "resealed_unverified"


class PortableError(UserFacingError, ValueError):
    """A checkpoint file that is not one (another format, version or a damaged line), or one
    that fails its integrity check (modified, truncated, oversized, a row of the wrong shape)."""


@dataclass(frozen=True)
class PortableCount:
    """What an export or import did.

    Attributes:
        results / decisions: judgments and decision records written.
        personas: title-free simulator personas written (``<store>.personas``).
        left_out: rows not exported because their answer holds item text (judged again).
        present: rows an import skipped because the store already had their key.
        conflicts: of those, rows whose answer differs from the store's (the store's is kept;
            a checkpoint never changes a verdict a store already holds).
        verified: how an import checked the file: ``signed`` (Ed25519 by a key of
            ``$RECJUDGE_TRUSTED_KEYS``, or the legacy HMAC with
            ``$RECJUDGE_CHECKPOINT_KEY``), ``digest`` (its sha256 manifest matched) or
            ``unverified`` (``trust_unsigned``: a file without a manifest, or one that failed it).
    """

    results: int
    decisions: int
    left_out: int = 0
    present: int = 0
    conflicts: int = 0
    verified: str = ""
    personas: int = 0


def _title_free(text: Any) -> bool:
    return isinstance(text, str) and _SKELETON.fullmatch(text) is not None


def portable_result(result: dict[str, Any]) -> dict[str, Any] | None:
    """A judgment without its ids, an evaluator answer's declared title-free form, or None
    if the answer holds item text."""
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


def portable_persona(result: dict[str, Any]) -> dict[str, Any] | None:
    """A stored persona as it was declared title-free when written (``StoredAsk.portable``),
    or None (it names a title, or it was stored before personas declared a form)."""
    form = result.get(PORTABLE_FORM)
    if not isinstance(form, dict) or set(form) != {"text"} or form["text"] != result.get("text"):
        return None
    if isinstance(form["text"], str) and CHAT_MARKUP.search(form["text"]):
        return None
    return {**form, PORTABLE_FORM: form}


def _table_paths(store: Path) -> dict[str, Path]:
    """Each checkpoint table's file for ``store`` (the store itself, then the files beside it),
    for export and import alike."""
    return {"results": store, "decisions": decisions_path(store), "personas": personas_path(store)}


def export_portable(store: str | Path, out: str | Path) -> PortableCount:
    """Write the title-free rows of ``store`` (and of ``<store>.decisions`` and
    ``<store>.personas`` where they exist) to ``out`` (gzip JSON lines; a header line, then
    one row per line)."""
    store = Path(store)
    if not store.exists():
        raise PortableError(f"{store}: no such results store; pass the store.sqlite of a run")
    lines: list[str] = []
    counts = {"results": 0, "decisions": 0, "personas": 0, "left_out": 0}
    keeps = {"results": portable_result, "decisions": portable_decision,
             "personas": portable_persona}  # fmt: skip
    for table, path in _table_paths(store).items():
        if not path.exists():  # the store exists; the files beside it may not
            continue
        keep = keeps[table]
        with ResultsStore(path) as s:
            for row in s.rows():
                got = keep(row["result"])
                if got is None:
                    counts["left_out"] += 1
                    continue
                lines.append(json.dumps({"table": table, "key": row["key"], "result": got}))
                counts[table] += 1
    _write(Path(out), lines, counts, store.name)
    return PortableCount(**counts)


def _write(
    out: Path,
    lines: list[str],
    counts: dict[str, int],
    source: str,
    resealed: dict[str, Any] | None = None,
) -> None:
    """A checkpoint file: the manifest line (format, version, counts, producer, digest and,
    with ``$RECJUDGE_SIGNING_KEY`` set, an Ed25519 signature; with ``$RECJUDGE_CHECKPOINT_KEY``
    set, the legacy HMAC; ``resealed``: the mark of a file
    resealed from one that did not verify), then one row per line."""
    body = "".join(line + "\n" for line in lines)
    if not counts.get("personas"):  # a checkpoint without personas reads as before they existed
        counts = {k: v for k, v in counts.items() if k != "personas"}
    manifest = {
        "format": PORTABLE_FORMAT,
        "version": PORTABLE_VERSION,
        **counts,
        "rows": len(lines),
        "producer": {"recjudge": __version__, "store": source},
        **({RESEALED: resealed} if resealed else {}),
    }
    body_hash = hashlib.sha256(body.encode("utf-8"))
    header = {**manifest, "digest": "sha256:" + _combine(manifest, body_hash)}
    key = os.environ.get(KEY_ENV)
    if key:  # the shared-secret HMAC of before Ed25519 (still verified where it is set)
        header["signature"] = _sign(key, header["digest"])
    signed = sign(header["digest"], CHECKPOINT_PURPOSE)  # with $RECJUDGE_SIGNING_KEY set
    if signed is not None:
        header[ED25519] = signed
    data = (json.dumps(header) + "\n" + body).encode("utf-8")
    atomic_write_bytes(out, gzip.compress(data, mtime=0))


def reseal_portable(
    path: str | Path, out: str | Path, *, trust_unsigned: bool = False
) -> PortableCount:
    """Write a checkpoint again in the current version, with a fresh manifest (and signature
    when ``$RECJUDGE_CHECKPOINT_KEY`` is set): e.g. a version-1 file, which has no digest.
    The rows are checked as on import; a file that fails its manifest needs
    ``trust_unsigned``. The new digest then vouches only that the file is not changed after
    the reseal, not for who wrote the rows: the manifest says so (``RESEALED``), and every
    import of it needs ``trust_unsigned`` again (a reseal of a file that verified keeps it
    trusted; a reseal of a marked one keeps the mark)."""
    path = Path(path)
    rows, verified, head = _read(path, trust_unsigned=trust_unsigned, with_head=True)
    lines = [json.dumps(r) for r in rows]
    counts = _table_counts(rows)
    mark = head.get(RESEALED) if isinstance(head, dict) else None
    if verified == "unverified" and not mark:
        mark = {"from": path.name, "version": head.get("version") if isinstance(head, dict)
                else None}  # fmt: skip
    _write(Path(out), lines, {**counts, "left_out": 0}, path.name, resealed=mark or None)
    return PortableCount(
        counts["results"], counts["decisions"], verified=verified, personas=counts["personas"]
    )


def _table_counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Rows per table, as a manifest counts them."""
    return {t: sum(r["table"] == t for r in rows) for t in TABLES}


def _sign(key: str, digest: str) -> str:
    return "hmac-sha256:" + hmac.new(key.encode("utf-8"), digest.encode(), "sha256").hexdigest()


def _lines(data: bytes, path: Path, max_inflated: int) -> Iterator[tuple[int, bytes]]:
    """The inflated lines of a gzip file, streamed: never more than ``MAX_LINE`` bytes of one
    line or ``max_inflated`` in all (a small file that inflates to gigabytes is refused
    before it does)."""
    total = 0
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            n = 0
            while True:
                line = f.readline(MAX_LINE + 1)
                if not line:
                    return
                n += 1
                total += len(line)
                if total > max_inflated:
                    raise PortableError(
                        f"{path}: inflates past {max_inflated // 2**20} MiB (line {n}); a "
                        "checkpoint that large is refused. If it is really yours, raise the "
                        "limit (--max-size MB)"
                    )
                if len(line) > MAX_LINE:
                    raise PortableError(
                        f"{path}, line {n}: a row longer than {MAX_LINE // 2**20} MiB is no "
                        "checkpoint row; export it again"
                    )
                yield n, line
    except (OSError, EOFError, zlib.error) as e:
        raise PortableError(
            f"{path}: not a whole gzip checkpoint ({e}); it is damaged or truncated: copy or "
            "export it again"
        ) from None


def _num(v: Any, lo: float = -math.inf, hi: float = math.inf) -> bool:
    return (
        isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
        and lo <= v <= hi
    )


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# Each field of an exported judgment and what it must hold (read-outs only: no ids, no text).
_JUDGMENT: dict[str, Any] = {
    "mode": lambda v: isinstance(v, str) and 0 < len(v) < 64,
    "is_relevant": lambda v: isinstance(v, bool),
    "p_yes": lambda v: _num(v, 0.0, 1.0),
    "p_yes_semantic": lambda v: v is None or _num(v, 0.0, 1.0),
    "sigma": lambda v: v is None or _num(v, -1.0, 1.0),
    "delta": _num,
    "entropy": lambda v: _num(v, 0.0, 1.0 + 1e-9),
    "raw_text": _title_free,
    "decision_steps": _count,
    "history_shown": _count,
    "history_dropped": _count,
    "samples_yes": lambda v: v is None or _count(v),
    "key": lambda v: isinstance(v, str),
    "error": lambda v: v is None,
}
_JUDGMENT_NEEDS = ("mode", "is_relevant", "p_yes", "raw_text")
_DECISION: dict[str, Any] = {
    "branches": lambda v: (
        isinstance(v, list) and len(v) >= 2 and all(isinstance(b, str) for b in v)
    ),
    "chosen": lambda v: v is None or isinstance(v, str),
    "steps": lambda v: isinstance(v, list),
    "text": _title_free,
    "shown": _count,
    "dropped": _count,
}


def _bad_field(result: dict[str, Any], schema: dict[str, Any], needs: tuple[str, ...]):
    for name in needs:
        if name not in result:
            return name, "is missing"
    for name, value in result.items():
        if name not in schema:
            return name, "is no field of this kind of row"
        if not schema[name](value):
            return name, f"holds {str(value)[:40]!r}, outside what it can be"
    return None


def check_row(row: Any) -> str | None:
    """Why a checkpoint row does not have the shape of what it claims to be, or None.

    A judgment (table ``results``) has the read-out fields of ``Judgment`` and nothing else;
    its verdict agrees with its own answer text. An evaluator's answer holds its declared
    title-free form and nothing beside it. A decision record (``decisions``) has branch names,
    the chosen branch among them and the scores per step. A persona (``personas``) is one
    text of at most ``MAX_PERSONA`` characters in its declared form (it reaches prompts only
    through the chat rendering, which escapes special-token strings).
    """
    if not isinstance(row, dict) or set(row) != {"table", "key", "result"}:
        return "a row is an object with exactly table, key and result"
    table, key, result = row["table"], row["key"], row["result"]
    if table not in TABLES:
        return f"table {str(table)[:20]!r} is none of {', '.join(TABLES)}"
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        return f"key {str(key)[:40]!r} is not a result key (1-128 printable characters)"
    if not isinstance(result, dict):
        return "result is not an object"
    return _ROW_CHECKS[table](result)


def _check_decision(result: dict[str, Any]) -> str | None:
    bad = _bad_field(result, _DECISION, ("branches", "steps"))
    if bad:
        return f"decision field {bad[0]!r} {bad[1]}"
    if result.get("chosen") is not None and result["chosen"] not in result["branches"]:
        return f"decision chosen {result['chosen']!r} is none of its branches"
    return None


def _check_persona(result: dict[str, Any]) -> str | None:
    form = result.get(PORTABLE_FORM)
    text = form.get("text") if isinstance(form, dict) else None
    markup = CHAT_MARKUP.search(text) if isinstance(text, str) else None
    if markup:
        return f"a persona holds chat markup ({markup.group()!r})"
    if not isinstance(text, str) or portable_persona(result) != result:
        return "a persona is exactly {text, portable_form: {text}}"
    if len(text) > MAX_PERSONA:
        return f"a persona of {len(text)} characters is longer than {MAX_PERSONA}"
    return None


def _check_result(result: dict[str, Any]) -> str | None:
    """A judgment, or an evaluator's answer (its declared portable form and nothing else)."""
    if PORTABLE_FORM in result:
        form = result[PORTABLE_FORM]
        if not isinstance(form, dict) or {**form, PORTABLE_FORM: form} != result:
            return "an evaluator answer holds exactly its declared portable form"
        return None
    bad = _bad_field(result, _JUDGMENT, _JUDGMENT_NEEDS)
    if bad:
        return f"judgment field {bad[0]!r} {bad[1]}"
    said = _said_verdict(result["raw_text"])
    if said is not None and said != result["is_relevant"]:
        return f"judgment is_relevant {result['is_relevant']} contradicts its own answer text"
    return None


#: each table's row check (``check_row``)
_ROW_CHECKS = {"results": _check_result, "decisions": _check_decision,
               "personas": _check_persona}  # fmt: skip


def _said_verdict(text: str) -> bool | None:
    """The verdict an evidence-first (or plain) answer text commits to, if it got that far."""
    compact = re.sub(r"\s", "", text)
    if '"is_relevant":"YES"' in compact or compact.startswith('{"evidence":["'):
        return True
    if '"is_relevant":"NO"' in compact or compact.startswith('{"evidence":[]'):
        return False
    return None


def _checkpoint_bytes(path: Path, max_inflated: int) -> bytes:
    """The file's bytes, refused in one line when it is missing, a folder, over the size
    bound or a results store (not a checkpoint)."""
    try:
        size = path.stat().st_size
        if size > max_inflated:
            raise PortableError(
                f"{path}: {size // 2**20} MiB compressed is over the {max_inflated // 2**20} MiB "
                "limit; if it is really yours, raise the limit (--max-size MB)"
            )
        data = path.read_bytes()
    except FileNotFoundError:
        raise PortableError(
            f"{path}: no such file; pass a file `recjudge store export` wrote"
        ) from None
    except IsADirectoryError:
        raise PortableError(
            f"{path}: a folder; pass a file `recjudge store export` wrote"
        ) from None
    if data.startswith(b"SQLite format 3"):
        raise PortableError(
            f"{path}: a results store, not a checkpoint; write one from it with `recjudge "
            f"store export {path} --out FILE.ckpt.gz`"
        )
    return data


def _manifest(path: Path, first: tuple[int, bytes] | None) -> dict[str, Any]:
    """The first line as a recjudge checkpoint's manifest, or one line refusing the file."""
    try:
        head = json_loads(first[1]) if first else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        head = {}
    if not isinstance(head, dict) or head.get("format") != PORTABLE_FORMAT:
        raise PortableError(
            f"{path}: not a recjudge checkpoint (first line {str(head)[:60]!r}); write it with "
            "`recjudge store export`"
        )
    return head


def _read(
    path: Path,
    *,
    trust_unsigned: bool = False,
    max_inflated: int = MAX_INFLATED,
    with_head: bool = False,
) -> Any:
    """A checkpoint's rows, after checking its manifest and every row; and how it was verified
    (and, ``with_head``, the manifest).

    The file is read whole (its compressed size is bounded too) and inflated as a stream,
    within ``max_inflated`` bytes.
    """
    lines = _lines(_checkpoint_bytes(path, max_inflated), path, max_inflated)
    head = _manifest(path, next(lines, None))
    version = head.get("version")
    if version not in (1, PORTABLE_VERSION):
        raise PortableError(
            f"{path}: checkpoint version {str(version)[:10]}; this recjudge reads versions 1 "
            f"and {PORTABLE_VERSION}: export it again with this recjudge"
        )
    h = hashlib.sha256()
    rows: list[dict[str, Any]] = []
    for n, line in lines:
        h.update(line)
        try:
            row = json_loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PortableError(f"{path}, line {n}: not JSON ({e}); export it again") from None
        why = check_row(row)
        if why:
            raise PortableError(
                f"{path}, line {n}: {why}; the checkpoint is refused whole (nothing imported). "
                "Export it again from the store that made it"
            )
        rows.append(row)
    verified = _verify(path, head, version, h, rows, trust_unsigned)
    return (rows, verified, head) if with_head else (rows, verified)


def _verify(path, head, version, body_hash, rows, trust_unsigned: bool) -> str:
    """``signed``/``digest`` if the manifest holds; else refuse, or ``unverified`` when the
    caller trusts unsigned files."""
    trust = (
        "; pass --trust-unsigned only if you know where the file came from and that nobody "
        "edited it"
    )
    problem = None
    if version == 1:
        problem = "was written before checkpoints carried a digest: re-export it with `recjudge "
        problem += "store export` on the machine that has the store"
    else:
        manifest = {k: v for k, v in head.items() if k not in ("digest", "signature", ED25519)}
        got = "sha256:" + _combine(manifest, body_hash)
        counts = _table_counts(rows)
        # A manifest from before personas were exported has no count for them (none).
        if head.get("rows") != len(rows) or any(
            head.get(t, 0 if t == "personas" else None) != c for t, c in counts.items()
        ):
            problem = (
                f"holds {len(rows)} rows ({counts['results']} results, {counts['decisions']} "
                f"decisions, {counts['personas']} personas) where its manifest says "
                f"{head.get('rows')}: it was cut or added to"
            )
        elif head.get("digest") != got:
            problem = "does not match its digest: it was modified after `recjudge store export`"
        else:
            keys = trusted_keys()
            problem = _signature_problem(head, got, keys)
            if problem is None:
                return "signed" if os.environ.get(KEY_ENV) or keys else "digest"
    if trust_unsigned:
        return "unverified"
    raise PortableError(f"{path}: {problem}; nothing was imported{trust}")


def _signature_problem(head: dict[str, Any], digest: str, keys: dict[str, Any]) -> str | None:
    """Why a checkpoint whose digest holds is still not trusted (None: it is): no Ed25519
    signature by a key of ``$RECJUDGE_TRUSTED_KEYS`` where that is set, no valid HMAC where
    ``$RECJUDGE_CHECKPOINT_KEY`` is set, or the mark of a reseal of an unverified file
    (``keys``: ``trusted_keys()``, read once by the caller)."""
    if keys:
        try:
            verify(digest, CHECKPOINT_PURPOSE, head.get(ED25519), keys)
        except SignatureError as e:
            return f"{e} (${TRUSTED_KEYS_ENV} asks for signed checkpoints)"
    key = os.environ.get(KEY_ENV)
    sig = head.get("signature")
    if key and sig is None:
        return f"is not signed, and ${KEY_ENV} is set (signed checkpoints expected)"
    if key and not hmac.compare_digest(str(sig), _sign(key, digest)):
        return f"carries a signature that ${KEY_ENV} does not verify"
    if head.get(RESEALED):
        return ("was resealed (`store reseal --trust-unsigned`) from a file that did not "
                "verify: its digest only shows it is unchanged since the reseal, not who "
                "wrote its rows")  # fmt: skip
    return None


def _combine(manifest: dict[str, Any], body_hash: Any) -> str:
    """The checkpoint digest: sha256 over the manifest (canonical JSON, without digest and
    signature), a newline, and the hex sha256 of the row lines exactly as written."""
    h = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode("utf-8") + b"\n")
    h.update(body_hash.hexdigest().encode())
    return h.hexdigest()


def verify_portable(
    path: str | Path, *, max_inflated: int = MAX_INFLATED
) -> tuple[PortableCount, str | None]:
    """Check a checkpoint whole as an import would, writing nothing.

    Returns:
        Its counts (``verified``: ``signed`` or ``digest``) and the id of the trusted
        Ed25519 key that signed it (None: no trusted key is set, or it carries none).

    Raises:
        PortableError: as ``import_portable`` refuses.
    """
    path = Path(path)
    rows, verified, head = _read(path, max_inflated=max_inflated, with_head=True)
    counts = _table_counts(rows)
    signer = None
    sig = head.get(ED25519) if isinstance(head, dict) else None
    if trusted_keys() and isinstance(sig, dict):
        signer = str(sig.get("key_id"))  # _read verified it against a trusted key
    return PortableCount(counts["results"], counts["decisions"], verified=verified,
                         personas=counts["personas"]), signer  # fmt: skip


def import_portable(
    path: str | Path,
    store: str | Path,
    *,
    trust_unsigned: bool = False,
    max_inflated: int = MAX_INFLATED,
) -> PortableCount:
    """Add a checkpoint's rows to ``store``, ``<store>.decisions`` and ``<store>.personas``
    (created if missing).

    The file is checked whole before anything is written: its manifest (row counts and
    sha256 digest; with ``$RECJUDGE_CHECKPOINT_KEY`` set, its HMAC signature), its size
    inflated (``max_inflated``) and every row's shape (``check_row``). A file that fails is
    refused (``PortableError``) unless ``trust_unsigned``. Keys the store already has are
    kept as they are; those whose answer differs are counted as ``conflicts``. Judgments are
    written without ids (``user_id``/``candidate_id`` null): the judge fills them from the
    request that asks for the key.
    """
    path, store = Path(path), Path(store)
    rows, verified = _read(path, trust_unsigned=trust_unsigned, max_inflated=max_inflated)
    origin = {"imported_from": path.name, "verified": verified}
    written = dict.fromkeys(TABLES, 0)
    present = conflicts = 0
    for table, target in _table_paths(store).items():
        mine = [r for r in rows if r["table"] == table]
        if not mine:
            continue
        with ResultsStore(target) as s:
            have = s.get_many([r["key"] for r in mine])
            new = []
            for r in mine:
                res = r["result"]
                if table == "results" and PORTABLE_FORM not in res:  # a judgment
                    res = {**res, "user_id": None, "candidate_id": None, "evidence": []}
                if r["key"] in have:
                    present += 1
                    conflicts += _differs(have[r["key"]], res)
                    continue
                new.append((r["key"], origin, res))
            written[table] = s.put_many(new)
    return PortableCount(
        written["results"],
        written["decisions"],
        0,
        present,
        conflicts,
        verified,
        personas=written["personas"],
    )


_VERDICT_FIELDS = ("is_relevant", "value", "chosen", "branches")


def _differs(stored: dict[str, Any], imported: dict[str, Any]) -> bool:
    """Whether an imported answer would change what the store holds under the same key (its
    verdict, choice or value; ids the store filled in do not count)."""
    return any(
        stored.get(f) != imported.get(f) for f in _VERDICT_FIELDS if f in stored or f in imported
    )
