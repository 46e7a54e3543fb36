"""The card of a tuned judge model (``recjudge judge tune``): what it was tuned from and on.

A tuned model is an ordinary safetensors folder that every backend loads unchanged, plus
``recjudge-tuned.json``: the base model and its digest, the data and period it read, its
pairs, steps and validation AUC, and the sha256 of each weight file. The card's digest enters
every result key of the model (``llm_key``), so answers of two tunings never share a key even
when their folders share a path; loading the folder checks the weights against the card
(``check_tuned``), so a card cannot vouch for weights it was not written for.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from recjudge._util import json_loads, sha256_file

TUNED_CARD = "recjudge-tuned.json"
TUNED_FORMAT = "recjudge-tuned"
#: the tuned folder's record of the users its tuning read (``evaluators.offline._leakage`` reads it)
USERS_FILE = "tuning-users.json"


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
    """The weight files of a tuned folder against the sha256 its card lists.

    Raises:
        TunedCardError: a listed weight file is missing or differs (named), or the card
            lists none.
    """
    card = read_card(folder)
    if card is None:
        if (Path(folder) / USERS_FILE).is_file():  # a tuned folder whose card is gone
            raise TunedCardError(
                f"{folder}: a tuned model folder (it holds {USERS_FILE}) without its card "
                f"{TUNED_CARD}: nothing vouches for its files; restore the card, or tune again"
            )
        return
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
