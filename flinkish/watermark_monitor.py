"""The safety net under :func:`flinkish.with_watermark`: an ERROR when Spark's watermark stays
behind the combined watermark, as when a filter before ``with_watermark`` removed the carrier
row or another watermarked stream holds Spark's global watermark back: windows, joins and timers
would otherwise wait silently, up to ``watermark.horizon`` (docs/semantics.md).

A listener compares Spark's watermark of each batch of a query using ``with_watermark`` (its
observed metrics say so) with the combined watermark its flinkish sources journaled a batch
earlier, at least two batches old: a working query never falls behind it.
"""

from __future__ import annotations

import logging
import re
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from flinkish.lag import EPOCH, json_value, timestamp_ms
from flinkish_core.watermark import LAST_CARRIER_MS, MIN_WATERMARK

logger = logging.getLogger(__name__)

#: The observed metrics ``with_watermark`` adds start with this; the horizon follows.
METRICS_PREFIX = "flinkish_with_watermark"
_METRICS_NAME = re.compile(rf"^{METRICS_PREFIX}_h(\d+)_[0-9a-f]+$")

#: Consecutive micro-batches behind before the ERROR: one is the normal one-batch trail.
STALLED_BATCHES = 3


def metrics_name(horizon_ms: int) -> str:
    """A name for one ``with_watermark`` call's observed metrics: unique in the session (Spark
    refuses two observations of one name in a query, and a query may union or join two
    ``with_watermark`` streams) and carrying the horizon the monitor needs."""
    return f"{METRICS_PREFIX}_h{horizon_ms}_{uuid.uuid4().hex[:12]}"


def _iso(ms: int) -> str:
    return (EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")


def _journaled_watermark(sources: list[Mapping[str, Any]]) -> int | None:
    """The smallest combined watermark among the query's flinkish sources (None when one has
    none yet); flinkish offsets are the ones with a journaled valve."""
    found: list[int] = []
    for source in sources:
        offset = json_value(source.get("endOffset"))
        if isinstance(offset, Mapping) and isinstance(offset.get("valve"), Mapping):
            found.append(int(offset["valve"]["watermark"]))
    if not found or MIN_WATERMARK in found:
        return None
    return min(found)


@dataclass
class _Query:
    expected: int | None = None
    behind: int = 0
    reported: bool = False


class WatermarkMonitor:
    """The listener's logic, a pure function of the progress reports it is fed."""

    def __init__(self) -> None:
        self._queries: dict[str, _Query] = {}

    def on_progress(self, progress: Mapping[str, Any]) -> str | None:
        """Feed one ``StreamingQueryProgress`` (as its JSON dict); the ERROR message when the
        query has just been behind for :data:`STALLED_BATCHES` batches in a row."""
        observed = progress.get("observedMetrics") or {}
        horizons = [int(m.group(1)) for m in map(_METRICS_NAME.match, observed) if m]
        if not horizons:
            return None
        query = self._queries.setdefault(str(progress.get("runId")), _Query())
        expected = query.expected
        journaled = _journaled_watermark(progress.get("sources") or [])
        # the carrier's event time clamps at 9999-12-31, Spark's watermark with it
        query.expected = None if journaled is None else min(
            journaled, LAST_CARRIER_MS - max(horizons))
        text = (progress.get("eventTime") or {}).get("watermark")
        if expected is None or text is None:
            return None
        spark = timestamp_ms(text)
        if spark >= expected:
            query.behind, query.reported = 0, False
            return None
        query.behind += 1
        if query.behind < STALLED_BATCHES or query.reported:
            return None
        query.reported = True
        name = progress.get("name") or progress.get("id")
        return (
            f"flinkish: Spark's event-time watermark in query {name} ({_iso(spark)}) has "
            f"stayed behind the combined watermark of its flinkish source ({_iso(expected)}) "
            f"for {query.behind} micro-batches: its windows, deduplication, joins and timers "
            f"wait (up to watermark.horizon, {max(horizons)} ms) and nothing says so. Likely "
            "causes: (1) a filter, join, dropna or select was applied to the source's "
            "DataFrame before flinkish.with_watermark and removed the carrier row: call "
            "with_watermark directly on spark.readStream.format('flinkish')...load() and "
            "transform its result instead; (2) the query also reads another stream with its "
            "own withWatermark, and Spark's global watermark is the minimum of both "
            "(spark.sql.streaming.multipleWatermarkPolicy): give every stream flinkish's "
            "watermark, or accept the slower one.")

    def forget(self, run_id: str) -> None:
        self._queries.pop(run_id, None)


_installed: weakref.WeakSet[Any] = weakref.WeakSet()


def install(spark: Any) -> None:
    """Add the monitor's listener to ``spark`` once (``with_watermark`` calls this)."""
    from flinkish.listeners import progress_listener

    if spark in _installed:
        return
    monitor = WatermarkMonitor()

    def log(progress: dict[str, Any]) -> None:
        message = monitor.on_progress(progress)
        if message is not None:
            logger.error(message)

    spark.streams.addListener(progress_listener(log, monitor.forget))
    _installed.add(spark)
