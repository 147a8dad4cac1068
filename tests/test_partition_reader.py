"""Tests for flinkish_source.partition_reader.read_slice against a fake Kafka (no broker): the
exact sequence of records and markers, the Arrow schema, and the generator state it saves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import flinkish_source.kafka as kafka_source
from flinkish_source import partition_reader
from flinkish_source.event_time import EventTimeError
from flinkish_source.options import SourceOptions, parse_options
from flinkish_source.partition_reader import SlicePlan, read_slice
from flinkish_source.schema import arrow_schema
from flinkish_source.source_state import SourceStateStore
from flinkish_source.watermark_strategy import GeneratorState

MAX = 9223372036854775807
MIN = -9223372036854775808
ACTIVE, IDLE = "ACTIVE", "IDLE"


@dataclass
class FakeMessage:
    """What confluent-kafka's Message offers read_slice."""

    _offset: int
    _ts: int
    _value: bytes | None = b"v"
    _key: bytes | None = b"k"
    _headers: list[tuple[str, bytes | None]] | None = None
    _ts_type: int = 1  # TIMESTAMP_CREATE_TIME
    _topic: str = "t"
    _partition: int = 0

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (self._ts_type, self._ts)

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition


@dataclass
class FakeKafka:
    """Replaces flinkish_source.kafka.read_range: serves ``messages`` in chunks of ``chunk``."""

    messages: list[FakeMessage] = field(default_factory=list)
    chunk: int = 1000
    calls: list[tuple[str, int, int, int]] = field(default_factory=list)

    def read_range(
        self, options: SourceOptions, topic: str, partition: int, start: int, end: int, chunk: int
    ) -> Iterator[list[FakeMessage]]:
        self.calls.append((topic, partition, start, end))
        wanted = [m for m in self.messages if start <= m.offset() < end]
        for i in range(0, len(wanted), self.chunk):
            yield wanted[i : i + self.chunk]


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
    fake = FakeKafka()
    monkeypatch.setattr(kafka_source, "read_range", fake.read_range)
    return fake


def opts(state: Path | None, **extra: str) -> SourceOptions:
    raw = {"kafka.bootstrap.servers": "b:1", "subscribe": "t"}
    if state is not None:
        raw["checkpointing.location"] = str(state)
    return parse_options(raw | extra)


def run(options: SourceOptions, plan: SlicePlan) -> list[pa.RecordBatch]:
    batches = list(read_slice(options, plan))
    expected = arrow_schema(options.include_headers)
    for batch in batches:
        assert batch.schema.equals(expected, check_metadata=True), batch.schema
        assert batch.num_rows > 0
    return batches


Row = tuple[str, int, int | None, str | None]


def rows(batches: list[pa.RecordBatch]) -> list[Row]:
    """(kind, offset, watermark, status) of every output row, in order."""
    out: list[Row] = []
    for batch in batches:
        d = batch.to_pydict()
        out.extend(zip(d["kind"], d["offset"], d["watermark"], d["status"], strict=True))
    return out


def rec(offset: int) -> Row:
    return ("record", offset, None, None)


def wm(offset: int, watermark: int) -> Row:
    return ("watermark", offset, watermark, None)


def status(offset: int, value: str) -> Row:
    return ("status", offset, None, value)


def column(batches: list[pa.RecordBatch], name: str, kind: str = "record") -> list[Any]:
    values: list[Any] = []
    for batch in batches:
        d = batch.to_pydict()
        values.extend(v for v, k in zip(d[name], d["kind"], strict=True) if k == kind)
    return values


def ms(batches: list[pa.RecordBatch], name: str) -> list[int | None]:
    """A timestamp column of the record rows as epoch milliseconds."""
    out: list[int | None] = []
    for batch in batches:
        kinds = batch.column("kind").to_pylist()
        micros = batch.column(name).cast(pa.int64()).to_pylist()
        out.extend(
            None if u is None else u // 1000
            for u, k in zip(micros, kinds, strict=True)
            if k == "record"
        )
    return out


def saved(state: Path, at: int, topic: str = "t", partition: int = 0) -> GeneratorState | None:
    return SourceStateStore(str(state)).load(topic, partition, at)


# ---------------------------------------------------------------- first batch


