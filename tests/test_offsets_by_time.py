"""Offsets for a time (``startingTimestamp``, ``startingOffsetsByTimestamp``, the ending pair)
against a Kafka-protocol server on loopback that answers ListOffsets by timestamp right, or
wrong as the brokers here do (Tansu: 0 for every time; librdkafka's mock cluster: -1)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from kafka_server import FaultyKafka, Log
from record_batches import BASE_TS, Rec, batch

import flinkish_source.kafka.base as kafka_base
from flinkish_core.errors import OptionError
from flinkish_source.kafka.base import ConsumerPool
from flinkish_source.kafka.metadata import KafkaMetadata, OffsetRange
from flinkish_source.kafka.offsets_by_time import offsets_for_times
from flinkish_source.offset_planner import from_json
from flinkish_source.options import parse_options
from flinkish_source.stream_reader import FlinkishStreamReader

RECORDS = 50  # offset o has timestamp BASE_TS + 1000 * o


@pytest.fixture(autouse=True)
def own_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    pool = ConsumerPool(evict_interval=0)
    monkeypatch.setattr(kafka_base, "POOL", pool)
    yield
    pool.clear()


@pytest.fixture
def server() -> Iterator[FaultyKafka]:
    log = Log()
    for base in range(0, RECORDS, 10):
        log.append(base, base + 9, batch(base, [
            Rec(i, b"k", b"v", ts_delta=1000 * (base + i)) for i in range(10)]))
    log.times = {o: BASE_TS + 1000 * o for o in range(RECORDS)}
    made = FaultyKafka({("t", 0): log})
    yield made
    made.close()


def options(server: FaultyKafka, **extra: str) -> Any:
    return parse_options({"kafka.bootstrap.servers": server.bootstrap, "subscribe": "t",
                          "includeMarkers": "false", "kafkaConsumer.pollTimeoutMs": "3000",
                          **extra})


def lookup(server: FaultyKafka, at: int) -> int | None:
    opts = options(server)
    metadata = KafkaMetadata(opts)
    try:
        return offsets_for_times(opts, metadata, {("t", 0): at},
                                 {("t", 0): OffsetRange(0, RECORDS)})[("t", 0)]
    finally:
        metadata.close()


@pytest.mark.parametrize("broker", ["kafka", "answers 0", "answers -1"])
def test_the_first_record_at_or_after_the_time(
    server: FaultyKafka, broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    log = server.logs[("t", 0)]
    log.time_answer = {"kafka": None, "answers 0": 0, "answers -1": -1}[broker]
    caplog.set_level(logging.WARNING, logger="flinkish_source.kafka.offsets_by_time")
    assert lookup(server, BASE_TS + 25_000) == 25  # exactly a record's time
    assert lookup(server, BASE_TS + 24_500) == 25  # between two records
    assert lookup(server, BASE_TS) == 0
    assert lookup(server, BASE_TS + 10 ** 9) is None  # after the last record
    scanned = [r for r in caplog.records if "scanning" in r.getMessage()]
    # a right answer is taken as it is; a wrong one is scanned for, with a warning
    assert len(scanned) == {"kafka": 0, "answers 0": 3, "answers -1": 3}[broker]


def start(server: FaultyKafka, **extra: str) -> dict[tuple[str, int], Any]:
    reader = FlinkishStreamReader(options(server, **extra))
    try:
        return from_json(reader.initialOffset())
    finally:
        reader.stop()


@pytest.mark.parametrize("broker", ["kafka", "answers 0"])
def test_the_query_starts_and_ends_at_times(server: FaultyKafka, broker: str) -> None:
    server.logs[("t", 0)].time_answer = None if broker == "kafka" else 0
    [pos] = start(server, startingTimestamp=str(BASE_TS + 10_000)).values()
    assert (pos.offset, pos.stop) == (10, None)
    [pos] = start(server, startingOffsetsByTimestamp=f'{{"t": {{"0": {BASE_TS + 12_300}}}}}',
                  endingTimestamp=str(BASE_TS + 30_000)).values()
    assert (pos.offset, pos.stop) == (13, 30)
    # no record at or after the ending time: the partition's end, as Spark's ending times
    [pos] = start(server, startingTimestamp=str(BASE_TS),
                  endingOffsetsByTimestamp=f'{{"t": {{"0": {BASE_TS + 10 ** 9}}}}}').values()
    assert (pos.offset, pos.stop) == (0, RECORDS)


def test_no_record_after_the_starting_time_fails_or_starts_at_the_end(
    server: FaultyKafka
) -> None:
    late = str(BASE_TS + 10 ** 9)
    with pytest.raises(OptionError, match="startingOffsetsByTimestampStrategy=latest"):
        start(server, startingTimestamp=late)
    [pos] = start(server, startingTimestamp=late,
                  startingOffsetsByTimestampStrategy="LATEST").values()
    assert pos.offset == RECORDS
