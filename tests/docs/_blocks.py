"""The code blocks of the docs pages and the README: their language, text, the marker above
each (``<!-- run: FILE -->`` or ``<!-- not run: REASON -->``) and the ``recjudge`` command
lines in shell blocks."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SHELL = {"bash", "sh", "shell", "console"}
CODE = SHELL | {"python"}
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*(run|not run):\s*(.*?)\s*-->\s*$")
#: how a command line calls recjudge (``R=.venv/bin/recjudge`` then ``$R``)
_RECJUDGE = re.compile(r"^(?:\$R|(?:\S*/)?recjudge)$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: tuple[str, str] | None  # ("run", FILE) or ("not run", REASON)
    section: str  # the nearest heading above

    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.section!r})"


def pages() -> list[Path]:
    """Every docs page written by hand (the API pages only hold mkdocstrings directives)."""
    return sorted(p for p in DOCS.rglob("*.md") if "api" not in p.relative_to(DOCS).parts)


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    section = ""
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if lines[i].startswith("#") and not m:
            section = lines[i].lstrip("#").strip()
        if m:
            start, lang = i, m.group(1)
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            mark = _MARK.match(lines[start - 1]) if start else None
            name = str(path.relative_to(ROOT))
            marker = (mark.group(1), mark.group(2)) if mark else None
            text = "\n".join(lines[start + 1 : j])
            out.append(Block(name, start + 1, lang, text, marker, section))
            i = j + 1
            continue
        i += 1
    return out


def block(path: Path, section: str, index: int = 0, lang: str | None = None) -> Block:
    """The ``index``-th code block under the heading that starts with ``section``."""
    found = [b for b in blocks(path) if b.section.startswith(section)
             and (lang is None or b.lang == lang)]  # fmt: skip
    if len(found) <= index:
        raise LookupError(f"{path.name}: no block {index} under a heading {section!r}")
    return found[index]


def joined(text: str) -> list[str]:
    """A shell block's logical lines: continuations joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        if words:
            out.append(line)
    return out


def recjudge_commands(text: str) -> list[list[str]]:
    """The argv after ``recjudge`` of every command a shell block runs (``;``, ``&&``, ``|``
    and ``for ...; do`` split; comments dropped)."""
    cmds = []
    for line in joined(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        parts: list[list[str]] = [[]]
        for w in words:
            if w in {";", "&&", "||", "|", "do", "done", "then", "fi"}:
                parts.append([])
            elif w.endswith(";") and w != ";":
                parts[-1].append(w[:-1])
                parts.append([])
            else:
                parts[-1].append(w)
        for p in parts:
            for k, w in enumerate(p):
                if _RECJUDGE.match(w):
                    cmds.append(p[k + 1 :])
                    break
    return cmds


def make_targets(text: str) -> list[str]:
    """The ``make TARGET`` words of a shell block."""
    out = []
    for line in joined(text):
        words = shlex.split(line, comments=True)
        if words[:1] == ["make"] and len(words) > 1:
            out.append(words[1])
    return out
