"""The main job: what flinkish does that Spark alone does not, shown live and measured.

A skewed, out-of-order stream over four partitions (one lagging, one going silent) runs in a
child process through three queries: the flinkish source into the two-phase-commit sink, and a
windowed count on the valve's combined watermark beside one on Spark's own. Midway the demo
kills the child's process tree, restarts it, and checks the output exactly once and each
count's windows against the events it produced (docs/reference/cli.md, ``flinkish demo``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from flinkish.demo.processes import kill_tree
from flinkish.demo.windows import Comparison, WindowCount, WindowQuery
from flinkish.inspect import EpochRow, format_watermark, load_epochs, number_ranges, offsets_log

PARTITIONS = 4
LAGGING, SILENT = 3, 2
LAG_MS = 120_000
DELAY_MS = 2_000  # the bound for both: flinkish's maxOutOfOrderness, Spark's withWatermark
RATE = 40  # events per second per partition
IDLE_TIMEOUT_MS = 2_000  # the source's idleTimeout
IDLE_EPOCHS = 3  # partition 2 stays silent until it was IDLE in this many epochs...
SILENCE_MAX_S = 120.0  # ...or this long
WINDOWS_GRACE_S = 120.0  # after the events are all in, how long the last windows may take


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


def ends(times: dict[tuple[int, int], int]) -> dict[int, int]:
    """The end offset (one past the last produced) of every partition."""
    out = dict.fromkeys(range(PARTITIONS), 0)
    for p, offset in times:
        out[p] = max(out[p], offset + 1)
    return out


class EventStream:
    """Produces the demo's events in a thread; partition 2 produces nothing while ``silent``."""

    def __init__(self, bootstrap: str, topic: str, produced: Produced) -> None:
        self._bootstrap, self._topic, self._produced = bootstrap, topic, produced
        self._rng = random.Random(42)
        self._seq = 0
        self._thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.silent = threading.Event()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self._bootstrap, "linger.ms": 20})
        while not self.stop.is_set():
            now = int(time.time() * 1000)
            for p in range(PARTITIONS):
                if p == SILENT and self.silent.is_set():
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
    return [{int(p): e["offset"] for p, e in offsets[-1]["topics"].get(topic, {}).items()}
            for _, _, offsets in offsets_log(str(checkpoint))]


def _idle_alone(epochs: list[EpochRow], topic: str) -> list[int]:
    """Completed epochs in which the silent partition was IDLE while the others were not (the
    valve left it out of the combined watermark)."""
    return [r.epoch for r in epochs if r.state == "completed"
            and f"{topic}/{SILENT}" in r.idle_partitions
            and len(r.idle_partitions) < PARTITIONS]


def _all_idle(epochs: list[EpochRow]) -> list[int]:
    """Completed epochs with every partition IDLE (the valve released the maximum)."""
    return [r.epoch for r in epochs if r.state == "completed"
            and len(r.idle_partitions) == PARTITIONS]


class QueryProcess:
    """The query as a child process in its own session, so the demo can kill its whole tree."""

    def __init__(self, command: list[str], log: Path, ready_file: Path) -> None:
        self._command = [*command, "--ready-file", str(ready_file)]
        self._log = log
        self._ready_file = ready_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def ready(self) -> bool:
        """This run's SparkSession is up, before any query starts."""
        return self._ready_file.exists()

    def start(self) -> None:
        self._ready_file.unlink(missing_ok=True)
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


@dataclass
class Recovery:
    """The restart after the crash: over once an epoch after the crash is committed."""

    started: float  # monotonic time of the crash (and restart)
    last_committed: int  # the newest epoch committed before the crash
    last_planned: int  # the newest batch Spark planned before the crash
    lingering: int  # pre-commits (prepared transactions, staged files) the crash left
    ready_at: float | None = None
    seconds: float | None = None  # crash -> first commit after it, once there

    def phase(self, now: float, ready: bool, newest: int | None) -> str:
        """What is being recovered and for how long (``newest``: the newest committed epoch)."""
        if newest is not None and newest > self.last_committed:
            self.seconds = now - self.started
            return (f"RECOVERED in {self.seconds:.1f} s: epoch {self.last_committed + 1} "
                    "committed again from the checkpoint; streaming")
        if ready and self.ready_at is None:
            self.ready_at = now
        left = (f"{self.lingering} pre-commit(s) the crash left in the target" if self.lingering
                else "nothing the crash left pre-committed in the target")
        if self.last_planned > self.last_committed:
            work = (f"replaying epoch {self.last_committed + 1} (planned before the crash, not "
                    f"committed; {left})")
        else:
            work = f"planning epoch {self.last_committed + 1} ({left})"
        if self.ready_at is None:
            return (f"CRASH: SIGKILL of the queries' processes; RECOVERING for "
                    f"{now - self.started:.0f} s: starting Spark again; then {work}")
        return (f"RECOVERING for {now - self.started:.0f} s: Spark up after "
                f"{self.ready_at - self.started:.0f} s; {work}")


