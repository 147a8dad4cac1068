"""PostgresTarget against a real PostgreSQL server: prepared rows stay invisible until the
driver commits them, and commit / rollback / pending behave as the recovery protocol needs."""

from __future__ import annotations

import math
import os
import pickle
import time
import uuid
from collections.abc import Iterator
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from flinkish.demo.embedded_postgres import DSN_ENV, EmbeddedPostgres, postgres_for_tests
from flinkish_sink.postgres_target import PostgresTarget
from flinkish_sink.target import TransactionId

pytestmark = pytest.mark.integration

UTC = timezone.utc
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def batch(start: int, count: int) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    return pa.record_batch([pa.array(ids, pa.int64()), [f"n{i}" for i in ids]], schema=SCHEMA)


def query_all(dsn: str, statement: sql.Composable | str, *params: Any) -> list[tuple[Any, ...]]:
    """Run ``statement`` in a fresh session: what any other reader of the database sees."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params or None).fetchall()


def execute(dsn: str, statement: sql.Composable) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


class Env:
    """One test's unique table and query names (so tests can share the server, even an
    external one), plus cleanup of everything they leave behind."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.token = uuid.uuid4().hex[:10]
        self.table = f"t_{self.token}"
        self.query = f"q_{self.token}"
        self.targets: list[PostgresTarget] = []

    def target(self, table: str | None = None) -> PostgresTarget:
        target = PostgresTarget(self.dsn, table or self.table)
        self.targets.append(target)
        return target

    def txn(
        self,
        epoch: int,
        task: int = 0,
        attempt: int = 0,
        *,
        prefix: str = "flinkish",
        query: str | None = None,
    ) -> TransactionId:
        return TransactionId(prefix, query or self.query, epoch, task, attempt)

    def count(self, table: str | None = None) -> int:
        name = sql.Identifier(*(table or self.table).split("."))
        rows = query_all(self.dsn, sql.SQL("SELECT count(*) FROM {}").format(name))
        return int(rows[0][0])

    def cleanup(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", [f"%{self.token}%"]
            ).fetchall():
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            for target in self.targets:
                for name in (target.table, target.epochs_table):
                    conn.execute(
                        sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(*name.split(".")))
                    )
        for target in self.targets:
            target.close()


@pytest.fixture
def env(postgres_dsn: str) -> Iterator[Env]:  # noqa: F811
    environment = Env(postgres_dsn)
    yield environment
    environment.cleanup()


