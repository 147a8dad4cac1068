"""Benchmark: the flinkish source's per-batch cost as the number of Kafka partitions grows.

Run from the repository root: ``python bench/scale.py [--partitions 8,64,256,1024]
[--rows-per-batch N] [--batches B]``. Progress goes to stderr; the last line on stdout is one
json object of named figures.

What is measured, and why:

* For each partition count P the script creates a topic of P partitions on the embedded Tansu
  broker (``flinkish.demo.embedded_kafka``) and produces ``--rows-per-batch`` x ``--batches``
  records of ``--value-bytes`` round-robin over its partitions (not timed), so every batch
  reads the same number of rows whatever P: at 8 partitions a batch holds a large slice per
  partition, at 1024 a few records per partition. A real topic's trickle of data spread over
  hundreds of partitions is the case this exercises.
* One ``Trigger.AvailableNow`` query of the flinkish source (markers on,
  ``watermark.maxOutOfOrderness`` 2 seconds, ``maxOffsetsPerTrigger`` = ``--rows-per-batch``, a
  fresh ``checkpointing.location``, the default ``maxReadTasks``) runs into Spark's ``noop``
  sink. From its progress reports the script takes each batch's ``durationMs``; a batch that
  read a full ``--rows-per-batch`` of records is a data batch (the query's last batches only
  carry the combined watermark). ``trigger_ms_by_partitions`` is, per P, the median
  ``triggerExecution`` of the data batches: what one micro-batch costs, planning
  (``latestOffset``), reading and Spark's own bookkeeping included. The medians of the
  ``latestOffset`` and ``addBatch`` phases are reported beside it.
* ``ratio_256_vs_8`` = trigger ms at 256 partitions / trigger ms at 8; the target is <= 2
  (before read tasks it was ~15: one Spark task, one consumer and one state file per partition
  and batch). 1024 partitions must run.
* A warm-up query (another topic, same shape as the smallest P) runs first, so JVM class loading
  and Python worker start-up are not in any figure. SparkSession start-up is not timed.

The broker, the Spark session and its JVM are stopped on every exit path, including errors and
SIGTERM. Run it on a quiet machine: the figures are wall-clock times on shared cores.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import (  # noqa: E402
    CpuMeter,
    bench_environment,
    log,
    median,
    print_result,
    produce,
    run_to_end,
)

MAX_OUT_OF_ORDERNESS = "2 seconds"
TARGET_RATIO = 2.0


def run_query(spark: Any, bootstrap: str, topic: str, rows_per_batch: int, workdir: Path,
              timeout: float, extra: dict[str, str]) -> list[dict[str, Any]]:
    """One AvailableNow query into noop; the progress reports of its batches."""
    run = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    reader = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("watermark.maxOutOfOrderness", MAX_OUT_OF_ORDERNESS)
        .option("maxOffsetsPerTrigger", str(rows_per_batch))
        .option("checkpointing.location", str(run / "state"))
    )
    for key, value in extra.items():
        reader = reader.option(key, value)
    writer = (
        reader.load().writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(run / "checkpoint"))
    )
    try:
        result = run_to_end(writer, f"flinkish query on {topic}", timeout)
    finally:
        shutil.rmtree(run, ignore_errors=True)
    return [dict(p) for p in result.progress]


def summarise(progress: list[dict[str, Any]], rows_per_batch: int) -> dict[str, Any]:
    """Median phase durations (ms) over the batches that read a full batch of records."""
    data = [p for p in progress if int(p["numInputRows"]) >= rows_per_batch]
    if not data:
        raise RuntimeError(f"no batch read {rows_per_batch} rows: {progress}")
    phases = ("triggerExecution", "latestOffset", "addBatch", "queryPlanning", "walCommit",
              "commitOffsets")
    out: dict[str, Any] = {"data_batches": len(data), "batches": len(progress)}
    for phase in phases:
        values = [float(p["durationMs"].get(phase, 0)) for p in data]
        out[f"{phase}_ms"] = round(median(values), 1)
    out["trigger_ms_runs"] = [int(p["durationMs"]["triggerExecution"]) for p in data]
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="8,64,256,1024",
                        help="comma-separated partition counts")
    parser.add_argument("--rows-per-batch", type=int, default=5_120,
                        help="records per micro-batch (maxOffsetsPerTrigger)")
    parser.add_argument("--batches", type=int, default=8, help="data batches per query")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--cores", type=int, default=2, help="Spark's local[N]")
    parser.add_argument("--max-read-tasks", type=int, default=None,
                        help="the source's maxReadTasks (default: the source's default)")
    parser.add_argument("--timeout", type=float, default=1_800, help="seconds per query")
    args = parser.parse_args(argv)
    args.counts = [int(p) for p in args.partitions.split(",") if p.strip()]
    if not args.counts or min(args.counts) < 1 or args.rows_per_batch < max(args.counts):
        parser.error("--partitions must be positive and --rows-per-batch at least the largest")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    extra = {} if args.max_read_tasks is None else {"maxReadTasks": str(args.max_read_tasks)}
    records = args.rows_per_batch * args.batches
    results: dict[int, dict[str, Any]] = {}
    with bench_environment("flinkish-scale-") as env:
        from flinkish.demo.embedded_kafka import create_topic

        topics: dict[str, int] = {}
        for count in [min(args.counts), *args.counts]:
            name = f"scale-{count}-{len(topics)}"
            create_topic(env.bootstrap, name, count)
            rate = produce(env.bootstrap, name, records, count, args.value_bytes)
            log(f"{name}: {records:,} x {args.value_bytes} B over {count} partitions "
                f"({rate:,.0f} msg/s, not timed)")
            topics[name] = count
        spark, startup = env.start_spark("flinkish-scale", args.cores)
        log(f"SparkSession up in {startup:.1f} s")
        (warmup, *measured) = topics
        run_query(spark, env.bootstrap, warmup, args.rows_per_batch, env.workdir,
                  args.timeout, extra)
        log("warm-up query done (not timed)")
        for name in measured:
            count = topics[name]
            with CpuMeter() as cpu:
                progress = run_query(spark, env.bootstrap, name, args.rows_per_batch,
                                     env.workdir, args.timeout, extra)
            summary = summarise(progress, args.rows_per_batch)
            summary["cpu_seconds"] = cpu.seconds
            results[count] = summary
            log(f"{count} partitions: median trigger {summary['triggerExecution_ms']} ms "
                f"(latestOffset {summary['latestOffset_ms']} ms, addBatch "
                f"{summary['addBatch_ms']} ms) over {summary['data_batches']} data batches "
                f"of {len(progress)}; per batch: {summary['trigger_ms_runs']}; CPU {cpu.seconds}")

    trigger = {str(c): results[c]["triggerExecution_ms"] for c in sorted(results)}
    ratio = (results[256]["triggerExecution_ms"] / results[8]["triggerExecution_ms"]
             if 256 in results and 8 in results else None)
    print_result({
        "bench": "scale",
        "rows_per_batch": args.rows_per_batch,
        "data_batches": args.batches,
        "value_bytes": args.value_bytes,
        "spark_cores": args.cores,
        "max_read_tasks": args.max_read_tasks or "default (the driver's cores)",
        "trigger_ms_by_partitions": trigger,
        "ratio_256_vs_8": None if ratio is None else round(ratio, 2),
        "target_ratio_256_vs_8": TARGET_RATIO,
        "latest_offset_ms_by_partitions": {
            str(c): results[c]["latestOffset_ms"] for c in sorted(results)},
        "add_batch_ms_by_partitions": {
            str(c): results[c]["addBatch_ms"] for c in sorted(results)},
        "details": {str(c): results[c] for c in sorted(results)},
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
