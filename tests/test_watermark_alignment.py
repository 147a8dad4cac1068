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
