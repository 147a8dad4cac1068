"""The source's output columns: Spark's Kafka source columns plus the marker columns, as Spark's
``StructType`` (sent to the JVM as JSON: a DDL string would go through Spark's SQL parser, whose
first parse in a JVM holds a restarted driver's ``load()``) and as the Arrow schema ``read()``
must match exactly.

pyarrow is imported only for the Arrow schema: the processes that need Spark's schema alone
(~0.2 s saved) are on the way of every query's (re)start.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

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


def spark_schema(include_headers: bool) -> StructType:
    """The source's columns as Spark's schema, each nullable (as :func:`arrow_schema`'s)."""
    columns: list[tuple[str, DataType]] = [
        ("key", BinaryType()), ("value", BinaryType()), ("topic", StringType()),
        ("partition", IntegerType()), ("offset", LongType()), ("timestamp", TimestampType()),
        ("timestampType", IntegerType()),
    ]
    if include_headers:
        columns.append(("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", BinaryType())]))))
    columns += [("eventTime", TimestampType()), ("kind", StringType()),
                ("watermark", LongType()), ("status", StringType())]
    return StructType([StructField(name, data_type) for name, data_type in columns])
