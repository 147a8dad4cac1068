"""Flink's ``MergingWindowSetTest`` and ``TimeWindowTest``, replayed against
:mod:`flinkish_core.windowing`.

Sources: apache/flink, ``flink-streaming-java/src/test/java/org/apache/flink/streaming/runtime/
operators/windowing/MergingWindowSetTest.java`` and ``TimeWindowTest.java``. Flink's mocked
``ListState`` of the window mapping is the set's plain-data form (``to_data``/``from_data``).
Where Flink accepts any of several state windows (it picks one from a hash set), the
expectation keeps all of Flink's alternatives.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flinkish_core.watermark import MIN_WATERMARK
from flinkish_core.windowing import (
    EventTimeSessionWindows,
    GlobalWindow,
    MergingWindowAssigner,
    MergingWindowSet,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from flinkish_core.windowing.window import LONG_MAX, get_window_start_with_offset

W = TimeWindow


class RecordingMergeFunction:
    """Flink's ``TestingMergeFunction``: records the one merge an ``add_window`` may cause."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.target: TimeWindow | None = None
        self.sources: list[TimeWindow] = []
        self.state_window: TimeWindow | None = None
        self.merged_state_windows: list[TimeWindow] = []

    def has_merged(self) -> bool:
        return self.target is not None

    def __call__(
        self, merge_result: TimeWindow, merged_windows: list[TimeWindow],
        state_window_result: TimeWindow, merged_state_windows: list[TimeWindow],
    ) -> None:
        assert self.target is None, "More than one merge for adding a Window should not occur."
        self.target = merge_result
        self.sources = list(merged_windows)
        self.state_window = state_window_result
        self.merged_state_windows = list(merged_state_windows)


def _sessions() -> tuple[MergingWindowSet, RecordingMergeFunction]:
    return MergingWindowSet(EventTimeSessionWindows.with_gap(3)), RecordingMergeFunction()


class NonEagerlyMergingWindowAssigner(MergingWindowAssigner):
    """Flink's misbehaving test assigner: merges lazily, windows that need not overlap the new
    one."""

    def __init__(self, session_timeout: int) -> None:
        self.session_timeout = session_timeout

    def merge_windows(
        self, windows: list[TimeWindow], callback: Callable[[list[TimeWindow], TimeWindow], None],
    ) -> None:
        earliest = min(windows, key=lambda w: w.start)
        associated = [w for w in windows if earliest.start <= w.start < earliest.end]
        if len(associated) > 1:
            callback(associated, TimeWindow(earliest.start, earliest.end + 1))


def test_non_eager_merging() -> None:
    """The set stays correct and holds every added window even when windows that do not
    overlap the new one merge."""
    window_set = MergingWindowSet(NonEagerlyMergingWindowAssigner(3000))
    merge = RecordingMergeFunction()
    for window in (W(0, 2), W(2, 5), W(1, 2), W(10, 12)):
        merge.reset()
        result = window_set.add_window(window, merge)
        assert window_set.get_state_window(result) is not None


def test_incremental_merging() -> None:
    window_set, merge = _sessions()
    # add initial window
    assert window_set.add_window(W(0, 4), merge) == W(0, 4)
    assert not merge.has_merged()
    assert window_set.get_state_window(W(0, 4)) == W(0, 4)

    # add some more windows
    merge.reset()
    assert window_set.add_window(W(0, 4), merge) == W(0, 4)
    assert not merge.has_merged()

    merge.reset()
    assert window_set.add_window(W(3, 5), merge) == W(0, 5)
    assert merge.has_merged()
    assert (merge.target, merge.state_window) == (W(0, 5), W(0, 4))
    assert merge.sources == [W(0, 4)] and merge.merged_state_windows == []

    merge.reset()
    assert window_set.add_window(W(4, 6), merge) == W(0, 6)
    assert (merge.target, merge.state_window) == (W(0, 6), W(0, 4))
    assert merge.sources == [W(0, 5)] and merge.merged_state_windows == []
    assert window_set.get_state_window(W(0, 6)) == W(0, 4)

    # add some windows that falls into the already merged region
    for window in (W(1, 4), W(0, 4), W(3, 5), W(4, 6)):
        merge.reset()
        assert window_set.add_window(window, merge) == W(0, 6)
        assert not merge.has_merged()
    assert window_set.get_state_window(W(0, 6)) == W(0, 4)

    # add some more windows that don't merge with the first bunch
    merge.reset()
    assert window_set.add_window(W(11, 14), merge) == W(11, 14)
    assert not merge.has_merged()
    assert window_set.get_state_window(W(0, 6)) == W(0, 4)
    assert window_set.get_state_window(W(11, 14)) == W(11, 14)

    # add some more windows that merge with the second bunch
    merge.reset()
    assert window_set.add_window(W(10, 13), merge) == W(10, 14)
    assert (merge.target, merge.state_window) == (W(10, 14), W(11, 14))
    assert merge.sources == [W(11, 14)] and merge.merged_state_windows == []

    merge.reset()
    assert window_set.add_window(W(12, 15), merge) == W(10, 15)
    assert (merge.target, merge.state_window) == (W(10, 15), W(11, 14))
    assert merge.sources == [W(10, 14)] and merge.merged_state_windows == []

    merge.reset()
    assert window_set.add_window(W(11, 14), merge) == W(10, 15)
    assert not merge.has_merged()
    assert window_set.get_state_window(W(0, 6)) == W(0, 4)
    assert window_set.get_state_window(W(10, 15)) == W(11, 14)

    # retire the first batch of windows
    window_set.retire_window(W(0, 6))
    assert window_set.get_state_window(W(0, 6)) is None
    assert window_set.get_state_window(W(10, 15)) == W(11, 14)


