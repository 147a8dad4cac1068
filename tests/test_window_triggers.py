"""Flink's trigger tests, replayed against :mod:`flinkish_core.windowing.triggers`.

Sources: apache/flink, ``flink-streaming-java/src/test/java/org/apache/flink/streaming/runtime/
operators/windowing/`` ``EventTimeTriggerTest``, ``ProcessingTimeTriggerTest``,
``CountTriggerTest``, ``ContinuousEventTimeTriggerTest`` and ``PurgingTriggerTest``; each test
is named ``test_<class>_<method>``.

:class:`TriggerTestHarness` is Flink's ``TriggerTestHarness``: one key, a timer service and the
trigger's partitioned state. ``StreamRecord<Object>(1)`` has no timestamp (None here; Flink's
``Long.MIN_VALUE``). As in Flink's ``TestInternalTimerService``, advancing a clock fires the
timers due *before* the callbacks ran; timers they register wait for the next advance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flinkish_core.windowing import (
    ContinuousEventTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    TimeWindow,
    Trigger,
    TriggerContext,
    TriggerResult,
    Window,
)
from flinkish_core.windowing.partitioned_state import PartitionedStateStore
from flinkish_core.windowing.timer_service import InternalTimer, InternalTimerService, TimerQueue

CONTINUE = TriggerResult.CONTINUE
FIRE = TriggerResult.FIRE
PURGE = TriggerResult.PURGE
FIRE_AND_PURGE = TriggerResult.FIRE_AND_PURGE

KEY = 1


class TriggerTestHarness:
    def __init__(self, trigger: Trigger) -> None:
        self.trigger = trigger
        self.timers = InternalTimerService()
        self.state = PartitionedStateStore()
        self.ctx = TriggerContext(self.timers, self.state)
        self.ctx.key = KEY

    def _point(self, window: Window) -> TriggerContext:
        self.ctx.window = window
        return self.ctx

    def process_element(self, window: Window, timestamp: int | None = None) -> TriggerResult:
        return self.trigger.on_element(1, timestamp, window, self._point(window))

    @staticmethod
    def _due(queue: TimerQueue, time: int) -> list[InternalTimer]:
        due = []
        while (timer := queue.poll(time)) is not None:
            due.append(timer)
        return due

    def advance_watermark(self, time: int) -> list[tuple[Window, TriggerResult]]:
        self.timers.current_watermark = time
        return [(t.window, self.invoke_on_event_time(t.timestamp, t.window))
                for t in self._due(self.timers.event_time_timers, time)]

    def advance_processing_time(self, time: int) -> list[tuple[Window, TriggerResult]]:
        self.timers.current_processing_time = time
        return [(t.window, self.trigger.on_processing_time(t.timestamp, t.window,
                                                           self._point(t.window)))
                for t in self._due(self.timers.processing_time_timers, time)]

    @staticmethod
    def _only(firings: list[tuple[Window, TriggerResult]], window: Window) -> TriggerResult:
        assert len(firings) == 1, f"Must have exactly one timer firing. Fired timers: {firings}"
        assert firings[0][0] == window, "Trigger fired for another window."
        return firings[0][1]

    def advance_watermark_for(self, time: int, window: Window) -> TriggerResult:
        return self._only(self.advance_watermark(time), window)

    def advance_processing_time_for(self, time: int, window: Window) -> TriggerResult:
        return self._only(self.advance_processing_time(time), window)

    def invoke_on_event_time(self, time: int, window: Window) -> TriggerResult:
        return self.trigger.on_event_time(time, window, self._point(window))

    def merge_windows(self, target: Window, merged: list[Window]) -> None:
        ctx = self._point(target)
        ctx.merged_windows = list(merged)
        self.trigger.on_merge(target, ctx)
        ctx.merged_windows = []
        for window in merged:
            self.clear_trigger_state(window)

    def clear_trigger_state(self, window: Window) -> None:
        self.trigger.clear(window, self._point(window))

    def num_state_entries(self, window: Window | None = None) -> int:
        return self.state.count(window)

    def num_event_time_timers(self, window: Window | None = None) -> int:
        return self.timers.event_time_timers.count(window)

    def num_processing_time_timers(self, window: Window | None = None) -> int:
        return self.timers.processing_time_timers.count(window)


W02, W24, W04, W46 = TimeWindow(0, 2), TimeWindow(2, 4), TimeWindow(0, 4), TimeWindow(4, 6)


# ------------------------------------------------ EventTimeTriggerTest

def test_event_time_trigger_window_separation_and_firing() -> None:
    """State of separate windows does not leak into other windows."""
    h = TriggerTestHarness(EventTimeTrigger())
    for window in (W02, W02, W02, W24, W24):
        assert h.process_element(window) is CONTINUE
    assert (h.num_state_entries(), h.num_processing_time_timers()) == (0, 0)
    assert h.num_event_time_timers() == 2
    assert h.num_event_time_timers(W02) == 1 and h.num_event_time_timers(W24) == 1

    assert h.advance_watermark_for(2, W02) is FIRE
    assert h.num_event_time_timers() == 1
    assert h.num_event_time_timers(W02) == 0 and h.num_event_time_timers(W24) == 1

    assert h.advance_watermark_for(4, W24) is FIRE
    assert (h.num_state_entries(), h.num_processing_time_timers()) == (0, 0)
    assert h.num_event_time_timers() == 0


def test_event_time_trigger_late_element_triggers_immediately() -> None:
    """Late elements fire at once, without a timer."""
    h = TriggerTestHarness(EventTimeTrigger())
    h.advance_watermark(2)
    assert h.process_element(W02) is FIRE
    assert (h.num_state_entries(), h.num_processing_time_timers()) == (0, 0)
    assert h.num_event_time_timers() == 0


def test_event_time_trigger_clear() -> None:
    """clear() does not leak across windows."""
    h = TriggerTestHarness(EventTimeTrigger())
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    assert h.num_event_time_timers() == 2
    h.clear_trigger_state(W24)
    assert h.num_event_time_timers() == 1
    assert h.num_event_time_timers(W02) == 1 and h.num_event_time_timers(W24) == 0
    h.clear_trigger_state(W02)
    assert (h.num_state_entries(), h.num_processing_time_timers()) == (0, 0)
    assert h.num_event_time_timers() == 0


def test_event_time_trigger_merging_windows() -> None:
    h = TriggerTestHarness(EventTimeTrigger())
    assert EventTimeTrigger().can_merge()
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    assert h.num_event_time_timers() == 2

    h.merge_windows(W04, [W02, W24])
    assert (h.num_state_entries(), h.num_processing_time_timers()) == (0, 0)
    assert h.num_event_time_timers() == 1
    assert h.num_event_time_timers(W02) == 0 and h.num_event_time_timers(W24) == 0
    assert h.num_event_time_timers(W04) == 1

    assert h.advance_watermark_for(4, W04) is FIRE
    assert h.num_event_time_timers() == 0


def test_event_time_trigger_merging_late_windows() -> None:
    """Merging a late window registers no timer: onElement() fires it, a timer would fire it
    a second time."""
    h = TriggerTestHarness(EventTimeTrigger())
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    assert h.num_event_time_timers() == 2
    h.advance_watermark(10)
    assert h.num_event_time_timers() == 0
    h.merge_windows(W04, [W02, W24])
    assert (h.num_state_entries(), h.num_processing_time_timers()) == (0, 0)
    assert h.num_event_time_timers() == 0 and h.num_event_time_timers(W04) == 0


# ------------------------------------------------ ProcessingTimeTriggerTest

def test_processing_time_trigger_window_separation_and_firing() -> None:
    h = TriggerTestHarness(ProcessingTimeTrigger())
    for window in (W02, W02, W02, W24, W24):
        assert h.process_element(window) is CONTINUE
    assert (h.num_state_entries(), h.num_event_time_timers()) == (0, 0)
    assert h.num_processing_time_timers() == 2
    assert h.num_processing_time_timers(W02) == 1 and h.num_processing_time_timers(W24) == 1

    assert h.advance_processing_time_for(2, W02) is FIRE
    assert h.num_processing_time_timers() == 1
    assert h.num_processing_time_timers(W02) == 0 and h.num_processing_time_timers(W24) == 1

    assert h.advance_processing_time_for(4, W24) is FIRE
    assert (h.num_state_entries(), h.num_event_time_timers()) == (0, 0)
    assert h.num_processing_time_timers() == 0


def test_processing_time_trigger_clear() -> None:
    h = TriggerTestHarness(ProcessingTimeTrigger())
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    assert h.num_processing_time_timers() == 2
    h.clear_trigger_state(W24)
    assert h.num_processing_time_timers() == 1
    assert h.num_processing_time_timers(W02) == 1 and h.num_processing_time_timers(W24) == 0
    h.clear_trigger_state(W02)
    assert (h.num_state_entries(), h.num_processing_time_timers()) == (0, 0)


def test_processing_time_trigger_merging_windows() -> None:
    h = TriggerTestHarness(ProcessingTimeTrigger())
    assert ProcessingTimeTrigger().can_merge()
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    h.merge_windows(W04, [W02, W24])
    assert (h.num_state_entries(), h.num_event_time_timers()) == (0, 0)
    assert h.num_processing_time_timers() == 1
    assert h.num_processing_time_timers(W02) == 0 and h.num_processing_time_timers(W24) == 0
    assert h.num_processing_time_timers(W04) == 1
    assert h.advance_processing_time_for(4, W04) is FIRE
    assert h.num_processing_time_timers() == 0


def test_processing_time_trigger_merging_late_windows() -> None:
    h = TriggerTestHarness(ProcessingTimeTrigger())
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    h.advance_processing_time(10)
    assert h.num_processing_time_timers() == 0
    h.merge_windows(W04, [W02, W24])
    assert (h.num_state_entries(), h.num_event_time_timers()) == (0, 0)
    assert h.num_processing_time_timers() == 0 and h.num_processing_time_timers(W04) == 0


# ------------------------------------------------ CountTriggerTest

def test_count_trigger_window_separation_and_firing() -> None:
    h = TriggerTestHarness(CountTrigger(3))
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    # shouldn't have any timers
    assert (h.num_processing_time_timers(), h.num_event_time_timers()) == (0, 0)
    assert h.num_state_entries() == 2
    assert h.num_state_entries(W02) == 1 and h.num_state_entries(W24) == 1

    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W02) is FIRE
    assert h.process_element(W24) is CONTINUE
    # CountTrigger clears its state in onElement when firing
    assert h.num_state_entries() == 1
    assert h.num_state_entries(W02) == 0 and h.num_state_entries(W24) == 1

    assert h.process_element(W24) is FIRE
    # now all state should be gone
    assert h.num_state_entries() == 0


def test_count_trigger_clear() -> None:
    h = TriggerTestHarness(CountTrigger(3))
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    assert h.num_state_entries() == 2
    h.clear_trigger_state(W24)
    assert h.num_state_entries() == 1
    assert h.num_state_entries(W02) == 1 and h.num_state_entries(W24) == 0
    h.clear_trigger_state(W02)
    assert h.num_state_entries() == 0


def test_count_trigger_merging_windows() -> None:
    h = TriggerTestHarness(CountTrigger(3))
    for window in (W02, W24, W46):
        assert h.process_element(window) is CONTINUE
    assert (h.num_processing_time_timers(), h.num_event_time_timers()) == (0, 0)
    assert h.num_state_entries() == 3

    h.merge_windows(W04, [W02, W24])
    assert h.num_state_entries() == 2
    assert h.num_state_entries(W02) == 0 and h.num_state_entries(W24) == 0
    assert h.num_state_entries(W04) == 1 and h.num_state_entries(W46) == 1

    assert h.process_element(W04) is FIRE
    assert h.num_state_entries() == 1
    assert h.num_state_entries(W04) == 0 and h.num_state_entries(W46) == 1

    assert h.process_element(W46) is CONTINUE
    assert h.process_element(W46) is FIRE
    assert h.num_state_entries() == 0


def test_count_trigger_merge_subsuming_window() -> None:
    h = TriggerTestHarness(CountTrigger(3))
    assert h.process_element(W24) is CONTINUE
    assert h.process_element(W46) is CONTINUE
    assert h.num_state_entries() == 2
    w08 = TimeWindow(0, 8)
    h.merge_windows(w08, [W24, W46])
    assert h.num_state_entries() == 1
    assert h.num_state_entries(W24) == 0 and h.num_state_entries(W46) == 0
    assert h.num_state_entries(w08) == 1
    assert h.process_element(w08) is FIRE
    assert h.num_state_entries() == 0


# ------------------------------------------------ ContinuousEventTimeTriggerTest

HOUR = 3_600_000


def test_continuous_event_time_trigger_trigger_handles_all_on_timer_calls() -> None:
    """No failure on a timer firing when there is no trigger state."""
    h = TriggerTestHarness(ContinuousEventTimeTrigger(5))
    assert (h.num_state_entries(), h.num_processing_time_timers()) == (0, 0)
    assert h.num_event_time_timers() == 0
    # the elements we now process fall into late windows: no trigger state is created
    h.advance_watermark(10)
    # late fires immediately
    assert h.process_element(W02) is FIRE
    # simulate a GC timer firing
    assert h.invoke_on_event_time(20, W02) is CONTINUE


def _fired(firings: list[tuple[Window, TriggerResult]], window: Window) -> bool:
    results = [r for w, r in firings if w == window]
    return bool(results) and all(r is FIRE for r in results)


def test_continuous_event_time_trigger_window_separation_and_firing() -> None:
    h = TriggerTestHarness(ContinuousEventTimeTrigger(HOUR))
    for window in (W02, W02, W02, W24, W24):
        assert h.process_element(window) is CONTINUE
    assert h.num_state_entries() == 2
    assert h.num_processing_time_timers() == 0
    assert h.num_event_time_timers() == 4
    assert h.num_event_time_timers(W02) == 2 and h.num_event_time_timers(W24) == 2

    assert _fired(h.advance_watermark(2), W02)
    assert h.num_state_entries() == 2
    assert h.num_event_time_timers() == 3
    assert h.num_event_time_timers(W02) == 1 and h.num_event_time_timers(W24) == 2

    assert _fired(h.advance_watermark(4), W24)
    assert h.num_state_entries() == 2
    assert h.num_processing_time_timers() == 0
    assert h.num_event_time_timers() == 2


def test_continuous_event_time_trigger_late_element_triggers_immediately() -> None:
    h = TriggerTestHarness(ContinuousEventTimeTrigger(HOUR))
    h.advance_watermark(2)
    assert h.process_element(W02) is FIRE
    assert (h.num_state_entries(), h.num_processing_time_timers()) == (0, 0)
    assert h.num_event_time_timers() == 0


def test_continuous_event_time_trigger_clear() -> None:
    h = TriggerTestHarness(ContinuousEventTimeTrigger(HOUR))
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    assert h.num_state_entries() == 2
    assert h.num_event_time_timers() == 4

    h.clear_trigger_state(W24)
    assert h.num_state_entries() == 1
    assert h.num_event_time_timers() == 3
    assert h.num_event_time_timers(W02) == 2 and h.num_event_time_timers(W24) == 1

    h.clear_trigger_state(W02)
    assert h.num_state_entries() == 0
    assert h.num_event_time_timers() == 2  # doesn't clean up timers


def test_continuous_event_time_trigger_merging_windows() -> None:
    h = TriggerTestHarness(ContinuousEventTimeTrigger(HOUR))
    assert ContinuousEventTimeTrigger(HOUR).can_merge()
    assert h.process_element(W02) is CONTINUE
    assert h.process_element(W24) is CONTINUE
    assert h.num_state_entries() == 2
    assert h.num_event_time_timers() == 4

    h.merge_windows(W04, [W02, W24])
    assert h.num_state_entries() == 1
    assert h.num_event_time_timers() == 5  # on merging, timers are not cleaned up
    assert h.num_event_time_timers(W02) == 2 and h.num_event_time_timers(W24) == 2
    assert h.num_event_time_timers(W04) == 1

    assert _fired(h.advance_watermark(4), W04)
    assert h.num_state_entries() == 1
    assert h.num_processing_time_timers() == 0
    assert h.num_event_time_timers() == 1


# ------------------------------------------------ PurgingTriggerTest

def test_purging_trigger_all_methods_implemented() -> None:
    """PurgingTrigger forwards every callback of Trigger."""
    callbacks = [name for name, v in vars(Trigger).items()
                 if callable(v) and not name.startswith("_")]
    assert callbacks
    assert [name for name in callbacks if name not in vars(PurgingTrigger)] == []


class ScriptedTrigger(Trigger):
    """Stands in for Flink's mock trigger: returns the results it is told to, records calls."""

    def __init__(self) -> None:
        self.element_result = CONTINUE
        self.event_result = CONTINUE
        self.processing_result = CONTINUE
        self.on_element_action: Callable[[TriggerContext], None] | None = None
        self.merges: list[Window] = []
        self.clears: list[Window] = []

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        if self.on_element_action is not None:
            self.on_element_action(ctx)
        return self.element_result

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return self.event_result

    def on_processing_time(
        self, time: int, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        return self.processing_result

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        self.merges.append(window)

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        self.clears.append(window)


@pytest.mark.parametrize(("nested", "purging"), [
    (CONTINUE, CONTINUE), (FIRE, FIRE_AND_PURGE), (FIRE_AND_PURGE, FIRE_AND_PURGE),
    (PURGE, PURGE),
])
def test_purging_trigger_forwarding(nested: TriggerResult, purging: TriggerResult) -> None:
    mock = ScriptedTrigger()
    h = TriggerTestHarness(PurgingTrigger(mock))

    mock.element_result = nested
    assert h.process_element(W02) is purging

    # register some timers that we can step through to call onEventTime several times in a row
    def event_timers(ctx: TriggerContext) -> None:
        for t in (1, 2, 3, 4):
            ctx.register_event_time_timer(t)
    mock.element_result, mock.on_element_action = CONTINUE, event_timers
    h.process_element(W02)
    assert h.num_event_time_timers(W02) == 4
    mock.event_result = nested
    assert h.advance_watermark_for(1, W02) is purging

    def processing_timers(ctx: TriggerContext) -> None:
        for t in (1, 2, 3, 4):
            ctx.register_processing_time_timer(t)
    mock.on_element_action = processing_timers
    h.process_element(W02)
    assert h.num_processing_time_timers(W02) == 4
    mock.processing_result = nested
    assert h.advance_processing_time_for(1, W02) is purging

    h.merge_windows(W02, [TimeWindow(0, 1)])
    assert mock.merges == [W02]
    h.clear_trigger_state(W02)
    assert mock.clears == [TimeWindow(0, 1), W02]
