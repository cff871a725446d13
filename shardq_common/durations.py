"""Durations as people write them: "90s", "5m", "1h30m", "2d", "250ms", or plain seconds ("300")."""

from __future__ import annotations

import re

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration_ms(text: str) -> int:
    """Milliseconds; ValueError naming the text when it is not a duration."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if seconds < 0 or seconds != seconds:
            raise ValueError(f"{text!r} is not a duration: it must not be negative")
        return round(seconds * 1000)
    parts = _PART.findall(value)
    if not value or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"{text!r} is not a duration (write e.g. 90s, 5m, 1h30m, 2d or seconds)")
    return round(sum(float(n) * _UNITS[u] for n, u in parts))
