"""flinkish: Flink's per-partition watermarks, idleness, StatusWatermarkValve and
two-phase-commit sinks for Spark Structured Streaming.

- ``spark.readStream.format("flinkish")``: the Kafka source (records plus per-partition
  watermark and status markers, and a carrier row per batch);
- :func:`with_watermark`: Spark's own stateful operators on the valve's combined watermark;
- ``df.writeStream.format("flinkish")``: the two-phase-commit sink (PostgreSQL, Parquet);
- :class:`ValveForEachBatch`: the valve for any other sink;
- :mod:`flinkish.windows`: Flink's window operator (triggers, lateness, late output, panes);
- :func:`register`: call once per driver before starting flinkish queries.
"""

from __future__ import annotations

from checkpointing import CorruptRecordError, FencedError
from flinkish import windows
from flinkish.foreach_batch import ValveForEachBatch, WatermarkedBatch
from flinkish.lag import log_lag, source_lags
from flinkish.session import register
from flinkish.spark_watermark import with_watermark
from flinkish_core.errors import OptionError, WorkerEnvironmentError
from flinkish_source.kafka import DataLossError

__all__ = [
    "CorruptRecordError",
    "DataLossError",
    "FencedError",
    "OptionError",
    "ValveForEachBatch",
    "WatermarkedBatch",
    "WorkerEnvironmentError",
    "log_lag",
    "register",
    "source_lags",
    "windows",
    "with_watermark",
]
