"""Benchmark: the flinkish Kafka source in Spark against a plain confluent-kafka consumer.

Run from the repository root: ``python bench/source_throughput.py [--records N]
[--partitions P] [--repeat R]``. Progress goes to stderr; the last line on
stdout is one json object of named figures.

What is measured, and why:

* The script starts the embedded Tansu broker (``flinkish.demo.embedded_kafka``) and produces
  ``--records`` records (``--value-bytes`` of value, a 10-byte key) round-robin over
  ``--partitions`` partitions with a batching producer; CreateTime timestamps climb 1 ms per
  record of a partition with a jitter of up to ±1 s, so they are slightly out of order. Producing
  is not timed.
* ``raw_consume_rps`` is the ceiling: one plain confluent-kafka consumer (librdkafka's default
  settings) assigned all partitions from offset 0, calling ``consume(num_messages=…)`` in a loop
  and touching each message's key, value, offset and timestamp (the fields the source reads),
  timed from creating the consumer to the last record. It is what reading the topic costs in
  Python without Spark. ``raw_consume_tuned_rps`` is the same consumer with only
  ``fetch.queue.backoff.ms`` lowered (see ``TUNED_CONSUMER``): what the broker can deliver.
* ``flinkish_rps`` is ``records / seconds`` of one ``Trigger.AvailableNow`` query of the
  flinkish source (markers on, ``watermark.maxOutOfOrderness`` 2 seconds, a fresh
  ``checkpointing.location`` and Spark checkpoint, ``startingOffsets`` earliest) into Spark's
  ``noop`` sink, timed from ``writeStream.start()`` to the query's termination. SparkSession
  start-up is not included, and a warm-up query (``--warmup-records``) on another topic runs
  first, so JVM class loading and JIT compilation and Python worker start-up are not counted
  either; the per-query and per-batch costs of Spark (query start, planning, offset probes,
  checkpoint log writes) are, since a user pays them. The project's modules are imported from
  bytecode, as from an installed wheel (``dev/setup.sh`` compiles them; rerun it after editing
  the sources, or every query's driver-side Python process compiles the edited modules again).
* ``worker_peak_rss_mb`` is the largest VmHWM (peak resident set) of the Python processes Spark
  starts (worker daemon, forked workers, the data source runner), sampled from ``/proc`` every
  0.25 s while the query runs. Workers are reused between queries, so this is the peak over
  the run so far (warm-up included).
* ``bare_source_rps`` is the ceiling of any Python source in Spark: ``records / seconds`` of
  one ``Trigger.AvailableNow`` query of a bare Python streaming data source (``BareSource``
  below) that yields prebuilt Arrow batches of the flinkish schema (built once per read task,
  before its first batch; the same rows and columns as the flinkish source's record rows)
  into the same ``noop`` sink, timed the same way, with as many read tasks as the flinkish
  query runs (``maxReadTasks``' default, at most one per partition). It reads no Kafka and
  computes nothing, so the gap to it is what flinkish adds to Spark's own cost of taking rows
  from Python. ``ratio_vs_bare = flinkish_rps / bare_source_rps``; the target is 0.85.
* ``kafka_floor_rps`` is the ceiling of any Kafka source written on PySpark's Python data source
  API with confluent-kafka: ``records / seconds`` of one ``Trigger.AvailableNow`` query of
  ``KafkaFloorSource`` below, whose read tasks (as many as flinkish's, each given every
  ``tasks``-th partition) read their partitions from offset 0 with one tuned consumer
  (``TUNED_CONSUMER``, ``consume(num_messages=BARE_CHUNK)``) and turn each chunk into an Arrow
  batch of the flinkish schema with the fewest steps (no markers, no watermark state, no
  offset checks), with the cyclic collector spaced as flinkish's read tasks space it. The gap
  from it to the bare source is what reading Kafka in Python costs on these cores;
  ``ratio_vs_kafka_floor = flinkish_rps / kafka_floor_rps`` is what flinkish adds to that
  (target 0.95). ``worker_cpu_s_per_million`` and ``floor_worker_cpu_s_per_million`` are the
  CPU-seconds Spark's Python processes spent per million records in the flinkish query and in
  the floor's; ``cpu_vs_floor`` is their ratio (target at most 1.3).
* Where the whole-query gap to the floor lies, from each query's progress (medians):
  ``*_start_s`` from ``start()`` to the first trigger (Spark starts a fresh driver-side Python
  process per query for a Python source; flinkish's also asks Kafka for the partitions and
  their offsets), ``*_record_batches_s`` in the batches that read records, and
  ``*_other_batches_s`` the rest (a batch holding only a carrier row, should one follow the
  records: the batch that reaches the AvailableNow target carries its own watermark, so
  normally none does). ``record_batches_ratio_vs_kafka_floor``
  is the floor's record-batch time over flinkish's: the per-record cost alone.
* ``ratio`` = ``flinkish_rps / raw_consume_tuned_rps``: against what the broker can deliver to
  one consumer (the ceiling); ``ratio_vs_default_consumer`` is against the consumer with
  librdkafka's default settings, which a 1 s fetch backoff throttles (a ceiling that flatters).
* ``flinkish_cpu_seconds`` splits the CPU used during the (median) query by process kind;
  ``other_processes`` is everything else on the machine: when it is large, something else
  competed for the two cores and the wall-clock figures are suspect. The progress lines on
  stderr also give Spark's per-batch durations.

With ``--repeat R`` the measurements run R times, alternating, against the same topic, and the
medians are reported (each run's figures are in the ``*_runs`` lists). The broker, the Spark
session and its JVM are stopped on every exit path, including errors and SIGTERM.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
from _common import (  # noqa: E402
    BASE_MS,
    CpuMeter,
    PeakMemorySampler,
    bench_environment,
    log,
    median,
    print_result,
    run_to_end,
)
from confluent_kafka import Consumer, KafkaError, TopicPartition  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: E402

MAX_OUT_OF_ORDERNESS = "2 seconds"
TARGET_RATIO_VS_BARE = 0.85
#: targets for the default read path: rows/s against the Kafka floor, and Python workers'
#: CPU per record against the floor's
TARGET_RATIO_VS_FLOOR = 0.95
TARGET_CPU_VS_FLOOR = 1.3
BARE_CHUNK = 20_000  # rows per prebuilt batch, as the flinkish reader's chunks
#: librdkafka postpones a partition's next fetch by fetch.queue.backoff.ms (configurable since
#: librdkafka 2.2; 1 s by default) whenever its prefetch queue reaches queued.min.messages
#: (100,000 by default), so a consumer with default settings stalls for up to a second every
#: ~100k records of a partition. The "tuned" consumer only lowers that backoff.
TUNED_CONSUMER = {"fetch.queue.backoff.ms": 10}


def raw_consume(
    bootstrap: str,
    topic: str,
    records: int,
    partitions: int,
    batch: int,
    timeout: float,
    extra: dict[str, Any] | None = None,
) -> float:
    """One plain consumer reads every record; returns records per second."""
    started = time.monotonic()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            **(extra or {}),
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen = value_bytes = offsets = stamps = 0
        deadline = started + timeout
        while seen < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw consumer read {seen} of {records} in {timeout:g} s")
            for msg in consumer.consume(num_messages=batch, timeout=1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"raw consumer: {err.str()}")
                key, value = msg.key(), msg.value()
                value_bytes += len(value or b"") + len(key or b"")
                offsets += msg.offset()
                stamps += msg.timestamp()[1]
                seen += 1
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    if seen != records:
        raise RuntimeError(f"raw consumer read {seen} records, expected {records}")
    return records / elapsed


class BarePartition(InputPartition):
    def __init__(self, index: int, rows: int) -> None:
        super().__init__(index)
        self.index = index
        self.rows = rows


class BareReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """All ``records`` rows in one batch, split over ``tasks`` read tasks, each yielding one
    prebuilt Arrow batch (and a slice of it for the rest) of the flinkish schema."""

    def __init__(self, records: int, tasks: int, value_bytes: int) -> None:
        self.records, self.tasks, self.value_bytes = records, tasks, value_bytes

    def initialOffset(self) -> dict:
        return {"offset": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        return {"offset": self.records}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        total = int(end["offset"]) - int(start["offset"])
        shares = [total // self.tasks + (1 if i < total % self.tasks else 0)
                  for i in range(self.tasks)]
        return [BarePartition(i, n) for i, n in enumerate(shares) if n]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, BarePartition)
        batch = _prebuilt(partition.index, min(BARE_CHUNK, partition.rows), self.value_bytes)
        left = partition.rows
        while left > 0:
            yield batch if left >= batch.num_rows else batch.slice(0, left)
            left -= batch.num_rows

    def commit(self, end: dict) -> None:
        pass


def _prebuilt(partition: int, rows: int, value_bytes: int) -> pa.RecordBatch:
    """Record rows of the flinkish schema, as ``partition_reader`` builds them."""
    filler = b"x" * max(0, value_bytes - 10)
    return _record_rows(
        pa.array([b"k%09d" % i for i in range(rows)], pa.binary()),
        pa.array([(b"%010d" % i + filler)[:value_bytes] for i in range(rows)], pa.binary()),
        "bench-source",
        pa.repeat(pa.scalar(partition, pa.int32()), rows),
        pa.array(range(rows), pa.int64()),
        pa.array([(BASE_MS + i) * 1000 for i in range(rows)], pa.timestamp("us", "UTC")),
    )


def _record_rows(keys: pa.Array, values: pa.Array, topic: str, partitions: pa.Array,
                 offsets: pa.Array, stamps: pa.Array) -> pa.RecordBatch:
    """Record rows of the flinkish schema (CreateTime timestamps, event time = timestamp)."""
    from flinkish_source.schema import arrow_schema

    n = len(keys)
    columns = [
        keys, values, pa.repeat(pa.scalar(topic, pa.string()), n), partitions, offsets, stamps,
        pa.repeat(pa.scalar(0, pa.int32()), n), stamps,
        pa.repeat(pa.scalar("record", pa.string()), n),
        pa.nulls(n, pa.int64()),
        pa.nulls(n, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(False))


class FloorPartition(InputPartition):
    def __init__(self, partitions: list[int]) -> None:
        super().__init__(partitions)
        self.partitions = partitions


class KafkaFloorReader(BareReader):
    """All ``records`` records of ``topic`` (written round-robin from an empty topic) in one
    batch, each read task reading whole partitions with one tuned consumer."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(int(options["records"]), int(options["tasks"]), 0)
        self.bootstrap, self.topic = options["bootstrap"], options["topic"]
        self.partition_count = int(options["partitions"])

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [FloorPartition(list(range(i, self.partition_count, self.tasks)))
                for i in range(min(self.tasks, self.partition_count))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # imported here: pickled with the class, the names would be taken by value (their
        # __module__, cimpl, cannot be imported by that name)
        from confluent_kafka import Consumer, TopicPartition

        from flinkish_source.partition_reader import READ_GC_THRESHOLD

        assert isinstance(partition, FloorPartition)
        ends = {p: self.records // self.partition_count
                + (1 if p < self.records % self.partition_count else 0)
                for p in partition.partitions}
        left = sum(ends.values())
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": f"floor-{uuid.uuid4().hex}",
            "enable.auto.commit": False, "enable.partition.eof": False, **TUNED_CONSUMER,
        })
        thresholds = gc.get_threshold()
        gc.set_threshold(READ_GC_THRESHOLD, *thresholds[1:])
        try:
            consumer.assign([TopicPartition(self.topic, p, 0) for p in partition.partitions])
            while left > 0:
                msgs = consumer.consume(num_messages=min(BARE_CHUNK, left), timeout=1.0)
                if msgs:
                    left -= len(msgs)
                    yield _floor_batch(self.topic, msgs)
        finally:
            gc.set_threshold(*thresholds)
            consumer.close()


