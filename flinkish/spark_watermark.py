"""``flinkish.with_watermark``: Spark's own event-time operators on the valve's combined watermark.

The source's carrier row, whose event time is the combined watermark W plus the horizon H, makes
Spark's watermark under ``withWatermark(eventTime, H)`` max(W, newest record - H): W while no
record is more than H ahead. An observation above the watermark node keeps the optimizer from
pushing any later filter below it, where it would drop the carrier. docs/semantics.md, "Spark's
own operators on the combined watermark", has the whole design.
"""

from __future__ import annotations

from typing import Any

from flinkish_core.durations import parse_duration_ms
from flinkish_core.errors import OptionError
from flinkish_core.markers import KIND_CARRIER, KIND_RECORD, MARKER_COLUMNS
from flinkish_core.watermark import DEFAULT_HORIZON_MS, LAST_CARRIER_MS, SPARK_DELAY_KEY

_SOURCE_COLUMNS = ("kind", "watermark", "eventTime")


def with_watermark(df: Any, event_time: str = "eventTime", horizon: str | None = None) -> Any:
    """The record rows of a flinkish source DataFrame, with Spark's event-time watermark on
    ``event_time`` equal to the valve's combined watermark (one micro-batch behind it).

    Args:
        df: the flinkish source's DataFrame, marker rows and columns still in it (row-wise
            transformations that keep them are fine).
        event_time: the timestamp column Spark's watermark goes on: the source's ``eventTime``
            or one derived from the record (the carrier's event time is put into it).
        horizon: the source's ``watermark.horizon`` (a duration such as ``'1d'``; None: the
            default, one day); a mismatch fails the query at its first carrier row. It is the
            delay Spark sees, so it must exceed the largest skew between partitions, and the
            window of ``dropDuplicatesWithinWatermark``.

    Returns:
        The DataFrame's record rows (marker rows and the carrier dropped), with Spark's
        watermark on ``event_time``, for Spark's stateful operators.

    Raises:
        OptionError: the marker columns are missing, ``event_time`` is not a timestamp
            column or already has a watermark, or ``horizon`` is not a positive duration.
    """
    from pyspark.sql import functions as F

    from flinkish.session import seed_runner_environment
    from flinkish.watermark_monitor import install as install_monitor
    from flinkish.watermark_monitor import metrics_name

    missing = [c for c in _SOURCE_COLUMNS if c not in df.columns]
    if missing:
        raise OptionError(
            f"with_watermark needs the flinkish source's columns {list(_SOURCE_COLUMNS)}; "
            f"{missing} are missing: apply it to the source's DataFrame before selecting, "
            "dropping or filtering its marker rows"
        )
    if event_time not in df.columns:
        raise OptionError(f"with_watermark: no column {event_time!r} (event_time)")
    field = df.schema[event_time]
    if field.dataType.typeName() not in ("timestamp", "timestamp_ntz"):
        raise OptionError(
            f"with_watermark: column {event_time!r} is {field.dataType.simpleString()}, not a "
            "timestamp; derive a timestamp column first (e.g. F.timestamp_millis(...))"
        )
    if SPARK_DELAY_KEY in (field.metadata or {}):
        raise OptionError(
            f"with_watermark: column {event_time!r} already has a watermark (withWatermark was "
            "called on this DataFrame); use with_watermark instead of withWatermark, not both"
        )
    horizon_ms = DEFAULT_HORIZON_MS if horizon is None else parse_duration_ms("horizon", horizon)
    if horizon_ms <= 0:
        raise OptionError("with_watermark: horizon must be a positive duration")

    seed_runner_environment(df.sparkSession)  # before the query starts, see flinkish.session
    install_monitor(df.sparkSession)
    kind, t = F.col("kind"), F.col(event_time)
    if event_time != "eventTime":
        df = df.withColumn(event_time, F.when(kind == KIND_CARRIER, F.col("eventTime"))
                           .otherwise(t))
    expected = F.timestamp_millis(
        F.least(F.col("watermark"), F.lit(LAST_CARRIER_MS - horizon_ms)) + F.lit(horizon_ms)
    )
    mismatch = (
        f"flinkish.with_watermark declares horizon={horizon_ms} ms but the source's carrier "
        "row says otherwise: set the source option watermark.horizon and with_watermark's "
        "horizon to the same duration"
    )
    # false for every other row, yet it references the event time (docs/semantics.md, 5.)
    keep_records = (
        F.when(kind == KIND_RECORD, F.lit(True))
        .when((kind == KIND_CARRIER) & (t != expected), F.raise_error(F.lit(mismatch)))
        .otherwise(F.isnull(t) & F.isnotnull(t))
    )
    return (
        df.withWatermark(event_time, f"{horizon_ms} milliseconds")
        .observe(metrics_name(horizon_ms),
                 F.max(F.when(kind == KIND_CARRIER, F.col("watermark"))).alias("watermark"))
        .filter(keep_records)
        .drop(*MARKER_COLUMNS)
    )
