"""PostgreSQL as a two-phase-commit target: COPY into a transaction, PREPARE it, decide later.

``PREPARE TRANSACTION 'gid'`` is PostgreSQL's XA: the rows are durable yet invisible until any
session commits or rolls back the gid. The gid is the deterministic :class:`TransactionId`, so
a restarted driver finds its query's transactions in ``pg_prepared_xacts``. Rows travel as
binary ``COPY`` built from the Arrow buffers, with no Python object per row.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from functools import cache, partial
from time import monotonic, sleep
from typing import Any, TypeAlias

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from psycopg.adapt import PyFormat
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from flinkish_core.config import Option, optional_text
from flinkish_core.secrets import dsn_secrets, mask_dsn, scrub
from flinkish_sink.options import LATE_TABLE, TABLE, UPSERT_KEY, DeliveryGuarantee, TargetOptions
from flinkish_sink.outages import postgres_transient
from flinkish_sink.target import FIX_WRITE_TASKS, PreCommit, TransactionId
from flinkish_sink.targets import TargetFactory
from flinkish_sink.window_columns import check_columns, is_window, table_batch, table_schema

Connection = psycopg.Connection[TupleRow]

COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, header extension length
COPY_TRAILER = b"\xff\xff"


@cache
def _no_separator() -> pa.Scalar:
    """The empty separator of the row join, built at first use: a pyarrow scalar from a Python
    value imports pandas, which the driver's commit runner would pay for at every start."""
    return pa.scalar(b"", pa.large_binary())


_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01, PostgreSQL's timestamp epoch, in Unix us
_PG_EPOCH_DAYS = 10_957
_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}

_FIX_2PC = (
    "Two-phase commit is disabled on this server (max_prepared_transactions = 0), so "
    "PREPARE TRANSACTION cannot work. Fix: as a superuser run "
    "`ALTER SYSTEM SET max_prepared_transactions = 64;` and restart PostgreSQL, or start the "
    "server with `-c max_prepared_transactions=64` (use at least the number of write tasks "
    "that pre-commit concurrently).")


Values: TypeAlias = np.ndarray | pa.Array
"""A column's values in binary form: a big-endian numpy array of a fixed-width type (a NULL
row's value is arbitrary), or a large_binary array, NULL where the column is."""


@dataclass(frozen=True)
class ColumnType:
    """How one Arrow type lands in PostgreSQL: ``ddl`` for a created table, ``accepts`` the
    ``pg_type.typname``\\ s binary COPY can fill (binary input is strict: int8 cannot go into
    int4), ``encode`` to :data:`Values`, of one width when ``fixed``."""

    ddl: str
    accepts: frozenset[str]
    encode: Callable[[pa.Array], Values]
    fixed: bool = False


#: Arrow type, DDL, ``pg_type.typname``, numpy wire type.
_FIXED_TYPES: tuple[tuple[Callable[[pa.DataType], bool], str, str, str], ...] = (
    (lambda t: pa.types.is_int8(t) or pa.types.is_int16(t), "smallint", "int2", ">i2"),
    (pa.types.is_int32, "integer", "int4", ">i4"),
    (pa.types.is_int64, "bigint", "int8", ">i8"),
    (pa.types.is_float32, "real", "float4", ">f4"),
    (pa.types.is_float64, "double precision", "float8", ">f8"),
    (pa.types.is_boolean, "boolean", "bool", "u1"),
)


