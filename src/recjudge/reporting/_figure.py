"""One figure set-up for every PNG a report writes (headless backend, size, layout, dpi)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recjudge._util import atomic_write_bytes


@contextmanager
def figure(
    path: str | Path,
    size: tuple[float, float] = (6.0, 4.0),
    dpi: int = 110,
    grid: tuple[int, int] | None = None,
    **subplots: Any,
) -> Iterator[Any]:
    """Yield one matplotlib Axes (or, with ``grid=(rows, cols)``, the 2-D array of Axes;
    ``subplots`` go to ``plt.subplots``, e.g. ``sharex=True``); on exit lay it out, write
    ``path`` atomically and free the figure (also when the body raises, so a failed plot leaks
    nothing)."""
    import matplotlib

    matplotlib.use("Agg")  # reports are written on machines without a display
    import matplotlib.pyplot as plt

    if grid is None:
        fig, ax = plt.subplots(figsize=size, **subplots)
    else:
        fig, ax = plt.subplots(*grid, figsize=size, squeeze=False, **subplots)
    try:
        yield ax
        fig.tight_layout()

        buf = io.BytesIO()  # rendered whole, then renamed in: a kill never leaves half a PNG
        fig.savefig(buf, dpi=dpi, format=Path(path).suffix.lstrip(".") or "png")
        atomic_write_bytes(path, buf.getvalue())
    finally:
        plt.close(fig)
