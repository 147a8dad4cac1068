"""flinkish.windows' output through the sink, results and late rows to tables of their own:
neither table gets the other's columns, null in every one of its rows (no Spark: the writer as
Spark builds it on the driver, over a Parquet target)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from flinkish_core.window_output import LATE_COLUMN, PANE_COLUMNS
from flinkish_sink.stream_writer import FlinkishStreamWriter

LATE = {LATE_COLUMN: True}


def _output(late_metadata: dict[str, bool]) -> StructType:
    """window()'s columns: the key, kind, the pane's, then the late element's."""
    return StructType([
        StructField("key", StringType()), StructField("kind", StringType()),
        StructField("window_start", TimestampType()), StructField("window_end", TimestampType()),
        StructField("result", LongType()), StructField("pane_index", IntegerType()),
        StructField("pane_timing", StringType()), StructField("pane_is_last", BooleanType()),
        StructField("eventTime", TimestampType(), metadata=late_metadata),
        StructField("value", LongType(), metadata=late_metadata),
    ])


def _writer(tmp_path: Path, schema: StructType, **options: str) -> FlinkishStreamWriter:
    (tmp_path / "ck").mkdir(exist_ok=True)
    (tmp_path / "ck" / "metadata").write_text('{"id":"q"}\n')  # as Spark writes it
    return FlinkishStreamWriter(schema, {"target": "parquet", "path": str(tmp_path / "results"),
                                         "checkpointLocation": str(tmp_path / "ck"), **options})


def _names(writer: FlinkishStreamWriter, kind: str) -> list[str]:
    return writer._schemas[kind].names


@pytest.mark.parametrize("late_data", ["side", "drop"])
def test_results_and_late_rows_each_get_their_own_columns(tmp_path: Path, late_data: str) -> None:
    side = {"lateData.path": str(tmp_path / "late")} if late_data == "side" else {}
    writer = _writer(tmp_path, _output(LATE), lateData=late_data, **side)
    assert _names(writer, "data") == ["key", "kind", *PANE_COLUMNS]
    if late_data == "side":
        assert _names(writer, "late") == ["key", "kind", "eventTime", "value"]


def test_one_table_for_both_kinds_keeps_every_column(tmp_path: Path) -> None:
    writer = _writer(tmp_path, _output(LATE))
    assert _names(writer, "data") == _output({}).fieldNames()


def test_columns_without_the_mark_are_kept(tmp_path: Path) -> None:
    """Not window()'s late columns (a user's own, or the mark lost): nothing is left out."""
    writer = _writer(tmp_path, _output({}), lateData="side",
                     **{"lateData.path": str(tmp_path / "late")})
    assert _names(writer, "data") == _names(writer, "late") == _output({}).fieldNames()
