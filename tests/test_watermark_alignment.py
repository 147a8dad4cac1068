"""Watermark alignment decisions (flinkish_source.watermark_alignment) on valve states built by
the real valve over epochs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flinkish_core.epoch_valve import EpochWatermark, advance, initial
from flinkish_core.markers import Marker
from flinkish_source.watermark_alignment import decide

T = "t"
DRIFT = 10_000


def valve(*partitions: tuple[int, int | None, str]) -> EpochWatermark:
    """The valve after one epoch in which each (partition, watermark, status) was reported."""
    markers = []
    for p, wm, status in partitions:
        markers.append(Marker(T, p, 0, "status", status="ACTIVE"))
        if wm is not None:
            markers.append(Marker(T, p, 1, "watermark", watermark=wm))
        if status == "IDLE":
            markers.append(Marker(T, p, 1, "status", status="IDLE"))
    return advance(initial(), 0, markers)


def test_a_partition_far_ahead_of_one_with_a_backlog_is_held() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 600_000, "ACTIVE"), (2, 5_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 1): 10, (T, 2): 10}
    decision = decide(state, offsets, {(T, 0): 100, (T, 1): 100, (T, 2): 100}, DRIFT)
    assert decision.reference == 1_000
    assert decision.held == {(T, 1)}  # 5_000 is within the drift


def test_a_partition_with_nothing_left_to_read_holds_nothing_back() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 600_000, "ACTIVE"))
    offsets = {(T, 0): 100, (T, 1): 10}
    decision = decide(state, offsets, {(T, 0): 100, (T, 1): 100}, DRIFT)
    assert decision.held == frozenset() and decision.reference == 600_000


def test_an_idle_partition_holds_nothing_back() -> None:
    state = valve((0, 1_000, "IDLE"), (1, 600_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 1): 10}
    assert decide(state, offsets, {(T, 0): 100, (T, 1): 100}, DRIFT).held == frozenset()


def test_no_backlog_anywhere_or_no_valve_yet_holds_nothing() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 600_000, "ACTIVE"))
    offsets = {(T, 0): 100, (T, 1): 100}
    assert decide(state, offsets, {(T, 0): 100, (T, 1): 100}, DRIFT).held == frozenset()
    assert decide(initial(), offsets, {(T, 0): 200, (T, 1): 200}, DRIFT).held == frozenset()


def test_a_partition_without_a_watermark_yet_holds_the_others_for_a_batch() -> None:
    state = valve((0, None, "ACTIVE"), (1, 600_000, "ACTIVE"))
    offsets = {(T, 0): 0, (T, 1): 10}
    decision = decide(state, offsets, {(T, 0): 100, (T, 1): 100}, DRIFT)
    assert decision.held == {(T, 1)}


def test_partitions_not_yet_announced_are_neither_held_nor_a_reference() -> None:
    state = valve((0, 1_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 5): 0}
    assert decide(state, offsets, {(T, 0): 100, (T, 5): 100}, DRIFT).held == frozenset()


def test_the_planner_gives_a_held_partition_nothing_and_its_budget_to_the_others() -> None:
    from flinkish_source.kafka_client import OffsetRange
    from flinkish_source.offset_planner import OffsetPlanner, from_json, to_json
    from flinkish_source.options import parse_options

    planner = OffsetPlanner(parse_options({
        "kafka.bootstrap.servers": "b:1", "subscribe": T, "startingOffsets": "earliest",
        "checkpointing.location": "/unused", "idleTimeout": "1 s",
    }))
    tps = [(T, 0), (T, 1)]
    ranges = {tp: OffsetRange(0, 100) for tp in tps}
    start = planner.initial(tps, ranges, 0)
    seen: list[tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]] = []

    def hold(offsets: object, available: object, share: object) -> dict[tuple[str, int], int]:
        seen.append((dict(offsets), dict(available)))  # type: ignore[call-overload]
        return {(T, 1): 0}

    end = planner.latest(start, tps, ranges, 10_000, limit=40, load_state=lambda tp, at, b: b,
                         hold=hold)
    assert seen == [({(T, 0): 0, (T, 1): 0}, {(T, 0): 100, (T, 1): 100})]
    assert (end[(T, 0)].offset, end[(T, 1)].offset) == (40, 0)
    assert end[(T, 1)].held and not end[(T, 0)].held
    assert end[(T, 1)].status == "ACTIVE"  # held with a backlog: never idle
    assert to_json(end)["topics"][T]["1"]["held"] is True
    assert from_json(to_json(end)) == end
    again = planner.latest(end, tps, ranges, 20_000, limit=40, load_state=lambda tp, at, b: b)
    assert not again[(T, 1)].held and again[(T, 1)].offset > 0

    shared: list[dict[tuple[str, int], int]] = []

    def cap(offsets: object, available: object, share: Any) -> dict[tuple[str, int], int]:
        shared.append(dict(share({(T, 0): 100, (T, 1): 100})))
        return {(T, 1): 5}

    capped = planner.latest(start, tps, ranges, 10_000, limit=40,
                            load_state=lambda tp, at, b: b, hold=cap)
    assert shared == [{(T, 0): 20, (T, 1): 20}]  # the planner's own share of the budget
    # the budget is shared by what each may read: 100 and 5 of 105
    assert (capped[(T, 0)].offset, capped[(T, 1)].offset) == (38, 2)
    assert capped[(T, 1)].capped and not capped[(T, 1)].held and not capped[(T, 0)].capped
    assert to_json(capped)["topics"][T]["1"]["capped"] is True
    assert from_json(to_json(capped)) == capped


def even_share(limit: int) -> Callable[[Mapping[tuple[str, int], int]], dict[tuple[str, int], int]]:
    """The batch's budget shared equally (enough for these tests)."""
    def share(lags: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        return {tp: min(lag, limit // len(lags)) for tp, lag in lags.items()}
    return share


def test_a_partition_within_the_drift_reads_only_as_far_as_the_drift_allows() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 8_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 1): 10}
    paces = {(T, 0): 10.0, (T, 1): 100.0}  # event-time ms per offset
    decision = decide(state, offsets, {(T, 0): 1_000, (T, 1): 1_000}, DRIFT, paces.get,
                      even_share(200))
    # partition 0 is expected at 1_000 + 100 * 10 after the batch: partition 1 may reach
    # 2_000 + DRIFT = 12_000, i.e. (12_000 - 8_000) / 100 = 40 records
    assert decision.held == frozenset() and decision.limits == {(T, 1): 40}


def test_the_partition_expected_slowest_after_the_batch_is_never_limited() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 5_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 1): 10}
    paces = {(T, 0): 1_000.0, (T, 1): 1.0}  # partition 0 is behind but covers time fast
    decision = decide(state, offsets, {(T, 0): 1_000, (T, 1): 1_000}, DRIFT, paces.get,
                      even_share(200))
    # partition 1 is expected at 5_100: partition 0 may reach 15_100, (15_100 - 1_000) / 1_000
    assert decision.limits == {(T, 0): 14}


