"""``format("flinkish")``: one Spark data source name for both the Kafka source and the
two-phase-commit sink, so a pipeline reads and writes with the same word."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.types import StructType

from flinkish_source.options import parse_options
from flinkish_source.schema import spark_schema


class FlinkishDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "flinkish"

    def schema(self) -> StructType:
        # Parsing here makes a wrong option fail at load(), before any query starts.
        return spark_schema(parse_options(self.options).include_headers)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from flinkish_source.stream_reader import FlinkishStreamReader

        return FlinkishStreamReader(parse_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from flinkish_sink.stream_writer import FlinkishStreamWriter

        return FlinkishStreamWriter(schema, dict(self.options))