def test_late_merging() -> None:
    window_set, merge = _sessions()
    # add several non-overlapping initial windows
    for window in (W(0, 3), W(5, 8), W(10, 13)):
        merge.reset()
        assert window_set.add_window(window, merge) == window
        assert not merge.has_merged()
        assert window_set.get_state_window(window) == window

    # add a window that merges the later two windows
    merge.reset()
    assert window_set.add_window(W(8, 10), merge) == W(5, 13)
    assert merge.target == W(5, 13)
    assert merge.state_window in (W(5, 8), W(10, 13))
    assert sorted(merge.sources) == [W(5, 8), W(10, 13)]
    assert merge.merged_state_windows in ([W(10, 13)], [W(5, 8)])
    assert merge.target not in merge.merged_state_windows
    assert window_set.get_state_window(W(0, 3)) == W(0, 3)

    for window in (W(5, 8), W(8, 10), W(10, 13)):
        merge.reset()
        assert window_set.add_window(window, merge) == W(5, 13)
        assert not merge.has_merged()
    assert window_set.get_state_window(W(5, 13)) in (W(5, 8), W(10, 13))

    # add a window that merges all of them together
    merge.reset()
    assert window_set.add_window(W(3, 5), merge) == W(0, 13)
    assert merge.target == W(0, 13)
    assert merge.state_window in (W(0, 3), W(5, 8), W(10, 13))
    assert sorted(merge.sources) == [W(0, 3), W(5, 13)]
    assert merge.merged_state_windows in ([W(0, 3)], [W(5, 8)], [W(10, 13)])
    assert merge.target not in merge.merged_state_windows
    assert window_set.get_state_window(W(0, 13)) in (W(0, 3), W(5, 8), W(10, 13))


def test_merge_large_window_covering_single_window() -> None:
    window_set, merge = _sessions()
    # add an initial small window
    assert window_set.add_window(W(1, 2), merge) == W(1, 2)
    assert not merge.has_merged()
    assert window_set.get_state_window(W(1, 2)) == W(1, 2)
    # add a new window that completely covers the existing window
    merge.reset()
    assert window_set.add_window(W(0, 3), merge) == W(0, 3)
    assert merge.has_merged()
    assert window_set.get_state_window(W(0, 3)) == W(1, 2)


def test_adding_identical_windows() -> None:
    """Adding a window identical to an existing one is no merge."""
    window_set, merge = _sessions()
    for _ in range(2):
        merge.reset()
        assert window_set.add_window(W(1, 2), merge) == W(1, 2)
        assert not merge.has_merged()
        assert window_set.get_state_window(W(1, 2)) == W(1, 2)


def test_merge_large_window_covering_multiple_windows() -> None:
    window_set, merge = _sessions()
    # add several non-overlapping initial windows
    for window in (W(1, 3), W(5, 8), W(10, 13)):
        merge.reset()
        assert window_set.add_window(window, merge) == window
        assert not merge.has_merged()
    # add a new window that completely covers the existing windows
    merge.reset()
    assert window_set.add_window(W(0, 13), merge) == W(0, 13)
    assert merge.has_merged()
    assert sorted(merge.merged_state_windows) in (
        [W(0, 3), W(5, 8)], [W(0, 3), W(10, 13)], [W(5, 8), W(10, 13)])
    assert window_set.get_state_window(W(0, 13)) in (W(1, 3), W(5, 8), W(10, 13))


