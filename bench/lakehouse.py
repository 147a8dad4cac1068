"""Benchmark: the flinkish sink into a Delta table against the Parquet target and Spark's noop.

Run from the repository root: ``python bench/lakehouse.py [--rows N] [--partitions P]
[--epochs E] [--repeat R] [--minutes M] [--rate R]``. Progress goes to stderr; the last line
on stdout is one json object of named figures.

What is measured, and how:

* The embedded Tansu broker (``flinkish.demo.embedded_kafka``) is started and ``--rows``
  records (``bench/_common.produce``) are produced over ``--partitions`` partitions, untimed.
* **Throughput.** One ``Trigger.AvailableNow`` query per sink over the same topic: the
  flinkish Kafka source (markers on, ``maxOffsetsPerTrigger`` = rows / ``--epochs``, one write
  task per partition) into ``format("flinkish")`` with ``target=delta`` (exactly once: tasks
  write data files, the driver commits each epoch as one table version with its ``txn``) or
  ``target=parquet`` (exactly once: staged files renamed by the driver), both with compaction
  off so that ``*_files_per_epoch`` is what an epoch itself adds; and into Spark's ``noop`` sink
  (the source's cost alone). Each sink runs ``--repeat`` times, in rotating order, after a
  warm-up query per sink; ``*_rps`` = rows / seconds from ``start()`` to the end (medians).
  ``ratio_vs_parquet`` = ``delta_rps / parquet_rps`` (target >= 0.8). ``--repeat 0`` skips
  this part.
* **Steady stream.** A producer thread writes ``--rate`` records a second for ``--minutes``
  (CreateTime now) while two queries with a 2 s processing-time trigger read them: into a Delta
  table (``delta.compactEvery``) and into a Parquet target (``parquet.compactEvery``, both
  ``--compact-every``). After the producer stops and both queries caught up, ``*_files_after``
  is the table's data files: Delta's active files (``DeltaTable.file_uris``), the Parquet
  target's ``flinkish.parquet_files``. ``*_ideal_files`` = ceil(data bytes / the compaction's
  target size) (Delta: ``delta.targetFileSize`` or delta-rs' 100 MiB; Parquet:
  ``parquet.targetFileSize``, 128 MiB), at least 1. A compaction runs every
  ``--compact-every`` epochs, so the files at the end depend on where in that cycle the
  stream stopped: ``*_files_after_compaction`` is what the last compaction left (Delta: the
  active files at the version of the last ``OPTIMIZE``; Parquet: the files of the epochs up to
  the last compaction's), target: within 2x of ideal; ``*_files_bound`` = ideal +
  (``--compact-every`` - 1) x the most files an epoch added (one per write task with rows),
  which ``*_files_after`` must not pass. Both outputs are checked to hold every produced
  record exactly once.

The broker, the Spark session and its JVM are stopped on every exit path, including errors
and SIGTERM. Timings on a shared machine are noisy: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _common import bench_environment, log, median, print_result, run_to_end  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from checkpointing import CheckpointStorage, CheckpointStore  # noqa: E402

SINKS = ("delta", "parquet", "noop")
TARGET_RATIO = 0.8
TRIGGER = "2 seconds"
DELTA_DEFAULT_TARGET = 100 * 1024 * 1024  # delta-rs' optimize target without a table property
PARQUET_TARGET = 128 * 1024 * 1024  # parquet.targetFileSize's default
#: a Parquet target's data file: (epoch, "c" for a compaction's output)
PARQUET_PART = r"-(\d{9})-(?:\d{5}-\d+-\d{3}|(c)[0-9a-f]{8}-\d{3})\.parquet$"


@dataclass
class Run:
    sink: str
    seconds: float
    epochs: int
    files: int

    def rps(self, rows: int) -> float:
        return rows / self.seconds


def source(spark: Any, bootstrap: str, topic: str, state: Path, max_offsets: int | None) -> Any:
    reader = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("watermark.maxOutOfOrderness", "2 seconds")
        .option("checkpointing.location", str(state))
    )
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    return reader.load()


def sink(df: Any, kind: str, out: Path, checkpoint: Path, compact_every: int) -> Any:
    writer = df.writeStream.option("checkpointLocation", str(checkpoint))
    if kind == "noop":
        return writer.format("noop")
    return (
        writer.format("flinkish").option("target", kind).option("path", str(out))
        .option(f"{kind}.compactEvery", str(compact_every))
        .option("checkpointing.retain", "1000000")
    )


def epochs_of(checkpoint: Path) -> int:
    view = CheckpointStore.reader(CheckpointStorage.open(str(checkpoint / "flinkish")))
    return len(view.completed_ids())


def max_files_per_epoch(checkpoint: Path) -> int:
    """The most pre-commits (write tasks with rows: one file each) an epoch decided on."""
    view = CheckpointStore.reader(CheckpointStorage.open(str(checkpoint / "flinkish")))
    return max((len(view.completed(n).state["decision"]) for n in view.completed_ids()),
               default=0)


def files_after_last_compaction(kind: str, out: Path) -> int | None:
    """How many data files a reader read right after the stream's last compaction (None:
    none ran): Delta's active files at the version of its last ``OPTIMIZE``; for the Parquet
    target, the files of the epochs up to the last compaction's (named in its outputs)."""
    if kind == "delta":
        from deltalake import DeltaTable

        optimized = [h["version"] for h in DeltaTable(str(out)).history()
                     if h.get("operation") == "OPTIMIZE"]
        if not optimized:
            return None
        return len(DeltaTable(str(out), version=max(optimized)).file_uris())
    names = [re.search(PARQUET_PART, Path(f).name) for f in data_files(kind, out)]
    parts = [(int(m[1]), m[2] is not None) for m in names if m]
    compacted = [epoch for epoch, output in parts if output]
    if not compacted:
        return None
    return sum(1 for epoch, _ in parts if epoch <= max(compacted))


