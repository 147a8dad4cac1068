"""The main job: what flinkish does that Spark alone does not, shown live.

A realistic event stream over four Kafka partitions: out-of-order event times, partition 3
lagging two minutes behind in event time, partition 2 going silent for a while and resuming.
The flinkish source feeds the valve and the two-phase-commit sink (in a separate process);
midway the demo kills that process (SIGKILL, like a crash) and restarts it from its checkpoint,
then checks that the output holds every produced event exactly once.

Beside flinkish's combined watermark it shows the one global watermark Spark's
``withWatermark`` would have used (max event time of the previous batches minus the same
2-second delay) and how many rows Spark would have dropped as late. Both are computed exactly
from the batches Spark actually planned (the query's ``offsets/`` log) and the event times the
demo produced.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from flinkish.demo.processes import kill_tree
from flinkish.inspect import EpochRow, format_watermark, load_epochs

PARTITIONS = 4
LAGGING, SILENT = 3, 2
LAG_MS = 120_000
DELAY_MS = 2_000  # the bound for both: flinkish's maxOutOfOrderness, Spark's withWatermark
RATE = 40  # events per second per partition


@dataclass
class Produced:
    """Event times by (partition, offset), from the producer's delivery reports."""

    times: dict[tuple[int, int], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, partition: int, offset: int, ts: int) -> None:
        with self.lock:
            self.times[(partition, offset)] = ts

    def snapshot(self) -> dict[tuple[int, int], int]:
        with self.lock:
            return dict(self.times)


class EventStream:
    """Produces the demo's events in runs; a run is a thread, ``running`` while it lasts."""

    def __init__(self, bootstrap: str, topic: str, produced: Produced) -> None:
        self._bootstrap, self._topic, self._produced = bootstrap, topic, produced
        self._rng = random.Random(42)
        self._seq = 0
        self._thread: threading.Thread | None = None
        self.stop = threading.Event()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, duration: float) -> None:
        """Produce until ``stop`` is set; partition 2 is silent from 20% to 60% of
        ``duration``."""
        self._thread = threading.Thread(target=self._run, args=(duration,), daemon=True)
        self._thread.start()

    def _run(self, duration: float) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self._bootstrap, "linger.ms": 20})
        start = time.monotonic()
        while not self.stop.is_set():
            elapsed = (time.monotonic() - start) / duration
            now = int(time.time() * 1000)
            for p in range(PARTITIONS):
                if p == SILENT and 0.2 <= elapsed < 0.6:
                    continue  # partition 2 goes silent, then resumes
                for _ in range(RATE // 10):
                    ts = now - (LAG_MS if p == LAGGING else 0) - self._rng.randint(0, 1500)
                    self._seq += 1

                    def report(err: Any, msg: Any, ts: int = ts) -> None:
                        if err is None:
                            self._produced.add(msg.partition(), msg.offset(), ts)

                    producer.produce(self._topic, json.dumps({"id": self._seq, "p": p}).encode(),
                                     partition=p, timestamp=ts, on_delivery=report)
            producer.poll(0)
            self.stop.wait(0.1)
        producer.flush(30)


def _epochs(checkpoint: Path) -> list[EpochRow]:
    return load_epochs(str(checkpoint)) if (checkpoint / "flinkish").exists() else []


def _spark_batches(checkpoint: Path, topic: str) -> list[dict[int, int]]:
    """End offsets per partition of every batch Spark planned (its offsets log)."""
    out: list[dict[int, int]] = []
    directory = checkpoint / "offsets"
    if not directory.is_dir():
        return out
    for name in sorted((n for n in os.listdir(directory) if n.isdigit()), key=int):
        try:
            data = json.loads((directory / name).read_text().splitlines()[-1])
            out.append({int(p): e["offset"] for p, e in data["topics"].get(topic, {}).items()})
        except (OSError, ValueError, KeyError, IndexError):
            break  # being written
    return out


@dataclass
class SparkComparison:
    watermark: int | None = None
    dropped: int = 0
    dropped_lagging: int = 0


def spark_comparison(batches: list[dict[int, int]], times: dict[tuple[int, int], int]
                     ) -> SparkComparison:
    """What Spark's withWatermark would have done on the same batches: its watermark for batch
    N is max event time of batches < N minus the delay; rows below it are dropped as late."""
    result = SparkComparison()
    previous = {p: 0 for p in range(PARTITIONS)}
    max_seen: int | None = None
    for ends in batches:
        watermark = None if max_seen is None else max_seen - DELAY_MS
        batch_max = max_seen
        for p, end in ends.items():
            for offset in range(previous.get(p, 0), end):
                ts = times.get((p, offset))
                if ts is None:
                    continue
                if watermark is not None and ts < watermark:
                    result.dropped += 1
                    result.dropped_lagging += p == LAGGING
                batch_max = ts if batch_max is None else max(batch_max, ts)
            previous[p] = end
        max_seen = batch_max
        result.watermark = watermark
    return result


class QueryProcess:
    """The query as a child process (its own session, so the demo can kill its whole tree)."""

    def __init__(self, command: list[str], log: Path) -> None:
        self._command = command
        self._log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # the project root, not flinkish/
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
        with open(self._log, "ab") as log:
            self.process = subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)

    def crash(self) -> None:
        if self.process is not None:
            kill_tree(self.process.pid)
            self.process.wait()

    def stop(self, stop_file: Path, timeout: float = 60) -> None:
        """Ask the query to stop (it polls ``stop_file``), then make sure it is gone."""
        stop_file.write_text("stop")
        deadline = time.monotonic() + timeout
        while self.process and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        self.crash()

    def failed(self) -> bool:
        return self.process is not None and self.process.poll() not in (None, 0)


