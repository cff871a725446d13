"""Rates as people write them ("100/s", "30/m"), for the queues file and dispatcherctl: no import
beyond the standard library, so the command runs where only the SDK is installed."""

from __future__ import annotations

import math

_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate(text: str) -> float | None:
    """'100/s', '30/m', '2/h' or a bare number (per second) -> per second; '' or 'none' -> None.
    ValueError says what is wrong."""
    text = text.strip().lower()
    if text in ("", "none", "0"):
        return None
    count, slash, unit = text.partition("/")
    unit = unit.strip() or "s"
    if unit not in _PER:
        raise ValueError(f"{text!r} is not a rate: write N/s, N/m or N/h")
    try:
        n = float(count)
    except ValueError:
        raise ValueError(f"{text!r} is not a rate: write N/s, N/m or N/h") from None
    if not math.isfinite(n) or n <= 0:
        raise ValueError(f"{text!r} is not a rate: N must be a positive number")
    return n / _PER[unit]
