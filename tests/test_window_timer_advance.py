"""Event-time timers advance only on a strictly greater watermark, as Flink's
``InternalTimerServiceImpl.advanceWatermark`` behind the ``StatusWatermarkValve`` (which
forwards a watermark only when it rises): a timer registered at or below the current watermark
fires at the next advance, never at a repeat of the same watermark.

The Spark operator repeats watermarks: each visit of a key group starts with the batch's
watermark, a group can be visited for records and then for a timer in one batch, and
consecutive batches can share a watermark. So the same input must give the same output
whether one watermark's records come in one piece after it (Flink's order) or in several,
each after the watermark again, with the state snapshotted and restored between them (the
Spark operator's order).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flinkish_core.windowing import (
    ContinuousEventTimeTrigger,
    Count,
    CountTrigger,
    PurgingTrigger,
    Sum,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowOperator,
    WindowOutput,
)
from integration.window_cases import CASES, TimerAtElementTrigger, WindowCase

Panes = list[tuple[Any, ...]]


def panes(outputs: list[WindowOutput]) -> Panes:
    """Every result and late element, in emission order."""
    seen: Panes = []
    for out in outputs:
        for r in out.results:
            bounds = (r.window.start, r.window.end) if isinstance(r.window, TimeWindow) else None
            seen.append(("result", r.key, bounds, r.result, r.pane.index, r.pane.timing.value,
                         r.pane.is_last))
        seen.extend(("late", e.key, e.value, e.timestamp) for e in out.late)
    return seen


def continuous() -> WindowOperator:
    return WindowOperator(TumblingEventTimeWindows(10_000), Count(),
                          ContinuousEventTimeTrigger(3_000), allowed_lateness=5_000)


def test_a_repeated_watermark_fires_nothing() -> None:
    op = WindowOperator(TumblingEventTimeWindows(10_000), Count(), TimerAtElementTrigger())
    assert panes([op.process_watermark(5_000)]) == []
    op.process_element("a", 1, 4_000)  # its timer, 4 s, is already behind the watermark
    op.process_element("a", 1, 5_000)
    assert panes([op.process_watermark(5_000), op.process_watermark(4_000)]) == []
    assert op.current_watermark == 5_000 and op.num_event_time_timers() == 3
    # the next advance fires both timers, each with the window's two elements
    assert panes([op.process_watermark(5_001)]) == [
        ("result", "a", (0, 10_000), 2, 0, "EARLY", False),
        ("result", "a", (0, 10_000), 2, 1, "EARLY", False)]


def test_a_continuous_trigger_interval_reached_by_a_late_element_waits_for_the_next_advance(
) -> None:
    # 74,999 ms arrives after W = 75,000 in window [70 s, 80 s): its interval timer, 75,000,
    # is at the watermark. Flink fires it at the next advance, when the window holds all four
    # elements; firing it at once would make a pane of one.
    op = continuous()
    outputs = [op.process_watermark(75_000), op.process_element("a", 1, 74_999)]
    outputs.append(op.process_watermark(75_000))  # the same watermark again: nothing
    outputs += [op.process_element("a", 1, t) for t in (76_000, 77_000, 78_000)]
    outputs.append(op.process_watermark(76_000))
    assert panes(outputs) == [("result", "a", (70_000, 80_000), 4, 0, "EARLY", False)]
    # the trigger's next interval (78 s) and the window's end come with later watermarks
    assert panes([op.process_watermark(79_999)]) == [
        ("result", "a", (70_000, 80_000), 4, 1, "EARLY", False),
        ("result", "a", (70_000, 80_000), 4, 2, "ON_TIME", False)]


def test_a_count_trigger_with_late_elements_inside_the_lateness() -> None:
    op = WindowOperator(TumblingEventTimeWindows(10_000), Sum(),
                        PurgingTrigger(CountTrigger(2)), allowed_lateness=5_000)
    outputs = [op.process_watermark(12_000)]
    # late for [0, 10 s) but within its lateness: the count trigger fires on the second
    outputs += [op.process_element("a", v, t) for v, t in ((1, 1_000), (2, 2_000), (4, 3_000))]
    outputs.append(op.process_watermark(12_000))
    outputs.append(op.process_watermark(14_999))  # cleanup: the third element goes unfired
    outputs.append(op.process_element("a", 8, 4_000))  # now beyond the lateness
    assert panes(outputs) == [("result", "a", (0, 10_000), 3, 0, "LATE", False),
                              ("late", "a", 8, 4_000)]


# ---------------------------------------------------------------- Flink's order, Spark's order

Round = tuple[int, list[list[tuple[str, int, int]]]]
"""One watermark and the records that follow it, in pieces (key, value, event time)."""

rounds = st.lists(
    st.tuples(
        st.integers(0, 4_000),  # how far the watermark rises (0: it repeats)
        st.lists(st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 9),
                                    st.integers(-9_000, 6_000)),  # relative to the watermark
                          max_size=4), max_size=3)),
    min_size=1, max_size=12)


def schedule(drawn: list[tuple[int, list[list[tuple[str, int, int]]]]]) -> list[Round]:
    watermark, out = 50_000, []
    for rise, pieces in drawn:
        watermark += rise
        out.append((watermark, [[(k, v, watermark + dt) for k, v, dt in piece]
                                for piece in pieces]))
    return out


def flink_order(make: Any, schedule: list[Round]) -> Panes:
    """Each watermark once, then all its records."""
    op = make()
    outputs: list[WindowOutput] = []
    for watermark, pieces in schedule:
        outputs.append(op.process_watermark(watermark))
        outputs += [op.process_element(k, v, t) for piece in pieces for k, v, t in piece]
    outputs.append(op.process_watermark(10**9))
    return panes(outputs)


def spark_order(make: Any, schedule: list[Round]) -> Panes:
    """As the Spark operator visits a key group: for each piece of records (a micro-batch, or a
    visit for records then one for a timer), a fresh operator restored from the stored state
    (through JSON, as the state store keeps it), the watermark again, then the piece; and a
    visit with no records between the pieces (a timer's)."""
    stored = make().snapshot()
    outputs: list[WindowOutput] = []

    def visit(watermark: int, piece: list[tuple[str, int, int]]) -> None:
        nonlocal stored
        op = make()
        snapshot = json.loads(json.dumps(stored))
        for entry in snapshot["keys"]:
            entry["key"] = str(entry["key"])
        op.restore(snapshot)
        outputs.append(op.process_watermark(watermark))
        outputs.extend(op.process_element(k, v, t) for k, v, t in piece)
        stored = op.snapshot()

    for watermark, pieces in schedule:
        for piece in pieces or [[]]:
            visit(watermark, piece)
            visit(watermark, [])
    visit(10**9, [])
    return panes(outputs)


@settings(max_examples=60, deadline=None)
@given(drawn=rounds, case=st.sampled_from(CASES))
def test_splitting_a_watermarks_records_into_visits_changes_nothing(
        drawn: list[tuple[int, list[list[tuple[str, int, int]]]]], case: WindowCase) -> None:
    """Flink's continuous, count and custom triggers, late elements inside the allowed
    lateness, evictors, every event-time assigner (``integration.window_cases``)."""
    make = case.operator
    plan = schedule(drawn)
    assert spark_order(make, plan) == flink_order(make, plan)
