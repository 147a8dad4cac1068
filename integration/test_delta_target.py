"""Kafka -> flinkish source -> flinkish sink into Delta tables (delta-rs), read back with
``deltalake``: one table version per epoch, each row once, late rows in their own table, the
epochs' records in the table's history and in ``flinkish inspect``; then Spark replaying a
committed batch (its commit log entry lost) commits nothing, and a batch whose task failed
leaves no file behind. On the S3 test server: epochs commit once, and two queries appending to
one table both land."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest

from checkpointing.query import query_id
from flinkish.inspect import load_epochs
from flinkish_sink.data_files import STAGING_DIR
from flinkish_sink.delta_target import DeltaTarget, delta_location
from flinkish_sink.target import EpochRecord, TransactionId
from integration.kafka_helpers import produce, source
from integration.s3_server import S3Server

pytestmark = pytest.mark.integration

B = 1_700_000_000_000
PARTITIONS = 2
PER_PARTITION = 10
LATE = {(0, 7)}  # (partition, offset) produced 60 s behind the others


def _start(df: Any, checkpoint: Path, **options: str) -> Any:
    writer = df.writeStream.format("flinkish").option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.trigger(availableNow=True).start()


def _run(df: Any, checkpoint: Path, **options: str) -> None:
    query = _start(df, checkpoint, **options)
    query.awaitTermination(300)
    assert not query.isActive
    if query.exception() is not None:
        raise query.exception()


def _stream(spark: Any, kafka_bootstrap: str, name: str, state: Path) -> Any:
    return source(spark, kafka_bootstrap, name, str(state), maxOffsetsPerTrigger="8").selectExpr(
        "CAST(key AS STRING) AS k", "topic", "partition", "offset", "eventTime", "kind",
        "watermark", "status")


def _topic(kafka_bootstrap: str, topic: Any) -> str:
    name = str(topic(PARTITIONS))
    produce(kafka_bootstrap, name, [
        (p, f"k{p}-{i}".encode(), b"{}",
         B + i * 1000 + p - (60_000 if (p, i) in LATE else 0))
        for i in range(PER_PARTITION) for p in range(PARTITIONS)])
    return name


def _rows(path: Path) -> list[tuple[int, int]]:
    table = deltalake.DeltaTable(str(path)).to_pyarrow_dataset().to_table()
    return sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                      strict=True))


def _records(path: Path) -> list[dict[str, Any]]:
    """The epochs' records in the table's history, oldest first."""
    history = deltalake.DeltaTable(str(path)).history()
    return [json.loads(h["userMetadata"])["flinkish"] | {"version": h["version"]}
            for h in reversed(history) if "userMetadata" in h]


def _unreferenced(path: Path) -> set[str]:
    """Data files in the table's directory that no version references, and manifests."""
    table = deltalake.DeltaTable(str(path))
    referenced = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
    files = {p.name for p in path.glob("*.parquet")}
    return (files - referenced) | {p.name for p in (path / STAGING_DIR).glob("*")}


def test_exactly_once_one_version_per_epoch_and_late_rows_aside(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    name = _topic(kafka_bootstrap, topic)
    out, late, checkpoint = tmp_path / "out", tmp_path / "late", tmp_path / "ck"
    options = {"target": "delta", "path": str(out), "partitionBy": "partition",
               "lateData": "side", "lateData.path": str(late)}
    _run(_stream(spark, kafka_bootstrap, name, tmp_path / "state"), checkpoint, **options)

    produced = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
    assert _rows(out) == sorted(produced - LATE)
    assert _rows(late) == sorted(LATE)
    assert _unreferenced(out) == set() and _unreferenced(late) == set()
    main = deltalake.DeltaTable(str(out))
    assert main.metadata().partition_columns == ["partition"]
    records = _records(out)
    query = query_id(str(checkpoint))
    epochs = [r["epoch"] for r in records]
    # one version per epoch, right after the table's creation (version 0)
    assert epochs == list(range(len(records))) and len(records) >= 3
    assert [r["version"] for r in records] == [e + 1 for e in epochs]
    assert main.transaction_version(query) == epochs[-1]
    assert {r["query"] for r in records} == {query}
    assert sum(r["rows"] for r in records) == len(produced)
    assert sum(r["late_rows"] for r in records) == len(LATE)
    marks = [r["watermark"] for r in records if r["watermark"] is not None]
    assert marks == sorted(marks) and marks[-1] == B + (PER_PARTITION - 1) * 1000 - 1
    # the late table has a version of its own, under the same app id, in the late epoch only
    late_records = _records(late)
    assert len(late_records) == 1
    assert deltalake.DeltaTable(str(late)).transaction_version(query) == late_records[0]["epoch"]
    # flinkish inspect reads the same epochs from the sink's store
    inspected = {row.epoch: row for row in load_epochs(str(checkpoint))}
    assert sorted(inspected) == epochs
    for record in records:
        row = inspected[record["epoch"]]
        assert (row.watermark, row.rows, row.late_rows) == (
            record["watermark"], record["rows"], record["late_rows"])
        assert list(row.idle_partitions) == record["idle_partitions"]

    # Spark lost its commit log entry of the last batch (a crash after the sink committed):
    # the restart replays it; the table holds that epoch already, so nothing is committed
    # again and the replay's own files are deleted
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for lost in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / lost).unlink()
    version = main.version()
    _run(_stream(spark, kafka_bootstrap, name, tmp_path / "state"), checkpoint, **options)
    assert deltalake.DeltaTable(str(out)).version() == version
    assert _rows(out) == sorted(produced - LATE)
    assert _unreferenced(out) == set()


