"""The demo's streaming query, run as its own process so the demo can kill it like a crash:
flinkish source -> flinkish two-phase-commit sink. Stops gracefully when STOP_FILE appears."""

from __future__ import annotations

import argparse
import os
import time

from flinkish.demo.spark_session import local_session


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("checkpoint")
    parser.add_argument("stop_file")
    parser.add_argument("--parquet")
    parser.add_argument("--postgres")
    parser.add_argument("--table", default="demo_events")
    args = parser.parse_args()

    spark = local_session("flinkish-demo-query")
    events = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("watermark.maxOutOfOrderness", "2 seconds")
        .option("idleTimeout", "2 seconds")
        .option("maxOffsetsPerTrigger", "5000")
        .option("checkpointing.location", os.path.join(args.checkpoint, "source-state"))
        .load()
        .selectExpr("CAST(value AS STRING) AS event", "topic", "partition", "offset",
                    "eventTime", "kind", "watermark", "status")
    )
    writer = (
        events.writeStream.format("flinkish")
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="1 second")
    )
    if args.postgres:
        writer = writer.option("target", "postgres").option("dsn", args.postgres).option(
            "table", args.table)
    else:
        writer = writer.option("target", "parquet").option("path", args.parquet)
    query = writer.start()
    while query.isActive and not os.path.exists(args.stop_file):
        time.sleep(0.2)
    query.stop()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    spark.stop()


if __name__ == "__main__":
    main()
