"""Flink's ``WindowOperatorTest``, replayed against :mod:`flinkish_core.windowing`.

Source: apache/flink, ``flink-streaming-java/src/test/java/org/apache/flink/streaming/runtime/
operators/windowing/WindowOperatorTest.java`` (the JUnit 4 version of Flink 1.18-1.20). Each
``@Test`` method is one test here, named after it in snake_case, with Flink's inputs and
expected outputs.

Translation: Flink's elements are ``Tuple2<String, Integer>`` keyed by their first field; here
``harness.element("key2", 1, 3000)`` processes the value ``("key2", 1)`` for key ``"key2"`` at
timestamp 3000. Flink's output record ``StreamRecord(value, ts)`` is ``(ts, value)``, and as in
Flink's ``assertOutputEqualsSorted`` the outputs are compared sorted, without the forwarded
watermarks (the operator here emits results only). Flink's ``SumReducer`` in a reducing state is
a :class:`ReduceFunction`; its ``RichSumReducer``, ``SessionWindowFunction`` and the
``Reduced...SessionWindowFunction`` outputs ``("key-sum", start, end)`` are built from the
:class:`WindowResult` (key, window, result). Flink's snapshot/close/restore becomes a pickle
round trip of :meth:`WindowOperator.snapshot` into a fresh operator. Outputs are cumulative
across a restore (Flink's tests sometimes start a new expected queue; nothing is lost either
way). Panes, which Flink does not have, are asserted where the rule of
:mod:`flinkish_core.windowing.pane` gives something worth pinning.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from flinkish_core.watermark import MAX_WATERMARK
from flinkish_core.windowing import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    Count,
    CountTrigger,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindows,
    LateElement,
    PaneInfo,
    ProcessingTimeSessionWindows,
    ProcessingTimeTrigger,
    ProcessWindowFunction,
    PurgingTrigger,
    ReduceFunction,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    Sum,
    TimeWindow,
    Timing,
    Trigger,
    TriggerContext,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    Window,
    WindowContext,
    WindowOperator,
    WindowResult,
)

Element = tuple[str, int]


def sum_reducer(a: Element, b: Element) -> Element:
    """Flink's ``SumReducer``."""
    return (b[0], a[1] + b[1])


SUM = ReduceFunction(sum_reducer)


class RichSumReducer(ProcessWindowFunction[Element, Element]):
    """Flink's ``RichSumReducer``: ``(key, sum of the values)`` over all elements."""

    def process(self, key: Any, context: WindowContext, elements: list[Element]) -> list[Element]:
        return [(key, sum(v for _, v in elements))]


class SessionWindowFunction(ProcessWindowFunction[Element, tuple[str, int, int]]):
    """Flink's ``SessionWindowFunction`` / ``SessionProcessWindowFunction``."""

    def process(
        self, key: Any, context: WindowContext, elements: list[Element],
    ) -> list[tuple[str, int, int]]:
        window = context.window
        assert isinstance(window, TimeWindow)
        return [(f"{key}-{sum(v for _, v in elements)}", window.start, window.end)]


class PassThroughFunction(ProcessWindowFunction[Element, Element]):
    """Flink's ``PassThroughFunction``: every element of the window."""

    def process(self, key: Any, context: WindowContext, elements: list[Element]) -> list[Element]:
        return list(elements)


def reduced_session(r: WindowResult) -> tuple[str, int, int]:
    """Flink's ``ReducedSessionWindowFunction`` output for a reduced element."""
    assert isinstance(r.window, TimeWindow)
    return (f"{r.key}-{r.result[1]}", r.window.start, r.window.end)


def result(r: WindowResult) -> Any:
    return r.result


class Harness:
    """Drives one operator like Flink's ``KeyedOneInputStreamOperatorTestHarness``."""

    def __init__(self, build: Callable[[], WindowOperator]) -> None:
        self.build = build
        self.operator = build()
        self.results: list[WindowResult] = []
        self.late: list[LateElement] = []

    def element(self, key: str, value: int, timestamp: int | None = None) -> None:
        out = self.operator.process_element(key, (key, value), timestamp)
        self.results += out.results
        self.late += out.late

    def watermark(self, watermark: int) -> None:
        self.results += self.operator.process_watermark(watermark).results

    def processing_time(self, time: int) -> None:
        self.results += self.operator.process_processing_time(time).results

    def snapshot_and_restore(self) -> None:
        snapshot = pickle.loads(pickle.dumps(self.operator.snapshot()))
        self.operator = self.build()
        self.operator.restore(snapshot)

    def output(self, render: Callable[[WindowResult], Any] = result) -> list[tuple[int, Any]]:
        return sorted((r.timestamp, render(r)) for r in self.results)

    def late_output(self) -> list[tuple[int | None, Any]]:
        return sorted((e.timestamp, e.value) for e in self.late)


# ------------------------------------------------ sliding, tumbling

def _sliding_event_time_windows(function: Any) -> Harness:
    h = Harness(lambda: WindowOperator(SlidingEventTimeWindows(3000, 1000), function,
                                       EventTimeTrigger()))
    # add elements out-of-order
    h.element("key2", 1, 3999)
    h.element("key2", 1, 3000)
    h.element("key1", 1, 20)
    h.element("key1", 1, 0)
    h.element("key1", 1, 999)
    h.element("key2", 1, 1998)
    h.element("key2", 1, 1999)
    h.element("key2", 1, 1000)

    expected = [(999, ("key1", 3))]
    h.watermark(999)
    assert h.output() == sorted(expected)
    h.watermark(1999)
    expected += [(1999, ("key1", 3)), (1999, ("key2", 3))]
    assert h.output() == sorted(expected)
    h.watermark(2999)
    expected += [(2999, ("key1", 3)), (2999, ("key2", 3))]
    assert h.output() == sorted(expected)

    h.snapshot_and_restore()
    h.watermark(3999)
    expected += [(3999, ("key2", 5))]
    assert h.output() == sorted(expected)
    h.watermark(4999)
    expected += [(4999, ("key2", 2))]
    assert h.output() == sorted(expected)
    h.watermark(5999)
    expected += [(5999, ("key2", 2))]
    assert h.output() == sorted(expected)
    # those don't have any effect...
    h.watermark(6999)
    h.watermark(7999)
    assert h.output() == sorted(expected)
    return h