def test_a_failed_batch_leaves_no_file_and_the_rerun_is_exactly_once(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    """A task of batch 1 fails (no task retries): Spark aborts the batch and the query fails;
    the other task's pre-committed files and the failed task's own are deleted. The restarted
    query writes every row once."""
    from pyspark.errors import StreamingQueryException
    from pyspark.sql.functions import col, udf

    name = _topic(kafka_bootstrap, topic)
    out, checkpoint, switch = tmp_path / "out", tmp_path / "ck", tmp_path / "fail"
    switch.write_text("on")
    flag = str(switch)

    @udf("bigint")
    def failing(partition, offset):  # type: ignore[no-untyped-def]  (Spark reads hints)
        import os

        if partition == 1 and offset == 6 and os.path.exists(flag):
            raise RuntimeError("injected failure of a write task")
        return offset

    df = _stream(spark, kafka_bootstrap, name, tmp_path / "state").withColumn(
        "offset", failing(col("partition"), col("offset")))
    query = _start(df, checkpoint, target="delta", path=str(out))
    with pytest.raises(StreamingQueryException, match="injected failure"):
        query.awaitTermination(300)
    committed = _rows(out)
    assert committed and len(committed) < PARTITIONS * PER_PARTITION  # batch 0 only
    # Spark aborts the batch without waiting for the other task: one still running then may
    # stage its files after the abort. Only batch 1's may be there; the restart cleans them.
    assert all(re.search(r"-000000001-|~1~", f) for f in _unreferenced(out)), _unreferenced(out)

    switch.unlink()
    _run(df, checkpoint, target="delta", path=str(out))
    assert _rows(out) == sorted((p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION))
    assert _unreferenced(out) == set()


def test_on_s3_epochs_commit_once_and_two_queries_appending_both_land(s3: S3Server) -> None:
    """A table on the S3 test server (delta-rs' object store; log entries created with
    If-None-Match): an epoch committed twice is one version, and two queries committing to
    the same table at the same moment both land, each under its own app id."""
    import threading
    import uuid

    bucket = f"delta-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    location = s3.uri(bucket, "tables/events")
    schema = pa.schema([("id", pa.int64())])
    targets = [DeltaTarget(location), DeltaTarget(location)]
    targets[0].check(schema)
    targets[1].check(schema)

    def pre_commit(target: DeltaTarget, query: str, epoch: int, ids: list[int]) -> Any:
        transaction = target.begin_transaction(
            TransactionId("flinkish", query, epoch, 0, 0, "r1"), schema)
        transaction.write(pa.record_batch([pa.array(ids, pa.int64())], schema=schema))
        return transaction.pre_commit()

    def record(query: str, epoch: int) -> EpochRecord:
        return EpochRecord(query, epoch, 1_000 * epoch, "valve", "ACTIVE", (), 1, 0)

    first = pre_commit(targets[0], "q0", 0, [1, 2])
    targets[0].commit_epoch([first], record("q0", 0))
    targets[1].commit_epoch([first], record("q0", 0))  # a replay, from another process
    pcs = [pre_commit(targets[i], f"q{i}", 1, [10 + i]) for i in range(2)]
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def commit(i: int) -> None:
        start.wait()
        try:
            targets[i].commit_epoch([pcs[i]], record(f"q{i}", 1))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    uri, options = delta_location(location)
    table = deltalake.DeltaTable(uri, storage_options=options)
    ids = table.to_pyarrow_dataset().to_table().column("id").to_pylist()
    assert sorted(ids) == [1, 2, 10, 11]
    assert table.version() == 3  # created, q0's epoch 0, one version per query's epoch 1
    assert (table.transaction_version("q0"), table.transaction_version("q1")) == (1, 1)
    assert targets[0].pending("flinkish", "q0") == targets[1].pending("flinkish", "q1") == []
    assert targets[0].committed_watermark("q0") == 1_000