def test_first_batch_announce_records_watermark(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 1_000), FakeMessage(1, 1_500), FakeMessage(2, 1_200)]
    options = opts(tmp_path, **{"watermark.maxOutOfOrderness": "100 ms"})
    plan = SlicePlan("t", 0, 0, 3, None, ACTIVE, GeneratorState(0), None)
    batches = run(options, plan)
    assert rows(batches) == [status(0, ACTIVE), rec(0), rec(1), rec(2), wm(3, 1_399)]
    assert kafka.calls == [("t", 0, 0, 3)]
    assert column(batches, "topic") == ["t", "t", "t"]
    assert column(batches, "partition") == [0, 0, 0]
    assert column(batches, "key") == [b"k", b"k", b"k"]
    assert column(batches, "value") == [b"v", b"v", b"v"]
    assert column(batches, "timestampType") == [0, 0, 0]
    assert ms(batches, "timestamp") == [1_000, 1_500, 1_200]
    assert ms(batches, "eventTime") == [1_000, 1_500, 1_200]
    # markers carry topic/partition and nulls elsewhere
    first = batches[0].to_pydict()
    assert first["topic"] == ["t"]
    assert first["partition"] == [0]
    assert first["key"] == [None]
    assert first["eventTime"] == [None]
    assert saved(tmp_path, 3) == GeneratorState(3, 1_500, 1_399, 0)


def test_many_chunks_one_watermark_at_slice_end(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.chunk = 2
    kafka.messages = [FakeMessage(o, 100 * o) for o in range(5, 10)]
    options = opts(tmp_path, **{"watermark.strategy": "monotonous"})
    plan = SlicePlan("t", 0, 5, 10, ACTIVE, ACTIVE, GeneratorState(5), None)
    batches = run(options, plan)
    assert rows(batches) == [rec(5), rec(6), rec(7), rec(8), rec(9), wm(10, 899)]
    assert [b.num_rows for b in batches] == [2, 2, 1, 1]
    assert saved(tmp_path, 10) == GeneratorState(10, 900, 899, 0)


def test_base_state_carries_over(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(10, 4_000), FakeMessage(11, 4_500)]
    options = opts(tmp_path, **{"watermark.maxOutOfOrderness": "1 s"})
    base = GeneratorState(10, 5_000, 3_999, 2)
    plan = SlicePlan("t", 0, 10, 12, ACTIVE, ACTIVE, base, None)
    # older events than already seen: no watermark, it never goes back
    assert rows(run(options, plan)) == [rec(10), rec(11)]
    assert saved(tmp_path, 12) == GeneratorState(12, 5_000, 3_999, 2)
    kafka.messages.append(FakeMessage(12, 9_000))
    plan = SlicePlan("t", 0, 12, 13, ACTIVE, ACTIVE, saved(tmp_path, 12), None)
    assert rows(run(options, plan)) == [rec(12), wm(13, 7_999)]


# ---------------------------------------------------------------- status changes


def test_resume_idle_to_active_before_records(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(12, 2_000), FakeMessage(13, 2_100)]  # 10, 11 compacted away
    options = opts(tmp_path)
    plan = SlicePlan("t", 0, 10, 14, IDLE, ACTIVE, GeneratorState(10, 1_000, 999), None)
    assert rows(run(options, plan)) == [status(12, ACTIVE), rec(12), rec(13), wm(14, 2_099)]


def test_resume_without_records_marks_active_at_end(kafka: FakeKafka, tmp_path: Path) -> None:
    options = opts(tmp_path)
    plan = SlicePlan("t", 0, 10, 12, IDLE, ACTIVE, GeneratorState(10), None)
    assert rows(run(options, plan)) == [status(12, ACTIVE)]


def test_idle_at_end(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 500)]
    options = opts(tmp_path, idleTimeout="1 s")
    plan = SlicePlan("t", 0, 0, 1, ACTIVE, IDLE, GeneratorState(0), None)
    assert rows(run(options, plan)) == [rec(0), wm(1, 499), status(1, IDLE)]


def test_status_only_slice(kafka: FakeKafka, tmp_path: Path) -> None:
    options = opts(tmp_path, idleTimeout="1 s")
    plan = SlicePlan("t", 0, 7, 7, ACTIVE, IDLE, GeneratorState(7, 10, 9), None)
    assert rows(run(options, plan)) == [status(7, IDLE)]
    assert kafka.calls == [("t", 0, 7, 7)]
    assert list(tmp_path.iterdir()) == []  # nothing read, nothing saved


