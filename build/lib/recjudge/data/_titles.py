"""Does a model's free text name one of a set of titles? For title-free checkpoints.

Datasets such as MovieLens forbid redistributing their records, and a free-text answer
(a GISTBench interest, say) may quote a title from the history it was shown. Before such an
answer may leave the machine in a checkpoint, it is screened against the titles of the
items it could have copied; an answer that names one stays behind (and is asked again).

The screen errs towards leaving answers out: a title matches as any whole run of words,
case- and punctuation-insensitively, in each of its common spellings:

- without a trailing year (``Heat (1995)`` -> ``heat``);
- with a trailing article moved to the front and dropped (``Godfather, The`` -> ``the
  godfather`` and ``godfather``);
- each part around a subtitle mark (``Star Wars: Episode IV - A New Hope`` -> ``star wars``,
  ``episode iv``, ``new hope``) and each parenthesised alternative title (``City of Lost
  Children, The (Cité des enfants perdus, La)`` -> ``cite des enfants perdus``, ...);
- without accents (answers may be ASCII-only).

So an interest "Heat-seeking thrillers" is held back on a history holding *Heat*; that
costs one re-asked answer, never a leaked title.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = ["TitleScreen"]

_YEAR = re.compile(r"\s*\((?:\d{4}|\d{4}\s*-\s*\d{0,4})\)\s*$")
_PARENS = re.compile(r"\(([^()]*)\)")
_ARTICLE = re.compile(r"^(.*),\s*(the|a|an|les|la|le|l'|il|el|die|der|das|los|las)$", re.I)
_SUBTITLE = re.compile(r"\s*(?::|\s-\s|\s–\s|\s—\s)\s*")
_LEADING_ARTICLE = frozenset({"the", "a", "an"})


def _words(text: str) -> tuple[str, ...]:
    """Lower-cased words of ``text`` (letters and digits of any script) without accents, so
    that ``Cité`` and an ASCII-only answer's ``Cite`` are the same word."""
    text = unicodedata.normalize("NFKD", str(text)).casefold()
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return tuple(re.findall(r"\w+", text))


def _spellings(title: str) -> set[tuple[str, ...]]:
    title = _YEAR.sub("", unicodedata.normalize("NFKC", str(title))).strip()
    parts = [_PARENS.sub(" ", title).strip()] + [p.strip() for p in _PARENS.findall(title)]
    out: set[tuple[str, ...]] = set()
    for part in parts:
        variants = {part}
        m = _ARTICLE.match(part)
        if m:
            variants |= {f"{m.group(2)} {m.group(1)}", m.group(1)}
        for v in list(variants):
            variants.update(_SUBTITLE.split(v))
        for v in variants:
            words = _words(v)
            if words and words[0] in _LEADING_ARTICLE and len(words) > 1:
                out.add(words[1:])
            if words:
                out.add(words)
    return out


class TitleScreen:
    """A set of titles, and whether a text names any of them (rules: module docstring).

    Args:
        titles: the titles to screen for (e.g. every item of a user's history).
    """

    def __init__(self, titles: Iterable[str]) -> None:
        self._spellings: set[tuple[str, ...]] = set()
        for t in titles:
            self._spellings |= _spellings(t)
        self._longest = max((len(s) for s in self._spellings), default=0)

    def __len__(self) -> int:
        return len(self._spellings)

    def names_title(self, text: str) -> bool:
        """True if some run of words of ``text`` is a spelling of one of the titles."""
        words = _words(text)
        for i in range(len(words)):
            for n in range(1, min(self._longest, len(words) - i) + 1):
                if words[i : i + n] in self._spellings:
                    return True
        return False