def postgres_type(dtype: pa.DataType, column: str) -> ColumnType:
    """The PostgreSQL type for an Arrow type; ValueError naming ``column`` if there is none."""
    for accepts, ddl, typname, wire in _FIXED_TYPES:
        if accepts(dtype):
            return ColumnType(ddl, frozenset({typname}), partial(_encode_fixed, dtype=wire), True)
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return ColumnType("text", frozenset({"text", "varchar", "bpchar"}), _encode_binary)
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return ColumnType("bytea", frozenset({"bytea"}), _encode_binary)
    if pa.types.is_timestamp(dtype) and dtype.unit in (*_US_PER_UNIT, "ns"):
        # Arrow timestamps count from the Unix epoch in UTC, also without a zone
        return ColumnType("timestamptz", frozenset({"timestamptz", "timestamp"}),
                          partial(_encode_timestamp, unit=dtype.unit), True)
    if pa.types.is_date32(dtype):
        return ColumnType("date", frozenset({"date"}), _encode_date, True)
    if pa.types.is_decimal(dtype):
        return ColumnType(
            f"numeric({dtype.precision}, {dtype.scale})", frozenset({"numeric"}), _encode_decimal)
    if any(kind(dtype) for kind in (pa.types.is_list, pa.types.is_large_list,
                                    pa.types.is_fixed_size_list, pa.types.is_struct,
                                    pa.types.is_map)):
        return ColumnType("jsonb", frozenset({"jsonb"}),
                          partial(_encode_per_value, dump=_dump_jsonb))
    raise ValueError(
        f"unsupported type for column {column!r}: Arrow {dtype} has no PostgreSQL mapping "
        "(supported: integers, floats, bool, string, binary, timestamp, date32, decimal, "
        "window structs as two timestamptz columns, other list/struct/map as jsonb)")


def postgres_types(schema: pa.Schema) -> list[ColumnType]:
    return [postgres_type(field.type, field.name) for field in schema]


def _large_binary(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A large_binary array over the contiguous ``data``, value i at ``offsets[i:i + 2]``."""
    return pa.Array.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _numbers(column: pa.Array) -> np.ndarray:
    # to_numpy would turn ints with nulls into float64 (lossy)
    filled = column if column.null_count == 0 else pc.fill_null(
        column, False if pa.types.is_boolean(column.type) else 0)
    result: np.ndarray = filled.to_numpy(zero_copy_only=False)
    return result


def _encode_fixed(column: pa.Array, dtype: str) -> np.ndarray:
    return _numbers(column).astype(dtype)


def _encode_timestamp(column: pa.Array, unit: str) -> np.ndarray:
    raw = _numbers(column.cast(pa.int64()))
    # PostgreSQL keeps microseconds: nanoseconds are floored
    micros = raw // 1_000 if unit == "ns" else raw * _US_PER_UNIT[unit]
    return (micros - _PG_EPOCH_US).astype(">i8")


def _encode_date(column: pa.Array) -> np.ndarray:
    days = _numbers(column.cast(pa.int32()))
    return (days - _PG_EPOCH_DAYS).astype(">i4")


def _encode_binary(column: pa.Array) -> pa.Array:
    """text and bytea: the bytes themselves."""
    return column.cast(pa.large_binary())


def _encode_per_value(column: pa.Array, dump: Callable[[Any], bytes]) -> pa.Array:
    """For types Arrow kernels cannot encode (decimal, jsonb): one Python call per value."""
    return pa.array([None if value is None else dump(value) for value in column.to_pylist()],
                    pa.large_binary())


def _encode_decimal(column: pa.Array) -> pa.Array:
    """numeric's binary form, by psycopg's own dumper."""
    dumper = psycopg.adapters.get_dumper(Decimal, PyFormat.BINARY)(Decimal)

    def dump(value: Decimal) -> bytes:
        return bytes(dumper.dump(value) or b"")  # None is only ever dumped from None

    return _encode_per_value(column, dump)


def _json_default(value: object) -> str:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} in jsonb")


def _dump_jsonb(value: object) -> bytes:
    """A list or struct as a JSON array or object (a map as an array of [key, value] pairs),
    in jsonb's binary format: a version byte (1), then the JSON text."""
    text = json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))
    return b"\x01" + text.encode()


