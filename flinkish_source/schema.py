"""The source's output columns: Spark's Kafka source columns plus the marker columns.

Kept in one place as both a Spark DDL string (what ``DataSource.schema`` returns) and the Arrow
schema ``read()`` must match exactly (int32 vs int64, ``binary`` not ``large_binary``).

pyarrow is imported only for the Arrow schema: Spark's discovery of installed data sources and
its ``create_data_source`` process import this module for the DDL alone, both on the way of a
query's (re)start, and pyarrow with numpy costs each ~0.2 s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


@functools.cache
def arrow_schema(include_headers: bool) -> pa.Schema:
    import pyarrow as pa

    timestamp = pa.timestamp("us", tz="UTC")
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", timestamp),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(
            pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
        )))
    fields += [
        pa.field("eventTime", timestamp),
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