def test_new_partition_announced_then_idle(kafka: FakeKafka, tmp_path: Path) -> None:
    options = opts(tmp_path, idleTimeout="1 s")
    plan = SlicePlan("t", 0, 4, 4, None, IDLE, GeneratorState(4), None)
    assert rows(run(options, plan)) == [status(4, ACTIVE), status(4, IDLE)]


def test_idle_to_idle_with_records(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(10, 50)]
    options = opts(tmp_path, idleTimeout="1 s")
    plan = SlicePlan("t", 0, 10, 11, IDLE, IDLE, GeneratorState(10), None)
    assert rows(run(options, plan)) == [status(10, ACTIVE), rec(10), wm(11, 49), status(11, IDLE)]


# ---------------------------------------------------------------- bounded partitions


def test_max_watermark_at_stop(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 1_000), FakeMessage(1, 2_000), FakeMessage(2, 3_000)]
    options = opts(tmp_path, endingOffsets="latest")
    plan = SlicePlan("t", 0, 0, 3, None, ACTIVE, GeneratorState(0), 3)
    assert rows(run(options, plan)) == [
        status(0, ACTIVE),
        rec(0),
        rec(1),
        rec(2),
        wm(3, 2_999),
        wm(3, MAX),
    ]
    assert saved(tmp_path, 3) == GeneratorState(3, 3_000, MAX, 0)


def test_no_max_before_stop(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 1_000), FakeMessage(1, 2_000)]
    options = opts(tmp_path, endingOffsets="latest")
    plan = SlicePlan("t", 0, 0, 1, ACTIVE, ACTIVE, GeneratorState(0), 2)
    assert rows(run(options, plan)) == [rec(0), wm(1, 999)]


def test_max_on_empty_bounded_partition(kafka: FakeKafka, tmp_path: Path) -> None:
    options = opts(tmp_path, endingOffsets="latest")
    plan = SlicePlan("t", 0, 0, 0, None, ACTIVE, GeneratorState(0), 0)
    assert rows(run(options, plan)) == [status(0, ACTIVE), wm(0, MAX)]


# ---------------------------------------------------------------- punctuated


def test_punctuated_markers_right_after_flagged_records(kafka: FakeKafka, tmp_path: Path) -> None:
    def msg(offset: int, ts: int, flag: Any) -> FakeMessage:
        return FakeMessage(offset, ts, json.dumps({"meta": {"wm": flag}}).encode())

    kafka.messages = [
        msg(0, 100, False),
        msg(1, 200, True),
        msg(2, 150, None),
        msg(3, 180, True),  # flagged but behind the last watermark: no marker
        msg(4, 300, 1),
        msg(5, 400, 0),
    ]
    options = opts(
        tmp_path,
        **{"watermark.strategy": "punctuated", "watermark.punctuation.field": "meta.wm"},
    )
    plan = SlicePlan("t", 0, 0, 6, ACTIVE, ACTIVE, GeneratorState(0), None)
    batches = run(options, plan)
    assert rows(batches) == [rec(0), rec(1), wm(2, 200), rec(2), rec(3), rec(4), wm(5, 300), rec(5)]
    # the record batch is split exactly at the markers
    assert [b.num_rows for b in batches] == [2, 1, 3, 1, 1]
    assert saved(tmp_path, 6) == GeneratorState(6, MIN, 300, 0)