def _records(fields: list[np.ndarray]) -> pa.Array:
    """One large_binary value per row: the rows' values of ``fields`` packed side by side."""
    packed = np.empty(len(fields[0]), dtype=[(f"f{i}", f.dtype) for i, f in enumerate(fields)])
    for i, values in enumerate(fields):
        packed[f"f{i}"] = values
    width = packed.dtype.itemsize
    return _large_binary(np.arange(0, (len(packed) + 1) * width, width, dtype=np.int64), packed)


def _nullable(values: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, pa.Array]:
    """(lengths, data) of fixed-width ``values``: -1 and no bytes where not ``valid``."""
    width = values.dtype.itemsize
    lengths = np.where(valid, width, -1).astype(">i4")
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(valid * width, out=offsets[1:])
    return lengths, _large_binary(offsets, np.ascontiguousarray(values[valid]))


def encode_rows(batch: pa.RecordBatch, types: list[ColumnType]) -> memoryview:
    """The rows of a binary COPY payload for ``batch``, by one Arrow join over whole columns:
    the fixed-width pieces between two variable-length values are packed into one record per
    row by numpy, so adjacent fixed-width columns without NULLs cost one piece together."""
    parts: list[pa.Array] = []
    run: list[np.ndarray] = [np.full(batch.num_rows, len(types), dtype=">i2")]
    for kind, column in zip(types, batch.columns, strict=True):
        values = kind.encode(column)
        if isinstance(values, np.ndarray) and column.null_count == 0:
            run += [np.full(len(values), values.dtype.itemsize, dtype=">i4"), values]
            continue
        if isinstance(values, np.ndarray):
            lengths, data = _nullable(values, column.is_valid().to_numpy(zero_copy_only=False))
        else:
            lengths = np.asarray(pc.fill_null(pc.binary_length(values), -1)).astype(">i4")
            data = values
        parts += [_records([*run, lengths]), data]
        run = []
    if run:
        parts.append(_records(run))
    rows = pc.binary_join_element_wise(*parts, _no_separator(), null_handling="replace")
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int64)
    start, end = int(offsets[rows.offset]), int(offsets[rows.offset + len(rows)])
    return memoryview(rows.buffers()[2])[start:end]


def copy_order(batch: pa.RecordBatch, types: list[ColumnType]) -> list[int]:
    """The columns' order in the COPY: fixed width without NULLs first (one piece per row)."""
    packed = [kind.fixed and column.null_count == 0
              for kind, column in zip(types, batch.columns, strict=True)]
    return sorted(range(len(types)), key=lambda i: not packed[i])


def _names(names: Iterable[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(name) for name in names)


def _copy_into(conn: Connection, table: sql.Composable, batch: pa.RecordBatch) -> None:
    types = postgres_types(batch.schema)
    order = copy_order(batch, types)
    batch, types = batch.select(order), [types[i] for i in order]
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        table, _names(batch.schema.names))
    with conn.cursor() as cursor, cursor.copy(statement) as copy:
        copy.write(COPY_HEADER)
        copy.write(encode_rows(batch, types))
        copy.write(COPY_TRAILER)


#: How long COMMIT / ROLLBACK PREPARED waits while another session finishes the same gid.
BUSY_WAIT_S = 60.0

_STAGING_ORDER = "flinkish_row"  # the staging table's row order: of one key the last row wins


def _upsert_into(conn: Connection, table: sql.Identifier, batch: pa.RecordBatch,
                 key: tuple[str, ...]) -> None:
    """Upsert ``batch`` on ``key`` through a staging table (a prepared transaction may not
    touch temporary ones); of several rows with one key the last one wins."""
    staging = sql.Identifier(f"flinkish_staging_{uuid.uuid4().hex}")
    order = sql.Identifier(_STAGING_ORDER)
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {}, {} bigserial)").format(
        staging, table, order))
    _copy_into(conn, staging, batch)
    columns, keys = _names(batch.schema.names), _names(key)
    updates = [name for name in batch.schema.names if name not in key]
    action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(n), sql.Identifier(n))
        for n in updates)) if updates else sql.SQL("DO NOTHING")
    conn.execute(sql.SQL(
        "INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} ORDER BY {}, {} DESC "
        "ON CONFLICT ({}) {}").format(table, columns, keys, columns, staging, keys, order,
                                      keys, action))
    conn.execute(sql.SQL("DROP TABLE {}").format(staging))


