"""Benchmark: the flinkish sink into PostgreSQL, exactly-once against at-least-once.

Run from the repository root: ``python bench/sink_throughput.py [--rows N] [--partitions P]
[--epochs E] [--repeat R]``. Progress goes to stderr; the last line on
stdout is one json object of named figures.

What is measured, and how:

* The embedded Tansu broker (``flinkish.demo.embedded_kafka``) and an embedded PostgreSQL
  (``flinkish.demo.embedded_postgres``, ``fsync=off``, ``max_prepared_transactions=64``) are
  started;
  ``--rows`` records (a 10-byte key, ``--value-bytes`` of value, CreateTime timestamps climbing
  1 ms per record of a partition with up to 1 s of jitter) are produced round-robin over
  ``--partitions`` partitions. Producing is not timed.
* One ``Trigger.AvailableNow`` streaming query per mode: the flinkish Kafka source (markers on,
  ``watermark.maxOutOfOrderness`` 2 seconds, ``maxOffsetsPerTrigger`` = rows / ``--epochs``, so
  the rows arrive in that many epochs, one read task -- hence one write task -- per partition)
  into ``df.writeStream.format("flinkish")`` with ``target=postgres`` and ``deliveryGuarantee``
  ``exactly-once`` (tasks COPY into a transaction and PREPARE it; the driver decides, COMMIT
  PREPAREs and completes the epoch's checkpoint) or ``at-least-once`` (tasks COPY in autocommit
  mode; the driver only records the epoch). Each query writes to a fresh table with a fresh
  Spark checkpoint. ``*_rps`` = rows / seconds from ``writeStream.start()`` to the query's
  termination; it includes Spark's per-query and per-batch costs, which a user pays too.
  SparkSession start-up is not included, and a small warm-up query runs in each mode first, so
  JVM code loading and Python worker start-up are not counted either; then the whole topic is
  written once, untimed, at-least-once into a scratch table (the first full-size run was
  consistently the slowest, whichever mode ran it, also after a full read into the ``noop``
  sink: the PostgreSQL side warms up too).
* ``ratio`` = ``exactly_once_rps / at_least_once_rps`` (target >= 0.8).
* ``median_epoch_commit_ms`` is read from the sink's checkpoint records
  (``<checkpointLocation>/flinkish``, opened with ``CheckpointStore.reader``): for each completed
  epoch of the exactly-once query, ``completed_ms - created_ms``. ``created_ms`` is stamped in
  ``TwoPhaseCommitCoordinator.commit_epoch`` just before the decision record is written and
  ``completed_ms`` just before the completed record is written, so the span covers: writing the
  decision record, COMMIT PREPARED of every task's transaction, the recovery scan for lingering
  transactions, reading the previous checkpoint, the valve, and publishing the epoch row. It
  does not cover opening the store (fencing claim, temp clean-up), the completed record's own
  write and the settle step, nor Spark's work around ``commit()``. The at-least-once figure is
  reported beside it (its epochs decide nothing but still record and publish).
* The committed rows are counted in PostgreSQL after each query (exactly-once must hold exactly
  ``--rows``; no prepared transaction may remain).

Each mode runs ``--repeat`` times (default 3: on a shared 2-core machine single runs of the
same mode differed by up to 2x), alternating which goes first, and medians are reported
(``ratio_runs`` pairs the runs in order). The broker, PostgreSQL, the Spark session and its
JVM are stopped on every exit path, including errors and SIGTERM.
"""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from _common import (  # noqa: E402
    bench_environment,
    guarantee_bench_args,
    log,
    median,
    print_result,
    run_to_end,
)

from checkpointing import CheckpointStorage, CheckpointStore  # noqa: E402

MAX_OUT_OF_ORDERNESS = "2 seconds"
EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
TARGET_RATIO = 0.8
TARGET_COMMIT_MS = 25.0


