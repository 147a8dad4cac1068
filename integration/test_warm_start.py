"""``flinkish.register`` starts the daemons of the data source's driver-side calls ahead, and a
query's calls and tasks use them: the query starts no daemon of any of those modules (it would,
with a worker environment that differs from the one Spark gives its runners). The first of them
forks the server the source's runner is forked from, which a query does without (it starts the
runner as Spark does) when the server is gone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import flinkish
from flinkish import fork_server, warm_start
from integration.kafka_helpers import produce, source

pytestmark = pytest.mark.integration


def daemons() -> set[tuple[int, str]]:
    """The pid and worker module of each Python daemon the driver's JVM started."""
    from flinkish.demo.processes import tree

    found = set()
    for pid, (ppid, _, _, _) in tree(os.getpid()).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode().split("\0")
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                parent = f.read().decode()
        except FileNotFoundError:
            continue
        if "-m" in argv and "java" in parent and argv[argv.index("-m") + 1].endswith("daemon"):
            found.add((pid, argv[argv.index("-m") + 2]))
    return found


def test_the_daemons_started_ahead_are_the_ones_the_query_uses(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    flinkish.register(spark)
    registered = spark._jsparkSession.sessionState().dataSourceManager().lookupDataSource(
        "flinkish")
    planned = tuple(module for module, _, _ in warm_start.plans(spark, registered))
    assert set(planned) == {*warm_start.DRIVER_MODULES, "pyspark.worker"}  # a local master
    assert warm_start.started(spark, timeout=120) == planned
    before = daemons()
    query = flinkish_query(spark, kafka_bootstrap, topic, tmp_path, availableNow=True)
    query.awaitTermination(300)
    assert not query.isActive and query.exception() is None
    assert {m for _, m in daemons() - before} & set(planned) == set()


RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def processes() -> dict[int, tuple[int, str]]:
    """The parent and command line of each process of the driver's tree."""
    from flinkish.demo.processes import tree

    found = {}
    for pid, (ppid, _, _, _) in tree(os.getpid()).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found[pid] = (ppid, f.read().decode().replace("\0", " "))
        except FileNotFoundError:
            continue
    return found


def runners(server: int | None) -> tuple[set[int], set[int]]:
    """The source runners' clients (``flinkish.fork_client``, started by the JVM) and the
    server's forks."""
    table = processes()
    clients = {pid for pid, (_, line) in table.items()
               if "fork_client" in line and RUNNER in line}
    forks = {pid for pid, (ppid, _) in table.items() if server is not None and ppid == server}
    return clients, forks


def wait_until(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def registered_server(spark: Any) -> int:
    """The pid of the fork server of the daemons ``register`` started."""
    flinkish.register(spark)
    assert warm_start.started(spark, timeout=120)

    def found() -> set[int]:
        names = {}
        for pid in processes():
            try:
                with open(f"/proc/{pid}/comm", "rb") as f:
                    names[pid] = f.read().strip()
            except FileNotFoundError:
                continue
        return {pid for pid, name in names.items() if name == fork_server.NAME}

    wait_until(lambda: len(found()) == 1, "one fork server")
    (server,) = found()
    return server


def flinkish_query(spark: Any, bootstrap: str, topic: Any, tmp_path: Path, **trigger: Any) -> Any:
    """A query from a new topic of five records into Parquet, started with ``trigger``."""
    name = topic(1)
    produce(bootstrap, name, [(0, b"k", b"v%d" % i, 1_000 + i) for i in range(5)])
    return (source(spark, bootstrap, name, str(tmp_path / "state"))
            .writeStream.format("flinkish").option("target", "parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(**trigger).start())


def test_the_source_runner_is_a_fork_of_the_fork_server_and_goes_with_its_query(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    server = registered_server(spark)
    query = flinkish_query(spark, kafka_bootstrap, topic, tmp_path, processingTime="1 second")
    try:
        wait_until(lambda: query.lastProgress is not None or not query.isActive, "a batch")
        assert query.isActive, query.exception()
        clients, forks = runners(server)
        assert len(clients) == 1 and len(forks) == 1, processes()
        client_parent = processes()[next(iter(clients))][0]
        assert "java" in processes()[client_parent][1]
    finally:
        query.stop()
    wait_until(lambda: runners(server) == (set(), set()), "the runner gone with its query", 30)


def test_a_query_runs_without_the_fork_server(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    server = registered_server(spark)
    os.kill(server, signal.SIGKILL)
    wait_until(lambda: server not in processes(), "the server gone")
    query = flinkish_query(spark, kafka_bootstrap, topic, tmp_path, availableNow=True)
    query.awaitTermination(300)
    assert not query.isActive and query.exception() is None
    assert spark.read.parquet(str(tmp_path / "out")).count() == 5
    assert runners(None)[0] == set()
