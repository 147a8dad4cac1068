"""Tests for flinkish_core.valve: Flink's StatusWatermarkValve plus the FLINK-40475 fixes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from valve_reference import LinearScanValve

from flinkish_core.valve import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    ChannelState,
    StatusWatermarkValve,
    WatermarkStatus,
)

ACTIVE = WatermarkStatus.ACTIVE
IDLE = WatermarkStatus.IDLE

Event = tuple[str, Any]


class Recorder:
    """A ValveOutput that logs ("wm", value) / ("status", status) in emission order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit_watermark(self, watermark: int) -> None:
        self.events.append(("wm", watermark))

    def emit_watermark_status(self, status: WatermarkStatus) -> None:
        self.events.append(("status", status))

    def take(self) -> list[Event]:
        """The events since the last take(), so each step can be asserted on its own."""
        events, self.events = self.events, []
        return events


class SeedValve(LinearScanValve):
    """Flink 1.11's StatusWatermarkValve exactly as its ``StatusWatermarkValve.java`` has it
    (apache/flink, branch release-1.11, ``flink-streaming-java/src/main/java/org/apache/flink/
    streaming/runtime/streamstatus/StatusWatermarkValve.java``).

    Only ``inputStreamStatus`` differs from the corrected reference; it is transliterated here
    line by line, so the tests below can show where the corrections change the output.
    """

    def input_watermark_status(self, status: WatermarkStatus, channel: int) -> None:
        c = self.channels[channel]
        if status.is_idle and c.status.is_active:
            c.status = IDLE
            c.aligned = False
            if not self.has_active_channels():
                if c.watermark == self.last_output_watermark:
                    self.find_and_output_max_watermark_across_all_channels()
                self.last_output_status = IDLE
                self.output.emit_watermark_status(self.last_output_status)
            elif c.watermark == self.last_output_watermark:
                self.find_and_output_new_min_watermark_across_aligned_channels()
        elif status.is_active and c.status.is_idle:
            c.status = ACTIVE
            if c.watermark >= self.last_output_watermark:
                c.aligned = True
            if self.last_output_status.is_idle:
                self.last_output_status = ACTIVE
                self.output.emit_watermark_status(self.last_output_status)


Step = tuple[
    str, int, Any
]  # ("wm", channel, watermark) | ("status", channel, status) | ("add", ...)


def apply(valve: StatusWatermarkValve | LinearScanValve, step: Step) -> None:
    """Feed one step; channel indices wrap so that random steps fit any channel count."""
    kind, raw_channel, value = step
    channel = raw_channel % valve.num_channels
    if kind == "wm":
        valve.input_watermark(value, channel)
    elif kind == "status":
        valve.input_watermark_status(value, channel)
    else:
        valve.add_channel()


def state(valve: StatusWatermarkValve | LinearScanValve) -> tuple[Any, ...]:
    """Everything observable about a valve, for comparing two of them."""
    channels = tuple(valve.channel(i) for i in range(valve.num_channels))
    return valve.last_output_watermark, valve.last_output_status, channels


def make(num_channels: int) -> tuple[StatusWatermarkValve, Recorder]:
    out = Recorder()
    return StatusWatermarkValve(num_channels, out), out


# ------------------------------------------------------- Flink 1.11 behaviour


def test_single_channel_forwards_increasing_watermarks_only() -> None:
    valve, out = make(1)
    valve.input_watermark(0, 0)
    assert out.take() == [("wm", 0)]
    valve.input_watermark(25, 0)
    assert out.take() == [("wm", 25)]
    valve.input_watermark(25, 0)
    valve.input_watermark(18, 0)
    assert out.take() == []
    assert valve.channel(0) == ChannelState(25, ACTIVE, True)
    assert valve.last_output_watermark == 25


def test_multiple_channels_emit_minimum_of_aligned_channels() -> None:
    valve, out = make(3)
    valve.input_watermark(12, 0)
    valve.input_watermark(13, 1)
    assert out.take() == []  # channel 2 still at MIN holds everything back
    valve.input_watermark(10, 2)
    assert out.take() == [("wm", 10)]
    valve.input_watermark(15, 2)
    assert out.take() == [("wm", 12)]
    valve.input_watermark(17, 0)
    assert out.take() == [("wm", 13)]
    valve.input_watermark(20, 1)
    assert out.take() == [("wm", 15)]


