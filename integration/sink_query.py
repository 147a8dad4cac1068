"""Run flinkish source -> flinkish sink as its own Spark driver process (for crash tests).

One query::

    python integration/sink_query.py --bootstrap HOST:PORT --topic T --checkpoint DIR \\
        --target postgres --dsn DSN --table NAME   # or: --target parquet|delta --path DIR
                                                   # or: --target kafka --out-topic TOPIC
        [--trigger available-now | --trigger processing --until-offsets '{"T": {"0": 25}}']
        [--max-offsets N] [--master 'local[2,2]' | 'local-cluster[2,1,1024]']
        [--conf KEY=VALUE ...] [--query-name NAME]
        [--failpoint NAME --failpoint-file FILE [--failpoint-from-epoch N]]
        [--fail-first-attempt EPOCH:TASK[:kill] --evidence FILE [--batch-rows N]]
        [--windowed [DURATION]] [--ending-offsets JSON] [--idle-timeout DURATION]
        [--flink-windows [DURATION] [--allowed-lateness DURATION]] [--progress FILE]

Several queries in one driver (each with its own checkpoint and table / path)::

    python integration/sink_query.py --jobs jobs.json [--master ...] [--start-window K]

``jobs.json`` is a list of objects whose keys are the long option names above with ``_`` for
``-`` (``bootstrap``, ``topic``, ``checkpoint``, ``target``, ``dsn``, ``max_offsets``, …, plus
``name``, a label for the results); a failpoint is an object
``{"point": NAME, "marker": FILE, "from_epoch": N}``. Queries start one after another, at most
``--start-window`` of them before the earlier ones finished a batch (many queries starting at
once on 2 cores made Spark time out waiting for Python workers to connect back), then run
concurrently. The script exits when every query is done: 0 if all succeeded, 1 if any failed,
printing one JSON line per query (``{"name": …, "ok": …, "error": …, "last_batch": …}``);
with ``--report-early`` each line as soon as that query is done (in job order), and a query
that stopped at its failpoint is reported then (``"stopped_at": NAME``) and left there, for a
caller that SIGKILLs the driver once every query is reported.
A job's ``keep`` (jobs only) is a Spark SQL condition on the source's columns: only the
records it holds for are written (the source's marker rows all are), e.g.
``"(offset DIV 25) % 2 = 0"`` for epochs, or write tasks, without rows.
A job's ``sink_options`` (jobs only) is an object of further options for the sink, e.g.
``{"lateData": "side", "lateData.path": DIR}``. With ``--retry-transient N`` a query that
failed only because a new Python worker did not connect back within the 10 s Spark allows
(``PythonWorkerFactory.createSimpleWorker``, not configurable: a busy machine) is started again
from its checkpoint, up to N times (its result then says ``"restarts"``): the recovery a crash
gets, so the sink's guarantees must hold across it.

Failure injection:

* ``--failpoint NAME`` stops the query at ``checkpointing.failpoints.failpoint(NAME, …)``: the
  process that reaches it writes ``--failpoint-file`` and blocks, for the caller to SIGKILL the
  process tree. With ``--failpoint-from-epoch N`` it fires only in batches N and later, so
  the crash lands mid-stream. Each failpoint is armed for its own query's checkpoint, so
  each query of a ``--jobs`` run can stop at its own point.
* ``--fail-first-attempt EPOCH:TASK`` runs ``offset`` through an identity Python UDF that
  fails the first attempt of task TASK of batch EPOCH past its first UDF batch, *after* the
  sink's transaction of that attempt holds rows (it waits until it sees them in the target),
  writing what it saw to ``--evidence``; ``EPOCH:TASK:kill`` SIGKILLs the sink's write process
  instead of raising (the process holding the attempt's PostgreSQL session or staged file
  open), so the sink's own clean-up in ``write`` never runs. Needs task retries
  (``--master 'local[2,2]'``) for the query to succeed.
  ``--batch-rows N`` (rows per UDF batch; the sink's Arrow batches get N/2) must be well below
  the rows of one task, so that rows reach the sink before the failure.

Windows: ``--windowed`` (job key ``"windowed": true`` or a duration) puts
``flinkish.with_watermark`` and ``groupBy(window(eventTime, DURATION), "partition").count()``
(default 10 seconds) between source and sink, in append mode, so the sink gets one row per
closed window: ``window_start``, ``window_end``, ``partition``, ``count``. ``--ending-offsets``
and ``--idle-timeout`` set the source's ``endingOffsets`` and ``idleTimeout``; ``--progress``
appends the query's progress reports (one JSON object a line, as Spark reports them; a batch
may appear twice) to a file while it runs, so a killed run leaves them too.

Flink's windows: ``--flink-windows`` (job key ``"flink_windows": true`` or a duration) puts
``flinkish.with_watermark`` and ``flinkish.windows.window`` (a tumbling ``Count`` of DURATION,
default 10 seconds, keyed by ``partition`` and ``CAST(key AS STRING) AS key``, with
``--allowed-lateness``, job key ``allowed_lateness``, default 0) between source and sink, and
writes both kinds of its output into one PostgreSQL table with ``upsertKey``, so that a
window's later pane replaces its row and each late row is kept once: ``partition``, ``key``,
``kind`` (the operator's: ``result`` or ``late``; the sink writes it as data, since the
source's marker columns are not there), ``window_start``, ``window_end``, ``count``,
``pane_index``, ``pane_timing``, ``pane_is_last``, and for late rows ``late_time`` (the
element's event time) and ``offset`` (the element, handed to the window function as its
value). A pane has no offset and a late row no window, and a primary key allows no NULLs, so
the driver creates the table first (if missing) with a unique index ``NULLS NOT DISTINCT`` on
the upsert key ``partition, key, window_start, window_end, offset``. The RocksDB state store
that ``transformWithState`` needs is set for the driver's queries.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from checkpointing import failpoints  # noqa: E402
from flinkish.demo.spark_session import worker_start_timed_out  # noqa: E402

_JOB_KEYS = {
    "name", "bootstrap", "topic", "checkpoint", "source_state", "target", "dsn", "table",
    "path", "prefix", "trigger", "until_offsets", "max_offsets", "fail_first_attempt",
    "evidence", "out_of_orderness", "query_name", "failpoint", "udf_batch_rows", "sink_options",
    "windowed", "ending_offsets", "idle_timeout", "progress", "flink_windows",
    "allowed_lateness", "keep", "out_topic",
}
DEFAULT_WINDOW = "10 seconds"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: The upsert key of ``--flink-windows``: a pane's window and key, or a late row's element.
FLINK_WINDOWS_KEY = ("partition", "key", "window_start", "window_end", "offset")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--jobs", help="JSON file with a list of query configurations")
    p.add_argument("--name", help="label of the query in the results")
    p.add_argument("--query-name", dest="query_name", help="Spark's queryName of the query")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers")
    p.add_argument("--topic", help="topic to read (from the earliest offsets)")
    p.add_argument("--checkpoint", help="the query's checkpointLocation")
    p.add_argument("--source-state", dest="source_state",
                   help="the source's checkpointing.location (default: <checkpoint>-source)")
    p.add_argument("--target", choices=("postgres", "parquet", "delta", "iceberg", "kafka"))
    p.add_argument("--out-topic", dest="out_topic",
                   help="target kafka: the topic written to, on the --bootstrap broker (the "
                        "source's rows, their markers and position columns included)")
    p.add_argument("--dsn")
    p.add_argument("--table")
    p.add_argument("--path")
    p.add_argument("--prefix", help="transactionalIdPrefix")
    p.add_argument("--trigger", choices=("available-now", "processing"))
    p.add_argument("--until-offsets", dest="until_offsets",
                   help='with --trigger processing: stop once every listed partition is read '
                        'up to the offset, e.g. \'{"topic": {"0": 100, "1": 100}}\'')
    p.add_argument("--max-offsets", dest="max_offsets", type=int,
                   help="maxOffsetsPerTrigger (records per micro-batch over all partitions)")
    p.add_argument("--out-of-orderness", dest="out_of_orderness",
                   help="watermark.maxOutOfOrderness of the source (default 1 second)")
    p.add_argument("--master", default="local[2]",
                   help="local[N], local[N,maxFailures] or local-cluster[N,cores,MB]")
    p.add_argument("--batch-rows", dest="batch_rows", type=int,
                   help="rows per batch to Python UDFs (and half as many to the sink)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark configuration setting (repeatable)")
    p.add_argument("--start-window", dest="start_window", type=int, default=1,
                   help="queries that may be starting (no batch finished yet) at once")
    p.add_argument("--report-early", dest="report_early", action="store_true",
                   help="print each query's result line as soon as it is done")
    p.add_argument("--retry-transient", dest="retry_transient", type=int, default=0,
                   metavar="N", help="start a query that failed because a Python worker did "
                   "not connect back in time again from its checkpoint, up to N times")
    p.add_argument("--together", action="store_true",
                   help="start every query at the same moment, each from its own thread")
    p.add_argument("--no-register", dest="register", action="store_false",
                   help="skip flinkish.register(spark) (rely on automatic discovery alone)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="give up on the queries after this many seconds")
    p.add_argument("--failpoint", help="stop the query at this checkpointing failpoint")
    p.add_argument("--failpoint-file", dest="failpoint_file",
                   help="written when the failpoint is reached")
    p.add_argument("--failpoint-from-epoch", dest="failpoint_from_epoch", type=int, default=0,
                   help="the failpoint fires only in batch N and later")
    p.add_argument("--fail-first-attempt", dest="fail_first_attempt", metavar="EPOCH:TASK",
                   help="fail attempt 0 of this task after the sink wrote rows in it")
    p.add_argument("--evidence", help="with --fail-first-attempt: JSON written by the failure")
    p.add_argument("--windowed", nargs="?", const=DEFAULT_WINDOW, metavar="DURATION",
                   help="write with_watermark -> groupBy(window(eventTime, DURATION), "
                        f"partition).count() in append mode (default {DEFAULT_WINDOW})")
    p.add_argument("--ending-offsets", dest="ending_offsets",
                   help="endingOffsets of the source (latest or JSON): a bounded query")
    p.add_argument("--idle-timeout", dest="idle_timeout", help="idleTimeout of the source")
    p.add_argument("--progress", help="append the query's progress reports to this file")
    p.add_argument("--flink-windows", dest="flink_windows", nargs="?", const=DEFAULT_WINDOW,
                   metavar="DURATION",
                   help="write with_watermark -> flinkish.windows (tumbling Count of DURATION "
                        f"per partition and key; default {DEFAULT_WINDOW}) with upsertKey")
    p.add_argument("--allowed-lateness", dest="allowed_lateness",
                   help="with --flink-windows: the window operator's allowed lateness")
    return p


def _jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.jobs:
        jobs = json.loads(Path(args.jobs).read_text())
        if not isinstance(jobs, list) or not jobs:
            raise SystemExit("--jobs: expected a non-empty JSON list of objects")
    else:
        job = {k: getattr(args, k) for k in _JOB_KEYS - {"failpoint"}
               if getattr(args, k, None) is not None}
        if args.failpoint:
            if not args.failpoint_file:
                raise SystemExit("--failpoint needs --failpoint-file")
            job["failpoint"] = {"point": args.failpoint, "marker": args.failpoint_file,
                                "from_epoch": args.failpoint_from_epoch}
        jobs = [job]
    checked = []
    for i, raw in enumerate(jobs):
        job = {"trigger": "available-now", "out_of_orderness": "1 second", **raw}
        unknown = sorted(set(job) - _JOB_KEYS)
        if unknown:
            raise SystemExit(f"job {i}: unknown keys {unknown}")
        for key in ("bootstrap", "topic", "checkpoint", "target"):
            if not job.get(key):
                raise SystemExit(f"job {i}: {key} is required")
        if job["target"] == "postgres" and not (job.get("dsn") and job.get("table")):
            raise SystemExit(f"job {i}: target postgres needs dsn and table")
        if job["target"] in ("parquet", "delta") and not job.get("path"):
            raise SystemExit(f"job {i}: target {job['target']} needs path")
        if job["target"] == "kafka" and not job.get("out_topic"):
            raise SystemExit(f"job {i}: target kafka needs out_topic")
        if job["target"] == "iceberg" and not job.get("table"):
            raise SystemExit(f"job {i}: target iceberg needs table (and catalog.* in "
                             "sink_options)")
        if job["trigger"] == "processing" and not job.get("until_offsets"):
            raise SystemExit(f"job {i}: trigger processing needs until_offsets")
        if job.get("fail_first_attempt") and not job.get("evidence"):
            raise SystemExit(f"job {i}: fail_first_attempt needs evidence")
        if not isinstance(job.get("sink_options", {}), dict):
            raise SystemExit(f"job {i}: sink_options must be an object of sink options")
        for key in ("windowed", "flink_windows"):  # true, false or the window's duration
            if job.get(key) is True:
                job[key] = DEFAULT_WINDOW
            elif job.get(key) is False:
                del job[key]
            elif key in job and not isinstance(job[key], str):
                raise SystemExit(f"job {i}: {key} must be true, false or a duration")
        if job.get("flink_windows") and (job.get("windowed") or job["target"] != "postgres"):
            raise SystemExit(f"job {i}: flink_windows needs target postgres, without windowed")
        if job.get("allowed_lateness") and not job.get("flink_windows"):
            raise SystemExit(f"job {i}: allowed_lateness applies only with flink_windows")
        if isinstance(job.get("ending_offsets"), dict):
            job["ending_offsets"] = json.dumps(job["ending_offsets"])
        job["checkpoint"] = os.path.abspath(job["checkpoint"])
        job.setdefault("name", Path(job["checkpoint"]).name)
        job.setdefault("source_state", job["checkpoint"].rstrip("/") + "-source")
        checked.append(job)
    return checked


def _install_failpoints(jobs: list[dict[str, Any]]) -> None:
    """Before Spark starts (its JVM and every Python worker inherit the environment): arm the
    jobs' failpoints (``checkpointing.failpoints``), each for its own query's checkpoint."""
    specs = [
        {**job["failpoint"], "checkpoint": job["checkpoint"],
         "marker": os.path.abspath(job["failpoint"]["marker"])}
        for job in jobs if job.get("failpoint")
    ]
    if not specs:
        return
    parent = Path(jobs[0]["checkpoint"]).parent
    parent.mkdir(parents=True, exist_ok=True)
    handle, path = tempfile.mkstemp(prefix=".failpoints-", suffix=".json", dir=parent)
    with os.fdopen(handle, "w") as f:
        json.dump(specs, f, indent=1)
    os.environ[failpoints.ENV] = path


# -- the failing UDF (runs in the executors' Python workers) ------------------------------

def _sink_attempt_has_rows(job: dict[str, Any], base: str) -> str | None:
    """How we can see that the sink's transaction of the attempt ``base`` (its id without
    the writer's run token) holds rows, or None if not yet."""
    if job["target"] == "postgres":
        import psycopg

        with psycopg.connect(job["dsn"], autocommit=True) as conn:
            row = conn.execute(
                "SELECT application_name, state, backend_xid::text FROM pg_stat_activity "
                "WHERE (application_name = %s OR application_name LIKE %s) "
                "AND backend_xid IS NOT NULL",
                [base, base + ":%"],
            ).fetchone()
        return None if row is None else f"session {row[0]} {row[1]} with xid {row[2]}"
    staging = Path(job["path"], "_flinkish_staging")
    name = base.replace(":", "~")
    files = sorted(
        str(p.relative_to(staging)) for p in staging.glob("*/*.parquet")
        if p.parent.name == name or p.parent.name.startswith(name + "~")
    )
    return f"staged {files}" if files else None


