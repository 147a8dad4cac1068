"""Late rows through Spark into both targets: routed to a side output, or dropped, and always
counted in the published epochs; at-least-once delivery writes directly but still publishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds
import pytest

from integration.kafka_helpers import produce, run_sink, source

B = 1_700_000_000_000


def _late_stream(spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path) -> Any:
    """One partition, five records a batch; offset 7 is 60 s behind: late in epoch 1."""
    name = topic(1)
    records = [(0, f"k{i}".encode(), b"{}", B + i * 1000) for i in range(12)]
    records[7] = (0, b"late", b"{}", B - 60_000)
    produce(kafka_bootstrap, name, records)
    return source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                  maxOffsetsPerTrigger="5").selectExpr(
        "CAST(key AS STRING) AS k", "topic", "partition", "offset", "eventTime", "kind",
        "watermark", "status")


def test_parquet_side_output_gets_exactly_the_late_rows(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    df = _late_stream(spark, kafka_bootstrap, topic, tmp_path)
    out, late = tmp_path / "out", tmp_path / "late"
    run_sink(df, tmp_path / "ck", target="parquet", path=str(out), lateData="side",
         **{"lateData.path": str(late)})
    main = sorted(ds.dataset(str(out), format="parquet").to_table().column("k").to_pylist())
    assert main == sorted(f"k{i}" for i in range(12) if i != 7)
    assert ds.dataset(str(late), format="parquet").to_table().column("k").to_pylist() == ["late"]
    assert spark.read.parquet(str(out)).count() == 11  # Spark reads only committed files
    epochs = sorted((out / "_flinkish_epochs").glob("*/*.json"))
    published = [json.loads(p.read_text()) for p in epochs]
    assert sum(e["late_rows"] for e in published) == 1
    assert sum(e["rows"] for e in published) == 12


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_postgres_drops_late_rows_but_counts_them(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, postgres_dsn: str,
    guarantee: str,
) -> None:
    df = _late_stream(spark, kafka_bootstrap, topic, tmp_path)
    table = f"late_{guarantee.replace('-', '_')}"
    run_sink(df, tmp_path / "ck", target="postgres", dsn=postgres_dsn, table=table,
         lateData="drop", deliveryGuarantee=guarantee)
    with psycopg.connect(postgres_dsn) as conn:
        keys = sorted(k for (k,) in conn.execute(f"SELECT k FROM {table}").fetchall())
        epochs = conn.execute(
            f"SELECT epoch, watermark, rows, late_rows FROM {table}_flinkish_epochs "
            "ORDER BY epoch").fetchall()
    assert keys == sorted(f"k{i}" for i in range(12) if i != 7)
    assert sum(e[3] for e in epochs) == 1 and sum(e[2] for e in epochs) == 12
    watermarks = [e[1] for e in epochs if e[1] is not None]
    assert watermarks == sorted(watermarks) and watermarks[-1] == B + 11_000 - 1
