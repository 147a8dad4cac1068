"""Benchmark: how soon a query restarted after a crash commits its next epoch, flinkish against
Spark's own pipeline, side by side in one run.

Run from the repository root: ``python bench/recovery.py [--repeats 3] [--rate 400]
[--partitions 4] [--no-postgres]``.

Why: exactly once through a crash is half of what Flink promises; the other half is being back
quickly from the last checkpoint. Every second between the restart and the first commit after
it is a second of lag added to every recovery.

* The embedded broker and PostgreSQL (``bench/_common.bench_environment``); each flinkish run
  gets a new topic of ``--partitions`` partitions, fed ``--rate`` records per second from its
  creation on (the embedded broker keeps every record in memory: one topic fed for the whole
  run made it stop answering).
* Each pipeline runs as its own driver process (``local[2]``, ``flinkish.demo.spark_session``;
  this script with ``--driver``), trigger 1 s:

  - ``spark``: Spark's ``rate`` source (``--rate`` rows/s) -> Spark's Parquet file sink;
  - ``flinkish``: the flinkish source (the topic, from its start) -> the flinkish
    exactly-once sink into Parquet;
  - ``flinkish_postgres``: the same into PostgreSQL.

* A run: start the driver; once it has committed two batches and planned the next (a new entry
  in the checkpoint's ``offsets/`` beyond its ``commits/``: the crash lands in an undecided
  epoch), SIGKILL its whole process tree (``flinkish.demo.processes.kill_tree``: pyspark's
  worker daemon has a process group of its own); start a fresh driver on the same checkpoint
  and time restart -> the first new entry in ``commits/``. Pipelines take turns, so each
  repeat measures them under the same load; the median of ``--repeats`` is reported.
* The restarted driver prints when it got where (after its imports, the SparkSession,
  ``flinkish.register``, ``writeStream.start()``) and Spark's progress report of its first
  batch; the breakdown's phases come from those, the first batch's from ``durationMs``.

The last stdout line is one JSON object: ``recovery_s``, ``spark_recovery_s``,
``postgres_recovery_s``, ``ratio_vs_spark`` (target <= 1.2), each run's seconds, and
``breakdown``: the median seconds of each phase per pipeline and flinkish's extra over Spark's
(``process_start``: interpreter and pyspark imports; ``session``: the SparkSession's JVM;
``register``: ``flinkish.register`` and its worker check; ``query_start``: ``start()``;
``source_start``: from ``start()`` to the first batch's trigger (the source's Python runner,
its planning and state restore); ``first_batch``: the first batch's own phases, ``addBatch``
holding its tasks and the sink's commit with the recovery of an undecided epoch), and
``busy_machine`` (other Java processes were running: the figures are from a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import bench_environment, log, median, print_result  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from latency import java_processes  # noqa: E402

TARGET_RATIO = 1.2
TRIGGER = "1 second"
PIPELINES = ("spark", "flinkish", "flinkish_postgres")
#: committed batches before the crash (then it lands in the next, planned but not committed)
COMMITTED_BEFORE_CRASH = 2
#: what the driver prints: ``@ <mark> <epoch seconds>`` and ``progress <json>``
MARK, PROGRESS = "@", "progress"
PHASES = ("process_start", "session", "register", "query_start", "source_start")
DRIVER_TIMEOUT_S = 300.0


# -- the driver process ------------------------------------------------------------------------

def plain_session(app: str) -> Any:
    """The session of the README and the getting-started page: Spark's defaults, a local
    master, two shuffle partitions (the driver runs with the virtualenv's ``bin`` first on its
    PATH, as an activated virtualenv has it)."""
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2]").appName(app)
            .config("spark.sql.shuffle.partitions", "2").getOrCreate())


def demo_session(app: str) -> Any:
    """``flinkish.demo.spark_session.local_session``: the demo's and the tests' session."""
    from flinkish.demo.spark_session import local_session

    return local_session(app)


SESSIONS = {"plain": plain_session, "demo": demo_session}


def mark(name: str) -> None:
    print(f"{MARK} {name} {time.time():.3f}", flush=True)


def driver(args: argparse.Namespace) -> None:
    """One pipeline's query in this process, until killed."""
    mark("imports")
    spark = SESSIONS[args.session](f"flinkish-recovery-{args.pipeline}")
    mark("session")
    if args.pipeline != "spark":
        import flinkish

        flinkish.register(spark)
    mark("register")
    checkpoint = os.path.join(args.workdir, "checkpoint")
    if args.pipeline == "spark":
        rows = spark.readStream.format("rate").option("rowsPerSecond", args.rate).load()
        writer = rows.writeStream.format("parquet").option("path", os.path.join(
            args.workdir, "output"))
    else:
        rows = (
            spark.readStream.format("flinkish")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("subscribe", args.topic)
            .option("startingOffsets", "earliest")
            .option("checkpointing.location", os.path.join(args.workdir, "source-state"))
            .load()
        )
        writer = rows.writeStream.format("flinkish")
        if args.pipeline == "flinkish_postgres":
            writer = writer.option("target", "postgres").option("dsn", args.dsn).option(
                "table", f"recovery_{os.path.basename(args.workdir).replace('-', '_')}")
        else:
            writer = writer.option("target", "parquet").option(
                "path", os.path.join(args.workdir, "output"))
    query = writer.option("checkpointLocation", checkpoint).trigger(
        processingTime=TRIGGER).start()
    mark("started")
    reported: set[int] = set()
    while query.isActive:
        for report in query.recentProgress:
            if report.batchId not in reported:
                reported.add(report.batchId)
                print(f"{PROGRESS} {json.dumps(json.loads(report.json))}", flush=True)
        time.sleep(0.1)
    raise SystemExit(f"the query ended: {query.exception()}")