def _writer_pid(job: dict[str, Any], base: str) -> int | None:
    """The process of this driver (same session) holding the attempt's transaction open: the
    client end of its PostgreSQL session, or an open file in its staging directory."""
    if job["target"] == "postgres":
        import psycopg

        with psycopg.connect(job["dsn"], autocommit=True) as conn:
            row = conn.execute(
                "SELECT client_port FROM pg_stat_activity "
                "WHERE application_name = %s OR application_name LIKE %s",
                [base, base + ":%"],
            ).fetchone()
        if row is None or row[0] is None:
            return None
        wanted = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(table) as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == int(row[0]):
                        wanted.add(f"socket:[{fields[9]}]")

        def matches(link: str) -> bool:
            return link in wanted
    else:
        staging = Path(job["path"], "_flinkish_staging")
        name = base.replace(":", "~")
        dirs = [str(p) + "/" for p in staging.glob(name + "*")
                if p.name == name or p.name.startswith(name + "~")]

        def matches(link: str) -> bool:
            return any(link.startswith(d) for d in dirs)
    session = os.getsid(0)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if os.getsid(int(entry.name)) != session:
                continue
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if matches(os.readlink(fd)):
                        return int(entry.name)
    return None


def _fail_first_attempt(df: Any, job: dict[str, Any]) -> Any:
    """``df`` with ``offset`` through an identity Python UDF (row-at-a-time: pandas is not
    needed) that fails the first attempt of the chosen task at its first row past the first
    UDF batch, once the sink's transaction of that attempt holds rows: by raising, or with
    ``EPOCH:TASK:kill`` by SIGKILLing the sink's write process (whose ``write`` then cannot
    clean up after itself)."""
    from pyspark.sql.functions import col, udf

    epoch_s, task_s, *mode = job["fail_first_attempt"].split(":")
    fail_epoch, fail_task = int(epoch_s), int(task_s)
    kill = mode == ["kill"]
    prefix = job.get("prefix") or "flinkish"
    checkpoint, evidence = job["checkpoint"], job["evidence"]
    first_batch = int(job.get("udf_batch_rows") or 10)
    passed: dict[tuple[int, int, int], int] = {}

    def identity(offset: Any) -> Any:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        epoch = int(context.getLocalProperty("streaming.sql.batchId") or -1)
        key = (epoch, context.partitionId(), context.attemptNumber())
        seen_rows = passed.get(key, 0)
        passed[key] = seen_rows + 1
        if key != (fail_epoch, fail_task, 0) or seen_rows != first_batch:
            return offset
        from checkpointing.query import query_id

        base = f"{prefix}:{query_id(checkpoint)}:{epoch}:{fail_task}:0"
        deadline = time.monotonic() + 60
        seen = _sink_attempt_has_rows(job, base)
        while seen is None and time.monotonic() < deadline:
            time.sleep(0.1)
            seen = _sink_attempt_has_rows(job, base)
        found: dict[str, Any] = {"attempt": base, "seen": seen, "rows_passed": seen_rows}
        if kill:
            import signal

            pid = _writer_pid(job, base) if seen else None
            if pid is not None:
                found["killed"] = {"pid": pid, "cmdline": Path(f"/proc/{pid}/cmdline")
                                   .read_bytes().replace(b"\0", b" ").decode(errors="replace")}
            Path(evidence).write_text(json.dumps(found))
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                return offset  # the task fails when Spark next talks to the dead writer
        Path(evidence).write_text(json.dumps(found))
        raise RuntimeError(f"injected failure of {base} (sink transaction: {seen})")

    return df.withColumn("offset", udf(identity, "long", useArrow=False)(col("offset")))


