"""Arrow -> PostgreSQL type mapping and binary COPY encoding, without a server.

The encoding is checked byte for byte against psycopg's own binary dumpers, so a mistake in
the vectorised encoder (endianness, epochs, NULL markers) shows up here, not as corrupt rows.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import pq
from psycopg.adapt import PyFormat

from flinkish_sink.postgres_target import (
    copy_order,
    encode_rows,
    is_window,
    postgres_type,
    postgres_types,
    table_batch,
    table_schema,
)

UTC = timezone.utc


@pytest.mark.parametrize(
    ("arrow", "ddl", "accepts"),
    [
        (pa.int8(), "smallint", {"int2"}),
        (pa.int16(), "smallint", {"int2"}),
        (pa.int32(), "integer", {"int4"}),
        (pa.int64(), "bigint", {"int8"}),
        (pa.float32(), "real", {"float4"}),
        (pa.float64(), "double precision", {"float8"}),
        (pa.bool_(), "boolean", {"bool"}),
        (pa.string(), "text", {"text", "varchar", "bpchar"}),
        (pa.large_string(), "text", {"text", "varchar", "bpchar"}),
        (pa.binary(), "bytea", {"bytea"}),
        (pa.large_binary(), "bytea", {"bytea"}),
        (pa.timestamp("s"), "timestamptz", {"timestamptz", "timestamp"}),
        (pa.timestamp("ms", tz="UTC"), "timestamptz", {"timestamptz", "timestamp"}),
        (pa.timestamp("us", tz="Europe/Paris"), "timestamptz", {"timestamptz", "timestamp"}),
        (pa.timestamp("ns"), "timestamptz", {"timestamptz", "timestamp"}),
        (pa.date32(), "date", {"date"}),
        (pa.decimal128(10, 2), "numeric(10, 2)", {"numeric"}),
        (pa.decimal256(40, 0), "numeric(40, 0)", {"numeric"}),
        (pa.list_(pa.int64()), "jsonb", {"jsonb"}),
        (pa.large_list(pa.string()), "jsonb", {"jsonb"}),
        (pa.list_(pa.int32(), 2), "jsonb", {"jsonb"}),
        (pa.struct([("a", pa.int64())]), "jsonb", {"jsonb"}),
        (pa.map_(pa.string(), pa.int64()), "jsonb", {"jsonb"}),
    ],
)
def test_mapping(arrow: pa.DataType, ddl: str, accepts: set[str]) -> None:
    kind = postgres_type(arrow, "c")
    assert kind.ddl == ddl
    assert kind.accepts == accepts


@pytest.mark.parametrize(
    "arrow",
    [
        pa.uint64(),
        pa.uint8(),
        pa.float16(),
        pa.time64("us"),
        pa.duration("s"),
        pa.null(),
        pa.date64(),
        pa.dictionary(pa.int32(), pa.string()),
    ],
)
def test_unsupported_type_names_the_column(arrow: pa.DataType) -> None:
    with pytest.raises(ValueError, match=r"unsupported type for column 'odd'"):
        postgres_types(pa.schema([("fine", pa.int64()), ("odd", arrow)]))


def _dumper(typname: str) -> Any:
    if typname == "bytea":  # by oid psycopg picks its DB-API Binary wrapper dumper
        return psycopg.adapters.get_dumper(bytes, PyFormat.BINARY)(bytes)
    oid = psycopg.adapters.types[typname].oid
    return psycopg.adapters.get_dumper_by_oid(oid, pq.Format.BINARY)(object)


def _reference_rows(batch: pa.RecordBatch, typnames: list[str]) -> bytes:
    """The same rows through psycopg's per-value binary dumpers."""
    dumpers = [_dumper(name) for name in typnames]
    out = bytearray()
    for row in zip(*(column.to_pylist() for column in batch.columns), strict=True):
        out += len(row).to_bytes(2, "big")
        for value, dumper in zip(row, dumpers, strict=True):
            if value is None:
                out += (-1).to_bytes(4, "big", signed=True)
            else:
                data = bytes(dumper.dump(value))
                out += len(data).to_bytes(4, "big") + data
    return bytes(out)


