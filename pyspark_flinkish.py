"""Spark imports every top-level ``pyspark_*`` module and registers its ``DefaultSource``, so
installing flinkish makes ``format("flinkish")`` work with no ``register`` call."""

from flinkish.data_source import FlinkishDataSource as DefaultSource

__all__ = ["DefaultSource"]
