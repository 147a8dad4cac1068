"""Flink's built-in triggers, callback for callback.

Each ``on_merge`` follows Flink's: the event-time and processing-time triggers register the
merged window's end only when it is still ahead of the clock (otherwise ``on_element`` fires it
at once, and a timer would fire it twice).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from flinkish_core.watermark import MIN_WATERMARK
from flinkish_core.windowing.partitioned_state import ReducingStateDescriptor
from flinkish_core.windowing.trigger import Trigger, TriggerContext, TriggerResult
from flinkish_core.windowing.window import Window, java_remainder

__all__ = [
    "ContinuousEventTimeTrigger", "ContinuousProcessingTimeTrigger", "CountTrigger",
    "EventTimeTrigger", "NeverTrigger", "ProcessingTimeTrigger", "PurgingTrigger",
]


class NeverTrigger(Trigger):
    """Never fires: the default of :class:`GlobalWindows`."""

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        return None


class EventTimeTrigger(Trigger):
    """Fires once the watermark passes the window's end (W >= ``max_timestamp()``); an element
    for a window already past it fires at once. The default of event-time assigners."""

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        if window.max_timestamp() <= ctx.current_watermark:
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if time == window.max_timestamp() else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        if window.max_timestamp() > ctx.current_watermark:
            ctx.register_event_time_timer(window.max_timestamp())

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        ctx.delete_event_time_timer(window.max_timestamp())


class ProcessingTimeTrigger(Trigger):
    """Fires when the processing time reaches the window's end. The default of
    processing-time assigners."""

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        ctx.register_processing_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        if window.max_timestamp() > ctx.current_processing_time:
            ctx.register_processing_time_timer(window.max_timestamp())

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        ctx.delete_processing_time_timer(window.max_timestamp())


class CountTrigger(Trigger):
    """Fires every ``max_count`` elements of a window (the count restarts after each)."""

    def __init__(self, max_count: int) -> None:
        self.max_count = max_count
        self._count = ReducingStateDescriptor[int]("count", operator.add)

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        count = ctx.get_partitioned_state(self._count)
        count.add(1)
        if count.get() >= self.max_count:
            count.clear()
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        ctx.merge_partitioned_state(self._count)

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        ctx.get_partitioned_state(self._count).clear()

    def __repr__(self) -> str:
        return f"CountTrigger({self.max_count})"


class _ContinuousTrigger(Trigger):
    """What Flink's two continuous triggers share: the next firing time, aligned to multiples of
    ``interval`` and capped at the window's end, kept in reducing state (the earliest wins when
    windows merge) and registered as a timer of the subclass's clock."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self._fire_time = ReducingStateDescriptor[int]("fire-time", min)

    # the subclass's clock
    _register_timer: Callable[[TriggerContext, int], None]
    _delete_timer: Callable[[TriggerContext, int], None]

    def _register_next(self, time: int, window: Window, ctx: TriggerContext) -> None:
        next_fire = min(time + self.interval, window.max_timestamp())
        ctx.get_partitioned_state(self._fire_time).add(next_fire)
        self._register_timer(ctx, next_fire)

    def _take_fire_time(self, time: int, ctx: TriggerContext) -> bool:
        """Whether ``time`` is the registered firing time (then cleared for the next)."""
        fire_time = ctx.get_partitioned_state(self._fire_time)
        if fire_time.get() != time:
            return False
        fire_time.clear()
        return True

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        ctx.merge_partitioned_state(self._fire_time)
        next_fire = ctx.get_partitioned_state(self._fire_time).get()
        if next_fire is not None:
            self._register_timer(ctx, next_fire)

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        fire_time = ctx.get_partitioned_state(self._fire_time)
        time = fire_time.get()
        if time is not None:
            self._delete_timer(ctx, time)
            fire_time.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.interval})"


class ContinuousEventTimeTrigger(_ContinuousTrigger):
    """Fires every ``interval`` of event time (early results), and at the window's end."""

    _register_timer = staticmethod(TriggerContext.register_event_time_timer)
    _delete_timer = staticmethod(TriggerContext.delete_event_time_timer)

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        if window.max_timestamp() <= ctx.current_watermark:
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.max_timestamp())
        if ctx.get_partitioned_state(self._fire_time).get() is None:
            time = MIN_WATERMARK if timestamp is None else timestamp
            self._register_next(time - java_remainder(time, self.interval), window, ctx)
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        if time == window.max_timestamp():
            return TriggerResult.FIRE
        if self._take_fire_time(time, ctx):
            self._register_next(time, window, ctx)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE


class ContinuousProcessingTimeTrigger(_ContinuousTrigger):
    """Fires every ``interval`` of processing time, aligned to multiples of it."""

    _register_timer = staticmethod(TriggerContext.register_processing_time_timer)
    _delete_timer = staticmethod(TriggerContext.delete_processing_time_timer)

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        if ctx.get_partitioned_state(self._fire_time).get() is None:
            now = ctx.current_processing_time
            self._register_next(now - java_remainder(now, self.interval), window, ctx)
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        if self._take_fire_time(time, ctx):
            # the firing at the window's end is the last one: registering min(end + interval,
            # end) again would be a timer already due, firing the window in a loop
            if time < window.max_timestamp():
                self._register_next(time, window, ctx)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE


class PurgingTrigger(Trigger):
    """Wraps a trigger and turns each of its FIREs into FIRE_AND_PURGE."""

    def __init__(self, nested: Trigger) -> None:
        self.nested = nested

    @staticmethod
    def _purging(result: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if result.is_fire else result

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        return self._purging(self.nested.on_element(element, timestamp, window, ctx))

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_event_time(time, window, ctx))

    def on_processing_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.nested.on_processing_time(time, window, ctx))

    def can_merge(self) -> bool:
        return self.nested.can_merge()

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        self.nested.on_merge(window, ctx)

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        self.nested.clear(window, ctx)

    def __repr__(self) -> str:
        return f"PurgingTrigger({self.nested!r})"
