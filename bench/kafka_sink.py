"""Benchmark: Kafka to Kafka through the flinkish sink, exactly-once against at-least-once.

Run from the repository root: ``python bench/kafka_sink.py [--rows N] [--partitions P]
[--epochs E] [--repeat R] [--session plain|demo]``. Progress goes to stderr; the last line on
stdout is one json object of named figures.

What is measured, and how:

* The session is the README's by default (``--session plain``: ``SparkSession.builder
  ...getOrCreate()`` and ``flinkish.register(spark)``); ``--session demo`` is the demo's.
* The embedded Tansu broker is started; ``--rows`` records (a 10-byte key, ``--value-bytes``
  of value) are produced round-robin over ``--partitions`` partitions (not timed).
* One ``Trigger.AvailableNow`` query per mode, the same pipeline: the flinkish source (markers
  on, ``maxOffsetsPerTrigger`` = rows / ``--epochs``, one read task -- hence one write task --
  per partition), ``key``, ``value`` and the marker columns, into
  ``writeStream.format("flinkish")`` with ``target=kafka`` to a fresh topic of
  ``--partitions`` partitions, ``deliveryGuarantee`` ``exactly-once`` (each task produces in a
  transaction of its own and leaves it open; the driver records the decision and commits each
  with EndTxn) or ``at-least-once`` (an idempotent producer, flushed before the task ends).
  ``*_rps`` = rows / seconds from ``writeStream.start()`` to the query's termination (Spark's
  per-query and per-batch costs included; SparkSession start-up and a warm-up query per mode
  are not).
* ``ratio`` = ``exactly_once_rps / at_least_once_rps`` (target >= 0.8).
* ``median_epoch_commit_ms``: for each completed exactly-once epoch, ``completed_ms -
  created_ms`` of its checkpoint record: the decision record's write, the EndTxn of every
  task's transaction, the valve and the completion (not Spark's work around ``commit()``).
* After each query the output topic is read back through the committed view
  (``integration.kafka_committed``): exactly-once must hold exactly ``--rows`` records and no
  open transaction.

Each mode runs ``--repeat`` times (default 3), alternating which goes first; medians are
reported.
"""

from __future__ import annotations

import itertools
import math
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _common import (  # noqa: E402
    bench_environment,
    guarantee_bench_args,
    log,
    median,
    print_result,
    run_to_end,
)

from checkpointing import CheckpointStorage, CheckpointStore  # noqa: E402
from integration.kafka_committed import settled_values  # noqa: E402

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
TARGET_RATIO = 0.8
MARKERS = ("topic", "partition", "offset", "kind", "watermark", "status")


def commit_spans(checkpoint: Path) -> list[int]:
    """decision -> completion ms of every completed epoch in the sink's records."""
    view = CheckpointStore.reader(CheckpointStorage.open(str(checkpoint / "flinkish")))
    spans = []
    for epoch in view.completed_ids():
        record = view.completed(epoch)
        assert record is not None
        spans.append(record.completed_ms - record.created_ms)
    return spans


