"""The window operator's fast paths against its reference ones, over random streams
(hypothesis): ``process_elements`` and the firing of timers (one loop each for tumbling and
sliding windows with the default trigger) against ``process_element`` element by element and
the general firing, and the columnar snapshot against the per-key one it replaces (a state
written in either layout restores and continues alike).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flinkish_core.watermark import MAX_WATERMARK
from flinkish_core.windowing import (
    COLUMNAR_FORMAT,
    ContinuousEventTimeTrigger,
    Count,
    CountEvictor,
    CountTrigger,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    Sum,
    TumblingEventTimeWindows,
    WindowOperator,
    WindowOutput,
)
from flinkish_core.windowing.timer_service import TimerQueue
from flinkish_core.windowing.window import TimeWindow

Element = tuple[str, int, int]
Batch = tuple[int, list[Element]]

elements = st.tuples(st.sampled_from("abcd"), st.integers(0, 9), st.integers(-3000, 12000))
#: batches as flinkish.windows feeds them: a watermark, then the batch's elements
batches = st.lists(st.tuples(st.integers(-3000, 12000), st.lists(elements, max_size=12)),
                   max_size=8)
lateness = st.sampled_from([0, 500, 2500])
assigners = st.sampled_from([
    TumblingEventTimeWindows(1000), TumblingEventTimeWindows(1000, 300),
    TumblingEventTimeWindows(1000, -700), SlidingEventTimeWindows(2000, 500),
    SlidingEventTimeWindows(1500, 1000, 200),
])
functions = st.sampled_from([Count(), Sum()])


def _flat(out: WindowOutput) -> list[Any]:
    return ([(r.key, r.window, r.result, r.pane) for r in out.results]
            + [("late", e.key, e.value, e.timestamp) for e in out.late])


def _state(operator: WindowOperator) -> dict[str, Any]:
    """The operator's per-key snapshot, its keys in order (restoring may change their
    order, which means nothing)."""
    snapshot = operator.snapshot()
    return {**snapshot, "keys": sorted(snapshot["keys"], key=lambda entry: entry["key"])}


class _Reference(EventTimeTrigger):
    """Flink's default trigger as any user's trigger: the operator's general path."""


class _Listing(ProcessWindowFunction[Any, Any]):
    def process(self, key: Any, context: Any, elements: list[Any]) -> list[Any]:
        return [sorted(elements)]


@settings(max_examples=100, deadline=None)
@given(batches, assigners, functions, lateness)
def test_process_elements_is_process_element_one_by_one(
    stream: list[Batch], assigner: Any, function: Any, allowed_lateness: int,
) -> None:
    bulk = WindowOperator(assigner, function, allowed_lateness=allowed_lateness)
    single = WindowOperator(assigner, function, _Reference(), allowed_lateness=allowed_lateness)
    assert bulk._bulk and not single._bulk
    for watermark, batch in [*stream, (MAX_WATERMARK, [])]:
        assert _flat(bulk.process_watermark(watermark)) == _flat(
            single.process_watermark(watermark))
        out = WindowOutput()
        for key, value, timestamp in batch:
            one = single.process_element(key, value, timestamp)
            out.results += one.results
            out.late += one.late
        assert _flat(bulk.process_elements(batch)) == _flat(out)
        # the same contents, panes and timers, registered in the same order
        assert bulk.snapshot() == single.snapshot()
        assert bulk.late_records == single.late_records
    assert bulk.num_keys() == 0