def test_every_supported_type_round_trips(env: Env) -> None:
    struct = pa.struct([("a", pa.int64()), ("b", pa.string())])
    columns = {
        "i8": pa.array([-128, 127, None], pa.int8()),
        "i16": pa.array([-32768, 32767, None], pa.int16()),
        "i32": pa.array([-(2**31), 2**31 - 1, None], pa.int32()),
        "i64": pa.array([-(2**63), 2**63 - 1, None], pa.int64()),
        "f32": pa.array([1.5, -65504.25, None], pa.float32()),
        "f64": pa.array([0.1, float("nan"), None], pa.float64()),
        "flag": pa.array([True, False, None]),
        "s": pa.array(["héllo ✓", "", None]),
        "ls": pa.array(["x" * 10_000, "'quoted\"\\\ttab", None], pa.large_string()),
        "bin": pa.array([b"\x00\xff\x01", b"", None]),
        "lbin": pa.array([b"abc", b"\\x00", None], pa.large_binary()),
        "ts_utc": pa.array(
            [
                datetime(1999, 12, 31, 23, 59, 59, 999999, UTC),
                datetime(2024, 2, 29, tzinfo=UTC),
                None,
            ],
            pa.timestamp("us", tz="UTC"),
        ),
        "ts_naive_ms": pa.array([0, 1_700_000_000_123, None], pa.timestamp("ms")),
        "ts_s_paris": pa.array([-86_400, 1, None], pa.timestamp("s", tz="Europe/Paris")),
        "ts_ns": pa.array([1_999, 1_000_000_000_000_000_000, None], pa.timestamp("ns")),
        "d": pa.array([date(1970, 1, 1), date(1999, 12, 31), None]),
        "dec": pa.array([Decimal("-12.34"), Decimal("99999999.99"), None], pa.decimal128(10, 2)),
        "big_dec": pa.array([Decimal(10**39), Decimal(-1), None], pa.decimal256(40, 0)),
        "ints": pa.array([[1, 2], [], None], pa.list_(pa.int64())),
        "obj": pa.array([{"a": 1, "b": "x"}, {"a": None, "b": None}, None], struct),
        "m": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
    }
    data = pa.record_batch(columns)
    target = env.target()
    target.check(data.schema)

    declared = query_all(
        env.dsn,
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = to_regclass(%s) AND attnum > 0 ORDER BY attnum",
        env.table,
    )
    assert declared == [
        ("i8", "smallint"), ("i16", "smallint"), ("i32", "integer"), ("i64", "bigint"),
        ("f32", "real"), ("f64", "double precision"), ("flag", "boolean"), ("s", "text"),
        ("ls", "text"), ("bin", "bytea"), ("lbin", "bytea"),
        ("ts_utc", "timestamp with time zone"), ("ts_naive_ms", "timestamp with time zone"),
        ("ts_s_paris", "timestamp with time zone"), ("ts_ns", "timestamp with time zone"),
        ("d", "date"), ("dec", "numeric(10,2)"), ("big_dec", "numeric(40,0)"),
        ("ints", "jsonb"), ("obj", "jsonb"), ("m", "jsonb"),
    ]  # fmt: skip

    txn = target.begin_transaction(env.txn(0), data.schema)
    txn.write(data)
    target.commit(txn.pre_commit())

    names = sql.SQL(", ").join(sql.Identifier(name) for name in columns)
    got = query_all(
        env.dsn, sql.SQL("SELECT {} FROM {} ORDER BY i8").format(names, sql.Identifier(env.table))
    )
    assert len(got) == 3
    first, second, third = (dict(zip(columns, row, strict=True)) for row in got)
    assert all(value is None for value in third.values())
    assert first == {
        "i8": -128, "i16": -32768, "i32": -(2**31), "i64": -(2**63), "f32": 1.5, "f64": 0.1,
        "flag": True, "s": "héllo ✓", "ls": "x" * 10_000, "bin": b"\x00\xff\x01",
        "lbin": b"abc",
        "ts_utc": datetime(1999, 12, 31, 23, 59, 59, 999999, UTC),
        "ts_naive_ms": datetime(1970, 1, 1, tzinfo=UTC),
        "ts_s_paris": datetime(1969, 12, 31, tzinfo=UTC),
        "ts_ns": datetime(1970, 1, 1, 0, 0, 0, 1, UTC),
        "d": date(1970, 1, 1), "dec": Decimal("-12.34"), "big_dec": Decimal(10**39),
        "ints": [1, 2], "obj": {"a": 1, "b": "x"}, "m": [["k", 1]],
    }  # fmt: skip
    assert math.isnan(second.pop("f64"))
    assert second == {
        "i8": 127, "i16": 32767, "i32": 2**31 - 1, "i64": 2**63 - 1,
        "f32": -65504.25, "flag": False, "s": "",
        "ls": "'quoted\"\\\ttab", "bin": b"", "lbin": b"\\x00",
        "ts_utc": datetime(2024, 2, 29, tzinfo=UTC),
        "ts_naive_ms": datetime(2023, 11, 14, 22, 13, 20, 123000, UTC),
        "ts_s_paris": datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
        "ts_ns": datetime(2001, 9, 9, 1, 46, 40, tzinfo=UTC),
        "d": date(1999, 12, 31), "dec": Decimal("99999999.99"), "big_dec": Decimal(-1),
        "ints": [], "obj": {"a": None, "b": None}, "m": [],
    }  # fmt: skip


def test_incompatible_existing_table_names_every_column(env: Env) -> None:
    execute(
        env.dsn,
        sql.SQL("CREATE TABLE {} (id integer, extra text NOT NULL, note text)").format(
            sql.Identifier(env.table)
        ),
    )
    with pytest.raises(ValueError) as failure:
        env.target().check(SCHEMA)
    message = str(failure.value)
    assert env.table in message
    assert "'id' is integer in the table but Arrow int64 in the stream (needs bigint)" in message
    assert "'name' is missing from the table (needs text)" in message
    assert "'extra' is NOT NULL without a default" in message
    assert "'note'" not in message  # nullable extra columns are fine: COPY leaves them NULL


