"""flinkish: Flink's per-partition watermarks, idleness, StatusWatermarkValve and
two-phase-commit sinks for Spark Structured Streaming: ``format("flinkish")`` reads Kafka and
writes exactly once; :func:`with_watermark`, :class:`ValveForEachBatch` and
:mod:`flinkish.windows` run on the valve's combined watermark; call :func:`register` once per
driver first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkpointing import CorruptRecordError, FencedError
    from flinkish import windows
    from flinkish.batch_errors import stoppable
    from flinkish.foreach_batch import ValveForEachBatch, WatermarkedBatch
    from flinkish.lag import log_lag, source_lags
    from flinkish.parquet_reader import parquet_files
    from flinkish.session import register
    from flinkish.spark_watermark import with_watermark
    from flinkish_core.errors import OptionError, WorkerEnvironmentError
    from flinkish_source.kafka import DataLossError

#: Where each public name lives. They are imported on first use (PEP 562): Spark starts a fresh
#: Python process for every streaming query's source and imports ``flinkish.data_source`` there,
#: and eager imports of the whole API (pandas, pyarrow.fs, the sink) cost it ~0.2 s per query.
_PUBLIC = {
    "CorruptRecordError": "checkpointing",
    "DataLossError": "flinkish_source.kafka",
    "FencedError": "checkpointing",
    "OptionError": "flinkish_core.errors",
    "ValveForEachBatch": "flinkish.foreach_batch",
    "WatermarkedBatch": "flinkish.foreach_batch",
    "WorkerEnvironmentError": "flinkish_core.errors",
    "log_lag": "flinkish.lag",
    "parquet_files": "flinkish.parquet_reader",
    "register": "flinkish.session",
    "source_lags": "flinkish.lag",
    "stoppable": "flinkish.batch_errors",
    "windows": "flinkish.windows",
    "with_watermark": "flinkish.spark_watermark",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    imported = importlib.import_module(module)
    value = imported if module == f"{__name__}.{name}" else getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = [
    "CorruptRecordError",
    "DataLossError",
    "FencedError",
    "OptionError",
    "ValveForEachBatch",
    "WatermarkedBatch",
    "WorkerEnvironmentError",
    "log_lag",
    "parquet_files",
    "register",
    "source_lags",
    "stoppable",
    "windows",
    "with_watermark",
]
