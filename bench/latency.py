"""Benchmark: end-to-end latency of a steady stream, record produced -> row visible in
PostgreSQL through the exactly-once sink.

Run from the repository root: ``python bench/latency.py [--rate 1000] [--partitions 4]
[--warmup 20] [--seconds 40] [--linger-ms 5] [--session plain|demo]``.

Why: a streaming source is judged by how soon a record reaches the sink under a steady
producer, not only by throughput; planning that waits on the brokers (a high-watermark probe
that needs a quiet partition, say) shows up here and nowhere else.

* The embedded broker and PostgreSQL (``bench/_common.bench_environment``), one topic of
  ``--partitions`` partitions, a local SparkSession: the README's by default (``--session
  plain``: ``SparkSession.builder...getOrCreate()`` and ``flinkish.register``), the demo's
  with ``--session demo``.
* A producer thread writes ``--rate`` records per second round-robin over the partitions with
  ``linger.ms=5``, the default of librdkafka and of Kafka 4's Java producer, so what a user's
  producer sends (``--linger-ms 0``: every record a produce request of its own, which the
  embedded broker sharing the 2 cores answers more slowly at 1,000 records/s and cannot keep
  up with at 10,000), noting when each record was handed to the producer and when the broker
  acknowledged it (its delivery report: by partition and offset).
* One query, the flinkish source (default options, ``startingOffsets=latest``) into the
  flinkish sink (``target=postgres``, exactly-once), trigger ``processingTime=0``.
* A poller asks PostgreSQL every 20 ms for each partition's highest offset; every offset up
  to it became visible then. Records produced during the first ``--warmup`` seconds are not
  counted (JVM and Python workers warming up), nor those of the last two seconds (the stream
  stops with them).

The last stdout line is one json object: ``p50_ms``, ``p99_ms``, ``max_ms`` over the measured
records (handed to the producer -> visible), ``ack_p50_ms``/``ack_p99_ms``/``ack_max_ms`` (handed
-> acknowledged by the broker: the broker's share, nothing of flinkish's) and
``after_ack_p50_ms``/``after_ack_p99_ms`` (acknowledged -> visible: the source, Spark and the
sink), ``records``, ``max_latest_offset_ms`` (the longest ``durationMs.latestOffset`` of the
query's planning over the measured window), ``batches`` and ``batch_ms_median`` (the median of
each ``durationMs`` phase), the targets and whether they were met, ``busy_machine`` (other
Java processes were running: the figure is from a shared machine) and ``load_1min`` (the
machine's load average before and after the run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
from _common import bench_environment, log, print_result  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

TARGET_P99_MS = 1_000
TARGET_PLANNING_MS = 1_000
TABLE = "latency"
#: how often the poller asks PostgreSQL for the highest offsets
POLL_S = 0.02


class SteadyProducer(threading.Thread):
    """``rate`` records per second, round-robin over the partitions, ``linger.ms`` as given;
    ``sent[(partition, offset)]`` is the monotonic time the record was handed over,
    ``acked[(partition, offset)]`` the time its delivery report came (the thread serves the
    reports every millisecond)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int,
                 linger_ms: int) -> None:
        super().__init__(name="steady-producer", daemon=True)
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms,
                                   "acks": "all"})
        self._topic, self._partitions, self._rate = topic, partitions, rate
        self.sent: dict[tuple[int, int], float] = {}
        self.acked: dict[tuple[int, int], float] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        started, n = time.monotonic(), 0
        while not self.stopping.is_set():
            due = int((time.monotonic() - started) * self._rate)
            while n < due:
                handed = time.monotonic()
                try:
                    self._producer.produce(
                        self._topic, value=b"%020d" % n, key=b"k%09d" % n,
                        partition=n % self._partitions,
                        on_delivery=lambda err, msg, t=handed: self._delivered(err, msg, t))
                except BufferError:  # librdkafka's queue is full: let deliveries drain it
                    self._producer.poll(0.01)
                    continue
                n += 1
            self._producer.poll(0)
            time.sleep(0.001)
        self._producer.flush(30)

    def _delivered(self, err: Any, msg: Any, handed: float) -> None:
        if err is None:
            key = (msg.partition(), msg.offset())
            self.sent[key] = handed
            self.acked[key] = time.monotonic()