@pytest.mark.parametrize("build", [
    lambda: WindowOperator(TumblingEventTimeWindows(1000), Count(), EventTimeTrigger()),
    lambda: WindowOperator(TumblingEventTimeWindows(1000), Count(),
                           ContinuousEventTimeTrigger(300)),
    lambda: WindowOperator(GlobalWindows(), Count(), CountTrigger(2)),
    lambda: WindowOperator(TumblingEventTimeWindows(1000), _Listing(), evictor=CountEvictor(2)),
])
def test_the_general_path_is_kept_outside_the_common_case(build: Any) -> None:
    operator = build()
    assert operator._bulk == (type(operator.trigger) is EventTimeTrigger
                              and isinstance(operator.function, Count))
    if not operator._bulk:
        reference = build()
        batch = [("a", 1, 100), ("b", 2, 900), ("a", 3, 1_500), ("a", 4, 1_600)]
        expected = [_flat(reference.process_element(*e)) for e in batch]
        got = _flat(operator.process_elements(batch))
        assert sorted(got, key=repr) == sorted((r for o in expected for r in o), key=repr)


def test_a_timestamp_missing_fails_as_in_process_element() -> None:
    with pytest.raises(ValueError, match="without a timestamp"):
        WindowOperator(TumblingEventTimeWindows(1000), Count()).process_elements(
            [("a", 1, None)])


# every kind of state: contents, pane counters, trigger state, merging windows, timers of
# both domains, element lists
OPERATORS = [
    lambda: WindowOperator(EventTimeSessionWindows(1000), Count(),
                           ContinuousEventTimeTrigger(400), allowed_lateness=800),
    lambda: WindowOperator(SlidingEventTimeWindows(2000, 500), Sum(), allowed_lateness=500),
    lambda: WindowOperator(GlobalWindows(), Count(), CountTrigger(3)),
    lambda: WindowOperator(TumblingEventTimeWindows(1000), _Listing(), evictor=CountEvictor(2),
                           allowed_lateness=1000),
]


@settings(max_examples=40, deadline=None)
@given(batches, st.sampled_from(range(len(OPERATORS))), st.data())
def test_either_snapshot_layout_restores_and_continues_identically(
    stream: list[Batch], which: int, data: st.DataObject,
) -> None:
    """A state written per key (the layout before the columnar one: old checkpoints) and one
    written in columns, both through JSON, restore the same operator, which continues as the
    uninterrupted one does."""
    build = OPERATORS[which]
    cut = data.draw(st.integers(0, len(stream)))
    stream = [*stream, (MAX_WATERMARK, [])]
    operators = [build()]
    for watermark, batch in stream[:cut]:
        operators[0].process_watermark(watermark)
        operators[0].process_elements(batch)
    columnar = json.loads(json.dumps(operators[0].columnar_snapshot()))
    assert columnar["format"] == COLUMNAR_FORMAT
    for snapshot in (json.loads(json.dumps(operators[0].snapshot())), columnar):
        restored = build()
        restored.restore(snapshot)
        assert _state(restored) == _state(operators[0])
        operators.append(restored)
    for watermark, batch in stream[cut:]:
        outs = [_flat(op.process_watermark(watermark)) + _flat(op.process_elements(batch))
                for op in operators]
        assert outs[0] == outs[1] == outs[2]
        assert _state(operators[0]) == _state(operators[1]) == _state(operators[2])


def test_a_columnar_snapshot_takes_no_copies_without_copy() -> None:
    operator = WindowOperator(TumblingEventTimeWindows(1000), _Listing())
    operator.process_elements([("a", 1, 100)])
    shared = operator.columnar_snapshot(copy=False)["contents"][2][0]
    assert shared is operator._contents[("a", TimeWindow(0, 1000))]
    assert operator.columnar_snapshot()["contents"][2][0] is not shared


def test_timer_queue_columns_load_and_earliest() -> None:
    queue = TimerQueue()
    assert queue.earliest() is None and queue.columns() == ([], [], [], [])
    queue.register("a", TimeWindow(0, 10), 9)
    queue.register("b", TimeWindow(0, 10), 5)
    queue.register("a", TimeWindow(10, 20), 19)
    queue.delete("b", TimeWindow(0, 10), 5)
    assert queue.earliest() == 9
    loaded = TimerQueue()
    loaded.load(*queue.columns())
    assert list(loaded.items()) == list(queue.items())
    assert loaded.next_seq == 3
    assert loaded.poll(20) == queue.poll(20)
    assert loaded.earliest() == queue.earliest() == 19