def test_lower_watermarks_of_a_channel_are_ignored() -> None:
    valve, out = make(2)
    valve.input_watermark(10, 0)
    valve.input_watermark(10, 1)
    assert out.take() == [("wm", 10)]
    valve.input_watermark(5, 0)
    valve.input_watermark(11, 1)
    assert out.take() == []
    assert valve.channel(0).watermark == 10
    valve.input_watermark(11, 0)
    assert out.take() == [("wm", 11)]


def test_toggling_status() -> None:
    valve, out = make(2)
    valve.input_watermark_status(IDLE, 0)
    assert out.take() == []
    assert valve.channel(0) == ChannelState(MIN_WATERMARK, IDLE, False)
    valve.input_watermark_status(IDLE, 0)  # no change, ignored
    valve.input_watermark(10, 0)  # idle channel: ignored
    assert out.take() == []
    assert valve.channel(0).watermark == MIN_WATERMARK
    valve.input_watermark(7, 1)
    assert out.take() == [("wm", 7)]  # only channel 1 is aligned
    valve.input_watermark_status(IDLE, 1)
    assert out.take() == [("status", IDLE)]  # max (7) is not above the last output
    assert valve.last_output_status is IDLE
    valve.input_watermark(30, 1)  # the whole valve is idle: ignored
    assert out.take() == []
    valve.input_watermark_status(ACTIVE, 0)
    assert out.take() == [("status", ACTIVE)]
    assert valve.channel(0) == ChannelState(MIN_WATERMARK, ACTIVE, False)  # resumed behind
    valve.input_watermark(5, 0)
    assert out.take() == []
    valve.input_watermark(8, 0)
    assert out.take() == [("wm", 8)]
    assert valve.channel(0) == ChannelState(8, ACTIVE, True)


def test_partial_idleness_advances_the_minimum() -> None:
    valve, out = make(3)
    for channel, wm in enumerate((10, 20, 30)):
        valve.input_watermark(wm, channel)
    assert out.take() == [("wm", 10)]
    valve.input_watermark_status(IDLE, 0)
    assert out.take() == [("wm", 20)]
    valve.input_watermark_status(IDLE, 2)
    assert out.take() == []
    valve.input_watermark(25, 1)
    assert out.take() == [("wm", 25)]
    assert valve.last_output_status is ACTIVE


def test_full_idleness_flushes_the_maximum() -> None:
    valve, out = make(3)
    for channel, wm in enumerate((10, 20, 30)):
        valve.input_watermark(wm, channel)
    valve.input_watermark_status(IDLE, 1)
    valve.input_watermark_status(IDLE, 2)
    assert out.take() == [("wm", 10)]
    valve.input_watermark_status(IDLE, 0)
    assert out.take() == [("wm", 30), ("status", IDLE)]


def test_resuming_behind_is_unaligned_until_caught_up() -> None:
    valve, out = make(2)
    valve.input_watermark(10, 0)
    valve.input_watermark(15, 1)
    valve.input_watermark_status(IDLE, 0)
    valve.input_watermark(20, 1)
    assert out.take() == [("wm", 10), ("wm", 15), ("wm", 20)]
    valve.input_watermark_status(ACTIVE, 0)
    assert out.take() == []
    assert valve.channel(0) == ChannelState(10, ACTIVE, False)
    valve.input_watermark(18, 0)  # still behind: does not hold the valve back
    valve.input_watermark(25, 1)
    assert out.take() == [("wm", 25)]
    assert not valve.channel(0).aligned
    valve.input_watermark(26, 0)  # caught up: aligned again
    assert out.take() == []
    assert valve.channel(0) == ChannelState(26, ACTIVE, True)
    valve.input_watermark(30, 1)
    assert out.take() == [("wm", 26)]  # now channel 0 holds the minimum


def test_resuming_ahead_is_aligned_immediately() -> None:
    valve, out = make(2)
    valve.input_watermark(30, 0)
    valve.input_watermark(10, 1)
    valve.input_watermark_status(IDLE, 0)
    valve.input_watermark(20, 1)
    assert out.take() == [("wm", 10), ("wm", 20)]
    valve.input_watermark_status(ACTIVE, 0)
    assert out.take() == []
    assert valve.channel(0) == ChannelState(30, ACTIVE, True)
    valve.input_watermark(40, 1)
    assert out.take() == [("wm", 30)]


