"""The source's output columns: Spark's Kafka source columns plus the marker columns, as a Spark
DDL string and as the Arrow schema ``read()`` must match exactly.

pyarrow is imported only for the Arrow schema: the processes that need the DDL alone (~0.2 s
saved) are on the way of every query's (re)start.
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
