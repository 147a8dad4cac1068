"""Watermark alignment decisions (flinkish_source.watermark_alignment) on valve states built by
the real valve over epochs."""

from __future__ import annotations

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

    def hold(offsets: object, available: object) -> frozenset[tuple[str, int]]:
        seen.append((dict(offsets), dict(available)))  # type: ignore[call-overload]
        return frozenset({(T, 1)})

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
