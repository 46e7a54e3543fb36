"""Say the time before spending it: the work ahead of a judging run and its projected time,
from the first calls, in one line each (the progress bar's ETA scrolls away; these stay)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["WorkAhead"]

#: a run projected past this many seconds is told how to get a first answer sooner
LONG_RUN_S = 3600.0
#: the projection is said once this much of the work or time is behind (the first calls
#: carry model loading and warm-up; a projection from them alone overstates)
FIRST_SHARE, FIRST_SECONDS = 0.02, 20.0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class WorkAhead:
    """The work ahead (``start``) and, once ``FIRST_SHARE`` of it or ``FIRST_SECONDS`` are
    behind, the projected time of the rest (``done``), each said once through ``say``.

    Args:
        unit: what is counted (``pair``, ``question``).
        verb: what is done to each (``judge``, ``ask``).
        label: the stage, said first (an evaluator runs several).
        resume: how a run stopped now keeps its work (said with the over-an-hour advice).
    """

    def __init__(
        self,
        say: Callable[[str], None],
        unit: str = "pair",
        verb: str = "judge",
        label: str = "",
        resume: str = "a later run into the same --out with --resume keeps every judged pair",
    ) -> None:
        self.say, self.unit, self.verb, self.resume = say, unit, verb, resume
        self.label = f"{label}: " if label else ""
        self.total = self.finished = 0
        self.t0 = 0.0
        self.projected: float | None = None

    def start(self, todo: int, reused: int) -> None:
        self.total, self.t0 = todo, time.perf_counter()
        units = f"{self.unit}{'s' * (reused != 1)}"
        kept = f" ({reused} {units} reused from the store)" if reused else ""
        self.say(
            f"{self.label}work ahead: {todo} {self.unit}{'s' * (todo != 1)} to {self.verb}{kept}"
        )

    def done(self, n: int) -> None:
        self.finished += n
        if self.projected is not None or not self.total or self.finished >= self.total:
            return
        elapsed = time.perf_counter() - self.t0
        if self.finished < FIRST_SHARE * self.total and elapsed < FIRST_SECONDS:
            return
        rate = self.finished / max(elapsed, 1e-9)
        self.projected = (self.total - self.finished) / rate
        line = (
            f"{self.label}projected: {_duration(self.projected)} more for "
            f"{self.total - self.finished} {self.unit}s at {rate:.2f} {self.unit}s/s "
            f"(from the first {self.finished})"
        )
        if self.projected > LONG_RUN_S:
            line += (
                "; over an hour: a smaller --users gives a first answer sooner, and " + self.resume
            )
        self.say(line)
