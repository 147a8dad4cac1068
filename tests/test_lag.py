"""Lag figures from a query's progress report (``flinkish.lag``), with no Spark."""

from __future__ import annotations

import json
from typing import Any

from flinkish.lag import source_lags
from flinkish_core.watermark import MIN_WATERMARK

NOW = 1_700_000_100_000


def offset(**partitions: dict[str, Any]) -> str:
    topics: dict[str, dict[str, Any]] = {"t": {}}
    for name, pos in partitions.items():
        topics["t"][name.lstrip("p")] = {"first": 0, "progressAt": NOW - 1000, "seen": 0, **pos}
    return json.dumps({"version": 1, "topics": topics,
                       "valve": {"watermark": NOW - 65_000, "status": "ACTIVE"}})


def progress(end: str, latest: Any) -> dict[str, Any]:
    return {"batchId": 7, "timestamp": "2023-11-14T22:15:00.000Z",
            "sources": [{"description": "rate", "endOffset": "12", "latestOffset": "15"},
                        {"description": "flinkish", "endOffset": end, "latestOffset": latest}]}


def test_offsets_behind_latest_watermark_lag_and_idle_time() -> None:
    end = offset(p0={"offset": 40, "base": {"at": 30, "wm": NOW - 60_000}},
                 p1={"offset": 10, "status": "IDLE", "progressAt": NOW - 30_000,
                     "base": {"at": 10, "wm": MIN_WATERMARK}},
                 p2={"offset": 5, "status": "ACTIVE"})
    [lag] = source_lags(progress(end, {"t": {"0": 100, "1": 10, "2": 8}}), now_ms=NOW)
    assert lag.batch_id == 7
    assert lag.offsets_behind_latest == {"t/0": 60, "t/1": 0, "t/2": 3}
    assert (lag.min_offsets_behind_latest, lag.max_offsets_behind_latest) == (0, 60)
    assert lag.avg_offsets_behind_latest == 21
    assert lag.watermark_lag_ms == 65_000
    assert lag.partition_watermark_lag_ms == {"t/0": 60_000}  # t/1 has none yet
    assert lag.idle_ms == {"t/1": 30_000}
    assert "max 60" in lag.describe() and "t/1 30000 ms" in lag.describe()


def test_without_a_reported_latest_offset_the_journaled_view_counts() -> None:
    """Spark's offsets log has no latestOffset: the offset's own ``seen`` (the latest offset
    planning saw) stands in."""
    [lag] = source_lags(progress(offset(p0={"offset": 4, "seen": 9}), None), now_ms=NOW)
    assert lag.offsets_behind_latest == {"t/0": 5} and lag.max_offsets_behind_latest == 5


def test_the_report_timestamp_is_now_by_default() -> None:
    [lag] = source_lags(progress(offset(p0={"offset": 4}), {"t": {"0": 4}}))
    assert lag.watermark_lag_ms == 65_000  # the report's timestamp, 22:15:00Z, is NOW
