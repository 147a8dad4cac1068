"""Window assigners: which windows an element belongs to, after Flink's ``WindowAssigner``s.

Every assigner says whether it works in event time (windows end by the watermark and can be
late) or in processing time (windows end by the wall clock; nothing is ever late), and which
trigger fires its windows when the user names none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from flinkish_core.watermark import MIN_WATERMARK
from flinkish_core.windowing.trigger import Trigger
from flinkish_core.windowing.triggers import EventTimeTrigger, NeverTrigger, ProcessingTimeTrigger
from flinkish_core.windowing.window import (
    GlobalWindow,
    TimeWindow,
    Window,
    get_window_start_with_offset,
    merge_time_windows,
)

__all__ = [
    "EventTimeSessionWindows", "GlobalWindows", "MergingWindowAssigner",
    "ProcessingTimeSessionWindows", "SlidingEventTimeWindows", "SlidingProcessingTimeWindows",
    "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "WindowAssigner",
    "WindowAssignerContext",
]


class WindowAssignerContext(Protocol):
    """What an assigner may ask the operator: the current processing time."""

    @property
    def current_processing_time(self) -> int: ...


class WindowAssigner:
    """Assigns an element with its timestamp to zero or more windows."""

    is_event_time: bool = True

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssignerContext,
    ) -> list[Window]:
        raise NotImplementedError

    def default_trigger(self) -> Trigger:
        """The trigger that fires a window at its end, by the assigner's clock."""
        return EventTimeTrigger() if self.is_event_time else ProcessingTimeTrigger()

    def _time(self, timestamp: int | None, context: WindowAssignerContext) -> int:
        """The element's event time, or the operator's processing time."""
        if not self.is_event_time:
            now = context.current_processing_time
            if now == MIN_WATERMARK:
                raise ValueError(
                    "processing-time windows need the processing time: advance it "
                    "(process_processing_time) before the first element"
                )
            return now
        if timestamp is None:
            raise ValueError(
                "an element without a timestamp cannot be assigned to event-time windows: give "
                "every element its event time"
            )
        return timestamp


class MergingWindowAssigner(WindowAssigner):
    """An assigner whose windows merge when they overlap (sessions)."""

    def merge_windows(
        self, windows: list[TimeWindow], callback: Callable[[list[TimeWindow], TimeWindow], None],
    ) -> None:
        """Calls ``callback(to_be_merged, merge_result)`` for each group of windows to merge."""
        merge_time_windows(windows, callback)


class TumblingEventTimeWindows(WindowAssigner):
    """Fixed-size, non-overlapping windows ``[start, start + size)`` aligned to ``offset``."""

    def __init__(self, size: int, offset: int = 0) -> None:
        if abs(offset) >= size or size <= 0:
            raise ValueError(
                "TumblingWindows parameters must satisfy abs(offset) < size and size > 0, got "
                f"size={size}, offset={offset}"
            )
        self.size = size
        self.offset = offset

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssignerContext,
    ) -> list[Window]:
        time = self._time(timestamp, context)
        start = get_window_start_with_offset(time, self.offset % self.size, self.size)
        return [TimeWindow(start, start + self.size)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, offset={self.offset})"


class TumblingProcessingTimeWindows(TumblingEventTimeWindows):
    """Tumbling windows over the operator's processing time (the element's timestamp is
    ignored)."""

    is_event_time = False


class SlidingEventTimeWindows(WindowAssigner):
    """Windows of ``size`` starting every ``slide``: an element belongs to ``size / slide``
    of them."""

    def __init__(self, size: int, slide: int, offset: int = 0) -> None:
        if abs(offset) >= slide or size <= 0 or slide <= 0:
            raise ValueError(
                "SlidingWindows parameters must satisfy abs(offset) < slide and size > 0, got "
                f"size={size}, slide={slide}, offset={offset}"
            )
        self.size = size
        self.slide = slide
        self.offset = offset

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssignerContext,
    ) -> list[Window]:
        time = self._time(timestamp, context)
        windows: list[Window] = []
        start = get_window_start_with_offset(time, self.offset, self.slide)
        while start > time - self.size:
            windows.append(TimeWindow(start, start + self.size))
            start -= self.slide
        return windows

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(size={self.size}, slide={self.slide}, "
                f"offset={self.offset})")


class SlidingProcessingTimeWindows(SlidingEventTimeWindows):
    """Sliding windows over the operator's processing time."""

    is_event_time = False


GapExtractor = Callable[[Any], int]
"""Flink's ``SessionWindowTimeGapExtractor``: the session gap an element opens."""


class EventTimeSessionWindows(MergingWindowAssigner):
    """Sessions: each element opens ``[t, t + gap)``; overlapping ones merge. ``gap`` is a
    number of milliseconds or a function of the element (Flink's dynamic sessions)."""

    def __init__(self, gap: int | GapExtractor) -> None:
        if isinstance(gap, int) and gap <= 0:
            raise ValueError(f"a session gap must be > 0, got {gap}")
        self.gap = gap

    @classmethod
    def with_gap(cls, gap: int) -> EventTimeSessionWindows:
        return cls(gap)

    @classmethod
    def with_dynamic_gap(cls, extractor: GapExtractor) -> EventTimeSessionWindows:
        return cls(extractor)

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssignerContext,
    ) -> list[Window]:
        time = self._time(timestamp, context)
        gap = self.gap if isinstance(self.gap, int) else self.gap(element)
        if gap <= 0:
            raise ValueError(f"a dynamic session gap must be > 0, got {gap} for {element!r}")
        return [TimeWindow(time, time + gap)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gap={self.gap!r})"


class ProcessingTimeSessionWindows(EventTimeSessionWindows):
    """Sessions over the operator's processing time."""

    is_event_time = False


class GlobalWindows(WindowAssigner):
    """Every element of a key in one :class:`GlobalWindow`; it fires only by a custom trigger
    (the default trigger never fires). As in Flink it is not an event-time assigner: a global
    window is never late and gets no cleanup timer."""

    is_event_time = False

    def assign_windows(
        self, element: Any, timestamp: int | None, context: WindowAssignerContext,
    ) -> list[Window]:
        return [GlobalWindow()]

    def default_trigger(self) -> Trigger:
        return NeverTrigger()

    def __repr__(self) -> str:
        return "GlobalWindows()"
