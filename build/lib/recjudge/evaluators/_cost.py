"""What a stored run asked its models in this invocation, and how fast.

Long evaluator runs resume from their results store, so a report's wall time covers only the
last resume. ``AskMeter`` counts, per kind of question, how many the store lacked (asked now),
how many there are in all, and the seconds spent asking, so a report can state the rate of
the work actually done.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["AskMeter", "cost_sentence"]

T = TypeVar("T")


@dataclass
class AskMeter:
    """Per kind: questions asked now, all questions, seconds spent asking them."""

    kinds: dict[str, dict[str, float]] = field(default_factory=dict)

    def measure(self, kind: str, store: Any, keys: Iterable[str], call: Callable[[], T]) -> T:
        """``call()`` (which answers and stores ``keys``), counting the keys ``store`` lacked
        before it and the seconds it took when it asked anything."""
        unique = list(dict.fromkeys(keys))
        asked = len(store.missing(unique))
        t0 = time.time()
        got = call()
        c = self.kinds.setdefault(kind, {"asked_now": 0, "seconds": 0.0, "questions": 0})
        c["asked_now"] += asked
        c["seconds"] += time.time() - t0 if asked else 0.0
        c["questions"] += len(unique)
        return got

    def summary(self) -> dict[str, dict[str, Any]]:
        """``{kind: {"asked_now", "questions", "seconds", "per_second"}}``."""
        return {
            kind: {
                "asked_now": int(c["asked_now"]),
                "questions": int(c["questions"]),
                "seconds": round(c["seconds"], 1),
                "per_second": round(c["asked_now"] / c["seconds"], 4) if c["seconds"] else None,
            }
            for kind, c in self.kinds.items()
        }


def cost_sentence(wall_seconds: float, cost: dict[str, Any], labels: dict[str, str]) -> str:
    """The report's cost sentence: wall time, then per kind in ``labels`` what this run
    asked and how fast (``AskMeter.summary``'s output; kinds never asked are skipped)."""
    parts = []
    for kind, what in labels.items():
        c = cost.get(kind)
        if c:
            rate = f", {c['per_second']} per second" if c["per_second"] else ""
            parts.append(f"{c['asked_now']} of {c['questions']} {what} in {c['seconds']} s{rate}")
    asked = f": asked in this run {'; '.join(parts)}; the rest from the store" if parts else ""
    return f"Wall time {wall_seconds} s{asked}."
