"""The card of a tuned judge model (``recjudge judge tune``): what it was tuned from and on.

A tuned model is an ordinary safetensors folder that every backend loads unchanged, plus
``recjudge-tuned.json``: the base model and its digest, the data and period it read, its
pairs, steps and validation AUC, and the sha256 of each weight file. The card's digest enters
every result key of the model (``llm_key``), so answers of two tunings never share a key even
when their folders share a path; loading the folder checks every file a loader reads against
the card (``check_tuned``), so a card cannot vouch for files it was not written for.

Whoever can write the folder can also rewrite the card: ``recjudge-tuned.sig`` closes that.
It is an Ed25519 signature of the card's digest (``recjudge._signing``; written by ``judge
tune`` when ``$RECJUDGE_SIGNING_KEY`` names a key, or later by ``recjudge keys sign``). With
``$RECJUDGE_TRUSTED_KEYS`` set, every local model folder must carry a card signed by one of
those keys. A refused folder loads only under ``--trust-unsigned`` (``$RECJUDGE_TRUST_UNSIGNED``),
with a warning, keyed by the sha256 of its files rather than by the card it does not match.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from recjudge._signing import (
    SIGNING_KEY_ENV,
    TRUSTED_KEYS_ENV,
    SignatureError,
    sign,
    trust_unsigned,
    trusted_keys,
    verify,
)
from recjudge._util import atomic_write_text, json_loads, sha256_file, stable_hash

TUNED_CARD = "recjudge-tuned.json"
TUNED_FORMAT = "recjudge-tuned"
#: the tuned folder's record of the users its tuning read (``tune.tuning_users`` reads it)
USERS_FILE = "tuning-users.json"
#: the detached Ed25519 signature of the card (``sign_card``)
SIGNATURE_FILE = "recjudge-tuned.sig"
#: what a card's signature signs: this prefix and the card's sha256 (never a checkpoint's)
CARD_PURPOSE = "recjudge-tuned-card"


class TunedCardError(ValueError):
    """A tuned model's card is unreadable, or its weights are not the ones it lists."""


def _card_path(model: str | Path) -> Path | None:
    p = Path(str(model)).expanduser()
    card = p / TUNED_CARD
    return card if card.is_file() else None


@lru_cache(maxsize=64)
def _read(path: str, size: int, mtime_ns: int) -> tuple[dict[str, Any], str]:
    raw = Path(path).read_bytes()
    try:
        card = json_loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise TunedCardError(f"{path}: not a tuned-model card (JSON); tune the model again "
                             "with `recjudge judge tune`") from None  # fmt: skip
    if not isinstance(card, dict) or card.get("format") != TUNED_FORMAT:
        raise TunedCardError(f"{path}: not a {TUNED_FORMAT} card; tune the model again with "
                             "`recjudge judge tune`")  # fmt: skip
    return card, hashlib.sha256(raw).hexdigest()


def _card_and_digest(model: str | Path) -> tuple[dict[str, Any], str] | None:
    """The card and the sha256 of its bytes, read once per file version."""
    card = _card_path(model)
    if card is None:
        return None
    st = card.stat()
    return _read(str(card), st.st_size, st.st_mtime_ns)


def read_card(model: str | Path) -> dict[str, Any] | None:
    """The card of a tuned model folder (None: not a tuned folder, e.g. a preset or hub id).

    Raises:
        TunedCardError: the card is not a ``recjudge-tuned`` JSON object.
    """
    got = _card_and_digest(model)
    return None if got is None else got[0]


def card_digest(model: str | Path) -> str | None:
    """sha256 of the card's bytes (None without a card): what keys the tuned model."""
    got = _card_and_digest(model)
    return None if got is None else got[1]