def test_sliding_event_time_windows_reduce() -> None:
    h = _sliding_event_time_windows(SUM)
    # zero lateness: each window fires once, on time, and that firing is its last
    assert {r.pane for r in h.results} == {PaneInfo(0, Timing.ON_TIME, True)}
    assert h.operator.num_keys() == 0


def test_sliding_event_time_windows_apply() -> None:
    _sliding_event_time_windows(RichSumReducer())


def _tumbling_event_time_windows(function: Any) -> Harness:
    h = Harness(lambda: WindowOperator(TumblingEventTimeWindows(3000), function,
                                       EventTimeTrigger()))
    h.element("key2", 1, 3999)
    h.element("key2", 1, 3000)
    h.element("key1", 1, 20)
    h.element("key1", 1, 0)
    h.element("key1", 1, 999)
    h.element("key2", 1, 1998)
    h.element("key2", 1, 1999)
    h.element("key2", 1, 1000)

    h.watermark(999)
    h.watermark(1999)
    assert h.output() == []
    h.snapshot_and_restore()
    h.watermark(2999)
    expected = [(2999, ("key1", 3)), (2999, ("key2", 3))]
    assert h.output() == sorted(expected)
    h.watermark(3999)
    h.watermark(4999)
    assert h.output() == sorted(expected)
    h.watermark(5999)
    expected += [(5999, ("key2", 2))]
    assert h.output() == sorted(expected)
    h.watermark(6999)
    h.watermark(7999)
    assert h.output() == sorted(expected)
    return h


def test_tumbling_event_time_windows_reduce() -> None:
    _tumbling_event_time_windows(SUM)


def test_tumbling_event_time_windows_apply() -> None:
    _tumbling_event_time_windows(RichSumReducer())


# ------------------------------------------------ sessions

def _session_windows(function: Any, render: Callable[[WindowResult], Any]) -> None:
    h = Harness(lambda: WindowOperator(EventTimeSessionWindows.with_gap(3000), function,
                                       EventTimeTrigger()))
    # add elements out-of-order
    h.element("key2", 1, 0)
    h.element("key2", 2, 1000)
    h.element("key2", 3, 2500)
    h.element("key1", 1, 10)
    h.element("key1", 2, 1000)

    h.snapshot_and_restore()
    assert h.output() == []

    h.element("key1", 3, 2500)
    h.element("key2", 4, 5501)
    h.element("key2", 5, 6000)
    h.element("key2", 5, 6000)
    h.element("key2", 6, 6050)
    h.watermark(12000)
    expected = [
        (5499, ("key1-6", 10, 5500)),
        (5499, ("key2-6", 0, 5500)),
        (9049, ("key2-20", 5501, 9050)),
    ]
    assert h.output(render) == sorted(expected)

    h.element("key2", 10, 15000)
    h.element("key2", 20, 15000)
    h.watermark(17999)
    expected += [(17999, ("key2-30", 15000, 18000))]
    assert h.output(render) == sorted(expected)


def test_session_windows() -> None:
    _session_windows(SessionWindowFunction(), result)


def test_session_windows_with_process_function() -> None:
    # Flink's WindowFunction and ProcessWindowFunction are both a ProcessWindowFunction here
    _session_windows(SessionWindowFunction(), result)


def _reduce_session_windows() -> None:
    h = Harness(lambda: WindowOperator(EventTimeSessionWindows.with_gap(3000), SUM,
                                       EventTimeTrigger()))
    h.element("key2", 1, 0)
    h.element("key2", 2, 1000)
    h.element("key2", 3, 2500)
    h.snapshot_and_restore()
    h.element("key1", 1, 10)
    h.element("key1", 2, 1000)
    h.element("key1", 3, 2500)
    h.element("key2", 4, 5501)
    h.element("key2", 5, 6000)
    h.element("key2", 5, 6000)
    h.element("key2", 6, 6050)
    h.watermark(12000)
    expected = [
        (5499, ("key1-6", 10, 5500)),
        (5499, ("key2-6", 0, 5500)),
        (9049, ("key2-20", 5501, 9050)),
    ]
    assert h.output(reduced_session) == sorted(expected)
    h.element("key2", 10, 15000)
    h.element("key2", 20, 15000)
    h.watermark(17999)
    expected += [(17999, ("key2-30", 15000, 18000))]
    assert h.output(reduced_session) == sorted(expected)


def test_reduce_session_windows() -> None:
    _reduce_session_windows()


def test_reduce_session_windows_with_process_function() -> None:
    _reduce_session_windows()


def test_session_windows_with_count_trigger() -> None:
    """Merging works with the CountTrigger: the merged session's count is the sum."""
    h = Harness(lambda: WindowOperator(EventTimeSessionWindows.with_gap(3000),
                                       SessionWindowFunction(), PurgingTrigger(CountTrigger(4))))
    h.element("key2", 1, 0)
    h.element("key2", 2, 1000)
    h.element("key2", 3, 2500)
    h.element("key2", 4, 3500)
    h.element("key1", 1, 10)
    h.element("key1", 2, 1000)
    h.snapshot_and_restore()
    expected = [(6499, ("key2-10", 0, 6500))]
    assert h.output() == expected

    h.element("key1", 3, 2500)
    h.element("key1", 1, 6000)
    h.element("key1", 2, 6500)
    h.element("key1", 3, 7000)
    assert h.output() == expected

    # add an element that merges the two "key1" sessions, they should now have count 6, and
    # therefore fire
    h.element("key1", 10, 4500)
    expected += [(9999, ("key1-22", 10, 10000))]
    assert h.output() == sorted(expected)
    # count-triggered firings come before the watermark reaches the window's end
    assert {r.pane.timing for r in h.results} == {Timing.EARLY}