def test_compatible_existing_table_is_used_as_is(env: Env) -> None:
    execute(
        env.dsn,
        sql.SQL(
            "CREATE TABLE {} (seen timestamp, id bigint NOT NULL, name varchar(20), "
            "loaded_at timestamptz NOT NULL DEFAULT now(), note text)"
        ).format(sql.Identifier(env.table)),
    )
    schema = SCHEMA.append(pa.field("seen", pa.timestamp("us")))
    target = env.target()
    target.check(schema)
    data = batch(0, 2).append_column("seen", pa.array([0, None], pa.timestamp("us")))
    target.write_direct(data)
    rows = query_all(
        env.dsn,
        sql.SQL("SELECT id, name, seen, note FROM {} ORDER BY id").format(
            sql.Identifier(env.table)
        ),
    )
    assert rows == [(0, "n0", datetime(1970, 1, 1), None), (1, "n1", None, None)]


def test_server_without_two_phase_commit_says_how_to_fix_it() -> None:
    with EmbeddedPostgres(max_prepared_transactions=0) as server:
        target = PostgresTarget(server.dsn, "t")
        direct = PostgresTarget(server.dsn, "t", two_phase=False)  # at-least-once needs no 2PC
        try:
            with pytest.raises(RuntimeError) as failure:
                target.check(SCHEMA)
            direct.check(SCHEMA)
            direct.write_direct(batch(0, 3))
        finally:
            target.close()
            direct.close()
        dsn = server.dsn
    with pytest.raises(psycopg.OperationalError):  # stopped
        psycopg.connect(dsn, connect_timeout=2)
    message = str(failure.value)
    assert "max_prepared_transactions = 0" in message
    assert "ALTER SYSTEM SET max_prepared_transactions = 64" in message
    assert "-c max_prepared_transactions=64" in message


def test_prepared_rows_are_invisible_until_committed(env: Env) -> None:
    target = env.target()
    target.check(SCHEMA)
    txn = target.begin_transaction(env.txn(3, task=1), SCHEMA)
    txn.write(batch(0, 5))
    txn.write(batch(5, 0))
    txn.write(batch(5, 2))
    pre_commit = txn.pre_commit()
    assert (pre_commit.txn, pre_commit.rows) == (env.txn(3, task=1), 7)

    assert env.count() == 0
    assert target.pending("flinkish", env.query) == [env.txn(3, task=1)]

    target.commit(pre_commit)
    assert env.count() == 7
    assert target.pending("flinkish", env.query) == []

    target.commit(pre_commit)  # a replayed commit after a driver crash: nothing happens
    assert env.count() == 7


def test_commit_survives_a_new_target_and_connection(env: Env) -> None:
    """The driver that commits is not the process that prepared (nor, after a crash, the one
    that started the query): only the gid crosses over."""
    writer = env.target()
    writer.check(SCHEMA)
    txn = writer.begin_transaction(env.txn(1), SCHEMA)
    txn.write(batch(0, 3))
    pre_commit = txn.pre_commit()
    writer.close()

    recovering = env.target()
    assert recovering.pending("flinkish", env.query) == [pre_commit.txn]
    recovering.commit(pre_commit)
    assert env.count() == 3


def test_rollback_discards_and_is_idempotent(env: Env) -> None:
    target = env.target()
    target.check(SCHEMA)
    txn = target.begin_transaction(env.txn(4), SCHEMA)
    txn.write(batch(0, 3))
    pre_commit = txn.pre_commit()

    target.rollback(pre_commit.txn)
    assert target.pending("flinkish", env.query) == []
    assert env.count() == 0
    target.rollback(pre_commit.txn)
    target.rollback(env.txn(99))  # never existed