# -- the bench ---------------------------------------------------------------------------------

class TopicFeeder(threading.Thread):
    """``rate`` records per second, round-robin over the partitions, into ``topic`` (which the
    bench points at a new topic before each flinkish run: the embedded broker keeps every
    record in memory, and a run reads its topic from the start)."""

    def __init__(self, bootstrap: str, partitions: int, rate: int) -> None:
        super().__init__(name="topic-feeder", daemon=True)
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        self._partitions, self._rate = partitions, rate
        self.topic: str | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        started, n = time.monotonic(), 0
        while not self.stopping.is_set():
            due = int((time.monotonic() - started) * self._rate)
            topic = self.topic
            while n < due:
                if topic is not None:
                    self._producer.produce(topic, value=b"%020d" % n, key=b"k%09d" % n,
                                           partition=n % self._partitions)
                n += 1
            self._producer.poll(0)
            time.sleep(0.01)
        self._producer.flush(30)


def batches(checkpoint: Path, log_dir: str) -> set[int]:
    """The batch ids with an entry in the checkpoint's ``offsets/`` or ``commits/``."""
    try:
        return {int(n) for n in os.listdir(checkpoint / log_dir) if n.isdigit()}
    except FileNotFoundError:
        return set()


def launch(args: argparse.Namespace, pipeline: str, workdir: Path, log_file: Path
           ) -> subprocess.Popen[bytes]:
    command = [sys.executable, str(Path(__file__).resolve()), "--driver", pipeline,
               "--session", args.session, "--workdir", str(workdir), "--rate", str(args.rate),
               "--bootstrap", args.bootstrap, "--topic", args.topic, "--dsn", args.dsn]
    with open(log_file, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=str(Path(__file__).resolve().parent.parent),
                                env=driver_environment())


def driver_environment() -> dict[str, str]:
    """A user's shell with the virtualenv activated: its ``bin`` first on the PATH (Spark
    starts its Python workers with ``python3`` from there), none of the variables the demo
    session sets for its workers."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env["VIRTUAL_ENV"] = sys.prefix
    return env


def wait_for(condition: Any, what: str, proc: subprocess.Popen[bytes], log_file: Path) -> None:
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_file.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"waiting for {what}: the driver "
                               + (f"exited with {proc.returncode}" if proc.poll() is not None
                                  else f"did not get there in {DRIVER_TIMEOUT_S:g} s")
                               + f"\n{tail}")
        time.sleep(0.05)


def one_recovery(args: argparse.Namespace, pipeline: str, workdir: Path
                 ) -> dict[str, Any]:
    """Crash ``pipeline``'s driver mid-stream, restart it; the seconds to the first commit
    after the restart and the restarted driver's phases."""
    from flinkish.demo.processes import kill_tree

    checkpoint = workdir / "checkpoint"
    first_log, second_log = workdir / "crashed.log", workdir / "restarted.log"
    proc = launch(args, pipeline, workdir, first_log)
    try:
        wait_for(lambda: len(batches(checkpoint, "commits")) >= COMMITTED_BEFORE_CRASH
                 and max(batches(checkpoint, "offsets")) > max(batches(checkpoint, "commits")),
                 "a batch planned after two committed", proc, first_log)
    finally:
        kill_tree(proc.pid)
    committed = batches(checkpoint, "commits")
    restarted = time.time()
    proc = launch(args, pipeline, workdir, second_log)
    try:
        wait_for(lambda: batches(checkpoint, "commits") - committed, "a commit after the restart",
                 proc, second_log)
        seconds = time.time() - restarted
        wait_for(lambda: PROGRESS + " " in second_log.read_text(errors="replace"),
                 "the first batch's progress report", proc, second_log)
    finally:
        kill_tree(proc.pid)
    return {"seconds": seconds, **phases(second_log.read_text(errors="replace"), restarted)}