# ------------------------------------------------------- FLINK-40475 corrections


def run_both(num_channels: int, steps: list[Step]) -> tuple[list[Event], ...]:
    """Feed the same steps to Flink 1.11's logic and to the heap valve; return both outputs."""
    seed_out, fixed_out = Recorder(), Recorder()
    seed = SeedValve(num_channels, seed_out)
    fixed = StatusWatermarkValve(num_channels, fixed_out)
    for step in steps:
        apply(seed, step)
        apply(fixed, step)
    return seed_out.events, fixed_out.events


# A (0) at 30, B (1) at 5, C (2) at 20; B idles and resumes behind, so it is active but
# unaligned; A and C go idle, leaving B as the last active channel: it is not at the minimum.
LAST_ACTIVE_LAGGING = [
    ("wm", 0, 30),
    ("wm", 1, 5),
    ("wm", 2, 20),
    ("status", 1, IDLE),
    ("status", 1, ACTIVE),
    ("status", 0, IDLE),
    ("status", 2, IDLE),
]


def test_correction_1_all_idle_flushes_max_even_if_last_channel_lags() -> None:
    steps = [*LAST_ACTIVE_LAGGING, ("status", 1, IDLE)]
    seed, fixed = run_both(3, steps)
    assert seed == [("wm", 5), ("wm", 20), ("status", IDLE)]  # 30 is never emitted
    assert fixed == [("wm", 5), ("wm", 20), ("wm", 30), ("status", IDLE)]


def test_correction_2_reactivated_channel_advances_the_minimum_at_once() -> None:
    # B (1) goes idle at 20 while not the minimum; the only other active channel is unaligned,
    # so when B resumes it is the only aligned channel and 20 can be emitted right away.
    steps = [
        ("wm", 0, 10),
        ("wm", 1, 20),
        ("wm", 2, 5),
        ("status", 2, IDLE),
        ("status", 2, ACTIVE),
        ("status", 1, IDLE),
        ("status", 0, IDLE),
        ("status", 1, ACTIVE),
    ]
    seed, fixed = run_both(3, steps)
    assert seed == [("wm", 5), ("wm", 10)]  # stalls until the next watermark input
    assert fixed == [("wm", 5), ("wm", 10), ("wm", 20)]


def test_correction_2_emits_status_active_before_the_new_watermark() -> None:
    # Flink 1.11's valve goes idle without flushing (see correction 1) and leaves channel A at 30
    # above its last output 20; a valve restored from that state must, when A resumes, first
    # turn active and then emit A's watermark.
    seed_out = Recorder()
    seed = SeedValve(3, seed_out)
    for step in [*LAST_ACTIVE_LAGGING, ("status", 1, IDLE)]:
        apply(seed, step)
    snapshot = {
        "format": 1,
        "last_output_watermark": seed.last_output_watermark,
        "last_output_status": seed.last_output_status.value,
        "channels": [[c.watermark, c.status.value, c.aligned] for c in seed.channels],
    }
    out = Recorder()
    valve = StatusWatermarkValve.restore(snapshot, out)
    seed_out.take()
    seed.input_watermark_status(ACTIVE, 0)
    valve.input_watermark_status(ACTIVE, 0)
    assert seed_out.take() == [("status", ACTIVE)]
    assert out.take() == [("status", ACTIVE), ("wm", 30)]


# ------------------------------------------------------------------ add_channel


def test_add_channel_before_any_output_holds_the_watermark_back() -> None:
    valve, out = make(1)
    assert valve.add_channel() == 1
    assert valve.num_channels == 2
    assert valve.channel(1) == ChannelState(MIN_WATERMARK, ACTIVE, True)
    valve.input_watermark(10, 0)
    assert out.take() == []
    valve.input_watermark(5, 1)
    assert out.take() == [("wm", 5)]


def test_add_channel_after_output_starts_unaligned() -> None:
    valve, out = make(1)
    valve.input_watermark(10, 0)
    assert out.take() == [("wm", 10)]
    assert valve.add_channel() == 1
    assert out.take() == []
    assert valve.channel(1) == ChannelState(MIN_WATERMARK, ACTIVE, False)
    valve.input_watermark(20, 0)
    assert out.take() == [("wm", 20)]  # the new channel does not hold it back
    valve.input_watermark(15, 1)
    assert not valve.channel(1).aligned
    valve.input_watermark(25, 1)
    assert valve.channel(1).aligned
    assert out.take() == []
    valve.input_watermark(30, 0)
    assert out.take() == [("wm", 25)]


