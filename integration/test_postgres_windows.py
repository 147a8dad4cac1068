"""PostgresTarget against a real server (no Spark): a table flinkish 0.1 created with a jsonb
``window`` column is refused with the statements that move it to the window's bounds (and they
do), a table whose ``window`` is neither gets a clear error, and an epoch with more write tasks than
``max_prepared_transactions`` fails naming the setting and the fix."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import psycopg
import pyarrow as pa
import pytest

from flinkish.demo.embedded_postgres import EmbeddedPostgres
from flinkish_sink.postgres_target import PostgresTarget
from flinkish_sink.target import TransactionId

pytestmark = pytest.mark.integration

UTC = timezone.utc
WINDOW = pa.struct([("start", pa.timestamp("us", tz="UTC")), ("end", pa.timestamp("us", tz="UTC"))])
SCHEMA = pa.schema([("window", WINDOW), ("count", pa.int64())])
T0, T1 = datetime(2024, 1, 1, 12, 0, tzinfo=UTC), datetime(2024, 1, 1, 12, 1, tzinfo=UTC)


def rows() -> pa.RecordBatch:
    return pa.record_batch([pa.array([{"start": T0, "end": T1}], WINDOW), pa.array([7])],
                           schema=SCHEMA)


def write_epoch(target: PostgresTarget, query: str) -> None:
    target.check(SCHEMA)
    txn = target.begin_transaction(TransactionId("flinkish", query, 0, 0, 0), SCHEMA)
    txn.write(rows())
    target.commit(txn.pre_commit())


def test_a_jsonb_window_column_of_0_1_is_refused_with_its_migration(postgres_dsn: str) -> None:
    table = f"legacy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE {table} ("window" jsonb, "count" bigint)')
        conn.execute(f"""INSERT INTO {table} VALUES ('{{"start": "2024-01-01T12:00:00+00:00", '
                     '"end": "2024-01-01T12:01:00+00:00"}}', 3)""")
    with pytest.raises(ValueError, match="'window' as one jsonb column, as flinkish 0.1") as e:
        PostgresTarget(postgres_dsn, table).check(SCHEMA)
    # the message's statements move the table to the bounds, its rows kept
    migration = str(e.value).split("Move the table to them: ")[1]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(migration)
    write_epoch(PostgresTarget(postgres_dsn, table), "q1")
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        found = conn.execute(f"SELECT window_start, window_end, count FROM {table} "
                             "ORDER BY count").fetchall()
    assert found == [(T0, T1, 3), (T0, T1, 7)]


def test_a_new_table_gets_the_windows_bounds(postgres_dsn: str) -> None:
    table = f"new_{uuid.uuid4().hex[:8]}"
    write_epoch(PostgresTarget(postgres_dsn, table), "q2")
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        found = conn.execute(f"SELECT window_start, window_end, count FROM {table}").fetchall()
    assert found == [(T0, T1, 7)]


def test_a_window_column_of_another_type_is_a_clear_error(postgres_dsn: str) -> None:
    table = f"odd_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE {table} ("window" text, "count" bigint)')
    with pytest.raises(ValueError, match="'window_start' is missing from the table "
                                         r"\(needs timestamptz\)"):
        PostgresTarget(postgres_dsn, table).check(SCHEMA)


def test_more_write_tasks_than_max_prepared_transactions_name_the_fix() -> None:
    with EmbeddedPostgres(max_prepared_transactions=2) as server:
        target = PostgresTarget(server.dsn, "t")
        target.check(SCHEMA)
        assert target.max_pending() == 2
        for task in range(2):
            txn = target.begin_transaction(TransactionId("flinkish", "q", 0, task, 0), SCHEMA)
            txn.write(rows())
            txn.pre_commit()
        third = target.begin_transaction(TransactionId("flinkish", "q", 0, 2, 0), SCHEMA)
        third.write(rows())
        with pytest.raises(RuntimeError) as failure:
            third.pre_commit()
        third.abort()
        message = str(failure.value)
        assert "max_prepared_transactions (currently 2)" in message
        assert "spark.sql.shuffle.partitions" in message and "coalesce(n)" in message
        for task in range(2):
            target.rollback(TransactionId("flinkish", "q", 0, task, 0))
        target.close()


def test_an_older_epochs_table_gets_the_watermark_source_column(postgres_dsn: str) -> None:
    table = f"old_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table}_flinkish_epochs (query text NOT NULL, epoch bigint "
                     "NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), watermark "
                     "bigint, rows bigint NOT NULL, late_rows bigint NOT NULL, "
                     "PRIMARY KEY (query, epoch))")
        conn.execute(f"INSERT INTO {table}_flinkish_epochs (query, epoch, watermark, rows, "
                     "late_rows) VALUES ('q', 0, 5, 1, 0)")
    target = PostgresTarget(postgres_dsn, table)
    target.publish_epoch("q", 1, 9, 1, 0, "spark")
    target.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        found = conn.execute(f"SELECT epoch, watermark, watermark_source FROM "
                             f"{table}_flinkish_epochs ORDER BY epoch").fetchall()
    assert found == [(0, 5, None), (1, 9, "spark")]