# -- queries -------------------------------------------------------------------------------

def _start(spark: Any, job: dict[str, Any]) -> Any:
    reader = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", job["bootstrap"])
        .option("subscribe", job["topic"])
        .option("startingOffsets", "earliest")
        .option("checkpointing.location", job["source_state"])
        .option("kafkaConsumer.pollTimeoutMs", "20000")
        .option("watermark.maxOutOfOrderness", job["out_of_orderness"])
    )
    if job.get("max_offsets"):
        reader = reader.option("maxOffsetsPerTrigger", str(job["max_offsets"]))
    for key, option in (("ending_offsets", "endingOffsets"), ("idle_timeout", "idleTimeout")):
        if job.get(key):
            reader = reader.option(option, job[key])
    df = reader.load()
    if job.get("keep"):  # the records to write; the source's markers all go on to the sink
        df = df.filter(f"kind <> 'record' OR ({job['keep']})")
    if job.get("fail_first_attempt"):
        df = _fail_first_attempt(df, job)
    if job.get("windowed"):
        df = _windowed_count(df, job["windowed"])
    if job.get("flink_windows"):
        df = _flink_windows(df, job)
    writer = (
        df.writeStream.format("flinkish")
        .option("checkpointLocation", job["checkpoint"])
        .option("target", job["target"])
    )
    if job.get("windowed") or job.get("flink_windows"):
        writer = writer.outputMode("append")
    if job.get("flink_windows"):
        writer = writer.option("upsertKey", ",".join(FLINK_WINDOWS_KEY))
    if job["target"] == "kafka":
        writer = writer.option("kafka.bootstrap.servers", job["bootstrap"])
    for key, option in (("dsn", "dsn"), ("table", "table"), ("path", "path"),
                        ("prefix", "transactionalIdPrefix"), ("out_topic", "topic")):
        if job.get(key):
            writer = writer.option(option, job[key])
    for option, value in (job.get("sink_options") or {}).items():
        writer = writer.option(option, str(value))
    if job.get("query_name"):
        writer = writer.queryName(job["query_name"])
    if job["trigger"] == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="0 seconds")
    query = writer.start()
    if job.get("progress"):
        _ProgressFiles.get(spark).follow(query, job["progress"])
    return query