def _identifier(name: str) -> sql.Identifier:
    parts = name.split(".")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"table name {name!r} must be 'table' or 'schema.table'")
    return sql.Identifier(*parts)


def _write(conn: Connection, table: sql.Identifier, batch: pa.RecordBatch,
           upsert_key: tuple[str, ...]) -> None:
    batch = table_batch(batch)
    if batch.num_rows == 0:
        return
    if upsert_key:
        _upsert_into(conn, table, batch, upsert_key)
    else:
        _copy_into(conn, table, batch)


class PostgresConnectError(RuntimeError):
    """PostgreSQL could not be reached or refused the login (the DSN's password masked);
    ``transient`` keeps what the unchained original error would tell."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def _connect(dsn: str, **options: Any) -> Connection:
    """An autocommit connection; a failure is reported with the password masked, also in
    libpq's message, and unchained (the original could hold it)."""
    try:
        # binary COPY of text is converted from the client encoding
        return psycopg.connect(dsn, autocommit=True, client_encoding="UTF8", **options)
    except psycopg.Error as exc:
        reason = scrub(str(exc).strip(), dsn_secrets(dsn)) or type(exc).__name__
        raise PostgresConnectError(
            f"cannot connect to PostgreSQL with dsn {mask_dsn(dsn)!r}: {reason} (check the "
            "sink's dsn option: host, port, user, password, dbname, and that the server runs "
            "and accepts connections from here)",
            transient=bool(postgres_transient(exc))) from None


class PostgresTransaction:
    """One task attempt's transaction, named by its gid once prepared; autocommit with an
    explicit BEGIN, so that psycopg adds no statement of its own."""

    def __init__(self, dsn: str, table: sql.Identifier, txn: TransactionId, schema: pa.Schema,
                 upsert_key: tuple[str, ...] = (), conn: Connection | None = None) -> None:
        postgres_types(table_schema(schema))  # fail before connecting if a column cannot be stored
        self.txn = txn
        self._table = table
        self._upsert_key = upsert_key
        self._types = schema.types
        self._rows = 0
        self._prepared = False
        # application_name shows in pg_stat_activity which attempt holds a session
        taken_over = conn is not None
        if conn is None:
            conn = _connect(dsn, application_name=txn.gid[:63])
        try:
            if taken_over:
                conn.execute(
                    sql.SQL("SET application_name = {}").format(sql.Literal(txn.gid[:63])))
            conn.execute("BEGIN")
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def write(self, batch: pa.RecordBatch) -> None:
        if self._prepared:
            raise RuntimeError(f"transaction {self.txn.gid} is already pre-committed")
        if batch.schema.types != self._types:
            raise ValueError(
                f"batch types {batch.schema.types} differ from the transaction's {self._types}")
        _write(self._conn, self._table, batch, self._upsert_key)
        self._rows += batch.num_rows

    def pre_commit(self) -> PreCommit:
        try:
            prepared = self._conn.execute(
                sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(self.txn.gid)))
        except psycopg.errors.OutOfMemory as exc:  # SQLSTATE 53200, as PostgreSQL reports it
            if "prepared transactions" not in str(exc):
                raise
            hint = exc.diag.message_hint or "Increase max_prepared_transactions"
            raise RuntimeError(
                f"PostgreSQL refused to prepare {self.txn.gid}: all its prepared-transaction "
                f"slots are taken ({hint.rstrip('.')}); {FIX_WRITE_TASKS}") from exc
        if prepared.statusmessage != "PREPARE TRANSACTION":
            # PostgreSQL answers PREPARE in a failed transaction with a ROLLBACK, not an error
            raise RuntimeError(
                f"transaction {self.txn.gid} was rolled back, not prepared: an earlier "
                "statement in it failed")
        self._prepared = True
        # a prepared transaction no longer belongs to the session
        self._conn.close()
        return PreCommit(self.txn, self._rows)

    def abort(self) -> None:
        """Roll back if not yet prepared; after PREPARE only the driver decides."""
        if self._conn.closed:
            return
        try:
            if not self._prepared:
                self._conn.execute("ROLLBACK")
        except psycopg.Error:
            pass  # a broken connection: the server rolls the transaction back itself
        finally:
            self._conn.close()


