"""Flink's ``WindowOperatorContractTest``, replayed against :class:`WindowOperator`.

Source: apache/flink, ``flink-streaming-java/src/test/java/org/apache/flink/streaming/runtime/
operators/windowing/WindowOperatorContractTest.java``: how the operator deals with its assigner,
trigger, window function and state. Flink drives the operator with Mockito mocks; here the
mocks are small scripted classes (:class:`ScriptedAssigner`, :class:`ScriptedTrigger`,
:class:`RecordingFunction`) that return what the Flink test stubs and record the calls it
verifies. Flink's paired ``...EventTime...`` / ``...ProcessingTime...`` methods (its
``TimeDomainAdaptor``) are one test parametrized by the time domain; the docstring names the
Flink methods. ``numKeyedStateEntries`` is :meth:`WindowOperator.num_state_entries`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from flinkish_core.watermark import MAX_WATERMARK, MIN_WATERMARK
from flinkish_core.windowing import (
    GlobalWindow,
    LateElement,
    MergingWindowAssigner,
    ProcessWindowFunction,
    TimeWindow,
    Trigger,
    TriggerContext,
    TriggerResult,
    ValueStateDescriptor,
    Window,
    WindowAssigner,
    WindowContext,
    WindowOperator,
    WindowResult,
)

CONTINUE = TriggerResult.CONTINUE
FIRE = TriggerResult.FIRE
PURGE = TriggerResult.PURGE
FIRE_AND_PURGE = TriggerResult.FIRE_AND_PURGE
STRING_STATE = ValueStateDescriptor("string-state")


class ScriptedAssigner(WindowAssigner):
    """Returns ``windows`` for every element; records the calls."""

    def __init__(self, is_event_time: bool = True, windows: list[Window] | None = None) -> None:
        self.is_event_time = is_event_time
        self.windows: list[Window] = windows or []
        self.calls: list[tuple[Any, int | None]] = []

    def assign_windows(self, element: Any, timestamp: int | None, context: Any) -> list[Window]:
        self.calls.append((element, timestamp))
        return list(self.windows)

    def default_trigger(self) -> Trigger:
        return Trigger()


class ScriptedMergingAssigner(MergingWindowAssigner, ScriptedAssigner):
    """A merging assigner that merges nothing unless told to (Flink's ``shouldMergeWindows``):
    ``merge = (expected windows, windows to merge, result)``."""

    def __init__(self, is_event_time: bool = True, windows: list[Window] | None = None) -> None:
        ScriptedAssigner.__init__(self, is_event_time, windows)
        self.merge: tuple[list[TimeWindow], list[TimeWindow], TimeWindow] | None = None

    def merge_windows(
        self, windows: list[TimeWindow], callback: Callable[[list[TimeWindow], TimeWindow], None],
    ) -> None:
        if self.merge is not None:
            expected, to_merge, result = self.merge
            assert sorted(windows) == sorted(expected)
            callback(list(to_merge), result)


OnElement = Callable[[Window, TriggerContext], TriggerResult]
OnTime = Callable[[int, Window], TriggerResult]


class ScriptedTrigger(Trigger):
    """Flink's ``mockTrigger()``: CONTINUE everywhere until told otherwise; records calls."""

    def __init__(self) -> None:
        self.on_element_do: OnElement = lambda window, ctx: CONTINUE
        self.on_time: dict[bool, OnTime] = {
            True: lambda time, window: CONTINUE, False: lambda time, window: CONTINUE}
        self.on_merge_do: Callable[[Window, TriggerContext], None] = lambda window, ctx: None
        self.clear_do: Callable[[Window, TriggerContext], None] = lambda window, ctx: None
        self.element_calls: list[tuple[Any, int | None, Window]] = []
        self.time_calls: dict[bool, list[tuple[int, Window]]] = {True: [], False: []}
        self.merges: list[Window] = []
        self.clears: list[Window] = []

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        self.element_calls.append((element, timestamp, window))
        return self.on_element_do(window, ctx)

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        self.time_calls[True].append((time, window))
        return self.on_time[True](time, window)

    def on_processing_time(
        self, time: int, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        self.time_calls[False].append((time, window))
        return self.on_time[False](time, window)

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        self.merges.append(window)
        self.on_merge_do(window, ctx)

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        self.clears.append(window)
        self.clear_do(window, ctx)


class RecordingFunction(ProcessWindowFunction[int, Any]):
    """Flink's mocked window function: records (key, window, elements) and the contexts of
    ``process`` and ``clear``, returns ``outputs``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Window, list[int]]] = []
        self.contexts: list[WindowContext] = []
        self.clears: list[WindowContext] = []
        self.outputs: list[Any] = []

    def process(self, key: Any, context: WindowContext, elements: list[int]) -> list[Any]:
        self.calls.append((key, context.window, list(elements)))
        self.contexts.append(context)
        return list(self.outputs)

    def clear(self, key: Any, context: WindowContext) -> None:
        self.clears.append(context)


@dataclass(frozen=True)
class Domain:
    """Flink's ``TimeDomainAdaptor``: event time or processing time."""

    event_time: bool

    def register(self, ctx: TriggerContext, time: int) -> None:
        if self.event_time:
            ctx.register_event_time_timer(time)
        else:
            ctx.register_processing_time_timer(time)

    def delete(self, ctx: TriggerContext, time: int) -> None:
        if self.event_time:
            ctx.delete_event_time_timer(time)
        else:
            ctx.delete_processing_time_timer(time)

    def num_timers(self, op: WindowOperator) -> int:
        return op.num_event_time_timers() if self.event_time else op.num_processing_time_timers()

    def num_timers_other_domain(self, op: WindowOperator) -> int:
        return op.num_processing_time_timers() if self.event_time else op.num_event_time_timers()


DOMAINS = [pytest.param(Domain(True), id="event_time"),
           pytest.param(Domain(False), id="processing_time")]


class Harness:
    """One operator with scripted parts, keyed by the element itself (Flink's tests key the
    ``Integer`` elements by identity)."""

    def __init__(
        self, assigner: ScriptedAssigner, lateness: int = 0, trigger: ScriptedTrigger | None = None,
    ) -> None:
        self.assigner = assigner
        self.trigger = trigger or ScriptedTrigger()
        self.function = RecordingFunction()
        self.lateness = lateness
        self.operator = self._build()
        self.results: list[WindowResult] = []
        self.late: list[LateElement] = []

    def _build(self) -> WindowOperator:
        return WindowOperator(self.assigner, self.function, self.trigger,
                              allowed_lateness=self.lateness)

    def element(self, value: int, timestamp: int = 0) -> None:
        out = self.operator.process_element(value, value, timestamp)
        self.results += out.results
        self.late += out.late

    def watermark(self, watermark: int) -> None:
        self.results += self.operator.process_watermark(watermark).results

    def advance(self, domain: Domain, time: int) -> None:
        if domain.event_time:
            self.watermark(time)
        else:
            self.results += self.operator.process_processing_time(time).results

    def entries(self) -> int:
        return self.operator.num_state_entries()


def _register_and_set_state(domain: Domain, time: int, result: TriggerResult) -> OnElement:
    """Flink's recurring answer: a timer at ``time`` and the string state, then ``result``."""
    def on_element(window: Window, ctx: TriggerContext) -> TriggerResult:
        domain.register(ctx, time)
        ctx.get_partitioned_state(STRING_STATE).update("hello")
        return result
    return on_element


def _registers(domain: Domain, time: int, result: TriggerResult = CONTINUE) -> OnElement:
    """An ``on_element`` that registers a timer at ``time``, then answers ``result``."""
    def on_element(window: Window, ctx: TriggerContext) -> TriggerResult:
        domain.register(ctx, time)
        return result
    return on_element


def _deletes(domain: Domain, time: int) -> OnElement:
    def on_element(window: Window, ctx: TriggerContext) -> TriggerResult:
        domain.delete(ctx, time)
        return CONTINUE
    return on_element


def _merge_registers_and_sets_state(domain: Domain) -> Callable[[Window, TriggerContext], None]:
    def on_merge(window: Window, ctx: TriggerContext) -> None:
        domain.register(ctx, 0)
        ctx.get_partitioned_state(STRING_STATE).update("hello")
    return on_merge


def _delete_and_clear_state(domain: Domain, time: int) -> Callable[[Window, TriggerContext], None]:
    def clear(window: Window, ctx: TriggerContext) -> None:
        domain.delete(ctx, time)
        ctx.get_partitioned_state(STRING_STATE).clear()
    return clear


W02, W24, W46 = TimeWindow(0, 2), TimeWindow(2, 4), TimeWindow(4, 6)
EVENT = Domain(True)


# ------------------------------------------------ late side output

def test_no_late_side_output_for_skipped_windows() -> None:
    """No late output when the assigner gives an element no window and it is not late."""
    h = Harness(ScriptedAssigner(windows=[]))
    h.watermark(0)
    h.element(0, 5)
    assert h.assigner.calls == [(0, 5)]
    assert h.late == []


def test_late_side_output() -> None:
    h = Harness(ScriptedAssigner(windows=[TimeWindow(0, 0)]))
    h.watermark(20)
    h.element(0, 5)
    assert h.assigner.calls == [(0, 5)]
    assert h.late == [LateElement(0, 0, 5)]
    # we should also see side output if the WindowAssigner assigns no windows
    h.assigner.windows = []
    h.element(0, 10)
    assert h.assigner.calls == [(0, 5), (0, 10)]
    assert h.late == [LateElement(0, 0, 5), LateElement(0, 0, 10)]


# ------------------------------------------------ assigner, trigger and function calls

def test_assigner_is_invoked_once_per_element() -> None:
    h = Harness(ScriptedAssigner(windows=[TimeWindow(0, 0)]))
    h.element(0, 0)
    assert h.assigner.calls == [(0, 0)]
    h.element(0, 0)
    assert h.assigner.calls == [(0, 0), (0, 0)]


def test_assigner_with_multiple_windows() -> None:
    h = Harness(ScriptedAssigner(windows=[W24, W02]))
    h.trigger.on_element_do = lambda window, ctx: FIRE
    h.element(0, 0)
    assert sorted(h.function.calls) == [(0, W02, [0]), (0, W24, [0])]


def test_windows_dont_interfere() -> None:
    h = Harness(ScriptedAssigner(windows=[W02]))
    h.element(0)
    h.assigner.windows = [TimeWindow(0, 1)]
    h.element(1)
    # no output so far; state for two windows
    assert h.results == []
    assert (h.entries(), h.operator.num_event_time_timers()) == (2, 2)
    # now we fire
    h.trigger.on_element_do = lambda window, ctx: FIRE
    h.element(1)
    h.assigner.windows = [W02]
    h.element(0)
    assert h.function.calls == [(1, TimeWindow(0, 1), [1, 1]), (0, W02, [0, 0])]


def test_on_element_called_per_window() -> None:
    h = Harness(ScriptedAssigner(windows=[W24, W02]))
    h.element(42, 1)
    assert h.trigger.element_calls == [(42, 1, W24), (42, 1, W02)]


def test_emitting_from_window_function() -> None:
    h = Harness(ScriptedAssigner(windows=[W02]))
    h.trigger.on_element_do = lambda window, ctx: FIRE
    h.function.outputs = ["Hallo", "Ciao"]
    h.element(0)
    assert h.function.calls == [(0, W02, [0])]
    assert [(r.result, r.timestamp) for r in h.results] == [("Hallo", 1), ("Ciao", 1)]
    assert h.results[0].pane == h.results[1].pane  # one firing, one pane


@pytest.mark.parametrize("domain", DOMAINS)
def test_emitting_from_window_function_on_time(domain: Domain) -> None:
    """``testEmittingFromWindowFunctionOnEventTime`` / ``...OnProcessingTime``."""
    h = Harness(ScriptedAssigner(domain.event_time, [W02]))
    h.function.outputs = ["Hallo", "Ciao"]
    h.trigger.on_element_do = _registers(domain, 1)
    h.element(0)
    assert h.function.calls == [] and h.results == []
    h.trigger.on_time[domain.event_time] = lambda time, window: FIRE
    h.advance(domain, 1)
    assert h.function.calls == [(0, W02, [0])]
    assert [(r.result, r.timestamp) for r in h.results] == [("Hallo", 1), ("Ciao", 1)]


# ------------------------------------------------ trigger results on elements

@pytest.mark.parametrize(("result", "entries", "fired"), [
    pytest.param(CONTINUE, 4, False, id="testOnElementContinue"),
    pytest.param(FIRE, 4, True, id="testOnElementFire"),
    pytest.param(FIRE_AND_PURGE, 2, True, id="testOnElementFireAndPurge"),
])
def test_on_element_result(result: TriggerResult, entries: int, fired: bool) -> None:
    """FIRE keeps the contents, FIRE_AND_PURGE drops them; trigger state and timers stay;
    ``clear`` only at cleanup time."""
    h = Harness(ScriptedAssigner(windows=[W24, W02]))

    def on_element(window: Window, ctx: TriggerContext) -> TriggerResult:
        assert isinstance(window, TimeWindow)
        ctx.register_event_time_timer(window.end)
        ctx.get_partitioned_state(STRING_STATE).update("hello")
        return result
    h.trigger.on_element_do = on_element
    h.element(0)
    expected_calls = [(0, W24, [0]), (0, W02, [0])] if fired else []
    assert h.function.calls == expected_calls
    assert h.trigger.clears == []
    # window contents plus trigger state; window timers plus cleanup timers
    assert (h.entries(), h.operator.num_event_time_timers()) == (entries, 4)


def test_on_element_purge() -> None:
    h = Harness(ScriptedAssigner(windows=[W24, W02]))
    h.trigger.on_element_do = _register_and_set_state(EVENT, 0, PURGE)
    h.element(0)
    assert h.trigger.clears == []
    # PURGE drops the contents; trigger state and timers stay until cleanup time
    assert (h.entries(), h.operator.num_event_time_timers()) == (2, 4)
    assert h.results == []


# ------------------------------------------------ trigger results on timers

@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize(("result", "entries", "fired"), [
    pytest.param(CONTINUE, 4, False, id="Continue"),
    pytest.param(FIRE, 4, True, id="Fire"),
    pytest.param(FIRE_AND_PURGE, 2, True, id="FireAndPurge"),
])
def test_on_time_result(domain: Domain, result: TriggerResult, entries: int, fired: bool) -> None:
    """``testOn{Event,Processing}Time{Continue,Fire,FireAndPurge}``."""
    h = Harness(ScriptedAssigner(domain.event_time, [W24, W02]))
    h.advance(domain, MIN_WATERMARK)
    h.trigger.on_element_do = _register_and_set_state(domain, 0, CONTINUE)
    h.trigger.on_time[domain.event_time] = lambda time, window: result
    h.element(0)
    # window contents and trigger state for two windows; their timers and cleanup timers
    assert (h.entries(), domain.num_timers(h.operator)) == (4, 4)
    h.advance(domain, 0)
    assert sorted(h.function.calls) == ([(0, W02, [0]), (0, W24, [0])] if fired else [])
    assert h.trigger.clears == []
    assert (h.entries(), domain.num_timers(h.operator)) == (entries, 2)  # only cleanup timers


@pytest.mark.parametrize("domain", DOMAINS)
def test_on_time_purge(domain: Domain) -> None:
    """``testOnEventTimePurge`` / ``testOnProcessingTimePurge``."""
    h = Harness(ScriptedAssigner(domain.event_time, [W24, W46]))
    h.advance(domain, MIN_WATERMARK)
    h.trigger.on_element_do = _register_and_set_state(domain, 1, CONTINUE)
    h.trigger.on_time[domain.event_time] = lambda time, window: PURGE
    h.element(0)
    assert (h.entries(), domain.num_timers(h.operator)) == (4, 4)
    h.advance(domain, 1)
    assert h.trigger.clears == []
    # PURGE drops the contents; trigger state and cleanup timers stay
    assert (h.entries(), domain.num_timers(h.operator)) == (2, 2)
    assert h.results == []


@pytest.mark.parametrize("domain", DOMAINS)
def test_no_timer_firing_for_purged_window(domain: Domain) -> None:
    """``testNo{Event,Processing}TimeFiringForPurgedWindow``: a timer of a window without
    contents reaches the trigger, but no function runs."""
    h = Harness(ScriptedAssigner(domain.event_time, [W24]))
    h.advance(domain, MIN_WATERMARK)
    h.trigger.on_element_do = _registers(domain, 0, PURGE)
    h.element(0)
    assert (h.entries(), domain.num_timers(h.operator)) == (0, 2)  # timer and cleanup timer
    h.advance(domain, 0)
    assert len(h.trigger.time_calls[domain.event_time]) == 1
    assert h.function.calls == []
    assert domain.num_timers(h.operator) == 1  # only the cleanup timer is left


@pytest.mark.parametrize("domain", DOMAINS)
def test_no_timer_firing_for_purged_merging_window(domain: Domain) -> None:
    """``testNo{Event,Processing}TimeFiringForPurgedMergingWindow``."""
    h = Harness(ScriptedMergingAssigner(domain.event_time, [W24]))
    h.advance(domain, MIN_WATERMARK)
    h.trigger.on_element_do = _registers(domain, 0, PURGE)
    h.element(0)
    assert (h.entries(), domain.num_timers(h.operator)) == (1, 2)  # just the merging window set
    h.advance(domain, 0)
    assert len(h.trigger.time_calls[domain.event_time]) == 1
    assert h.function.calls == []
    assert domain.num_timers(h.operator) == 1


@pytest.mark.parametrize("domain", DOMAINS)
def test_no_timer_firing_for_garbage_collected_merging_window(domain: Domain) -> None:
    """``testNo{Event,Processing}TimeFiringForGarbageCollectedMergingWindow``: a timer left
    behind by the trigger after the window was cleaned up reaches nothing."""
    h = Harness(ScriptedMergingAssigner(domain.event_time, [W24]))
    h.advance(domain, MIN_WATERMARK)
    h.trigger.on_element_do = _registers(domain, 10)  # a timer after the cleanup time
    h.element(0)
    assert (h.entries(), domain.num_timers(h.operator)) == (2, 2)  # contents, merging set
    h.advance(domain, 4)  # the cleanup
    assert h.trigger.clears == [W24]
    assert h.entries() == 0
    assert domain.num_timers(h.operator) == 1  # the trigger's dangling timer
    assert len(h.trigger.time_calls[domain.event_time]) == 1
    assert h.function.calls == []
    h.advance(domain, 10)  # the dangling timer: we don't fire again
    assert len(h.trigger.time_calls[domain.event_time]) == 1


# ------------------------------------------------ timers

@pytest.mark.parametrize("domain", DOMAINS)
def test_timer_creation_and_deletion(domain: Domain) -> None:
    """``test{Event,Processing}TimeTimerCreationAndDeletion`` (counts include the cleanup
    timer)."""
    h = Harness(ScriptedAssigner(domain.event_time, [W02]))
    assert domain.num_timers(h.operator) == 0
    h.trigger.on_element_do = _registers(domain, 17)
    h.element(0)
    assert domain.num_timers(h.operator) == 2  # +1: the window's cleanup timer
    h.trigger.on_element_do = _registers(domain, 42)
    h.element(0)
    assert domain.num_timers(h.operator) == 3
    h.trigger.on_element_do = _deletes(domain, 42)
    h.element(0)
    h.trigger.on_element_do = _deletes(domain, 17)
    h.element(0)
    assert domain.num_timers(h.operator) == 1


@pytest.mark.parametrize("domain", DOMAINS)
def test_timer_firing(domain: Domain) -> None:
    """``test{Event,Processing}TimeTimerFiring``."""
    window = TimeWindow(0, 100)
    h = Harness(ScriptedAssigner(domain.event_time, [window]))
    for time in (1, 17, 42):
        h.trigger.on_element_do = _registers(domain, time)
        h.element(0)
    assert domain.num_timers(h.operator) == 4
    calls = h.trigger.time_calls[domain.event_time]
    h.advance(domain, 1)
    assert calls == [(1, window)] and domain.num_timers(h.operator) == 3
    h.advance(domain, 15)  # doesn't do anything
    assert len(calls) == 1
    h.advance(domain, 42)
    assert calls == [(1, window), (17, window), (42, window)]
    assert domain.num_timers(h.operator) == 1


@pytest.mark.parametrize("domain", DOMAINS)
def test_deleted_timer_does_not_fire(domain: Domain) -> None:
    """``test{Event,Processing}TimeDeletedTimerDoesNotFire``."""
    window = TimeWindow(0, 100)
    h = Harness(ScriptedAssigner(domain.event_time, [window]))
    h.trigger.on_element_do = _registers(domain, 1)
    h.element(0)
    assert domain.num_timers(h.operator) == 2
    h.trigger.on_element_do = _deletes(domain, 1)
    h.element(0)
    assert domain.num_timers(h.operator) == 1
    h.trigger.on_element_do = _registers(domain, 2)
    h.element(0)
    assert domain.num_timers(h.operator) == 2
    h.advance(domain, 50)
    assert h.trigger.time_calls[domain.event_time] == [(2, window)]
    assert domain.num_timers(h.operator) == 1


# ------------------------------------------------ merging

@pytest.mark.parametrize("domain", DOMAINS)
def test_windows_are_merged_eagerly(domain: Domain) -> None:
    """``test{Event,Processing}TimeWindowsAreMergedEagerly``: one state window; the merge
    result gets its timer and state from ``on_merge``."""
    h = Harness(ScriptedMergingAssigner(domain.event_time, [W02]))
    h.advance(domain, MIN_WATERMARK)
    h.trigger.on_element_do = _register_and_set_state(domain, 0, CONTINUE)
    h.trigger.on_merge_do = _merge_registers_and_sets_state(domain)
    h.trigger.clear_do = _delete_and_clear_state(domain, 0)
    h.element(0)
    # window state plus trigger state plus merging window set; timer and cleanup timer
    assert (h.entries(), domain.num_timers(h.operator)) == (3, 2)

    assert isinstance(h.assigner, ScriptedMergingAssigner)
    h.assigner.windows = [W24]
    h.assigner.merge = ([W02, W24], [W02, W24], TimeWindow(0, 4))
    # no timer or state in on_element: on_merge must set them
    h.trigger.on_element_do = lambda window, ctx: CONTINUE
    h.element(0)
    assert h.trigger.merges == [TimeWindow(0, 4)]
    assert (h.entries(), domain.num_timers(h.operator)) == (3, 2)


@pytest.mark.parametrize("domain", DOMAINS)
def test_reject_shrinking_merging_windows(domain: Domain) -> None:
    """``testRejectShrinkingMerging{Event,Processing}TimeWindows``: a misbehaving assigner
    could make a window late by merging; the operator refuses."""
    lateness = 10 if domain.event_time else 0  # no allowed lateness in processing time
    assigner = ScriptedMergingAssigner(domain.event_time, [TimeWindow(0, 22)])
    h = Harness(assigner, lateness)
    h.advance(domain, 0)
    h.element(0)
    assert (h.entries(), domain.num_timers(h.operator)) == (2, 1)  # contents, set; cleanup
    assigner.windows = [TimeWindow(0, 25)]
    h.advance(domain, 20)
    # our window should still be there
    assert (h.entries(), domain.num_timers(h.operator)) == (2, 1)
    # + 2: a watermark t says no element <= t follows and window ends are exclusive
    just_in_time = TimeWindow(0, 20 - lateness + 2)
    assigner.merge = ([TimeWindow(0, 22), TimeWindow(0, 25)],
                      [TimeWindow(0, 22), TimeWindow(0, 25)], just_in_time)
    h.element(0)
    # now merge it to a window that is just late
    assigner.merge = ([just_in_time, TimeWindow(0, 25)], [just_in_time, TimeWindow(0, 25)],
                      TimeWindow(0, 20 - lateness + 1))
    with pytest.raises(ValueError, match="cannot become earlier than the current"):
        h.element(0)


@pytest.mark.parametrize("domain", DOMAINS)
def test_merging_of_existing_windows(domain: Domain) -> None:
    """``testMergingOfExisting{Event,Processing}TimeWindows``: one state window is kept and
    the merged windows' cleanup timers are deleted."""
    assigner = ScriptedMergingAssigner(domain.event_time, [W02])
    h = Harness(assigner)
    h.advance(domain, MIN_WATERMARK)
    h.trigger.on_element_do = _register_and_set_state(domain, 0, CONTINUE)
    h.trigger.on_merge_do = _merge_registers_and_sets_state(domain)
    h.trigger.clear_do = _delete_and_clear_state(domain, 0)
    h.element(0)
    assert (h.entries(), domain.num_timers(h.operator)) == (3, 2)
    assigner.windows = [W24]
    h.element(0)
    assert (h.entries(), domain.num_timers(h.operator)) == (5, 4)
    assigner.windows = [TimeWindow(1, 3)]
    assigner.merge = ([W02, W24, TimeWindow(1, 3)], [W02, W24, TimeWindow(1, 3)],
                      TimeWindow(0, 4))
    h.element(0)
    # window contents plus trigger state plus merging window set; timer plus cleanup timer
    assert (h.entries(), domain.num_timers(h.operator)) == (3, 2)
    assert h.results == []


def test_on_element_purge_does_not_cleanup_merging_set() -> None:
    h = Harness(ScriptedMergingAssigner(True, [W02]))
    h.trigger.on_element_do = lambda window, ctx: PURGE
    h.element(0)
    assert (h.entries(), h.operator.num_event_time_timers()) == (1, 1)  # set; cleanup timer
    assert h.results == []


@pytest.mark.parametrize("domain", DOMAINS)
def test_on_time_purge_does_not_cleanup_merging_set(domain: Domain) -> None:
    """``testOn{Event,Processing}TimePurgeDoesNotCleanupMergingSet``."""
    h = Harness(ScriptedMergingAssigner(domain.event_time, [TimeWindow(0, 4)]))
    h.trigger.on_element_do = _registers(domain, 1)
    h.element(0)
    h.trigger.on_time[domain.event_time] = lambda time, window: PURGE
    assert (h.entries(), domain.num_timers(h.operator)) == (2, 2)  # set + contents
    h.advance(domain, 1)
    assert (h.entries(), domain.num_timers(h.operator)) == (1, 1)  # the merging window set
    assert h.results == []


# ------------------------------------------------ cleanup (garbage collection) timers

@pytest.mark.parametrize("domain", DOMAINS)
def test_no_garbage_collection_timer_for_global_window(domain: Domain) -> None:
    """``testNo{Event,Processing}TimeGarbageCollectionTimerForGlobalWindow``."""
    assert GlobalWindow().max_timestamp() == MAX_WATERMARK
    h = Harness(ScriptedAssigner(domain.event_time, [GlobalWindow()]))
    h.element(0)
    assert h.entries() == 1  # just the window contents
    assert h.operator.num_event_time_timers() == h.operator.num_processing_time_timers() == 0


def test_no_event_time_garbage_collection_timer_for_long_max() -> None:
    h = Harness(ScriptedAssigner(True, [TimeWindow(0, MAX_WATERMARK - 10)]), lateness=20)
    h.element(0)
    assert h.entries() == 1
    assert h.operator.num_event_time_timers() == h.operator.num_processing_time_timers() == 0


def test_processing_time_garbage_collection_timer_is_always_window_max_timestamp() -> None:
    h = Harness(ScriptedAssigner(False, [TimeWindow(0, MAX_WATERMARK - 10)]), lateness=20)
    h.element(0)
    assert h.entries() == 1
    assert h.operator.num_event_time_timers() == 0
    assert h.operator.num_processing_time_timers() == 1
    assert h.trigger.clears == []
    h.advance(Domain(False), MAX_WATERMARK - 10)
    assert h.trigger.clears == [TimeWindow(0, MAX_WATERMARK - 10)]
    assert h.operator.num_event_time_timers() == h.operator.num_processing_time_timers() == 0


@pytest.mark.parametrize("domain", DOMAINS)
def test_garbage_collection_timer(domain: Domain) -> None:
    """``test{Event,Processing}TimeGarbageCollectionTimer``: the trigger still fires on the
    cleanup timer, and that firing is the window's last pane."""
    lateness = 20 if domain.event_time else 0
    h = Harness(ScriptedAssigner(domain.event_time, [TimeWindow(0, 20)]), lateness)
    h.function.outputs = ["last"]
    h.element(0)
    assert h.entries() == 1
    assert (domain.num_timers(h.operator), domain.num_timers_other_domain(h.operator)) == (1, 0)
    assert h.trigger.clears == []
    h.trigger.on_time[domain.event_time] = lambda time, window: FIRE
    h.advance(domain, 19 + lateness)  # 19 is the window's max timestamp
    assert h.trigger.time_calls[domain.event_time] == [(19 + lateness, TimeWindow(0, 20))]
    assert h.function.calls == [(0, TimeWindow(0, 20), [0])]
    assert h.trigger.clears == [TimeWindow(0, 20)]
    assert (domain.num_timers(h.operator), domain.num_timers_other_domain(h.operator)) == (0, 0)
    assert h.results[0].pane.is_last


@pytest.mark.parametrize("domain", DOMAINS)
def test_trigger_timer_and_garbage_collection_timer_coincide(domain: Domain) -> None:
    """``test{Event,Processing}TimeTriggerTimerAndGarbageCollectionTimerCoincide``: one timer,
    one callback."""
    h = Harness(ScriptedAssigner(domain.event_time, [TimeWindow(0, 20)]))
    h.trigger.on_element_do = _registers(domain, 19)
    h.element(0)
    assert h.entries() == 1
    assert (domain.num_timers(h.operator), domain.num_timers_other_domain(h.operator)) == (1, 0)
    h.advance(domain, 19)
    assert h.trigger.clears == [TimeWindow(0, 20)]
    assert len(h.trigger.time_calls[domain.event_time]) == 1
    assert (domain.num_timers(h.operator), domain.num_timers_other_domain(h.operator)) == (0, 0)


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize(("merging", "result", "entries"), [
    pytest.param(False, CONTINUE, 2, id="StateAndTimerCleanupAtGarbageCollection"),
    pytest.param(False, PURGE, 1, id="WithPurgingTrigger"),
    pytest.param(True, PURGE, 2, id="WithPurgingTriggerAndMergingWindows"),
])
def test_state_and_timer_cleanup_at_garbage_collection(
    domain: Domain, merging: bool, result: TriggerResult, entries: int,
) -> None:
    """``testStateAndTimerCleanupAt{Event,Processing}TimeGarbageCollection[WithPurgingTrigger
    [AndMergingWindows]]``: the cleanup clears contents, trigger state, merging set and
    timers, even after a purge."""
    assigner = (ScriptedMergingAssigner if merging else ScriptedAssigner)(
        domain.event_time, [TimeWindow(0, 20)])
    h = Harness(assigner, lateness=20)
    # very far in the future so our watermark does not trigger it
    h.trigger.on_element_do = _register_and_set_state(domain, 1000, result)
    h.trigger.clear_do = _delete_and_clear_state(domain, 1000)
    h.element(0)
    assert h.trigger.clears == []
    assert h.entries() == entries
    assert (domain.num_timers(h.operator), domain.num_timers_other_domain(h.operator)) == (2, 0)
    h.advance(domain, 19 + 20)
    assert h.trigger.clears == [TimeWindow(0, 20)]
    assert h.entries() == 0
    assert (domain.num_timers(h.operator), domain.num_timers_other_domain(h.operator)) == (0, 0)


@pytest.mark.parametrize("domain", DOMAINS)
def test_merging_window_set_cleared_at_garbage_collection(domain: Domain) -> None:
    """``testMergingWindowSetClearedAt{Event,Processing}TimeGarbageCollection``."""
    h = Harness(ScriptedMergingAssigner(domain.event_time, [TimeWindow(0, 20)]), lateness=20)
    h.element(0)
    assert (h.entries(), domain.num_timers(h.operator)) == (2, 1)  # contents, set; cleanup
    h.advance(domain, 19 + 20)
    assert (h.entries(), domain.num_timers(h.operator)) == (0, 0)


# ------------------------------------------------ lateness

def test_processing_elements_within_allowed_lateness() -> None:
    h = Harness(ScriptedAssigner(True, [W02]), lateness=20)
    h.trigger.on_element_do = lambda window, ctx: FIRE
    # 20 is just at the limit, window.maxTime() is 1 and allowed lateness is 20
    h.watermark(20)
    h.element(0)
    assert h.function.calls == [(0, W02, [0])]
    assert h.trigger.clears == []
    # FIRE keeps the contents; just the cleanup timer
    assert (h.entries(), h.operator.num_event_time_timers()) == (1, 1)
    assert h.results == [] and h.late == []


def test_late_window_dropping() -> None:
    h = Harness(ScriptedAssigner(True, [W02]), lateness=20)
    h.trigger.on_element_do = lambda window, ctx: FIRE
    # window.maxTime() == 1 plus 20 of allowed lateness
    h.watermark(21)
    h.element(0)
    # there should be nothing (the element goes to the late output)
    assert h.entries() == 0
    assert h.operator.num_event_time_timers() == h.operator.num_processing_time_timers() == 0
    assert h.function.calls == [] and h.results == []
    assert h.late == [LateElement(0, 0, 0)]


# ------------------------------------------------ snapshot

def test_state_snapshot_and_restore() -> None:
    assigner = ScriptedMergingAssigner(True, [W24, W02])
    h = Harness(assigner)
    h.trigger.on_element_do = _register_and_set_state(EVENT, 0, CONTINUE)
    h.trigger.on_time[True] = lambda time, window: FIRE_AND_PURGE
    h.element(0)
    # window contents and trigger state for two windows plus merging window set
    assert (h.entries(), h.operator.num_event_time_timers()) == (5, 4)
    snapshot = pickle.loads(pickle.dumps(h.operator.snapshot()))

    # restore into an operator with a new trigger and function
    trigger = ScriptedTrigger()
    trigger.clear_do = _delete_and_clear_state(EVENT, 0)
    # only fire on the timestamp == 0 timers, not the cleanup timers
    trigger.on_time[True] = lambda time, window: FIRE if time == 0 else CONTINUE
    restored = Harness(ScriptedMergingAssigner(True, [W24, W02]), trigger=trigger)
    restored.operator.restore(snapshot)
    assert restored.results == []
    # we still have all the state, timers and the merging window set
    assert (restored.entries(), restored.operator.num_event_time_timers()) == (5, 4)
    assert trigger.clears == []

    restored.watermark(20)
    assert set(trigger.clears) == {W02, W24} and len(trigger.clears) == 2
    assert sorted(restored.function.calls) == [(0, W02, [0]), (0, W24, [0])]
    # it's also called for the cleanup timers
    assert sorted(trigger.time_calls[True]) == [(0, W02), (0, W24), (1, W02), (3, W24)]
    assert (restored.entries(), restored.operator.num_event_time_timers()) == (0, 0)


@pytest.mark.parametrize("domain", DOMAINS)
def test_current_time_querying(domain: Domain) -> None:
    """``testEventTimeQuerying`` / ``testProcessingTimeQuerying``: the window function sees
    the operator's current time, in ``process`` and in ``clear`` at the cleanup."""
    h = Harness(ScriptedAssigner(domain.event_time, [TimeWindow(0, 20)]), lateness=20)
    h.trigger.on_element_do = lambda window, ctx: FIRE

    def now(context: WindowContext) -> int:
        return context.current_watermark if domain.event_time else context.current_processing_time
    h.advance(domain, 10)
    h.element(0)
    assert [now(c) for c in h.function.contexts] == [10]
    h.advance(domain, 100)
    assert [now(c) for c in h.function.clears] == [100]
    assert h.function.clears[0].window == TimeWindow(0, 20)
