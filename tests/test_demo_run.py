"""The demo's pacing without Spark: ``--duration`` bounds production whatever phase the demo
is in, the crash still comes once production is over, and the live display is only used on a
terminal (elsewhere a Live's last frame glued the next table's title onto its border)."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from flinkish.demo import main as demo
from flinkish.inspect import EpochRow


class FakeStream:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.silent = threading.Event()
        self.running = True

    def join(self) -> None:
        assert self.stop.is_set()
        self.running = False


class FakeQuery:
    ready = True

    def __init__(self) -> None:
        self.crashes = self.starts = 0

    def failed(self) -> bool:
        return False

    def crash(self) -> None:
        self.crashes += 1

    def start(self) -> None:
        self.starts += 1


class FakeCount:
    def __init__(self, started: bool) -> None:
        self._started = started

    def progress(self) -> Any:
        return type("P", (), {"started": self._started})()


def _run(tmp_path: Path, counts_started: bool = True) -> tuple[Any, FakeStream, FakeQuery]:
    stream, query = FakeStream(), FakeQuery()
    run = demo._Run(10.0, "t", tmp_path, stream, demo.Produced(), query,  # type: ignore[arg-type]
                    [FakeCount(counts_started)])  # type: ignore[list-item]
    return run, stream, query


def _epochs(monkeypatch: pytest.MonkeyPatch, *numbers: int) -> None:
    rows = [EpochRow(n, "completed", 0, None, None, (), 0, 0) for n in numbers]
    monkeypatch.setattr(demo, "_epochs", lambda checkpoint: rows)


def test_production_stops_at_the_duration_even_before_spark_committed_anything(
        tmp_path: Path) -> None:
    run, stream, query = _run(tmp_path)
    run.step(9.9)
    assert stream.running and not stream.stop.is_set()
    run.step(10.0)
    assert stream.stop.is_set() and not stream.running
    assert "production ended (--duration 10 s) before partition 2 went IDLE" in run.note
    assert query.crashes == 0  # nothing committed yet: no crash to show


def test_production_stops_at_the_duration_while_partition_2_is_silent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, stream, query = _run(tmp_path)
    _epochs(monkeypatch, 0)
    run.step(3.0)
    assert stream.silent.is_set() and run.resume_epoch is None
    run.step(10.5)  # production ends, and the silent phase with it
    assert not stream.running
    assert run.resume_epoch == 0 and not stream.silent.is_set() and query.crashes == 0
    run.step(10.75)  # the crash follows at once
    assert query.crashes == 1 and query.starts == 1 and run.crashes == 1
    assert not run.crashed_producing


def test_the_crash_waits_for_the_windowed_counts(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    run, stream, query = _run(tmp_path, counts_started=False)
    _epochs(monkeypatch, 0)
    for elapsed in (1.0, 10.0, 11.0, 12.0):
        run.step(elapsed)
    assert query.crashes == 0 and "waiting for the windowed counts" in run.phase


def test_while_producing_the_crash_comes_after_45_percent_of_the_duration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, stream, query = _run(tmp_path)
    _epochs(monkeypatch, 0)
    run.step(1.0)  # silent
    run.resume_epoch = 0  # partition 2 was IDLE long enough
    _epochs(monkeypatch, 0, 1)
    run.step(4.0)
    assert query.crashes == 0
    run.step(4.6)
    assert query.crashes == 1 and run.crashed_producing and stream.running


def _frame() -> Group:
    return Group(Text("phase"))


def test_the_live_display_only_on_a_terminal() -> None:
    pipe = Console(file=io.StringIO())
    assert demo._live_display(pipe, True, _frame) is None
    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(demo._live_display(terminal, True, _frame), Live)
    assert demo._live_display(terminal, False, _frame) is None


def test_after_the_crash_the_phase_shows_the_recovery_as_it_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, stream, query = _run(tmp_path)
    run.lingering = lambda: ["txn-a", "txn-b"]
    (tmp_path / "offsets").mkdir()
    for batch in range(3):  # batch 2 planned before the crash, not committed
        (tmp_path / "offsets" / str(batch)).write_text('v1\n{}\n{"topics": {"t": {}}}')
    clock = iter([100.0, 104.0, 108.0, 113.0, 125.5, 130.0])
    monkeypatch.setattr(demo.time, "monotonic", lambda: next(clock))
    _epochs(monkeypatch, 0)
    run.step(1.0)  # silent
    run.resume_epoch = 0
    _epochs(monkeypatch, 0, 1)
    query.ready = False  # type: ignore[misc]
    run.step(4.6)  # the crash: the restarted process has no SparkSession yet
    assert query.crashes == 1 and query.starts == 1
    assert "RECOVERING for 0 s: starting Spark again" in run.phase
    assert "replaying epoch 2 (planned before the crash, not committed; 2 pre-commit(s)" in (
        run.phase)
    run.step(5.0)  # still starting: the clock runs on
    assert "RECOVERING for 4 s: starting Spark again" in run.phase
    query.ready = True  # type: ignore[misc]
    run.step(6.0)
    assert "RECOVERING for 9 s: Spark up after 9 s; replaying epoch 2" in run.phase
    assert demo._stage(run.phase) == demo._stage(run.phase.replace("9 s", "12 s"))
    _epochs(monkeypatch, 0, 1, 2)
    run.step(7.0)  # epoch 2 committed by the restarted run
    assert run.recovery is not None and run.recovery.seconds == 21.5
    assert "recovered in 21.5 s; streaming" in run.phase
    run.step(8.0)
    assert "recovered in 21.5 s; streaming" in run.phase


def test_a_plain_log_prints_a_recovery_once_per_state_then_its_figure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a terminal: each step of the recovery is one line (not one every 5 s while Spark
    starts), then the recovered figure; streaming goes on printing its counts every 5 s."""
    run, stream, query = _run(tmp_path)
    (tmp_path / "offsets").mkdir()
    for batch in range(3):
        (tmp_path / "offsets" / str(batch)).write_text('v1\n{}\n{"topics": {"t": {}}}')
    now = [100.0]
    monkeypatch.setattr(demo.time, "monotonic", lambda: now[0])
    printed: list[str] = []
    last_stage, last_log = "", -1e9

    def tick(elapsed: float) -> None:
        nonlocal last_stage, last_log
        run.step(elapsed)
        if demo._log_due(run, last_stage, now[0] - last_log):
            printed.append(run.phase)
            last_stage, last_log = demo._stage(run.phase), now[0]
        now[0] += 6.0  # more than a plain log's 5 s between ticks

    _epochs(monkeypatch, 0)
    tick(1.0)
    run.resume_epoch = 0
    _epochs(monkeypatch, 0, 1)
    query.ready = False  # type: ignore[misc]
    tick(4.6)  # the crash
    for _ in range(5):  # 30 s of starting Spark
        tick(5.0)
    query.ready = True  # type: ignore[misc]
    for _ in range(3):  # 18 s of replaying
        tick(6.0)
    _epochs(monkeypatch, 0, 1, 2)
    tick(7.0)
    tick(7.5)
    recovering = [p for p in printed if "RECOVERING" in p]
    assert len(recovering) == 2, printed  # the crash, then Spark up
    assert "starting Spark again" in recovering[0] and "Spark up after" in recovering[1]
    after = printed[printed.index(recovering[1]) + 1]
    assert "recovered in 54.0 s; streaming" in after  # 6 s ticks: the crash at 106, up at 142
    assert printed[-1] == printed[-2]  # streaming again: its line every 5 s
