"""Windows: Flink's ``TimeWindow`` and ``GlobalWindow``, and the merge of overlapping windows.
A window is a hashable value: it is the namespace of all per-window state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flinkish_core.watermark import MAX_WATERMARK

__all__ = [
    "GlobalWindow", "TimeWindow", "Window", "get_window_start_with_offset", "java_remainder",
    "merge_time_windows", "window_from_data", "window_to_data",
]

LONG_MAX = MAX_WATERMARK  # Java's Long.MAX_VALUE


class Window:
    """A group of elements with a last timestamp, after which the window is complete."""

    __slots__ = ()

    def max_timestamp(self) -> int:
        raise NotImplementedError


class TimeWindow(tuple[int, int], Window):
    """The half-open interval ``[start, end)`` in milliseconds; a tuple underneath, since every
    element and timer hashes and compares its window, and a tuple does that in C."""

    __slots__ = ()

    def __new__(cls, start: int, end: int) -> TimeWindow:
        return tuple.__new__(cls, (start, end))

    def __getnewargs__(self) -> tuple[int, int]:
        return self[0], self[1]

    @property
    def start(self) -> int:
        return self[0]

    @property
    def end(self) -> int:
        return self[1]

    def max_timestamp(self) -> int:
        return self[1] - 1

    def intersects(self, other: TimeWindow) -> bool:
        """Overlap or touch: a session ending where the next begins is one session."""
        return self.start <= other.end and self.end >= other.start

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window containing both."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))

    def __repr__(self) -> str:
        return f"TimeWindow(start={self.start}, end={self.end})"


@dataclass(frozen=True, order=True)
class GlobalWindow(Window):
    """The one window of every element of a key; it never ends (``Long.MAX_VALUE``)."""

    def max_timestamp(self) -> int:
        return LONG_MAX

    def __repr__(self) -> str:
        return "GlobalWindow"


def java_remainder(dividend: int, divisor: int) -> int:
    """Java's ``%``: the sign of the dividend, so Flink's negative-timestamp branch ports as
    written."""
    remainder = abs(dividend) % abs(divisor)
    return -remainder if dividend < 0 else remainder


def get_window_start_with_offset(timestamp: int, offset: int, window_size: int) -> int:
    """Flink's ``TimeWindow.getWindowStartWithOffset``."""
    remainder = java_remainder(timestamp - offset, window_size)
    return timestamp - (remainder + window_size if remainder < 0 else remainder)


def merge_time_windows(
    windows: Iterable[TimeWindow], callback: Callable[[list[TimeWindow], TimeWindow], None],
) -> None:
    """Flink's ``TimeWindow.mergeWindows``: ``callback(merged, result)`` for each run of two
    or more distinct intersecting windows (equal ones collapse, as in Flink's set)."""
    runs: list[tuple[TimeWindow, list[TimeWindow]]] = []  # (cover, members)
    for candidate in sorted(windows, key=lambda w: w.start):
        if runs and runs[-1][0].intersects(candidate):
            cover, members = runs[-1]
            runs[-1] = (cover.cover(candidate), members)
            if candidate not in members:
                members.append(candidate)
        else:
            runs.append((candidate, [candidate]))
    for result, merged in runs:
        if len(merged) > 1:
            callback(merged, result)


def window_to_data(window: Window) -> Any:
    """``[start, end]`` or ``"global"``."""
    if isinstance(window, TimeWindow):
        return list(window)
    if isinstance(window, GlobalWindow):
        return "global"
    raise TypeError(f"cannot snapshot a window of type {type(window).__name__}")


def window_from_data(data: Any) -> Window:
    if data == "global":
        return GlobalWindow()
    start, end = data
    return TimeWindow(int(start), int(end))