def test_encoding_matches_psycopg_dumpers() -> None:
    columns: dict[str, tuple[pa.Array, str]] = {
        "i8": (pa.array([-128, None, 127], pa.int8()), "int2"),
        "i16": (pa.array([-32768, 0, None], pa.int16()), "int2"),
        "i32": (pa.array([None, -(2**31), 2**31 - 1], pa.int32()), "int4"),
        "i64": (pa.array([-(2**63), 2**63 - 1, None], pa.int64()), "int8"),
        "f32": (pa.array([1.5, None, -3.25e38], pa.float32()), "float4"),
        "f64": (pa.array([float("-inf"), 0.1, None], pa.float64()), "float8"),
        "b": (pa.array([True, False, None]), "bool"),
        "s": (pa.array(["", None, "héllo ✓"]), "text"),
        "ls": (pa.array(["x", "yz", None], pa.large_string()), "text"),
        "bin": (pa.array([b"\x00\xff", None, b""]), "bytea"),
        "ts": (
            pa.array(
                [
                    datetime(1999, 12, 31, 23, 59, 59, 999999, UTC),
                    None,
                    datetime(2024, 2, 29, 12, 0, tzinfo=UTC),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "timestamptz",
        ),
        "ts_ms": (
            pa.array([0, 1_700_000_000_123, None], pa.timestamp("ms", tz="UTC")),
            "timestamptz",
        ),
        "ts_s": (pa.array([None, -86_400, 1], pa.timestamp("s", tz="UTC")), "timestamptz"),
        "d": (pa.array([date(1970, 1, 1), date(2000, 1, 2), None]), "date"),
        "dec": (
            pa.array([Decimal("-12.34"), None, Decimal("99999999.99")], pa.decimal128(10, 2)),
            "numeric",
        ),
    }
    batch = pa.record_batch({name: array for name, (array, _) in columns.items()})
    encoded = encode_rows(batch, postgres_types(batch.schema))
    assert bytes(encoded) == _reference_rows(batch, [typname for _, typname in columns.values()])


def test_nanoseconds_are_floored_to_microseconds() -> None:
    batch = pa.record_batch({"t": pa.array([1_999, -1], pa.timestamp("ns"))})
    encoded = bytes(encode_rows(batch, postgres_types(batch.schema)))
    pg_epoch_us = 946_684_800_000_000
    first = int.from_bytes(encoded[6:14], "big", signed=True)
    second = int.from_bytes(encoded[20:28], "big", signed=True)
    assert (first, second) == (1 - pg_epoch_us, -1 - pg_epoch_us)


def test_jsonb_is_version_byte_then_json() -> None:
    struct = pa.struct([("a", pa.int64()), ("when", pa.date32())])
    batch = pa.record_batch(
        {
            "l": pa.array([[1, 2], None], pa.list_(pa.int64())),
            "s": pa.array([{"a": 1, "when": date(2024, 1, 2)}, {"a": None, "when": None}], struct),
        }
    )
    encoded = bytes(encode_rows(batch, postgres_types(batch.schema)))
    row_one, row_two = [], []
    position = 0
    for row in (row_one, row_two):
        assert encoded[position : position + 2] == b"\x00\x02"
        position += 2
        for _ in range(2):
            length = int.from_bytes(encoded[position : position + 4], "big", signed=True)
            position += 4
            if length < 0:
                row.append(None)
                continue
            assert encoded[position] == 1
            row.append(json.loads(encoded[position + 1 : position + length]))
            position += length
    assert position == len(encoded)
    assert row_one == [[1, 2], {"a": 1, "when": "2024-01-02"}]
    assert row_two == [None, {"a": None, "when": None}]


def test_sliced_batches_encode_only_their_rows() -> None:
    batch = pa.record_batch({"s": pa.array(["a", "bb", "ccc", None]), "n": [1, 2, 3, 4]})
    part = batch.slice(1, 2)
    encoded = encode_rows(part, postgres_types(part.schema))
    assert bytes(encoded) == _reference_rows(part, ["text", "int8"])


def test_fixed_width_columns_without_nulls_are_packed_first_and_encode_the_same() -> None:
    """The COPY order puts fixed-width columns without NULLs first (one packed piece per row);
    whatever the order and wherever the NULLs, the rows are psycopg's."""
    columns: dict[str, tuple[pa.Array, str]] = {
        "s": (pa.array(["a", None, "ccc", ""]), "text"),
        "i": (pa.array([1, 2, 3, 4], pa.int32()), "int4"),
        "bin": (pa.array([b"x", b"", b"\x00", b"yy"]), "bytea"),
        "n": (pa.array([None, 5, None, 7], pa.int64()), "int8"),
        "t": (pa.array([0, 1, -1, 2**40], pa.timestamp("us", tz="UTC")), "timestamptz"),
        "f": (pa.array([0.5, -1.0, 2.0, 3.0], pa.float64()), "float8"),
    }
    batch = pa.record_batch({name: array for name, (array, _) in columns.items()})
    typnames = [typname for _, typname in columns.values()]
    types = postgres_types(batch.schema)
    order = copy_order(batch, types)
    assert [batch.schema.names[i] for i in order] == ["i", "t", "f", "s", "bin", "n"]
    for part in (batch, batch.slice(1, 3)):
        for chosen in (list(range(len(typnames))), order):
            encoded = encode_rows(part.select(chosen), [types[i] for i in chosen])
            assert bytes(encoded) == _reference_rows(part.select(chosen),
                                                     [typnames[i] for i in chosen])


WINDOW = pa.struct([("start", pa.timestamp("us", tz="UTC")), ("end", pa.timestamp("us", tz="UTC"))])


def test_a_window_struct_becomes_two_timestamptz_columns() -> None:
    t0, t1 = datetime(2024, 1, 1, 12, 0, tzinfo=UTC), datetime(2024, 1, 1, 12, 1, tzinfo=UTC)
    windows = pa.array([{"start": t0, "end": t1}, None], WINDOW)
    batch = pa.record_batch([windows, pa.array([3, 4], pa.int64())], names=["window", "count"])
    split = table_batch(batch)
    assert split.schema.names == ["window_start", "window_end", "count"]
    assert [t.ddl for t in postgres_types(split.schema)] == ["timestamptz", "timestamptz",
                                                             "bigint"]
    assert split.column("window_start").to_pylist() == [t0, None]  # a NULL window: NULL bounds
    assert split.column("window_end").to_pylist() == [t1, None]


@pytest.mark.parametrize("dtype", [
    pa.struct([("start", pa.timestamp("us")), ("stop", pa.timestamp("us"))]),
    pa.struct([("start", pa.int64()), ("end", pa.int64())]),
    pa.struct([("start", pa.timestamp("us")), ("end", pa.timestamp("us")), ("n", pa.int8())]),
])
def test_other_structs_stay_jsonb(dtype: pa.DataType) -> None:
    assert not is_window(dtype)
    schema = pa.schema([("s", dtype)])
    assert table_schema(schema) == schema
    assert postgres_type(dtype, "s").ddl == "jsonb"


def test_a_split_window_clashing_with_a_column_names_both() -> None:
    schema = pa.schema([("w", WINDOW), ("w_end", pa.int64())])
    with pytest.raises(ValueError, match="'w'.*w_start and w_end.*'w_end' too"):
        table_schema(schema)
