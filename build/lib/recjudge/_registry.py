"""One registry type for models, judges, evaluators and datasets, with "did you mean" errors."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised when a registry lookup fails; the message lists close matches and all names."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly instead.
        return str(self.args[0])


def suggest(name: str, choices: list[str], n: int = 3) -> list[str]:
    """Closest matches to ``name`` among ``choices`` (case-insensitive)."""
    lowered = {c.lower(): c for c in choices}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    # Substring hits help for ids like "qwen" -> "qwen2.5-coder-0.5b".
    for c in choices:
        if name.lower() in c.lower() and c.lower() not in hits:
            hits.append(c.lower())
    return [lowered[h] for h in hits[:n]]


class Registry(Generic[T]):
    """A name -> factory mapping with helpful errors.

    Args:
        kind: what the registry holds ("model", "judge", ...), used in error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = item
        return item

    def decorator(self, name: str) -> Callable[[T], T]:
        def wrap(item: T) -> T:
            return self.register(name, item)

        return wrap

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            close = suggest(name, list(self._items))
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise UnknownNameError(
                f"Unknown {self.kind} {name!r}.{hint} Known {self.kind}s: "
                f"{', '.join(sorted(self._items))}."
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def names(self) -> list[str]:
        return list(self._items)

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())
