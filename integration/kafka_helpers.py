"""Producing known data and running the source into a memory sink, for the integration tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Producer

Record = tuple[int, bytes, bytes, int]  # partition, key, value, timestamp ms


def produce(bootstrap: str, topic: str, records: Iterable[Record], headers: Any = None) -> None:
    """Produce with lingering so several records share a producer batch (Tansu's latest-offset
    quirk only shows with multi-record batches)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 100, "batch.num.messages": 50}
    )
    for partition, key, value, ts in records:
        producer.produce(topic, key=key, value=value, partition=partition, timestamp=ts,
                         headers=headers)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not delivered"


def source(spark: Any, bootstrap: str, topic: str, state: str, **options: str | None) -> Any:
    """The flinkish source over ``topic`` from its earliest offsets; ``options`` add to or
    replace the defaults (None removes one)."""
    settings: dict[str, str | None] = {
        "kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest",
        "checkpointing.location": state, "kafkaConsumer.pollTimeoutMs": "20000", **options}
    reader = spark.readStream.format("flinkish")
    for key, value in settings.items():
        if value is not None:
            reader = reader.option(key, value)
    return reader.load()


_ORDER = {("status", "ACTIVE"): 0, ("record", None): 1, ("watermark", None): 2}


def run_sink(df: Any, checkpoint: Any, **options: str) -> None:
    """Run ``df`` into the flinkish sink with ``options`` (``Trigger.AvailableNow``) to its end;
    raise the query's failure."""
    writer = df.writeStream.format("flinkish").option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(300)
    assert not query.isActive
    if query.exception() is not None:
        raise query.exception()


def ordered(batches: list[tuple[int, Any]]) -> list[Any]:
    """Rows of (batch id, row) pairs in partition order, each marker where its partition emitted
    it: within a batch, a marker's offset and kind place it (see partition_reader). Carrier
    rows (one per batch, of no partition) are left out."""
    return [
        row
        for _, row in sorted(
            [(batch, row) for batch, row in batches if row.kind != "carrier"],
            key=lambda br: (
                br[1].partition, br[0], br[1].offset, _ORDER.get((br[1].kind, br[1].status), 3),
                br[1].watermark or 0,
            ),
        )
    ]


class Collector:
    """A foreachBatch sink keeping every row (unlike the memory sink it can restart from a
    checkpoint)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        from flinkish.batch_errors import spark_safe_errors

        with spark_safe_errors():  # a test's stop() during the collect ends the query cleanly
            got = batch.collect()
        with self.lock:
            self.rows.extend((batch_id, row) for row in got)

    def snapshot(self) -> list[Any]:
        with self.lock:
            return ordered(list(self.rows))


def start(df: Any, checkpoint: str, collector: Collector, available_now: bool = False) -> Any:
    writer = df.writeStream.foreachBatch(collector).option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def run_available_now(df: Any, checkpoint: str) -> list[Any]:
    """Run to the end of what is in Kafka now; the rows this run read, in partition order."""
    collector = Collector()
    query = start(df, checkpoint, collector, available_now=True)
    query.awaitTermination(300)
    assert not query.isActive, "the AvailableNow query did not finish in 300 s"
    if query.exception() is not None:
        raise query.exception()
    return collector.snapshot()


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll until ``condition()`` is truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def markers(rows: list[Any], partition: int) -> list[tuple[Any, ...]]:
    """(kind, offset, watermark or status) of a partition's marker rows, in order."""
    return [
        (r.kind, r.offset, r.watermark if r.kind == "watermark" else r.status)
        for r in rows if r.partition == partition and r.kind != "record"
    ]
