"""flinkish on a Spark Connect session (``SparkSession.builder.remote(...)``), which has no JVM.

``register`` does there what it does through the JVM on a classic session: the Spark master
travels to the server inside the registered data source class (a class defined in a function is
pickled by value); the shared environment map, which the client cannot reach, gets its keys from
one tiny flinkish query run to its end before any user query (docs/guides/spark-connect.md);
the completed-epoch listener runs in a Python process of the server.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql.datasource import (
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import BinaryType, StructField, StructType

from flinkish.data_source import FlinkishDataSource
from flinkish.epoch_listener import CompletedEpochListener
from flinkish_core.locations import MASTER_ENV

#: The option that turns a ``format("flinkish")`` read into ``register``'s warm-up reader.
WARMUP_OPTION = "flinkish.connect.warmup"
#: The name of the warm-up query (it shows in the server's UI and logs).
WARMUP_QUERY = "flinkish-connect-warmup"
#: How long the warm-up query may take: a query start on a busy 2-core server takes ~20 s.
WARMUP_TIMEOUT_S = 180.0

_lock = threading.Lock()
#: Connect session ids this process has prepared (register is idempotent per session).
_prepared: set[str] = set()


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session. ``is_remote()`` first, so a classic-only
    install never imports the Connect client (it needs grpcio); it is true for every session of a
    process that ever opened a Connect one, hence the class."""
    from pyspark.sql.utils import is_remote

    if not is_remote():
        return False
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return isinstance(spark, ConnectSession)


class _WarmupReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Has nothing to read: the warm-up query only needs Spark to start its source runner."""

    def initialOffset(self) -> dict:
        return {}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {}

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        return iter(())


def connect_source(master: str) -> type[FlinkishDataSource]:
    """``FlinkishDataSource`` carrying the Spark ``master`` to the server, and serving the
    warm-up query."""

    class FlinkishConnectSource(FlinkishDataSource):
        spark_master = master

        def _with_master(self) -> None:
            # one server JVM has one master, so the value is right for every flinkish query a
            # reused Python worker may serve later
            os.environ[MASTER_ENV] = self.spark_master

        def schema(self) -> StructType:
            if WARMUP_OPTION in self.options:
                return StructType([StructField("value", BinaryType())])
            self._with_master()
            return super().schema()

        def streamReader(self, schema: StructType) -> DataSourceStreamReader:
            if WARMUP_OPTION in self.options:
                return _WarmupReader()
            self._with_master()
            return super().streamReader(schema)

        def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
            self._with_master()
            return super().streamWriter(schema, overwrite)

    return FlinkishConnectSource


def register_connect(spark: Any) -> None:
    """``flinkish.register`` for a Connect session: register the source with the master and run
    the warm-up query, once per session (later calls return at once)."""
    with _lock:
        if spark.session_id in _prepared:
            return
        spark.dataSource.register(connect_source(spark.conf.get("spark.master")))
        _warm_up(spark)
        spark.streams.addListener(CompletedEpochListener())
        _prepared.add(spark.session_id)


def _warm_up(spark: Any) -> None:
    """Run the warm-up query to its end: Spark's runner seeds the map from one thread."""
    query = (
        spark.readStream.format(FlinkishDataSource.name()).option(WARMUP_OPTION, "true").load()
        .writeStream.format("noop").queryName(WARMUP_QUERY).trigger(availableNow=True).start()
    )
    try:
        finished = query.awaitTermination(WARMUP_TIMEOUT_S)
    except StreamingQueryException as exc:
        raise RuntimeError(
            f"flinkish.register: the warm-up query {WARMUP_QUERY!r} failed on the Spark Connect "
            f"server (is flinkish installed for the server's PYSPARK_PYTHON?): {exc}"
        ) from exc
    if not finished:
        query.stop()
        raise RuntimeError(
            f"flinkish.register: the warm-up query {WARMUP_QUERY!r} did not finish within "
            f"{WARMUP_TIMEOUT_S:g} s on the Spark Connect server; see the server's log"
        )