def _windowed_count(df: Any, duration: str) -> Any:
    """Spark's own windowed count on the combined watermark: one row per closed window."""
    from pyspark.sql import functions as F

    import flinkish

    counts = flinkish.with_watermark(df).groupBy(
        F.window("eventTime", duration), "partition").count()
    return counts.select(F.col("window.start").alias("window_start"),
                         F.col("window.end").alias("window_end"), "partition", "count")


def _flink_windows(df: Any, job: dict[str, Any]) -> Any:
    """Flink's window operator on the combined watermark: every pane and every late element
    as a row of one table (see the module docstring)."""
    from pyspark.sql import functions as F

    import flinkish
    from flinkish import windows

    events = flinkish.with_watermark(df).selectExpr(
        "partition", "CAST(key AS STRING) AS key", "offset", "eventTime")
    fired = windows.window(
        events, key=["partition", "key"], assigner=windows.tumbling(job["flink_windows"]),
        aggregate=windows.Count(), value="offset",
        allowed_lateness=job.get("allowed_lateness") or 0)
    return fired.select(
        "partition", "key", "kind", "window_start", "window_end",
        F.col("result").alias("count"), "pane_index", "pane_timing", "pane_is_last",
        F.col("eventTime").alias("late_time"), "offset")


def _flink_windows_table(job: dict[str, Any]) -> None:
    """Creates ``--flink-windows``' table if missing, with its upsert key as a unique index
    that treats NULLs as equal (PostgreSQL 15+): the sink would make the key a primary key,
    which allows no NULLs, and every row has some."""
    import psycopg
    from psycopg import sql

    schema, _, name = job["table"].rpartition(".")
    table = sql.Identifier(*([schema] if schema else []), name)
    with psycopg.connect(job["dsn"], autocommit=True) as conn:
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (\"partition\" integer, key text, kind text, "
            "window_start timestamptz, window_end timestamptz, \"count\" bigint, "
            "pane_index integer, pane_timing text, pane_is_last boolean, late_time timestamptz, "
            "\"offset\" bigint, UNIQUE NULLS NOT DISTINCT ({}))").format(
            table, sql.SQL(", ").join(sql.Identifier(c) for c in FLINK_WINDOWS_KEY)))


