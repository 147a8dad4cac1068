"""A query stopped while its ``foreachBatch`` function runs a Spark job, on the JVM's default
thread stacks: Spark matches the function's failure against ``StreamExecution.PROXY_ERROR``,
which overflowed the stream thread's stack on the ~9,000-character traceback of an interrupted
``collect()``: the thread ended with a ``StackOverflowError`` (fatal under an uncaught-error
handler that exits, and a real failure then goes unreported). Through
:func:`flinkish.stoppable` the query ends as a stop does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import flinkish
from integration.kafka_helpers import wait_for

pytestmark = pytest.mark.integration


class Uncaught:
    """A Java ``Thread.UncaughtExceptionHandler`` in Python: the errors that ended threads."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def uncaughtException(self, thread: Any, error: Any) -> None:  # noqa: N802 (Java's name)
        self.errors.append((thread.getName(), error.getClass().getName()))

    class Java:
        implements = ["java.lang.Thread$UncaughtExceptionHandler"]


@pytest.fixture
def uncaught(spark: Any) -> Iterator[Uncaught]:
    """The JVM's default handler of uncaught errors, recording them for this test."""
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(spark.sparkContext._gateway)
    threads = spark.sparkContext._jvm.java.lang.Thread
    before = threads.getDefaultUncaughtExceptionHandler()
    handler = Uncaught()
    threads.setDefaultUncaughtExceptionHandler(handler)
    try:
        yield handler
    finally:
        threads.setDefaultUncaughtExceptionHandler(before)


def test_a_query_stopped_while_its_batch_runs_a_job_ends_as_a_stop(
    spark: Any, uncaught: Uncaught
) -> None:
    from pyspark.sql.streaming import StreamingQueryListener

    class Terminations(StreamingQueryListener):
        def __init__(self) -> None:
            self.ended: dict[str, str | None] = {}

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            self.ended[str(event.id)] = event.exception

    def slow(batches: Any) -> Any:
        import time

        time.sleep(120)  # until the stop cancels the job
        yield from batches

    running = threading.Event()

    def func(df: Any, epoch: int) -> None:
        running.set()
        df.sparkSession.range(1).mapInPandas(slow, "id long").collect()

    listener = Terminations()
    spark.streams.addListener(listener)
    try:
        query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
                 .writeStream.foreachBatch(flinkish.stoppable(func)).start())
        try:
            assert running.wait(120), "no batch started"
            tracker = spark.sparkContext.statusTracker()
            wait_for(lambda: any(tracker.getJobInfo(j) and tracker.getJobInfo(j).status
                                 == "RUNNING" for j in tracker.getActiveJobsIds()),
                     60, "the batch's job to run")
        finally:
            stopped = time.monotonic()
            query.stop()
        wait_for(lambda: query.id in listener.ended, 60, "the query's termination event")
        assert listener.ended[query.id] is None and query.exception() is None
        assert time.monotonic() - stopped < 60
        # Spark's stop check ran over the function's failure without overflowing
        assert [e for e in uncaught.errors if e[0].startswith("stream execution thread")] == []
    finally:
        spark.streams.removeListener(listener)