def data_files(kind: str, out: Path) -> list[str]:
    """The files a reader reads: Delta's active files, the Parquet target's consistent view."""
    if kind == "delta":
        from deltalake import DeltaTable

        return list(DeltaTable(str(out)).file_uris())
    import flinkish

    return flinkish.parquet_files(str(out))


def count_rows(kind: str, out: Path) -> tuple[int, int]:
    """(rows, distinct record offsets) the sink's output holds."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    if kind == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(str(out)).to_pyarrow_table(columns=["partition", "offset"])
    else:
        table = ds.dataset(data_files(kind, out), format="parquet").to_table(
            columns=["partition", "offset"])
    keys = pc.add(pc.multiply(table["partition"].cast("int64"), 1 << 40),
                  table["offset"].cast("int64"))
    return table.num_rows, len(pc.unique(keys))


def ideal_files(kind: str, out: Path, files: list[str]) -> tuple[int, int]:
    """(ceil(data bytes / target size), the target size)."""
    size = PARQUET_TARGET
    if kind == "delta":
        from deltalake import DeltaTable

        configured = DeltaTable(str(out)).metadata().configuration.get("delta.targetFileSize")
        size = int(configured) if configured else DELTA_DEFAULT_TARGET
    total = sum(Path(f.removeprefix("file://")).stat().st_size for f in files)
    return max(1, math.ceil(total / size)), size


def run_once(spark: Any, kind: str, bootstrap: str, topic: str, max_offsets: int,
             workdir: Path, timeout: float) -> Run:
    run = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir))
    df = source(spark, bootstrap, topic, run / "source-state", max_offsets)
    writer = sink(df, kind, run / "out", run / "checkpoint", 0).trigger(availableNow=True)
    result = run_to_end(writer, f"{kind} query", timeout)
    if kind == "noop":
        epochs, files = len(result.progress), 0
    else:
        epochs, files = epochs_of(run / "checkpoint"), len(data_files(kind, run / "out"))
    shutil.rmtree(run, ignore_errors=True)
    return Run(kind, result.seconds, epochs, files)


def steady_producer(bootstrap: str, topic: str, rate: int, seconds: float,
                    value_bytes: int) -> tuple[threading.Thread, list[int]]:
    """A thread producing ``rate`` records a second for ``seconds`` (CreateTime now); the
    list it returns holds the count produced once the thread ended."""
    produced = [0]

    def work() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        filler = b"x" * max(0, value_bytes - 10)
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * rate) + 1
            while produced[0] < due:
                producer.produce(topic, value=b"%010d" % produced[0] + filler,
                                 key=b"k%09d" % produced[0])
                produced[0] += 1
            producer.poll(0)
            time.sleep(0.05)
        if producer.flush(120):
            raise RuntimeError(f"records of {topic} not delivered within 120 s")

    thread = threading.Thread(target=work, name="steady-producer", daemon=True)
    thread.start()
    return thread, produced


def steady_stream(spark: Any, bootstrap: str, topic: str, workdir: Path, args: argparse.Namespace,
                  partitions: int) -> dict[str, Any]:
    from flinkish.demo.embedded_kafka import create_topic

    create_topic(bootstrap, topic, partitions)
    queries = {}
    for kind in ("delta", "parquet"):
        run = workdir / f"steady-{kind}"
        df = source(spark, bootstrap, topic, run / "source-state", None)
        queries[kind] = (run, sink(df, kind, run / "out", run / "checkpoint",
                                   args.compact_every).trigger(processingTime=TRIGGER).start())
    seconds = args.minutes * 60
    log(f"steady stream: {args.rate} records/s for {args.minutes:g} min, trigger {TRIGGER}")
    thread, produced = steady_producer(bootstrap, topic, args.rate, seconds, args.value_bytes)
    try:
        thread.join(seconds + 180)
        if thread.is_alive():
            raise RuntimeError("the steady producer did not finish")
        result: dict[str, Any] = {"steady_records": produced[0]}
        for kind, (run, query) in queries.items():
            wait_until(lambda q=query, k=kind, r=run: caught_up(q, k, r, produced[0]),
                       args.timeout, f"the steady {kind} query to catch up")
            query.stop()
            out = run / "out"
            files = data_files(kind, out)
            ideal, size = ideal_files(kind, out, files)
            rows, distinct = count_rows(kind, out)
            if rows != produced[0] or distinct != rows:
                raise RuntimeError(f"steady {kind}: {rows} rows ({distinct} distinct), "
                                   f"expected {produced[0]} once each")
            epochs = epochs_of(run / "checkpoint")
            compacted = files_after_last_compaction(kind, out)
            # what the last compaction left, plus a file per write task of every epoch since
            bound = ideal + (args.compact_every - 1) * max_files_per_epoch(run / "checkpoint")
            log(f"  steady {kind}: {epochs} epochs, {len(files)} files (bound {bound}), "
                f"{compacted} right after the last compaction, ideal {ideal} "
                f"(target size {size:,} B)")
            result.update({
                f"{kind}_steady_epochs": epochs, f"{kind}_files_after": len(files),
                f"{kind}_files_bound": bound, f"{kind}_files_after_compaction": compacted,
                f"{kind}_ideal_files": ideal,
                f"{kind}_files_vs_ideal": round(len(files) / ideal, 2),
                f"{kind}_compacted_vs_ideal": None if compacted is None
                else round(compacted / ideal, 2),
            })
        return result
    finally:
        for _, query in queries.values():
            if query.isActive:
                query.stop()


def caught_up(query: Any, kind: str, run: Path, records: int) -> bool:
    if query.exception() is not None:
        raise RuntimeError(f"the steady {kind} query failed: {query.exception()}")
    try:
        return count_rows(kind, run / "out")[0] >= records
    except Exception:  # no table / file yet
        return False


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(2)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=5,
                        help="maxOffsetsPerTrigger = ceil(rows / epochs)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="median of N runs per sink (0: skip the throughput part)")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--warmup-rows", type=int, default=8_000)
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="length of the steady stream (0: skip it)")
    parser.add_argument("--rate", type=int, default=1_000, help="steady records per second")
    parser.add_argument("--compact-every", type=int, default=10,
                        help="delta.compactEvery and parquet.compactEvery of the steady stream")
    parser.add_argument("--cores", type=int, default=2, help="Spark's local[N]")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per query")
    args = parser.parse_args(argv)
    if min(args.rows, args.partitions, args.epochs, args.warmup_rows, args.rate,
           args.compact_every) < 1 or min(args.minutes, args.repeat) < 0:
        parser.error("--rows, --partitions, --epochs, --warmup-rows, --rate and "
                     "--compact-every must be positive, --minutes and --repeat not negative")
    if args.repeat == 0 and args.minutes == 0:
        parser.error("--repeat 0 and --minutes 0 leave nothing to measure")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    max_offsets = math.ceil(args.rows / args.epochs)
    runs: dict[str, list[Run]] = {kind: [] for kind in SINKS}
    with bench_environment("flinkish-lakehouse-") as env:
        topic, warmup_topic = "bench-lakehouse", "bench-lakehouse-warmup"
        env.prepare_topics(args.partitions, args.value_bytes,
                           (topic, args.rows if args.repeat else 1),
                           (warmup_topic, args.warmup_rows), "not timed")
        spark, startup = env.start_spark("flinkish-lakehouse-bench", args.cores)
        log(f"SparkSession up in {startup:.1f} s")
        for kind in SINKS if args.repeat else ():
            log(f"warm-up: {args.warmup_rows:,} rows into {kind} (not timed)")
            run_once(spark, kind, env.bootstrap, warmup_topic, args.warmup_rows, env.workdir,
                     args.timeout)
        for n in range(args.repeat):
            for kind in SINKS[n % 3:] + SINKS[:n % 3]:
                result = run_once(spark, kind, env.bootstrap, topic, max_offsets, env.workdir,
                                  args.timeout)
                log(f"run {n + 1}/{args.repeat} {kind}: {result.rps(args.rows):,.0f} rows/s, "
                    f"{result.epochs} epochs, {result.files} files")
                runs[kind].append(result)
        steady = {} if args.minutes == 0 else steady_stream(
            spark, env.bootstrap, "bench-lakehouse-steady", env.workdir, args, args.partitions)

    print_result({
        "bench": "lakehouse",
        "partitions": args.partitions,
        "value_bytes": args.value_bytes,
        "spark_cores": args.cores,
        **(throughput(args, runs) if args.repeat else {}),
        "steady_minutes": args.minutes,
        "steady_rate": args.rate,
        "compact_every": args.compact_every,
        **steady,
    })
    return 0


def throughput(args: argparse.Namespace, runs: dict[str, list[Run]]) -> dict[str, Any]:
    rps = {kind: median([r.rps(args.rows) for r in runs[kind]]) for kind in SINKS}
    per_epoch = {kind: median([r.files / r.epochs for r in runs[kind]])
                 for kind in ("delta", "parquet")}
    return {
        "rows": args.rows,
        "epochs": runs["delta"][0].epochs,
        "repeat": args.repeat,
        "delta_rps": round(rps["delta"]),
        "parquet_rps": round(rps["parquet"]),
        "noop_rps": round(rps["noop"]),
        "ratio_vs_parquet": round(rps["delta"] / rps["parquet"], 3),
        "ratio_vs_parquet_runs": [round(d.rps(args.rows) / p.rps(args.rows), 3)
                                  for d, p in zip(runs["delta"], runs["parquet"], strict=True)],
        "ratio_vs_noop": round(rps["delta"] / rps["noop"], 3),
        "target_ratio": TARGET_RATIO,
        "delta_files_per_epoch": round(per_epoch["delta"], 2),
        "parquet_files_per_epoch": round(per_epoch["parquet"], 2),
        "excluded_from_rps": "SparkSession start-up; JVM and Python worker warm-up (a warm-up "
                             f"query of {args.warmup_rows} rows per sink ran first)",
    }


if __name__ == "__main__":
    sys.exit(main())