def test_session_windows_with_continuous_event_time_trigger() -> None:
    """Merging works with the ContinuousEventTimeTrigger."""
    h = Harness(lambda: WindowOperator(EventTimeSessionWindows.with_gap(3000),
                                       SessionWindowFunction(), ContinuousEventTimeTrigger(2000)))
    # add elements out-of-order and first trigger time is 2000
    h.element("key1", 1, 1500)
    h.element("key2", 1, 0)
    h.element("key2", 3, 2500)
    h.element("key2", 2, 1000)
    # triggers emit and next trigger time is 4000
    h.watermark(2500)
    expected = [(4499, ("key1-1", 1500, 4500)), (5499, ("key2-6", 0, 5500))]
    assert h.output() == sorted(expected)

    h.element("key2", 5, 4000)
    h.watermark(3000)
    h.snapshot_and_restore()
    assert h.output() == sorted(expected)

    h.element("key1", 2, 4000)
    h.element("key2", 4, 3500)
    # triggers emit and next trigger time is 6000
    h.watermark(4000)
    expected += [(6999, ("key1-3", 1500, 7000)), (6999, ("key2-15", 0, 7000))]
    assert h.output() == sorted(expected)
    assert [r.pane.timing for r in h.results] == [Timing.EARLY] * 4


class PointSessionWindows(EventTimeSessionWindows):
    """Flink's test assigner: elements with value 33 get a point window [t, t)."""

    def assign_windows(self, element: Any, timestamp: int | None, context: Any) -> list[Window]:
        assert timestamp is not None
        if element[1] == 33:
            return [TimeWindow(timestamp, timestamp)]
        return [TimeWindow(timestamp, timestamp + 3000)]


def test_point_sessions() -> None:
    h = Harness(lambda: WindowOperator(PointSessionWindows(3000), SessionWindowFunction(),
                                       EventTimeTrigger()))
    h.element("key2", 1, 0)
    h.element("key2", 33, 1000)
    h.snapshot_and_restore()
    h.element("key2", 33, 2500)
    h.element("key1", 1, 10)
    h.element("key1", 2, 1000)
    h.element("key1", 33, 2500)
    h.watermark(12000)
    assert h.output() == [(2999, ("key2-67", 0, 3000)), (3999, ("key1-36", 10, 4000))]


# ------------------------------------------------ global windows

def test_continuous_watermark_trigger() -> None:
    h = Harness(lambda: WindowOperator(GlobalWindows(), SUM, ContinuousEventTimeTrigger(3000)))
    # The global window actually ignores these timestamps...
    h.element("key1", 1, 0)
    # add elements out-of-order
    h.element("key2", 1, 3000)
    h.element("key2", 1, 3999)
    h.element("key1", 1, 20)
    h.element("key1", 1, 999)
    h.element("key2", 1, 1998)
    h.element("key2", 1, 1999)
    h.element("key2", 1, 1000)

    h.watermark(1000)
    h.watermark(2000)
    assert h.output() == []
    h.watermark(3000)
    expected = [(MAX_WATERMARK, ("key1", 3))]
    assert h.output() == expected
    h.watermark(4000)
    h.watermark(5000)
    assert h.output() == expected
    h.watermark(6000)
    expected += [(MAX_WATERMARK, ("key1", 3)), (MAX_WATERMARK, ("key2", 5))]
    assert h.output() == sorted(expected)
    # those don't have any effect...
    h.watermark(7000)
    h.watermark(8000)
    assert h.output() == sorted(expected)
    key1_panes = [r.pane for r in h.results if r.key == "key1"]
    assert key1_panes == [PaneInfo(0, Timing.EARLY, False), PaneInfo(1, Timing.EARLY, False)]


def test_count_trigger() -> None:
    h = Harness(lambda: WindowOperator(GlobalWindows(), SUM, PurgingTrigger(CountTrigger(4))))
    # The global window actually ignores these timestamps...
    h.element("key2", 1, 3000)
    h.element("key2", 1, 3999)
    h.element("key1", 1, 20)
    h.element("key1", 1, 0)
    h.element("key1", 1, 999)
    h.element("key2", 1, 1998)
    h.element("key2", 1, 1999)
    h.snapshot_and_restore()
    h.element("key2", 1, 1000)
    expected = [(MAX_WATERMARK, ("key2", 4))]
    assert h.output() == expected

    h.element("key1", 1, 10999)
    h.element("key2", 1, 1000)
    h.element("key2", 1, 1000)
    h.element("key2", 1, 1000)
    expected += [(MAX_WATERMARK, ("key1", 4)), (MAX_WATERMARK, ("key2", 4))]
    assert h.output() == sorted(expected)
    # a purge drops the contents, not the window: the second key2 firing is its pane 1
    assert [r.pane.index for r in h.results if r.key == "key2"] == [0, 1]


# ------------------------------------------------ processing time

def test_processing_time_tumbling_windows() -> None:
    h = Harness(lambda: WindowOperator(TumblingProcessingTimeWindows(3000), SUM,
                                       ProcessingTimeTrigger()))
    h.processing_time(3)
    # timestamp is ignored in processing time
    h.element("key2", 1, MAX_WATERMARK)
    h.element("key2", 1, 7000)
    h.element("key2", 1, 7000)
    h.element("key1", 1, 7000)
    h.element("key1", 1, 7000)
    h.processing_time(5000)
    expected = [(2999, ("key1", 2)), (2999, ("key2", 3))]
    assert h.output() == expected

    h.element("key1", 1, 7000)
    h.element("key1", 1, 7000)
    h.element("key1", 1, 7000)
    h.processing_time(7000)
    expected += [(5999, ("key1", 3))]
    assert h.output() == sorted(expected)
    assert {r.pane for r in h.results} == {PaneInfo(0, Timing.ON_TIME, True)}
    assert h.late == []


def test_processing_time_sliding_windows() -> None:
    h = Harness(lambda: WindowOperator(SlidingProcessingTimeWindows(3000, 1000), SUM,
                                       ProcessingTimeTrigger()))
    # timestamp is ignored in processing time
    h.processing_time(3)
    h.element("key2", 1, MAX_WATERMARK)
    h.processing_time(1000)
    expected = [(999, ("key2", 1))]
    assert h.output() == expected

    h.element("key2", 1, MAX_WATERMARK)
    h.element("key2", 1, MAX_WATERMARK)
    h.processing_time(2000)
    expected += [(1999, ("key2", 3))]
    assert h.output() == sorted(expected)

    h.element("key1", 1, MAX_WATERMARK)
    h.element("key1", 1, MAX_WATERMARK)
    h.processing_time(3000)
    expected += [(2999, ("key2", 3)), (2999, ("key1", 2))]
    assert h.output() == sorted(expected)

    h.element("key1", 1, MAX_WATERMARK)
    h.element("key1", 1, MAX_WATERMARK)
    h.element("key1", 1, MAX_WATERMARK)
    h.processing_time(7000)
    expected += [
        (3999, ("key2", 2)), (3999, ("key1", 5)), (4999, ("key1", 5)), (5999, ("key1", 3)),
    ]
    assert h.output() == sorted(expected)