@contextlib.contextmanager
def _broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from flinkish.demo.embedded_kafka import EmbeddedKafka

    with EmbeddedKafka() as broker:
        yield broker.bootstrap_servers


@contextlib.contextmanager
def _postgres(enabled: bool) -> Iterator[str | None]:
    if not enabled:
        yield None
        return
    from flinkish.demo.embedded_postgres import postgres_for_tests

    with postgres_for_tests() as dsn:
        yield dsn


def _view(phase: str, epochs: list[EpochRow], batches: list[dict[int, int]],
          spark: SparkComparison, produced: int, crashes: int) -> Group:
    latest = next((r for r in reversed(epochs) if r.state == "completed"), None)
    table = Table(title="flinkish: per-partition watermarks (UTC)", expand=False)
    for column in ("partition", "last offset", "watermark", "status"):
        table.add_column(column)
    ends = batches[-1] if batches else {}
    for p in range(PARTITIONS):
        info = latest.partitions.get(f"{_TOPIC[0]}/{p}", {}) if latest else {}
        note = " (lags 2 min)" if p == LAGGING else " (goes silent)" if p == SILENT else ""
        status = info.get("status", "-")
        table.add_row(f"{p}{note}", str(ends.get(p, "-")),
                      format_watermark(info.get("watermark"), False) if info else "-",
                      Text(status, style="yellow" if status == "IDLE" else "green"))
    committed = sum(r.rows or 0 for r in epochs if r.state == "completed")
    late = sum(r.late_rows or 0 for r in epochs if r.state == "completed")
    summary = Table.grid(padding=(0, 2))
    summary.add_row("flinkish combined watermark",
                    format_watermark(latest.watermark if latest else None, False),
                    "valve: min over active partitions")
    summary.add_row("Spark's global watermark", format_watermark(spark.watermark, False),
                    "fastest partition - 2 s")
    summary.add_row("rows Spark would drop as late", f"[red]{spark.dropped}[/]",
                    f"{spark.dropped_lagging} from the lagging partition")
    summary.add_row("rows flinkish committed", str(committed),
                    f"late {late} (kept, counted); dropped 0")
    summary.add_row("produced / epochs / crashes", f"{produced} / {len(epochs)} / {crashes}", "")
    return Group(Text(phase, style="bold cyan"), table, summary)


