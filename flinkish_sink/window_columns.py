"""Spark time windows as two columns ``w_start`` and ``w_end`` in every table target: tables
are queried, partitioned and indexed by a window's bounds, which a nested value would hide."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

#: The fields of a Spark time window (``window``, ``session_window``).
WINDOW_FIELDS = ("start", "end")


def is_window(dtype: pa.DataType) -> bool:
    """Whether ``dtype`` is a Spark time window's struct<start, end> of timestamps."""
    return (pa.types.is_struct(dtype)
            and [dtype.field(i).name for i in range(dtype.num_fields)] == list(WINDOW_FIELDS)
            and all(pa.types.is_timestamp(dtype.field(i).type)
                    for i in range(dtype.num_fields)))


def table_schema(schema: pa.Schema) -> pa.Schema:
    """The table's columns for a stream's ``schema``, windows split; ValueError if a split
    column's name is taken."""
    fields: list[pa.Field] = []
    for field in schema:
        if not is_window(field.type):
            fields.append(field)
            continue
        for part in WINDOW_FIELDS:
            name = f"{field.name}_{part}"
            if name in schema.names:
                raise ValueError(
                    f"column {field.name!r} (a window) is stored as {field.name}_start and "
                    f"{field.name}_end, but the stream has a column {name!r} too: rename one "
                    "of them before the sink")
            fields.append(pa.field(name, field.type.field(part).type))
    return pa.schema(fields)


def check_columns(option: str, names: Iterable[str], columns: pa.Schema) -> None:
    """Raise unless ``names``, given by ``option``, are columns of the stream's rows."""
    missing = [name for name in names if name not in columns.names]
    if missing:
        raise ValueError(
            f"option {option}: {', '.join(map(repr, missing))} "
            f"{'is not a column' if len(missing) == 1 else 'are not columns'} of the stream's "
            f"rows (their columns: {columns.names}; a window w is w_start and w_end)")


def table_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` in the columns of :func:`table_schema` (windows split into their bounds)."""
    windows = [f.name for f in batch.schema if is_window(f.type)]
    if not windows:
        return batch
    columns = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if field.name in windows:
            # a NULL window has NULL bounds (a struct's children ignore the parent's validity)
            columns += [pc.if_else(column.is_valid(), pc.struct_field(column, part), None)
                        for part in WINDOW_FIELDS]
        else:
            columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=table_schema(batch.schema))