def _floor_batch(topic: str, msgs: list[Any]) -> pa.RecordBatch:
    """The fewest steps from a chunk of messages to record rows of the flinkish schema."""
    return _record_rows(
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        topic,
        pa.array([m.partition() for m in msgs], pa.int32()),
        pa.array([m.offset() for m in msgs], pa.int64()),
        pa.array([m.timestamp()[1] for m in msgs], pa.int64()).cast(
            pa.timestamp("ms", "UTC")).cast(pa.timestamp("us", "UTC")),
    )


class KafkaFloorSource(DataSource):
    """``format("flinkish_kafka_floor_bench")``: options ``bootstrap``, ``topic``,
    ``partitions``, ``records``, ``tasks``."""

    @classmethod
    def name(cls) -> str:
        return "flinkish_kafka_floor_bench"

    def schema(self) -> Any:
        from flinkish_source.schema import spark_schema

        return spark_schema(False)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaFloorReader(dict(self.options))


def run_floor(spark: Any, bootstrap: str, topic: str, records: int, partitions: int,
              tasks: int, workdir: Path, timeout: float) -> Split:
    """One AvailableNow query of the Kafka floor source into noop; where its time went."""
    return _run_ceiling(spark, KafkaFloorSource.name(), {
        "bootstrap": bootstrap, "topic": topic, "partitions": str(partitions),
        "records": str(records), "tasks": str(tasks),
    }, records, "Kafka floor source", workdir, timeout)


