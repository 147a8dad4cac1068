"""A Spark Connect server for the integration tests, shared by the whole session, and clients
that run jobs on it.

The server runs in a process of its own (``integration/connect_server.py``, on an ephemeral
port) and each client in another (``integration/connect_client.py``): a Connect server is a
classic SparkSession, which cannot share this process with the ``spark`` fixture, and a Connect
client makes PySpark treat every session of its process as remote. The clients have no JVM, so
nothing flinkish does there can reach for one.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flinkish.demo.processes import kill_tree

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 120.0  # a Spark driver start on a busy 2-core machine
RUN_TIMEOUT = 360.0
#: Fake static AWS credentials and a region in the server's environment, which its Python
#: workers inherit: what the AWS MSK IAM signer reads there (it signs locally; nothing here
#: calls AWS). See integration/test_secured_kafka.py.
FAKE_AWS_ENV = {"AWS_ACCESS_KEY_ID": "AKIAFLINKISHTEST0000",
                "AWS_SECRET_ACCESS_KEY": "fake-secret-for-tests", "AWS_REGION": "eu-west-1"}


class Child:
    """A Python child process speaking one JSON object a line on stdout; stdin to talk back."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._stderr = open(log, "wb")  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, start_new_session=True, env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(line)
        self.lines.put(None)

    def expect(self, timeout: float, what: str) -> dict[str, Any]:
        """The next JSON line; fails naming ``what`` (with the log's tail) after ``timeout``."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            line = None
            reason = f"nothing after {timeout:g} s"
        else:
            reason = "the process exited"
        if line is None:
            tail = self.log.read_text(errors="replace")[-4000:]
            raise AssertionError(f"waiting for {what}: {reason}\n{tail}")
        return dict(json.loads(line))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self, timeout: float = 60.0) -> None:
        """Close stdin (the child's signal to stop its session and exit), then make sure that
        it and every process it started are gone."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            pass
        finally:
            kill_tree(self.proc.pid, 30)
            self.proc.wait()
            self._stderr.close()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Child, int]]:
    """The Connect server process and its port."""
    server = Child(["-m", "integration.connect_server"],
                   tmp_path_factory.mktemp("connect") / "server.log",
                   env={**os.environ, **FAKE_AWS_ENV})
    try:
        yield server, int(server.expect(START_TIMEOUT, "the Connect server's port")["port"])
    finally:
        server.close()


def _env_keys(server: Child, session: list[str]) -> list[str]:
    server.send(json.dumps({"env": session}))
    reply = server.expect(30, "the server's environment report")
    assert "env" in reply, reply
    return list(reply["env"])


def run_client(connect: tuple[Child, int], root: Path, jobs: list[dict[str, Any]]
                ) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]]:
    """Run the jobs in a Connect client: (its register report, the session's environment keys
    before the jobs started, their results); checks the keys did not change while they ran."""
    server, port = connect
    (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
    client = Child(["-m", "integration.connect_client", "--port", str(port),
                    "--jobs", str(root / "jobs.json")], root / "client.log")
    try:
        hello = client.expect(START_TIMEOUT, "the client's register report")
        before = _env_keys(server, hello["session"])
        client.send("go")
        results = [client.expect(RUN_TIMEOUT, f"job {job['name']}") for job in jobs]
        assert client.expect(60, "the client's end")["done"]
        after = _env_keys(server, hello["session"])
    finally:
        client.close()
    assert after == before, "a query's source runner added keys to the shared map"
    failed = [r for r in results if not r["ok"]]
    assert not failed, "\n\n".join(f"{r['name']}: {r['error']}" for r in failed)
    return hello, before, results
