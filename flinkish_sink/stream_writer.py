"""The Spark adapter: ``df.writeStream.format("flinkish")``.

Write tasks (executors) run beginTransaction / write / preCommit; the driver's
``commit(messages, batchId)`` runs :class:`TwoPhaseCommitCoordinator` for the epoch. Only the
commit messages travel from tasks to the driver, so each carries the task's pre-commits and the
source's marker rows it saw (markers are not data: they feed the valve at the epoch commit).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from checkpointing import CheckpointStorage, CheckpointStore
from checkpointing.failpoints import failpoint
from flinkish_sink.options import (
    DeliveryGuarantee,
    LateData,
    SinkOptions,
    parse_sink_options,
    query_id,
)
from flinkish_sink.target import PreCommit, Target, TaskTransaction, TransactionId
from flinkish_sink.two_phase_commit import LATE_SUFFIX, TwoPhaseCommitCoordinator
from flinkish_source.epoch_valve import Marker
from flinkish_source.options import OptionError
from flinkish_source.valve import MIN_WATERMARK

logger = logging.getLogger(__name__)

_LAST_MS = (2**63 - 1) // 1000  # the last millisecond a microsecond timestamp can hold

#: (options, schema) pairs whose targets this process has checked (and created) already.
_CHECKED: set[tuple[str, str]] = set()

#: Source columns that describe markers; they are not written as data.
MARKER_COLUMNS = ("kind", "watermark", "status")


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    task: int
    pre_commits: list[dict[str, Any]] = field(default_factory=list)
    markers: list[list[Any]] = field(default_factory=list)
    rows: int = 0
    late_rows: int = 0


def make_target(options: SinkOptions, late: bool = False) -> Target:
    """The configured target (or, with ``late``, the late-data side output)."""
    if options.target == "postgres":
        from flinkish_sink.postgres_target import PostgresTarget

        assert options.dsn is not None and options.table is not None
        table = options.late_table if late else options.table
        assert table is not None
        return PostgresTarget(
            options.dsn, table, epochs_table=options.epochs_table,
            two_phase=options.guarantee is DeliveryGuarantee.EXACTLY_ONCE,
        )
    from flinkish_sink.parquet_target import ParquetTarget

    path = options.late_path if late else options.path
    assert path is not None
    return ParquetTarget(path)


def store_location(options: SinkOptions) -> str:
    if options.state_location:
        return options.state_location
    assert options.checkpoint_location is not None
    return options.checkpoint_location.rstrip("/") + "/flinkish"


def _data_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)
    return pa.schema([f for f in arrow if f.name not in MARKER_COLUMNS])


class FlinkishStreamWriter(DataSourceStreamArrowWriter):
    """Built on the driver once per micro-batch, then pickled to the write tasks."""

    def __init__(self, schema: StructType, raw_options: dict[str, str]) -> None:
        self._options = parse_sink_options(raw_options)
        self._has_kind = "kind" in schema.fieldNames()
        self._data_schema = _data_schema(schema)
        self._event_time = (
            self._options.event_time_column
            if self._options.event_time_column in schema.fieldNames() else None
        )
        if self._event_time is not None:
            kind = schema[self._event_time].dataType.typeName()
            if kind not in ("timestamp", "timestamp_ntz"):
                raise OptionError(
                    f"option eventTimeColumn: column {self._event_time!r} is {kind}, not a "
                    "timestamp; late data is judged on the source's eventTime column"
                )
        if not self._has_kind:
            logger.warning(
                "the flinkish sink got no marker rows (no 'kind' column): it commits exactly "
                "once but cannot compute a combined watermark or judge late rows"
            )
        self._target = make_target(self._options)
        self._side = make_target(self._options, late=True) if (
            self._options.late_data is LateData.SIDE) else None
        checked = (repr(self._options), self._data_schema.to_string())
        if checked not in _CHECKED:  # Spark builds a writer per batch in one long-lived process
            self._target.check(self._data_schema)
            if self._side is not None:
                self._side.check(self._data_schema)
            _CHECKED.add(checked)
        self._query = ""
        self._run = uuid.uuid4().hex[:8]  # see TransactionId.run
        # (latest completed epoch, its combined watermark, the watermark before it): enough
        # for a task of epoch N to know its late threshold without opening the store
        self._thresholds: tuple[int, int, int] = (-1, MIN_WATERMARK, MIN_WATERMARK)
        if self._options.guarantee is not DeliveryGuarantee.NONE:
            if not self._options.checkpoint_location:
                raise OptionError(
                    "the flinkish sink needs the query's checkpointLocation: its id names the "
                    "query's transactions and owns the checkpoint store"
                )
            self._query = query_id(self._options.checkpoint_location)
            view = CheckpointStore.reader(CheckpointStorage.open(store_location(self._options)))
            latest = view.latest_completed()
            if latest is not None:
                wm = latest.state["watermark"]
                self._thresholds = (
                    latest.checkpoint_id, int(wm["watermark"]), int(wm["previous_watermark"])
                )

    # -- task side -------------------------------------------------------------------------

    def _threshold(self, epoch: int) -> int:
        latest, watermark, previous = self._thresholds
        return watermark if epoch > latest else previous

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        epoch = int(context.getLocalProperty("streaming.sql.batchId") or 0)
        task, attempt = context.partitionId(), context.attemptNumber()
        exactly_once = self._options.guarantee is DeliveryGuarantee.EXACTLY_ONCE
        threshold = self._threshold(epoch)
        late_mode = self._options.late_data
        message = SinkCommitMessage(task)
        open_txns: dict[str, TaskTransaction] = {}

        def txn(kind: str) -> TaskTransaction:
            if kind not in open_txns:
                prefix = self._options.prefix + (LATE_SUFFIX if kind == "late" else "")
                target = self._side if kind == "late" else self._target
                assert target is not None
                open_txns[kind] = target.begin_transaction(
                    TransactionId(prefix, self._query, epoch, task, attempt, self._run),
                    self._data_schema,
                )
            return open_txns[kind]

        def emit(kind: str, rows: pa.RecordBatch) -> None:
            if rows.num_rows == 0:
                return
            if exactly_once:
                txn(kind).write(rows)
            else:
                target = self._side if kind == "late" else self._target
                assert target is not None
                target.write_direct(rows)

        try:
            for batch in iterator:
                if self._has_kind:
                    is_record = pc.fill_null(pc.equal(batch.column("kind"), "record"), True)
                    markers = batch.filter(pc.invert(is_record))
                    if markers.num_rows:
                        message.markers.extend(_markers(markers))
                    batch = batch.filter(is_record)
                data = pa.RecordBatch.from_arrays(
                    [batch.column(f.name) for f in self._data_schema], schema=self._data_schema
                )
                message.rows += data.num_rows
                late = None
                if self._event_time is not None and threshold != MIN_WATERMARK:
                    event_us = batch.column(self._event_time).cast(pa.int64())
                    late = pc.fill_null(pc.less_equal(event_us, min(threshold, _LAST_MS) * 1000),
                                        False)
                    late_count = pc.sum(late).as_py() or 0
                    message.late_rows += late_count
                    if late_count == 0:
                        late = None
                if late is None or late_mode is LateData.KEEP:
                    emit("data", data)
                else:
                    emit("data", data.filter(pc.invert(late)))
                    if late_mode is LateData.SIDE:
                        emit("late", data.filter(late))
                failpoint("task_write")
            message.pre_commits = [t.pre_commit().to_json() for t in open_txns.values()]
        except BaseException:
            for t in open_txns.values():
                try:
                    t.abort()
                except Exception:  # keep the original failure; the driver rolls back leftovers
                    logger.exception("abort after a failed write")
            raise
        return message

    # -- driver side -----------------------------------------------------------------------

    def _coordinator(self) -> TwoPhaseCommitCoordinator:
        store = CheckpointStore(
            CheckpointStorage.open(store_location(self._options)),
            owner=self._query, retain=self._options.retain,
        )
        return TwoPhaseCommitCoordinator(
            store, self._target, self._options.prefix, self._query, side_target=self._side
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self._options.guarantee is DeliveryGuarantee.NONE:
            return
        received = [m for m in messages if isinstance(m, SinkCommitMessage)]
        outcome = self._coordinator().commit_epoch(
            batchId,
            [PreCommit.from_json(p) for m in received for p in m.pre_commits],
            [Marker.from_json(mk) for m in received for mk in m.markers],
            sum(m.rows for m in received),
            sum(m.late_rows for m in received),
        )
        logger.info(
            "epoch %s committed: watermark %s, %s rows (%s late)%s", batchId,
            outcome.watermark.watermark, outcome.checkpoint.state["rows"],
            outcome.checkpoint.state["late_rows"], " (replay)" if outcome.replayed else "",
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self._options.guarantee is not DeliveryGuarantee.EXACTLY_ONCE:
            return
        pre_commits = [
            PreCommit.from_json(p)
            for m in messages if isinstance(m, SinkCommitMessage) for p in m.pre_commits
        ]
        self._coordinator().abort_epoch(batchId, pre_commits)


def _markers(rows: pa.RecordBatch) -> list[list[Any]]:
    columns = [rows.column(name).to_pylist() for name in
               ("topic", "partition", "offset", "kind", "watermark", "status")]
    return [list(values) for values in zip(*columns, strict=True)]