def _synchronous_standby(dsn: str, name: str) -> None:
    """Set ``synchronous_standby_names`` server-wide and wait until new sessions see it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if name:
            conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(
                sql.Literal(name)))
        else:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    while query_all(dsn, "SHOW synchronous_standby_names")[0][0] != name:
        assert time.monotonic() < deadline, "the server did not reload its configuration"
        time.sleep(0.05)


def test_finishing_a_transaction_another_session_is_finishing_waits_for_it(env: Env) -> None:
    """The tasks of a replayed epoch each resolve what an earlier run left pre-committed, so two
    can meet on one gid; PostgreSQL then answers "is busy" to the second until the first is
    done. Made to last here: with a synchronous standby configured that never connects, a
    COMMIT PREPARED waits for it while holding the transaction."""
    if env.dsn == os.environ.get(DSN_ENV):
        pytest.skip("changes the server's configuration: only on the embedded server")
    import threading

    target = env.target()
    target.check(SCHEMA)
    txn = target.begin_transaction(env.txn(1), SCHEMA)
    txn.write(batch(0, 3))
    pre_commit = txn.pre_commit()
    committer = env.target()
    finished: list[BaseException | None] = []

    def resolve(action: Any) -> None:
        try:
            action()
            finished.append(None)
        except BaseException as exc:  # noqa: BLE001  (reported by the test)
            finished.append(exc)

    _synchronous_standby(env.dsn, "flinkish_test_standby_never_there")
    try:
        first = threading.Thread(target=resolve, args=(lambda: committer.commit(pre_commit),))
        first.start()
        deadline = time.monotonic() + 30
        while not query_all(env.dsn, "SELECT 1 FROM pg_stat_activity WHERE wait_event = "
                                     "'SyncRep'"):
            assert time.monotonic() < deadline, "COMMIT PREPARED did not wait for the standby"
            time.sleep(0.05)
        second = threading.Thread(target=resolve, args=(lambda: target.commit(pre_commit),))
        second.start()
        time.sleep(0.5)  # the second meets the busy transaction meanwhile, and waits
        assert finished == []
    finally:
        _synchronous_standby(env.dsn, "")
    first.join(30)
    second.join(30)
    assert finished == [None, None]
    assert env.count() == 3
    assert target.pending("flinkish", env.query) == []


def test_abort_before_prepare_leaves_nothing(env: Env) -> None:
    target = env.target()
    target.check(SCHEMA)
    txn = target.begin_transaction(env.txn(5), SCHEMA)
    txn.write(batch(0, 3))
    txn.abort()
    txn.abort()
    assert env.count() == 0
    assert target.pending("flinkish", env.query) == []
    # The session is gone too (a backend exits a moment after its client disconnects).
    deadline = time.monotonic() + 10
    while query_all(
        env.dsn, "SELECT 1 FROM pg_stat_activity WHERE application_name = %s", env.txn(5).gid
    ):
        assert time.monotonic() < deadline, "the aborted transaction's session is still open"
        time.sleep(0.01)


def test_a_transaction_with_a_failed_write_cannot_be_pre_committed(env: Env) -> None:
    """PostgreSQL turns PREPARE of a failed transaction into a silent ROLLBACK: pre_commit must
    not report that as prepared rows, or the driver would "commit" rows that do not exist."""
    execute(
        env.dsn,
        sql.SQL("CREATE TABLE {} (id bigint CHECK (id >= 0), name text)").format(
            sql.Identifier(env.table)
        ),
    )
    target = env.target()
    target.check(SCHEMA)
    txn = target.begin_transaction(env.txn(8), SCHEMA)
    txn.write(batch(0, 2))
    with pytest.raises(psycopg.errors.CheckViolation):
        txn.write(batch(-1, 1))
    with pytest.raises(RuntimeError, match="rolled back, not prepared"):
        txn.pre_commit()
    txn.abort()
    assert target.pending("flinkish", env.query) == []
    assert env.count() == 0


def test_write_rejects_a_batch_of_other_types(env: Env) -> None:
    target = env.target()
    target.check(SCHEMA)
    txn = target.begin_transaction(env.txn(6), SCHEMA)
    try:
        other = pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["x"]})
        with pytest.raises(ValueError, match="differ"):
            txn.write(other)
    finally:
        txn.abort()


def test_pending_filters_by_prefix_and_query(env: Env) -> None:
    target = env.target()
    target.check(SCHEMA)
    other_query = f"{env.query}-other"
    ids = [
        env.txn(1, task=0),
        env.txn(1, task=1),
        env.txn(2, attempt=1),
        env.txn(1, prefix="elsewhere"),
        env.txn(1, query=other_query),
    ]
    for txn_id in ids:
        txn = target.begin_transaction(txn_id, SCHEMA)
        if txn_id.task == 0:  # an empty transaction (a task without rows) is prepared too
            txn.write(batch(0, 1))
        txn.pre_commit()
    # A prepared transaction that is not ours at all.
    with psycopg.connect(env.dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(f"app-{env.token}")))

    assert target.pending("flinkish", env.query) == ids[:3]
    assert target.pending("elsewhere", env.query) == [ids[3]]
    assert target.pending("flinkish", other_query) == [ids[4]]
    assert target.pending("nobody", env.query) == []


def test_write_direct_is_visible_at_once(env: Env) -> None:
    target = env.target()
    target.check(SCHEMA)
    target.write_direct(batch(0, 4))
    target.write_direct(batch(4, 0))
    assert env.count() == 4
    target.write_direct(batch(4, 1))
    assert env.count() == 5


def test_schema_qualified_table_with_awkward_names(env: Env) -> None:
    schema_name = f"Odd Schema {env.token}"
    execute(env.dsn, sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema_name)))
    try:
        table = f'{schema_name}.Table "{env.token}"'
        awkward = pa.schema([("Mixed Case", pa.int64()), ("select", pa.string())])
        target = env.target(table)
        assert target.epochs_table == f"{table}_flinkish_epochs"
        target.check(awkward)
        txn = target.begin_transaction(env.txn(0), awkward)
        txn.write(pa.record_batch([pa.array([1], pa.int64()), ["x"]], schema=awkward))
        target.commit(txn.pre_commit())
        target.publish_epoch(env.query, 0, 5, 1, 0)
        assert env.count(table) == 1
        assert target.committed_watermark(env.query) == 5
        target.check(awkward)  # now it exists: checked, not created
    finally:
        execute(env.dsn, sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema_name)))


def test_table_name_must_be_table_or_schema_dot_table(postgres_dsn: str) -> None:  # noqa: F811
    with pytest.raises(ValueError, match="schema.table"):
        PostgresTarget(postgres_dsn, "a.b.c")


def test_publish_epoch_is_idempotent_and_gives_the_committed_watermark(env: Env) -> None:
    target = env.target()
    assert target.committed_watermark(env.query) is None  # no epochs table yet
    target.check(SCHEMA)
    assert target.committed_watermark(env.query) is None

    target.publish_epoch(env.query, 0, None, 0, 0)
    target.publish_epoch(env.query, 1, 1_000, 10, 2, "valve")
    epochs = sql.Identifier(target.epochs_table)
    before = query_all(env.dsn, sql.SQL("SELECT * FROM {} ORDER BY epoch").format(epochs))
    target.publish_epoch(env.query, 1, 5_000, 99, 7, "spark")  # a replay must not rewrite history
    after = query_all(env.dsn, sql.SQL("SELECT * FROM {} ORDER BY epoch").format(epochs))
    assert after == before
    assert [row[:2] + row[3:] for row in after] == [
        (env.query, 0, None, 0, 0, None),
        (env.query, 1, 1_000, 10, 2, "valve"),
    ]
    assert target.committed_watermark(env.query) == 1_000

    target.publish_epoch(env.query, 2, 2_500, 4, 0)
    target.publish_epoch(f"{env.query}-other", 0, 9_999, 1, 0)
    assert target.committed_watermark(env.query) == 2_500


def test_pickled_target_with_an_open_connection(env: Env) -> None:
    target = env.target()
    target.check(SCHEMA)
    assert target.pending("flinkish", env.query) == []  # the driver connection is open now

    copy = pickle.loads(pickle.dumps(target))
    env.targets.append(copy)
    copy.write_direct(batch(0, 2))
    txn = copy.begin_transaction(env.txn(7), SCHEMA)
    txn.write(batch(2, 1))
    target.commit(txn.pre_commit())
    assert copy.pending("flinkish", env.query) == []
    assert env.count() == 3


def test_postgres_for_tests_prefers_an_external_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DSN_ENV, "host=db.example port=5433 user=ci")
    with postgres_for_tests() as dsn:
        assert dsn == "host=db.example port=5433 user=ci"


# --- upsert mode --------------------------------------------------------------------------

PANES = pa.schema([("k", pa.string()), ("start", pa.int64()), ("n", pa.int64()),
                   ("pane", pa.int32())])


def panes(*rows: tuple[str, int, int, int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [dict(zip(PANES.names, row, strict=True)) for row in rows], schema=PANES)


def staging_tables(dsn: str) -> list[tuple[Any, ...]]:
    return query_all(dsn, "SELECT tablename FROM pg_tables WHERE tablename LIKE "
                          "'flinkish_staging_%%'")


def test_upsert_overwrites_a_keys_row_inside_the_prepared_transaction(env: Env) -> None:
    target = PostgresTarget(env.dsn, env.table, upsert_key=("k", "start"))
    env.targets.append(target)
    target.check(PANES)  # creates the table with the key as primary key
    txn = target.begin_transaction(env.txn(1), PANES)
    # two panes of window (a, 0) in one batch: the later wins
    txn.write(panes(("a", 0, 1, 0), ("b", 0, 5, 0), ("a", 0, 2, 1)))
    txn.write(panes(("a", 10, 7, 0)))
    pre_commit = txn.pre_commit()
    assert env.count() == 0  # prepared: invisible
    target.commit(pre_commit)
    rows = sql.SQL("SELECT k, start, n, pane FROM {} ORDER BY k, start").format(
        sql.Identifier(env.table))
    assert query_all(env.dsn, rows) == [("a", 0, 2, 1), ("a", 10, 7, 0), ("b", 0, 5, 0)]

    txn = target.begin_transaction(env.txn(2), PANES)
    txn.write(panes(("a", 0, 3, 2), ("c", 0, 1, 0)))
    target.rollback(txn.pre_commit().txn)  # a rolled-back epoch changes nothing
    txn = target.begin_transaction(env.txn(2, attempt=1), PANES)
    txn.write(panes(("a", 0, 4, 2), ("c", 0, 1, 0)))
    target.commit(txn.pre_commit())
    assert query_all(env.dsn, rows) == [("a", 0, 4, 2), ("a", 10, 7, 0), ("b", 0, 5, 0),
                                        ("c", 0, 1, 0)]
    target.write_direct(panes(("b", 0, 6, 1)))  # at-least-once: its own transaction
    assert ("b", 0, 6, 1) in query_all(env.dsn, rows)
    assert staging_tables(env.dsn) == []


def test_upsert_key_must_name_columns_with_a_unique_index(env: Env) -> None:
    plain = env.target()
    plain.check(PANES)  # a table without any index
    target = PostgresTarget(env.dsn, env.table, upsert_key=("k", "start"))
    with pytest.raises(ValueError, match=r"no unique index on \(k, start\)"):
        target.check(PANES)
    execute(env.dsn, sql.SQL("CREATE UNIQUE INDEX ON {} (start, k)").format(
        sql.Identifier(env.table)))
    target.check(PANES)  # any column order
    with pytest.raises(ValueError, match="'window_start' is not a column"):
        PostgresTarget(env.dsn, env.table, upsert_key=("k", "window_start")).check(PANES)
    target.close()


def test_a_transaction_takes_over_the_write_tasks_idle_connection(env: Env) -> None:
    """A write task looks for leftovers on the target's connection, then begins its
    transaction: on that same session (one login per task and epoch, not two), named by its
    gid; after PREPARE the session is closed and the target opens a new one when asked."""
    target = env.target()
    target.check(SCHEMA)
    assert target.pending("flinkish", env.query) == []
    row = target._connection().execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    looked_on = row[0]
    txn = target.begin_transaction(env.txn(5), SCHEMA)
    txn.write(batch(0, 3))
    assert query_all(env.dsn, "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                     env.txn(5).gid) == [(looked_on,)]
    pre_commit = txn.pre_commit()
    assert target.pending("flinkish", env.query) == [env.txn(5)]
    target.commit(pre_commit)
    assert env.count() == 3
    # a connection inside a transaction is not taken over: the transaction opens its own
    busy = target._connection()
    busy.execute("BEGIN")
    other = target.begin_transaction(env.txn(6), SCHEMA)
    assert busy.closed
    other.write(batch(3, 2))
    target.commit(other.pre_commit())
    assert env.count() == 5