_TOPIC: list[str] = ["events"]


def _committed_rows(target: str, output: Path, dsn: str | None) -> list[tuple[int, int]]:
    if target == "postgres":
        import psycopg

        with psycopg.connect(dsn or "") as conn:
            return [(int(p), int(o)) for p, o in
                    conn.execute('SELECT partition, "offset" FROM demo_events').fetchall()]
    import pyarrow.dataset as ds

    if not output.exists():
        return []
    table = ds.dataset(str(output), format="parquet").to_table(columns=["partition", "offset"])
    return list(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                    strict=True))


def _exit_on(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the clean-up below


def run_demo(duration: float = 30.0, target: str = "parquet", bootstrap: str | None = None,
             live: bool = True, workdir: str | None = None) -> int:
    # a closed terminal or a kill must still stop the broker, PostgreSQL and the query
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on)
    console = Console()
    work = Path(workdir or tempfile.mkdtemp(prefix="flinkish-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    checkpoint, output = work / "checkpoint", work / "output"
    stop_file = work / "stop"
    started = time.monotonic()
    crashes = 0
    try:
        with _broker(bootstrap) as servers, _postgres(target == "postgres") as dsn:
            from flinkish.demo.embedded_kafka import create_topic

            topic = f"flinkish-demo-{int(time.time())}"
            _TOPIC[0] = topic
            create_topic(servers, topic, PARTITIONS)
            console.print(f"broker {servers}, topic {topic}, target {target}, work dir {work}")
            produced = Produced()
            stream = EventStream(servers, topic, produced)
            command = [sys.executable, "-m", "flinkish.demo.query", servers, topic,
                       str(checkpoint), str(stop_file)]
            command += ["--postgres", dsn] if dsn else ["--parquet", str(output)]
            query = QueryProcess(command, work / "query.log")
            # Produce from the start: a stream that paused longer than idleTimeout before the
            # first batch would mark every partition idle, and the lagging one, resuming behind
            # the others, would then stay unaligned (Flink's valve semantics).
            try:
                stream.start(duration)
                production_started = time.monotonic()
                query.start()
                phase = "starting Spark and the query…"

                def refresh() -> Group:
                    times = produced.snapshot()
                    batches = _spark_batches(checkpoint, topic)
                    epochs = _epochs(checkpoint)
                    return _view(f"[{time.monotonic() - started:5.1f}s] {phase}", epochs, batches,
                                 spark_comparison(batches, times), len(times), crashes)

                display = Live(refresh(), console=console, refresh_per_second=4) if live else None
                with display if display is not None else contextlib.nullcontext():
                    last_log = 0.0
                    epoch_at_crash = 0
                    while True:
                        if query.failed():
                            raise RuntimeError("the query process failed; see " +
                                               str(work / "query.log"))
                        epochs = _epochs(checkpoint)
                        completed = [r for r in epochs if r.state == "completed"]
                        if not completed:
                            time.sleep(0.25)
                            if display is not None:
                                display.update(refresh())
                            elif time.monotonic() - last_log > 5:
                                last_log = time.monotonic()
                                console.print(f"[{time.monotonic() - started:5.1f}s] {phase}")
                            continue
                        elapsed = time.monotonic() - production_started
                        if crashes == 0 and completed[-1].epoch >= 2 and (
                                elapsed > duration * 0.45):
                            epoch_at_crash = completed[-1].epoch
                            phase = "CRASH: SIGKILL of the query's processes; restarting it…"
                            query.crash()
                            crashes += 1
                            query.start()
                        elif crashes:
                            phase = "restarted from the checkpoint; streaming"
                        else:
                            phase = "streaming"
                        times = produced.snapshot()
                        if stream.running and elapsed >= duration and crashes and (
                                completed[-1].epoch > epoch_at_crash + 1):
                            stream.stop.set()  # ran its time, and the restarted query is live
                            stream.join()
                        if not stream.running:
                            phase = "production finished; catching up"
                            batches = _spark_batches(checkpoint, topic)
                            caught_up = batches and all(
                                batches[-1].get(p, 0) >= 1 + max(
                                    (o for (q, o) in times if q == p), default=-1)
                                for p in range(PARTITIONS))
                            if (caught_up and crashes and completed[-1].epoch > epoch_at_crash
                                    and completed[-1].epoch >= len(batches) - 1):
                                break
                        if display is not None:
                            display.update(refresh())
                        elif time.monotonic() - last_log > 5:
                            last_log = time.monotonic()
                            console.print(f"[{elapsed:5.1f}s] {phase}: {len(completed)} epochs, "
                                          f"{len(times)} produced")
                        time.sleep(0.25)
                        if time.monotonic() - started > duration + 300:
                            raise RuntimeError("the demo did not finish in time")
                    phase = "stopping the query and verifying the output…"
                    if display is not None:
                        display.update(refresh())
                query.stop(stop_file)
            finally:
                stream.stop.set()
                query.crash()  # whatever happened, stop every process the demo started
            return _verdict(console, produced, target, output, dsn, checkpoint, topic, crashes,
                            started)
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _lingering(target: str, output: Path, dsn: str | None, checkpoint: Path) -> list[Any]:
    """Prepared transactions / staged files of the demo's query still in the target."""
    from checkpointing.query import query_id
    from flinkish_sink.target import Target

    sink: Target
    if target == "postgres":
        from flinkish_sink.postgres_target import PostgresTarget

        sink = PostgresTarget(dsn or "", "demo_events")
    else:
        from flinkish_sink.parquet_target import ParquetTarget

        sink = ParquetTarget(str(output))
    try:
        return list(sink.pending("flinkish", query_id(str(checkpoint))))
    finally:
        sink.close()


def _verdict(console: Console, produced: Produced, target: str, output: Path, dsn: str | None,
             checkpoint: Path, topic: str, crashes: int, started: float) -> int:
    times = produced.snapshot()
    rows = _committed_rows(target, output, dsn)
    unique = set(rows)
    duplicates = len(rows) - len(unique)
    missing = len(set(times) - unique)
    unexpected = len(unique - set(times))
    epochs = [r for r in load_epochs(str(checkpoint)) if r.state == "completed"]
    watermarks = [r.watermark for r in epochs if r.watermark is not None]
    monotone = all(a <= b for a, b in zip(watermarks, watermarks[1:], strict=False))
    spark = spark_comparison(_spark_batches(checkpoint, topic), times)
    lagging = sum(1 for (p, _) in times if p == LAGGING)
    lingering = _lingering(target, output, dsn, checkpoint)
    ok = (duplicates == 0 and missing == 0 and unexpected == 0 and monotone and crashes == 1
          and not lingering)
    verdict = Table(title="verdict", show_header=False)
    verdict.add_row("events produced", str(len(times)))
    verdict.add_row("rows committed", str(len(rows)))
    verdict.add_row("duplicates / missing", f"{duplicates} / {missing}")
    verdict.add_row("crashes survived", str(crashes))
    verdict.add_row("pre-commits left in the target", str(len(lingering)))
    verdict.add_row("combined watermark never went back", "yes" if monotone else "NO")
    verdict.add_row("rows Spark's withWatermark would have dropped",
                    f"{spark.dropped} ({spark.dropped_lagging} of the lagging partition's "
                    f"{lagging})")
    verdict.add_row("rows flinkish dropped", "0")
    verdict.add_row("elapsed", f"{time.monotonic() - started:.0f} s")
    console.print(verdict)
    if ok:
        console.print("[bold green]VERDICT: every produced event is in the output exactly once, "
                      "through a crash.[/]")
        return 0
    console.print("[bold red]VERDICT: FAILED[/] (see the table above)")
    return 1