def _stage(phase: str) -> str:
    """A phase without its running seconds, which are no news to a plain log."""
    return re.sub(r"\d+(\.\d+)? s\b", "", phase)


#: How often a plain log (not a terminal) prints the demo's state while nothing changes
PLAIN_EVERY_S = 5.0


def _log_due(run: _Run, last_stage: str, quiet_for: float) -> bool:
    """At each change of stage, and every :data:`PLAIN_EVERY_S` while not recovering."""
    if _stage(run.phase) != last_stage:
        return True
    recovering = run.recovery is not None and run.recovery.seconds is None
    return quiet_for > PLAIN_EVERY_S and not recovering


@contextlib.contextmanager
def _services(bootstrap: str | None, postgres: bool) -> Iterator[tuple[str, str | None]]:
    """The brokers (``bootstrap``, else an embedded one) and, for ``postgres``, a DSN."""
    with contextlib.ExitStack() as stack:
        if not bootstrap:
            from flinkish.demo.embedded_kafka import EmbeddedKafka

            bootstrap = stack.enter_context(EmbeddedKafka()).bootstrap_servers
        dsn = None
        if postgres:
            from flinkish.demo.embedded_postgres import postgres_for_tests

            dsn = stack.enter_context(postgres_for_tests())
        yield bootstrap, dsn


def _window_summary(counts: list[WindowQuery], results: dict[str, Comparison]) -> Table:
    table = Table(title="windowed counts (10 s, per partition, append mode) against the "
                  "produced events", expand=False)
    for column in ("count on", "watermark", "closed", "wrong", "rows lost",
                   "numRowsDropped\nByWatermark"):
        table.add_column(column, justify="left" if column in ("count on", "watermark")
                         else "right")
    for count, short in zip(counts, ("with_watermark", "Spark's own"), strict=True):
        result = results[count.name]
        wrong, dropped = len(result.wrong), result.dropped
        table.add_row(
            short, format_watermark(result.progress.watermark, False), str(len(result.closed)),
            Text(str(wrong), style="bold red" if wrong else "green"),
            Text(str(dropped), style="bold red" if dropped else "green"),
            str(result.progress.dropped))
    return table


def _idle_note(idle: tuple[str, ...]) -> str:
    """`` (IDLE: 2)``: the idle partitions' numbers, when there are any."""
    return f" (IDLE: {', '.join(n.rsplit('/', 1)[1] for n in idle)})" if idle else ""


def _view(phase: str, topic: str, epochs: list[EpochRow], batches: list[dict[int, int]],
          counts: list[WindowQuery], results: dict[str, Comparison], produced: int,
          crashes: int) -> Group:
    latest = next((r for r in reversed(epochs) if r.state == "completed"), None)
    table = Table(title="flinkish: per-partition watermarks (UTC)", expand=False)
    for column in ("partition", "last offset", "watermark", "status"):
        table.add_column(column)
    last = batches[-1] if batches else {}
    for p in range(PARTITIONS):
        info = latest.partitions.get(f"{topic}/{p}", {}) if latest else {}
        note = " (lags 2 min)" if p == LAGGING else " (goes silent)" if p == SILENT else ""
        status = info.get("status", "-")
        shown = "IDLE: left out of the min" if status == "IDLE" else status
        table.add_row(f"{p}{note}", str(last.get(p, "-")),
                      format_watermark(info.get("watermark"), False) if info else "-",
                      Text(shown, style="bold yellow" if status == "IDLE" else "green"))
    committed = sum(r.rows or 0 for r in epochs if r.state == "completed")
    late = sum(r.late_rows or 0 for r in epochs if r.state == "completed")
    idle = latest.idle_partitions if latest else ()
    summary = Table.grid(padding=(0, 2))
    summary.add_row("flinkish combined watermark",
                    format_watermark(latest.watermark if latest else None, False),
                    "valve: min over active partitions" + _idle_note(idle))
    summary.add_row(f"partition {SILENT} IDLE in epochs", number_ranges(_idle_alone(epochs, topic)),
                    f"idleTimeout {IDLE_TIMEOUT_MS / 1000:g} s")
    summary.add_row("rows flinkish committed", str(committed),
                    f"late {late} (kept, counted); dropped 0")
    summary.add_row("produced / epochs / crashes", f"{produced} / {len(epochs)} / {crashes}", "")
    return Group(Text(phase, style="bold cyan"), table, summary,
                 _window_summary(counts, results))


