"""Durations in options (``"15 min"``, ``"500 ms"``) and in messages (``"3 min 12 s"``): one
parser for the source's and the sink's options."""

from __future__ import annotations

import re

from flinkish_core.errors import OptionError

_UNITS_MS = {
    "ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")
_BARE_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")


def parse_duration_ms(name: str, text: str) -> int:
    """``"2 seconds"``, ``"500 ms"``, ``"1.5s"`` -> milliseconds; OptionError naming option
    ``name`` otherwise. A bare number other than ``0`` is refused: Flink reads it as
    milliseconds, Spark's intervals need a unit, and a user may mean seconds."""
    bare = _BARE_NUMBER.match(text)
    if bare:
        if float(bare.group(1)) == 0:
            return 0
        number = bare.group(1)
        raise OptionError(
            f"option {name}: {text!r} is not a duration: the number has no unit; write "
            f"'{number} ms', '{number} s' or '{number} min' (units: ms, s, m/min, h, d)"
        )
    match = _DURATION.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS_MS:
        raise OptionError(
            f"option {name}: {text!r} is not a duration; write a number and a unit, "
            "e.g. '2 seconds', '500 ms', '1 minute' (units: ms, s, m/min, h, d)"
        )
    return int(round(float(match.group(1)) * _UNITS_MS[unit]))


def format_duration(seconds: float) -> str:
    """``"250 ms"``, ``"45 s"``, ``"3 min 12 s"``, ``"2 h 03 min"``, ``"3 d 4 h"``."""
    whole = max(0, int(seconds))
    if seconds < 1:
        return f"{max(0.0, seconds) * 1000:.0f} ms"
    if whole < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min" + (f" {secs:02d} s" if secs else "")
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h" + (f" {minutes:02d} min" if minutes else "")
    days, hours = divmod(hours, 24)
    return f"{days} d" + (f" {hours} h" if hours else "")