class PostgresTarget:
    """Exactly-once target over prepared transactions; pickles without its connection."""

    #: a prepared transaction keeps its row locks until COMMIT/ROLLBACK PREPARED
    leftovers_block_writes = True
    pending_consequence = ("a prepared transaction holds its locks and keeps PostgreSQL's "
                           "VACUUM from cleaning up")

    def __init__(self, dsn: str, table: str, *, epochs_table: str | None = None,
                 two_phase: bool = True, upsert_key: tuple[str, ...] = ()) -> None:
        self.dsn = dsn
        self.table = table
        self.upsert_key = upsert_key
        self.two_phase = two_phase  # at-least-once writes directly: no PREPARE needed
        self.epochs_table = epochs_table or f"{table}_flinkish_epochs"
        self._table = _identifier(table)
        self._epochs = _identifier(self.epochs_table)
        self._conn: Connection | None = None
        self._epochs_ready = False
        self._max_pending: int | None = None

    def __repr__(self) -> str:
        return f"PostgresTarget({mask_dsn(self.dsn)!r}, {self.table!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_conn"] = None
        state["_epochs_ready"] = False
        return state

    def _connection(self) -> Connection:
        """This process's reused autocommit connection."""
        if self._conn is None or self._conn.closed:
            self._conn = _connect(self.dsn)
        return self._conn

    def check(self, schema: pa.Schema) -> None:
        """Fail unless the server can prepare and the table fits; create what is missing."""
        conn = self._connection()
        if self.two_phase and not self.max_pending():
            raise RuntimeError(f"PostgreSQL at {conn.info.host}:{conn.info.port}: {_FIX_2PC}")
        windows = [f.name for f in schema if is_window(f.type)]
        schema = table_schema(schema)
        types = postgres_types(schema)
        check_columns("upsertKey", self.upsert_key, schema)
        found = conn.execute("SELECT to_regclass(%s)::oid",
                             [self._table.as_string(conn)]).fetchone()
        if found is None or found[0] is None:
            parts = [sql.SQL("{} {}").format(sql.Identifier(field.name), sql.SQL(kind.ddl))
                     for field, kind in zip(schema, types, strict=True)]
            if self.upsert_key:
                parts.append(sql.SQL("PRIMARY KEY ({})").format(_names(self.upsert_key)))
            conn.execute(sql.SQL("CREATE TABLE {} ({})").format(self._table,
                                                                sql.SQL(", ").join(parts)))
        else:
            self._check_columns(conn, found[0], schema, types, windows)
            self._check_upsert_key(conn, found[0])
        self._ensure_epochs_table()

    def _check_upsert_key(self, conn: Connection, oid: int) -> None:
        """ON CONFLICT needs a unique index on exactly the upsert key's columns."""
        if not self.upsert_key:
            return
        unique = conn.execute("""
            SELECT 1 FROM pg_index i
            WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL
              AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
                   WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)) = %s
            """, [oid, sorted(self.upsert_key)]).fetchone()
        if unique is None:
            columns = ", ".join(self.upsert_key)
            raise ValueError(
                f"option upsertKey: table {self.table} has no unique index on ({columns}), "
                "which INSERT … ON CONFLICT needs; create one (CREATE UNIQUE INDEX ON "
                f"{self.table} ({columns})) or let the sink create the table")

    def _check_columns(self, conn: Connection, oid: int, schema: pa.Schema,
                       types: list[ColumnType], windows: list[str]) -> None:
        rows = conn.execute("""
            SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod),
                   a.attnotnull AND NOT a.atthasdef AND a.attidentity = ''
                   AND a.attgenerated = ''
            FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
            WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum
            """, [oid]).fetchall()
        existing = {name: (typname, shown) for name, typname, shown, _ in rows}
        for w in windows:
            if existing.get(w, ("",))[0] == "jsonb" and f"{w}_start" not in existing:
                column, start, end = (f'"{name}"' for name in (w, f"{w}_start", f"{w}_end"))
                raise ValueError(
                    f"table {self.table} holds the window {w!r} as one jsonb column, as "
                    f"flinkish 0.1 created it; 0.2 writes a window as two timestamptz columns "
                    f"{w}_start and {w}_end. Move the table to them: ALTER TABLE {self.table} "
                    f"ADD COLUMN {start} timestamptz, ADD COLUMN {end} timestamptz; "
                    f"UPDATE {self.table} SET {start} = ({column}->>'start')::timestamptz, "
                    f"{end} = ({column}->>'end')::timestamptz; ALTER TABLE {self.table} "
                    f"DROP COLUMN {column}")
        problems = []
        for field, kind in zip(schema, types, strict=True):
            if field.name not in existing:
                problems.append(f"{field.name!r} is missing from the table (needs {kind.ddl})")
            elif existing[field.name][0] not in kind.accepts:
                problems.append(
                    f"{field.name!r} is {existing[field.name][1]} in the table but Arrow "
                    f"{field.type} in the stream (needs {kind.ddl})")
        problems += [f"{name!r} is NOT NULL without a default in the table but not in the stream"
                     for name, _, _, required in rows if required and name not in schema.names]
        if problems:
            raise ValueError(
                f"table {self.table} does not fit the stream's schema: " + "; ".join(problems))

    def max_pending(self) -> int:
        if self._max_pending is None:
            setting = self._connection().execute("SHOW max_prepared_transactions").fetchone()
            self._max_pending = 0 if setting is None else int(setting[0])
        return self._max_pending

    def begin_transaction(self, txn: TransactionId, schema: pa.Schema) -> PostgresTransaction:
        """A transaction that takes over this target's idle connection (a write task's, which
        looked for leftovers just before), saving a login per task; else a connection of its
        own."""
        conn, self._conn = self._conn, None
        if conn is not None and (conn.closed
                                 or conn.info.transaction_status != TransactionStatus.IDLE):
            conn.close()
            conn = None
        return PostgresTransaction(self.dsn, self._table, txn, schema, self.upsert_key, conn)

    def write_direct(self, batch: pa.RecordBatch) -> None:
        """One transaction of its own: the batch commits as a whole, at once."""
        conn = self._connection()
        with conn.transaction():
            _write(conn, self._table, batch, self.upsert_key)

    def commit(self, pre_commit: PreCommit) -> None:
        """COMMIT PREPARED; a gid no longer prepared was committed before (only undecided
        epochs are ever rolled back)."""
        self._finish_prepared("COMMIT PREPARED", pre_commit.txn.gid)

    def rollback(self, txn: TransactionId) -> None:
        self._finish_prepared("ROLLBACK PREPARED", txn.gid)

    def _finish_prepared(self, statement: str, gid: str) -> None:
        """``statement`` for ``gid`` unless no longer prepared; "is busy" (another session
        finishing it: a replay's tasks can meet on one gid) is waited out."""
        deadline = monotonic() + BUSY_WAIT_S
        while True:
            try:
                with contextlib.suppress(psycopg.errors.UndefinedObject):
                    self._connection().execute(
                        sql.SQL(statement + " {}").format(sql.Literal(gid)))
                return
            except psycopg.errors.ObjectNotInPrerequisiteState:
                if monotonic() >= deadline:
                    raise
                sleep(0.05)

    def pending(self, prefix: str, query: str) -> list[TransactionId]:
        """Prepared transactions of ``prefix``/``query`` in this database, sorted."""
        return sorted(self.pending_ages(prefix, query))

    def pending_ages(self, prefix: str, query: str) -> dict[TransactionId, float | None]:
        """:meth:`pending` with how long each has been prepared (s, server clock), oldest first."""
        rows = self._connection().execute(
            "SELECT gid, extract(epoch FROM now() - prepared)::float8 FROM pg_prepared_xacts"
            " WHERE database = current_database() ORDER BY prepared, gid").fetchall()
        ids = ((TransactionId.parse(gid), age) for gid, age in rows)
        return {txn: None if age is None else max(0.0, float(age)) for txn, age in ids
                if txn is not None and txn.prefix == prefix and txn.query == query}

    def _ensure_epochs_table(self) -> None:
        if self._epochs_ready:
            return
        self._connection().execute(sql.SQL("""
            CREATE TABLE IF NOT EXISTS {} (
                query text NOT NULL,
                epoch bigint NOT NULL,
                committed_at timestamptz NOT NULL DEFAULT now(),
                watermark bigint,
                rows bigint NOT NULL,
                late_rows bigint NOT NULL,
                watermark_source text,
                PRIMARY KEY (query, epoch)
            )""").format(self._epochs))
        # an older epochs table lacks watermark_source
        self._connection().execute(sql.SQL(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS watermark_source text").format(self._epochs))
        self._epochs_ready = True

    def publish_epoch(self, query: str, epoch: int, watermark: int | None, rows: int,
                      late_rows: int, source: str | None = None) -> None:
        """Record that ``epoch`` of ``query`` is committed; a replay leaves the row as it was."""
        self._ensure_epochs_table()
        self._connection().execute(sql.SQL(
            "INSERT INTO {} (query, epoch, watermark, rows, late_rows, watermark_source) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (query, epoch) DO NOTHING"
        ).format(self._epochs), [query, epoch, watermark, rows, late_rows, source])

    def committed_watermark(self, query: str) -> int | None:
        """The highest published watermark of ``query``; None before the first publish."""
        try:
            row = self._connection().execute(
                sql.SQL("SELECT max(watermark) FROM {} WHERE query = %s").format(self._epochs),
                [query]).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
        return None if row is None else row[0]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


DSN: Option[str | None] = Option(
    "dsn", optional_text, None, mask=mask_dsn, secrets=dsn_secrets,
    doc="libpq connection string.")
EPOCHS_TABLE: Option[str | None] = Option(
    "epochsTable", optional_text, None, shown_default="`<table>_flinkish_epochs`",
    doc="The table of committed epochs.")


def _create(options: TargetOptions, late: bool) -> PostgresTarget:
    dsn, table = options[DSN], options[LATE_TABLE] if late else options[TABLE]
    assert dsn is not None and table is not None
    return PostgresTarget(dsn, table, epochs_table=options[EPOCHS_TABLE],
                          two_phase=options.guarantee is DeliveryGuarantee.EXACTLY_ONCE,
                          upsert_key=() if late else options[UPSERT_KEY])  # late rows append


FACTORY = TargetFactory(
    name="postgres",
    doc="A PostgreSQL table, written by binary COPY in prepared transactions.",
    options=(DSN, TABLE, UPSERT_KEY, EPOCHS_TABLE, LATE_TABLE),
    required={DSN: "", TABLE: ""},
    side_output=LATE_TABLE,
    create=_create,
    cli_option="dsn",
    title="PostgreSQL",
)
