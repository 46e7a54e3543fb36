"""Peak resident memory per phase of a benchmark, sampled in a thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

__all__ = ["PeakRSS"]


class PeakRSS:
    """Samples this process's resident memory in a thread; ``phase(name)`` records peaks.

    ``tree``: the sum over this process and its descendants (engines that compute in child
    processes, such as vLLM's engine core).
    """

    def __init__(self, every: float = 0.02, tree: bool = False) -> None:
        self._proc = psutil.Process()
        self.tree = tree
        self.every = every
        self.peaks: dict[str, int] = {}
        self._current: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._current is not None:
                rss = self._rss()
                self.peaks[self._current] = max(self.peaks.get(self._current, 0), rss)
            time.sleep(self.every)

    def _rss(self) -> int:
        procs = [self._proc] + (self._proc.children(recursive=True) if self.tree else [])
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):  # a child that just exited
                total += p.memory_info().rss
        return total

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._current = name
        try:
            yield
        finally:
            self._current = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