def _run_ceiling(spark: Any, source: str, options: dict[str, str], records: int, label: str,
                 workdir: Path, timeout: float) -> Split:
    """One AvailableNow query of a ceiling source into noop, which must yield ``records``
    rows; where its time went."""
    run = Path(tempfile.mkdtemp(prefix="ceiling-", dir=workdir))
    df = spark.readStream.format(source).options(**options).load()
    writer = (df.writeStream.format("noop").trigger(availableNow=True)
              .option("checkpointLocation", str(run / "checkpoint")))
    try:
        result = run_to_end(writer, f"{label} query", timeout)
    finally:
        shutil.rmtree(run, ignore_errors=True)
    rows, split = _log_progress(result)
    if rows != records:
        raise RuntimeError(f"the {label} query read {rows} rows, expected {records}")
    return split


class BareSource(DataSource):
    """``format("flinkish_bare_bench")``: options ``records``, ``tasks``, ``valueBytes``."""

    @classmethod
    def name(cls) -> str:
        return "flinkish_bare_bench"

    def schema(self) -> Any:
        from flinkish_source.schema import spark_schema

        return spark_schema(False)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return BareReader(int(self.options["records"]), int(self.options["tasks"]),
                          int(self.options["valueBytes"]))


def run_bare(spark: Any, records: int, tasks: int, value_bytes: int, workdir: Path,
             timeout: float) -> Split:
    """One AvailableNow query of the bare source into noop; where its time went."""
    return _run_ceiling(spark, BareSource.name(), {
        "records": str(records), "tasks": str(tasks), "valueBytes": str(value_bytes),
    }, records, "bare source", workdir, timeout)