def check_tuned(folder: str | Path) -> None:
    """A local model folder against its card and, with ``$RECJUDGE_TRUSTED_KEYS`` set, the
    card against its signature. Under ``--trust-unsigned`` a folder that fails is loaded
    with a warning (``tuned_key`` then keys it by its files' digests).

    Raises:
        TunedCardError: a file the card lists is missing or differs, a file a loader reads
            is not listed, a tuned folder lost its card, or (trusted keys set) no trusted key
            signed the card; each names the file and the fix.
    """
    problem = _problem(Path(folder))
    if problem is None:
        return
    if not trust_unsigned():
        raise TunedCardError(problem + "; or pass --trust-unsigned if you know where the "
                             "folder came from")  # fmt: skip
    warnings.warn(f"--trust-unsigned: loading it anyway: {problem}", stacklevel=2)


def _stats(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, size and mtime of every file of a folder: a cache key that changes with any
    edit (the checks below hash a weight file once per version, not once per lookup)."""
    if not folder.is_dir():
        return ()
    out = []
    for f in sorted(folder.iterdir()):
        if f.is_file():
            st = f.stat()
            out.append((f.name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _problem(folder: Path) -> str | None:
    """Why a local model folder may not be loaded (None: it may)."""
    return _problem_cached(str(folder), _stats(folder), _trusted_spec())


def _trusted_spec() -> str:
    return os.environ.get(TRUSTED_KEYS_ENV, "")


@lru_cache(maxsize=64)
def _problem_cached(folder_s: str, stats: tuple[Any, ...], spec: str) -> str | None:
    folder = Path(folder_s)
    keys = trusted_keys(spec) if spec else {}
    try:
        card = read_card(folder)
    except TunedCardError as e:
        return str(e)
    if card is None:
        if (folder / USERS_FILE).is_file():  # a tuned folder whose card is gone
            return (f"{folder}: a tuned model folder (it holds {USERS_FILE}) without its card "
                    f"{TUNED_CARD}: nothing vouches for its files; restore the card, or tune "
                    "again")  # fmt: skip
        if keys and folder.is_dir():
            return (f"{folder}: no signed card ({TUNED_CARD}), and $RECJUDGE_TRUSTED_KEYS "
                    "asks for signed model folders: use a folder tuned and signed by a "
                    "trusted key (`recjudge keys sign FOLDER`)")  # fmt: skip
        return None
    try:
        _check_weights(folder, card)
    except TunedCardError as e:
        return str(e)
    if keys:
        try:
            verify(card_digest(folder) or "", CARD_PURPOSE, _read_signature(folder), keys)
        except SignatureError as e:
            return (f"{folder}: its card {e} ($RECJUDGE_TRUSTED_KEYS asks for signed model "
                    "folders); sign it with a trusted key (`recjudge keys sign FOLDER`), or "
                    "use the folder as its signer gave it")  # fmt: skip
    return None


def _read_signature(folder: Path) -> Any:
    f = folder / SIGNATURE_FILE
    if not f.is_file() or f.stat().st_size > 8192:
        return None
    try:
        return json_loads(f.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def sign_card(folder: str | Path, key_path: str | Path | None = None) -> dict[str, str] | None:
    """Sign a tuned folder's card with ``key_path`` (default ``$RECJUDGE_SIGNING_KEY``):
    writes ``recjudge-tuned.sig`` and returns the signature (None when no key is named).
    The folder is checked against its card first: a signature never vouches for a folder
    that its card does not describe.

    Raises:
        TunedCardError: no card, or the folder does not match it.
    """
    folder = Path(folder)
    if not (key_path or os.environ.get(SIGNING_KEY_ENV)):
        return None
    digest = card_digest(folder)
    if digest is None:
        raise TunedCardError(f"{folder}: no {TUNED_CARD}; only a folder of `recjudge judge "
                             "tune` is signed (its card lists every file it holds)")  # fmt: skip
    _check_weights(folder, read_card(folder) or {})
    signature = sign(digest, CARD_PURPOSE, key_path)
    if signature is not None:
        atomic_write_text(folder / SIGNATURE_FILE, json.dumps(signature, indent=1) + "\n")
    return signature


def verify_folder(folder: str | Path) -> str | None:
    """Check a local model folder as loading does, never trusting unsigned: the id of the
    trusted key that signed its card (None when no trusted key is set).

    Raises:
        TunedCardError: why it would be refused.
    """
    folder = Path(folder)
    problem = _problem(folder)
    if problem is not None:
        raise TunedCardError(problem)
    if not _trusted_spec():
        return None
    signature = _read_signature(folder)
    return str(signature.get("key_id")) if isinstance(signature, dict) else None


def tuned_key(model: str | Path) -> str | None:
    """What keys a local model folder's answers beside its name: the card's digest (16 hex
    digits), or, for a folder loaded under ``--trust-unsigned`` that fails its checks,
    ``unverified-`` and the digest of its files (its answers never share a key with the
    folder its card describes). None for a folder without a card that passes (a base model)
    or a hub id."""
    digest = card_digest(model)
    path = Path(str(model)).expanduser()
    if not trust_unsigned() or not path.is_dir() or _problem(path) is None:
        return None if digest is None else digest[:16]
    return "unverified-" + _content_digest(str(path), _stats(path))


@lru_cache(maxsize=16)
def _content_digest(folder: str, stats: tuple[Any, ...]) -> str:
    return stable_hash([(name, sha256_file(Path(folder) / name)) for name, _, _ in stats])


def _check_weights(folder: Path, card: dict[str, Any]) -> None:
    """Every file the card lists, and the weights, against their sha256."""
    verified = _check_files(Path(folder), card)
    listed = card.get("weights_sha256")
    if not isinstance(listed, dict) or not listed:
        raise TunedCardError(f"{folder}: its card lists no weight digests; tune it again")
    for name, digest in listed.items():
        f = Path(folder) / str(name)
        if "/" in str(name) or not f.is_file():
            raise TunedCardError(f"{folder}: weight file {name!r} of its card is missing")
        if verified.get(str(name)) == digest:
            continue  # hashed by _check_files already: a weight file is read once per load
        if sha256_file(f) != digest:
            raise TunedCardError(f"{folder}: {name} is not the file its card was written for "
                                 "(sha256 differs); tune again, or restore the folder")  # fmt: skip


#: files a loader reads from a model folder besides the weights: one that a card does not
#: list (added after tuning: a chat template with a fake assistant turn) is refused
LOADED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "vocab.json",
          "merges.txt", "added_tokens.json", "tokenizer.model")  # fmt: skip


def _check_files(folder: Path, card: dict[str, Any]) -> dict[str, str]:
    """Every file the card lists (``files_sha256``, cards since issue 110) against its
    sha256, and no file a loader reads that the card does not list; returns the digests it
    verified (``check_tuned`` does not hash those weights again). A card written before
    lists the weights only (checked by ``check_tuned``)."""
    listed = card.get("files_sha256")
    if not isinstance(listed, dict):
        return {}
    for name, digest in listed.items():
        f = folder / str(name)
        if "/" in str(name) or not f.is_file():
            raise TunedCardError(f"{folder}: {name}, listed by its card, is missing; restore "
                                 "the folder, or tune again")  # fmt: skip
        if sha256_file(f) != digest:
            raise TunedCardError(f"{folder}: {name} is not the file its card was written for "
                                 "(sha256 differs): an edited config, tokenizer or chat "
                                 "template changes every verdict; restore it, or tune "
                                 "again")  # fmt: skip
    extra = [f.name for f in folder.iterdir() if f.is_file() and f.name not in listed
             and (f.name in LOADED or f.suffix == ".safetensors")]  # fmt: skip
    if extra:
        raise TunedCardError(f"{folder}: {sorted(extra)[0]} is not listed by its card (added "
                             "after tuning): the loader would read it; remove it, or tune "
                             "again")  # fmt: skip
    return {str(k): str(v) for k, v in listed.items()}


def user_hash(user_id: str) -> str:
    """How a tuning's users record names a user: sha256 of the id, 16 hex digits (the card
    travels with the model; the ids stay with the team)."""
    return hashlib.sha256(str(user_id).encode()).hexdigest()[:16]
