"""Flink's ``EvictingWindowOperatorTest``, replayed against :class:`WindowOperator` with an
evictor.

Source: apache/flink, ``flink-streaming-java/src/test/java/org/apache/flink/streaming/runtime/
operators/windowing/EvictingWindowOperatorTest.java``; each ``@Test`` method is the test of the
same name in snake_case, with Flink's inputs and expected outputs (translation as in
``test_window_operator.py``: ``StreamRecord(("key2", 4), ts)`` is ``(ts, ("key2", 4))``, sorted).
"""

from __future__ import annotations

from test_window_operator import SUM, Element, Harness, RichSumReducer

from flinkish_core.watermark import MAX_WATERMARK
from flinkish_core.windowing import (
    CountEvictor,
    CountTrigger,
    DeltaEvictor,
    EventTimeTrigger,
    Evictor,
    GlobalWindows,
    TimeEvictor,
    TumblingEventTimeWindows,
    WindowOperator,
)
from flinkish_core.windowing.window_operator import WindowFunction

MAX = MAX_WATERMARK


def _global(evictor: Evictor, function: WindowFunction | None = None) -> Harness:
    return Harness(lambda: WindowOperator(
        GlobalWindows(), RichSumReducer() if function is None else function, CountTrigger(2),
        evictor=evictor))


def _delta(old: Element, new: Element) -> float:
    return new[1] - old[1]


def test_count_evictor_evict_after() -> None:
    h = _global(CountEvictor(4, evict_after=True))
    h.element("key2", 1, 3000)
    h.element("key2", 1, 3999)
    h.element("key1", 1, 20)
    h.element("key1", 1, 0)
    h.element("key1", 1, 999)
    h.element("key2", 1, 1998)
    h.element("key2", 1, 1999)
    h.element("key2", 1, 1000)
    expected = [(MAX, ("key2", 2)), (MAX, ("key2", 4)), (MAX, ("key1", 2))]
    assert h.output() == sorted(expected)

    h.element("key1", 1, 10999)
    h.element("key2", 1, 1000)
    expected += [(MAX, ("key1", 4)), (MAX, ("key2", 6))]
    assert h.output() == sorted(expected)

    h.element("key2", 1, 1000)
    h.element("key2", 1, 1000)
    expected += [(MAX, ("key2", 6))]
    assert h.output() == sorted(expected)


def test_time_evictor_evict_after() -> None:
    h = _global(TimeEvictor(2000, evict_after=True))
    h.element("key2", 1, 1000)
    h.element("key2", 1, 4000)
    h.element("key1", 1, 20)
    h.element("key1", 1, 0)
    h.element("key1", 1, 999)
    h.element("key2", 1, 3500)
    h.element("key2", 1, 2001)
    h.element("key2", 1, 1001)
    expected = [(MAX, ("key2", 2)), (MAX, ("key1", 2)), (MAX, ("key2", 3))]
    assert h.output() == sorted(expected)

    h.element("key1", 1, 10999)
    h.element("key2", 1, 1002)
    expected += [(MAX, ("key1", 4)), (MAX, ("key2", 5))]
    assert h.output() == sorted(expected)


def test_time_evictor_evict_before() -> None:
    h = Harness(lambda: WindowOperator(TumblingEventTimeWindows(4000), RichSumReducer(),
                                       CountTrigger(2), evictor=TimeEvictor(2000)))
    h.element("key2", 1, 1000)
    h.element("key2", 1, 3999)
    h.element("key1", 1, 20)
    h.element("key1", 1, 0)
    h.element("key1", 1, 999)
    h.element("key1", 1, 5999)
    h.element("key2", 1, 3500)
    h.element("key2", 1, 2001)
    h.element("key2", 1, 1001)
    expected = [(3999, ("key2", 1)), (3999, ("key1", 2)), (3999, ("key2", 3))]
    assert h.output() == sorted(expected)

    h.element("key1", 1, 6500)
    h.element("key2", 1, 1002)
    expected += [(7999, ("key1", 2)), (3999, ("key2", 3))]
    assert h.output() == sorted(expected)


