"""The native fetch path against the real broker: it reads exactly what librdkafka reads, in
every codec librdkafka produces, transaction markers never reach the output, and a whole query
emits the same records and markers either way."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from flinkish_source.kafka import read_range
from flinkish_source.kafka.protocol import RecordChunk
from flinkish_source.options import parse_options
from integration.kafka_helpers import produce, run_available_now, source
from integration.mock_cluster import mock_topic

pytestmark = pytest.mark.integration

BASE = 1_700_000_000_000
RECORDS = 3_000


def _options(bootstrap: str, topic: str, fetch: str, **extra: str) -> Any:
    return parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                          "includeMarkers": "false", "kafkaConsumer.fetch": fetch,
                          "kafkaConsumer.pollTimeoutMs": "20000", "includeHeaders": "true",
                          **extra})


def _read(options: Any, topic: str, partition: int, start: int, end: int
          ) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """(offset, key, value, timestamp, headers) of every record of the range, and the
    chunks."""
    chunks = list(read_range(options, topic, partition, start, end, 1_000))
    rows = [(m.offset(), m.key(), m.value(), m.timestamp(), m.headers())
            for c in chunks for m in c]
    return rows, chunks


def _produce(bootstrap: str, topic: str, partition: int, compression: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.num.messages": 200, "compression.type": compression})
    for i in range(RECORDS):
        producer.produce(topic, partition=partition, timestamp=BASE + i * 7,
                         key=None if i % 13 == 0 else b"k%d" % i,
                         value=None if i % 17 == 0 else b"v%d-" % i + b"x" * (i % 50),
                         headers=[("trace", b"t%d" % i), ("none", None)] if i % 5 == 0
                         else None)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("broker", ["tansu", "mock-cluster"])
def test_native_reads_exactly_what_librdkafka_reads(
    request: pytest.FixtureRequest, kafka_bootstrap: str, topic: Any, compression: str,
    broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On the embedded broker and on librdkafka's mock cluster (integration/mock_cluster.py,
    whose topics have 4 partitions: partition 0 is read)."""
    if broker == "tansu":
        bootstrap, name = kafka_bootstrap, topic(1)
    else:
        bootstrap, name = request.getfixturevalue("mock_bootstrap"), f"native-{compression}"
        mock_topic(bootstrap, name)
    _produce(bootstrap, name, 0, compression)
    expected, _ = _read(_options(bootstrap, name, "librdkafka"), name, 0, 100, 2_900)
    assert [r[0] for r in expected] == list(range(100, 2_900))
    assert expected[0][4] == [("trace", b"t100"), ("none", None)] and expected[1][4] is None
    with caplog.at_level(logging.INFO, logger="flinkish_source.kafka.native"):
        got, chunks = _read(_options(bootstrap, name, "native"), name, 0, 100, 2_900)
    assert got == expected
    assert all(isinstance(c, RecordChunk) for c in chunks)  # no record went to librdkafka
    assert "with librdkafka" not in caplog.text


def test_transaction_markers_are_skipped_and_a_range_can_end_on_one(
    kafka_bootstrap: str, topic: Any
) -> None:
    """Two committed transactions: each ends in a marker at an offset of its own, which both
    clients skip; a range that ends on the last marker is read to its end."""
    name = topic(1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": name,
                         "linger.ms": 5})
    producer.init_transactions(30)
    for txn in range(2):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(name, partition=0, key=b"t%d-%d" % (txn, i), value=b"x",
                             timestamp=BASE + i)
        producer.commit_transaction(30)
    end = 12  # 2 x (5 records + 1 marker)
    for isolation in ("read_committed", "read_uncommitted"):
        extra = {"kafka.isolation.level": isolation}
        expected, _ = _read(_options(kafka_bootstrap, name, "librdkafka", **extra), name, 0, 0,
                            end)
        got, chunks = _read(_options(kafka_bootstrap, name, "native", **extra), name, 0, 0,
                            end)
        assert got == expected, isolation
        assert [r[0] for r in got] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
        assert all(isinstance(c, RecordChunk) for c in chunks)


def test_a_whole_query_emits_the_same_records_and_markers_either_way(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    """Event time from a JSON field (records taken apart one by one), three partitions,
    several batches, through Spark with markers: the rows are identical."""
    name = topic(3)
    produce(kafka_bootstrap, name, [
        (p, b"k%d-%d" % (p, i), b'{"ts": %d}' % (BASE + i * 1_000 + p), BASE)
        for i in range(400) for p in (0, 1, 2)
    ])
    rows = {}
    for fetch in ("native", "librdkafka"):
        df = source(spark, kafka_bootstrap, name, str(tmp_path / f"{fetch}-state"),
                    **{"kafkaConsumer.fetch": fetch, "eventTime.field": "ts",
                       "watermark.maxOutOfOrderness": "2 seconds",
                       "maxOffsetsPerTrigger": "500"})
        rows[fetch] = [r.asDict() for r in run_available_now(df, str(tmp_path / f"{fetch}-ck"))]
    assert len(rows["native"]) > 1200
    assert rows["native"] == rows["librdkafka"]
