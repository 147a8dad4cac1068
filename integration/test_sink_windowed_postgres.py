"""The docs' first windowed count (docs/getting-started.md) against real Kafka, Spark and
PostgreSQL (issue 23, items 4 and 6): a windowed count on ``flinkish.with_watermark`` into the
flinkish sink. Its rows carry no markers, so the sink records Spark's event-time watermark of
each batch (through with_watermark: the combined watermark) in the epochs table and its
checkpoint, where ``flinkish inspect`` shows it; the ``window`` struct lands as two timestamptz
columns."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import functions as F

import flinkish
from flinkish.inspect import load_epochs
from integration.kafka_helpers import produce, source, wait_for

pytestmark = pytest.mark.integration

BASE = 1_700_000_040_000  # a multiple of the minute
PER_PARTITION = 120  # one record a second: two full one-minute windows per partition


def test_windowed_count_records_sparks_watermark_and_splits_the_window(
    spark: Any, kafka_bootstrap: str, topic: Any, postgres_dsn: str, tmp_path: Path
) -> None:
    name = topic(2)
    produce(kafka_bootstrap, name, [
        (p, b"k", b"v", BASE + i * 1_000) for i in range(PER_PARTITION) for p in (0, 1)])
    table = f"counts_{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "ck"
    flinkish.register(spark)
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    endingOffsets="latest")  # bounded: MAX_WATERMARK closes every window
    counts = (
        flinkish.with_watermark(events)
        .groupBy(F.window("eventTime", "1 minute"), "partition")
        .count()
        .coalesce(2)
    )
    query = (
        counts.writeStream.outputMode("append").format("flinkish")
        .option("target", "postgres").option("dsn", postgres_dsn).option("table", table)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )

    def fetch(statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            try:
                return conn.execute(statement).fetchall()
            except psycopg.errors.UndefinedTable:
                return []

    try:
        wait_for(lambda: len(fetch(f"SELECT 1 FROM {table}")) == 4, 180, "all four windows")
    finally:
        query.stop()
    assert query.exception() is None

    columns = fetch(
        "SELECT column_name, data_type FROM information_schema.columns "
        f"WHERE table_name = '{table}' ORDER BY ordinal_position")
    assert columns[:2] == [("window_start", "timestamp with time zone"),
                           ("window_end", "timestamp with time zone")]
    rows = fetch(
        "SELECT (extract(epoch FROM window_start) * 1000)::bigint, "
        f"(extract(epoch FROM window_end) * 1000)::bigint, partition, count FROM {table} "
        "ORDER BY 1, 3")
    assert rows == [(BASE + w * 60_000, BASE + (w + 1) * 60_000, p, 60)
                    for w in (0, 1) for p in (0, 1)]

    # the epochs table: Spark's watermark, said to be Spark's; it passes every window's end
    epochs = fetch(f"SELECT epoch, watermark, watermark_source FROM {table}_flinkish_epochs "
                   "ORDER BY epoch")
    recorded = [(w, s) for _, w, s in epochs if w is not None]
    assert recorded and {s for _, s in recorded} == {"spark"}
    assert max(w for w, _ in recorded) >= BASE + 120_000
    assert all(s is None for _, w, s in epochs if w is None)  # before Spark had one

    # inspect reads the same from the query's checkpoint
    shown = {r.epoch: (r.watermark, r.watermark_source) for r in load_epochs(str(checkpoint))}
    assert {e: (w, s) for e, w, s in epochs if w is not None}.items() <= shown.items()
