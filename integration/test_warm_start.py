"""``flinkish.register`` starts the daemons of the data source's driver-side calls ahead, and a
query's calls and tasks use them: the query starts no daemon of any of those modules (it would,
with a worker environment that differs from the one Spark gives its runners)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import flinkish
from flinkish import warm_start
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
    name = topic(1)
    produce(kafka_bootstrap, name, [(0, b"k", b"v%d" % i, 1_000 + i) for i in range(5)])
    query = (source(spark, kafka_bootstrap, name, str(tmp_path / "state"))
             .writeStream.format("flinkish").option("target", "parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert not query.isActive and query.exception() is None
    assert {m for _, m in daemons() - before} & set(planned) == set()
