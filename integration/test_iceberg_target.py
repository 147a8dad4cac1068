"""Kafka -> flinkish source -> flinkish sink into Iceberg tables (pyiceberg's SQL catalog on
SQLite), read back with pyiceberg: one snapshot per epoch, each row once, late rows in their
own table, the epochs' records in the snapshot summaries and in ``flinkish inspect``; then
Spark replaying a committed batch (its commit log entry lost) commits nothing and leaves no
file behind. And the SQL catalog on the session's PostgreSQL, which users of the PostgreSQL
target have already."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from psycopg.conninfo import conninfo_to_dict
from pyiceberg.catalog import load_catalog

from checkpointing.query import query_id
from flinkish.inspect import load_epochs
from flinkish_sink.data_files import STAGING_DIR
from flinkish_sink.iceberg_target import IcebergTarget
from flinkish_sink.target import EpochRecord, TransactionId
from integration.kafka_helpers import source
from integration.test_delta_target import LATE, PARTITIONS, PER_PARTITION, B, _run, _topic

pytestmark = pytest.mark.integration


def _catalog(root: Path) -> dict[str, str]:
    return {"uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}


def _stream(spark: Any, kafka_bootstrap: str, name: str, state: Path) -> Any:
    """The topic's rows in two epochs (each with pyiceberg's imports in Spark's commit
    process: a few seconds)."""
    return source(spark, kafka_bootstrap, name, str(state), maxOffsetsPerTrigger="10"
                  ).selectExpr("CAST(key AS STRING) AS k", "topic", "partition", "offset",
                               "eventTime", "kind", "watermark", "status")


def _rows(table: Any) -> list[tuple[int, int]]:
    rows = table.scan().to_arrow()
    return sorted(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(),
                      strict=True))


def _unreferenced(table: Any) -> set[str]:
    """Data files under the table's data location that no snapshot references, and
    manifests."""
    data = Path(table.location().removeprefix("file://")) / "data"
    referenced = {p.rsplit("/", 1)[-1]
                  for p in table.inspect.files().column("file_path").to_pylist()}
    return ({p.name for p in data.glob("*.parquet")} - referenced) | {
        p.name for p in (data / STAGING_DIR).glob("*")}


def test_exactly_once_one_snapshot_per_epoch_and_late_rows_aside(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    name = _topic(kafka_bootstrap, topic)
    checkpoint = tmp_path / "ck"
    catalog = _catalog(tmp_path)
    options = {"target": "iceberg", "table": "events.out", "partitionBy": "partition",
               "lateData": "side", "lateData.table": "events.late",
               **{f"catalog.{k}": v for k, v in catalog.items()}}
    _run(_stream(spark, kafka_bootstrap, name, tmp_path / "state"), checkpoint, **options)

    reader = load_catalog("flinkish", **catalog)
    out, late = reader.load_table("events.out"), reader.load_table("events.late")
    produced = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
    assert _rows(out) == sorted(produced - LATE)
    assert _rows(late) == sorted(LATE)
    assert _unreferenced(out) == set() and _unreferenced(late) == set()
    assert [f.name for f in out.schema().fields][:2] == ["k", "topic"]
    assert {f["partition"]["partition"] for f in out.inspect.files().to_pylist()} == {0, 1}
    query = query_id(str(checkpoint))
    records = IcebergTarget(catalog, "events.out").epoch_records()[::-1]  # oldest first
    epochs = [r["epoch"] for r in records]
    assert epochs == list(range(len(records))) and len(records) >= 2
    assert len(out.snapshots()) == len(records)  # one snapshot per epoch, nothing else
    assert {(r["query"], r["app_id"]) for r in records} == {(query, query)}
    assert sum(r["rows"] for r in records) == len(produced)
    assert sum(r["late_rows"] for r in records) == len(LATE)
    marks = [r["watermark"] for r in records if r["watermark"] is not None]
    assert marks == sorted(marks) and marks[-1] == B + (PER_PARTITION - 1) * 1000 - 1
    assert len(late.snapshots()) == 1  # the late table: a snapshot in the late epoch only
    inspected = {row.epoch: row for row in load_epochs(str(checkpoint))}
    assert sorted(inspected) == epochs
    for record in records:
        row = inspected[record["epoch"]]
        assert (row.watermark, row.rows, row.late_rows) == (
            record["watermark"], record["rows"], record["late_rows"])

    # Spark lost its commit log entry of the last batch (a crash after the sink committed):
    # the restart replays it; the table holds that epoch already, so nothing is committed
    # again and the replay's own files are deleted
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for lost in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / lost).unlink()
    _run(_stream(spark, kafka_bootstrap, name, tmp_path / "state"), checkpoint, **options)
    out = reader.load_table("events.out")
    assert len(out.snapshots()) == len(records)
    assert _rows(out) == sorted(produced - LATE)
    assert _unreferenced(out) == set()


def test_the_catalog_on_postgresql_commits_each_epoch_once(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """pyiceberg's SQL catalog on PostgreSQL (SQLAlchemy with psycopg 3): an epoch committed
    twice (a replay) is one snapshot; the table's pointer is swapped in the database."""
    import uuid

    params = conninfo_to_dict(postgres_dsn)
    uri = (f"postgresql+psycopg://{params.get('user', 'postgres')}@{params['host']}:"
           f"{params.get('port', 5432)}/{params['dbname']}")
    catalog = {"uri": uri, "warehouse": f"file://{tmp_path}/warehouse"}
    table = f"iceberg_it.t_{uuid.uuid4().hex[:8]}"
    schema = pa.schema([("id", pa.int64())])
    target = IcebergTarget(catalog, table)
    target.check(schema)
    for epoch in (0, 1):
        transaction = target.begin_transaction(
            TransactionId("flinkish", "q", epoch, 0, 0, "r1"), schema)
        transaction.write(pa.record_batch([pa.array([epoch], pa.int64())], schema=schema))
        decided = transaction.pre_commit()
        record = EpochRecord("q", epoch, epoch, "valve", "ACTIVE", (), 1, 0)
        target.commit_epoch([decided], record)
    # the driver died before completing epoch 1: its recorded decision is committed again
    IcebergTarget(catalog, table).commit_epoch([decided], record)
    loaded = load_catalog("flinkish", **catalog).load_table(table)
    assert sorted(loaded.scan().to_arrow().column("id").to_pylist()) == [0, 1]
    assert [r["epoch"] for r in target.epoch_records("q")] == [1, 0]
    assert _unreferenced(loaded) == set()