def test_restore_from_state() -> None:
    window_set = MergingWindowSet.from_data(
        EventTimeSessionWindows.with_gap(3), [[[17, 42], [42, 17]], [[1, 2], [3, 4]]])
    assert window_set.get_state_window(W(17, 42)) == W(42, 17)
    assert window_set.get_state_window(W(1, 2)) == W(3, 4)


def test_persist() -> None:
    window_set, merge = _sessions()
    window_set.add_window(W(1, 2), merge)
    window_set.add_window(W(17, 42), merge)
    assert window_set.get_state_window(W(1, 2)) == W(1, 2)
    assert window_set.get_state_window(W(17, 42)) == W(17, 42)
    assert window_set.to_data() == [[[1, 2], [1, 2]], [[17, 42], [17, 42]]]


def test_retire_unknown_window_fails() -> None:
    window_set, _ = _sessions()
    with pytest.raises(KeyError, match="not in in-flight window set"):
        window_set.retire_window(W(0, 3))


# ------------------------------------------------ TimeWindowTest, assigners

def test_get_window_start_with_offset() -> None:
    # [0, 7), [7, 14), [14, 21)...
    assert [get_window_start_with_offset(t, 0, 7) for t in (1, 6, 7, 8)] == [0, 0, 7, 7]
    # [-4, 3), [3, 10), [10, 17)...
    assert [get_window_start_with_offset(t, 3, 7) for t in (1, 2, 3, 9, 10)] == [
        -4, -4, 3, 3, 10]
    # [-2, 5), [5, 12), [12, 19)...
    assert [get_window_start_with_offset(t, -2, 7) for t in (1, -2, 3, 4, 7, 12)] == [
        -2, -2, -2, -2, 5, 12]
    # for GMT+8:00
    assert get_window_start_with_offset(1470902048450, -8 * 3_600_000, 86_400_000) == (
        1470844800000)


@pytest.mark.parametrize(("timestamp", "start"), [
    (-1, -2000), (-2000, -2000), (-2001, -4000), (0, 0), (1999, 0),
])
def test_tumbling_windows_of_negative_timestamps(timestamp: int, start: int) -> None:
    """Before the epoch the window containing t still starts at or before t (Flink's
    negative-remainder branch)."""
    (window,) = TumblingEventTimeWindows(2000).assign_windows(None, timestamp, _NoClock())
    assert window == W(start, start + 2000)


def test_sliding_windows_of_a_negative_timestamp() -> None:
    windows = SlidingEventTimeWindows(3000, 1000).assign_windows(None, -1, _NoClock())
    assert windows == [W(-1000, 2000), W(-2000, 1000), W(-3000, 0)]


def test_sliding_windows_with_offset() -> None:
    windows = SlidingEventTimeWindows(3000, 1000, offset=100).assign_windows(None, 1050, _NoClock())
    assert windows == [W(100, 3100), W(-900, 2100), W(-1900, 1100)]


@pytest.mark.parametrize("make", [
    lambda: TumblingEventTimeWindows(1000, offset=1000),
    lambda: SlidingEventTimeWindows(3000, 1000, offset=-1000),
    lambda: SlidingEventTimeWindows(0, 1000),
    lambda: EventTimeSessionWindows.with_gap(0),
])
def test_assigner_parameters_are_checked(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        make()


def test_processing_time_windows_need_the_processing_time() -> None:
    class Unknown:
        current_processing_time = MIN_WATERMARK

    with pytest.raises(ValueError, match="need the processing time"):
        TumblingProcessingTimeWindows(1000).assign_windows(None, 5, Unknown())


def test_event_time_windows_need_a_timestamp() -> None:
    with pytest.raises(ValueError, match="without a timestamp"):
        TumblingEventTimeWindows(1000).assign_windows(None, None, _NoClock())


def test_time_window_intersects_cover_and_max_timestamp() -> None:
    assert W(0, 2).intersects(W(2, 4)) and not W(0, 2).intersects(W(3, 4))
    assert W(0, 2).cover(W(5, 7)) == W(0, 7)
    assert W(0, 2).max_timestamp() == 1 and GlobalWindow().max_timestamp() == LONG_MAX


class _NoClock:
    current_processing_time = 0
