"""Helpers shared by the bench scripts: progress on stderr, the final JSON line on stdout,
medians, the processes a run needs (``bench_environment``: the embedded broker, optionally
PostgreSQL, the input topics, a local SparkSession; all stopped on every exit path, SIGTERM
included), running an ``AvailableNow`` query to its end, and peak-memory and CPU sampling of
PySpark's Python workers from ``/proc``.

psutil is not installed on these machines, so processes are found and measured by reading
``/proc/<pid>/stat``, ``/proc/<pid>/cmdline`` and ``/proc/<pid>/status`` directly (Linux only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from confluent_kafka import Producer

#: Substrings of the command line of PySpark's Python processes: the worker daemon (which forks
#: the workers, so they share its command line) and workers started without the daemon.
PYSPARK_MARKERS = ("pyspark.daemon", "pyspark.worker")

#: CreateTime of a partition's first record; each later record of the partition is 1 ms later
#: plus the jitter below (cycled), so timestamps are slightly out of order (by up to 1 s).
BASE_MS = 1_700_000_000_000
JITTER_MS = (0, -800, 300, -1_000, 600, -200, 900, -500, 1_000, -100, 400)


def guarantee_bench_args(argv: Sequence[str] | None, description: str, rows: int,
                         partitions: int) -> argparse.Namespace:
    """The arguments of a bench that runs one pipeline exactly-once against at-least-once:
    ``--rows``, ``--partitions``, ``--epochs``, ``--repeat``, ``--value-bytes``,
    ``--warmup-rows``, ``--cores``, ``--timeout``, ``--session`` (see
    :meth:`BenchEnvironment.start_spark`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--partitions", type=int, default=partitions)
    parser.add_argument("--epochs", type=int, default=5,
                        help="maxOffsetsPerTrigger = ceil(rows / epochs)")
    parser.add_argument("--repeat", type=int, default=3, help="median of N runs per mode")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--warmup-rows", type=int, default=8_000)
    parser.add_argument("--cores", type=int, default=2, help="Spark's local[N]")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per query")
    parser.add_argument("--session", choices=("plain", "demo"), default="plain",
                        help="plain: the README's session; demo: the demo's and the tests'")
    args = parser.parse_args(argv)
    if min(args.rows, args.partitions, args.epochs, args.repeat, args.warmup_rows) < 1:
        parser.error("--rows, --partitions, --epochs, --repeat, --warmup-rows must be positive")
    return args


def log(message: str) -> None:
    """A progress line on stderr, stamped with the wall-clock time."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def print_result(result: dict[str, Any]) -> None:
    """The bench's result: one JSON object on one line of stdout (the last line printed)."""
    print(json.dumps(result, sort_keys=False), flush=True)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def produce(bootstrap: str, topic: str, records: int, partitions: int, value_bytes: int) -> float:
    """Produce ``records`` records round-robin over the partitions with a batching producer;
    returns the rate (msg/s). Record ``i`` has the 10-byte key ``k%09d`` and a ``value_bytes``
    value starting with ``%010d``; its CreateTime is ``BASE_MS`` + its index in the partition
    (ms) + jitter from ``JITTER_MS``."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "compression.type": "none",  # librdkafka's default, spelled out
        }
    )
    filler = b"x" * max(0, value_bytes - 10)
    started = time.monotonic()
    for i in range(records):
        partition, index = i % partitions, i // partitions
        ts = BASE_MS + index + JITTER_MS[index % len(JITTER_MS)]
        key = b"k%09d" % i
        value = (b"%010d" % i + filler)[:value_bytes]
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} records of {topic} not delivered within 120 s")
    return records / (time.monotonic() - started)


@dataclass
class BenchEnvironment:
    """What ``bench_environment`` started: ``stack`` stops it all when the ``with`` block ends
    (further services entered into it are stopped before the broker), ``workdir`` is a scratch
    directory removed then, ``dsn`` is PostgreSQL's (empty when it was not started)."""

    stack: contextlib.ExitStack
    workdir: Path
    bootstrap: str
    dsn: str = ""

    def prepare_topics(
        self,
        partitions: int,
        value_bytes: int,
        topic: tuple[str, int],
        warmup: tuple[str, int],
        rate_note: str,
    ) -> None:
        """Create the measured topic and the warm-up topic, each ``(name, records)``, with
        ``partitions`` partitions and fill them with ``produce``; the measured topic's producing
        rate is logged, followed by ``rate_note``."""
        from flinkish.demo.embedded_kafka import create_topic

        (name, records), (warmup_name, warmup_records) = topic, warmup
        create_topic(self.bootstrap, name, partitions)
        create_topic(self.bootstrap, warmup_name, partitions)
        log(f"producing {records:,} x {value_bytes} B over {partitions} partitions")
        rate = produce(self.bootstrap, name, records, partitions, value_bytes)
        log(f"produced at {rate:,.0f} msg/s ({rate_note})")
        produce(self.bootstrap, warmup_name, warmup_records, partitions, value_bytes)

    def start_spark(self, app: str, cores: int, session: str = "demo") -> tuple[Any, float]:
        """A ``local[cores]`` SparkSession, stopped (``stop_spark``) first when the environment
        closes, and the seconds its start-up took. ``session``: ``demo`` is the demo's and the
        tests' (``flinkish.demo.spark_session.local_session``: its worker interpreter, daemon
        and settings); ``plain`` is the README's, ``SparkSession.builder...getOrCreate()`` and
        ``flinkish.register(spark)``, nothing else."""
        log(f"starting Spark local[{cores}], the {session} session (not timed)")
        started = time.monotonic()
        if session == "plain":
            from pyspark.sql import SparkSession

            import flinkish

            # what an activated virtualenv gives Spark's workers (python3 on the PATH)
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            spark = SparkSession.builder.master(f"local[{cores}]").appName(app).getOrCreate()
            flinkish.register(spark)
        else:
            from flinkish.demo.spark_session import local_session

            spark = local_session(app, cores=str(cores))
        self.stack.callback(log, "Spark stopped")
        self.stack.callback(stop_spark, spark)
        return spark, time.monotonic() - started


@contextlib.contextmanager
def bench_environment(workdir_prefix: str, *, postgres: bool = False) -> Iterator[BenchEnvironment]:
    """Start the embedded broker (``flinkish.demo.embedded_kafka``) and, with ``postgres``, an
    embedded PostgreSQL (``flinkish.demo.embedded_postgres``), in a scratch directory named
    ``workdir_prefix...``; everything started is stopped in reverse order on every exit path,
    errors and SIGTERM (turned into SystemExit, ``sigterm_raises``) included."""
    from flinkish.demo.embedded_kafka import EmbeddedKafka

    with sigterm_raises(), contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=workdir_prefix)))
        log("starting the embedded broker" + (" and PostgreSQL" if postgres else ""))
        broker = stack.enter_context(EmbeddedKafka())
        env = BenchEnvironment(stack, workdir, broker.bootstrap_servers)
        if postgres:
            from flinkish.demo.embedded_postgres import EmbeddedPostgres

            env.dsn = stack.enter_context(EmbeddedPostgres()).dsn
        yield env