def test_processing_time_session_windows() -> None:
    h = Harness(lambda: WindowOperator(ProcessingTimeSessionWindows.with_gap(3000), SUM,
                                       ProcessingTimeTrigger()))
    # timestamp is ignored in processing time
    h.processing_time(3)
    h.element("key2", 1, 1)
    h.processing_time(1000)
    h.element("key2", 1, 1002)
    h.processing_time(5000)
    expected = [(3999, ("key2", 2))]
    assert h.output() == expected

    h.element("key2", 1, 5000)
    h.element("key2", 1, 5000)
    h.element("key1", 1, 5000)
    h.element("key1", 1, 5000)
    h.element("key1", 1, 5000)
    h.processing_time(10000)
    expected += [(7999, ("key2", 2)), (7999, ("key1", 3))]
    assert h.output() == sorted(expected)


def _gap(element: Element) -> int:
    """The gap extractor of Flink's dynamic session tests."""
    key, value = element
    if key == "key1":
        return 3000
    if key == "key2":
        return 1000 if value == 10 else 2000
    return 0


def test_dynamic_event_time_session_windows() -> None:
    h = Harness(lambda: WindowOperator(EventTimeSessionWindows.with_dynamic_gap(_gap),
                                       SessionWindowFunction(), EventTimeTrigger()))
    # test different gaps for different keys
    h.element("key1", 3, 10)
    h.element("key2", 4, 5000)
    h.element("key2", 5, 6000)
    h.watermark(8999)
    expected = [(3009, ("key1-3", 10, 3010)), (7999, ("key2-9", 5000, 8000))]
    assert h.output() == expected

    # test gap when it produces an end time before current timeout
    # the furthest timeout is respected
    h.element("key2", 1, 9000)
    h.element("key2", 2, 10000)
    h.element("key2", 10, 10500)
    h.watermark(12999)
    expected += [(11999, ("key2-13", 9000, 12000))]
    assert h.output() == sorted(expected)

    # test gap when it produces an end time after current timeout
    h.element("key2", 10, 13000)
    h.element("key2", 10, 13500)
    h.element("key2", 1, 14000)
    h.watermark(16999)
    expected += [(15999, ("key2-21", 13000, 16000))]
    assert h.output() == sorted(expected)


def test_dynamic_processing_time_session_windows() -> None:
    h = Harness(lambda: WindowOperator(ProcessingTimeSessionWindows.with_dynamic_gap(_gap),
                                       SessionWindowFunction(), ProcessingTimeTrigger()))
    # test different gaps for different keys
    h.processing_time(10)
    h.element("key1", 3, 10)
    h.processing_time(5000)
    h.element("key2", 4, 5000)
    h.processing_time(6000)
    h.element("key2", 5, 6000)
    h.processing_time(8999)
    expected = [(3009, ("key1-3", 10, 3010)), (7999, ("key2-9", 5000, 8000))]
    assert h.output() == expected

    # test gap when it produces an end time before current timeout
    # the furthest timeout is respected
    h.processing_time(9000)
    h.element("key2", 1, 9000)
    h.processing_time(10000)
    h.element("key2", 2, 10000)
    h.processing_time(10500)
    h.element("key2", 10, 10500)
    h.processing_time(10500)

    # test gap when it produces an end time after current timeout
    h.processing_time(13000)
    expected += [(11999, ("key2-13", 9000, 12000))]
    assert h.output() == sorted(expected)
    h.element("key2", 10, 13000)
    h.processing_time(13500)
    h.element("key2", 10, 13500)
    h.processing_time(14000)
    h.element("key2", 1, 14000)
    h.processing_time(16999)
    expected += [(15999, ("key2-21", 13000, 16000))]
    assert h.output() == sorted(expected)


# ------------------------------------------------ lateness

def test_lateness() -> None:
    h = Harness(lambda: WindowOperator(TumblingEventTimeWindows(2000), SUM,
                                       PurgingTrigger(EventTimeTrigger()), allowed_lateness=500))
    h.element("key2", 1, 500)
    h.watermark(1500)
    h.element("key2", 1, 1300)
    h.watermark(2300)
    expected = [(1999, ("key2", 2))]
    assert h.output() == expected

    # this will not be sideoutput because window.maxTimestamp() + allowedLateness >
    # currentWatermark
    h.element("key2", 1, 1997)
    h.watermark(6000)
    # this is 1 and not 3 because the trigger fires and purges
    expected += [(1999, ("key2", 1))]
    assert h.output() == sorted(expected)

    # this will be side output because window.maxTimestamp() + allowedLateness <
    # currentWatermark
    h.element("key2", 1, 1998)
    h.watermark(7000)
    assert h.output() == sorted(expected)
    assert h.late_output() == [(1998, ("key2", 1))]
    assert h.operator.late_records == 1
    # the late firing within the lateness is the window's pane 1; the cleanup at 2499 emits
    # nothing (the trigger does not fire then), so no pane is flagged last
    assert [r.pane for r in h.results] == [
        PaneInfo(0, Timing.ON_TIME, False), PaneInfo(1, Timing.LATE, False)]


def test_cleanup_time_overflow() -> None:
    assigner = TumblingEventTimeWindows(1000)
    h = Harness(lambda: WindowOperator(assigner, SUM, EventTimeTrigger(), allowed_lateness=2000))
    timestamp = MAX_WATERMARK - 1750
    (window,) = assigner.assign_windows(("key2", 1), timestamp, h.operator)
    h.element("key2", 1, timestamp)

    # the garbage collection timer would wrap around in a Java long ...
    assert window.max_timestamp() + 2000 > MAX_WATERMARK
    # ... and would prematurely fire with watermark (Long.MAX_VALUE - 1500)
    h.watermark(MAX_WATERMARK - 1500)
    # this watermark is before the end timestamp of our only window
    assert MAX_WATERMARK - 1500 < window.max_timestamp() < MAX_WATERMARK
    assert h.output() == []

    # push in a watermark that will trigger computation of our window
    h.watermark(window.max_timestamp())
    assert h.output() == [(window.max_timestamp(), ("key2", 1))]


