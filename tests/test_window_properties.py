"""Properties of the window operator over random streams (hypothesis), beyond Flink's
examples: no element is lost or counted twice, and a snapshot taken anywhere, carried through
JSON, continues exactly like the uninterrupted run.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flinkish_core.watermark import MAX_WATERMARK
from flinkish_core.windowing import (
    ContinuousEventTimeTrigger,
    Count,
    EventTimeSessionWindows,
    EventTimeTrigger,
    SlidingEventTimeWindows,
    TimeWindow,
    Timing,
    TumblingEventTimeWindows,
    WindowOperator,
)

Step = tuple[str, Any]

elements = st.tuples(st.just("e"), st.tuples(st.sampled_from("abc"), st.integers(-3000, 12000)))
watermarks = st.tuples(st.just("w"), st.integers(-3000, 12000))
streams = st.lists(st.one_of(elements, elements, watermarks), max_size=60)
lateness = st.sampled_from([0, 500, 2500])


def _run(op: WindowOperator, steps: list[Step]) -> list[Any]:
    out: list[Any] = []
    for kind, arg in steps:
        o = op.process_element(arg[0], 1, arg[1]) if kind == "e" else op.process_watermark(arg)
        out += [(r.key, r.window, r.result, r.pane) for r in o.results]
        out += [("late", e.key, e.timestamp) for e in o.late]
    return out


@settings(max_examples=150, deadline=None)
@given(streams, lateness)
def test_every_element_is_counted_once_or_late(steps: list[Step], allowed_lateness: int) -> None:
    """Tumbling windows, accumulating event-time trigger: once the watermark reaches the end of
    time, each window's last pane counts exactly the elements it took, and every other element
    went to the late output — nothing is dropped."""
    op = WindowOperator(TumblingEventTimeWindows(1000), Count(), EventTimeTrigger(),
                        allowed_lateness=allowed_lateness)
    out = _run(op, [*steps, ("w", MAX_WATERMARK)])
    last: dict[tuple[str, Any], Any] = {}
    for key, window, result, pane in (r for r in out if r[0] != "late"):
        assert (key, window) not in last or last[(key, window)][1].index < pane.index
        last[(key, window)] = (result, pane)
    late = [r for r in out if r[0] == "late"]
    total = sum(1 for kind, _ in steps if kind == "e")
    assert sum(result for result, _ in last.values()) + len(late) == total == (
        op.late_records + sum(result for result, _ in last.values()))
    # each element is in the window of its timestamp, or late
    taken = Counter((key, TimeWindow(ts - ts % 1000, ts - ts % 1000 + 1000))
                    for kind, (key, ts) in (s for s in steps if s[0] == "e"))
    for (key, window), (result, pane) in last.items():
        assert result <= taken[(key, window)]
        # without lateness the on-time firing is the cleanup: the last pane; with a lateness,
        # the event-time trigger does not fire at the cleanup time, so no pane is flagged
        assert pane.is_last == (allowed_lateness == 0)
        assert allowed_lateness > 0 or pane.timing is Timing.ON_TIME
    assert op.num_keys() == 0


@settings(max_examples=60, deadline=None)
@given(streams, lateness, st.data())
def test_snapshot_anywhere_continues_identically(
    steps: list[Step], allowed_lateness: int, data: st.DataObject,
) -> None:
    """Sessions with early firings and sliding windows: cut anywhere, restore from JSON."""
    for build in (
        lambda: WindowOperator(EventTimeSessionWindows.with_gap(700), Count(),
                               ContinuousEventTimeTrigger(300), allowed_lateness=allowed_lateness),
        lambda: WindowOperator(SlidingEventTimeWindows(1500, 500), Count(), EventTimeTrigger(),
                               allowed_lateness=allowed_lateness),
    ):
        expected = _run(build(), steps)
        cut = data.draw(st.integers(0, len(steps)))
        first = build()
        head = _run(first, steps[:cut])
        second = build()
        second.restore(json.loads(json.dumps(first.snapshot())))
        assert head + _run(second, steps[cut:]) == expected
