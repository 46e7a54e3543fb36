"""One interval formatter for every report: ``value [lo, hi]``."""

from __future__ import annotations


def interval(
    value: float | None,
    lo: float | None = None,
    hi: float | None = None,
    *,
    nd: int = 3,
    signed: bool = False,
    scale: float = 1.0,
    unit: str = "",
    missing: str = "-",
) -> str:
    """``value`` (times ``scale``, ``nd`` decimals, a ``+`` on positives when ``signed``,
    then ``unit``) followed by its interval ``[lo, hi]`` in the same format; the interval is
    left out when either end is None. ``value=None`` gives the interval alone (``[lo, hi]``),
    or ``missing`` when there is no interval either.

    Examples: ``interval(0.1234, 0.1, 0.15)`` is ``0.123 [0.100, 0.150]``;
    ``interval(0.25, 0.2, 0.3, nd=1, scale=100, unit=" %")`` is ``25.0 % [20.0, 30.0]``;
    ``interval(None, -0.01, 0.02, nd=4, signed=True)`` is ``[-0.0100, +0.0200]``.
    """
    spec = f"{'+' if signed else ''}.{nd}f"

    def num(x: float) -> str:
        return format(scale * x, spec)

    band = f"[{num(lo)}, {num(hi)}]" if lo is not None and hi is not None else ""
    if value is None:
        return band or missing
    return f"{num(value)}{unit}" + (f" {band}" if band else "")
