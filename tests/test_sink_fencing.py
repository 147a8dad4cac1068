"""Fencing that holds, at the sink's commit: one claim per run of the query, kept across epochs;
a restart claims anew; of two live drivers on one checkpoint the older fails fast with an error
that says what to do, and a zombie's stale claim never fences the live driver — however often
its commit worker is replaced.

Each "driver" is a FlinkishStreamWriter plus the claims its commit worker holds (the sink's
process-level ``_STORES``, swapped per driver here); its write tasks are played by staging
Parquet pre-commits and handing the driver the commit messages Spark would."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyspark.sql.types import LongType, StructField, StructType

import flinkish_sink.stream_writer as stream_writer
from checkpointing import CheckpointStorage, FencedError
from checkpointing.fencing import OWNER_RECORD
from flinkish_sink.stream_writer import FlinkishStreamWriter, SinkCommitMessage, spark_run_id
from flinkish_sink.target import TransactionId

QUERY = "4b1d0c9e-5555-4666-8777-988899990000"
SCHEMA = StructType([StructField("id", LongType())])
ARROW = pa.schema([("id", pa.int64())])


class Driver:
    """One driver process of the query: a run id, and the claims its commit worker holds."""

    def __init__(self, root: Path, run: str) -> None:
        self.root = root
        self.run = run
        self.stores: dict[Any, Any] = {}

    @contextmanager
    def worker(self) -> Iterator[None]:
        saved = stream_writer._STORES
        stream_writer._STORES = self.stores
        try:
            yield
        finally:
            stream_writer._STORES = saved

    def writer(self) -> FlinkishStreamWriter:
        """Spark builds a writer per micro-batch (and commits on yet another one)."""
        return FlinkishStreamWriter(SCHEMA, {
            "target": "parquet", "path": str(self.root / "out"),
            "checkpointLocation": str(self.root / "ck"), "queryName": "fenced",
        })

    def messages(self, epoch: int, tasks: int = 2) -> list[SinkCommitMessage]:
        """What the batch's write tasks hand the driver: one staged pre-commit each."""
        writer = self.writer()
        out = []
        for task in range(tasks):
            txn = writer._target.begin_transaction(
                TransactionId("flinkish", QUERY, epoch, task, 0, writer._run), ARROW)
            txn.write(pa.record_batch([pa.array([epoch * 100 + task])], schema=ARROW))
            out.append(SinkCommitMessage(task, [txn.pre_commit().to_json()], [], 1, 0,
                                         run=self.run))
        return out

    def commit(self, epoch: int, messages: list[SinkCommitMessage] | None = None) -> None:
        with self.worker():
            self.writer().commit(self.messages(epoch) if messages is None else messages, epoch)

    def replaced_worker(self) -> None:
        """Spark replaced the driver's commit worker: a new process, no claims held."""
        self.stores = {}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "metadata").write_text(json.dumps({"id": QUERY}) + "\n")
    return tmp_path


def owner(root: Path) -> dict[str, Any]:
    record: dict[str, Any] = CheckpointStorage.open(str(root / "ck" / "flinkish")).read_json(
        OWNER_RECORD)
    return record


def committed(root: Path) -> list[int]:
    table = ds.dataset(str(root / "out"), format="parquet").to_table()
    return sorted(table.column("id").to_pylist())


def lingering(root: Path) -> list[str]:
    staging = root / "out" / "_flinkish_staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def test_one_claim_per_run_kept_across_epochs_and_a_replaced_worker(root: Path) -> None:
    driver = Driver(root, "run-1")
    driver.commit(0)
    claim = owner(root)
    assert (claim["generation"], claim["run"]) == (1, "run-1")
    for epoch in range(1, 5):
        driver.commit(epoch)
    assert owner(root) == claim  # not a new generation per epoch
    driver.replaced_worker()
    driver.commit(5)
    assert owner(root) == claim  # the run's new worker adopted the claim
    assert committed(root) == sorted(e * 100 + t for e in range(6) for t in range(2))


def test_a_restart_claims_anew(root: Path) -> None:
    first = Driver(root, "run-1")
    first.commit(0)
    first.commit(1)
    restarted = Driver(root, "run-2")  # a new run: after a crash, or query.stop() + start()
    restarted.stores = first.stores  # even in the same driver's worker
    restarted.commit(2)
    claim = owner(root)
    assert (claim["generation"], claim["run"], claim["superseded_runs"]) == (2, "run-2", ["run-1"])
    restarted.commit(3)
    assert owner(root)["generation"] == 2


def test_of_two_live_drivers_the_older_fails_fast_and_never_fences_the_live_one(
    root: Path
) -> None:
    a, b = Driver(root, "run-a"), Driver(root, "run-b")
    a.commit(0)
    a.commit(1)
    b.commit(2)  # a second driver of the same query starts: it claims the checkpoint
    assert (owner(root)["generation"], owner(root)["run"]) == (2, "run-b")

    zombie_messages = a.messages(3)
    with pytest.raises(FencedError) as fenced:
        a.commit(3, zombie_messages)
    message = str(fenced.value)
    assert "run run-a of query" in message and "superseded" in message and "run run-b" in message
    assert "two drivers were running this query" in message
    assert "stop this driver" in message and "stop the newer one first" in message
    # the older driver's worker is replaced and it tries again: still refused, claims nothing
    a.replaced_worker()
    with pytest.raises(FencedError, match="may not claim the location again"):
        a.commit(3, zombie_messages)
    assert (owner(root)["generation"], owner(root)["run"]) == (2, "run-b")

    b.commit(3)  # the live driver goes on; its recovery rolls back the zombie's pre-commits
    b.commit(4)
    assert (owner(root)["generation"], owner(root)["run"]) == (2, "run-b")
    assert committed(root) == sorted(e * 100 + t for e in range(5) for t in range(2))
    assert lingering(root) == []


def test_a_batch_without_tasks_keeps_the_held_claim(root: Path) -> None:
    driver = Driver(root, "run-1")
    driver.commit(0)
    driver.commit(1, messages=[])  # no write tasks: no message names the run
    driver.commit(2)
    assert (owner(root)["generation"], owner(root)["run"]) == (1, "run-1")


def test_abort_claims_nothing(root: Path) -> None:
    live = Driver(root, "run-live")
    live.commit(0)
    before = owner(root)
    other = Driver(root, "run-other")
    messages = other.messages(1)
    with other.worker():
        other.writer().abort([*messages, None], 1)
    assert owner(root) == before
    assert lingering(root) == []  # the aborted epoch's pre-commits were rolled back
    live.commit(1)


def test_commit_messages_carry_the_run_of_the_task_that_built_them() -> None:
    assert spark_run_id() is None  # not in a Spark task
    message = SinkCommitMessage(3, run="1f2e3d4c")
    assert pickle.loads(pickle.dumps(message)).run == "1f2e3d4c"
    assert SinkCommitMessage(0).run is None
