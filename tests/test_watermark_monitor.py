"""The safety net under ``with_watermark``: when does the monitor raise its ERROR, and when not."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from flinkish.watermark_monitor import STALLED_BATCHES, WatermarkMonitor, metrics_name
from flinkish_core.watermark import LAST_CARRIER_MS, MAX_WATERMARK, MIN_WATERMARK

HOUR = 3_600_000
BASE = 1_700_000_000_000


def iso(ms: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def progress(spark: int | None, journaled: list[int] | None, *, metrics: list[str] | None = None,
             run: str = "run-1", batch: int = 0) -> dict[str, Any]:
    """A StreamingQueryProgress as its JSON dict: Spark's watermark, one flinkish source per
    journaled combined watermark (plus a source of another kind), with_watermark's metrics."""
    sources: list[dict[str, Any]] = [{"description": "rate", "endOffset": "17"}]
    for value in journaled or []:
        offset = {"version": 1, "topics": {}, "valve": {"watermark": value, "status": "ACTIVE"}}
        sources.append({"description": "PythonMicroBatchStream", "endOffset": json.dumps(offset)})
    names = [metrics_name(24 * HOUR)] if metrics is None else metrics
    return {
        "id": "query-1", "runId": run, "name": "counts", "batchId": batch,
        "eventTime": {} if spark is None else {"watermark": iso(spark)},
        "observedMetrics": {name: {"watermark": None} for name in names},
        "sources": sources,
    }


def feed(monitor: WatermarkMonitor, reports: list[dict[str, Any]]) -> list[str | None]:
    return [monitor.on_progress(r) for r in reports]


def test_a_query_on_the_combined_watermark_is_never_reported() -> None:
    # Spark's watermark in batch N is the combined watermark journaled in batch N's own offset
    reports = [progress(BASE + i * 1000, [BASE + i * 1000]) for i in range(20)]
    assert feed(WatermarkMonitor(), reports) == [None] * 20


def test_a_query_a_day_behind_is_reported_once_after_the_stalled_batches() -> None:
    reports = [progress(BASE + i * 1000 - 24 * HOUR, [BASE + i * 1000]) for i in range(10)]
    found = feed(WatermarkMonitor(), reports)
    # the first report only sets what is expected; then STALLED_BATCHES behind in a row
    assert [i for i, m in enumerate(found) if m] == [STALLED_BATCHES]
    message = found[STALLED_BATCHES]
    assert message is not None
    assert "counts" in message and "before flinkish.with_watermark" in message
    assert "multipleWatermarkPolicy" in message and iso(BASE + 2000)[:19] in message


def test_recovery_rearms_the_report() -> None:
    behind = [progress(BASE - 24 * HOUR, [BASE]) for _ in range(STALLED_BATCHES + 1)]
    caught_up = [progress(BASE, [BASE])]
    found = feed(WatermarkMonitor(), behind + caught_up + behind)
    assert sum(1 for m in found if m) == 2


def test_one_or_two_batches_behind_are_the_normal_trail() -> None:
    reports = [progress(BASE, [BASE])]
    for _ in range(4):
        reports += [progress(BASE - 1, [BASE])] * (STALLED_BATCHES - 1) + [progress(BASE, [BASE])]
    assert feed(WatermarkMonitor(), reports) == [None] * len(reports)


def test_the_slowest_of_several_flinkish_sources_is_what_spark_may_show() -> None:
    reports = [progress(BASE, [BASE, BASE + HOUR]) for _ in range(10)]
    assert feed(WatermarkMonitor(), reports) == [None] * 10


@pytest.mark.parametrize("journaled", [[MIN_WATERMARK], [BASE, MIN_WATERMARK], None])
def test_no_expectation_without_a_combined_watermark(journaled: list[int] | None) -> None:
    reports = [progress(0, journaled) for _ in range(10)]
    assert feed(WatermarkMonitor(), reports) == [None] * 10


def test_queries_without_with_watermark_are_not_watched() -> None:
    reports = [progress(0, [BASE], metrics=["my_metric"]) for _ in range(10)]
    assert feed(WatermarkMonitor(), reports) == [None] * 10


def test_max_watermark_expects_the_clamped_carrier() -> None:
    # every partition ended: the carrier's event time clamps at 9999-12-31, Spark's watermark
    # at that minus the horizon
    clamped = LAST_CARRIER_MS - 24 * HOUR
    reports = [progress(clamped, [MAX_WATERMARK]) for _ in range(10)]
    assert feed(WatermarkMonitor(), reports) == [None] * 10


def test_runs_are_watched_separately_and_forgotten() -> None:
    monitor = WatermarkMonitor()
    for _ in range(STALLED_BATCHES):
        assert monitor.on_progress(progress(BASE - HOUR, [BASE], run="a")) is None
        assert monitor.on_progress(progress(BASE, [BASE], run="b")) is None
    monitor.forget("a")
    # a forgotten run starts over: no expectation yet
    assert monitor.on_progress(progress(BASE - HOUR, [BASE], run="a")) is None
    assert monitor.on_progress(progress(BASE - HOUR, [BASE], run="b")) is None
