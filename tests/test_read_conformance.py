"""The librdkafka read path (:class:`RangeReader`) against a fault-injecting Kafka-protocol
server (tests/kafka_server.py, real confluent-kafka clients talking to it): the rows of logs
in every message format, or a clear error, through retriable errors, a moving leader, retention
and a short log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka_server import FaultyKafka, Log
from record_batches import BASE_TS, legacy_set, plain

import flinkish_source.kafka.base as kafka_base
from flinkish_source.kafka import DataLossError, KafkaUnavailableError
from flinkish_source.kafka.base import ConsumerPool
from flinkish_source.kafka.librdkafka import RangeReader
from flinkish_source.options import parse_options

Row = tuple[int, bytes | None, bytes | None, int]


#: the bound of every wait, short where a case waits for it to pass (generous elsewhere: a
#: loaded machine must not turn a slow answer into a failure)
SHORT_WAIT = {"kafkaConsumer.pollTimeoutMs": "1500"}


def options(server: FaultyKafka, **extra: str) -> Any:
    return parse_options({"kafka.bootstrap.servers": server.bootstrap, "subscribe": "t",
                          "includeMarkers": "false", "kafkaConsumer.pollTimeoutMs": "20000",
                          **extra})


@pytest.fixture(autouse=True)
def own_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Real consumers, closed after each test (the process-wide pool would keep them)."""
    pool = ConsumerPool(evict_interval=0)
    monkeypatch.setattr(kafka_base, "POOL", pool)
    yield
    pool.clear()


def read(server: FaultyKafka, start: int, end: int, **extra: str) -> list[Row]:
    with RangeReader(options(server, **extra), [("t", 0, start, end)], 1_000) as reader:
        return [(m.offset(), m.key(), m.value(), m.timestamp()[1])
                for chunk in reader.read("t", 0, start, end) for m in chunk]


def expected(offsets: range, timestamp: Callable[[int], int] = lambda o: BASE_TS + o % 10
             ) -> list[Row]:
    return [(o, b"k%d" % o, b"v%d" % o, timestamp(o)) for o in offsets]


@pytest.fixture
def server() -> Iterator[FaultyKafka]:
    log = Log()
    for base in range(0, 50, 10):
        log.append(base, base + 9, plain(base, 10))
    made = FaultyKafka({("t", 0): log}, brokers=2)
    yield made
    made.close()


def test_plain_batches_cut_by_the_range(server: FaultyKafka) -> None:
    assert read(server, 3, 47) == expected(range(3, 47))


