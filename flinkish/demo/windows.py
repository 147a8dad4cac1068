"""The demo's two windowed counts, measured: what each query emitted (its Parquet output) and
Spark reported (its progress), against every event time the demo produced.

A window (10 s, one partition) is *closed* once the query's watermark passed its end or the
query emitted it, and *exact* when emitted once with as many rows as were produced for it. While
the demo runs, a query is judged only on the rows and the batches it has reported.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flinkish.lag import json_value, timestamp_ms

WINDOW_MS = 10_000

_PART = re.compile(r"^part-.+-(\d{9})-\d{5}-\d+-\d{3}\.parquet$")

Key = tuple[int, int]  # (window start ms, partition)


def window_of(ts: int) -> int:
    return ts - ts % WINDOW_MS


@dataclass(frozen=True)
class Progress:
    """What Spark reported for one query: its batches, one report each (the last one wins: a
    batch SIGKILLed before it finished is reported once, by the run that redid it)."""

    batches: int = 0
    batch: int | None = None  # the latest batch reported
    watermark: int | None = None  # Spark's event-time watermark in that batch (ms)
    dropped: int = 0  # numRowsDroppedByWatermark, over every reported batch
    ends: dict[int, int] = field(default_factory=dict)  # partition -> end offset read

    @property
    def started(self) -> bool:
        return self.batch is not None


def read_progress(path: Path, topic: str) -> Progress:
    reports: dict[int, dict[str, Any]] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.exists() else []
    for line in lines:
        try:
            report = json.loads(line)
            reports[int(report["batchId"])] = report
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by the crash
    if not reports:
        return Progress()
    last = reports[max(reports)]
    text = (last.get("eventTime") or {}).get("watermark")
    dropped = sum(int(op.get("numRowsDroppedByWatermark", 0))
                  for report in reports.values() for op in report.get("stateOperators", []))
    ends: dict[int, int] = {}
    for source in last.get("sources", []):
        end = json_value(source.get("endOffset"))
        for p, entry in ((end or {}).get("topics", {}).get(topic, {})).items():
            ends[int(p)] = int(entry["offset"])
    return Progress(len(reports), int(last["batchId"]),
                    timestamp_ms(text) if text else None, dropped, ends)


class WindowOutput:
    """The window rows a query committed to its Parquet target, each file read once."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._files: dict[str, tuple[int, list[tuple[int, int, int]]]] = {}

    def rows(self, up_to_batch: int | None = None) -> list[tuple[int, int, int]]:
        """(window start ms, partition, count) of every committed window row, of the batches
        up to ``up_to_batch`` (all when None)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._path.is_dir():
            for name in sorted(os.listdir(self._path)):
                match = _PART.match(name)
                if match is None or name in self._files:
                    continue
                table = pq.read_table(self._path / name,
                                      columns=["window_start", "partition", "count"])
                starts = table.column("window_start").cast(pa.timestamp("ms", tz="UTC")).cast(
                    pa.int64()).to_pylist()
                self._files[name] = (int(match[1]), list(zip(
                    starts, table.column("partition").to_pylist(),
                    table.column("count").to_pylist(), strict=True)))
        return [row for batch, rows in self._files.values()
                if up_to_batch is None or batch <= up_to_batch for row in rows]


def truth(times: Mapping[tuple[int, int], int], ends: Mapping[int, int] | None = None
          ) -> Counter[Key]:
    """Rows produced per window, of the offsets below ``ends`` (all when None)."""
    return Counter((window_of(ts), p) for (p, offset), ts in times.items()
                   if ends is None or offset < ends.get(p, 0))


@dataclass(frozen=True)
class WindowCount:
    start: int
    partition: int
    produced: int
    counted: int | None  # None: not emitted
    emitted: int  # how many times the window was emitted (exactly once: 1)
    closed: bool

    @property
    def exact(self) -> bool:
        return self.closed and self.emitted == 1 and self.counted == self.produced

    @property
    def lost(self) -> int:
        """Rows of the window the query did not count (0 while the window is open)."""
        return max(0, self.produced - (self.counted or 0)) if self.closed else 0


@dataclass(frozen=True)
class Comparison:
    """One query's windows against the truth."""

    progress: Progress
    windows: dict[Key, WindowCount]

    @property
    def closed(self) -> list[WindowCount]:
        return [w for w in self.windows.values() if w.closed]

    @property
    def wrong(self) -> list[WindowCount]:
        return [w for w in self.closed if not w.exact]

    @property
    def dropped(self) -> int:
        return sum(w.lost for w in self.windows.values())

    def dropped_of(self, partition: int) -> int:
        return sum(w.lost for w in self.windows.values() if w.partition == partition)


def compare(progress: Progress, emitted: list[tuple[int, int, int]], produced: Counter[Key]
            ) -> Comparison:
    counted: Counter[Key] = Counter()
    times: Counter[Key] = Counter()
    for start, partition, count in emitted:
        counted[(start, partition)] += count
        times[(start, partition)] += 1
    watermark = progress.watermark
    windows = {}
    for key in set(produced) | set(counted):
        start, partition = key
        closed = key in counted or (watermark is not None and start + WINDOW_MS <= watermark)
        windows[key] = WindowCount(start, partition, produced.get(key, 0), counted.get(key),
                                   times[key], closed)
    return Comparison(progress, windows)


class WindowQuery:
    """One of the demo's windowed counts, as the demo sees it from outside its process."""

    def __init__(self, name: str, label: str, home: Path, topic: str) -> None:
        self.name, self.label = name, label
        self._progress = home / "progress.jsonl"
        self._output = WindowOutput(home / "output")
        self._topic = topic

    def progress(self) -> Progress:
        return read_progress(self._progress, self._topic)

    def measure(self, times: Mapping[tuple[int, int], int], final: bool = False) -> Comparison:
        """The query against the truth: live, as far as its reported batches go; ``final``
        (the query stopped), everything it committed against everything it read."""
        progress = self.progress()
        if not progress.started:
            return Comparison(progress, {})
        emitted = self._output.rows(None if final else progress.batch)
        return compare(progress, emitted, truth(times, progress.ends))