def test_side_output_due_to_lateness_tumbling() -> None:
    h = Harness(lambda: WindowOperator(TumblingEventTimeWindows(2000), SUM, EventTimeTrigger()))
    # normal element
    h.element("key2", 1, 1000)
    h.watermark(1985)
    # this will not be dropped because window.maxTimestamp() + allowedLateness >
    # currentWatermark
    h.element("key2", 1, 1980)
    h.watermark(1999)
    expected = [(1999, ("key2", 2))]
    assert h.output() == expected

    # side output as late
    h.element("key2", 1, 1998)
    h.element("key2", 1, 2001)
    h.watermark(2999)
    h.watermark(3999)
    expected += [(3999, ("key2", 1))]
    assert h.output() == sorted(expected)
    assert h.late_output() == [(1998, ("key2", 1))]


def test_side_output_due_to_lateness_sliding() -> None:
    h = Harness(lambda: WindowOperator(SlidingEventTimeWindows(3000, 1000), SUM,
                                       EventTimeTrigger()))
    h.element("key2", 1, 1000)
    h.watermark(1999)
    expected = [(1999, ("key2", 1))]
    assert h.output() == expected

    h.element("key2", 1, 2000)
    h.watermark(3000)
    expected += [(2999, ("key2", 2))]
    assert h.output() == sorted(expected)

    h.element("key1", 1, 3001)
    # lateness is set to 0 and window size = 3 sec and slide 1, the following 2 elements (2400)
    # are assigned to windows ending at 2999, 3999, 4999.
    # The 2999 is dropped because it is already late (WM = 2999) but the rest are kept.
    h.element("key2", 1, 2400)
    h.element("key2", 1, 2400)
    h.element("key1", 1, 3001)
    h.element("key2", 1, 3900)
    h.watermark(6000)
    expected += [
        (3999, ("key2", 5)), (3999, ("key1", 2)),
        (4999, ("key2", 4)), (4999, ("key1", 2)),
        (5999, ("key2", 1)), (5999, ("key1", 2)),
    ]
    assert h.output() == sorted(expected)

    # side output element due to lateness
    h.element("key1", 1, 3001)
    h.watermark(25000)
    assert h.output() == sorted(expected)
    assert h.late_output() == [(3001, ("key1", 1))]


def _session_lateness(trigger: Trigger, lateness: int) -> Harness:
    """The common start of Flink's session lateness tests (gap 3s)."""
    h = Harness(lambda: WindowOperator(EventTimeSessionWindows.with_gap(3000), SUM, trigger,
                                       allowed_lateness=lateness))
    h.element("key2", 1, 1000)
    h.watermark(1999)
    h.element("key2", 1, 2000)
    h.watermark(4998)
    # this will not be dropped because the session we're adding two has maxTimestamp
    # after the current watermark
    h.element("key2", 1, 4500)
    # new session
    h.element("key2", 1, 8500)
    h.watermark(7400)
    assert h.output() == []
    # this will merge the two sessions into one
    h.element("key2", 1, 7000)
    h.watermark(11501)
    assert h.output(reduced_session) == [(11499, ("key2-5", 1000, 11500))]
    # new session
    h.element("key2", 1, 11600)
    h.watermark(14600)
    assert h.output(reduced_session) == [
        (11499, ("key2-5", 1000, 11500)), (14599, ("key2-1", 11600, 14600))]
    return h


def test_side_output_due_to_lateness_session_zero_lateness_purging_trigger() -> None:
    h = _session_lateness(PurgingTrigger(EventTimeTrigger()), 0)
    # this is side output as late
    h.element("key2", 1, 10000)
    # this is also side output as late (we test that they are not accidentally merged)
    h.element("key2", 1, 10100)
    h.element("key2", 1, 14500)
    h.watermark(20000)
    h.watermark(100000)
    assert h.output(reduced_session) == [
        (11499, ("key2-5", 1000, 11500)), (14599, ("key2-1", 11600, 14600)),
        (17499, ("key2-1", 14500, 17500))]
    assert h.late_output() == [(10000, ("key2", 1)), (10100, ("key2", 1))]


def test_side_output_due_to_lateness_session_zero_lateness() -> None:
    h = _session_lateness(EventTimeTrigger(), 0)
    # this is side output as late, reuse last timestamp
    h.element("key2", 1, 10000)
    h.element("key2", 1, 14500)
    h.watermark(20000)
    h.watermark(100000)
    assert h.output(reduced_session) == [
        (11499, ("key2-5", 1000, 11500)), (14599, ("key2-1", 11600, 14600)),
        (17499, ("key2-1", 14500, 17500))]
    assert h.late_output() == [(10000, ("key2", 1))]
    assert h.operator.num_keys() == 0


def test_drop_due_to_lateness_session_with_lateness_purging_trigger() -> None:
    # this has the same output as test_side_output_due_to_lateness_session_zero_lateness()
    # because the allowed lateness is too small to make a difference
    h = _session_lateness(PurgingTrigger(EventTimeTrigger()), 10)
    h.element("key2", 1, 10000)
    assert reduced_session(h.results[-1]) == ("key2-1", 10000, 14600)
    h.element("key2", 1, 14500)
    h.watermark(20000)
    h.watermark(100000)
    assert h.output(reduced_session) == [
        (11499, ("key2-5", 1000, 11500)), (14599, ("key2-1", 10000, 14600)),
        (14599, ("key2-1", 11600, 14600)), (17499, ("key2-1", 10000, 17500))]
    assert h.late == []


