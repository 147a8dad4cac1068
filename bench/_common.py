"""Helpers shared by the bench scripts: progress on stderr, the final JSON line on stdout,
medians, and peak-memory sampling of PySpark's Python workers from ``/proc``.

psutil is not installed on these machines, so processes are found and measured by reading
``/proc/<pid>/stat``, ``/proc/<pid>/cmdline`` and ``/proc/<pid>/status`` directly (Linux only).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Substrings of the command line of PySpark's Python processes: the worker daemon (which forks
#: the workers, so they share its command line) and workers started without the daemon.
PYSPARK_MARKERS = ("pyspark.daemon", "pyspark.worker")


def log(message: str) -> None:
    """A progress line on stderr, stamped with the wall-clock time."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def print_result(result: dict[str, Any]) -> None:
    """The bench's result: one JSON object on one line of stdout (the last line printed)."""
    print(json.dumps(result, sort_keys=False), flush=True)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


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