def test_add_channel_to_idle_valve_makes_it_active() -> None:
    valve, out = make(1)
    valve.input_watermark(10, 0)
    valve.input_watermark_status(IDLE, 0)
    assert out.take() == [("wm", 10), ("status", IDLE)]
    assert valve.add_channel() == 1
    assert out.take() == [("status", ACTIVE)]
    assert valve.last_output_status is ACTIVE
    assert valve.channel(1) == ChannelState(MIN_WATERMARK, ACTIVE, False)
    valve.input_watermark(12, 1)
    assert out.take() == [("wm", 12)]


# ------------------------------------------------------------- API and errors


def test_status_enum() -> None:
    assert [s.value for s in WatermarkStatus] == ["ACTIVE", "IDLE"]
    assert ACTIVE.is_active and not ACTIVE.is_idle
    assert IDLE.is_idle and not IDLE.is_active
    assert (MIN_WATERMARK, MAX_WATERMARK) == (-(2**63), 2**63 - 1)


def test_initial_state_and_frozen_channel_state() -> None:
    valve, _ = make(2)
    assert valve.num_channels == 2
    assert valve.last_output_watermark == MIN_WATERMARK
    assert valve.last_output_status is ACTIVE
    state = valve.channel(1)
    assert state == ChannelState(MIN_WATERMARK, ACTIVE, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.watermark = 3  # type: ignore[misc]


def test_needs_at_least_one_channel() -> None:
    with pytest.raises(ValueError, match="at least one channel.*num_channels=0"):
        make(0)


@pytest.mark.parametrize(
    "call",
    [
        lambda v: v.input_watermark(1, 2),
        lambda v: v.input_watermark(1, -1),
        lambda v: v.input_watermark_status(IDLE, 2),
        lambda v: v.channel(5),
    ],
)
def test_bad_channel_index(call: Any) -> None:
    valve, _ = make(2)
    with pytest.raises(IndexError, match=r"channel index -?\d+ out of range.* 2 channels"):
        call(valve)


def test_watermark_outside_64_bit_range() -> None:
    valve, _ = make(1)
    with pytest.raises(ValueError, match="64-bit"):
        valve.input_watermark(MAX_WATERMARK + 1, 0)


def test_max_watermark_passes_through() -> None:
    valve, out = make(1)
    valve.input_watermark(MAX_WATERMARK, 0)
    assert out.take() == [("wm", MAX_WATERMARK)]


def test_stale_heap_entries_are_compacted() -> None:
    # White-box: channel 1 stays at MIN, so channel 0's superseded entries never reach the
    # top of the heap; without compaction the heap would keep all 10,000 of them.
    valve, out = make(2)
    for wm in range(10_000):
        valve.input_watermark(wm, 0)
    assert out.events == []
    assert len(valve._heap) <= 2 * 2 + 64 + 1
    valve.input_watermark(20_000, 1)
    assert out.events == [("wm", 9_999)]


def good_snapshot() -> dict[str, Any]:
    return {
        "format": 1,
        "last_output_watermark": 10,
        "last_output_status": "ACTIVE",
        "channels": [[10, "ACTIVE", True], [3, "ACTIVE", False], [12, "IDLE", False]],
    }


def test_snapshot_layout_and_silent_restore() -> None:
    valve, out = make(3)
    valve.input_watermark(10, 0)
    valve.input_watermark(3, 1)
    valve.input_watermark(12, 2)
    valve.input_watermark_status(IDLE, 1)
    valve.input_watermark_status(ACTIVE, 1)
    valve.input_watermark_status(IDLE, 2)
    assert valve.snapshot() == good_snapshot()
    restored_out = Recorder()
    restored = StatusWatermarkValve.restore(good_snapshot(), restored_out)
    assert restored_out.events == []
    assert [restored.channel(i) for i in range(3)] == [valve.channel(i) for i in range(3)]
    restored.input_watermark(11, 0)
    assert restored_out.events == [("wm", 11)]


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    snap = good_snapshot()
    target: Any = snap
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return snap


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        ([1, 2], "must be a dict"),
        ({k: v for k, v in good_snapshot().items() if k != "channels"}, r"missing \['channels'\]"),
        ({**good_snapshot(), "extra": 1}, r"unknown \['extra'\]"),
        (_with(("format",), 2), "unsupported valve snapshot format 2"),
        (_with(("format",), True), "unsupported valve snapshot format True"),
        (_with(("last_output_watermark",), "10"), "last_output_watermark must be an int"),
        (_with(("last_output_watermark",), 2**63), "last_output_watermark must be an int"),
        (_with(("last_output_status",), "active"), "last_output_status must be 'ACTIVE'"),
        (_with(("channels",), []), "'channels' must be a non-empty list"),
        (_with(("channels", 1), [3, "ACTIVE"]), r"channels\[1\] must be \[watermark"),
        (_with(("channels", 1, 0), False), r"channels\[1\] watermark must be an int"),
        (_with(("channels", 1, 1), None), r"channels\[1\] status must be"),
        (_with(("channels", 1, 2), 0), r"channels\[1\] aligned must be a bool"),
        (_with(("channels", 2, 2), True), r"channels\[2\] is idle and aligned"),
        (_with(("channels", 1, 2), True), r"channels\[1\] is aligned with watermark 3 below"),
        (_with(("last_output_status",), "IDLE"), "contradicts the channels"),
        (_with(("channels", 0, 0), 11), "minimum watermark 11 differs"),
    ],
)
def test_restore_rejects_malformed_snapshots(snapshot: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StatusWatermarkValve.restore(snapshot, Recorder())


# ---------------------------------------------------------------- properties

WATERMARKS = st.one_of(st.integers(-3, 12), st.sampled_from([MIN_WATERMARK, MAX_WATERMARK]))
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("wm"), st.integers(0, 15), WATERMARKS),
        st.tuples(st.just("wm"), st.integers(0, 15), WATERMARKS),
        st.tuples(st.just("status"), st.integers(0, 15), st.sampled_from(WatermarkStatus)),
        st.tuples(st.just("add"), st.just(0), st.just(None)),
    ),
    max_size=80,
)