@dataclass
class RunResult:
    guarantee: str
    seconds: float
    rows: int
    epochs: int
    tasks_per_epoch: list[int] = field(default_factory=list)
    commit_ms: list[int] = field(default_factory=list)
    batch_ms: list[dict[str, int]] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return self.rows / self.seconds


def commit_records(checkpoint: Path) -> tuple[list[int], list[int]]:
    """(decision -> completion ms, tasks) of every completed epoch in the sink's records."""
    view = CheckpointStore.reader(CheckpointStorage.open(str(checkpoint / "flinkish")))
    spans, tasks = [], []
    for epoch in view.completed_ids():
        record = view.completed(epoch)
        assert record is not None
        spans.append(record.completed_ms - record.created_ms)
        tasks.append(len(record.state["decision"]))
    return spans, tasks


def table_state(dsn: str, table: str) -> tuple[int, int]:
    """(rows in ``table``, prepared transactions left in the database)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        count = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
    assert count is not None and prepared is not None
    return int(count[0]), int(prepared[0])


def drop_tables(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{table}", "{table}_flinkish_epochs"')


def run_query(
    spark: Any,
    *,
    bootstrap: str,
    topic: str,
    dsn: str,
    table: str,
    guarantee: str,
    max_offsets: int,
    workdir: Path,
    timeout: float,
) -> RunResult:
    """One AvailableNow query from the topic into a fresh table; timed from start() to the end."""
    run = Path(tempfile.mkdtemp(prefix=f"{table}-", dir=workdir))
    checkpoint = run / "checkpoint"
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
    writer = (
        df.writeStream.format("flinkish")
        .option("target", "postgres")
        .option("dsn", dsn)
        .option("table", table)
        .option("deliveryGuarantee", guarantee)
        .option("checkpointing.retain", "1000000")  # keep every epoch's record for the report
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    result = run_to_end(writer, f"{guarantee} query", timeout)
    spans, tasks = commit_records(checkpoint)
    shutil.rmtree(run, ignore_errors=True)
    rows, prepared = table_state(dsn, table)
    if prepared:
        raise RuntimeError(f"{prepared} prepared transactions left after the {guarantee} query")
    batches = [
        {"batch": int(p["batchId"]), "rows": int(p["numInputRows"]), **p["durationMs"]}
        for p in result.progress
    ]
    return RunResult(guarantee, result.seconds, rows, len(spans), tasks, spans, batches)


def describe(result: RunResult) -> None:
    log(f"  {result.guarantee}: {result.rows:,} rows in {result.seconds:.2f} s = "
        f"{result.rps:,.0f} rows/s; {result.epochs} epochs; tasks per epoch "
        f"{sorted(set(result.tasks_per_epoch))}; decision->completion ms {result.commit_ms}")
    for b in result.batch_ms:
        others = ", ".join(f"{k} {v}" for k, v in sorted(b.items()) if k not in ("batch", "rows"))
        log(f"    batch {b['batch']}: {b['rows']:,} source rows (incl. markers); ms: {others}")


def main(argv: Sequence[str] | None = None) -> int:
    args = guarantee_bench_args(
        argv, (__doc__ or "").split("\n\n")[0], rows=1_000_000, partitions=8)
    max_offsets = math.ceil(args.rows / args.epochs)
    runs: dict[str, list[RunResult]] = {EXACTLY_ONCE: [], AT_LEAST_ONCE: []}
    with bench_environment("flinkish-sink-", postgres=True) as env:
        bootstrap, dsn, workdir = env.bootstrap, env.dsn, env.workdir
        topic, warmup_topic = "bench-sink", "bench-sink-warmup"
        env.prepare_topics(args.partitions, args.value_bytes, (topic, args.rows),
                           (warmup_topic, args.warmup_rows), "not timed")

        spark, startup = env.start_spark("flinkish-sink-bench", args.cores)
        log(f"SparkSession up in {startup:.1f} s")

        def query(source: str, table: str, guarantee: str, limit: int) -> RunResult:
            drop_tables(dsn, table)
            result = run_query(
                spark, bootstrap=bootstrap, topic=source, dsn=dsn, table=table,
                guarantee=guarantee, max_offsets=limit, workdir=workdir, timeout=args.timeout,
            )
            drop_tables(dsn, table)
            return result

        for guarantee in (EXACTLY_ONCE, AT_LEAST_ONCE):
            log(f"warm-up: {args.warmup_rows:,} rows {guarantee} (not timed)")
            warm = query(warmup_topic, f"warmup_{guarantee[:2]}", guarantee,
                         math.ceil(args.warmup_rows / 2))
            describe(warm)

        log("priming: the whole topic at-least-once into a scratch table (not timed)")
        describe(query(topic, "prime", AT_LEAST_ONCE, max_offsets))

        for run in range(args.repeat):
            order = (AT_LEAST_ONCE, EXACTLY_ONCE) if run % 2 == 0 else (
                EXACTLY_ONCE, AT_LEAST_ONCE)
            for guarantee in order:
                log(f"run {run + 1}/{args.repeat}: {guarantee}, {args.rows:,} rows, "
                    f"maxOffsetsPerTrigger {max_offsets:,}")
                result = query(topic, f"bench_{guarantee[:2]}_{run}", guarantee, max_offsets)
                describe(result)
                if guarantee == EXACTLY_ONCE and result.rows != args.rows:
                    raise RuntimeError(
                        f"exactly-once wrote {result.rows:,} rows, expected {args.rows:,}")
                if result.rows < args.rows:
                    raise RuntimeError(
                        f"{guarantee} wrote {result.rows:,} rows, expected >= {args.rows:,}")
                runs[guarantee].append(result)

    eo, alo = runs[EXACTLY_ONCE], runs[AT_LEAST_ONCE]
    eo_rps, alo_rps = median([r.rps for r in eo]), median([r.rps for r in alo])
    tasks = sorted({t for r in eo for t in r.tasks_per_epoch})
    if tasks != [args.partitions]:
        log(f"warning: exactly-once epochs had {tasks} write tasks, not {args.partitions}")
    eo_commit = [ms for r in eo for ms in r.commit_ms]
    alo_commit = [ms for r in alo for ms in r.commit_ms]
    print_result({
        "bench": "sink_throughput",
        "rows": args.rows,
        "partitions": args.partitions,
        "epochs": eo[0].epochs,
        "tasks_per_epoch": tasks[0] if len(tasks) == 1 else tasks,
        "max_offsets_per_trigger": max_offsets,
        "value_bytes": args.value_bytes,
        "repeat": args.repeat,
        "spark_cores": args.cores,
        "exactly_once_rps": round(eo_rps),
        "at_least_once_rps": round(alo_rps),
        "ratio": round(eo_rps / alo_rps, 3),
        "ratio_runs": [round(e.rps / a.rps, 3) for e, a in zip(eo, alo, strict=True)],
        "target_ratio": TARGET_RATIO,
        "median_epoch_commit_ms": median(eo_commit),
        "p90_epoch_commit_ms": sorted(eo_commit)[int(0.9 * (len(eo_commit) - 1))],
        "target_epoch_commit_ms": TARGET_COMMIT_MS,
        "epoch_commit_ms": eo_commit,
        "at_least_once_median_epoch_commit_ms": median(alo_commit),
        "exactly_once_seconds": [round(r.seconds, 3) for r in eo],
        "at_least_once_seconds": [round(r.seconds, 3) for r in alo],
        "epoch_commit_measures": (
            "completed_ms - created_ms of each completed exactly-once epoch's checkpoint record: "
            "decision record write + COMMIT PREPARED of every task + recovery scan + previous "
            "checkpoint read + valve + publish_epoch (not: opening the store, the completed "
            "record write, Spark's own work around commit())"
        ),
        "excluded_from_rps": "SparkSession start-up; JVM and Python worker warm-up (warm-up "
                             f"queries of {args.warmup_rows} rows in each mode ran first, then "
                             "one untimed at-least-once run over the whole topic)",
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
