"""Tests for flinkish_source.event_time: where a record's event time comes from, and what happens
when it cannot be read (never guessed: fail names topic/partition/offset, skip returns None)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flinkish_source.event_time import EventTimeError, EventTimeExtractor
from flinkish_source.options import parse_options

BASE = {"kafka.bootstrap.servers": "b:1", "subscribe": "t", "checkpointing.location": "/s"}


def extractor(**extra: str) -> EventTimeExtractor:
    return EventTimeExtractor(parse_options(BASE | extra).event_time)


def field(path: str = "ts", unit: str | None = None, on_error: str = "fail") -> EventTimeExtractor:
    extra = {"eventTime.field": path, "eventTime.onError": on_error}
    if unit is not None:
        extra["eventTime.unit"] = unit
    return extractor(**extra)


def doc(value: Any) -> bytes:
    return json.dumps({"ts": value}).encode()


def test_kafka_timestamp_is_the_default() -> None:
    ex = extractor()
    assert ex.from_kafka_timestamp
    assert ex.extract(b'{"ts": 5}', [("ts", b"7")]) == (None, None)


def test_field_or_header_is_not_kafka_timestamp() -> None:
    assert not field().from_kafka_timestamp
    assert not extractor(**{"eventTime.header": "ts"}).from_kafka_timestamp


# ---------------------------------------------------------------- JSON field


@pytest.mark.parametrize(
    ("unit", "value", "ms"),
    [
        (None, 1_700_000_000_123, 1_700_000_000_123),
        ("milliseconds", 1_700_000_000_123, 1_700_000_000_123),
        ("seconds", 1_700_000_000, 1_700_000_000_000),
        ("seconds", 1_700_000_000.5, 1_700_000_000_500),
        ("microseconds", 1_700_000_000_123_456, 1_700_000_000_123),
        ("milliseconds", "1700000000123", 1_700_000_000_123),
        ("seconds", " 1700000000 ", 1_700_000_000_000),
        ("milliseconds", -5, -5),
        ("milliseconds", 0, 0),
    ],
)
def test_json_number_in_unit(unit: str | None, value: Any, ms: int) -> None:
    assert field(unit=unit).extract(doc(value), None) == (ms, value)


@pytest.mark.parametrize(("value", "ms"), [(1.001, 1001), (1091837578.11, 1091837578110)])
def test_fractional_seconds_are_exact_to_the_millisecond(value: float, ms: int) -> None:
    assert field(unit="seconds").extract(doc(value), None)[0] == ms


def test_dotted_path() -> None:
    value = json.dumps({"meta": {"time": {"at": 1234}}, "ts": 1}).encode()
    assert field("meta.time.at").extract(value, None) == (1234, 1234)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2024-01-01T00:00:00Z", 1_704_067_200_000),
        ("2024-01-01T00:00:00+00:00", 1_704_067_200_000),
        ("2024-01-01T01:00:00+01:00", 1_704_067_200_000),
        ("2023-12-31T19:00:00-05:00", 1_704_067_200_000),
        ("2024-01-01T00:00:00.250Z", 1_704_067_200_250),
        ("2024-01-01 00:00:00.5+00:00", 1_704_067_200_500),
    ],
)
def test_iso_8601_with_zone(text: str, ms: int) -> None:
    assert field().extract(doc(text), None) == (ms, text)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2004-05-21T04:36:33.975+00:00", 1_085_114_193_975),
        ("1978-08-28T22:02:54.011Z", 273_189_774_011),
    ],
)
def test_iso_8601_milliseconds_are_exact(text: str, ms: int) -> None:
    assert field().extract(doc(text), None)[0] == ms


@pytest.mark.parametrize(
    "value",
    [
        "2024-01-01T00:00:00",  # naive: a guess
        "2024-01-01",  # a date, no zone
        "yesterday",
        "",
        "nan",
        True,
        None,
        [1],
        {"a": 1},
    ],
)
def test_unreadable_values_give_none(value: Any) -> None:
    assert field().extract(doc(value), None) == (None, value)


def test_missing_field_and_non_json_value() -> None:
    ex = field("a.b")
    assert ex.extract(b'{"a": {"c": 1}}', None) == (None, None)
    assert ex.extract(b'{"a": 5}', None) == (None, None)
    assert ex.extract(b"not json", None) == (None, None)
    assert ex.extract(None, None) == (None, None)
    assert ex.extract(b"\xff\xfe", None) == (None, None)


@pytest.mark.parametrize(
    "raw", [b'{"ts": "inf"}', b'{"ts": "Infinity"}', b'{"ts": 1e400}', b'{"ts": NaN}']
)
def test_non_finite_numbers_are_unreadable(raw: bytes) -> None:
    assert field(on_error="skip").extract(raw, None)[0] is None


# ---------------------------------------------------------------- header


def test_header() -> None:
    ex = extractor(**{"eventTime.header": "event-ts"})
    headers = [("other", b"1"), ("event-ts", b"1700000000123")]
    assert ex.extract(b"ignored", headers) == (1_700_000_000_123, b"1700000000123")
    assert ex.extract(None, [("event-ts", b"2024-01-01T00:00:00Z")])[0] == 1_704_067_200_000
    assert ex.extract(None, None) == (None, None)
    assert ex.extract(None, [("other", b"5")]) == (None, None)
    assert ex.extract(None, [("event-ts", None)]) == (None, None)
    assert ex.extract(None, [("event-ts", b"\xff")]) == (None, b"\xff")


def test_header_in_seconds() -> None:
    ex = extractor(**{"eventTime.header": "ts", "eventTime.unit": "seconds"})
    assert ex.extract(None, [("ts", b"1700000000")])[0] == 1_700_000_000_000


# ---------------------------------------------------------------- policy


def test_fail_policy_names_topic_partition_offset() -> None:
    ex = field("meta.ts")
    with pytest.raises(EventTimeError) as info:
        ex.failed("orders", 3, 1234, "2024-01-01T00:00:00")
    message = str(info.value)
    assert message.startswith("orders/3 offset 1234: cannot read an event time from the ")
    assert "JSON field 'meta.ts' of the value" in message
    assert "(found '2024-01-01T00:00:00')" in message
    assert "eventTime.onError=skip" in message


def test_fail_policy_header_and_bytes_shown_truncated() -> None:
    ex = extractor(**{"eventTime.header": "ts"})
    with pytest.raises(EventTimeError) as info:
        ex.failed("t", 0, 9, b"x" * 200)
    message = str(info.value)
    assert message.startswith("t/0 offset 9: cannot read an event time from the header 'ts'")
    assert repr(b"x" * 80) in message
    assert repr(b"x" * 81) not in message


def test_skip_policy_returns_none() -> None:
    ex = field(on_error="skip")
    ex.failed("t", 0, 1, "garbage")  # returns (None) instead of raising


def test_event_time_error_is_a_value_error() -> None:
    assert issubclass(EventTimeError, ValueError)
