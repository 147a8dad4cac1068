"""The sink's judgement of a stream without markers and of an epoch's number of write tasks,
without Spark: which schemas deserve the dropped-markers warning, where Spark's event-time
watermark of a batch is read from, and when the write tasks are too many for PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import (
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from checkpointing.query import spark_batch_watermark
from flinkish_sink.stream_writer import (
    SENSIBLE_WRITE_TASKS,
    _data_schema,
    carries_markers,
    dropped_markers,
    write_task_problem,
)

WINDOW = StructType([StructField("start", TimestampType()), StructField("end", TimestampType())])
WATERMARKED: dict[str, Any] = {"spark.watermarkDelayMs": 86_400_000}


def fields(*names: str) -> list[StructField]:
    return [StructField(n, LongType() if n in ("partition", "offset") else StringType())
            for n in names]


def test_the_sources_rows_without_markers_are_a_mistake() -> None:
    assert dropped_markers(StructType(fields("value", "topic", "partition", "offset")))


@pytest.mark.parametrize("schema", [
    # the docs' windowed count: a stateful aggregate's output (window carries the watermark)
    StructType([StructField("window", WINDOW, metadata={**WATERMARKED, "spark.timeWindow": True}),
                *fields("partition", "count")]),
    # the same with the window's bounds selected: no source row columns
    StructType([StructField("window_start", TimestampType()), *fields("partition", "count")]),
    # with_watermark + dropDuplicatesWithinWatermark keeps the source's columns and eventTime
    StructType([*fields("value", "topic", "partition", "offset"),
                StructField("eventTime", TimestampType(), metadata=WATERMARKED)]),
    # the markers kept: nothing dropped
    StructType(fields("value", "topic", "partition", "offset", "kind", "watermark", "status")),
])
def test_stateful_output_and_kept_markers_are_not(schema: StructType) -> None:
    assert not dropped_markers(schema)


def test_a_kind_column_without_the_markers_is_data() -> None:
    """flinkish.windows' output has ``kind`` ('result' / 'late') but none of the source's other
    marker columns: the sink writes it as a column instead of keeping only 'record' rows."""
    windows = StructType(fields("partition", "key", "kind", "window_start", "count"))
    assert not carries_markers(windows)
    assert _data_schema(windows).names == ["partition", "key", "kind", "window_start", "count"]
    source = StructType(fields("value", "topic", "partition", "offset", "kind", "watermark",
                               "status"))
    assert carries_markers(source)
    assert _data_schema(source).names == ["value", "topic", "partition", "offset"]


def _offsets(checkpoint: Path, batch: int, metadata: str) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text(
        f'v1\n{metadata}\n{json.dumps({"valve": {"watermark": 1}})}\n')


def test_sparks_batch_watermark_from_the_offsets_log(tmp_path: Path) -> None:
    _offsets(tmp_path, 3, '{"batchWatermarkMs":1700000000000,"batchTimestampMs":5,"conf":{}}')
    _offsets(tmp_path, 0, '{"batchWatermarkMs":0,"batchTimestampMs":5,"conf":{}}')
    _offsets(tmp_path, 4, "not json")
    assert spark_batch_watermark(str(tmp_path), 3) == 1_700_000_000_000
    assert spark_batch_watermark(f"file:{tmp_path}", 3) == 1_700_000_000_000
    assert spark_batch_watermark(str(tmp_path), 0) is None  # Spark's "no watermark yet"
    assert spark_batch_watermark(str(tmp_path), 4) is None
    assert spark_batch_watermark(str(tmp_path), 9) is None  # no such batch


def test_write_tasks_beyond_max_prepared_transactions_fail_the_epoch() -> None:
    problem = write_task_problem(200, 100)
    assert problem is not None
    assert "200 write tasks but PostgreSQL's max_prepared_transactions is 100" in problem
    assert "the epoch fails" in problem
    assert "spark.sql.shuffle.partitions" in problem and "coalesce(n)" in problem


def test_more_write_tasks_than_sensible_warn_even_within_the_limit() -> None:
    problem = write_task_problem(SENSIBLE_WRITE_TASKS + 1, 1_000)
    assert problem is not None and "more than 64" in problem and "fails" not in problem
    assert "spark.sql.shuffle.partitions" in problem
    assert write_task_problem(SENSIBLE_WRITE_TASKS, 1_000) is None
    assert write_task_problem(2, 64) is None


def test_the_sinks_driver_side_imports_leave_pandas_out() -> None:
    """The driver's writer and commit processes import the sink's modules before a restarted
    query's first commit; pandas (~0.4 s of CPU, pulled in by pyarrow on its first array from
    Python values) is for the tasks alone."""
    code = ("import sys, flinkish_sink.stream_writer, flinkish_sink.parquet_target, "
            "flinkish_sink.postgres_target; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] == 'pandas'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.strip() == "[]"
