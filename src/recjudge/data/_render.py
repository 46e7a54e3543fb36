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


#: chat-template markers of any model family written out as text (they never become special
#: tokens; rewritten so they do not read as a turn boundary either)
_CHAT_MARKER = re.compile(
    r"<\|[^|<>]{0,40}\|>|<</?SYS>>|\[/?INST\]|<(?:start|end)_of_turn>|<\|?eot_id\|?>", re.I
)
#: a quoted JSON key (``"is_relevant":``): the shape of the judge's own answer
_QUOTED_KEY = re.compile(r'"\s*([^"{}\[\]:]{1,40}?)\s*"\s*:')
_SCHEMA_KEY = re.compile(r"is[_\s]*relevant", re.I)


def neutralise(text: str) -> str:
    """Rewrite the answer- and template-shaped parts of untrusted text so that nothing in it
    reads as the judge's answer or as a turn of the chat: braces become parentheses (no JSON
    object survives), a quoted key loses its quotes (``"evidence":`` -> ``evidence:``), the
    answer schema's key ``is_relevant`` becomes ``is relevant``, and chat-template markers
    (``<|im_start|>``, ``[INST]``, ...) become a space. Text without these shapes (every
    ML-100K and ML-1M title) is returned unchanged; the rewrite is idempotent.

    After the spotlighting / datamarking idea (Hines et al., 2024): keep the prompt's own
    structure out of the data. What it does against a judge is measured by ``bench run
    injection``.
    """
    if not any(c in text for c in '{}"<[') and "relevant" not in text.lower():
        return text
    s = _CHAT_MARKER.sub(" ", text)
    s = s.replace("{", "(").replace("}", ")")
    s = _QUOTED_KEY.sub(lambda m: m.group(1).strip() + ":", s)
    s = _SCHEMA_KEY.sub("is relevant", s)
    return s


#: the datamarking character (Hines et al., 2024 used U+02C6 MODIFIER LETTER CIRCUMFLEX)
DATAMARK = "\u02c6"


def datamark(text: str, mark: str = DATAMARK) -> str:
    """Spotlighting by datamarking (Hines et al., 2024, "Defending Against Indirect Prompt
    Injection Attacks With Spotlighting"): every run of white space in untrusted text becomes
    ``mark``, so the model can tell item text from the prompt that the system message says
    is marked. ``"Toy Story (1995)"`` -> ``"ToyˆStoryˆ(1995)"`` with the default mark.
    Applied at prompt time (``JudgeConfig.marking``), after ``clean_text``; the evidence
    grammar keeps the clean titles."""
    return _SPACES.sub(mark, text.strip())


def clean_text(text: Any, max_chars: int = 200, defend: bool = True) -> str:
    """Strip control characters (newlines included) and invisible bidi / zero-width
    characters, neutralise answer- and template-shaped content (``neutralise``), fold white
    space, cap the length.

    Item text is untrusted: it goes into prompts and grammars only through this function and
    JSON escaping, never as code.

    Args:
        defend: ``neutralise`` the text (``False``: the renderer before it, for the
            injection bench's comparison only).
    """
    s = "" if text is None else str(text)
    s = unicodedata.normalize("NFC", s)
    s = _INVISIBLE.sub("", s)
    s = _CONTROL.sub(" ", s)
    if defend:
        s = neutralise(s)
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
