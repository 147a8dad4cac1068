"""Benchmark: Kafka -> the flinkish sink, per target, against the same source into Spark's noop.

Run from the repository root: ``python bench/pipeline.py [--targets postgres,parquet,delta,iceberg]
[--rows N] [--partitions P] [--epochs E] [--repeat R] [--session plain|demo]``. Progress goes to
stderr; the last line on stdout is one json object of named figures.

What is measured, and how:

* The embedded Tansu broker (``flinkish.demo.embedded_kafka``) and an embedded PostgreSQL
  (``flinkish.demo.embedded_postgres``, ``fsync=off``, ``max_prepared_transactions=64``) are
  started; ``--rows`` records (a 10-byte key, ``--value-bytes`` of value, CreateTime timestamps
  climbing 1 ms per record of a partition with up to 1 s of jitter) are produced round-robin
  over ``--partitions`` partitions. Producing is not timed.
* The session is the README's by default (``--session plain``: ``SparkSession.builder
  .master("local[N]").getOrCreate()`` and ``flinkish.register(spark)``, nothing else);
  ``--session demo`` is the demo's and the tests' (``local_session``).
* One ``Trigger.AvailableNow`` streaming query per sink and run, each on a fresh checkpoint and
  a fresh table or directory: the flinkish Kafka source (markers on,
  ``watermark.maxOutOfOrderness`` 2 seconds, ``maxOffsetsPerTrigger`` = rows / ``--epochs``,
  one read task -- hence one write task -- per partition) into Spark's ``noop`` sink, and into
  ``format("flinkish")`` with each of ``--targets``, exactly once (the default guarantee):
  ``postgres`` (tasks COPY into a transaction and PREPARE it, the driver COMMIT PREPAREs),
  ``parquet`` and ``delta`` (a directory in the scratch space), ``iceberg`` (a SQLite catalog
  and a file warehouse there). ``*_rps`` = rows / seconds from ``writeStream.start()`` to the
  query's termination: Spark's per-query and per-batch costs are in it, as a user pays them.
  SparkSession start-up is not; a small warm-up query per sink runs first (JVM code loading,
  Python worker start-up), then the whole topic once into the first target, untimed (the first
  full-size run was consistently the slowest, whichever sink ran it).
* Also into ``python_floor``: a Python data source of this script whose write tasks only count
  the Arrow batches Spark gives them, the floor of any Python sink (Spark's JVM turning every
  row into Arrow for a Python worker, the worker, the epoch's driver-side Python calls).
* And into ``spark_parquet``: Spark's own Parquet file sink (``format("parquet")``, written in
  the JVM, exactly once for readers of its ``_spark_metadata`` log), the same source and data:
  what Spark itself gets when it writes these rows somewhere, the honest ceiling of the
  ``parquet`` target; ``parquet_ratio_vs_spark_parquet`` compares the two.
* ``<target>_ratio`` = the target's median rps / ``noop``'s median rps (target >= 0.8), the
  runs alternating the order of the sinks; ``<target>_ratio_runs`` pairs each run with the
  ``noop`` run of the same round; ``<target>_ratio_vs_python_floor`` the same against
  ``python_floor``: what flinkish's own work costs.
* Each target's output is counted after each run: exactly ``--rows`` rows, and no prepared
  PostgreSQL transaction left. ``postgres_median_epoch_commit_ms`` is read from the sink's
  checkpoint records (``completed_ms - created_ms`` of each completed epoch: the decision
  record, COMMIT PREPARED of every task, the recovery scan, the valve, the epoch's row).
* ``cpu_s_per_million_rows``: per sink, the median CPU seconds of each kind of process during
  a run (``_common.CpuMeter``: Spark's JVM, its Python workers, the driver, PostgreSQL's server
  and backends as ``postgres``; ``other_processes`` is the rest of the machine, on a shared
  machine mostly others' work), per million rows: where a target's extra cost goes.
* ``batches_ms``: per sink, the median over its runs of each phase of Spark's ``durationMs``
  summed over the query's batches (``addBatch`` holds the write tasks, the writer's creation
  and the commit).
* ``spark_submit_opts``: the JVM options the session started with. ``dev/test.sh``'s
  ``-XX:TieredStopAtLevel=1`` (C1 only, for short test runs) roughly doubles what Spark's JVM
  spends handing the rows to a Python sink as Arrow, a cost ``noop`` does not have; a user's
  JVM compiles that loop with C2. The figures judged against the target run without it.
* ``load_1m`` is the machine's 1-minute load average at the start and the end: the figures of
  a shared machine are only comparable within one run.

The broker, PostgreSQL, the Spark session and its JVM are stopped on every exit path, including
errors and SIGTERM.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from _common import (  # noqa: E402
    CpuMeter,
    bench_environment,
    log,
    median,
    print_result,
    run_to_end,
)
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from checkpointing import CheckpointStorage, CheckpointStore  # noqa: E402

TARGETS = ("postgres", "parquet", "delta", "iceberg")
#: the floor of any Python sink: a Python data source whose write tasks only count the rows
FLOOR = "python_floor"
#: Spark's own Parquet file sink, from the same source: what writing the rows costs Spark itself
SPARK_PARQUET = "spark_parquet"
MAX_OUT_OF_ORDERNESS = "2 seconds"
TARGET_RATIO = 0.8


@dataclass
class Run:
    sink: str
    seconds: float
    rows: int
    epochs: int
    commit_ms: list[int]
    cpu: dict[str, float]
    #: each phase's milliseconds summed over the query's batches (Spark's ``durationMs``)
    phases_ms: dict[str, int]

    @property
    def rps(self) -> float:
        return self.rows / self.seconds


class CountingWriter(DataSourceStreamArrowWriter):
    """Receives each task's Arrow batches from Spark and counts them: what any Python sink
    pays before it writes anything."""

    def write(self, iterator: Any) -> WriterCommitMessage:
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return CountedRows(rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


@dataclass
class CountedRows(WriterCommitMessage):
    rows: int


class FloorSink(DataSource):
    """``format("python_floor")``: :class:`CountingWriter`."""

    @classmethod
    def name(cls) -> str:
        return FLOOR

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        return CountingWriter()


def postmaster(dsn: str) -> int | None:
    """The pid of the PostgreSQL server at ``dsn`` (its backends' parent); None without one."""
    if not dsn:
        return None
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        # read while the session is open: its backend exits when it closes
        with open(f"/proc/{row[0]}/stat", "rb") as f:
            stat = f.read()
    return int(stat[stat.rfind(b")") + 2:].split()[1])


def commit_spans(checkpoint: Path) -> list[int]:
    """decision -> completion ms of every completed epoch in the sink's records."""
    view = CheckpointStore.reader(CheckpointStorage.open(str(checkpoint / "flinkish")))
    spans = []
    for epoch in view.completed_ids():
        record = view.completed(epoch)
        assert record is not None
        spans.append(record.completed_ms - record.created_ms)
    return spans


class Sinks:
    """Where each sink of one run writes, and how many rows it holds afterwards."""

    def __init__(self, dsn: str, run: Path, name: str) -> None:
        self.dsn, self.run, self.name = dsn, run, name

    def writer(self, df: Any, kind: str) -> Any:
        writer = df.writeStream.option("checkpointLocation", str(self.run / "checkpoint"))
        if kind in ("noop", FLOOR):
            return writer.format(kind)
        if kind == SPARK_PARQUET:
            return writer.format("parquet").option("path", str(self.run / "out"))
        writer = writer.format("flinkish").option("target", kind).option(
            "checkpointing.retain", "1000000")  # keep every epoch's record for the report
        if kind == "postgres":
            return writer.option("dsn", self.dsn).option("table", self.name)
        if kind == "iceberg":
            return (writer.option("table", f"bench.{self.name}").option("catalog.name", "bench")
                    .option("catalog.uri", f"sqlite:///{self.run / 'catalog.db'}")
                    .option("catalog.warehouse", (self.run / "warehouse").as_uri()))
        return writer.option("path", str(self.run / "out"))

    def rows(self, kind: str) -> int:
        """The rows the run's output holds (raises if PostgreSQL kept a prepared
        transaction)."""
        if kind == "postgres":
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                count = conn.execute(f'SELECT count(*) FROM "{self.name}"').fetchone()
                prepared = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
                conn.execute(f'DROP TABLE IF EXISTS "{self.name}", '
                             f'"{self.name}_flinkish_epochs"')
            assert count is not None and prepared is not None
            if prepared[0]:
                raise RuntimeError(f"{prepared[0]} prepared transactions left")
            return int(count[0])
        if kind == "iceberg":
            from pyiceberg.catalog.sql import SqlCatalog

            catalog = SqlCatalog("bench", uri=f"sqlite:///{self.run / 'catalog.db'}",
                                 warehouse=(self.run / "warehouse").as_uri())
            return int(catalog.load_table(f"bench.{self.name}").scan().to_arrow().num_rows)
        if kind == "delta":
            from deltalake import DeltaTable

            return int(DeltaTable(str(self.run / "out")).to_pyarrow_table(
                columns=["offset"]).num_rows)
        import pyarrow.parquet as pq

        import flinkish

        if kind == SPARK_PARQUET:  # Spark's sink writes the source's marker rows too
            import pyarrow.compute as pc

            from flinkish_core.markers import KIND_RECORD

            return sum(pc.sum(pc.equal(pq.read_table(f, columns=["kind"])["kind"], KIND_RECORD))
                       .as_py() or 0 for f in (self.run / "out").glob("part-*.parquet"))
        return sum(pq.ParquetFile(f).metadata.num_rows
                   for f in flinkish.parquet_files(str(self.run / "out")))


def run_once(spark: Any, kind: str, *, bootstrap: str, topic: str, dsn: str, max_offsets: int,
             workdir: Path, timeout: float, name: str, expected: int | None,
             server: int | None) -> Run:
    """One AvailableNow query from the topic into ``kind``; timed from start() to the end.
    ``server``: PostgreSQL's pid, whose CPU (and its backends') is counted as ``postgres``."""
    run = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    df = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets))
        .option("watermark.maxOutOfOrderness", MAX_OUT_OF_ORDERNESS)
        .option("checkpointing.location", str(run / "source-state"))
        .load()
    )
    sinks = Sinks(dsn, run, name)
    with CpuMeter() as cpu, CpuMeter(server or os.getpid()) as pg:
        result = run_to_end(sinks.writer(df, kind).trigger(availableNow=True),
                            f"{kind} query", timeout)
    seconds = dict(cpu.seconds)
    if server is not None:
        seconds["postgres"] = round(sum(v for k, v in pg.seconds.items()
                                        if k != "other_processes"), 2)
        # pg_ctl's server is not this process's descendant: the machine's rest counted it too
        seconds["other_processes"] = round(
            max(0.0, seconds.get("other_processes", 0.0) - seconds["postgres"]), 2)
    if kind in ("noop", FLOOR, SPARK_PARQUET):
        spans, epochs = [], len(result.progress)
        rows = sinks.rows(kind) if kind == SPARK_PARQUET else expected or 0
    else:
        spans = commit_spans(run / "checkpoint")
        rows, epochs = sinks.rows(kind), len(spans)
    if expected is not None and rows != expected:
        raise RuntimeError(f"{kind} wrote {rows:,} rows, expected {expected:,}")
    shutil.rmtree(run, ignore_errors=True)
    phases: dict[str, int] = {}
    for progress in result.progress:
        for phase, ms in progress["durationMs"].items():
            phases[phase] = phases.get(phase, 0) + int(ms)
    return Run(kind, result.seconds, rows, epochs, spans, seconds, phases)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help="the flinkish sink's targets to run beside noop, comma-separated")
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4,
                        help="maxOffsetsPerTrigger = ceil(rows / epochs)")
    parser.add_argument("--repeat", type=int, default=3, help="median of N runs per sink")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--warmup-rows", type=int, default=8_000)
    parser.add_argument("--cores", type=int, default=2, help="Spark's local[N]")
    parser.add_argument("--session", choices=("plain", "demo"), default="plain",
                        help="plain: the README's session; demo: the demo's and the tests'")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per query")
    args = parser.parse_args(argv)
    if min(args.rows, args.partitions, args.epochs, args.repeat, args.warmup_rows) < 1:
        parser.error("--rows, --partitions, --epochs, --repeat, --warmup-rows must be positive")
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown or not args.targets:
        parser.error(f"--targets: {unknown or 'none'}; choose from {', '.join(TARGETS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    max_offsets = math.ceil(args.rows / args.epochs)
    sinks = ["noop", FLOOR, SPARK_PARQUET, *args.targets]
    runs: dict[str, list[Run]] = {kind: [] for kind in sinks}
    load_start = os.getloadavg()[0]
    if "TieredStopAtLevel" in os.environ.get("SPARK_SUBMIT_OPTS", ""):
        log("SPARK_SUBMIT_OPTS limits the JVM's JIT (as dev/test.sh does for tests): the "
            "Python sinks' ratios come out lower than a user's JVM gives them")
    with bench_environment("flinkish-pipeline-", postgres="postgres" in args.targets) as env:
        topic, warmup_topic = "bench-pipeline", "bench-pipeline-warmup"
        env.prepare_topics(args.partitions, args.value_bytes, (topic, args.rows),
                           (warmup_topic, args.warmup_rows), "not timed")
        spark, startup = env.start_spark("flinkish-pipeline-bench", args.cores, args.session)
        log(f"SparkSession up in {startup:.1f} s")
        spark.dataSource.register(FloorSink)
        server = postmaster(env.dsn)

        def query(kind: str, source: str, limit: int, name: str, expected: int | None) -> Run:
            result = run_once(spark, kind, bootstrap=env.bootstrap, topic=source, dsn=env.dsn,
                              max_offsets=limit, workdir=env.workdir, timeout=args.timeout,
                              name=name, expected=expected, server=server)
            log(f"  {kind}: {result.rows:,} rows in {result.seconds:.2f} s = "
                f"{result.rps:,.0f} rows/s; {result.epochs} epochs; decision->completion ms "
                f"{result.commit_ms}; CPU s {result.cpu}; batches' ms {result.phases_ms}")
            return result

        for kind in sinks:
            log(f"warm-up: {args.warmup_rows:,} rows into {kind} (not timed)")
            query(kind, warmup_topic, math.ceil(args.warmup_rows / 2), f"warmup_{kind}",
                  args.warmup_rows if kind in (SPARK_PARQUET, *args.targets) else None)
        log(f"priming: the whole topic into {args.targets[0]} (not timed)")
        query(args.targets[0], topic, max_offsets, "prime", args.rows)

        for run in range(args.repeat):
            shift = run % len(sinks)
            for kind in sinks[shift:] + sinks[:shift]:
                log(f"run {run + 1}/{args.repeat}: {kind}, {args.rows:,} rows, "
                    f"maxOffsetsPerTrigger {max_offsets:,}")
                runs[kind].append(query(kind, topic, max_offsets, f"bench_{kind}_{run}",
                                        args.rows))

    rps = {kind: median([r.rps for r in runs[kind]]) for kind in sinks}
    result: dict[str, Any] = {
        "bench": "pipeline",
        "session": args.session,
        "rows": args.rows,
        "partitions": args.partitions,
        "epochs": args.epochs,
        "max_offsets_per_trigger": max_offsets,
        "value_bytes": args.value_bytes,
        "repeat": args.repeat,
        "spark_cores": args.cores,
        "load_1m": [round(load_start, 1), round(os.getloadavg()[0], 1)],
        "spark_submit_opts": os.environ.get("SPARK_SUBMIT_OPTS", ""),
        "noop_rps": round(rps["noop"]),
    }
    for kind in (FLOOR, SPARK_PARQUET, *args.targets):
        result[f"{kind}_rps"] = round(rps[kind])
        result[f"{kind}_ratio"] = round(rps[kind] / rps["noop"], 3)
        if kind in args.targets:
            result[f"{kind}_ratio_vs_python_floor"] = round(rps[kind] / rps[FLOOR], 3)
        result[f"{kind}_ratio_runs"] = [
            round(r.rps / n.rps, 3) for r, n in zip(runs[kind], runs["noop"], strict=True)]
        if kind in args.targets:
            result[f"{kind}_median_epoch_commit_ms"] = median(
                [ms for r in runs[kind] for ms in r.commit_ms])
    if "parquet" in args.targets:
        result["parquet_ratio_vs_spark_parquet"] = round(rps["parquet"] / rps[SPARK_PARQUET], 3)
    result["seconds"] = {kind: [round(r.seconds, 3) for r in runs[kind]] for kind in sinks}
    result["cpu_s_per_million_rows"] = {
        kind: {what: round(median([r.cpu.get(what, 0.0) for r in runs[kind]]) * 1e6 / args.rows,
                           2)
               for what in sorted({w for r in runs[kind] for w in r.cpu})}
        for kind in sinks}
    result["batches_ms"] = {
        kind: {phase: median([r.phases_ms.get(phase, 0) for r in runs[kind]])
               for phase in sorted({p for r in runs[kind] for p in r.phases_ms})}
        for kind in sinks}
    result["target_ratio"] = TARGET_RATIO
    result["excluded_from_rps"] = (
        "SparkSession start-up; JVM and Python worker warm-up (a query of "
        f"{args.warmup_rows} rows into each sink first, then the whole topic once into "
        f"{args.targets[0]})")
    print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