def _plain_line(epochs: list[EpochRow], topic: str, counts: list[WindowQuery],
                results: dict[str, Comparison], produced: int) -> str:
    completed = [r for r in epochs if r.state == "completed"]
    latest = completed[-1] if completed else None
    idle = latest.idle_partitions if latest else ()
    parts = [f"{len(completed)} epochs, {produced} produced, combined watermark "
             f"{format_watermark(latest.watermark if latest else None, False)}"
             + _idle_note(idle)]
    for count in counts:
        result = results[count.name]
        if result.progress.started:
            parts.append(f"{count.label}: {len(result.closed)} windows closed, "
                         f"{len(result.wrong)} wrong, {result.dropped} rows dropped")
    return "; ".join(parts)


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


def _print_log_tail(console: Console, log: Path, lines: int = 40) -> None:
    """The end of the queries' log without Java stack frames."""
    with contextlib.suppress(OSError):
        text = log.read_text(errors="replace").splitlines()
        tail = [line for line in text
                if not line.lstrip().startswith(("at ", "... "))][-lines:]
        _say(console, f"--- {log}, last {len(tail)} lines without stack frames:")
        for line in tail:
            _say(console, line)


def _say(console: Console, text: str) -> None:
    """``text`` as it is: no markup, no highlighting, no wrapping."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def _live_display(console: Console, live: bool, render: Callable[[], Group]) -> Live | None:
    """On a terminal only: elsewhere a Live prints just its last frame, without a newline."""
    if not (live and console.is_terminal):
        return None
    return Live(render(), console=console, refresh_per_second=4)


def _exit_on(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the clean-up below


@dataclass
class _Run:
    """Where the demo stands; :meth:`step` moves it on from what the queries have done."""

    duration: float
    topic: str
    checkpoint: Path
    stream: EventStream
    produced: Produced
    query: QueryProcess
    counts: list[WindowQuery]
    phase: str = "starting Spark and the queries…"
    crashes: int = 0
    epoch_at_crash: int = 0
    crashed_producing: bool = True  # the crash came while events were still produced
    silence_started: float | None = None
    resume_epoch: int | None = None
    recovery: Recovery | None = None
    lingering: Callable[[], list[Any]] = list  # the query's pre-commits left in the target
    settled_at: float | None = None  # every event read and committed by the sink query
    done: bool = False
    note: str = ""

    def step(self, elapsed: float) -> None:
        """``elapsed``: seconds since production started, which stops at ``duration`` whatever
        the phase; the crash comes then at the latest."""
        stream, query = self.stream, self.query
        if query.failed():
            raise RuntimeError("the query process failed; see its query.log")
        if not stream.running and not stream.stop.is_set():
            raise RuntimeError("the event producer stopped")
        if stream.running and elapsed >= self.duration:
            stream.stop.set()  # --duration bounds production, whatever the phase
            stream.join()
            if self.crashes == 0 and not _idle_alone(_epochs(self.checkpoint), self.topic):
                self.note = (f"production ended (--duration {self.duration:g} s) before "
                             f"partition {SILENT} went IDLE on its own; a longer --duration "
                             "(60, the default) shows every phase")
        producing = stream.running
        completed = [r for r in _epochs(self.checkpoint) if r.state == "completed"]
        now = time.monotonic()
        if self.crashes == 0:
            if not completed:
                return  # starting: Spark, then the sink query, then the two windowed counts
            if self.silence_started is None:
                self.silence_started = now
                if producing:
                    stream.silent.set()
                    self.phase = (f"partition {SILENT} falls silent: IDLE after idleTimeout "
                                  f"({IDLE_TIMEOUT_MS / 1000:g} s), the valve leaves it out")
            elif self.resume_epoch is None:
                if (not producing or len(_idle_alone(completed, self.topic)) >= IDLE_EPOCHS
                        or now - self.silence_started > SILENCE_MAX_S):
                    stream.silent.clear()
                    self.resume_epoch = completed[-1].epoch
                    if producing:
                        self.phase = f"partition {SILENT} resumes; streaming"
            elif not all(c.progress().started for c in self.counts):
                self.phase = "waiting for the windowed counts to start (before the crash)…"
            elif not producing or (completed[-1].epoch > self.resume_epoch
                                   and elapsed > self.duration * 0.45):
                self.epoch_at_crash = completed[-1].epoch
                self.crashed_producing = producing
                query.crash()
                self.crashes += 1
                self.recovery = Recovery(now, self.epoch_at_crash,
                                         len(_spark_batches(self.checkpoint, self.topic)) - 1,
                                         len(self.lingering()))
                query.start()
                self.phase = self.recovery.phase(now, query.ready, None)
            return
        recovery = self.recovery
        recovering = recovery is not None and recovery.seconds is None
        if recovery is not None and recovering:
            self.phase = recovery.phase(now, query.ready, completed[-1].epoch)
            recovering = recovery.seconds is None
            if recovering and not self.crashed_producing and query.ready and (
                    recovery.last_planned <= recovery.last_committed):
                recovering = False  # every batch was committed: nothing to replay or to read
        if producing:
            if not recovering and recovery is not None:
                self.phase = (f"restarted from the checkpoints, recovered in "
                              f"{recovery.seconds:.1f} s; streaming")
            return
        if not recovering:
            self.phase = ("production finished; catching up (every partition goes IDLE, the "
                          "valve releases the maximum watermark, the last windows close)")
        times = self.produced.snapshot()
        last = ends(times)
        batches = _spark_batches(self.checkpoint, self.topic)
        # the restarted run has done its part: committed a batch of its own, or (crashed once
        # production was over, with every batch committed) at least started its session
        restarted = completed[-1].epoch > self.epoch_at_crash or (
            not self.crashed_producing and query.ready)
        settled = bool(batches) and all(batches[-1].get(p, 0) >= last[p] for p in last) and (
            restarted and completed[-1].epoch >= len(batches) - 1)
        if not settled:
            return
        if self.settled_at is None:
            self.settled_at = now
        if self._windows_final(completed[-1], times, last):
            self.done = True
        elif now - self.settled_at > WINDOWS_GRACE_S:
            self.note = (f"the windowed counts had not closed their last windows "
                         f"{WINDOWS_GRACE_S:g} s after the events were all in")
            self.done = True

    def _windows_final(self, latest: EpochRow, times: dict[tuple[int, int], int],
                       last: dict[int, int]) -> bool:
        """Both counts read everything and their watermarks reached where the events end."""
        if len(latest.idle_partitions) < PARTITIONS or latest.watermark is None or not times:
            return False
        expected = {"flinkish": latest.watermark, "spark": max(times.values()) - DELAY_MS}
        for count in self.counts:
            progress = count.progress()
            if progress.watermark is None or progress.watermark < expected[count.name] or any(
                    progress.ends.get(p, 0) < end for p, end in last.items()):
                return False
        return True


def run_demo(duration: float = 60.0, target: str = "parquet", bootstrap: str | None = None,
             live: bool = True, workdir: str | None = None) -> int:
    # a closed terminal or a kill must still stop the broker, PostgreSQL and the queries
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on)
    console = Console()
    work = Path(workdir or tempfile.mkdtemp(prefix="flinkish-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    checkpoint, output, windows = work / "checkpoint", work / "output", work / "windows"
    stop_file = work / "stop"
    started = time.monotonic()
    try:
        with _services(bootstrap, target == "postgres") as (servers, dsn):
            from flinkish.demo.embedded_kafka import create_topic

            topic = f"flinkish-demo-{int(time.time())}"
            create_topic(servers, topic, PARTITIONS)
            console.print(f"broker {servers}, topic {topic}, target {target}, work dir {work}")
            produced = Produced()
            stream = EventStream(servers, topic, produced)
            command = [sys.executable, "-m", "flinkish.demo.query", servers, topic,
                       str(checkpoint), str(stop_file), "--windows", str(windows),
                       "--idle-timeout", f"{IDLE_TIMEOUT_MS} milliseconds"]
            command += ["--postgres", dsn] if dsn else ["--parquet", str(output)]
            query = QueryProcess(command, work / "query.log", work / "ready")
            counts = [
                WindowQuery("flinkish", "flinkish.with_watermark", windows / "flinkish", topic),
                WindowQuery("spark", "Spark's withWatermark", windows / "spark", topic),
            ]
            run = _Run(duration, topic, checkpoint, stream, produced, query, counts,
                       lingering=lambda: _lingering(target, output, dsn, checkpoint))
            # Produce once the session is up but before any query starts: a pause longer than
            # idleTimeout before the first batch would leave the lagging partition unaligned.
            production_started: float | None = None
            try:
                query.start()

                def measured() -> tuple[list[EpochRow], dict[str, Comparison], int]:
                    times = produced.snapshot()
                    return (_epochs(checkpoint), {c.name: c.measure(times) for c in counts},
                            len(times))

                def refresh() -> Group:
                    epochs, results, n = measured()
                    return _view(f"[{time.monotonic() - started:5.1f}s] {run.phase}", topic,
                                 epochs, _spark_batches(checkpoint, topic), counts, results, n,
                                 run.crashes)

                display = _live_display(console, live, refresh)
                with display if display is not None else contextlib.nullcontext():
                    last_log, last_phase = 0.0, ""
                    while not run.done:
                        if production_started is not None:
                            run.step(time.monotonic() - production_started)
                        elif query.failed():
                            raise RuntimeError("the query process failed; see its query.log")
                        elif query.ready:
                            stream.start()
                            production_started = time.monotonic()
                        if display is not None:
                            display.update(refresh())
                        elif _log_due(run, last_phase, time.monotonic() - last_log):
                            last_log, last_phase = time.monotonic(), _stage(run.phase)
                            epochs, results, n = measured()
                            console.print(f"[{time.monotonic() - started:5.1f}s] {run.phase}",
                                          soft_wrap=True)
                            _say(console, "        " + _plain_line(epochs, topic, counts,
                                                                       results, n))
                        time.sleep(0.25)
                        if time.monotonic() - started > duration + 900:
                            raise RuntimeError("the demo did not finish in time")
                    run.phase = "stopping the queries and verifying the output…"
                    if display is not None:
                        display.update(refresh())
                query.stop(stop_file, timeout=120)
            except RuntimeError:
                _print_log_tail(console, work / "query.log")
                raise
            finally:
                stream.stop.set()
                query.crash()  # whatever happened, stop every process the demo started
            return _verdict(console, produced, target, output, dsn, checkpoint, topic,
                            run, started)
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _lingering(target: str, output: Path, dsn: str | None, checkpoint: Path) -> list[Any]:
    """Pre-commits (prepared transactions, staged files) of the demo's query in the target."""
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


