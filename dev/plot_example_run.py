"""Draws docs/images/lagging-and-idle-partitions.png from a real run: a windowed count after
``flinkish.with_watermark`` over four partitions, one three minutes behind in event time, one
silent after its first 40 seconds, on the embedded broker and PostgreSQL, then ``flinkish
inspect --plot`` of its checkpoint. Takes about two minutes: ``.venv/bin/python
dev/plot_example_run.py``."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import functions as F

import flinkish
from flinkish.cli import main as flinkish_cli
from flinkish.demo.embedded_kafka import EmbeddedKafka, create_topic
from flinkish.demo.embedded_postgres import EmbeddedPostgres
from flinkish.demo.spark_session import local_session

PICTURE = Path(__file__).resolve().parents[1] / "docs/images/lagging-and-idle-partitions.png"
START = 1_700_000_040_000  # event time of the first click, on a minute
BURSTS = 45  # one a second, each ten seconds of event time per partition
SILENT_AFTER_S = 40  # partition 2's last click
BEHIND_MS = 180_000  # partition 3's lag


def produce(producer: Producer, burst: int) -> None:
    for second in range(burst * 10, burst * 10 + 10):
        for partition in range(4):
            if partition == 2 and second >= SILENT_AFTER_S:
                continue
            behind = BEHIND_MS if partition == 3 else 0
            producer.produce("clicks", value=b"click", partition=partition,
                             timestamp=START + second * 1000 - behind)
    producer.flush()


def run(workdir: str) -> None:
    with EmbeddedKafka() as kafka, EmbeddedPostgres() as postgres:
        create_topic(kafka.bootstrap_servers, "clicks", 4)
        spark = local_session("plot-example-run")
        flinkish.register(spark)
        events = (spark.readStream.format("flinkish")
                  .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                  .option("subscribe", "clicks").option("startingOffsets", "earliest")
                  .option("watermark.maxOutOfOrderness", "2 seconds")
                  .option("idleTimeout", "3 seconds")
                  .option("checkpointing.location", f"{workdir}/source-state").load())
        counts = (flinkish.with_watermark(events)
                  .groupBy(F.window("eventTime", "1 minute"), "partition").count())
        query = (counts.writeStream.outputMode("append").format("flinkish")
                 .option("target", "postgres").option("dsn", postgres.dsn)
                 .option("table", "clicks_per_minute")
                 .option("checkpointLocation", f"{workdir}/ck")
                 .trigger(processingTime="1 second").start())
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
        for burst in range(BURSTS):
            produce(producer, burst)
            time.sleep(1)
        clicks = 3 * BURSTS * 10 + SILENT_AFTER_S
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # every click read, and every partition idle
            progress = query.lastProgress or {}
            end = (progress.get("sources") or [{}])[0].get("endOffset") or "{}"
            partitions = json.loads(end).get("topics", {}).get("clicks", {})
            read = sum(int(p["offset"]) for p in partitions.values())
            if read >= clicks and all(p.get("status") == "IDLE" for p in partitions.values()):
                break
            time.sleep(1)
        query.stop()
        spark.stop()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as workdir:
        run(workdir)
        sys.exit(flinkish_cli(["inspect", f"{workdir}/ck", "--plot", str(PICTURE)]))