class VisibilityPoller(threading.Thread):
    """Records, per partition and offset, the first poll that saw it in the table."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="visibility-poller", daemon=True)
        self._dsn = dsn
        self.seen: dict[tuple[int, int], float] = {}
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._poll()
        except BaseException as exc:  # reported by the main thread, which stops the run
            self.error = exc

    def _poll(self) -> None:
        highest: dict[int, int] = {}
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self.stopping.is_set():
                try:
                    rows = conn.execute(
                        f'SELECT "partition", max("offset") FROM "{TABLE}" '
                        "GROUP BY 1").fetchall()
                except psycopg.errors.UndefinedTable:
                    rows = []  # the sink creates the table with its first batch
                now = time.monotonic()
                for partition, top in rows:
                    for offset in range(highest.get(partition, -1) + 1, top + 1):
                        self.seen[(partition, offset)] = now
                    highest[partition] = max(highest.get(partition, -1), top)
                time.sleep(POLL_S)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def java_processes() -> int:
    """Java processes on the machine (before the bench starts its own: someone else's Spark)."""
    out = subprocess.run(["ps", "-eo", "comm"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.strip() == "java")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=1_000, help="records per second")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=20, help="seconds not measured")
    parser.add_argument("--seconds", type=float, default=40, help="seconds measured")
    parser.add_argument("--linger-ms", type=int, default=5,
                        help="the producer's linger.ms (librdkafka's and Kafka 4's default)")
    parser.add_argument("--cores", type=int, default=2, help="Spark's local[N]")
    parser.add_argument("--session", choices=("plain", "demo"), default="plain",
                        help="plain: the README's session; demo: the demo's and the tests'")
    args = parser.parse_args(argv)
    if min(args.rate, args.partitions, args.seconds) <= 0 or min(args.warmup,
                                                                  args.linger_ms) < 0:
        parser.error("--rate, --partitions, --seconds must be positive, --warmup and "
                     "--linger-ms >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    busy = java_processes()
    load_before = os.getloadavg()[0]
    if busy:
        log(f"{busy} other Java process(es) running: the figures are from a shared machine")
    with bench_environment("flinkish-latency-", postgres=True) as env:
        from flinkish.demo.embedded_kafka import create_topic

        topic = "bench-latency"
        create_topic(env.bootstrap, topic, args.partitions)
        spark, startup = env.start_spark("flinkish-latency-bench", args.cores,
                                         args.session)
        log(f"SparkSession up in {startup:.1f} s")
        df = (
            spark.readStream.format("flinkish")
            .option("kafka.bootstrap.servers", env.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "latest")
            .option("checkpointing.location", str(env.workdir / "source-state"))
            .load()
        )
        query = (
            df.writeStream.format("flinkish")
            .option("target", "postgres")
            .option("dsn", env.dsn)
            .option("table", TABLE)
            .option("checkpointLocation", str(env.workdir / "checkpoint"))
            .trigger(processingTime="0 seconds")
            .start()
        )
        producer = SteadyProducer(env.bootstrap, topic, args.partitions, args.rate,
                                  args.linger_ms)
        poller = VisibilityPoller(env.dsn)
        try:
            while query.lastProgress is None:  # the query planned its first batch
                if query.exception() is not None:
                    raise RuntimeError(f"the query failed: {query.exception()}")
                time.sleep(0.1)
            poller.start()
            producer.start()
            begun = time.monotonic()
            log(f"producing {args.rate}/s over {args.partitions} partitions; warm-up "
                f"{args.warmup:g} s, then {args.seconds:g} s measured")
            measured_from = begun + args.warmup
            measured_to = measured_from + args.seconds
            wall_from = time.time() + args.warmup
            while time.monotonic() < measured_to:
                if poller.error is not None or query.exception() is not None:
                    raise RuntimeError(f"the poller or the query failed: "
                                       f"{poller.error or query.exception()}")
                time.sleep(0.5)
            producer.stopping.set()
            producer.join()
            # the records of the measured window reach the table, or the run says how many did
            deadline = time.monotonic() + 60
            wanted = [k for k, t in dict(producer.sent).items()
                      if measured_from <= t < measured_to - 2]
            while time.monotonic() < deadline and any(k not in poller.seen for k in wanted):
                if query.exception() is not None:
                    raise RuntimeError(f"the query failed: {query.exception()}")
                time.sleep(0.2)
            progress = list(query.recentProgress)
        finally:
            poller.stopping.set()
            producer.stopping.set()
            query.stop()
        latencies = [(poller.seen[k] - producer.sent[k]) * 1000 for k in wanted
                     if k in poller.seen]
        acks = [(producer.acked[k] - producer.sent[k]) * 1000 for k in wanted]
        after_ack = [(poller.seen[k] - producer.acked[k]) * 1000 for k in wanted
                     if k in poller.seen]
        missing = len(wanted) - len(latencies)
        measured = [p for p in progress if _epoch_s(p["timestamp"]) >= wall_from]
        planning = [p["durationMs"].get("latestOffset", 0) for p in measured]
        phases = sorted({k for p in measured for k in p["durationMs"]})
        batch_ms = {k: round(statistics.median(p["durationMs"].get(k, 0) for p in measured))
                    for k in phases} if measured else {}
    if not latencies:
        raise RuntimeError("no measured record became visible")
    p50, p99, worst = (percentile(latencies, 0.5), percentile(latencies, 0.99),
                       max(latencies))
    longest_planning = max(planning, default=0)
    log(f"the broker's acknowledgement: p50 {percentile(acks, 0.5):.0f} ms, p99 "
        f"{percentile(acks, 0.99):.0f} ms, max {max(acks):.0f} ms; acknowledged -> visible: p50 "
        f"{percentile(after_ack, 0.5):.0f} ms, p99 {percentile(after_ack, 0.99):.0f} ms")
    log(f"{len(latencies):,} records: p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {worst:.0f} ms; "
        f"longest latestOffset {longest_planning} ms over {len(planning)} batches"
        + (f"; {missing} records never became visible" if missing else ""))
    print_result({
        "bench": "latency",
        "session": args.session,
        "rate": args.rate,
        "partitions": args.partitions,
        "linger_ms": args.linger_ms,
        "seconds": args.seconds,
        "records": len(latencies),
        "missing": missing,
        "p50_ms": round(p50),
        "p99_ms": round(p99),
        "max_ms": round(worst),
        "ack_p50_ms": round(percentile(acks, 0.5)),
        "ack_p99_ms": round(percentile(acks, 0.99)),
        "ack_max_ms": round(max(acks)),
        "after_ack_p50_ms": round(percentile(after_ack, 0.5)),
        "after_ack_p99_ms": round(percentile(after_ack, 0.99)),
        "max_latest_offset_ms": longest_planning,
        "batches": len(planning),
        "batch_ms_median": batch_ms,
        "target_p99_ms": TARGET_P99_MS,
        "target_planning_ms": TARGET_PLANNING_MS,
        "meets_targets": p99 <= TARGET_P99_MS and longest_planning <= TARGET_PLANNING_MS
        and not missing,
        "busy_machine": busy > 0,
        "load_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    })
    return 0


def _epoch_s(timestamp: str) -> float:
    """Seconds since the epoch of a progress report's ISO timestamp (UTC, ``…Z``)."""
    from datetime import datetime

    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    sys.exit(main())