def run_flinkish(
    spark: Any, bootstrap: str, topic: str, workdir: Path, timeout: float,
) -> tuple[Split, int]:
    """One AvailableNow query into the noop sink; where its time went, and the rows the
    source produced."""
    run = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    df = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeMarkers", "true")
        .option("watermark.maxOutOfOrderness", MAX_OUT_OF_ORDERNESS)
        .option("checkpointing.location", str(run / "state"))
        .load()
    )
    writer = (
        df.writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(run / "checkpoint"))
    )
    try:
        result = run_to_end(writer, f"flinkish query on {topic}", timeout)
    finally:
        shutil.rmtree(run, ignore_errors=True)
    rows, split = _log_progress(result)
    return split, rows


@dataclass(frozen=True)
class Split:
    """Where a query's time went: ``seconds`` in all (``start()`` to its end), ``start`` from
    ``start()`` to the first trigger (the driver-side reader process, the source's first
    offsets), ``record_batches`` in the triggers of batches that read records, and the rest
    (other batches: flinkish's last batch holds only the carrier row that hands the combined
    watermark to Spark, so its one row tells it apart)."""

    seconds: float
    start: float
    record_batches: float

    @property
    def other(self) -> float:
        return self.seconds - self.start - self.record_batches


def _log_progress(result: Any) -> tuple[int, Split]:
    """Log each batch's durations and where the query's time went; the rows it read, and
    the split of its time."""
    progress = result.progress
    for p in progress:
        durations = ", ".join(f"{k} {v}" for k, v in sorted(p["durationMs"].items()))
        log(f"  batch {p['batchId']}: {p['numInputRows']:,} rows; ms: {durations}")
    if progress:
        first = _epoch(progress[0]["timestamp"])
        final = progress[-1]
        last = _epoch(final["timestamp"]) + final["durationMs"]["triggerExecution"] / 1000
        log(f"  start() to first trigger {first - result.started_wall:.2f} s, in triggers "
            f"{last - first:.2f} s, after the last trigger {result.ended_wall - last:.2f} s")
    start = _epoch(progress[0]["timestamp"]) - result.started_wall if progress else 0.0
    record_batches = sum(p["durationMs"]["triggerExecution"] for p in progress
                         if int(p["numInputRows"]) > 1) / 1000
    return (sum(int(p["numInputRows"]) for p in progress),
            Split(result.seconds, start, record_batches))


