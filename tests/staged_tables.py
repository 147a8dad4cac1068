"""What the unit tests of the table targets whose tasks stage data files (Delta, Iceberg) share:
the rows, the task side (``begin_transaction(...).write(batch)`` / ``.pre_commit()`` on the
target as Spark ships it to a task) and the driver side (:class:`TwoPhaseCommitCoordinator`
over a real CheckpointStore)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa

from checkpointing import CheckpointStorage, CheckpointStore
from flinkish_core.markers import KIND_STATUS, KIND_WATERMARK, Marker
from flinkish_sink.data_files import StagedFilesTarget
from flinkish_sink.target import AnyTarget, PreCommit, TransactionId
from flinkish_sink.two_phase_commit import TwoPhaseCommitCoordinator

QUERY = "q1"
PREFIX = "flinkish"
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()),
                    ("eventTime", pa.timestamp("us", tz="UTC"))])


def batch(ids: list[int], name: str = "n") -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array([f"{name}{i % 2}" for i in ids]),
         pa.array([i * 1_000_000 for i in ids], pa.timestamp("us", tz="UTC"))],
        schema=SCHEMA)


def txn(epoch: int, task: int, attempt: int = 0, *, run: str = "r1",
        prefix: str = PREFIX) -> TransactionId:
    return TransactionId(prefix, QUERY, epoch, task, attempt, run)


def pre_commit(target: StagedFilesTarget, epoch: int, task: int, ids: list[int], *,
               run: str = "r1", prefix: str = PREFIX) -> PreCommit:
    """A write task's pre-commit of ``ids`` (in two batches), as the driver receives it."""
    shipped = pickle.loads(pickle.dumps(target))  # as Spark ships it to a task
    transaction = shipped.begin_transaction(txn(epoch, task, run=run, prefix=prefix), SCHEMA)
    transaction.write(batch(ids[:1]))
    transaction.write(batch(ids[1:]))
    result = transaction.pre_commit()
    # what crosses from the task to the driver is JSON
    return PreCommit.from_json(json.loads(json.dumps(result.to_json())))


def marker(partition: int, watermark: int) -> list[Marker]:
    return [Marker("t", partition, 0, KIND_STATUS, None, "ACTIVE"),
            Marker("t", partition, 5, KIND_WATERMARK, watermark, None)]


def coordinator(root: Path, target: AnyTarget, side: AnyTarget | None
                ) -> TwoPhaseCommitCoordinator:
    """A fresh driver-side writer, as Spark makes one for every commit."""
    store = CheckpointStore(CheckpointStorage.open(str(root / "store")), owner=QUERY)
    return TwoPhaseCommitCoordinator(store, target, PREFIX, QUERY, side_target=side)
