"""Runs flinkish source -> ValveForEachBatch to the end of what Kafka holds, appending one JSON
line per delivered epoch to OUT. Started as a subprocess so a test can kill it mid-stream."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flinkish.demo.spark_session import local_session
from flinkish.foreach_batch import ValveForEachBatch, WatermarkedBatch


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "topic", "checkpoint", "out"):
        parser.add_argument(name)
    args = parser.parse_args()
    spark = local_session("flinkish-valve-query")
    df = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .option("watermark.maxOutOfOrderness", "1 second")
        .option("idleTimeout", "1 ms")
        .option("checkpointing.location", args.checkpoint + "/source-state")
        .load()
    )

    def deliver(batch: WatermarkedBatch) -> None:
        late: list[Any] = [r.key.decode() for r in batch.late.select("key").collect()]
        with open(args.out, "a") as out:
            out.write(json.dumps({
                "epoch": batch.epoch, "watermark": batch.watermark.watermark,
                "status": batch.watermark.status, "rows": batch.rows,
                "late_rows": batch.late_rows, "late": sorted(late),
                "idle": batch.watermark.idle_partitions,
            }) + "\n")

    query = (
        df.writeStream.trigger(availableNow=True)
        .foreachBatch(ValveForEachBatch(deliver, args.checkpoint))
        .option("checkpointLocation", args.checkpoint)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