def test_not_side_output_due_to_lateness_session_with_lateness() -> None:
    # same as the one above but with an accumulating trigger, i.e. one that does not return
    # FIRE_AND_PURGE when firing but just FIRE
    h = _session_lateness(EventTimeTrigger(), 10)
    # because of the small allowed lateness and because the trigger is accumulating
    # this will be merged into the session (11600-14600) and therefore will not
    # be side output as late
    h.element("key2", 1, 10000)
    h.element("key2", 1, 14500)
    # adding ("key2", 1) extended the session to (10000-14600) for which
    # maxTimestamp <= currentWatermark. Therefore, we immediately get a firing
    assert reduced_session(h.results[-1]) == ("key2-2", 10000, 14600)
    assert h.late == []
    h.watermark(20000)
    h.watermark(100000)
    assert h.output(reduced_session) == [
        (11499, ("key2-5", 1000, 11500)), (14599, ("key2-1", 11600, 14600)),
        (14599, ("key2-2", 10000, 14600)), (17499, ("key2-3", 10000, 17500))]
    assert h.late == []
    # the session kept growing: its panes go on from the merged parts
    assert [(r.pane.index, r.pane.timing) for r in h.results] == [
        (0, Timing.ON_TIME), (0, Timing.ON_TIME), (1, Timing.LATE), (2, Timing.ON_TIME)]


def test_not_side_output_due_to_lateness_session_with_huge_lateness_purging_trigger() -> None:
    h = _session_lateness(PurgingTrigger(EventTimeTrigger()), 10000)
    h.element("key2", 1, 10000)
    assert reduced_session(h.results[-1]) == ("key2-1", 1000, 14600)
    assert h.late == []
    h.element("key2", 1, 14500)
    h.watermark(20000)
    h.watermark(100000)
    assert h.output(reduced_session) == [
        (11499, ("key2-5", 1000, 11500)), (14599, ("key2-1", 1000, 14600)),
        (14599, ("key2-1", 11600, 14600)), (17499, ("key2-1", 1000, 17500))]
    assert h.late == []


def test_not_side_output_due_to_lateness_session_with_huge_lateness() -> None:
    h = _session_lateness(EventTimeTrigger(), 10000)
    h.element("key2", 1, 10000)
    # the maxTimestamp of the merged session is already late, so we get an immediate firing
    assert reduced_session(h.results[-1]) == ("key2-7", 1000, 14600)
    assert h.late == []
    h.element("key2", 1, 14500)
    h.watermark(20000)
    h.watermark(100000)
    assert h.output(reduced_session) == [
        (11499, ("key2-5", 1000, 11500)), (14599, ("key2-1", 11600, 14600)),
        (14599, ("key2-7", 1000, 14600)), (17499, ("key2-8", 1000, 17500))]
    assert h.late == []


# ------------------------------------------------ cleanup timers

class EventTimeTriggerAccumGC(Trigger):
    """Flink's test trigger: fires at the window's end and at the cleanup time, purging."""

    def __init__(self, cleanup_time: int) -> None:
        self.cleanup_time = cleanup_time

    def on_element(
        self, element: Any, timestamp: int | None, window: Window, ctx: TriggerContext,
    ) -> TriggerResult:
        if window.max_timestamp() <= ctx.current_watermark:
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        if time in (window.max_timestamp(), window.max_timestamp() + self.cleanup_time):
            return TriggerResult.FIRE_AND_PURGE
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Window, ctx: TriggerContext) -> None:
        ctx.register_event_time_timer(window.max_timestamp())

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        ctx.delete_event_time_timer(window.max_timestamp())


class PassThroughFunction2(ProcessWindowFunction[Element, str]):
    """Flink's ``PassThroughFunction2``: ``"GOT: (key2,1)"``."""

    def process(self, key: Any, context: WindowContext, elements: list[Element]) -> list[str]:
        return ["GOT: " + ",".join(f"({k},{v})" for k, v in elements)]


def _cleanup_timer(build: Callable[[], WindowOperator], last_watermark: int) -> Harness:
    h = Harness(build)
    # normal element
    h.element("key2", 1, 1000)
    h.watermark(1599)
    h.watermark(1999)  # here it fires and purges
    h.watermark(last_watermark)  # here is the cleanup timer
    h.watermark(5000)
    # the cleanup cleared every piece of the window's state
    assert h.operator.num_keys() == 0
    assert h.operator.snapshot()["keys"] == []
    return h


def test_cleanup_timer_with_empty_list_state_for_tumbling_windows2() -> None:
    h = _cleanup_timer(lambda: WindowOperator(TumblingEventTimeWindows(2000),
                                              PassThroughFunction2(),
                                              EventTimeTriggerAccumGC(100),
                                              allowed_lateness=100), 2100)
    # the cleanup timer fires the trigger again, but the window is empty: no output
    assert h.output() == [(1999, "GOT: (key2,1)")]


def test_cleanup_timer_with_empty_list_state_for_tumbling_windows() -> None:
    h = _cleanup_timer(lambda: WindowOperator(TumblingEventTimeWindows(2000),
                                              PassThroughFunction(), EventTimeTrigger(),
                                              allowed_lateness=1), 2000)
    assert h.output() == [(1999, ("key2", 1))]


def test_cleanup_timer_with_empty_reduce_state_for_tumbling_windows() -> None:
    h = _cleanup_timer(lambda: WindowOperator(TumblingEventTimeWindows(2000), SUM,
                                              EventTimeTrigger(), allowed_lateness=1), 2000)
    assert h.output() == [(1999, ("key2", 1))]


def test_cleanup_timer_with_empty_list_state_for_session_windows() -> None:
    h = Harness(lambda: WindowOperator(EventTimeSessionWindows.with_gap(3000),
                                       PassThroughFunction(), EventTimeTrigger(),
                                       allowed_lateness=10))
    h.element("key2", 1, 1000)
    h.watermark(4998)
    assert h.output() == [(3999, ("key2", 1))]
    h.watermark(14600)
    assert h.output() == [(3999, ("key2", 1))]
    assert h.operator.num_keys() == 0


def test_cleanup_timer_with_empty_reduce_state_for_session_windows() -> None:
    h = Harness(lambda: WindowOperator(EventTimeSessionWindows.with_gap(3000), SUM,
                                       EventTimeTrigger(), allowed_lateness=10))
    h.element("key2", 1, 1000)
    h.watermark(4998)
    assert h.output(reduced_session) == [(3999, ("key2-1", 1000, 4000))]
    h.watermark(14600)
    assert h.output(reduced_session) == [(3999, ("key2-1", 1000, 4000))]
    assert h.operator.num_keys() == 0


