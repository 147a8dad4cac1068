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
    from flinkish_source.kafka import OffsetRange
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


def test_when_the_budget_binds_the_partitions_are_levelled_in_event_time() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 3_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 1): 10}
    paces = {(T, 0): 10.0, (T, 1): 100.0}  # event-time ms per offset
    decision = decide(state, offsets, {(T, 0): 1_000, (T, 1): 1_000}, DRIFT, paces.get,
                      even_share(300))
    # the highest common level 300 records reach: 3_919 (partition 0: 291 records to 3_910,
    # partition 1: 9 records to 3_900), not 150 records each (partition 1 to 18_000)
    assert decision.held == frozenset() and decision.limits == {(T, 0): 291, (T, 1): 9}


def test_a_partition_above_the_level_the_budget_reaches_is_held_for_the_batch() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 8_000, "ACTIVE"))  # 1 is within the drift
    offsets = {(T, 0): 10, (T, 1): 10}
    paces = {(T, 0): 10.0, (T, 1): 100.0}
    decision = decide(state, offsets, {(T, 0): 1_000, (T, 1): 1_000}, DRIFT, paces.get,
                      even_share(200))
    assert decision.held == {(T, 1)}  # 200 records raise partition 0 to 3_000 only
    assert decision.limits == {(T, 0): 200, (T, 1): 0}


def test_when_the_budget_does_not_bind_each_reads_up_to_the_drift_past_the_first_to_run_out(
) -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 3_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 1): 10}
    paces = {(T, 0): 10.0, (T, 1): 100.0}
    decision = decide(state, offsets, {(T, 0): 60, (T, 1): 1_010}, DRIFT, paces.get,
                      even_share(10_000))
    # partition 0 reads its last 50 records, to 1_500: partition 1 may reach 11_500
    assert decision.limits == {(T, 1): 85}


def test_the_slowest_partition_always_reads_and_the_budget_still_holds() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 1_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 1): 10}
    paces = {(T, 0): 1_000_000.0, (T, 1): 1.0}  # one record of 0 covers 1,000 s
    decision = decide(state, offsets, {(T, 0): 1_000, (T, 1): 1_000}, DRIFT, paces.get,
                      even_share(100))
    assert decision.limits == {(T, 0): 1, (T, 1): 99}


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


def test_a_lone_slowest_partition_reads_even_when_the_others_took_the_budget() -> None:
    state = valve((0, 1_000, "ACTIVE"))
    offsets = {(T, 0): 10, (T, 5): 0}  # 5 is not announced yet: it keeps its share
    decision = decide(state, offsets, {(T, 0): 1_000, (T, 5): 1_000}, DRIFT, {(T, 0): 10.0}.get,
                      lambda lags: {(T, 0): 0, (T, 5): 100})
    assert decision.limits == {(T, 0): 1, (T, 5): 100}


def test_the_level_stays_within_the_drift_of_the_held_partitions() -> None:
    state = valve((0, 1_000, "ACTIVE"), (1, 30_000, "ACTIVE"))  # 1 is held
    offsets = {(T, 0): 10, (T, 1): 10}
    paces = {(T, 0): 10.0, (T, 1): 100.0}
    decision = decide(state, offsets, {(T, 0): 10_000, (T, 1): 10_000}, DRIFT, paces.get,
                      even_share(8_000))
    # 4,000 records would raise partition 0 to 41_000: it stops at 30_000 + DRIFT
    assert decision.held == {(T, 1)}
    assert decision.limits == {(T, 0): 3_900, (T, 1): 0}
