"""Tests for flinkish_source.offset_planner: initial positions, admission control, AvailableNow,
partition discovery and loss, Flink-style idleness, generator-state hand-over, and slices."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flinkish_source.kafka import DataLossError, OffsetRange, TopicPartitionKey
from flinkish_source.offset_planner import (
    ACTIVE,
    FORMAT_VERSION,
    IDLE,
    OffsetPlanner,
    PartitionPosition,
    Positions,
    from_json,
    to_json,
)
from flinkish_source.options import EARLIEST, LATEST, OptionError, SourceOptions, parse_options
from flinkish_source.partition_reader import SlicePlan
from flinkish_source.watermark_strategy import GeneratorState

T0: TopicPartitionKey = ("t", 0)
T1: TopicPartitionKey = ("t", 1)
T2: TopicPartitionKey = ("t", 2)
U0: TopicPartitionKey = ("u", 0)

BASE = {"kafka.bootstrap.servers": "b:1", "subscribe": "t", "checkpointing.location": "/s"}


def opts(**extra: str) -> SourceOptions:
    raw = dict(BASE)
    for key, value in extra.items():
        raw.pop(key, None)
        raw[key] = value
    return parse_options(raw)


def planner(**extra: str) -> OffsetPlanner:
    return OffsetPlanner(opts(**extra))


def pos(
    offset: int,
    *,
    first: int | None = None,
    status: str | None = ACTIVE,
    progress_at: int = 0,
    seen: int | None = None,
    base: GeneratorState | None | str = "same",
    stop: int | None = None,
) -> PartitionPosition:
    """A journaled position; by default ACTIVE, caught up (seen = offset), base at offset."""
    return PartitionPosition(
        offset=offset,
        first=offset if first is None else first,
        status=status,
        progress_at=progress_at,
        seen=offset if seen is None else seen,
        base=GeneratorState(offset) if base == "same" else base,  # type: ignore[arg-type]
        stop=stop,
    )


def no_loader(tp: TopicPartitionKey, at: int, base: GeneratorState) -> GeneratorState:
    raise AssertionError(f"state loader must not be called ({tp}, {at}, {base})")


def same_json(a: Positions, b: Positions) -> bool:
    """Equal as the JSON text Spark journals and compares (key order included)."""
    return json.dumps(to_json(a)) == json.dumps(to_json(b))


# ---------------------------------------------------------------- initial positions


def test_initial_earliest() -> None:
    p = planner(startingOffsets="earliest")
    ranges = {T0: OffsetRange(3, 10), T1: OffsetRange(0, 0)}
    assert p.initial([T0, T1], ranges, 1_000) == {
        T0: PartitionPosition(3, 3, None, 1_000, 10, GeneratorState(3), None),
        T1: PartitionPosition(0, 0, None, 1_000, 0, GeneratorState(0), None),
    }


def test_initial_latest_is_the_default() -> None:
    p = planner()
    ranges = {T0: OffsetRange(3, 10), T1: OffsetRange(0, 4)}
    assert p.initial([T0, T1], ranges, 7) == {
        T0: PartitionPosition(10, 10, None, 7, 10, GeneratorState(10), None),
        T1: PartitionPosition(4, 4, None, 7, 4, GeneratorState(4), None),
    }


def test_initial_no_state_without_markers() -> None:
    p = planner(includeMarkers="false")
    assert p.initial([T0], {T0: OffsetRange(0, 5)}, 0)[T0].base is None
    p = planner(**{"watermark.strategy": "none"})
    assert p.initial([T0], {T0: OffsetRange(0, 5)}, 0)[T0].base is None


def test_initial_specific_offsets() -> None:
    p = planner(startingOffsets='{"t":{"0":5,"1":-1}}')
    ranges = {T0: OffsetRange(2, 10), T1: OffsetRange(0, 8)}
    positions = p.initial([T0, T1], ranges, 0)
    assert (positions[T0].offset, positions[T0].first, positions[T0].seen) == (5, 5, 10)
    assert (positions[T1].offset, positions[T1].first) == (8, 8)
    assert positions[T0].base == GeneratorState(5)


def test_initial_specific_earliest_marker() -> None:
    # built directly: parse_options wrongly rejects -2 (see test_source_options)
    base = opts()
    options = dataclasses.replace(base, offsets=dataclasses.replace(
        base.offsets, starting={"t": {0: EARLIEST, 1: LATEST}}))
    positions = OffsetPlanner(options).initial(
        [T0, T1], {T0: OffsetRange(2, 10), T1: OffsetRange(1, 8)}, 0
    )
    assert positions[T0].offset == 2
    assert positions[T1].offset == 8


def test_initial_specific_missing_partition() -> None:
    p = planner(startingOffsets='{"t":{"0":5}}')
    with pytest.raises(OptionError) as info:
        p.initial([T0, T1], {T0: OffsetRange(0, 10), T1: OffsetRange(0, 10)}, 0)
    assert str(info.value) == (
        "option startingOffsets must name every partition of the query exactly: missing [('t', 1)]"
    )


def test_initial_specific_unknown_partition() -> None:
    p = planner(startingOffsets='{"t":{"0":5,"7":1}}')
    with pytest.raises(OptionError) as info:
        p.initial([T0], {T0: OffsetRange(0, 10)}, 0)
    assert str(info.value) == (
        "option startingOffsets must name every partition of the query exactly: "
        "not in the query or not in Kafka: [('t', 7)]"
    )


def test_initial_specific_missing_and_unknown() -> None:
    p = planner(endingOffsets='{"t":{"9":5}}', startingOffsets="earliest")
    with pytest.raises(OptionError) as info:
        p.initial([T0], {T0: OffsetRange(0, 10)}, 0)
    assert str(info.value) == (
        "option endingOffsets must name every partition of the query exactly: "
        "missing [('t', 0)]; not in the query or not in Kafka: [('t', 9)]"
    )


def test_initial_offset_below_earliest_is_data_loss() -> None:
    p = planner(startingOffsets='{"t":{"0":1}}')
    with pytest.raises(DataLossError) as info:
        p.initial([T0], {T0: OffsetRange(4, 10)}, 0)
    message = str(info.value)
    assert message.startswith("startingOffsets for t/0 is 1 but the partition starts at 4")
    assert "failOnDataLoss=false" in message


def test_initial_offset_below_earliest_clamped_without_fail_on_data_loss() -> None:
    p = planner(startingOffsets='{"t":{"0":1}}', failOnDataLoss="false")
    assert p.initial([T0], {T0: OffsetRange(4, 10)}, 0) == {
        T0: PartitionPosition(4, 4, None, 0, 10, GeneratorState(4), None)
    }


def test_initial_ending_latest() -> None:
    p = planner(startingOffsets="earliest", endingOffsets="latest")
    positions = p.initial([T0, T1], {T0: OffsetRange(0, 10), T1: OffsetRange(2, 2)}, 0)
    assert positions[T0].stop == 10
    assert positions[T1].stop == 2


def test_initial_ending_json() -> None:
    p = planner(startingOffsets='{"t":{"0":5,"1":5}}', endingOffsets='{"t":{"0":7,"1":-1}}')
    positions = p.initial([T0, T1], {T0: OffsetRange(0, 10), T1: OffsetRange(0, 9)}, 0)
    assert positions[T0].stop == 7
    assert positions[T1].stop == 9


def test_initial_ending_below_start_is_start() -> None:
    p = planner(startingOffsets='{"t":{"0":5}}', endingOffsets='{"t":{"0":3}}')
    assert p.initial([T0], {T0: OffsetRange(0, 10)}, 0)[T0].stop == 5


# ---------------------------------------------------------------- JSON


def test_json_layout_and_round_trip() -> None:
    positions = {
        T1: PartitionPosition(9, 2, IDLE, 500, 9, GeneratorState(4, 100, 99, 1), 20),
        T0: PartitionPosition(3, 3, None, 7, 5, None, None),
        U0: PartitionPosition(0, 0, ACTIVE, 1, 0, GeneratorState(0), None),
    }
    data = to_json(positions)
    assert data == {
        "version": FORMAT_VERSION,
        "topics": {
            "t": {
                "0": {"offset": 3, "first": 3, "progressAt": 7, "seen": 5},
                "1": {
                    "offset": 9,
                    "first": 2,
                    "progressAt": 500,
                    "seen": 9,
                    "status": "IDLE",
                    "base": {"at": 4, "maxTs": 100, "wm": 99, "errors": 1},
                    "stop": 20,
                },
            },
            "u": {
                "0": {
                    "offset": 0,
                    "first": 0,
                    "progressAt": 1,
                    "seen": 0,
                    "status": "ACTIVE",
                    "base": {
                        "at": 0,
                        "maxTs": -9223372036854775808,
                        "wm": -9223372036854775808,
                        "errors": 0,
                    },
                },
            },
        },
    }
    assert from_json(json.loads(json.dumps(data))) == positions
    assert list(data["topics"]["t"]) == ["0", "1"]  # sorted, so equal offsets are equal JSON


@pytest.mark.parametrize("data", [{}, {"version": 2, "topics": {}}, {"version": 1, "topics": []}])
def test_from_json_rejects_other_formats(data: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="not a flinkish source offset"):
        from_json(data)


# ---------------------------------------------------------------- latest(): basics


def test_first_batch_announces_and_admits_everything() -> None:
    p = planner(startingOffsets="earliest")
    ranges = {T0: OffsetRange(0, 10), T1: OffsetRange(0, 0)}
    start = p.initial([T0, T1], ranges, 100)
    end = p.latest(start, [T0, T1], ranges, 200, load_state=no_loader)
    assert end == {
        T0: PartitionPosition(10, 0, ACTIVE, 100, 10, GeneratorState(0), None),
        T1: PartitionPosition(0, 0, ACTIVE, 100, 0, GeneratorState(0), None),
    }
    assert OffsetPlanner.slices(start, end) == [
        SlicePlan("t", 0, 0, 10, None, ACTIVE, GeneratorState(0), None),
        SlicePlan("t", 1, 0, 0, None, ACTIVE, GeneratorState(0), None),
    ]


def test_the_first_batch_reads_from_where_its_planning_started() -> None:
    """Spark asks initialOffset again when it runs the first batch (and after a restart); under
    startingOffsets=latest that start has moved on, yet the batch reads what it was planned
    to: from the ``first`` offsets its end offset journals."""
    p = planner()
    planned_from = p.initial([T0, T1], {T0: OffsetRange(0, 10), T1: OffsetRange(0, 4)}, 100)
    ranges = {T0: OffsetRange(0, 15), T1: OffsetRange(0, 6)}
    end = p.latest(planned_from, [T0, T1], ranges, 200, load_state=no_loader)
    asked_again = p.initial([T0, T1], {T0: OffsetRange(0, 20), T1: OffsetRange(0, 9)}, 300)
    expected = [
        SlicePlan("t", 0, 10, 15, None, ACTIVE, GeneratorState(10), None),
        SlicePlan("t", 1, 4, 6, None, ACTIVE, GeneratorState(4), None),
    ]
    assert OffsetPlanner.slices(planned_from, end) == expected
    assert OffsetPlanner.slices(asked_again, end) == expected
    assert OffsetPlanner.slices(from_json(json.loads(json.dumps(to_json(asked_again)))),
                                from_json(json.loads(json.dumps(to_json(end))))) == expected


def test_new_records_advance_progress() -> None:
    p = planner()
    start = {T0: pos(10, progress_at=5)}
    end = p.latest(start, [T0], {T0: OffsetRange(0, 15)}, 900, load_state=no_loader)
    assert end == {T0: PartitionPosition(15, 10, ACTIVE, 900, 15, GeneratorState(10), None)}


def test_nothing_happened_means_end_equals_start() -> None:
    p = planner(idleTimeout="10 s")
    start = {
        T0: pos(10, progress_at=1_000),
        T1: pos(4, status=IDLE, progress_at=0),
        T2: pos(7, stop=7),
    }
    ranges = {T0: OffsetRange(0, 10), T1: OffsetRange(0, 4), T2: OffsetRange(0, 9)}
    end = p.latest(start, [T0, T1, T2], ranges, 5_000, load_state=no_loader)
    assert same_json(end, start)
    assert OffsetPlanner.slices(start, end) == []


def test_missing_loader_when_state_is_needed() -> None:
    p = planner()
    start = {T0: pos(10, base=GeneratorState(4))}
    with pytest.raises(RuntimeError, match="no loader was given"):
        p.latest(start, [T0], {T0: OffsetRange(0, 12)}, 0)


def test_state_loader_called_only_when_base_is_behind() -> None:
    p = planner()
    calls: list[tuple[TopicPartitionKey, int, GeneratorState]] = []
    loaded = GeneratorState(10, 5_000, 4_999, 0)

    def loader(tp: TopicPartitionKey, at: int, base: GeneratorState) -> GeneratorState:
        calls.append((tp, at, base))
        return loaded

    start = {T0: pos(10, base=GeneratorState(4, 100, 99)), T1: pos(3)}
    ranges = {T0: OffsetRange(0, 12), T1: OffsetRange(0, 6)}
    end = p.latest(start, [T0, T1], ranges, 50, load_state=loader)
    assert calls == [(T0, 10, GeneratorState(4, 100, 99))]
    assert end[T0].base == loaded
    assert end[T0].offset == 12
    assert end[T1].base == GeneratorState(3)
    plans = OffsetPlanner.slices(start, end)
    assert plans == [
        SlicePlan("t", 0, 10, 12, ACTIVE, ACTIVE, loaded, None),
        SlicePlan("t", 1, 3, 6, ACTIVE, ACTIVE, GeneratorState(3), None),
    ]


def test_quiet_partition_keeps_its_base_until_it_has_a_slice() -> None:
    """After a batch that read records, nothing changes while the partition stays quiet (no
    empty batch just to journal the state); its next slice loads the state at its start."""
    p = planner()
    start = {T0: pos(10, base=GeneratorState(4))}
    quiet = p.latest(start, [T0], {T0: OffsetRange(0, 10)}, 0, load_state=no_loader)
    assert same_json(quiet, start)
    assert OffsetPlanner.slices(start, quiet) == []
    loaded = GeneratorState(10, 77, 76)
    end = p.latest(start, [T0], {T0: OffsetRange(0, 13)}, 5,
                   load_state=lambda tp, at, base: loaded if at == 10 else base)
    assert end[T0].base == loaded and end[T0].offset == 13
    assert OffsetPlanner.slices(start, end) == [
        SlicePlan("t", 0, 10, 13, ACTIVE, ACTIVE, loaded, None)
    ]


def test_no_state_no_loader_needed() -> None:
    p = planner(includeMarkers="false")
    start = {T0: pos(10, base=None)}
    end = p.latest(start, [T0], {T0: OffsetRange(0, 20)}, 0)
    assert end[T0].offset == 20
    assert end[T0].base is None


# ---------------------------------------------------------------- admission control


def test_limit_shared_in_proportion_to_backlog() -> None:
    p = planner()
    start = {T0: pos(0), T1: pos(100), T2: pos(50)}
    ranges = {T0: OffsetRange(0, 100), T1: OffsetRange(0, 400), T2: OffsetRange(0, 50)}
    end = p.latest(start, [T0, T1, T2], ranges, 0, limit=100, load_state=no_loader)
    assert (end[T0].offset, end[T1].offset, end[T2].offset) == (25, 175, 50)


def test_limit_remainder_goes_to_largest_fraction() -> None:
    p = planner()
    start = {T0: pos(0), T1: pos(0), T2: pos(0)}
    ranges = {T0: OffsetRange(0, 1), T1: OffsetRange(0, 1000), T2: OffsetRange(0, 1)}
    end = p.latest(start, [T0, T1, T2], ranges, 0, limit=10, load_state=no_loader)
    assert (end[T0].offset, end[T1].offset, end[T2].offset) == (0, 10, 0)
    # equal shares: remainder goes to the first partition in order
    ranges = {T0: OffsetRange(0, 10), T1: OffsetRange(0, 10), T2: OffsetRange(0, 10)}
    end = p.latest(start, [T0, T1, T2], ranges, 0, limit=5, load_state=no_loader)
    assert (end[T0].offset, end[T1].offset, end[T2].offset) == (2, 2, 1)


def test_limit_not_reached_admits_everything() -> None:
    p = planner()
    start = {T0: pos(0), T1: pos(0)}
    ranges = {T0: OffsetRange(0, 3), T1: OffsetRange(0, 4)}
    end = p.latest(start, [T0, T1], ranges, 0, limit=7, load_state=no_loader)
    assert (end[T0].offset, end[T1].offset) == (3, 4)


@given(
    backlog=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=8),
    offsets=st.lists(st.integers(min_value=0, max_value=10**12), min_size=8, max_size=8),
    limit=st.integers(min_value=1, max_value=50_000),
)
@settings(max_examples=300, deadline=None)
def test_limit_property(backlog: list[int], offsets: list[int], limit: int) -> None:
    p = OffsetPlanner(opts())
    tps = [("t", i) for i in range(len(backlog))]
    start = {tp: pos(offsets[i]) for i, tp in enumerate(tps)}
    ranges = {tp: OffsetRange(0, offsets[i] + backlog[i]) for i, tp in enumerate(tps)}
    end = p.latest(start, tps, ranges, 0, limit=limit, load_state=no_loader)
    admitted = [end[tp].offset - start[tp].offset for tp in tps]
    total = sum(backlog)
    assert sum(admitted) <= limit
    assert sum(admitted) == min(limit, total)
    for got, lag in zip(admitted, backlog, strict=True):
        assert 0 <= got <= lag
        # proportional: within one record of the exact share
        if total > limit:
            assert abs(got - lag * limit / total) < 1
    if total <= limit:
        assert admitted == backlog


# ---------------------------------------------------------------- AvailableNow, stops


def test_available_now_target_caps() -> None:
    p = planner()
    start = {T0: pos(0), T1: pos(0), T2: pos(0)}
    ranges = {T0: OffsetRange(0, 100), T1: OffsetRange(0, 100), T2: OffsetRange(0, 100)}
    target = {T0: 40, T1: 500}  # T2 appeared after the target was taken: nothing for it
    end = p.latest(start, [T0, T1, T2], ranges, 0, target=target, load_state=no_loader)
    assert (end[T0].offset, end[T1].offset, end[T2].offset) == (40, 100, 0)


def test_available_now_target_with_limit() -> None:
    p = planner()
    start = {T0: pos(0), T1: pos(0)}
    ranges = {T0: OffsetRange(0, 100), T1: OffsetRange(0, 100)}
    end = p.latest(
        start, [T0, T1], ranges, 0, limit=30, target={T0: 20, T1: 100}, load_state=no_loader
    )
    assert (end[T0].offset, end[T1].offset) == (5, 25)


def test_ending_offsets_stop() -> None:
    p = planner()
    start = {T0: pos(0, stop=50), T1: pos(50, stop=50)}
    ranges = {T0: OffsetRange(0, 80), T1: OffsetRange(0, 80)}
    end = p.latest(start, [T0, T1], ranges, 0, load_state=no_loader)
    assert (end[T0].offset, end[T1].offset) == (50, 50)
    assert end[T0].stop == 50


# ---------------------------------------------------------------- discovery and loss


def test_new_partition_starts_at_earliest() -> None:
    p = planner(startingOffsets="latest")
    start = {T0: pos(10)}
    ranges = {T0: OffsetRange(0, 10), T1: OffsetRange(3, 8)}
    end = p.latest(start, [T0, T1], ranges, 60, load_state=no_loader)
    assert end[T1] == PartitionPosition(8, 3, ACTIVE, 60, 8, GeneratorState(3), None)
    assert end[T0] == start[T0]
    assert OffsetPlanner.slices(start, end) == [
        SlicePlan("t", 1, 3, 8, None, ACTIVE, GeneratorState(3), None)
    ]


def test_new_partition_with_ending_offsets_stops_at_its_latest() -> None:
    p = planner(endingOffsets="latest", startingOffsets="earliest")
    start = {T0: pos(10, stop=10)}
    ranges = {T0: OffsetRange(0, 10), T1: OffsetRange(0, 4)}
    end = p.latest(start, [T0, T1], ranges, 0, load_state=no_loader)
    assert end[T1].stop == 4
    assert end[T1].offset == 4


def test_new_partition_respects_limit() -> None:
    p = planner()
    start = {T0: pos(0)}
    ranges = {T0: OffsetRange(0, 30), T1: OffsetRange(0, 10)}
    end = p.latest(start, [T0, T1], ranges, 0, limit=8, load_state=no_loader)
    assert (end[T0].offset, end[T1].offset) == (6, 2)
    assert end[T1].first == 0


def test_assign_does_not_pick_up_new_partitions() -> None:
    p = planner(subscribe="", assign='{"t":[0,1]}')
    start = {T0: pos(10)}
    ranges = {T0: OffsetRange(0, 12), T1: OffsetRange(0, 8)}
    end = p.latest(start, [T0, T1], ranges, 0, load_state=no_loader)
    assert set(end) == {T0}
    assert end[T0].offset == 12


def test_vanished_partition_is_data_loss() -> None:
    p = planner()
    start = {T0: pos(10), T1: pos(5)}
    with pytest.raises(DataLossError) as info:
        p.latest(start, [T0], {T0: OffsetRange(0, 10)}, 0, load_state=no_loader)
    message = str(info.value)
    assert message.startswith("partitions [('t', 1)] disappeared from Kafka")
    assert "failOnDataLoss=false" in message


def test_vanished_partition_dropped_without_fail_on_data_loss() -> None:
    p = planner(failOnDataLoss="false")
    start = {T0: pos(10), T1: pos(5)}
    end = p.latest(start, [T0], {T0: OffsetRange(0, 12)}, 0, load_state=no_loader)
    assert set(end) == {T0}
    assert OffsetPlanner.slices(start, end) == [
        SlicePlan("t", 0, 10, 12, ACTIVE, ACTIVE, GeneratorState(10), None)
    ]


# ---------------------------------------------------------------- idleness


def test_idle_after_timeout_without_new_records() -> None:
    p = planner(idleTimeout="1 s")
    ranges = {T0: OffsetRange(0, 10)}
    start = {T0: pos(10, progress_at=0)}
    assert p.latest(start, [T0], ranges, 999, load_state=no_loader) == start
    end = p.latest(start, [T0], ranges, 1_000, load_state=no_loader)
    assert end == {T0: dataclasses.replace(start[T0], status=IDLE)}
    assert OffsetPlanner.slices(start, end) == [
        SlicePlan("t", 0, 10, 10, ACTIVE, IDLE, GeneratorState(10), None)
    ]
    # stays idle, nothing changes
    assert same_json(p.latest(end, [T0], ranges, 50_000, load_state=no_loader), end)


def test_idle_turns_active_when_records_are_admitted() -> None:
    p = planner(idleTimeout="1 s")
    start = {T0: pos(10, status=IDLE, progress_at=0)}
    end = p.latest(start, [T0], {T0: OffsetRange(0, 12)}, 5_000, load_state=no_loader)
    assert end == {T0: PartitionPosition(12, 10, ACTIVE, 5_000, 12, GeneratorState(10), None)}
    assert OffsetPlanner.slices(start, end) == [
        SlicePlan("t", 0, 10, 12, IDLE, ACTIVE, GeneratorState(10), None)
    ]
    # new records again refresh progress: not idle 999 ms later, idle after 1 s
    later = {T0: dataclasses.replace(end[T0], base=GeneratorState(12))}
    ranges = {T0: OffsetRange(0, 12)}
    assert p.latest(later, [T0], ranges, 5_999, load_state=no_loader)[T0].status == ACTIVE
    assert p.latest(later, [T0], ranges, 6_000, load_state=no_loader)[T0].status == IDLE


def test_idle_partition_stays_idle_until_its_records_are_admitted() -> None:
    p = planner(idleTimeout="1 s")
    start = {T0: pos(10, status=IDLE, progress_at=0), T1: pos(0, progress_at=0)}
    ranges = {T0: OffsetRange(0, 11), T1: OffsetRange(0, 1000)}
    end = p.latest(start, [T0, T1], ranges, 9_000, limit=10, load_state=no_loader)
    assert end[T0] == PartitionPosition(10, 10, IDLE, 9_000, 11, GeneratorState(10), None)
    assert end[T1].offset == 10
    assert end[T1].status == ACTIVE


def test_backlog_prevents_idleness() -> None:
    p = planner(idleTimeout="1 s")
    start = {T0: pos(0, seen=100, progress_at=0)}
    end = p.latest(start, [T0], {T0: OffsetRange(0, 100)}, 60_000, limit=10, load_state=no_loader)
    assert end[T0].status == ACTIVE
    assert end[T0].offset == 10
    assert end[T0].progress_at == 0  # nothing new arrived in Kafka
    # the batch that drains the backlog long after the last arrival ends idle
    start = {T0: pos(95, seen=100, progress_at=0)}
    end = p.latest(start, [T0], {T0: OffsetRange(0, 100)}, 60_000, limit=10, load_state=no_loader)
    assert (end[T0].offset, end[T0].status) == (100, IDLE)


def test_no_idleness_without_idle_timeout() -> None:
    p = planner()
    start = {T0: pos(10, progress_at=0)}
    end = p.latest(start, [T0], {T0: OffsetRange(0, 10)}, 10**12, load_state=no_loader)
    assert end == start


def test_finished_bounded_partition_never_idle() -> None:
    p = planner(idleTimeout="1 s")
    start = {T0: pos(10, stop=10, progress_at=0)}
    end = p.latest(start, [T0], {T0: OffsetRange(0, 10)}, 10**9, load_state=no_loader)
    assert end == start


def test_first_batch_of_idle_partition_announces_then_idles() -> None:
    p = planner(idleTimeout="1 s")
    start = p.initial([T0], {T0: OffsetRange(0, 0)}, 0)
    end = p.latest(start, [T0], {T0: OffsetRange(0, 0)}, 1_000, load_state=no_loader)
    assert end[T0].status == IDLE
    assert OffsetPlanner.slices(start, end) == [
        SlicePlan("t", 0, 0, 0, None, IDLE, GeneratorState(0), None)
    ]


def test_announce_without_records() -> None:
    p = planner()
    start = p.initial([T0], {T0: OffsetRange(0, 10)}, 0)
    end = p.latest(start, [T0], {T0: OffsetRange(0, 10)}, 5, load_state=no_loader)
    assert not same_json(start, end)
    assert end[T0].status == ACTIVE
    assert OffsetPlanner.slices(start, end) == [
        SlicePlan("t", 0, 10, 10, None, ACTIVE, GeneratorState(10), None)
    ]
    assert same_json(p.latest(end, [T0], {T0: OffsetRange(0, 10)}, 9, load_state=no_loader), end)


# ---------------------------------------------------------------- slices


def test_slices_only_records_or_status_changes() -> None:
    start = {
        T0: pos(5),
        T1: pos(7),
        T2: pos(3, status=IDLE),
        U0: pos(1, status=IDLE),
    }
    end = {
        T0: pos(9, first=5, base=GeneratorState(5, 10, 9)),  # records
        T1: pos(7),  # nothing
        T2: pos(3, status=ACTIVE),  # status change only
        U0: pos(4, status=ACTIVE, stop=4),  # records and status
    }
    assert OffsetPlanner.slices(start, end) == [
        SlicePlan("t", 0, 5, 9, ACTIVE, ACTIVE, GeneratorState(5, 10, 9), None),
        SlicePlan("t", 2, 3, 3, IDLE, ACTIVE, GeneratorState(3), None),
        SlicePlan("u", 0, 1, 4, IDLE, ACTIVE, GeneratorState(4), 4),
    ]


def test_slices_pure_function_of_journaled_json() -> None:
    p = planner(startingOffsets="earliest", idleTimeout="1 s")
    ranges = {T0: OffsetRange(0, 10), T1: OffsetRange(0, 0)}
    start = p.initial([T0, T1], ranges, 0)
    end = p.latest(start, [T0, T1], ranges, 2_000, load_state=no_loader)
    replayed = OffsetPlanner.slices(
        from_json(json.loads(json.dumps(to_json(start)))),
        from_json(json.loads(json.dumps(to_json(end)))),
    )
    assert replayed == OffsetPlanner.slices(start, end)
    assert replayed == [
        SlicePlan("t", 0, 0, 10, None, IDLE, GeneratorState(0), None),
        SlicePlan("t", 1, 0, 0, None, IDLE, GeneratorState(0), None),
    ]