# ------------------------------------------------ ContinuousProcessingTimeTriggerTest

class IntegerSum(ProcessWindowFunction[int, tuple[Window, int]]):
    """Flink's ``IntegerSumWindowFunction``: ``(window, sum)``."""

    def process(self, key: Any, context: WindowContext, elements: list[int]) -> list[Any]:
        return [(context.window, sum(elements))]


def _integers(assigner: Any) -> tuple[WindowOperator, list[tuple[Window, int]]]:
    return WindowOperator(assigner, IntegerSum(), ContinuousProcessingTimeTrigger(5)), []


def _collect(out: Any, into: list[Any]) -> None:
    into.extend(r.result for r in out.results)


def test_continuous_processing_time_trigger_processing_time_window_firing() -> None:
    """``ContinuousProcessingTimeTriggerTest.testProcessingTimeWindowFiring``."""
    op, out = _integers(TumblingProcessingTimeWindows(10))
    for time, value in ((0, 1), (2, 2)):
        _collect(op.process_processing_time(time), out)
        _collect(op.process_element(0, value), out)
    _collect(op.process_processing_time(5), out)
    assert out == [(TimeWindow(0, 10), 3)]  # fire window [0, 10), value is 1+2=3
    _collect(op.process_processing_time(7), out)
    _collect(op.process_element(0, 3), out)
    _collect(op.process_processing_time(9), out)
    assert out[1:] == [(TimeWindow(0, 10), 6)]
    _collect(op.process_processing_time(10), out)
    _collect(op.process_element(0, 3), out)
    _collect(op.process_processing_time(15), out)
    assert out[2:] == [(TimeWindow(10, 20), 3)]
    _collect(op.process_processing_time(18), out)
    _collect(op.process_element(0, 3), out)
    _collect(op.process_processing_time(20), out)
    assert out[3:] == [(TimeWindow(10, 20), 6)]


def test_continuous_processing_time_trigger_event_time_window_firing() -> None:
    """``ContinuousProcessingTimeTriggerTest.testEventTimeWindowFiring``."""
    op, out = _integers(TumblingEventTimeWindows(10))
    _collect(op.process_processing_time(0), out)
    for value, timestamp in ((1, 1), (2, 3), (3, 7)):
        _collect(op.process_element(0, value, timestamp), out)
    _collect(op.process_processing_time(5), out)
    assert out == [(TimeWindow(0, 10), 6)]
    _collect(op.process_element(0, 3, 8), out)
    _collect(op.process_processing_time(10), out)
    assert out[1:] == [(TimeWindow(0, 10), 9)]
    _collect(op.process_element(0, 3, 12), out)
    _collect(op.process_processing_time(15), out)
    assert out[2:] == [(TimeWindow(10, 20), 3)]


def test_continuous_processing_time_trigger_merging_windows() -> None:
    """``ContinuousProcessingTimeTriggerTest.testMergingWindows``."""
    op, out = _integers(ProcessingTimeSessionWindows.with_gap(10))
    _collect(op.process_processing_time(0), out)
    _collect(op.process_element(0, 1), out)  # window [0, 10)
    _collect(op.process_processing_time(2), out)
    _collect(op.process_element(0, 2), out)  # window [2, 12) ==> [0, 12)
    _collect(op.process_processing_time(5), out)  # merged timer should still fire
    assert out == [(TimeWindow(0, 12), 3)]
    _collect(op.process_processing_time(9), out)
    assert len(out) == 1
    _collect(op.process_processing_time(10), out)
    _collect(op.process_processing_time(15), out)  # firing on time
    assert out == [(TimeWindow(0, 12), 3)] * 3
    _collect(op.process_processing_time(100), out)  # window is dropped already
    assert len(out) == 3
    assert op.num_keys() == 0


# ------------------------------------------------ beyond Flink's tests

def test_panes_early_on_time_and_last() -> None:
    """Early firings by a continuous trigger (at 1000 and 2000), then the on-time one, which
    with zero lateness also clears the window: the last pane."""
    op = WindowOperator(TumblingEventTimeWindows(3000), Count(), ContinuousEventTimeTrigger(1000))
    op.process_element("k", "a", 100)
    early = op.process_watermark(1000).results
    op.process_element("k", "b", 1500)
    later = op.process_watermark(2999).results
    assert [(r.result, r.pane) for r in early + later] == [
        (1, PaneInfo(0, Timing.EARLY, False)),
        (2, PaneInfo(1, Timing.EARLY, False)),
        (2, PaneInfo(2, Timing.ON_TIME, True)),
    ]
    assert early[0].pane.is_first and not later[0].pane.is_first


def test_panes_late_firing_and_cleanup_firing() -> None:
    """A late element within the lateness re-fires (LATE); a trigger that fires at the cleanup
    time makes the last pane."""
    op = WindowOperator(TumblingEventTimeWindows(2000), Count(), EventTimeTriggerAccumGC(1000),
                        allowed_lateness=1000)
    op.process_element("k", "a", 500)
    results = op.process_watermark(1999).results  # ON_TIME, purged
    results += op.process_element("k", "b", 1500).results  # W >= end: fires at once
    op.process_watermark(2200)
    results += op.process_watermark(2999).results  # the cleanup time: fires, then clears
    assert [(r.result, r.pane) for r in results] == [
        (1, PaneInfo(0, Timing.ON_TIME, False)),
        (1, PaneInfo(1, Timing.LATE, False)),
        (1, PaneInfo(2, Timing.LATE, True)),
    ]
    assert op.num_keys() == 0
    # after the cleanup the window is gone: its elements are late, counted, not dropped
    late = op.process_element("k", "c", 1999).late
    assert late == [LateElement("k", "c", 1999)] and op.late_records == 1


def test_element_of_late_point_window_goes_to_late_output() -> None:
    """Flink drops an element whose windows are all late while its own timestamp is not
    (``timestamp + lateness > W``) without a trace: a point window [t, t) ends at t - 1. Here it
    goes to the late output."""
    op = WindowOperator(PointSessionWindows(3000), Count(), EventTimeTrigger())
    op.process_watermark(2499)
    out = op.process_element("k", ("k", 33), 2500)
    assert out.results == [] and out.late == [LateElement("k", ("k", 33), 2500)]
    assert op.late_records == 1