def _epoch(iso: str) -> float:
    """Seconds since the epoch of a progress timestamp such as 2024-01-01T00:00:00.123Z."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="median of N runs of each")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--warmup-records", type=int, default=100_000)
    parser.add_argument("--cores", type=int, default=2, help="Spark's local[N]")
    parser.add_argument("--consume-batch", type=int, default=10_000,
                        help="num_messages of the raw consumer's consume()")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per measurement")
    args = parser.parse_args(argv)
    if min(args.records, args.partitions, args.repeat, args.warmup_records) < 1:
        parser.error("--records, --partitions, --repeat and --warmup-records must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raw_runs: list[float] = []
    tuned_runs: list[float] = []
    cpu_runs: list[dict[str, float]] = []
    flinkish_runs: list[float] = []
    seconds_runs: list[float] = []
    bare_runs: list[float] = []
    bare_seconds_runs: list[float] = []
    floor_runs: list[float] = []
    floor_cpu_runs: list[dict[str, float]] = []
    peaks: list[float] = []
    flinkish_splits: list[Split] = []
    floor_splits: list[Split] = []
    rows = 0
    with bench_environment("flinkish-bench-") as env:
        bootstrap, workdir = env.bootstrap, env.workdir
        topic, warmup_topic = "bench-source", "bench-warmup"
        env.prepare_topics(args.partitions, args.value_bytes, (topic, args.records),
                           (warmup_topic, args.warmup_records), "not part of the result")

        spark, startup = env.start_spark("flinkish-bench", args.cores)
        log(f"SparkSession up in {startup:.1f} s; warm-up query "
            f"({args.warmup_records:,} records on {warmup_topic}, not timed)")
        split, _ = run_flinkish(spark, bootstrap, warmup_topic, workdir, args.timeout)
        log(f"warm-up query took {split.seconds:.1f} s")
        from flinkish_source.read_plan import default_read_tasks

        tasks = min(args.partitions, default_read_tasks())
        spark.dataSource.register(BareSource)
        split = run_bare(spark, args.warmup_records, tasks, args.value_bytes, workdir,
                         args.timeout)
        log(f"warm-up of the bare source ({tasks} read tasks) took {split.seconds:.1f} s")
        spark.dataSource.register(KafkaFloorSource)
        split = run_floor(spark, bootstrap, warmup_topic, args.warmup_records,
                          args.partitions, tasks, workdir, args.timeout)
        log(f"warm-up of the Kafka floor source ({tasks} read tasks) took "
            f"{split.seconds:.1f} s")

        def measure_flinkish(run: int) -> None:
            with PeakMemorySampler() as sampler, CpuMeter() as cpu:
                split, rows = run_flinkish(spark, bootstrap, topic, workdir, args.timeout)
            seconds = split.seconds
            flinkish_splits.append(split)
            if rows < args.records:
                raise RuntimeError(f"the flinkish query read {rows} rows, expected "
                                   f">= {args.records} records (plus markers)")
            flinkish_runs.append(args.records / seconds)
            seconds_runs.append(seconds)
            peaks.append(sampler.peak_mb)
            log(f"run {run}/{args.repeat}: flinkish {args.records / seconds:,.0f} records/s "
                f"({seconds:.2f} s, {rows:,} rows incl. markers); ratio "
                f"{args.records / seconds / tuned_runs[-1]:.2f}; worker peak {sampler.peak_mb} MB: "
                + "; ".join(sampler.top()))
            log(f"run {run}/{args.repeat}: CPU seconds during the query: {cpu.seconds}")
            cpu_runs.append(cpu.seconds)

        def measure_bare(run: int) -> None:
            with CpuMeter() as bare_cpu:
                bare_seconds = run_bare(spark, args.records, tasks, args.value_bytes, workdir,
                                        args.timeout).seconds
            bare_runs.append(args.records / bare_seconds)
            bare_seconds_runs.append(bare_seconds)
            log(f"run {run}/{args.repeat}: bare Python source {args.records / bare_seconds:,.0f}"
                f" rows/s ({bare_seconds:.2f} s, {tasks} read tasks); CPU seconds: "
                f"{bare_cpu.seconds}")

        def measure_floor(run: int) -> None:
            with CpuMeter() as floor_cpu:
                floor_split = run_floor(spark, bootstrap, topic, args.records,
                                        args.partitions, tasks, workdir, args.timeout)
            floor_seconds = floor_split.seconds
            floor_splits.append(floor_split)
            floor_runs.append(args.records / floor_seconds)
            log(f"run {run}/{args.repeat}: Kafka floor source "
                f"{args.records / floor_seconds:,.0f} rows/s ({floor_seconds:.2f} s); "
                f"CPU seconds: {floor_cpu.seconds}")
            floor_cpu_runs.append(floor_cpu.seconds)

        for run in range(1, args.repeat + 1):
            rps = raw_consume(bootstrap, topic, args.records, args.partitions,
                              args.consume_batch, args.timeout)
            raw_runs.append(rps)
            tuned = raw_consume(bootstrap, topic, args.records, args.partitions,
                                args.consume_batch, args.timeout, TUNED_CONSUMER)
            tuned_runs.append(tuned)
            log(f"run {run}/{args.repeat}: raw consumer {rps:,.0f} records/s with librdkafka's "
                f"defaults, {tuned:,.0f} records/s with {TUNED_CONSUMER}")
            # Each contender takes its turn at going first after the raw consumers: the first
            # query of a round is measurably slower (measured: up to 1.7x), whoever it is.
            contenders = [measure_flinkish, measure_bare, measure_floor]
            turn = (run - 1) % len(contenders)
            for measure in contenders[turn:] + contenders[:turn]:
                measure(run)

    raw, tuned, flinkish = median(raw_runs), median(tuned_runs), median(flinkish_runs)
    bare, floor = median(bare_runs), median(floor_runs)
    middle = sorted(range(len(flinkish_runs)), key=flinkish_runs.__getitem__)[
        (len(flinkish_runs) - 1) // 2
    ]
    millions = args.records / 1e6
    worker_cpu = median([c.get("python_workers", 0.0) for c in cpu_runs]) / millions
    floor_worker_cpu = median([c.get("python_workers", 0.0) for c in floor_cpu_runs]) / millions
    print_result(
        {
            "bench": "source_throughput",
            "records": args.records,
            "partitions": args.partitions,
            "value_bytes": args.value_bytes,
            "repeat": args.repeat,
            "spark_cores": args.cores,
            "flinkish_rps": round(flinkish),
            "bare_source_rps": round(bare),
            "ratio_vs_bare": round(flinkish / bare, 3),
            "target_ratio_vs_bare": TARGET_RATIO_VS_BARE,
            "kafka_floor_rps": round(floor),
            "ratio_vs_kafka_floor": round(flinkish / floor, 3),
            "target_ratio_vs_kafka_floor": TARGET_RATIO_VS_FLOOR,
            "worker_cpu_s_per_million": round(worker_cpu, 3),
            "floor_worker_cpu_s_per_million": round(floor_worker_cpu, 3),
            "cpu_vs_floor": round(worker_cpu / floor_worker_cpu, 3) if floor_worker_cpu else None,
            "target_cpu_vs_floor": TARGET_CPU_VS_FLOOR,
            "floor_vs_bare": round(floor / bare, 3),
            # where the whole-query gap to the floor lies (medians, seconds; see Split)
            "flinkish_start_s": round(median([x.start for x in flinkish_splits]), 3),
            "kafka_floor_start_s": round(median([x.start for x in floor_splits]), 3),
            "flinkish_record_batches_s": round(
                median([x.record_batches for x in flinkish_splits]), 3),
            "kafka_floor_record_batches_s": round(
                median([x.record_batches for x in floor_splits]), 3),
            "flinkish_other_batches_s": round(median([x.other for x in flinkish_splits]), 3),
            "kafka_floor_other_batches_s": round(median([x.other for x in floor_splits]), 3),
            "record_batches_ratio_vs_kafka_floor": round(median(
                [f.record_batches / x.record_batches
                 for x, f in zip(flinkish_splits, floor_splits, strict=True)]), 3),
            "raw_consume_tuned_rps": round(tuned),
            "ratio": round(flinkish / tuned, 3),
            "raw_consume_rps": round(raw),
            "ratio_vs_default_consumer": round(flinkish / raw, 3),
            "bare_vs_tuned": round(bare / tuned, 3),
            "tuned_consumer_config": TUNED_CONSUMER,
            "read_tasks": tasks,
            "worker_peak_rss_mb": max(peaks, default=0.0),
            "flinkish_seconds": round(median(seconds_runs), 3),
            "bare_source_seconds": round(median(bare_seconds_runs), 3),
            "flinkish_rows_incl_markers": rows,
            "flinkish_cpu_seconds": cpu_runs[middle],
            "raw_consume_rps_runs": [round(r) for r in raw_runs],
            "raw_consume_tuned_rps_runs": [round(r) for r in tuned_runs],
            "flinkish_rps_runs": [round(r) for r in flinkish_runs],
            "bare_source_rps_runs": [round(r) for r in bare_runs],
            "kafka_floor_rps_runs": [round(r) for r in floor_runs],
            "kafka_floor_cpu_seconds": floor_cpu_runs[middle],
            "excluded_from_flinkish_rps": (
                "SparkSession start-up and JVM/Python-worker start-up (a "
                f"{args.warmup_records}-record warm-up query on another topic ran first)"
            ),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
