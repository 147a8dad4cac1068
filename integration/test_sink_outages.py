"""The sink rides out its target going away for a few seconds mid-stream: PostgreSQL stopped
and started again (a PostgreSQL server of this module's own, as stopping the session's would
break the tests beside it), and the S3 test server cut off behind a proxy, under a Delta
table. The query keeps running, every record lands exactly once, and the retry is logged.
Past ``outageTimeout`` the epoch's commit fails with an error naming the target."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from flinkish.demo.embedded_postgres import EmbeddedPostgres
from flinkish_sink.outages import TargetUnavailableError
from flinkish_sink.postgres_target import PostgresTarget
from flinkish_sink.stream_writer import FlinkishStreamWriter, SinkCommitMessage
from flinkish_sink.target import TransactionId
from integration.kafka_helpers import produce, source, wait_for
from integration.outage_proxy import OutageProxy
from integration.s3_server import ACCESS_KEY, SECRET_KEY, S3Server

pytestmark = pytest.mark.integration

PARTITIONS = 2
WAVE = 10  # records per partition and wave
B = 1_700_000_000_000
#: Longer than pyarrow's and delta-rs' own retries of a refused connection (~6 s and ~4 s),
#: so that the sink's retries are the ones that ride it out.
S3_OUTAGE_S = 8.0
PG_OUTAGE_S = 3.0


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


def _wave(kafka_bootstrap: str, name: str, wave: int) -> None:
    produce(kafka_bootstrap, name, [
        (p, f"k{p}".encode(), b"{}", B + (wave * WAVE + i) * 1000)
        for i in range(WAVE) for p in range(PARTITIONS)])


def _expected(waves: int) -> list[tuple[int, int]]:
    return [(p, o) for p in range(PARTITIONS) for o in range(waves * WAVE)]


def _start(spark: Any, kafka_bootstrap: str, name: str, tmp_path: Path, **options: str) -> Any:
    df = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                maxOffsetsPerTrigger="8").selectExpr(
        "topic", "partition", "offset", "eventTime", "kind", "watermark", "status")
    writer = df.writeStream.format("flinkish").option(
        "checkpointLocation", str(tmp_path / "ck"))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.trigger(processingTime="500 milliseconds").start()


def _pg_rows(dsn: str, table: str) -> list[tuple[int, int]]:
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            return sorted(conn.execute(sql.SQL('SELECT "partition", "offset" FROM {}').format(
                sql.Identifier(table))).fetchall())
    except (psycopg.OperationalError, psycopg.errors.UndefinedTable):
        return []


def _retries_logged(request: pytest.FixtureRequest, target: str) -> list[str] | None:
    """The sink's retry warnings for ``target`` in what Spark's Python workers wrote to
    stderr: Spark started under pytest's global output capture, so that is where it lands
    (written out again here for the test's report). None when pytest captures nothing
    (``-s``)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None or not capture.is_globally_capturing():
        return None
    err = capture.read_global_capture().err
    sys.stderr.write(err)
    return [line for line in err.splitlines() if target in line and " unreachable: " in line]


def _away_until_retried(request: pytest.FixtureRequest, target: str, seconds: float) -> None:
    """The outage itself: at least ``seconds``, then until the sink has logged a retry against
    ``target`` (on a loaded machine the next epoch may reach the target only later)."""
    time.sleep(seconds)
    wait_for(lambda: _retries_logged(request, target) != [], 120,
             f"the sink logging a retry of {target} while it is away")


def _stop(query: Any) -> None:
    query.stop()
    assert query.exception() is None


def test_postgres_stopped_mid_stream_the_query_keeps_running_and_writes_each_row_once(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path,
    own_postgres: EmbeddedPostgres, request: pytest.FixtureRequest,
) -> None:
    name, table = topic(PARTITIONS), f"outage_{uuid.uuid4().hex[:8]}"
    dsn = own_postgres.dsn
    _wave(kafka_bootstrap, name, 0)
    query = _start(spark, kafka_bootstrap, name, tmp_path, target="postgres", dsn=dsn,
                   table=table)
    try:
        wait_for(lambda: _pg_rows(dsn, table), 180, "the first epoch in PostgreSQL")
        with own_postgres.away():
            _wave(kafka_bootstrap, name, 1)
            _away_until_retried(request, f"PostgresTarget('{dsn}', '{table}')", PG_OUTAGE_S)
            assert query.isActive, query.exception()
        _wave(kafka_bootstrap, name, 2)
        wait_for(lambda: len(_pg_rows(dsn, table)) >= len(_expected(3)), 120,
                 "every record in PostgreSQL")
        assert query.isActive, query.exception()
    finally:
        _stop(query)
    assert _pg_rows(dsn, table) == _expected(3)  # each exactly once


def test_postgres_away_longer_than_outage_timeout_fails_naming_the_target_and_how_long(
    own_postgres: EmbeddedPostgres, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The driver's commit of an epoch (run here as Spark's commit runner runs it) while the
    server stays away past a short ``outageTimeout``; once it is back, the same commit
    completes: the prepared transaction outlived the restart."""
    from pyspark.sql.types import LongType, StructField, StructType

    dsn, table, query = own_postgres.dsn, f"outage_{uuid.uuid4().hex[:8]}", "q-outage"
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(f'{{"id":"{query}"}}\n')
    writer = FlinkishStreamWriter(StructType([StructField("v", LongType())]), {
        "target": "postgres", "dsn": dsn, "table": table,
        "checkpointLocation": str(checkpoint), "outageTimeout": "1 s"})
    arrow = pa.schema([("v", pa.int64())])
    transaction = PostgresTarget(dsn, table).begin_transaction(
        TransactionId("flinkish", query, 0, 0, 0, "r1"), arrow)
    transaction.write(pa.record_batch([pa.array([1, 2])], schema=arrow))
    message = SinkCommitMessage(0, [transaction.pre_commit().to_json()], [], 2, 0)
    with own_postgres.away():
        started = time.monotonic()
        with pytest.raises(TargetUnavailableError) as failed:
            writer.commit([message], 0)
        took = time.monotonic() - started
    assert 1.0 <= took < 15
    text = str(failed.value)
    assert text.startswith(f"PostgresTarget('{dsn}', '{table}'): commit of epoch 0 failed: "
                           "the target stayed unreachable for 1.")
    assert "longer than the sink's outageTimeout (1.0 s)" in text
    # the last attempt's own reason, from the connection it could not open
    assert "last error: PostgresConnectError: cannot connect to PostgreSQL" in text, text
    assert text.endswith("and accepts connections from here)"), text
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert any("Connection refused" in m for m in retries), retries  # the server was away
    writer.commit([message], 0)
    with psycopg.connect(dsn) as conn:
        assert conn.execute(sql.SQL("SELECT v FROM {} ORDER BY v").format(
            sql.Identifier(table))).fetchall() == [(1,), (2,)]
        assert conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall() == []


def _delta_rows(location: str) -> list[tuple[int, int]]:
    import deltalake

    from flinkish_sink.delta_target import delta_location

    uri, options = delta_location(location)
    try:
        table = deltalake.DeltaTable(uri, storage_options=options).to_pyarrow_table()
    except (deltalake.exceptions.TableNotFoundError, OSError):
        return []
    return sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                      strict=True))


def test_s3_away_mid_stream_a_delta_table_gets_each_row_once(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, s3: S3Server,
    request: pytest.FixtureRequest,
) -> None:
    bucket = f"outage-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    host, port = s3.endpoint.rsplit(":", 1)
    name = topic(PARTITIONS)
    _wave(kafka_bootstrap, name, 0)
    with OutageProxy((host, int(port))) as proxy:
        # the credentials in the URI: Spark's processes started before the S3 server's
        # fixture exported them
        location = S3Server(proxy.endpoint).uri(bucket, "tables/events").replace(
            "s3://", f"s3://{ACCESS_KEY}:{SECRET_KEY}@", 1)
        direct = s3.uri(bucket, "tables/events")
        query = _start(spark, kafka_bootstrap, name, tmp_path, target="delta", path=location)
        try:
            wait_for(lambda: _delta_rows(direct), 180, "the first epoch in the Delta table")
            with proxy.away():
                _wave(kafka_bootstrap, name, 1)
                _away_until_retried(request, "DeltaTarget(", S3_OUTAGE_S)
                assert query.isActive, query.exception()
            wait_for(lambda: len(_delta_rows(direct)) >= len(_expected(2)), 120,
                     "every record in the Delta table")
            assert query.isActive, query.exception()
        finally:
            _stop(query)
    assert _delta_rows(direct) == _expected(2)  # each exactly once
