"""Flink's ``Trigger``: decides when a window fires (computes its result) and when its
contents are purged. A trigger is stateless itself: what it remembers lives in per-window
partitioned state (:class:`TriggerContext`), so it is snapshotted and merged with the windows.
"""

from __future__ import annotations

import enum
from typing import Any

from flinkish_core.windowing.partitioned_state import (
    PartitionedState,
    PartitionedStateStore,
    ReducingStateDescriptor,
    StateDescriptor,
)
from flinkish_core.windowing.timer_service import InternalTimerService
from flinkish_core.windowing.window import Window

__all__ = ["Trigger", "TriggerContext", "TriggerResult"]


class TriggerResult(enum.Enum):
    """What the operator does with the window after a trigger callback."""

    CONTINUE = (False, False)
    FIRE = (True, False)
    PURGE = (False, True)
    FIRE_AND_PURGE = (True, True)

    def __init__(self, is_fire: bool, is_purge: bool) -> None:
        # plain attributes, not properties over ``value``: read for every element
        self.is_fire = is_fire
        self.is_purge = is_purge


class TriggerContext:
    """What a trigger may touch: the clocks, its key+window's timers and partitioned state
    (Flink's ``WindowOperator.Context``, pointed at a key and window before each callback)."""

    def __init__(self, timers: InternalTimerService, state: PartitionedStateStore) -> None:
        self._timers = timers
        self._state = state
        self.key: Any = None
        self.window: Window | None = None
        self.merged_windows: list[Window] = []

    def _current(self) -> Window:
        if self.window is None:
            raise RuntimeError("the trigger context is not pointed at a window")
        return self.window

    @property
    def current_watermark(self) -> int:
        return self._timers.current_watermark

    @property
    def current_processing_time(self) -> int:
        return self._timers.current_processing_time

    def register_event_time_timer(self, time: int) -> None:
        self._timers.event_time_timers.register(self.key, self._current(), time)

    def delete_event_time_timer(self, time: int) -> None:
        self._timers.event_time_timers.delete(self.key, self._current(), time)

    def register_processing_time_timer(self, time: int) -> None:
        self._timers.processing_time_timers.register(self.key, self._current(), time)

    def delete_processing_time_timer(self, time: int) -> None:
        self._timers.processing_time_timers.delete(self.key, self._current(), time)

    def get_partitioned_state(self, descriptor: StateDescriptor) -> PartitionedState:
        return PartitionedState(self._state, self.key, self._current(), descriptor)

    def merge_partitioned_state(self, descriptor: ReducingStateDescriptor[Any]) -> None:
        """In ``on_merge``: folds the merged windows' state into the new window's."""
        self._state.merge(self.key, self._current(), self.merged_windows, descriptor)


class Trigger:
    """Base class: a trigger that never fires. Override the callbacks you need."""

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        """Whether the trigger supports merging windows (sessions)."""
        return False

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        """Called on the merge result when windows merge; ``ctx.merged_windows`` are the
        windows merged into it."""
        raise NotImplementedError(f"{type(self).__name__} does not support merging windows")

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        """Removes the trigger's timers and state of ``window`` (it is being dropped)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
