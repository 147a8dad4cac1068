"""The demo's streaming queries, run as their own process so the demo can kill them like a crash.
Stops gracefully when STOP_FILE appears.

``events`` writes every record through the two-phase-commit sink; with ``--windows DIR`` two
windowed counts (``flinkish`` on the combined watermark, ``spark`` on Spark's own) write their
window rows through the flinkish sink to ``DIR/<name>/output`` and their progress reports to
``DIR/<name>/progress.jsonl`` as Spark reports them, so a killed run leaves those of the batches
it finished. The queries start one after another (many at once on 2 busy cores can make Spark
time out waiting for Python workers); one that fails only because a new Python worker did not
connect back in time is started again from its checkpoint, up to :data:`RETRIES` times.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from flinkish.demo.spark_session import local_session, worker_start_timed_out

#: The windowed counts' names (their directories under ``--windows``).
WINDOW_QUERIES = ("flinkish", "spark")
WINDOW = "10 seconds"
SPARK_DELAY = "2 seconds"  # Spark's withWatermark delay: the source's maxOutOfOrderness
TRIGGER = "1 second"
RETRIES = 20


def source(spark: Any, args: argparse.Namespace, state: str) -> Any:
    return spark.readStream.format("flinkish").options(**{
        "kafka.bootstrap.servers": args.bootstrap, "subscribe": args.topic,
        "startingOffsets": "earliest", "watermark.maxOutOfOrderness": SPARK_DELAY,
        "idleTimeout": args.idle_timeout, "maxOffsetsPerTrigger": "5000",
        "checkpointing.location": state}).load()


def windowed(events: Any, name: str) -> Any:
    """The window rows of one of the two counts (window bounds flattened for Parquet)."""
    from pyspark.sql import functions as F

    import flinkish

    if name == "flinkish":
        timed = flinkish.with_watermark(events)
    else:
        timed = events.filter("kind = 'record'").withWatermark("eventTime", SPARK_DELAY)
    counts = timed.groupBy(F.window("eventTime", WINDOW), "partition").count()
    return counts.select(F.col("window.start").alias("window_start"),
                         F.col("window.end").alias("window_end"), "partition", "count")


class ProgressFiles:
    """Appends each followed query's progress reports to its file as Spark reports them."""

    def __init__(self, spark: Any) -> None:
        from flinkish.listeners import progress_listener

        self._lock = threading.Lock()
        self._files: dict[str, str] = {}
        self._early: dict[str, list[str]] = {}  # reports of a query before it is followed
        spark.streams.addListener(progress_listener(self.write))

    def write(self, report: dict[str, Any]) -> None:
        line = json.dumps(report) + "\n"
        query_id = str(report["id"])
        with self._lock:
            path = self._files.get(query_id)
            if path is None:
                self._early.setdefault(query_id, []).append(line)
                return
            with open(path, "a", encoding="utf-8") as f:
                f.write(line)

    def follow(self, query: Any, path: str) -> None:
        with self._lock:
            self._files[str(query.id)] = path
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(self._early.pop(str(query.id), []))

    def finish(self, query: Any) -> None:
        """Spark's reports once more at a graceful stop: the listener's last may be on its way."""
        for report in query.recentProgress:
            self.write(json.loads(report.json))


def _started(query: Any) -> bool:
    """Past its start-up: its source is initialised, so it plans or runs batches."""
    return bool(query.recentProgress) or query.status["message"].startswith(
        ("Getting offsets", "Processing", "Waiting"))


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "topic", "checkpoint", "stop_file"):
        parser.add_argument(name)
    parser.add_argument("--parquet")
    parser.add_argument("--postgres")
    parser.add_argument("--table", default="demo_events")
    parser.add_argument("--windows", help="run the two windowed counts, writing under DIR")
    parser.add_argument("--idle-timeout", dest="idle_timeout", default="2 seconds")
    parser.add_argument("--ready-file", dest="ready_file",
                        help="created once the SparkSession is up, before any query starts")
    args = parser.parse_args()

    spark = local_session("flinkish-demo-query")
    import flinkish

    flinkish.register(spark)
    if args.ready_file:
        with open(args.ready_file, "w", encoding="utf-8") as ready:
            ready.write("ready")
    progress = ProgressFiles(spark) if args.windows else None

    def events() -> Any:
        rows = source(spark, args, os.path.join(args.checkpoint, "source-state")).selectExpr(
            "CAST(value AS STRING) AS event", "topic", "partition", "offset", "eventTime",
            "kind", "watermark", "status")
        writer = (rows.writeStream.format("flinkish").queryName("events")
                  .option("checkpointLocation", args.checkpoint).trigger(processingTime=TRIGGER))
        if args.postgres:
            return writer.options(target="postgres", dsn=args.postgres, table=args.table).start()
        return writer.options(target="parquet", path=args.parquet).start()

    def windows(name: str) -> Any:
        home = os.path.join(args.windows, name)
        os.makedirs(home, exist_ok=True)
        query = (
            windowed(source(spark, args, os.path.join(home, "source-state")), name)
            .writeStream.format("flinkish").queryName(f"windows-{name}").outputMode("append")
            .options(checkpointLocation=os.path.join(home, "checkpoint"), target="parquet",
                     path=os.path.join(home, "output"))
            .trigger(processingTime=TRIGGER).start())
        assert progress is not None
        progress.follow(query, os.path.join(home, "progress.jsonl"))
        return query

    starts: dict[str, Callable[[], Any]] = {"events": events, **{
        name: functools.partial(windows, name) for name in WINDOW_QUERIES if args.windows}}
    queries: dict[str, Any] = {}
    retries: dict[str, int] = {}
    failures: list[str] = []
    while not failures and not os.path.exists(args.stop_file):
        for name, query in list(queries.items()):
            if query.isActive:
                continue
            failure = query.exception()
            if worker_start_timed_out(failure) and retries.get(name, 0) < RETRIES:
                retries[name] = retries.get(name, 0) + 1
                print(f"query {name}: a Python worker did not connect back in time; starting "
                      f"it again from its checkpoint (retry {retries[name]})", flush=True)
                time.sleep(min(10, 2 * retries[name]))  # let a burst of load pass
                queries[name] = starts[name]()
            else:
                failures.append(f"{name}: {failure}")
        waiting = [n for n in starts if n not in queries]
        if waiting and not failures and all(_started(q) for q in queries.values()):
            queries[waiting[0]] = starts[waiting[0]]()
        time.sleep(0.2)
    try:
        for name, query in queries.items():
            query.stop()
            if progress is not None and name != "events":
                progress.finish(query)
    finally:
        spark.stop()
    if failures:
        raise SystemExit("query failed: " + "; ".join(failures))


if __name__ == "__main__":
    main()
