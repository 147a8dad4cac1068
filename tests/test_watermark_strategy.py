"""Tests for flinkish_source.watermark_strategy: Flink's WatermarkStrategy / WatermarkGenerator
formulas, watermarks that never go back, MAX at the end of a bounded partition, state JSON."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flinkish_core.valve import MAX_WATERMARK, MIN_WATERMARK
from flinkish_source.options import WatermarkKind, parse_options
from flinkish_source.watermark_strategy import (
    GeneratorState,
    WatermarkGenerator,
    WatermarkStrategy,
)

MAX = 9223372036854775807
MIN = -9223372036854775808


def fresh(strategy: WatermarkStrategy, at: int = 0) -> WatermarkGenerator:
    return strategy.create_generator(GeneratorState(at))


def test_constants_are_flinks_long_range() -> None:
    assert MAX_WATERMARK == MAX
    assert MIN_WATERMARK == MIN


# ---------------------------------------------------------------- strategies


def test_builders() -> None:
    assert WatermarkStrategy.for_bounded_out_of_orderness(250) == WatermarkStrategy(
        WatermarkKind.BOUNDED_OUT_OF_ORDERNESS, 250
    )
    assert WatermarkStrategy.for_monotonous_timestamps() == WatermarkStrategy(
        WatermarkKind.MONOTONOUS, 0
    )
    assert WatermarkStrategy.punctuated() == WatermarkStrategy(WatermarkKind.PUNCTUATED)
    assert WatermarkStrategy.no_watermarks() == WatermarkStrategy(WatermarkKind.NONE)


def test_builders_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        WatermarkStrategy.for_bounded_out_of_orderness(-1)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            {"watermark.maxOutOfOrderness": "2 seconds", "idleTimeout": "5 s"},
            WatermarkStrategy(WatermarkKind.BOUNDED_OUT_OF_ORDERNESS, 2000),
        ),
        ({}, WatermarkStrategy(WatermarkKind.BOUNDED_OUT_OF_ORDERNESS, 0)),
        ({"watermark.strategy": "monotonous"}, WatermarkStrategy(WatermarkKind.MONOTONOUS)),
        (
            {"watermark.strategy": "punctuated", "watermark.punctuation.header": "wm"},
            WatermarkStrategy(WatermarkKind.PUNCTUATED),
        ),
        (
            {"watermark.strategy": "none", "idleTimeout": "1 minute"},
            WatermarkStrategy(WatermarkKind.NONE, 0),
        ),
    ],
)
def test_from_options(extra: dict[str, str], expected: WatermarkStrategy) -> None:
    options = parse_options(
        {"kafka.bootstrap.servers": "b:1", "subscribe": "t", "checkpointing.location": "/s"} | extra
    )
    assert WatermarkStrategy.from_options(options.event_time) == expected


# ---------------------------------------------------------------- bounded out-of-orderness


def test_bounded_out_of_orderness_is_max_minus_bound_minus_one() -> None:
    gen = fresh(WatermarkStrategy.for_bounded_out_of_orderness(2000))
    assert gen.periodic
    gen.on_max_event_time(10_000)
    gen.on_max_event_time(7_000)  # late: does not lower the max
    assert gen.on_periodic_emit() == 10_000 - 2000 - 1
    assert gen.on_periodic_emit() is None  # unchanged: not emitted again
    gen.on_max_event_time(12_500)
    assert gen.on_periodic_emit() == 10_499
    assert gen.state(40) == GeneratorState(40, 12_500, 10_499, 0)


def test_bounded_zero_bound() -> None:
    gen = fresh(WatermarkStrategy.for_bounded_out_of_orderness(0))
    gen.on_max_event_time(5)
    assert gen.on_periodic_emit() == 4


def test_nothing_seen_no_watermark() -> None:
    gen = fresh(WatermarkStrategy.for_bounded_out_of_orderness(100))
    gen.on_max_event_time(None)
    assert gen.on_periodic_emit() is None
    assert gen.state(0) == GeneratorState(0, MIN, MIN, 0)


def test_negative_event_times() -> None:
    gen = fresh(WatermarkStrategy.for_bounded_out_of_orderness(10))
    gen.on_max_event_time(-100)
    assert gen.on_periodic_emit() == -111


# ---------------------------------------------------------------- monotonous


def test_monotonous_is_max_minus_one() -> None:
    gen = fresh(WatermarkStrategy.for_monotonous_timestamps())
    assert gen.periodic
    gen.on_max_event_time(1_000)
    assert gen.on_periodic_emit() == 999
    gen.on_max_event_time(1_000)
    assert gen.on_periodic_emit() is None
    gen.on_max_event_time(1_001)
    assert gen.on_periodic_emit() == 1_000


# ---------------------------------------------------------------- punctuated


def test_punctuated_emits_flagged_event_time_never_backwards() -> None:
    gen = fresh(WatermarkStrategy.punctuated())
    assert not gen.periodic
    assert gen.on_punctuation(500) == 500
    assert gen.on_punctuation(400) is None
    assert gen.on_punctuation(500) is None
    assert gen.on_punctuation(501) == 501
    gen.on_max_event_time(10_000)
    assert gen.on_periodic_emit() is None  # punctuated is not periodic
    assert gen.state(3).watermark == 501


# ---------------------------------------------------------------- none


def test_no_watermarks() -> None:
    gen = fresh(WatermarkStrategy.no_watermarks())
    assert not gen.periodic
    gen.on_max_event_time(10_000)
    assert gen.on_periodic_emit() is None
    assert gen.on_end_of_input() is None


# ---------------------------------------------------------------- end of input


@pytest.mark.parametrize(
    "strategy",
    [
        WatermarkStrategy.for_bounded_out_of_orderness(5),
        WatermarkStrategy.for_monotonous_timestamps(),
        WatermarkStrategy.punctuated(),
    ],
)
def test_max_watermark_once_at_end(strategy: WatermarkStrategy) -> None:
    gen = fresh(strategy)
    gen.on_max_event_time(100)
    assert gen.on_end_of_input() == MAX
    assert gen.on_end_of_input() is None
    assert gen.state(9).watermark == MAX
    # after MAX nothing else is ever emitted
    gen.on_max_event_time(10**15)
    assert gen.on_periodic_emit() is None
    assert gen.on_punctuation(10**15) is None
    # and a generator restored from that state does not emit MAX again
    again = strategy.create_generator(gen.state(9))
    assert again.on_end_of_input() is None


# ---------------------------------------------------------------- state carried across slices


def test_state_carries_across_generators() -> None:
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(100)
    gen = fresh(strategy)
    gen.on_max_event_time(1_000)
    assert gen.on_periodic_emit() == 899
    gen.on_event_time_error()
    state = gen.state(10)
    assert state == GeneratorState(10, 1_000, 899, 1)

    nxt = strategy.create_generator(state)
    nxt.on_max_event_time(950)  # older than the max seen in the previous slice
    assert nxt.on_periodic_emit() is None
    nxt.on_event_time_error()
    assert nxt.state(20) == GeneratorState(20, 1_000, 899, 2)


@given(
    bound=st.integers(min_value=0, max_value=10_000),
    chunks=st.lists(
        st.lists(st.integers(min_value=-(10**12), max_value=10**12), max_size=5), max_size=12
    ),
)
@settings(max_examples=150, deadline=None)
def test_watermarks_never_go_back_and_match_formula(bound: int, chunks: list[list[int]]) -> None:
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(bound)
    state = GeneratorState(0)
    emitted: list[int] = []
    seen: list[int] = []
    for i, chunk in enumerate(chunks):
        # a new generator for every slice, as read tasks do
        gen = strategy.create_generator(state)
        gen.on_max_event_time(max(chunk) if chunk else None)
        seen.extend(chunk)
        wm = gen.on_periodic_emit()
        if wm is not None:
            emitted.append(wm)
            assert wm == max(seen) - bound - 1
        state = gen.state(i + 1)
        if seen:
            assert state.watermark == max(seen) - bound - 1
            assert state.max_timestamp == max(seen)
        else:
            assert state.watermark == MIN
    assert emitted == sorted(set(emitted))


# ---------------------------------------------------------------- JSON


def test_generator_state_json_round_trip() -> None:
    state = GeneratorState(42, 1_700_000_000_000, 1_699_999_997_999, 3)
    data = state.to_json()
    assert data == {"at": 42, "maxTs": 1_700_000_000_000, "wm": 1_699_999_997_999, "errors": 3}
    assert GeneratorState.from_json(json.loads(json.dumps(data))) == state


def test_generator_state_json_extremes_and_default_errors() -> None:
    state = GeneratorState(0)
    assert state.to_json() == {"at": 0, "maxTs": MIN, "wm": MIN, "errors": 0}
    assert GeneratorState.from_json({"at": 7, "maxTs": 1, "wm": MAX}) == GeneratorState(
        7, 1, MAX, 0
    )


@pytest.mark.parametrize("data", [{}, {"at": 1, "maxTs": 2}, {"at": "x", "maxTs": 1, "wm": 1}])
def test_generator_state_json_rejects_garbage(data: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="not a watermark generator state"):
        GeneratorState.from_json(data)


@given(
    st.builds(
        GeneratorState,
        st.integers(min_value=0, max_value=2**62),
        st.integers(min_value=MIN, max_value=MAX),
        st.integers(min_value=MIN, max_value=MAX),
        st.integers(min_value=0, max_value=2**31),
    )
)
@settings(max_examples=100, deadline=None)
def test_generator_state_json_round_trip_property(state: GeneratorState) -> None:
    assert GeneratorState.from_json(json.loads(json.dumps(state.to_json()))) == state