def test_time_evictor_no_timestamp() -> None:
    """Without timestamps the time evictor evicts nothing."""
    h = _global(TimeEvictor(2000, evict_after=True))
    for key in ("key2", "key2", "key1", "key1", "key1", "key2", "key2", "key2"):
        h.element(key, 1)
    expected = [(MAX, ("key2", 2)), (MAX, ("key1", 2)), (MAX, ("key2", 4))]
    assert h.output() == sorted(expected)

    h.element("key1", 1)
    h.element("key2", 1)
    expected += [(MAX, ("key1", 4)), (MAX, ("key2", 6))]
    assert h.output() == sorted(expected)


def test_delta_evictor_evict_before() -> None:
    h = _global(DeltaEvictor(2, _delta, evict_after=False))
    h.element("key2", 1, 3000)
    h.element("key2", 4, 3999)
    h.element("key1", 1, 20)
    h.element("key1", 1, 0)
    h.element("key1", 5, 999)
    h.element("key2", 5, 1998)
    h.element("key2", 6, 1999)
    h.element("key2", 1, 1000)
    expected = [(MAX, ("key2", 4)), (MAX, ("key2", 11)), (MAX, ("key1", 2))]
    assert h.output() == sorted(expected)

    h.element("key1", 3, 10999)
    h.element("key2", 10, 1000)
    expected += [(MAX, ("key1", 8)), (MAX, ("key2", 10))]
    assert h.output() == sorted(expected)


def test_delta_evictor_evict_after() -> None:
    h = _global(DeltaEvictor(2, _delta, evict_after=True))
    h.element("key2", 1, 3000)
    h.element("key2", 4, 3999)
    h.element("key1", 1, 20)
    h.element("key1", 1, 0)
    h.element("key1", 5, 999)
    h.element("key2", 5, 1998)
    h.element("key2", 6, 1999)
    h.element("key2", 1, 1000)
    expected = [(MAX, ("key2", 5)), (MAX, ("key2", 15)), (MAX, ("key1", 2))]
    assert h.output() == sorted(expected)

    h.element("key1", 9, 10999)
    h.element("key2", 10, 1000)
    expected += [(MAX, ("key1", 16)), (MAX, ("key2", 22))]
    assert h.output() == sorted(expected)


def _count_trigger(function: WindowFunction) -> None:
    h = _global(CountEvictor(4), function=function)
    # The global window actually ignores these timestamps...
    h.element("key2", 1, 3000)
    h.element("key2", 1, 3999)
    h.element("key1", 1, 20)
    h.element("key1", 1, 0)
    h.element("key1", 1, 999)
    h.element("key2", 1, 1998)
    h.element("key2", 1, 1999)
    h.element("key2", 1, 1000)
    expected = [(MAX, ("key2", 2)), (MAX, ("key2", 4)), (MAX, ("key1", 2))]
    assert h.output() == sorted(expected)

    h.element("key1", 1, 10999)
    h.element("key2", 1, 1000)
    expected += [(MAX, ("key1", 4)), (MAX, ("key2", 4))]
    assert h.output() == sorted(expected)


def test_count_trigger() -> None:
    # Flink's ReduceApplyWindowFunction(SumReducer): the reduce runs over the kept elements
    _count_trigger(SUM)


def test_count_trigger_with_apply() -> None:
    _count_trigger(RichSumReducer())


def test_tumbling_window_with_apply() -> None:
    h = Harness(lambda: WindowOperator(TumblingEventTimeWindows(4000), RichSumReducer(),
                                       EventTimeTrigger(), evictor=CountEvictor(4)))
    h.element("key1", 1, 10)
    h.element("key1", 1, 100)
    h.watermark(1999)
    h.element("key1", 1, 1997)
    h.element("key1", 1, 1998)
    h.element("key1", 1, 2310)  # not late but more than 4
    h.element("key1", 1, 2310)
    h.element("key2", 1, 2310)
    h.element("key2", 1, 2310)
    h.watermark(3999)  # now is the evictor
    assert h.output() == [(3999, ("key1", 4)), (3999, ("key2", 2))]


def test_evicted_elements_leave_the_window_state() -> None:
    """Flink's FLINK-4369: evicted elements are removed from the window's contents, so the
    next firing and a snapshot see only the kept ones."""
    h = _global(CountEvictor(2, evict_after=True))
    for _ in range(4):
        h.element("key1", 1, 5)
    (entry,) = h.operator.snapshot()["keys"]
    assert entry["contents"] == [["global", [[("key1", 1), 5], [("key1", 1), 5]]]]
    assert h.output() == [(MAX, ("key1", 2)), (MAX, ("key1", 4))]