def test_punctuated_by_header_and_max_at_stop(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [
        FakeMessage(0, 100, _headers=[("wm", b"true")]),
        FakeMessage(1, 200, _headers=[("other", b"1")]),
        FakeMessage(2, 300, _headers=[("wm", b"false")]),
        FakeMessage(3, 400, _headers=[("wm", b"1")]),
    ]
    options = opts(
        tmp_path,
        endingOffsets="latest",
        **{"watermark.strategy": "punctuated", "watermark.punctuation.header": "wm"},
    )
    plan = SlicePlan("t", 0, 0, 4, None, ACTIVE, GeneratorState(0), 4)
    assert rows(run(options, plan)) == [
        status(0, ACTIVE),
        rec(0),
        wm(1, 100),
        rec(1),
        rec(2),
        rec(3),
        wm(4, 400),
        wm(4, MAX),
    ]


# ---------------------------------------------------------------- no markers, no watermarks


def test_include_markers_false_only_records(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.chunk = 2
    kafka.messages = [FakeMessage(o, 1_000 * o) for o in range(3)]
    options = opts(None, includeMarkers="false", endingOffsets="latest")
    plan = SlicePlan("t", 0, 0, 3, None, IDLE, None, 3)
    assert rows(run(options, plan)) == [rec(0), rec(1), rec(2)]
    # even if a base state is planned, no markers and no state
    options = opts(tmp_path, includeMarkers="false")
    plan = SlicePlan("t", 0, 0, 3, None, IDLE, GeneratorState(0), 3)
    assert rows(run(options, plan)) == [rec(0), rec(1), rec(2)]
    assert list(tmp_path.iterdir()) == []


def test_strategy_none_status_markers_only(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 10), FakeMessage(1, 20)]
    options = opts(None, **{"watermark.strategy": "none"}, idleTimeout="1 s")
    plan = SlicePlan("t", 0, 0, 2, None, IDLE, None, 2)
    assert rows(run(options, plan)) == [status(0, ACTIVE), rec(0), rec(1), status(2, IDLE)]


# ---------------------------------------------------------------- event time


def test_event_time_from_json_field_skip(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [
        FakeMessage(0, 1, b'{"ts": 5000}'),
        FakeMessage(1, 2, b'{"ts": "garbage"}'),
        FakeMessage(2, 3, b'{"ts": "2024-01-01T00:00:00Z"}'),
        FakeMessage(3, 4, b"not json"),
        FakeMessage(4, 5, b'{"ts": 7000}'),
    ]
    options = opts(tmp_path, **{"eventTime.field": "ts", "eventTime.onError": "skip"})
    plan = SlicePlan("t", 0, 0, 5, ACTIVE, ACTIVE, GeneratorState(0, 100, 99, 4), None)
    batches = run(options, plan)
    assert rows(batches) == [rec(0), rec(1), rec(2), rec(3), rec(4), wm(5, 1_704_067_199_999)]
    assert ms(batches, "eventTime") == [5_000, None, 1_704_067_200_000, None, 7_000]
    assert ms(batches, "timestamp") == [1, 2, 3, 4, 5]  # Kafka timestamps are kept
    assert saved(tmp_path, 5) == GeneratorState(5, 1_704_067_200_000, 1_704_067_199_999, 6)


def test_event_time_all_skipped_no_watermark(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 1, b"{}")]
    options = opts(tmp_path, **{"eventTime.field": "ts", "eventTime.onError": "skip"})
    plan = SlicePlan("t", 0, 0, 1, ACTIVE, ACTIVE, GeneratorState(0), None)
    batches = run(options, plan)
    assert rows(batches) == [rec(0)]
    assert ms(batches, "eventTime") == [None]
    assert saved(tmp_path, 1) == GeneratorState(1, MIN, MIN, 1)


def test_event_time_from_json_field_fail(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(3, 1, b'{"ts": 1}'), FakeMessage(4, 2, b'{"ts": "x"}')]
    options = opts(tmp_path, **{"eventTime.field": "ts"})
    plan = SlicePlan("orders", 2, 3, 5, ACTIVE, ACTIVE, GeneratorState(3), None)
    with pytest.raises(EventTimeError, match=r"^orders/2 offset 4: cannot read an event time"):
        run(options, plan)
    assert list(tmp_path.iterdir()) == []


def test_event_time_from_header_skip_without_markers(kafka: FakeKafka) -> None:
    kafka.messages = [
        FakeMessage(0, 1, _headers=[("et", b"2500")]),
        FakeMessage(1, 2, _headers=[("et", b"late?")]),
    ]
    options = opts(
        None, includeMarkers="false", **{"eventTime.header": "et", "eventTime.onError": "skip"}
    )
    plan = SlicePlan("t", 0, 0, 2, ACTIVE, ACTIVE, None, None)
    batches = run(options, plan)
    assert rows(batches) == [rec(0), rec(1)]
    assert ms(batches, "eventTime") == [2_500, None]


def test_kafka_timestamp_missing(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 900), FakeMessage(1, -1, _ts_type=0)]
    plan = SlicePlan("t", 0, 0, 2, ACTIVE, ACTIVE, GeneratorState(0), None)
    with pytest.raises(EventTimeError, match=r"^t/0 offset 1: .*Kafka record timestamp"):
        run(opts(tmp_path), plan)
    batches = run(opts(tmp_path, **{"eventTime.onError": "skip"}), plan)
    assert rows(batches) == [rec(0), rec(1), wm(2, 899)]
    assert ms(batches, "timestamp") == [900, None]
    assert column(batches, "timestampType") == [0, -1]
    assert saved(tmp_path, 2) == GeneratorState(2, 900, 899, 1)


