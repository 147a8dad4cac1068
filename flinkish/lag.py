"""How far a flinkish query is behind, from its progress reports: Spark's Kafka source's names
for offsets (``min/max/avgOffsetsBehindLatest``), Flink's for time (``watermarkLag``,
``sourceIdleTime``). Python sources cannot add custom metrics to Spark's progress, so
:func:`log_lag` logs them (docs/guides/monitor-lag.md).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from flinkish_core.watermark import MAX_WATERMARK, MIN_WATERMARK

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceLag:
    """One flinkish source of one micro-batch."""

    batch_id: int
    offsets_behind_latest: dict[str, int]  # "topic/partition" -> records not planned yet
    min_offsets_behind_latest: int
    max_offsets_behind_latest: int
    avg_offsets_behind_latest: float
    watermark_lag_ms: int | None  # now - combined watermark (None: none yet, or ended)
    partition_watermark_lag_ms: dict[str, int] = field(default_factory=dict)
    idle_ms: dict[str, int] = field(default_factory=dict)  # IDLE partitions: now - last record

    def describe(self) -> str:
        lag = "-" if self.watermark_lag_ms is None else f"{self.watermark_lag_ms} ms"
        idle = ", ".join(f"{tp} {ms} ms" for tp, ms in sorted(self.idle_ms.items())) or "none"
        return (f"offsets behind latest min {self.min_offsets_behind_latest} max "
                f"{self.max_offsets_behind_latest} avg {self.avg_offsets_behind_latest:.1f}; "
                f"watermark lag {lag}; idle: {idle}")


def _source_lag(batch_id: int, behind: dict[str, int], watermark_lag_ms: int | None,
                partition_watermark_lag_ms: dict[str, int], idle_ms: dict[str, int]
                ) -> SourceLag:
    values = list(behind.values()) or [0]
    return SourceLag(batch_id, behind, min(values), max(values), sum(values) / len(values),
                     watermark_lag_ms, partition_watermark_lag_ms, idle_ms)


def json_value(value: Any) -> Any:
    """A progress report's offset: JSON text parsed (None when it is not JSON), else as is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _lag(now_ms: int, watermark: Any) -> int | None:
    if watermark is None or int(watermark) in (MIN_WATERMARK, MAX_WATERMARK):
        return None
    return now_ms - int(watermark)


def _flinkish_sources(progress: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Any]]:
    """The flinkish sources of one progress report, each with its end offset (parsed)."""
    out = []
    for source in progress.get("sources") or []:
        end = json_value(source.get("endOffset"))
        if isinstance(end, Mapping) and isinstance(end.get("topics"), Mapping):
            out.append((source, end))
    return out


def end_offsets(progress: Mapping[str, Any]) -> list[Any]:
    """The end offset of every flinkish source in one progress report (its JSON dict)."""
    return [end for _, end in _flinkish_sources(progress)]


def source_lags(progress: Mapping[str, Any], now_ms: int | None = None) -> list[SourceLag]:
    """The lag figures of every flinkish source in one progress report.

    Args:
        progress: a ``StreamingQueryProgress`` as its JSON dict
            (``json.loads(query.lastProgress.json)`` or a listener event's).
        now_ms: the time the lag in event time is measured at (default: the report's own
            timestamp).

    Returns:
        One :class:`SourceLag` per flinkish source of the query, in the report's order.
    """
    if now_ms is None:
        stamp = progress.get("timestamp")
        now_ms = int(time.time() * 1000) if stamp is None else timestamp_ms(str(stamp))
    out = []
    for source, end in _flinkish_sources(progress):
        latest = json_value(source.get("latestOffset"))
        behind: dict[str, int] = {}
        watermarks: dict[str, int] = {}
        idle: dict[str, int] = {}
        for topic, parts in end["topics"].items():
            for part, pos in parts.items():
                name = f"{topic}/{part}"
                if isinstance(latest, Mapping) and str(part) in (latest.get(topic) or {}):
                    behind[name] = max(0, int(latest[topic][str(part)]) - int(pos["offset"]))
                elif "seen" in pos:  # the journaled offset's own view of Kafka at planning
                    behind[name] = max(0, int(pos["seen"]) - int(pos["offset"]))
                lag = _lag(now_ms, (pos.get("base") or {}).get("wm"))
                if lag is not None:
                    watermarks[name] = lag
                if pos.get("status") == "IDLE":
                    idle[name] = max(0, now_ms - int(pos["progressAt"]))
        valve: Mapping[str, Any] = end["valve"] if isinstance(end.get("valve"), Mapping) else {}
        out.append(_source_lag(int(progress.get("batchId", -1)), behind,
                               _lag(now_ms, valve.get("watermark")), watermarks, idle))
    return out


def combined(lags: list[SourceLag]) -> SourceLag | None:
    """Several flinkish sources of one batch (a union, a join) as one: every partition, the
    largest watermark lag."""
    if not lags:
        return None
    watermark_lags = [lag.watermark_lag_ms for lag in lags if lag.watermark_lag_ms is not None]
    return _source_lag(
        lags[0].batch_id, {k: v for lag in lags for k, v in lag.offsets_behind_latest.items()},
        max(watermark_lags) if watermark_lags else None,
        {k: v for lag in lags for k, v in lag.partition_watermark_lag_ms.items()},
        {k: v for lag in lags for k, v in lag.idle_ms.items()})


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def timestamp_ms(text: str) -> int:
    """A progress report's ISO time as epoch milliseconds, exactly (a float's would not be)."""
    return (datetime.fromisoformat(text.replace("Z", "+00:00")) - EPOCH) // timedelta(
        milliseconds=1)


def log_lag(spark: Any, level: int = logging.INFO) -> Any:
    """Log every flinkish source's lag figures after each micro-batch of every query of
    ``spark`` (logger ``flinkish.lag``).

    Args:
        spark: the driver's ``SparkSession``.
        level: the log level of the lines.

    Returns:
        The listener it added (``spark.streams.removeListener`` takes it off).
    """
    from flinkish.listeners import progress_listener

    def log(progress: dict[str, Any]) -> None:
        for lag in source_lags(progress):
            logger.log(level, "query %s batch %s: %s", progress.get("name") or progress.get("id"),
                       lag.batch_id, lag.describe())

    listener = progress_listener(log)
    spark.streams.addListener(listener)
    return listener
