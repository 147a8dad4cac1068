"""Flink's ``InternalTimerService`` for windows: event-time and processing-time timers per
key, window and timestamp, each registered at most once. They fire in timestamp order, ties in
registration order (so a run is deterministic); a timer registered while firing that is already
due fires in the same advance, as in Flink's loop over the queue's head.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flinkish_core.watermark import MIN_WATERMARK
from flinkish_core.windowing.window import Window

__all__ = ["InternalTimer", "InternalTimerService", "TimerQueue"]


@dataclass(frozen=True)
class InternalTimer:
    """A timer: the key and window it belongs to and the time it fires at."""

    timestamp: int
    key: Any
    window: Window


class TimerQueue:
    """Timers of one time domain: a set for deduplication and deletion, a heap for order.
    Deleted timers stay in the heap until they surface; ``seq`` tells a live heap entry from a
    stale one of a timer deleted and registered again."""

    def __init__(self) -> None:
        self._live: dict[tuple[Any, Window, int], int] = {}
        self._heap: list[tuple[int, int, Any, Window]] = []
        self.next_seq = 0

    def register(self, key: Any, window: Window, timestamp: int, seq: int | None = None) -> None:
        if (key, window, timestamp) in self._live:
            return
        seq = self.next_seq if seq is None else seq
        self.next_seq = max(self.next_seq, seq + 1)
        self._live[(key, window, timestamp)] = seq
        heapq.heappush(self._heap, (timestamp, seq, key, window))

    def delete(self, key: Any, window: Window, timestamp: int) -> None:
        self._live.pop((key, window, timestamp), None)

    def _head(self) -> tuple[int, int, Any, Window] | None:
        """The earliest live heap entry, stale entries above it dropped."""
        heap = self._heap
        while heap:
            timestamp, seq, key, window = head = heap[0]
            if self._live.get((key, window, timestamp)) == seq:
                return head
            heapq.heappop(heap)
        return None

    def poll(self, up_to: int) -> InternalTimer | None:
        """Removes and returns the earliest live timer due at ``up_to``, or None."""
        due = self.pop_due(up_to)
        return None if due is None else InternalTimer(*due)

    def pop_due(self, up_to: int) -> tuple[int, Any, Window] | None:
        """:meth:`poll` as a plain ``(timestamp, key, window)``."""
        head = self._head()
        if head is None or head[0] > up_to:
            return None
        timestamp, _, key, window = heapq.heappop(self._heap)
        del self._live[(key, window, timestamp)]
        return timestamp, key, window

    def earliest(self) -> int | None:
        head = self._head()
        return None if head is None else head[0]

    def count(self, window: Window | None = None) -> int:
        return sum(1 for (_, w, _) in self._live if window is None or w == window)

    def items(self) -> Iterator[tuple[Any, Window, int, int]]:
        """Every live timer as (key, window, timestamp, seq), in firing order."""
        for (key, window, timestamp), seq in sorted(
                self._live.items(), key=lambda item: (item[0][2], item[1])):
            yield key, window, timestamp, seq

    def columns(self) -> tuple[list[Any], list[Window], list[int], list[int]]:
        """Every live timer as four columns: keys, windows, timestamps, seqs."""
        if not self._live:
            return [], [], [], []
        keys, windows, timestamps = (list(c) for c in zip(*self._live, strict=True))
        return keys, windows, timestamps, list(self._live.values())

    def load(self, keys: list[Any], windows: list[Window], timestamps: list[int],
             seqs: list[int]) -> None:
        """Registers the timers of :meth:`columns` (into an empty queue) in one step."""
        self._live = dict(zip(zip(keys, windows, timestamps, strict=True), seqs, strict=True))
        self._heap = list(zip(timestamps, seqs, keys, windows, strict=True))
        heapq.heapify(self._heap)
        self.next_seq = max(self.next_seq, max(seqs, default=-1) + 1)


class InternalTimerService:
    """The clocks (watermark, processing time) and the timers of one window operator."""

    def __init__(self) -> None:
        self.current_watermark = MIN_WATERMARK
        self.current_processing_time = MIN_WATERMARK
        self.event_time_timers = TimerQueue()
        self.processing_time_timers = TimerQueue()
