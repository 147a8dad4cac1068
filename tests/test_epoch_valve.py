"""Tests for flinkish_core.epoch_valve: the StatusWatermarkValve carried across Spark epochs.

Every expected watermark below is computed by hand from the valve's rules (minimum over the
aligned channels; idle channels do not hold it back; all idle flushes the maximum; a channel
that resumes or joins behind stays unaligned until it catches up; the output never goes back).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from valve_reference import LinearScanValve

from flinkish_core.epoch_valve import EpochWatermark, advance, channel_name, feed_order, initial
from flinkish_core.markers import KIND_STATUS, KIND_WATERMARK, Marker
from flinkish_core.watermark import MAX_WATERMARK, MIN_WATERMARK, WatermarkStatus

MIN = MIN_WATERMARK


def active(partition: int, offset: int, topic: str = "t") -> Marker:
    return Marker(topic, partition, offset, KIND_STATUS, None, "ACTIVE")


def idle(partition: int, offset: int, topic: str = "t") -> Marker:
    return Marker(topic, partition, offset, KIND_STATUS, None, "IDLE")


def wm(partition: int, offset: int, watermark: int, topic: str = "t") -> Marker:
    return Marker(topic, partition, offset, KIND_WATERMARK, watermark, None)


def part(watermark: int, status: str, aligned: bool) -> dict[str, Any]:
    return {"watermark": watermark, "status": status, "aligned": aligned}


def run(epochs: Sequence[Iterable[Marker]]) -> list[EpochWatermark]:
    """advance() over consecutive epochs 0, 1, ... from initial(); every result."""
    results = []
    previous = initial()
    for epoch, markers in enumerate(epochs):
        previous = advance(previous, epoch, markers)
        results.append(previous)
    return results


# ------------------------------------------------------------------------ marker ordering


def test_sort_key_puts_active_then_watermarks_ascending_then_idle_at_one_offset() -> None:
    ordered = [
        idle(0, 3),  # an earlier offset comes first whatever its kind
        active(0, 5),
        wm(0, 5, 100),
        wm(0, 5, 250),
        wm(0, 5, MAX_WATERMARK),
        idle(0, 5),
        active(0, 6),
        wm(1, 0, -5),  # a later partition after every marker of partition 0
        active(1, 1),
        wm(0, 0, 7, topic="u"),  # topics before partitions
    ]
    assert sorted(reversed(ordered), key=Marker.sort_key) == ordered
    shuffled = list(ordered)
    random.Random(3).shuffle(shuffled)
    assert shuffled != ordered
    assert sorted(shuffled, key=Marker.sort_key) == ordered


def test_shuffled_markers_give_the_result_of_ordered_ones() -> None:
    # Partition 2 is announced and goes idle at the same offset: only ACTIVE-then-IDLE leaves it
    # idle. Fed IDLE first, the ACTIVE would re-activate it at MIN and hold everything back.
    ordered = [active(0, 0), wm(0, 10, 1_000), active(1, 0), wm(1, 5, 400),
               active(2, 0), idle(2, 0)]
    expected = advance(initial(), 0, ordered)
    assert expected.watermark == 400
    assert expected.partitions["t/2"] == part(MIN, "IDLE", False)
    assert advance(initial(), 0, reversed(ordered)) == expected
    assert advance(initial(), 0, [idle(2, 0), active(2, 0), *ordered[:4]]) == expected


def test_watermark_and_idle_at_the_offset_where_an_idle_partition_resumes() -> None:
    # Partition 1 is idle after epoch 0. In epoch 1 it resumes, emits 900 and goes idle again,
    # all at offset 30. In the emitted order (ACTIVE, 900, IDLE) the 900 counts; arriving
    # first, IDLE or the watermark would hit an idle channel and be ignored.
    e0 = advance(initial(), 0, [active(0, 0), wm(0, 10, 500), active(1, 0), idle(1, 0)])
    assert (e0.watermark, e0.partitions["t/1"]) == (500, part(MIN, "IDLE", False))
    epoch1 = [idle(1, 30), wm(1, 30, 900), active(1, 30)]
    e1 = advance(e0, 1, epoch1)
    assert e1.partitions["t/1"] == part(900, "IDLE", False)
    assert e1.watermark == 500
    assert advance(e0, 1, [active(1, 30), wm(1, 30, 900), idle(1, 30)]) == e1


marker_lists = st.lists(
    st.one_of(
        st.builds(active, st.integers(0, 2), st.integers(0, 4), st.sampled_from("ab")),
        st.builds(idle, st.integers(0, 2), st.integers(0, 4), st.sampled_from("ab")),
        st.builds(wm, st.integers(0, 2), st.integers(0, 4), st.integers(-50, 50),
                  st.sampled_from("ab")),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(first=marker_lists, second=marker_lists, seed=st.integers(0, 2**32 - 1))
def test_any_permutation_of_an_epochs_markers_gives_the_identical_result(
    first: list[Marker], second: list[Marker], seed: int
) -> None:
    rng = random.Random(seed)
    e0 = advance(initial(), 0, first)
    shuffled0 = rng.sample(first, len(first))
    assert advance(initial(), 0, shuffled0) == e0
    e1 = advance(e0, 1, second)
    shuffled1 = rng.sample(second, len(second))
    assert advance(e0, 1, shuffled1) == e1
    assert advance(advance(initial(), 0, shuffled0), 1, shuffled1) == e1


# ------------------------------------------------------------------------------- advance()


def test_before_any_marker_nothing_is_known() -> None:
    start = initial()
    assert start == EpochWatermark(-1, MIN, "ACTIVE", MIN)
    assert advance(start, 0, []) == EpochWatermark(0, MIN, "ACTIVE", MIN)
    assert advance(start, 0, []).valve is None


def test_first_epoch_creates_a_channel_per_announced_partition_and_an_empty_one_holds_min() -> (
    None
):
    # p0 runs ahead, p1 lags, p2 is announced ACTIVE but has no records (no watermark yet).
    e0 = advance(initial(), 0, [active(0, 0), wm(0, 10, 1_000), active(1, 0), wm(1, 5, 400),
                                active(2, 0)])
    assert e0.epoch == 0
    assert e0.channels == ("t/0", "t/1", "t/2")
    assert e0.watermark == MIN  # p2 at Long.MIN_VALUE holds the combined watermark back
    assert e0.status == "ACTIVE"
    assert e0.previous_watermark == MIN
    assert e0.partitions == {
        "t/0": part(1_000, "ACTIVE", True),
        "t/1": part(400, "ACTIVE", True),
        "t/2": part(MIN, "ACTIVE", True),
    }
    assert e0.idle_partitions == []
    assert e0.valve == {
        "format": 1,
        "last_output_watermark": MIN,
        "last_output_status": "ACTIVE",
        "channels": [[1_000, "ACTIVE", True], [400, "ACTIVE", True], [MIN, "ACTIVE", True]],
    }

    # p2 goes idle: the lagging p1 (now at 700) is the minimum of the rest.
    e1 = advance(e0, 1, [wm(0, 20, 2_000), wm(1, 8, 700), idle(2, 0)])
    assert (e1.watermark, e1.status, e1.previous_watermark) == (700, "ACTIVE", MIN)
    assert e1.partitions == {
        "t/0": part(2_000, "ACTIVE", True),
        "t/1": part(700, "ACTIVE", True),
        "t/2": part(MIN, "IDLE", False),
    }
    assert e1.idle_partitions == ["t/2"]

    # With p2 still idle, p1 goes on holding back p0.
    e2 = advance(e1, 2, [wm(0, 30, 3_000), wm(1, 9, 1_500)])
    assert (e2.watermark, e2.previous_watermark) == (1_500, 700)


def test_partitions_discovered_later_join_behind_and_unaligned() -> None:
    e0 = advance(initial(), 0, [active(0, 0), wm(0, 10, 1_000), active(1, 0), wm(1, 10, 800)])
    assert e0.watermark == 800
    # Two partitions appear in epoch 1, one behind the combined watermark, one ahead of it.
    e1 = advance(e0, 1, [active(3, 0), wm(3, 4, 100), active(2, 0), wm(2, 4, 5_000),
                         wm(0, 20, 1_200), wm(1, 20, 900)])
    assert e1.channels == ("t/0", "t/1", "t/2", "t/3")  # new ones appended, in sorted order
    assert e1.partitions == {
        "t/0": part(1_200, "ACTIVE", True),
        "t/1": part(900, "ACTIVE", True),
        "t/2": part(5_000, "ACTIVE", True),  # caught up at once
        "t/3": part(100, "ACTIVE", False),  # behind: does not drag the watermark back
    }
    assert (e1.watermark, e1.previous_watermark) == (900, 800)
    # p1 moves to 1 100 first (partitions are fed in order), so p3 at 1 000 is still behind.
    e2 = advance(e1, 2, [wm(3, 8, 1_000), wm(1, 30, 1_100), wm(0, 30, 2_000)])
    assert e2.partitions["t/3"] == part(1_000, "ACTIVE", False)
    assert (e2.watermark, e2.previous_watermark) == (1_100, 900)
    # p3 reaches the combined watermark: aligned from then on ...
    e3 = advance(e2, 3, [wm(3, 9, 1_100)])
    assert e3.partitions["t/3"] == part(1_100, "ACTIVE", True)
    assert e3.watermark == 1_100
    # ... and now it is what holds the combined watermark back.
    e4 = advance(e3, 4, [wm(3, 12, 1_300), wm(1, 50, 1_600)])
    assert (e4.watermark, e4.previous_watermark) == (1_300, 1_100)


def test_a_partition_joining_while_everything_is_idle_reactivates_the_combined_status() -> None:
    e0 = advance(initial(), 0, [active(0, 0), wm(0, 5, 300), idle(0, 5)])
    assert (e0.watermark, e0.status) == (300, "IDLE")
    e1 = advance(e0, 1, [active(1, 0), wm(1, 3, 200)])
    assert (e1.watermark, e1.status, e1.previous_watermark) == (300, "ACTIVE", 300)
    assert e1.partitions["t/1"] == part(200, "ACTIVE", False)
    e2 = advance(e1, 2, [wm(1, 9, 650)])
    assert (e2.watermark, e2.status) == (650, "ACTIVE")
    assert e2.partitions["t/1"] == part(650, "ACTIVE", True)


def test_epoch_without_markers_keeps_everything_but_moves_previous_watermark() -> None:
    e0 = advance(initial(), 0, [active(0, 0), wm(0, 5, 300)])
    e1 = advance(e0, 1, [])
    assert (e1.epoch, e1.watermark, e1.previous_watermark) == (1, 300, 300)
    assert (e1.channels, e1.valve, e1.partitions) == (e0.channels, e0.valve, e0.partitions)


def test_json_round_trip_is_exact() -> None:
    e0 = advance(initial(), 0, [active(0, 0), wm(0, 10, 1_000), active(1, 0), idle(1, 0),
                                active(0, 3, topic="u"), wm(0, 4, -7, topic="u")])
    e1 = advance(e0, 1, [active(1, 2), wm(1, 3, 20)])
    for result in (initial(), e0, e1):
        text = json.dumps(result.to_json(), sort_keys=True, allow_nan=False)
        back = EpochWatermark.from_json(json.loads(text))
        assert back == result
        assert json.dumps(back.to_json(), sort_keys=True) == text
    assert e1.to_json() == {
        "epoch": 1,
        "watermark": -7,
        "status": "ACTIVE",
        "previous_watermark": -7,
        "channels": ["t/0", "t/1", "u/0"],
        "valve": {
            "format": 1,
            "last_output_watermark": -7,
            "last_output_status": "ACTIVE",
            "channels": [[1_000, "ACTIVE", True], [20, "ACTIVE", True], [-7, "ACTIVE", True]],
        },
        "partitions": {
            "t/0": part(1_000, "ACTIVE", True),
            "t/1": part(20, "ACTIVE", True),
            "u/0": part(-7, "ACTIVE", True),
        },
    }


def test_replaying_an_epoch_from_the_same_previous_result_is_identical() -> None:
    e0 = advance(initial(), 0, [active(0, 0), wm(0, 10, 1_000), active(1, 0), wm(1, 10, 500)])
    markers = [wm(0, 20, 3_000), wm(1, 15, 700), idle(1, 15), active(2, 0), wm(2, 2, 10)]
    e1 = advance(e0, 1, markers)
    before = e0.to_json()
    for _ in range(3):
        assert advance(e0, 1, markers) == e1
        # ... also from the previous result as the checkpoint stores it (JSON)
        restored = EpochWatermark.from_json(json.loads(json.dumps(e0.to_json())))
        assert advance(restored, 1, markers) == e1
    assert e0.to_json() == before  # advance() does not touch its input
    assert (e1.watermark, e1.previous_watermark) == (3_000, 500)


def test_multi_epoch_skew_idleness_and_resuming_behind() -> None:
    """Three skewed partitions; s/1 goes idle, resumes behind (ignored), then catches up."""

    def m(kind: str, p: int, offset: int, value: Any = None) -> Marker:
        if kind == "wm":
            return wm(p, offset, value, topic="s")
        return active(p, offset, "s") if kind == "active" else idle(p, offset, "s")

    epochs = [
        # 0: min(10 000, 4 000, 7 000)
        [m("active", 0, 0), m("wm", 0, 100, 10_000), m("active", 1, 0), m("wm", 1, 100, 4_000),
         m("active", 2, 0), m("wm", 2, 100, 7_000)],
        # 1: s/1 reaches 5 000 then idles; s/0 12 000 and s/2 9 000 remain
        [m("wm", 0, 200, 12_000), m("wm", 1, 150, 5_000), m("idle", 1, 150),
         m("wm", 2, 200, 9_000)],
        # 2: s/1 resumes at 6 000 < 9 000: unaligned, ignored; min(15 000, 11 000)
        [m("wm", 0, 300, 15_000), m("active", 1, 150), m("wm", 1, 180, 6_000),
         m("wm", 2, 300, 11_000)],
        # 3: s/1 at 13 000 >= 11 000: aligned again; min(16 000, 13 000, 14 000)
        [m("wm", 0, 400, 16_000), m("wm", 1, 250, 13_000), m("wm", 2, 400, 14_000)],
        # 4: only s/1 moves; now it holds the watermark: min(16 000, 13 500, 14 000)
        [m("wm", 1, 260, 13_500)],
        # 5: everything goes idle: the maximum (16 000) is flushed, status IDLE
        [m("idle", 0, 400), m("idle", 1, 260), m("idle", 2, 400)],
        # 6: nothing happens
        [],
        # 7: s/2 resumes behind the flushed 16 000: ACTIVE, but no channel is aligned
        [m("active", 2, 400), m("wm", 2, 420, 15_000)],
        # 8: s/2 catches up
        [m("wm", 2, 450, 17_000)],
    ]
    results = run(epochs)
    assert [r.watermark for r in results] == [
        4_000, 9_000, 11_000, 13_000, 13_500, 16_000, 16_000, 16_000, 17_000
    ]
    assert [r.previous_watermark for r in results] == [
        MIN, 4_000, 9_000, 11_000, 13_000, 13_500, 16_000, 16_000, 16_000
    ]
    assert [r.status for r in results] == ["ACTIVE"] * 5 + ["IDLE", "IDLE", "ACTIVE", "ACTIVE"]
    assert [r.partitions["s/1"] for r in results[:5]] == [
        part(4_000, "ACTIVE", True),
        part(5_000, "IDLE", False),
        part(6_000, "ACTIVE", False),
        part(13_000, "ACTIVE", True),
        part(13_500, "ACTIVE", True),
    ]
    assert results[5].idle_partitions == ["s/0", "s/1", "s/2"]
    assert results[7].partitions["s/2"] == part(15_000, "ACTIVE", False)
    assert results[8].partitions["s/2"] == part(17_000, "ACTIVE", True)
    assert [r.epoch for r in results] == list(range(9))


# --------------------------------------------------------------------- random multi-epoch runs

PARTITIONS = [("a", 0), ("a", 1), ("a", 2), ("b", 0)]


@st.composite
def epoch_runs(draw: st.DrawFn) -> list[list[Marker]]:
    """Several epochs of plausible source output: per partition, positions only move forward;
    statuses and watermarks (not necessarily increasing) at those positions; partitions may
    appear in any epoch."""
    n_epochs = draw(st.integers(1, 6))
    offsets = {tp: 0 for tp in PARTITIONS}
    epochs: list[list[Marker]] = []
    for _ in range(n_epochs):
        markers: list[Marker] = []
        for topic, p in PARTITIONS:
            events = draw(
                st.lists(
                    st.one_of(
                        st.just(("ACTIVE", None)),
                        st.just(("IDLE", None)),
                        st.tuples(st.just("wm"), st.integers(-1_000, 1_000)),
                    ),
                    max_size=4,
                )
            )
            for kind, value in events:
                offsets[(topic, p)] += draw(st.integers(0, 3))
                at = offsets[(topic, p)]
                if kind == "wm" and value is not None:
                    markers.append(wm(p, at, value, topic))
                elif kind == "ACTIVE":
                    markers.append(active(p, at, topic))
                else:
                    markers.append(idle(p, at, topic))
        epochs.append(markers)
    return epochs


class _Null:
    def emit_watermark(self, watermark: int) -> None:
        pass

    def emit_watermark_status(self, status: WatermarkStatus) -> None:
        pass


def continuous_reference(epochs: Sequence[list[Marker]]) -> list[tuple[int, str]]:
    """One linear-scan valve (the reference semantics) fed every epoch's markers in feed order,
    never snapshotted: what advance() must reproduce through its checkpoints."""
    valve: LinearScanValve | None = None
    index: dict[str, int] = {}
    out: list[tuple[int, str]] = []
    for markers in epochs:
        ordered = feed_order(markers)
        new = sorted({channel_name(m.topic, m.partition) for m in ordered} - set(index))
        if valve is None and new:
            valve = LinearScanValve(len(new), _Null())
            index.update({name: i for i, name in enumerate(new)})
        elif valve is not None:
            for name in new:
                index[name] = valve.add_channel()
        for m in ordered:
            if valve is None:
                break
            channel = index[channel_name(m.topic, m.partition)]
            if m.kind == KIND_WATERMARK:
                assert m.watermark is not None
                valve.input_watermark(m.watermark, channel)
            else:
                assert m.status is not None
                valve.input_watermark_status(WatermarkStatus(m.status), channel)
        if valve is None:
            out.append((MIN, "ACTIVE"))
        else:
            out.append((valve.last_output_watermark, valve.last_output_status.value))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(epochs=epoch_runs())
def test_combined_watermark_never_decreases_and_matches_one_continuous_valve(
    epochs: list[list[Marker]],
) -> None:
    results = run(epochs)
    previous = initial()
    for epoch, result in enumerate(results):
        assert result.epoch == epoch
        assert result.previous_watermark == previous.watermark
        assert result.watermark >= previous.watermark
        # what the checkpoint stores reads back equal, and replaying from it is identical
        stored = EpochWatermark.from_json(json.loads(json.dumps(previous.to_json())))
        assert advance(stored, epoch, epochs[epoch]) == result
        previous = result
    assert [(r.watermark, r.status) for r in results] == continuous_reference(epochs)


@pytest.mark.parametrize("previous_status", ["ACTIVE", "IDLE"])
def test_idle_partitions_lists_exactly_the_idle_ones(previous_status: str) -> None:
    markers = [active(0, 0), active(1, 0), wm(1, 1, 5)]
    if previous_status == "IDLE":
        markers += [idle(0, 0), idle(1, 1)]
    result = advance(initial(), 0, markers)
    assert result.status == previous_status
    assert result.idle_partitions == (["t/0", "t/1"] if previous_status == "IDLE" else [])


def test_partitions_resuming_together_after_all_idle_keep_the_lagging_one_aligned() -> None:
    """All partitions idle (a quiet start), then all resume in one epoch, partition 1 two
    minutes behind: interleaving turns every partition ACTIVE before any watermark, so the
    combined watermark follows the lagging partition instead of leaving it unaligned (its
    records would all be late)."""
    quiet = advance(initial(), 0, [active(0, 0), active(1, 0), idle(0, 0), idle(1, 0)])
    assert (quiet.watermark, quiet.status) == (MIN, "IDLE")
    resumed = advance(quiet, 1, [active(0, 0), wm(0, 10, 200_000), active(1, 0), wm(1, 10, 80_000)])
    assert (resumed.watermark, resumed.status) == (80_000, "ACTIVE")
    assert resumed.partitions["t/1"] == {"watermark": 80_000, "status": "ACTIVE", "aligned": True}
    assert feed_order(
        [wm(1, 10, 80_000), active(0, 0), wm(0, 10, 200_000), active(1, 0)]
    ) == [active(0, 0), active(1, 0), wm(0, 10, 200_000), wm(1, 10, 80_000)]
