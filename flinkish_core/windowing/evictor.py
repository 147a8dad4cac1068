"""Flink's evictors: remove elements from a window's contents before and/or after the window
function runs (``EvictingWindowOperator``). A window with an evictor keeps every element with
its timestamp, since the evictor needs them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flinkish_core.windowing.window import Window

__all__ = ["CountEvictor", "DeltaEvictor", "Evictor", "TimeEvictor", "TimestampedValue"]


@dataclass
class TimestampedValue:
    """An element of a window with its timestamp (None: the element had none)."""

    value: Any
    timestamp: int | None


class Evictor:
    """Base class: ``evict_before``/``evict_after`` remove elements from the list in place."""

    def evict_before(self, elements: list[TimestampedValue], size: int, window: Window) -> None:
        return None

    def evict_after(self, elements: list[TimestampedValue], size: int, window: Window) -> None:
        return None


class _BeforeOrAfter(Evictor):
    def __init__(self, evict_after: bool) -> None:
        self.do_evict_after = evict_after

    def evict_before(self, elements: list[TimestampedValue], size: int, window: Window) -> None:
        if not self.do_evict_after:
            self._evict(elements, size)

    def evict_after(self, elements: list[TimestampedValue], size: int, window: Window) -> None:
        if self.do_evict_after:
            self._evict(elements, size)

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        raise NotImplementedError


class CountEvictor(_BeforeOrAfter):
    """Keeps at most ``max_count`` elements: the oldest (first added) go first."""

    def __init__(self, max_count: int, evict_after: bool = False) -> None:
        super().__init__(evict_after)
        self.max_count = max_count

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        if size > self.max_count:
            del elements[:size - self.max_count]


class TimeEvictor(_BeforeOrAfter):
    """Keeps the elements within ``window_size`` of the newest element's timestamp (drops those
    at or before newest - window_size). Without timestamps it keeps everything."""

    def __init__(self, window_size: int, evict_after: bool = False) -> None:
        super().__init__(evict_after)
        self.window_size = window_size

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        # as Flink, the first element says whether the elements have timestamps
        if not elements or elements[0].timestamp is None:
            return
        newest = max(e.timestamp for e in elements if e.timestamp is not None)
        cutoff = newest - self.window_size
        elements[:] = [e for e in elements if e.timestamp is None or e.timestamp > cutoff]


class DeltaEvictor(_BeforeOrAfter):
    """Drops the elements whose ``delta(element, last element) >= threshold``."""

    def __init__(
        self, threshold: float, delta: Callable[[Any, Any], float], evict_after: bool = False,
    ) -> None:
        super().__init__(evict_after)
        self.threshold = threshold
        self.delta = delta

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        if not elements:
            return
        last = elements[-1].value
        elements[:] = [e for e in elements if self.delta(e.value, last) < self.threshold]