class _ProgressFiles:
    """Appends each followed query's progress reports to its file as Spark reports them (a
    listener, so a run that gets killed leaves the reports of the batches it finished)."""

    _instance: _ProgressFiles | None = None

    def __init__(self, spark: Any) -> None:
        import threading

        from pyspark.sql.streaming import StreamingQueryListener

        self._lock = threading.Lock()
        self._files: dict[str, str] = {}
        self._early: dict[str, list[str]] = {}  # reports of queries not followed yet
        files = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                files.write(str(event.progress.id), event.progress.json)

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        spark.streams.addListener(Listener())

    @classmethod
    def get(cls, spark: Any) -> _ProgressFiles:
        if cls._instance is None:
            cls._instance = cls(spark)
        return cls._instance

    def write(self, query_id: str, report: str) -> None:
        line = json.dumps(json.loads(report)) + "\n"
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
            lines = self._early.pop(str(query.id), [])
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(lines)

    def finish(self, query: Any) -> None:
        """At the end of a run: Spark's reports of it once more (the listener gets them
        asynchronously, so the last may still be on its way when the driver stops)."""
        with self._lock:
            path = self._files.get(str(query.id))
            if path is None:
                return
            with open(path, "a", encoding="utf-8") as f:
                for report in query.recentProgress:
                    f.write(json.dumps(json.loads(report.json)) + "\n")


