"""``flinkish dev``: the embedded broker and PostgreSQL for one's own code. It prints where they
are, both answer (a record goes through the broker, PostgreSQL runs a query and two-phase
commit), and SIGTERM stops both: no process of theirs is left, nothing listens any more."""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from flinkish.demo.processes import tree

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def _lines(stream: object) -> queue.Queue[str | None]:
    """The child's output lines, read in a thread (None at its end)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _read_until(lines: queue.Queue[str | None], prefix: str, seen: list[str],
                timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no line starting {prefix!r}; output so far: {seen}")


def _pids_listening_on(port: int) -> set[int]:
    """Processes whose command line names ``port`` (the broker's listener URL, the
    postmaster's ``-p``)."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            args = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in args]
        if f"tcp://127.0.0.1:{port}" in text or any(
                f"-p {port} " in a or a == str(port) for a in text):
            found.add(int(name))
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def dev_process() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "flinkish.cli", "dev", "--topic", "events:2"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:  # the test failed before stopping it
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_dev_serves_kafka_and_postgres_until_sigterm(
        dev_process: subprocess.Popen[str]) -> None:
    lines, seen = _lines(dev_process.stdout), []
    bootstrap = _read_until(lines, "kafka.bootstrap.servers: ", seen).split(": ", 1)[1]
    dsn = _read_until(lines, "PostgreSQL dsn: ", seen).split(": ", 1)[1]
    export = _read_until(lines, "export ", seen)
    _read_until(lines, "running;", seen)
    assert shlex.split(export)[1:] == [f"FLINKISH_KAFKA_BOOTSTRAP={bootstrap}",
                                       f"FLINKISH_POSTGRES_DSN={dsn}"]
    kafka_port = int(bootstrap.rsplit(":", 1)[1])
    pg_port = int(re.search(r"port=(\d+)", dsn).group(1))  # type: ignore[union-attr]

    # the broker: one record through the topic dev created
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("events", b"hello", partition=1)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dev-test",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("events", 1, 0)])
    try:
        message = consumer.poll(30)
        assert message is not None and message.error() is None
        assert message.value() == b"hello"
    finally:
        consumer.close()

    # PostgreSQL, with two-phase commit available (the sink needs it)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        prepared = conn.execute("show max_prepared_transactions").fetchone()
        assert prepared is not None and int(prepared[0]) > 0

    servers = _pids_listening_on(kafka_port) | _pids_listening_on(pg_port)
    family = set(servers)
    for pid in servers:
        family |= set(tree(pid))
    assert len(servers) >= 2, servers  # the broker and the postmaster
    dev_process.send_signal(signal.SIGTERM)
    assert dev_process.wait(timeout=60) == 0
    remaining = [line for line in iter(lines.get, None)]
    assert "stopped the broker and PostgreSQL" in remaining, seen + remaining
    deadline = time.monotonic() + 20
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(family), "left running: " + ", ".join(
        Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ") for p in _alive(family))
    assert not _listens(kafka_port) and not _listens(pg_port)
