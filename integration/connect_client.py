"""A Spark Connect client running flinkish queries, in a process of its own (no JVM here: every
flinkish call goes through the Connect server, see ``integration/connect_server.py``).

    python -m integration.connect_client --port N --jobs jobs.json

Protocol on stdout (one JSON object a line) and stdin:

1. connects, calls ``flinkish.register`` and prints ``{"session": [user_id, session_id],
   "connect": true, "register_s": …}``;
2. waits for a line on stdin, then starts every job at once, each from its own thread behind
   one barrier, runs each to its end and prints one result line per job (``{"name": …, "ok": …,
   "error": …, "stopped_after": …}``) and then ``{"done": true}``;
3. stops the session and exits when stdin closes.

``jobs.json`` is a list of objects: ``name``, ``bootstrap``, ``topic``, ``checkpoint``,
``kind`` (``records`` or ``windowed`` into the flinkish sink, ``valve`` through
``ValveForEachBatch``), ``target`` and its ``dsn``/``table`` or ``path`` (the sink's, or for
``valve`` the file each delivered epoch is appended to), ``max_offsets``, and optionally
``stop_after``: run with a processing-time trigger (every ``interval``, default 0 seconds), stop
the query once that batch has committed, then start it again from its checkpoint and run it to
the end; ``group``: the query's ``kafka.group.id``, which must hold the end offsets of batch
``stop_after`` before the query is stopped (reported as ``group_before_stop``); ``options``:
more source options (e.g. a secured cluster's ``kafka.*`` settings).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback
from typing import Any

from flinkish.demo.spark_session import worker_start_timed_out
from flinkish.foreach_batch import WatermarkedBatch

TIMEOUT_S = 300.0
#: Spark gives a new Python process a fixed 10 s to connect back
#: (``PythonWorkerFactory.createSimpleWorker``): the foreachBatch runner Connect starts with a
#: query, the source's runner. Queries started together on 2 busy cores can overrun it before
#: their first batch; such a query is started again from its checkpoint, up to this many times
#: (as ``sink_query.py --retry-transient`` does), after a pause that grows with each retry: the
#: queries started with it are busy starting too, and an immediate retry meets the same load
#: (a CI run saw a query's four starts in a row miss the 10 s).
WORKER_RETRIES = 3
RETRY_PAUSE_S = 5.0


class EpochLog:
    """``ValveForEachBatch``'s function: appends what each delivered epoch held to a file. On
    Connect it runs in a Python process of the server, so it must be importable there."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, batch: WatermarkedBatch) -> None:
        records = [[r.partition, r.offset]
                   for r in batch.records.select("partition", "offset").collect()]
        with open(self.path, "a") as out:
            out.write(json.dumps({
                "epoch": batch.epoch, "rows": batch.rows, "late_rows": batch.late_rows,
                "watermark": batch.combined_watermark, "records": records,
            }) + "\n")


def _start(spark: Any, job: dict[str, Any], available_now: bool) -> Any:
    from pyspark.sql import functions as F

    import flinkish
    from flinkish import ValveForEachBatch

    df = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", job["bootstrap"])
        .option("subscribe", job["topic"])
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")  # bounded: the last windows close too
        .option("maxOffsetsPerTrigger", str(job["max_offsets"]))
        .option("watermark.maxOutOfOrderness", "1 second")
        .option("checkpointing.location", job["checkpoint"] + "-source-state")
        .option("kafkaConsumer.pollTimeoutMs", "20000")
        .options(**job.get("options", {}))
    )
    if job.get("group"):
        df = df.option("kafka.group.id", job["group"])
    df = df.load()
    if job["kind"] == "valve":
        writer = df.writeStream.foreachBatch(
            ValveForEachBatch(EpochLog(job["path"]), job["checkpoint"]))
    else:
        if job["kind"] == "windowed" and job.get("windows") == "flinkish":
            from flinkish import windows

            fired = windows.window(flinkish.with_watermark(df), key="partition",
                                   assigner=windows.tumbling("10 seconds"),
                                   aggregate=windows.Count())
            df = fired.select("window_start", "window_end", "partition",
                              F.col("result").alias("count"))
        elif job["kind"] == "windowed":
            counts = flinkish.with_watermark(df).groupBy(
                F.window("eventTime", "10 seconds"), "partition").count()
            df = counts.select(F.col("window.start").alias("window_start"),
                               F.col("window.end").alias("window_end"), "partition", "count")
        writer = df.writeStream.format("flinkish").outputMode("append").option(
            "target", job["target"])
        for key in ("dsn", "table", "path"):
            if job.get(key):
                writer = writer.option(key, job[key])
        writer = writer.options(**job.get("sink_options", {}))
    writer = writer.option("checkpointLocation", job["checkpoint"]).queryName(job["name"])
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=job.get("interval", "0 seconds")).start()