def run_query(spark: Any, bootstrap: str, source: str, out: str, guarantee: str,
              max_offsets: int, workdir: Path, timeout: float) -> tuple[float, list[int]]:
    """One AvailableNow query from ``source`` into ``out``: (seconds, commit spans)."""
    run = Path(tempfile.mkdtemp(prefix=f"{out}-", dir=workdir))
    df = (spark.readStream.format("flinkish")
          .option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", source)
          .option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", str(max_offsets))
          .option("checkpointing.location", str(run / "source-state"))
          .load())
    writer = (df.select("key", "value", *MARKERS).writeStream.format("flinkish")
              .option("target", "kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("topic", out)
              .option("deliveryGuarantee", guarantee)
              .option("checkpointing.retain", "1000000")
              .option("checkpointLocation", str(run / "checkpoint"))
              .trigger(availableNow=True))
    result = run_to_end(writer, f"{guarantee} query", timeout)
    spans = commit_spans(run / "checkpoint")
    shutil.rmtree(run, ignore_errors=True)
    return result.seconds, spans


def main(argv: Sequence[str] | None = None) -> int:
    from flinkish.demo.embedded_kafka import create_topic

    args = guarantee_bench_args(
        argv, (__doc__ or "").split("\n\n")[0], rows=200_000, partitions=4)
    max_offsets = math.ceil(args.rows / args.epochs)
    seconds: dict[str, list[float]] = {EXACTLY_ONCE: [], AT_LEAST_ONCE: []}
    spans: dict[str, list[int]] = {EXACTLY_ONCE: [], AT_LEAST_ONCE: []}
    with bench_environment("flinkish-kafka-sink-") as env:
        topic, warmup = "bench-in", "bench-in-warmup"
        env.prepare_topics(args.partitions, args.value_bytes, (topic, args.rows),
                           (warmup, args.warmup_rows), "not timed")
        spark, startup = env.start_spark("flinkish-kafka-sink-bench", args.cores, args.session)
        log(f"SparkSession up in {startup:.1f} s")
        outputs = itertools.count()

        def query(source: str, guarantee: str, limit: int, expected: int
                  ) -> tuple[float, list[int]]:
            out = f"bench-out-{next(outputs)}"
            create_topic(env.bootstrap, out, args.partitions)
            took, commit = run_query(spark, env.bootstrap, source, out, guarantee, limit,
                                     env.workdir, args.timeout)
            written = len(settled_values(env.bootstrap, out, args.partitions))
            if written != expected and (guarantee == EXACTLY_ONCE or written < expected):
                raise RuntimeError(f"{guarantee} wrote {written:,} records, expected "
                                   f"{expected:,}")
            log(f"  {guarantee}: {written:,} records in {took:.2f} s = {written / took:,.0f} "
                f"records/s; decision->completion ms {commit}")
            return took, commit

        for guarantee in (EXACTLY_ONCE, AT_LEAST_ONCE):
            log(f"warm-up: {args.warmup_rows:,} rows {guarantee} (not timed)")
            query(warmup, guarantee, math.ceil(args.warmup_rows / 2), args.warmup_rows)
        for run in range(args.repeat):
            order = (AT_LEAST_ONCE, EXACTLY_ONCE) if run % 2 == 0 else (
                EXACTLY_ONCE, AT_LEAST_ONCE)
            for guarantee in order:
                log(f"run {run + 1}/{args.repeat}: {guarantee}, {args.rows:,} rows")
                took, commit = query(topic, guarantee, max_offsets, args.rows)
                seconds[guarantee].append(took)
                spans[guarantee] += commit

    eo = args.rows / median(seconds[EXACTLY_ONCE])
    alo = args.rows / median(seconds[AT_LEAST_ONCE])
    print_result({
        "bench": "kafka_sink",
        "rows": args.rows,
        "partitions": args.partitions,
        "epochs": args.epochs,
        "max_offsets_per_trigger": max_offsets,
        "value_bytes": args.value_bytes,
        "repeat": args.repeat,
        "spark_cores": args.cores,
        "session": args.session,
        "exactly_once_rps": round(eo),
        "at_least_once_rps": round(alo),
        "ratio": round(eo / alo, 3),
        "ratio_runs": [round(a / e, 3) for e, a in zip(
            seconds[EXACTLY_ONCE], seconds[AT_LEAST_ONCE], strict=True)],
        "target_ratio": TARGET_RATIO,
        "median_epoch_commit_ms": median(spans[EXACTLY_ONCE]),
        "epoch_commit_ms": spans[EXACTLY_ONCE],
        "at_least_once_median_epoch_commit_ms": median(spans[AT_LEAST_ONCE]),
        "exactly_once_seconds": [round(s, 3) for s in seconds[EXACTLY_ONCE]],
        "at_least_once_seconds": [round(s, 3) for s in seconds[AT_LEAST_ONCE]],
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
