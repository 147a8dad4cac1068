"""flinkish: Flink's per-partition watermarks, idleness, StatusWatermarkValve and
two-phase-commit sinks for Spark Structured Streaming."""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register ``format("flinkish")`` on a session (needed only where Spark's automatic
    discovery of ``pyspark_*`` modules is off or the package is not installed)."""
    from flinkish_source.data_source import FlinkishDataSource

    spark.dataSource.register(FlinkishDataSource)


__all__ = ["register"]