def test_log_append_time_type(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 900, _ts_type=2)]
    plan = SlicePlan("t", 0, 0, 1, ACTIVE, ACTIVE, GeneratorState(0), None)
    assert column(run(opts(tmp_path), plan), "timestampType") == [1]


def test_out_of_range_event_time_is_skipped(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 1, b'{"ts": 100000000000000000}')]
    options = opts(tmp_path, **{"eventTime.field": "ts", "eventTime.onError": "skip"})
    plan = SlicePlan("t", 0, 0, 1, ACTIVE, ACTIVE, GeneratorState(0), None)
    batches = run(options, plan)
    assert ms(batches, "eventTime") == [None]


# ---------------------------------------------------------------- schema and headers


def test_headers_column(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [
        FakeMessage(0, 1, _headers=[("a", b"1"), ("b", None)], _key=None, _value=None),
        FakeMessage(1, 2, _headers=None),
    ]
    options = opts(tmp_path, includeHeaders="true")
    plan = SlicePlan("t", 0, 0, 2, None, ACTIVE, GeneratorState(0), None)
    batches = run(options, plan)  # checks the schema with the headers column
    assert rows(batches) == [status(0, ACTIVE), rec(0), rec(1), wm(2, 1)]
    assert column(batches, "headers") == [
        [{"key": "a", "value": b"1"}, {"key": "b", "value": None}],
        [],
    ]
    assert column(batches, "headers", kind="status") == [None]
    assert column(batches, "key") == [None, b"k"]
    assert column(batches, "value") == [None, b"v"]


def test_schema_exact_without_headers(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(0, 1)]
    plan = SlicePlan("t", 0, 0, 1, None, IDLE, GeneratorState(0), 1)
    batches = run(opts(tmp_path, idleTimeout="1 s", endingOffsets="latest"), plan)
    assert rows(batches) == [status(0, ACTIVE), rec(0), wm(1, 0), wm(1, MAX), status(1, IDLE)]
    assert all(b.schema == arrow_schema(False) for b in batches)
    assert "headers" not in batches[0].schema.names
    assert batches[0].schema.field("partition").type == pa.int32()
    assert batches[0].schema.field("value").type == pa.binary()


# ---------------------------------------------------------------- state store


def test_state_saved_at_slice_end_and_loadable(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.messages = [FakeMessage(o, 10 * o) for o in range(20, 25)]
    location = tmp_path / "source-state"
    options = opts(location)
    store = SourceStateStore(str(location))
    assert store.load("t", 0, 25) is None
    run(options, SlicePlan("t", 0, 20, 23, ACTIVE, ACTIVE, GeneratorState(20), None))
    run(options, SlicePlan("t", 0, 23, 25, ACTIVE, ACTIVE, store.load("t", 0, 23), None))
    assert store.load("t", 0, 23) == GeneratorState(23, 220, 219, 0)
    assert store.load("t", 0, 25) == GeneratorState(25, 240, 239, 0)
    assert store.load("t", 0, 24) is None
    assert store.load("t", 1, 25) is None


def test_replay_is_identical(kafka: FakeKafka, tmp_path: Path) -> None:
    kafka.chunk = 3
    kafka.messages = [FakeMessage(o, (o * 37) % 11 * 100) for o in range(10)]
    options = opts(tmp_path, **{"watermark.maxOutOfOrderness": "200 ms"})
    plan = SlicePlan("t", 0, 0, 10, None, ACTIVE, GeneratorState(0), None)
    first = run(options, plan)
    second = run(options, plan)
    assert [b.to_pydict() for b in first] == [b.to_pydict() for b in second]
    assert saved(tmp_path, 10) == GeneratorState(10, 1_000, 799, 0)


def test_chunk_size_passed_to_kafka(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[int] = []

    def fake(
        options: Any, topic: str, partition: int, start: int, end: int, chunk: int
    ) -> Iterator[list[FakeMessage]]:
        seen.append(chunk)
        yield [FakeMessage(start, 5)]

    monkeypatch.setattr(kafka_source, "read_range", fake)
    plan = SlicePlan("t", 0, 0, 1, ACTIVE, ACTIVE, GeneratorState(0), None)
    assert rows(run(opts(tmp_path), plan)) == [rec(0), wm(1, 4)]
    assert seen == [partition_reader.CHUNK]
