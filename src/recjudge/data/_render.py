"""The one function that turns an item into prompt text."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

import pandas as pd

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: invisible characters that reorder or hide text (bidi embeddings, overrides and isolates,
#: directional marks, zero-width space, BOM): a title could display as another title, or
#: spoof a report, with them (Trojan Source, CVE-2021-42574); ZWJ/ZWNJ stay (scripts need them)
_INVISIBLE = re.compile("[\u061c\u200b\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
_SPACES = re.compile(r"\s+")
_YEAR_SUFFIX = re.compile(r"\(\d{4}\)\s*$")


def clean_text(text: Any, max_chars: int = 200) -> str:
    """Strip control characters (newlines included) and invisible bidi / zero-width
    characters, fold white space, cap the length.

    Item text is untrusted: it goes into prompts and grammars only through this function and
    JSON escaping, never as code.
    """
    s = "" if text is None else str(text)
    s = unicodedata.normalize("NFC", s)
    s = _INVISIBLE.sub("", s)
    s = _CONTROL.sub(" ", s)
    s = _SPACES.sub(" ", s).strip()
    if len(s) > max_chars:
        s = s[: max_chars - 1].rstrip() + "…"
    return s


def _present(v: Any) -> bool:
    if v is None:
        return False
    try:
        if pd.isna(v):
            return False
    except (TypeError, ValueError):
        pass
    return str(v).strip() != ""


def render_item(item: Mapping[str, Any], domain: str = "generic", max_chars: int = 200) -> str:
    """Render an item for a prompt.

    Movies: ``Title (Year) | genre, genre``; books: ``Title by Author (Year)``; generic: the
    title. Control characters are stripped and the result capped at ``max_chars``.
    """
    title = clean_text(item.get("title", item.get("item_id", "")), max_chars)
    year = item.get("year")
    year_s = ""
    if _present(year):
        try:
            year_s = f" ({int(float(year))})"
        except (TypeError, ValueError):
            year_s = ""
    if domain == "movies":
        text = title if _YEAR_SUFFIX.search(title) or not year_s else title + year_s
        genres = item.get("genres")
        if _present(genres):
            text += " | " + ", ".join(g for g in str(genres).split("|") if g)
    elif domain == "books":
        text = title
        author = item.get("author")
        if _present(author):
            text += f" by {clean_text(author, 80)}"
        text += year_s
    else:
        text = title
    return clean_text(text, max_chars)


def item_title(item: Mapping[str, Any], max_chars: int = 200) -> str:
    """The short title used as a citable evidence string (no genres)."""
    return clean_text(item.get("title", item.get("item_id", "")), max_chars)