def _reached(query: Any, until: dict[str, dict[str, int]]) -> bool:
    """Whether the query's last finished batch read every listed partition up to its offset."""
    progress = query.lastProgress
    if not progress or not progress.get("sources"):
        return False
    end = progress["sources"][0].get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    topics = (end or {}).get("topics", {})
    return all(
        int(topics.get(topic, {}).get(str(part), {}).get("offset", -1)) >= int(offset)
        for topic, parts in until.items() for part, offset in parts.items()
    )


def _settled(query: Any, job: dict[str, Any]) -> bool:
    """Past start-up: a batch finished, the query ended, or it stopped at its failpoint."""
    marker = (job.get("failpoint") or {}).get("marker")
    return bool(not query.isActive or query.recentProgress
                or (marker and os.path.exists(marker)))


def _wait(query: Any, job: dict[str, Any], deadline: float,
          idle: Callable[[], bool] | None = None) -> None:
    """Until the query is done; ``idle`` is called about every second meanwhile, and the
    waiting ends (the query left as it is) once it returns True."""
    if job["trigger"] == "available-now":
        while not query.awaitTermination(1.0) and time.monotonic() < deadline:
            if idle is not None and idle():
                return
    else:
        until = job["until_offsets"]
        until = json.loads(until) if isinstance(until, str) else until
        while query.isActive and not _reached(query, until) and time.monotonic() < deadline:
            time.sleep(0.2)
            if idle is not None and idle():
                return
        if query.isActive and _reached(query, until):
            query.stop()
    if query.isActive:
        query.stop()
        raise TimeoutError(f"query {job['name']} did not finish in time")
    failure = query.exception()
    if failure is not None:
        raise RuntimeError(str(failure))