def test_without_a_known_pace_a_partition_is_not_limited_and_does_not_move_the_reference(
) -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 8_000, "ACTIVE"), (2, 9_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 1): 10, (T, 2): 10}
    available = {tp: 1_000 for tp in offsets}
    paces = {(T, 1): 100.0, (T, 2): 0.0}  # 0: its records all share one event time
    decision = decide(state, offsets, available, DRIFT, paces.get, even_share(300))
    # partition 0 (no pace) is assumed not to move: partition 1 may reach 11_000
    assert decision.limits == {(T, 1): 30}


def test_a_partition_with_no_room_left_is_held() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 10_990, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 1): 10}
    paces = {(T, 0): None, (T, 1): 100.0}
    decision = decide(state, offsets, {(T, 0): 1_000, (T, 1): 1_000}, DRIFT, paces.get,
                      even_share(200))
    assert decision.held == {(T, 1)} and decision.limits == {(T, 1): 0}


def test_pace_is_read_from_the_last_slice_the_read_task_recorded(tmp_path: object) -> None:
    from flinkish_source.source_state import SliceOutcome, SourceStateStore
    from flinkish_source.watermark_alignment import pace_at
    from flinkish_source.watermark_strategy import GeneratorState

    store = SourceStateStore(str(tmp_path))
    assert pace_at(store, (T, 0), 100) is None  # nothing recorded
    store.save_task([
        (T, 0, GeneratorState(100, 50_000, 48_999), SliceOutcome(60, "ACTIVE", "ACTIVE", (),
                                                                 30_000)),
        (T, 1, GeneratorState(100, 50_000, 48_999), SliceOutcome(60, "ACTIVE", "ACTIVE", ())),
        (T, 2, GeneratorState(100, 50_000, 48_999), SliceOutcome(60, "ACTIVE", "ACTIVE", (),
                                                                 50_000)),
    ])
    store.new_round()  # the driver looks again at each planning
    assert pace_at(store, (T, 0), 100) == 500.0  # 20 s over 40 offsets
    assert pace_at(store, (T, 1), 100) is None  # recorded without its earliest event time
    assert pace_at(store, (T, 2), 100) is None  # no event time elapsed