def test_batches_cut_at_the_fetch_size(server: FaultyKafka) -> None:
    """Each answer holds one whole batch and the next one cut at the partition byte limit."""
    size = len(plain(0, 10))
    assert read(server, 0, 50, **{"kafka.max.partition.fetch.bytes": str(size + size // 2)}
                ) == expected(range(50))


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [0, 1, 2])
def test_old_message_formats(magic: int, codec: int) -> None:
    """A topic migrated from an old cluster: v0/v1 message sets (plain, or in gzip/snappy
    wrappers) whose timestamp bytes read negative as a v2 lastOffsetDelta, then v2 batches."""
    log = Log()
    log.append(0, 9, legacy_set(0, magic, 10, codec=codec))
    log.append(10, 19, plain(10, 10))
    server = FaultyKafka({("t", 0): log})
    try:
        rows = read(server, 2, 20)
    finally:
        server.close()
    # v0 has no timestamp (librdkafka says 0, "not available"); v1 carries BASE_TS
    old = 0 if magic == 0 else BASE_TS
    assert rows == expected(range(2, 10), lambda o: old) + expected(range(10, 20))


@pytest.mark.parametrize("code", [5, 6, 7, 13])  # LEADER_NOT_AVAILABLE, NOT_LEADER, …
def test_retriable_errors_are_waited_out(server: FaultyKafka, code: int) -> None:
    answered = {"n": 0}

    def fault(broker: int, topic: str, partition: int, offset: int) -> int | None:
        answered["n"] += 1
        return code if offset >= 20 and answered["n"] <= 3 else None

    server.fault = fault
    assert read(server, 0, 50) == expected(range(50))


def test_a_high_watermark_below_the_read_position_is_waited_out(server: FaultyKafka) -> None:
    """A new leader reports high watermark 20 to the first three fetches from offset 30 on
    (one batch per fetch), after offsets up to 30 were read."""
    log = server.logs[("t", 0)]
    answered = {"n": 0}

    def fault(broker: int, topic: str, partition: int, offset: int) -> int | None:
        answered["n"] += offset >= 30
        log.high = 20 if offset >= 30 and answered["n"] <= 3 else None
        return None

    server.fault = fault
    one_batch = str(len(plain(0, 10)))
    assert read(server, 0, 50, **{"kafka.max.partition.fetch.bytes": one_batch}
                ) == expected(range(50))
    assert answered["n"] > 3


def test_records_the_broker_counts_but_does_not_serve_are_waited_for_saying_so(
    server: FaultyKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker's high watermark counts offsets 30..49 but its fetches serve nothing past 30
    (the embedded Tansu broker stalled on its writes): the read task says so while it waits
    and when the bound ends the wait."""
    server.logs[("t", 0)].withheld = 30
    caplog.set_level(logging.WARNING)
    with pytest.raises(KafkaUnavailableError) as failure:
        read(server, 0, 50, **SHORT_WAIT)
    says = ("the broker reports high watermark 50, above offset 30, yet its fetch answers from "
            "offset 30 bring no records")
    assert says in str(failure.value)
    assert any("still waiting" in r.getMessage() and says in r.getMessage()
               for r in caplog.records)


def test_a_leader_that_moves_is_followed(server: FaultyKafka) -> None:
    """Broker 1 answers NOT_LEADER_OR_FOLLOWER from offset 20 on (one batch per fetch); the
    metadata then names broker 2."""
    log = server.logs[("t", 0)]

    def fault(broker: int, topic: str, partition: int, offset: int) -> int | None:
        if broker == 1 and offset >= 20:
            log.leader = 2
        return None

    server.fault = fault
    one_batch = str(len(plain(0, 10)))
    server.requests.clear()
    assert read(server, 0, 50, **{"kafka.max.partition.fetch.bytes": one_batch}
                ) == expected(range(50))
    assert {b for b, api, _ in server.requests if api == 1} == {1, 2}


def test_records_deleted_by_retention_are_lost_data_on_read(server: FaultyKafka) -> None:
    server.logs[("t", 0)].earliest = 30
    with pytest.raises(DataLossError, match=r"t/0: offsets 10..29 .*retention"):
        read(server, 10, 50)
    assert read(server, 10, 50, failOnDataLoss="false") == expected(range(30, 50))


def test_a_log_shorter_than_the_plan_for_the_whole_wait_is_lost_data(
    server: FaultyKafka
) -> None:
    server.logs[("t", 0)].high = 40
    with pytest.raises(DataLossError, match="offsets 40..49 .*high watermark stayed at 40"):
        read(server, 0, 50, **SHORT_WAIT)


def test_planning_reads_the_offsets_from_listoffsets_and_the_fetch_high_watermark(
    server: FaultyKafka
) -> None:
    """The driver's metadata (AdminClient ListOffsets, then a fetch for the high watermark
    librdkafka caches from the first answer) against the same server."""
    from flinkish_source.kafka import KafkaMetadata, OffsetRange

    server.logs[("t", 0)].earliest = 5
    metadata = KafkaMetadata(options(server))
    try:
        assert metadata.partitions() == [("t", 0)]
        assert metadata.offset_ranges([("t", 0)]) == {("t", 0): OffsetRange(5, 50)}
    finally:
        metadata.close()