@settings(max_examples=300)
@given(num_channels=st.integers(1, 8), steps=STEPS)
def test_outputs_are_monotonic_and_statuses_alternate(num_channels: int, steps: list[Step]) -> None:
    valve, out = make(num_channels)
    for step in steps:
        apply(valve, step)
    watermarks = [v for kind, v in out.events if kind == "wm"]
    assert watermarks == sorted(set(watermarks))  # strictly increasing
    statuses = [v for kind, v in out.events if kind == "status"]
    assert statuses == [IDLE, ACTIVE] * (len(statuses) // 2) + [IDLE] * (len(statuses) % 2)
    assert valve.last_output_status.is_idle == all(
        valve.channel(i).status.is_idle for i in range(valve.num_channels)
    )


@settings(max_examples=300)
@given(num_channels=st.integers(1, 8), steps=STEPS, data=st.data())
def test_snapshot_restore_continues_identically(
    num_channels: int, steps: list[Step], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(steps)), label="cut")
    valve, out = make(num_channels)
    for step in steps[:cut]:
        apply(valve, step)
    snapshot = valve.snapshot()
    assert json.loads(json.dumps(snapshot)) == snapshot  # only JSON types, no tuples
    restored_out = Recorder()
    restored = StatusWatermarkValve.restore(json.loads(json.dumps(snapshot)), restored_out)
    assert state(restored) == state(valve)
    out.take()
    for step in steps[cut:]:
        apply(valve, step)
        apply(restored, step)
        assert restored_out.take() == out.take()
    assert state(restored) == state(valve)
    assert restored.snapshot() == valve.snapshot()


@settings(max_examples=300)
@given(num_channels=st.integers(1, 8), steps=STEPS)
def test_heap_valve_agrees_with_linear_scan_reference(num_channels: int, steps: list[Step]) -> None:
    valve, out = make(num_channels)
    reference_out = Recorder()
    reference = LinearScanValve(num_channels, reference_out)
    for step in steps:
        apply(valve, step)
        apply(reference, step)
        assert out.take() == reference_out.take()
        assert state(valve) == state(reference)
