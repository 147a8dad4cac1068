"""The source's output columns: Spark's Kafka source columns plus the marker columns.

Kept in one place as both a Spark DDL string (what ``DataSource.schema`` returns) and the Arrow
schema ``read()`` must match exactly (int32 vs int64, ``binary`` not ``large_binary``).
"""

from __future__ import annotations

import pyarrow as pa

_HEADERS = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)
_TIMESTAMP = pa.timestamp("us", tz="UTC")


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", _TIMESTAMP),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADERS))
    fields += [
        pa.field("eventTime", _TIMESTAMP),
        pa.field("kind", pa.string()),
        pa.field("watermark", pa.int64()),
        pa.field("status", pa.string()),
    ]
    return pa.schema(fields)


def spark_ddl(include_headers: bool) -> str:
    headers = "headers array<struct<key: string, value: binary>>, " if include_headers else ""
    return (
        "key binary, value binary, topic string, partition int, offset bigint, "
        "timestamp timestamp, timestampType int, "
        + headers
        + "eventTime timestamp, kind string, watermark bigint, status string"
    )