def _parked(job: dict[str, Any]) -> str | None:
    """The failpoint the job's query stopped at (its marker is written), if it did."""
    marker = (job.get("failpoint") or {}).get("marker")
    with contextlib.suppress(OSError):
        if marker and Path(marker).read_text().strip():
            return str(job["failpoint"]["point"])
    return None


def _idle(args: argparse.Namespace, retries: _Retries,
          started: list[tuple[dict[str, Any], Any, BaseException | None]], i: int) -> bool:
    """While waiting on ``started[i]``: restart the later queries that failed only because a
    Python worker did not connect back; with ``--report-early``, stop waiting on a query
    parked at its failpoint."""
    if args.retry_transient:
        retries.sweep(started, i + 1)
    return bool(args.report_early and _parked(started[i][0]))


class _Retries:
    """``--retry-transient``: restarts queries that failed only because a Python worker did not
    connect back in time."""

    def __init__(self, spark: Any, limit: int) -> None:
        self._spark = spark
        self.limit = limit
        self.used: dict[str, int] = {}

    def check(self, started: list[tuple[dict[str, Any], Any, BaseException | None]],
              i: int) -> bool:
        """Start ``started[i]`` again if it failed that way and may still; whether it did."""
        job, query, _ = started[i]
        name = job["name"]
        if query is None or query.isActive or self.used.get(name, 0) >= self.limit:
            return False
        failure = query.exception()
        if not worker_start_timed_out(failure):
            return False
        self.used[name] = self.used.get(name, 0) + 1
        print(f"query {name}: a Python worker did not connect back in time; starting it again "
              f"from its checkpoint ({self.used[name]}/{self.limit})", file=sys.stderr,
              flush=True)
        try:
            started[i] = (job, _start(self._spark, job), None)
        except Exception as exc:
            started[i] = (job, None, exc)
        return True

    def sweep(self, started: list[tuple[dict[str, Any], Any, BaseException | None]],
              first: int = 0) -> None:
        for i in range(first, len(started)):
            self.check(started, i)


