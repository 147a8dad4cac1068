"""Benchmark: watermark alignment against a backlog skewed in event time.

Run from the repository root: ``python bench/alignment.py [--records N] [--batch B]``.

One partition holds a 10-minute event-time backlog; the others hold as many records spread over
``--span`` minutes, so every batch moves them further ahead in event time than the slow one.
Once a partition has read everything it turns idle (``idleTimeout`` 1 s) and releases the
combined watermark. The same windowed count
(``with_watermark`` -> ``groupBy(window(eventTime, 10 s), partition).count()``, append mode,
``maxOffsetsPerTrigger`` = B, ``Trigger.AvailableNow``) runs twice in one Spark session, without
and with ``watermark.alignment.maxDrift``: the fast partitions' windows stay open while the slow
one holds the combined watermark back, so without alignment Spark's state grows with the skew.
Figures: the peak of the aggregation's state rows (``numRowsTotal``) and the total time of each
run; targets ``peak_state_ratio <= 0.25`` and ``time_ratio <= 1.2``. The last line printed is JSON.

Once the slow partition has caught up, both runs read the fast partitions side by side, aligned
or not, and hold the same state: about two batches' worth of their windows (Spark closes a
window one batch after the batch whose combined watermark passed it), so that steady state is a
floor under the aligned run's peak that alignment cannot lower. ``peak_state_rows_while_behind``
is the peak over the batches planned while the slow partition still had a backlog (read from
the query's offsets log), where the two runs differ. The default ``--batch`` (1,000 records, a
sixth of a partition) keeps a batch small against the skew, as the scenario intends; with
2,000 the steady state alone is a quarter of the unaligned peak.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _common import bench_environment, log, print_result, run_to_end  # noqa: E402

BASE = 1_700_000_000_000
WINDOW = "10 seconds"


def _produce(bootstrap: str, topic: str, partitions: int, records: int, span_ms: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        for p in range(partitions):
            ts = BASE + i * (span_ms if p else 600_000) // records
            producer.produce(topic, key=f"k{i}".encode(), value=b"{}", partition=p, timestamp=ts)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("records not delivered within 120 s")


def _run(spark: Any, env: Any, topic: str, name: str, batch: int, records: int,
         drift: str | None) -> dict[str, float]:
    from pyspark.sql import functions as F

    import flinkish

    reader = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", env.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(batch))
        .option("watermark.maxOutOfOrderness", "1 second")
        .option("idleTimeout", "1 second")
        .option("checkpointing.location", str(env.workdir / f"{name}-state"))
    )
    if drift is not None:
        reader = reader.option("watermark.alignment.maxDrift", drift)
    counts = (flinkish.with_watermark(reader.load())
              .groupBy(F.window("eventTime", WINDOW), "partition").count())
    writer = (counts.writeStream.format("noop").outputMode("append")
              .option("checkpointLocation", str(env.workdir / f"{name}-ck"))
              .trigger(availableNow=True))
    run = run_to_end(writer, f"{name} query", 1800)
    behind = _batches_behind(env.workdir / f"{name}-ck", topic, records)
    peak = behind_peak = 0
    for progress in run.progress:
        rows = max((op.get("numRowsTotal", 0) for op in progress.get("stateOperators", [])),
                   default=0)
        peak = max(peak, rows)
        if progress["batchId"] in behind:
            behind_peak = max(behind_peak, rows)
    log(f"{name}: {run.seconds:.1f} s, {len(run.progress)} batches, peak state rows {peak} "
        f"({behind_peak} while partition 0 had a backlog, batches {min(behind)}-{max(behind)})")
    return {"seconds": run.seconds, "peak_state_rows": float(peak),
            "peak_state_rows_while_behind": float(behind_peak)}


def _batches_behind(checkpoint: Path, topic: str, records: int) -> set[int]:
    """The batches planned while partition 0 had records left: its start offset (the previous
    batch's end in Spark's offsets log; 0 for the first) below ``records``."""
    ends = {}
    for path in (checkpoint / "offsets").iterdir():
        if path.name.isdigit():
            offset = json.loads(path.read_text().splitlines()[-1])
            ends[int(path.name)] = int(offset["topics"][topic]["0"]["offset"])
    return {batch for batch in ends if ends.get(batch - 1, 0) < records}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=6_000, help="records per partition")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--span", type=float, default=60.0,
                        help="minutes of event time the fast partitions' records span")
    parser.add_argument("--drift", default="30 seconds", help="watermark.alignment.maxDrift")
    args = parser.parse_args()

    with bench_environment("flinkish-bench-alignment-") as env:
        from flinkish.demo.embedded_kafka import create_topic

        topics = {name: f"alignment-{name}" for name in ("warmup", "free", "aligned")}
        for topic in topics.values():
            create_topic(env.bootstrap, topic, args.partitions)
            _produce(env.bootstrap, topic, args.partitions, args.records,
                     int(args.span * 60_000))
        spark, _ = env.start_spark("flinkish-bench-alignment", 2)
        import flinkish

        flinkish.register(spark)
        # JVM warm-up, untimed
        _run(spark, env, topics["warmup"], "warmup", args.batch, args.records, None)
        free = _run(spark, env, topics["free"], "without", args.batch, args.records, None)
        aligned = _run(spark, env, topics["aligned"], "with", args.batch, args.records,
                       args.drift)
    print_result({
        "bench": "alignment",
        "records_per_partition": args.records,
        "partitions": args.partitions,
        "max_offsets_per_trigger": args.batch,
        "max_drift": args.drift,
        "peak_state_rows_without": free["peak_state_rows"],
        "peak_state_rows_with": aligned["peak_state_rows"],
        "peak_state_ratio": round(aligned["peak_state_rows"] / max(free["peak_state_rows"], 1), 3),
        "peak_state_rows_while_behind_without": free["peak_state_rows_while_behind"],
        "peak_state_rows_while_behind_with": aligned["peak_state_rows_while_behind"],
        "peak_state_ratio_while_behind": round(
            aligned["peak_state_rows_while_behind"]
            / max(free["peak_state_rows_while_behind"], 1), 3),
        "seconds_without": round(free["seconds"], 2),
        "seconds_with": round(aligned["seconds"], 2),
        "time_ratio": round(aligned["seconds"] / free["seconds"], 3),
        "target_peak_state_ratio": 0.25,
        "target_time_ratio": 1.2,
    })


if __name__ == "__main__":
    main()