def _count_cell(window: WindowCount) -> Text:
    if not window.closed:
        return Text("open", style="dim")
    if window.counted is None:
        return Text("–", style="bold red")
    times = f" (×{window.emitted})" if window.emitted > 1 else ""
    return Text(f"{window.counted}{times}", style="green" if window.exact else "bold red")


def _window_table(results: list[Comparison], labels: list[str]) -> Table:
    table = Table(title="10 s windows: rows produced, and counted by each query",
                  caption="–: never emitted (every row dropped); open: the watermark has not "
                  "passed the window's end, append mode holds it back")
    for column in ("window start (UTC)", "part.", "produced", *labels):
        table.add_column(column, justify="left" if column.startswith("window") else "right")
    for start, partition in sorted({k for r in results for k in r.windows},
                                   key=lambda k: (k[1], k[0])):
        cells = [r.windows.get((start, partition)) for r in results]
        table.add_row(format_watermark(start, False)[:8], str(partition),
                      str(max(w.produced for w in cells if w is not None)),
                      *(_count_cell(w) if w is not None else Text("-", style="dim")
                        for w in cells))
    return table


def _verdict(console: Console, produced: Produced, target: str, output: Path, dsn: str | None,
             checkpoint: Path, topic: str, run: _Run, started: float) -> int:
    times = produced.snapshot()
    rows = _committed_rows(target, output, dsn)
    unique = set(rows)
    duplicates = len(rows) - len(unique)
    missing = len(set(times) - unique)
    unexpected = len(unique - set(times))
    epochs = [r for r in load_epochs(str(checkpoint)) if r.state == "completed"]
    watermarks = [r.watermark for r in epochs if r.watermark is not None]
    monotone = all(a <= b for a, b in zip(watermarks, watermarks[1:], strict=False))
    lagging = sum(1 for (p, _) in times if p == LAGGING)
    lingering = _lingering(target, output, dsn, checkpoint)
    last = ends(times)
    results = {c.name: c.measure(times, final=True) for c in run.counts}
    flinkish, spark = results["flinkish"], results["spark"]
    read_all = {name: all(r.progress.ends.get(p, 0) >= end for p, end in last.items())
                for name, r in results.items()}
    exactly_once = (duplicates == 0 and missing == 0 and unexpected == 0 and monotone
                    and run.crashes == 1 and not lingering)
    windows_exact = (read_all["flinkish"] and bool(flinkish.closed) and not flinkish.wrong
                     and flinkish.dropped == 0 and flinkish.progress.dropped == 0)

    console.print(_window_table([flinkish, spark], ["with_watermark", "Spark's own"]))
    verdict = Table(title="verdict", show_header=False)
    verdict.add_row("events produced", str(len(times)))
    verdict.add_row("rows committed", str(len(rows)))
    verdict.add_row("duplicates / missing", f"{duplicates} / {missing}")
    verdict.add_row("crashes survived", str(run.crashes))
    if run.recovery is not None:
        verdict.add_row("recovery, crash to next commit",
                        "none needed (nothing left to read)" if run.recovery.seconds is None
                        else f"{run.recovery.seconds:.1f} s")
    verdict.add_row("pre-commits left in the target", str(len(lingering)))
    verdict.add_row("combined watermark never went back", "yes" if monotone else "NO")
    verdict.add_row("elapsed", f"{time.monotonic() - started:.0f} s")
    console.print(verdict)
    for count in run.counts:
        result = results[count.name]
        _say(console, f"{count.label}: {len(result.wrong)} of {len(result.closed)} closed "
             f"windows wrong, {result.dropped} rows dropped ({result.dropped_of(LAGGING)} of the "
             f"lagging partition's {lagging}; numRowsDroppedByWatermark {result.progress.dropped})"
             + ("" if read_all[count.name] else "; did NOT read every event"))
    _say(console, f"partition {SILENT} (silent) IDLE in epochs "
         f"{number_ranges(_idle_alone(epochs, topic))}; every partition IDLE in epochs "
         f"{number_ranges(_all_idle(epochs))}")
    if spark.progress.dropped < spark.dropped:
        _say(console, "(numRowsDroppedByWatermark counts what reaches Spark's state store after "
             "partial aggregation, not input rows: the output shows the rows lost)")
    if run.note:
        _say(console, f"note: {run.note}")
    if exactly_once:
        console.print("[bold green]VERDICT: every produced event is in the output exactly once, "
                      "through a crash.[/]", soft_wrap=True)
    if windows_exact:
        console.print(
            f"[bold green]VERDICT: with flinkish.with_watermark every closed window counted "
            f"exactly ({len(flinkish.closed)} windows, 0 rows dropped);[/] [bold red]Spark's own "
            f"watermark got {len(spark.wrong)} windows wrong and dropped {spark.dropped} rows."
            "[/]", soft_wrap=True)
    if exactly_once and windows_exact:
        return 0
    failed = [what for what, ok in (("exactly-once output", exactly_once),
                                    ("flinkish windows exact", windows_exact)) if not ok]
    console.print(f"[bold red]VERDICT: FAILED[/] ({', '.join(failed)}; see the tables above)",
                  soft_wrap=True)
    return 1