def _start_together(
    spark: Any, jobs: list[dict[str, Any]]
) -> list[tuple[dict[str, Any], Any, BaseException | None]]:
    """Start every query at once, each from its own thread behind one barrier, the way a
    driver that starts one query per topic from a thread pool does."""
    import threading

    barrier = threading.Barrier(len(jobs))
    started: list[tuple[dict[str, Any], Any, BaseException | None]] = [
        (job, None, None) for job in jobs]

    def run(i: int) -> None:
        try:
            # Spark looks Python data sources up in the JVM thread's active session, which a
            # new Python thread's JVM thread does not have (DATA_SOURCE_NOT_FOUND otherwise)
            from pyspark.sql import SparkSession

            SparkSession._get_j_spark_session_class(spark._jvm).setActiveSession(
                spark._jsparkSession)
            barrier.wait(60)
            started[i] = (jobs[i], _start(spark, jobs[i]), None)
        except Exception as exc:
            started[i] = (jobs[i], None, exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return started


def _shared_env_keys(spark: Any) -> list[str]:
    """The keys of the environment map every flinkish query of this driver shares."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    env = manager.lookupDataSource("flinkish").dataSourceCls().envVars()
    return sorted(env.keySet())


def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc))[-4000:]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    jobs = _jobs(args)
    match = re.fullmatch(r"local\[([0-9*]+(?:,[0-9]+)?)\]", args.master)
    cluster = re.fullmatch(r"local-cluster\[[0-9]+,[0-9]+,([0-9]+)\]", args.master)
    if match is None and cluster is None:
        raise SystemExit(f"--master {args.master!r}: expected local[N], local[N,F] or "
                         "local-cluster[N,C,M]")
    _install_failpoints(jobs)

    from flinkish.demo.spark_session import local_session

    # Python workers must connect back within this; 15 s (the default) was too short with many
    # queries starting on 2 busy cores
    conf = {"spark.python.authenticate.socketTimeout": "120s"}
    if args.batch_rows:
        # the sink's batches half as big as the UDF's: the writer's input side completes a
        # batch only when it has seen the row after it, so it must not wait on a UDF batch
        conf["spark.sql.execution.arrow.maxRecordsPerBatch"] = str(max(1, args.batch_rows // 2))
        conf["spark.sql.execution.python.udf.maxRecordsPerBatch"] = str(args.batch_rows)
        # and no 64 KiB socket buffers holding a batch back until the next one fills them
        conf["spark.sql.execution.python.udf.buffer.size"] = "16"
        conf["spark.sql.execution.pandas.udf.buffer.size"] = "16"
        for job in jobs:
            job["udf_batch_rows"] = args.batch_rows
    for setting in args.conf:
        key, sep, value = setting.partition("=")
        if not sep:
            raise SystemExit(f"--conf {setting!r}: expected KEY=VALUE")
        conf[key.strip()] = value.strip()
    if any(job.get("flink_windows") for job in jobs):
        conf.setdefault("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        for job in jobs:
            if job.get("flink_windows"):
                _flink_windows_table(job)
    if cluster is not None:
        # separate executor JVMs (each with its own Python workers): one must fit in its
        # worker's M MB
        conf.setdefault("spark.executor.memory", f"{min(512, int(cluster[1]))}m")
    spark = local_session("flinkish-sink-query", master=args.master, **conf)
    if args.register:
        import flinkish

        flinkish.register(spark)
    if any(job.get("progress") for job in jobs):
        _ProgressFiles.get(spark)  # listening before any query starts
    env_before = _shared_env_keys(spark)
    deadline = time.monotonic() + args.timeout
    started: list[tuple[dict[str, Any], Any, BaseException | None]] = []
    results = []
    retries = _Retries(spark, args.retry_transient)
    try:
        if args.together:
            started = _start_together(spark, jobs)
        for job in [] if args.together else jobs:
            while time.monotonic() < deadline and sum(
                    1 for j, q, _ in started if q is not None and not _settled(q, j)
            ) >= max(1, args.start_window):
                time.sleep(0.1)
                if args.retry_transient:
                    retries.sweep(started)
            try:
                started.append((job, _start(spark, job), None))
            except Exception as exc:  # a bad job must not hide the others' outcomes
                started.append((job, None, exc))
        for i in range(len(started)):
            while True:
                job, query, error = started[i]
                if query is not None and error is None:
                    idle = functools.partial(_idle, args, retries, started, i) if (
                        args.retry_transient or args.report_early) else None
                    try:
                        _wait(query, job, deadline, idle)
                    except Exception as exc:
                        error = exc
                if error is None or not args.retry_transient or not retries.check(started, i):
                    break
            if query is not None and job.get("progress"):
                _ProgressFiles.get(spark).finish(query)
            progress = None if query is None else query.lastProgress
            results.append({
                "name": job["name"], "ok": error is None,
                "last_batch": progress["batchId"] if progress else None,
                "error": None if error is None else _error(error),
            })
            if args.retry_transient:
                results[-1]["restarts"] = retries.used.get(job["name"], 0)
            if args.report_early and query is not None and query.isActive and _parked(job):
                results[-1].update(ok=False, stopped_at=_parked(job),
                                   error="stopped at its failpoint, left there")
            if args.report_early:
                print(json.dumps(results[-1]), flush=True)
        env = {"env_keys_before": env_before, "env_keys_after": _shared_env_keys(spark)}
    finally:
        for query in spark.streams.active:
            query.stop()
        spark.stop()
    for result in [] if args.report_early else results:
        print(json.dumps(result), flush=True)
    print(json.dumps(env), flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