def stop_spark(spark: Any) -> None:
    """Stop the queries, the session and the JVM (workers die when the JVM's pipes close)."""
    from pyspark import SparkContext

    try:
        active = list(spark.streams.active)
    except Exception:  # the session is half torn down already (e.g. SIGTERM mid-query)
        active = []
    for query in active:
        with contextlib.suppress(Exception):
            query.stop()
    gateway = SparkContext._gateway
    with contextlib.suppress(Exception):
        spark.stop()
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except Exception:
            proc.kill()
            proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


@dataclass
class QueryRun:
    """A finished query: ``seconds`` from ``writeStream.start()`` to its termination, its
    ``recentProgress``, and the wall-clock times (epoch seconds) just before ``start()`` and
    just after the termination."""

    seconds: float
    progress: list[Any]
    started_wall: float
    ended_wall: float


def run_to_end(writer: Any, name: str, timeout: float) -> QueryRun:
    """Start ``writer``'s query (an ``AvailableNow`` trigger, so it ends by itself) and wait for
    it; raises when it fails or does not end within ``timeout`` seconds (``name`` says which
    query). The query is stopped on every path."""
    started, started_wall = time.monotonic(), time.time()
    query = writer.start()
    try:
        finished = query.awaitTermination(timeout)
        seconds = time.monotonic() - started
        ended_wall = time.time()
        if not finished:
            raise RuntimeError(f"the {name} did not finish within {timeout:g} s")
        if query.exception() is not None:
            raise RuntimeError(f"the {name} failed: {query.exception()}")
        return QueryRun(seconds, query.recentProgress, started_wall, ended_wall)
    finally:
        if query.isActive:
            query.stop()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so the ``finally`` blocks and exit stacks stop everything
    (broker, PostgreSQL, Spark)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process we can see."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name (field 2) is in parentheses and may contain spaces
        rest = stat[stat.rfind(b")") + 2:].split()
        parents[int(entry)] = int(rest[1])
    return parents


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` in the process tree (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def status_kb(pid: int, keys: Iterable[str] = ("VmHWM", "VmRSS")) -> dict[str, int]:
    """Fields of ``/proc/<pid>/status`` in kB (missing when the process is gone)."""
    wanted = set(keys)
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in wanted:
                    out[name] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def is_pyspark_python(command: str) -> bool:
    """A Python process started by Spark: the worker daemon and the workers it forks, or any
    other Python interpreter the JVM starts (e.g. the runner of a data source's driver-side
    calls). The JVM itself and non-Python helpers are not."""
    if any(marker in command for marker in PYSPARK_MARKERS):
        return True
    program = os.path.basename(command.split(" ", 1)[0])
    return program.startswith("python")


@dataclass
class PeakMemorySampler:
    """Samples VmHWM (peak resident set) of PySpark's Python processes while it runs.

    Processes are the Python ones below ``root`` in the process tree (the driver, hence the JVM
    and the daemons and workers it starts; the daemon calls ``setpgid`` but stays a child of the
    JVM); the driver process itself is excluded. Only descendants are looked at, so other
    Spark applications on the same machine are not counted. VmHWM is the kernel's own high-water
    mark, so a short spike between two samples is not missed as long as the process is still
    alive at the next sample; processes that start and exit within one ``interval`` are. Use as
    a context manager.
    """

    root: int = field(default_factory=os.getpid)
    interval: float = 0.25
    peak_kb: int = 0
    peaks: dict[int, tuple[int, str]] = field(default_factory=dict)  # pid -> (VmHWM kB, cmdline)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        for pid in descendants(self.root):
            command = self.peaks[pid][1] if pid in self.peaks else cmdline(pid)
            if not is_pyspark_python(command):
                continue
            hwm = status_kb(pid, ("VmHWM",)).get("VmHWM")
            if hwm is None:
                continue
            if hwm > self.peaks.get(pid, (0, ""))[0]:
                self.peaks[pid] = (hwm, command)
            self.peak_kb = max(self.peak_kb, hwm)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemorySampler:
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()

    @property
    def peak_mb(self) -> float:
        return round(self.peak_kb / 1024, 1)

    def top(self, n: int = 3) -> list[str]:
        """The ``n`` largest processes seen, for a progress line."""
        ranked = sorted(self.peaks.items(), key=lambda item: -item[1][0])[:n]
        return [f"pid {pid} {kb / 1024:.0f} MB ({cmd[-60:]})" for pid, (kb, cmd) in ranked]


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of ``pid`` and of its reaped children (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17
    return sum(int(v) for v in fields[11:15]) / _CLOCK_TICKS


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "other"


def classify(pid: int) -> str:
    """``python_workers``, ``spark_jvm``, or the program's name."""
    command = cmdline(pid)
    if is_pyspark_python(command):
        return "python_workers"
    program = os.path.basename(command.split(" ", 1)[0]) if command else _comm(pid)
    return "spark_jvm" if program == "java" else program


def machine_busy_seconds() -> float:
    """CPU seconds all processes on the machine have used since boot (not idle, not iowait)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    busy = sum(fields[:3]) + sum(fields[5:8])
    return busy / _CLOCK_TICKS


class CpuMeter:
    """CPU seconds spent while it runs, per kind of process below ``root`` (default: this
    process): Spark's JVM, PySpark's Python processes (daemon, workers, data source runner),
    the driver itself, and other programs (e.g. the broker) by name. Processes that both start
    and exit inside the window are counted only when their parent reaps them (as the worker
    daemon does its forked workers).
    ``other_processes`` is the rest of the machine's busy CPU in the window: when it is large,
    something else competed for the cores and the wall-clock figures are suspect."""

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self._before: dict[int, tuple[str, float]] = {}
        self._machine = 0.0
        self.seconds: dict[str, float] = {}

    def _snapshot(self) -> dict[int, tuple[str, float]]:
        kinds = {pid: classify(pid) for pid in descendants(self.root)}
        kinds[self.root] = "driver"
        snapshot: dict[int, tuple[str, float]] = {}
        for pid, kind in kinds.items():
            seconds = cpu_seconds(pid)
            if seconds is not None:
                snapshot[pid] = (kind, seconds)
        return snapshot

    def __enter__(self) -> CpuMeter:
        self._machine = machine_busy_seconds()
        self._before = self._snapshot()
        return self

    def __exit__(self, *exc: object) -> None:
        after = self._snapshot()
        totals: dict[str, float] = {}
        for pid, (kind, seconds) in after.items():
            start = self._before.get(pid, (kind, 0.0))[1]
            totals[kind] = totals.get(kind, 0.0) + seconds - start
        totals["other_processes"] = max(
            0.0, machine_busy_seconds() - self._machine - sum(totals.values())
        )
        self.seconds = {k: round(v, 2) for k, v in sorted(totals.items()) if round(v, 2)}
