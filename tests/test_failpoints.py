"""Failpoints: an armed point stops the process that reaches it; with ``once`` only the first
(the rerun of a task whose executor a test killed there must run through)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpointing import failpoints

ROOT = Path(__file__).resolve().parent.parent


def _arm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **spec: object) -> Path:
    marker = tmp_path / "stopped"
    armed = tmp_path / "failpoints.json"
    armed.write_text(json.dumps([{"point": "task_write", "marker": str(marker), **spec}]))
    monkeypatch.setenv(failpoints.ENV, str(armed))
    return marker


def _reach_in_child() -> subprocess.Popen[bytes]:
    code = ("from checkpointing.failpoints import failpoint; "
            "failpoint('task_write', query='q', epoch=1); print('passed')")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE)


def _wait_written(marker: Path, child: subprocess.Popen[bytes], timeout: float = 30) -> str:
    """The marker once the child wrote it (its pid in it)."""
    deadline = time.monotonic() + timeout
    while not (marker.exists() and f" {child.pid}\n" in marker.read_text()):
        assert child.poll() is None, "the child passed the armed failpoint"
        assert time.monotonic() < deadline, "the child never reached the failpoint"
        time.sleep(0.05)
    return marker.read_text()


def test_once_stops_only_the_first_process(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    marker = _arm(tmp_path, monkeypatch, once=True, from_epoch=1)
    child = _reach_in_child()
    try:
        assert _wait_written(marker, child) == f"task_write {child.pid}\n"
        started = time.monotonic()
        failpoints.failpoint("task_write", query="q", epoch=1)  # passes: not the first
        assert time.monotonic() - started < 1
        assert marker.read_text() == f"task_write {child.pid}\n"  # left as the first wrote it
        assert child.poll() is None  # still stopped
    finally:
        child.kill()
        child.wait()


def test_without_once_every_process_stops(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    marker = _arm(tmp_path, monkeypatch)
    marker.write_text("task_write 1\n")  # an earlier stop
    child = _reach_in_child()
    try:
        assert _wait_written(marker, child) == f"task_write {child.pid}\n"
    finally:
        child.kill()
        child.wait()


def test_other_points_and_earlier_epochs_pass(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    marker = _arm(tmp_path, monkeypatch, once=True, from_epoch=1)
    failpoints.failpoint("task_write", query="q", epoch=0)
    failpoints.failpoint("mid_commit", query="q", epoch=1)
    assert not marker.exists()


def test_min_transactions_passes_steps_holding_fewer(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``min_transactions``: a crash where a decision names some transaction, not in an
    empty epoch's (nor where the caller does not say)."""
    marker = _arm(tmp_path, monkeypatch, once=True, min_transactions=1)
    failpoints.failpoint("task_write", query="q", epoch=1, transactions=0)
    failpoints.failpoint("task_write", query="q", epoch=1)
    assert not marker.exists()