# ------------------------------------------------ state as data

Step = tuple[str, Any]


def _run(op: WindowOperator, steps: Iterable[Step]) -> list[Any]:
    out: list[Any] = []
    for kind, arg in steps:
        if kind == "e":
            key, value, ts = arg
            o = op.process_element(key, value, ts)
        elif kind == "w":
            o = op.process_watermark(arg)
        else:
            o = op.process_processing_time(arg)
        out += [(r.key, window_key(r.window), r.result, r.pane) for r in o.results]
        out += [("late", e.key, e.value, e.timestamp) for e in o.late]
    return out


def window_key(window: Window) -> Any:
    return (window.start, window.end) if isinstance(window, TimeWindow) else "global"


SCENARIOS: dict[str, tuple[Callable[[], WindowOperator], list[Step]]] = {
    "sessions-lateness-continuous": (
        lambda: WindowOperator(EventTimeSessionWindows.with_gap(3000), Sum(),
                               ContinuousEventTimeTrigger(1000), allowed_lateness=2000),
        [("e", ("a", 1, 1000)), ("e", ("b", 2, 1200)), ("w", 1500), ("e", ("a", 3, 3500)),
         ("w", 2500), ("e", ("a", 4, 8000)), ("w", 6600), ("e", ("a", 5, 5000)),
         ("e", ("b", 6, 100)), ("w", 9000), ("e", ("a", 7, 4000)), ("w", 20000),
         ("e", ("a", 8, 4000))]),
    "sliding-evicting-process": (
        lambda: WindowOperator(SlidingEventTimeWindows(3000, 1000), RichIntSum(),
                               CountTrigger(2), allowed_lateness=500,
                               evictor=_count_evictor()),
        [("e", ("a", 1, 100)), ("e", ("a", 2, 1100)), ("e", ("a", 3, 2100)), ("w", 2000),
         ("e", ("a", 4, 1500)), ("e", ("b", 5, 2500)), ("w", 4000), ("e", ("a", 6, 3999)),
         ("e", ("a", 7, 2000)), ("w", 9000)]),
    "processing-time-sessions": (
        lambda: WindowOperator(ProcessingTimeSessionWindows.with_gap(100), Count(),
                               PurgingTrigger(CountTrigger(2))),
        [("p", 0), ("e", ("a", 1, None)), ("p", 50), ("e", ("a", 2, None)),
         ("e", ("a", 3, None)), ("p", 120), ("e", ("b", 4, None)), ("p", 400)]),
}


class RichIntSum(ProcessWindowFunction[int, int]):
    def process(self, key: Any, context: WindowContext, elements: list[int]) -> list[int]:
        return [sum(elements)]


def _count_evictor() -> Any:
    from flinkish_core.windowing import CountEvictor
    return CountEvictor(2)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_snapshot_restore_mid_stream_gives_identical_output(name: str) -> None:
    """Cut the run after every step, carry the state through JSON into a fresh operator and go
    on: the output equals the uninterrupted run's."""
    build, steps = SCENARIOS[name]
    expected = _run(build(), steps)
    assert any(r[0] != "late" for r in expected)
    for cut in range(len(steps) + 1):
        first = build()
        out = _run(first, steps[:cut])
        second = build()
        second.restore(json.loads(json.dumps(first.snapshot())))
        assert _run(second, steps[cut:]) == expected[len(out):], f"cut after step {cut}"
        assert out == expected[:len(out)]


def test_key_state_moves_one_key_between_operators() -> None:
    """A key's state alone (what a keyed state store keeps) carries its windows, trigger state,
    merging mapping, timers and panes: the key goes on in another operator as if it had never
    left."""
    def build() -> WindowOperator:
        return WindowOperator(EventTimeSessionWindows.with_gap(3000), Sum(),
                              ContinuousEventTimeTrigger(1000), allowed_lateness=1000)

    steps_before = [("e", ("a", 1, 1000)), ("e", ("b", 5, 1100)), ("w", 1500),
                    ("e", ("a", 2, 3500))]
    steps_after = [("w", 4000), ("e", ("a", 4, 2000)), ("w", 9000)]
    reference = build()
    _run(reference, steps_before)
    expected_a = [r for r in _run(reference, steps_after) if r[0] == "a"]

    source = build()
    _run(source, steps_before)
    entry = json.loads(json.dumps(source.key_state("a")))
    target = build()
    target.process_watermark(source.current_watermark)
    target.restore_key_state("a", entry)
    assert _run(target, steps_after) == expected_a
    assert target.num_keys() == 0

    # dropping the key's state leaves the other keys alone
    source.restore_key_state("a", None)
    assert source.key_state("a") is None and source.key_state("b") is not None
    with pytest.raises(ValueError, match="cannot restore key"):
        source.restore_key_state("b", entry)


def test_snapshot_and_restore_copy_the_users_values_unless_told_not_to() -> None:
    """With ``copy`` (the default) a snapshot and the operator never share the window contents:
    the operator appending an element changes neither a snapshot taken before nor one it was
    restored from. ``copy=False`` shares them (for a caller that encodes the snapshot at once,
    or restores one nobody else holds)."""
    def build() -> WindowOperator:
        return WindowOperator(TumblingEventTimeWindows(1000), PassThroughFunction())

    def contents(snapshot: dict[str, Any]) -> list[Any]:
        return [c for entry in snapshot["keys"] for _, c in entry["contents"]]

    source = build()
    source.process_element("a", ("a", 1), 10)
    copied, shared = source.snapshot(), source.snapshot(copy=False)
    source.process_element("a", ("a", 2), 20)
    assert contents(copied) == [[("a", 1)]]
    assert contents(shared) == [[("a", 1), ("a", 2)]]

    for copy, expected in ((True, [[("a", 1)]]), (False, [[("a", 1), ("a", 3)]])):
        origin = build()
        origin.process_element("a", ("a", 1), 10)
        taken = origin.snapshot()
        target = build()
        target.restore(taken, copy=copy)
        target.process_element("a", ("a", 3), 30)
        assert contents(taken) == expected
        fired = target.process_watermark(999).results
        assert [r.result for r in fired] == [("a", 1), ("a", 3)]
