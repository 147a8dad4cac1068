"""The main job: a skewed, out-of-order event stream on the embedded broker, read by the
flinkish source, showing per-partition watermarks where Spark would have one global number."""

from __future__ import annotations

import json
import random
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table

PARTITIONS = 4
LAG_MS = 120_000  # partition 3 lags two minutes behind in event time


def _produce(bootstrap: str, topic: str, events: int) -> None:
    from confluent_kafka import Producer

    rng = random.Random(7)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    base = int(time.time() * 1000) - 3_600_000
    for i in range(events):
        for p in range(PARTITIONS):
            ts = base + i * 500 - (LAG_MS if p == PARTITIONS - 1 else 0) + rng.randint(-1500, 0)
            producer.produce(topic, value=json.dumps({"p": p, "i": i}).encode(), partition=p,
                             timestamp=ts)
    producer.flush(30)


def run_demo(events_per_partition: int = 400) -> int:
    from flinkish.embedded_kafka import EmbeddedKafka, create_topic
    from flinkish.spark_session import local_session

    console = Console()
    with EmbeddedKafka() as broker, tempfile.TemporaryDirectory() as work:
        console.print(f"[bold]embedded broker[/] on {broker.bootstrap_servers}")
        create_topic(broker.bootstrap_servers, "events", PARTITIONS)
        _produce(broker.bootstrap_servers, "events", events_per_partition)
        console.print(f"produced {events_per_partition * PARTITIONS} events; starting Spark…")
        spark = local_session("flinkish-demo")
        try:
            rows = _read(spark, broker.bootstrap_servers, work)
        finally:
            spark.stop()
    table = Table(title="flinkish source: per-partition markers")
    for column in ("partition", "records", "max event time", "watermark", "status"):
        table.add_column(column)
    for p in range(PARTITIONS):
        mine = [r for r in rows if r["partition"] == p]
        records = [r for r in mine if r["kind"] == "record"]
        wms = [r["watermark"] for r in mine if r["kind"] == "watermark"]
        statuses = [r["status"] for r in mine if r["kind"] == "status"]
        top = max(r["eventTime"] for r in records) if records else None
        table.add_row(str(p), str(len(records)), str(top), str(wms[-1] if wms else None),
                      statuses[-1] if statuses else "")
    console.print(table)
    spark_wm = max(r["eventTime"] for r in rows if r["kind"] == "record")
    console.print(f"Spark's single global watermark would follow the fastest partition: {spark_wm}")
    return 0


def _read(spark: Any, bootstrap: str, work: str) -> list[dict[str, Any]]:
    df = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "events")
        .option("startingOffsets", "earliest")
        .option("watermark.maxOutOfOrderness", "2 seconds")
        .option("checkpointing.location", f"{work}/state")
        .load()
    )
    collected: list[dict[str, Any]] = []
    query = (
        df.writeStream.trigger(availableNow=True)
        .foreachBatch(lambda batch, _: collected.extend(r.asDict() for r in batch.collect()))
        .option("checkpointLocation", f"{work}/checkpoint")
        .start()
    )
    query.awaitTermination()
    return collected