def _group_holds_last_epoch(job: dict[str, Any], query: Any, deadline: float) -> bool:
    """Whether the job's consumer group comes to hold the end offsets of the query's last
    batch before ``deadline``."""
    from confluent_kafka import Consumer, TopicPartition

    from flinkish.lag import end_offsets

    [end] = end_offsets(json.loads(query.lastProgress.json))
    wanted = {(t, int(p)): pos["offset"] for t, parts in end["topics"].items()
              for p, pos in parts.items()}
    consumer = Consumer({"bootstrap.servers": job["bootstrap"], "group.id": job["group"],
                         "enable.auto.commit": False})
    try:
        while time.monotonic() < deadline:
            got = consumer.committed([TopicPartition(t, p) for t, p in wanted], timeout=30)
            if {(tp.topic, tp.partition): tp.offset for tp in got} == wanted:
                return True
            time.sleep(0.2)
    finally:
        consumer.close()
    return False


class _Retries:
    """Starts of a job's queries again after a Python process missed Spark's 10 s to connect
    back (``WORKER_RETRIES`` in all)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job, self.used = job, 0

    def allows(self, failure: BaseException | None) -> bool:
        """Whether a query that failed with ``failure`` is to be started again (said on
        stderr)."""
        if self.used >= WORKER_RETRIES or not worker_start_timed_out(failure):
            return False
        self.used += 1
        pause = RETRY_PAUSE_S * self.used
        print(f"query {self.job['name']}: a Python process did not connect back in time; "
              f"starting it again from its checkpoint in {pause:.0f} s "
              f"({self.used}/{WORKER_RETRIES})", file=sys.stderr, flush=True)
        time.sleep(pause)
        return True

    def start(self, spark: Any, available_now: bool) -> Any:
        while True:
            try:
                return _start(spark, self.job, available_now)
            except Exception as exc:
                if not self.allows(exc):
                    raise


def _run(spark: Any, job: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Run one job to its end (stopped and restarted first with ``stop_after``)."""
    result: dict[str, Any] = {"name": job["name"], "ok": False, "error": None}
    retries = _Retries(job)
    try:
        if job.get("stop_after") is not None:
            query = retries.start(spark, available_now=False)
            while time.monotonic() < deadline:
                progress = query.lastProgress
                if progress and progress["batchId"] >= job["stop_after"]:
                    break
                if not query.isActive:
                    if retries.allows(query.exception()):
                        query = retries.start(spark, available_now=False)
                        continue
                    raise RuntimeError(f"ended before batch {job['stop_after']}: "
                                       f"{query.exception()}")
                time.sleep(0.2)
            else:
                raise TimeoutError(f"batch {job['stop_after']} not committed in time")
            if job.get("group"):
                result["group_before_stop"] = _group_holds_last_epoch(
                    job, query, min(deadline, time.monotonic() + 60))
            query.stop()
            result["stopped_after"] = query.lastProgress["batchId"]
        while True:
            query = retries.start(spark, available_now=True)
            try:
                finished = query.awaitTermination(max(1.0, deadline - time.monotonic()))
            except Exception as exc:
                if retries.allows(exc):
                    continue
                raise
            if not finished:
                query.stop()
                raise TimeoutError("did not finish in time")
            break
        result["ok"] = True
    except Exception as exc:  # reported to the test with the others' outcomes
        result["error"] = "".join(traceback.format_exception_only(type(exc), exc))[:4000]
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--jobs", required=True)
    args = parser.parse_args()
    with open(args.jobs) as f:
        jobs: list[dict[str, Any]] = json.load(f)

    from pyspark.sql import SparkSession

    import flinkish
    from flinkish.connect import is_connect

    spark: Any = SparkSession.builder.remote(f"sc://127.0.0.1:{args.port}").getOrCreate()
    try:
        began = time.monotonic()
        flinkish.register(spark)
        print(json.dumps({"session": [spark._client._user_id or "", spark.session_id],
                          "connect": is_connect(spark),
                          "register_s": round(time.monotonic() - began, 2)}), flush=True)
        sys.stdin.readline()
        deadline = time.monotonic() + TIMEOUT_S
        barrier = threading.Barrier(len(jobs))
        results: list[dict[str, Any]] = [{} for _ in jobs]

        def run(i: int) -> None:
            barrier.wait(60)
            results[i] = _run(spark, jobs[i], deadline)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for result in results:
            print(json.dumps(result), flush=True)
        print(json.dumps({"done": True}), flush=True)
        sys.stdin.read()  # until the test closes stdin
    finally:
        for query in spark.streams.active:
            query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