def phases(output: str, restarted: float) -> dict[str, Any]:
    """The restarted driver's phases (seconds) from its marks and its first progress report."""
    marks: dict[str, float] = {}
    first: dict[str, Any] | None = None
    for line in output.splitlines():
        if line.startswith(MARK + " "):
            _, name, at = line.split()
            marks[name] = float(at)
        elif line.startswith(PROGRESS + " ") and first is None:
            first = json.loads(line[len(PROGRESS) + 1:])
    if first is None:
        raise RuntimeError("the restarted driver printed no progress report")
    from datetime import datetime

    triggered = datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00")).timestamp()
    points = [restarted, marks["imports"], marks["session"], marks["register"],
              marks["started"], triggered]
    out: dict[str, Any] = {name: points[i + 1] - points[i] for i, name in enumerate(PHASES)}
    out["first_batch"] = {k: v / 1000 for k, v in first["durationMs"].items()}
    out["first_batch_id"] = first["batchId"]
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each phase over the runs of one pipeline."""
    out: dict[str, Any] = {name: round(median([r[name] for r in runs]), 2) for name in PHASES}
    keys = sorted({k for r in runs for k in r["first_batch"]})
    out["first_batch"] = {k: round(median([r["first_batch"].get(k, 0) for r in runs]), 2)
                          for k in keys}
    return out


def extra(flinkish: dict[str, Any], spark: dict[str, Any]) -> dict[str, Any]:
    """flinkish's phases minus Spark's."""
    out: dict[str, Any] = {name: round(flinkish[name] - spark[name], 2) for name in PHASES}
    keys = sorted(set(flinkish["first_batch"]) | set(spark["first_batch"]))
    out["first_batch"] = {k: round(flinkish["first_batch"].get(k, 0)
                                   - spark["first_batch"].get(k, 0), 2) for k in keys}
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate", type=int, default=400, help="records (rows) per second")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--session", choices=tuple(SESSIONS), default="plain",
                        help="the drivers' SparkSession: plain (the README's, the default) or "
                             "demo (flinkish.demo.spark_session.local_session)")
    parser.add_argument("--no-postgres", dest="postgres", action="store_false",
                        help="leave out the PostgreSQL variant")
    parser.add_argument("--driver", choices=PIPELINES, dest="pipeline", help=argparse.SUPPRESS)
    for hidden in ("--workdir", "--bootstrap", "--topic", "--dsn"):
        parser.add_argument(hidden, default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.repeats, args.rate, args.partitions) <= 0:
        parser.error("--repeats, --rate and --partitions must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pipeline:
        driver(args)
        return 0
    busy = java_processes()
    if busy:
        log(f"{busy} other Java process(es) running: the figures are from a shared machine")
    pipelines = [p for p in PIPELINES if args.postgres or p != "flinkish_postgres"]
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in pipelines}
    with bench_environment("flinkish-recovery-", postgres=args.postgres) as env:
        from flinkish.demo.embedded_kafka import create_topic

        args.bootstrap, args.dsn = env.bootstrap, env.dsn
        producer = TopicFeeder(env.bootstrap, args.partitions, args.rate)
        producer.start()
        try:
            for repeat in range(args.repeats):
                for pipeline in pipelines:
                    workdir = env.workdir / f"{pipeline}-{repeat}"
                    workdir.mkdir()
                    if pipeline != "spark":
                        args.topic = f"bench-recovery-{pipeline}-{repeat}"
                        create_topic(env.bootstrap, args.topic, args.partitions)
                        producer.topic = args.topic
                    run = one_recovery(args, pipeline, workdir)
                    runs[pipeline].append(run)
                    log(f"{pipeline} run {repeat + 1}/{args.repeats}: restart -> first commit "
                        f"{run['seconds']:.1f} s (" + ", ".join(
                            f"{k} {run[k]:.1f}" for k in PHASES)
                        + f", first batch {run['first_batch'].get('triggerExecution', 0):.1f})")
        finally:
            producer.stopping.set()
            producer.join()
    seconds = {p: [round(r["seconds"], 2) for r in rs] for p, rs in runs.items()}
    recovery, spark = median(seconds["flinkish"]), median(seconds["spark"])
    breakdown = {p: summarise(rs) for p, rs in runs.items()}
    result = {
        "bench": "recovery",
        "session": args.session,
        "rate": args.rate,
        "partitions": args.partitions,
        "repeats": args.repeats,
        "recovery_s": round(recovery, 2),
        "spark_recovery_s": round(spark, 2),
        "ratio_vs_spark": round(recovery / spark, 2),
        "target_ratio": TARGET_RATIO,
        "meets_target": recovery / spark <= TARGET_RATIO,
        "runs_s": seconds,
        "breakdown": breakdown,
        "flinkish_extra_s": extra(breakdown["flinkish"], breakdown["spark"]),
        "busy_machine": busy > 0,
    }
    if "flinkish_postgres" in seconds:
        result["postgres_recovery_s"] = round(median(seconds["flinkish_postgres"]), 2)
        result["postgres_ratio_vs_spark"] = round(result["postgres_recovery_s"] / spark, 2)
    log(f"restart -> first commit: flinkish {recovery:.1f} s, Spark {spark:.1f} s "
        f"({recovery / spark:.2f}x)")
    print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
