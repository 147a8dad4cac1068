"""The Spark adapter: ``df.writeStream.format("flinkish")``.

Write tasks run beginTransaction / write / preCommit; the driver's ``commit(messages, batchId)``
runs :class:`TwoPhaseCommitCoordinator`. The commit messages carry the pre-commits and the
marker rows, which feed the valve. The store claimed at a run's first commit is kept in the
driver's long-lived Python worker (``_STORES``) across epochs, one generation per Spark run
(docs/architecture.md, "Two-phase commit" and "Checkpoint storage and fencing").
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from checkpointing import CheckpointStorage, CheckpointStore
from checkpointing.epoch_watermarks import latest_watermark
from checkpointing.failpoints import failpoint
from checkpointing.query import query_id, spark_batch_watermark
from checkpointing.query import store_location as _store_location
from flinkish_core.epoch_valve import EpochWatermark
from flinkish_core.errors import OptionError
from flinkish_core.late_data import late_mask, late_threshold
from flinkish_core.markers import KIND_RECORD, MARKER_COLUMNS, MARKER_FIELDS, MARKER_KINDS, Marker
from flinkish_core.watermark import SPARK_DELAY_KEY
from flinkish_core.window_output import KIND, LATE, PANE_COLUMNS, is_window_output, late_columns
from flinkish_sink import targets
from flinkish_sink.options import (
    UPSERT_KEY,
    DeliveryGuarantee,
    LateData,
    SinkOptions,
    parse_sink_options,
)
from flinkish_sink.outages import RetriedTransaction, RetryPolicy
from flinkish_sink.target import (
    FIX_WRITE_TASKS,
    SOURCE_POSITION,
    AnyTarget,
    PreCommit,
    ReusedIdsTarget,
    TaskTransaction,
    TransactionId,
)
from flinkish_sink.two_phase_commit import LATE_SUFFIX, EpochOutcome, TwoPhaseCommitCoordinator

logger = logging.getLogger(__name__)


@functools.cache
def _marker_kinds() -> pa.Array:
    """The marker kinds as an Arrow array, built at first use: ``pa.array`` of a Python list
    imports pandas, which the driver's commit runner, never needing it, would pay for."""
    return pa.array(MARKER_KINDS)


#: (options, schema) pairs whose targets this process has checked (and created) already.
_CHECKED: set[tuple[str, str]] = set()

#: Write tasks per epoch above which the sink warns: each holds a PostgreSQL session and a
#: prepared transaction per epoch, a cost that grows with the tasks, not the rows. 64 is the
#: max_prepared_transactions the setup message suggests, below the default max_connections.
SENSIBLE_WRITE_TASKS = 64

#: Queries this process has warned about their number of write tasks.
_WARNED_TASKS: set[str] = set()


def dropped_markers(schema: StructType) -> bool:
    """Whether ``schema`` looks like the source's rows with the marker columns projected
    away, rather than a stateful operator's output (which has an event-time watermark)."""
    names = set(schema.fieldNames())
    return (names >= SOURCE_POSITION and "kind" not in names
            and not any(SPARK_DELAY_KEY in (f.metadata or {}) for f in schema.fields))


def write_task_problem(tasks: int, limit: int) -> str | None:
    """Why ``tasks`` write tasks per epoch are too many for a server holding ``limit``
    prepared transactions, with the fix; None when they are not."""
    if tasks > limit:
        return (f"{tasks} write tasks but PostgreSQL's max_prepared_transactions is {limit}: "
                f"the epoch fails when they pre-commit; {FIX_WRITE_TASKS}")
    if tasks > SENSIBLE_WRITE_TASKS:
        return (f"{tasks} write tasks, more than {SENSIBLE_WRITE_TASKS}: each pays a session "
                f"and a prepared transaction per epoch (PostgreSQL allows {limit} at once); "
                f"{FIX_WRITE_TASKS}")
    return None


#: The checkpoint stores this process holds a claim on, by (location, query), with the run.
_STORES: dict[tuple[str, str], tuple[str | None, CheckpointStore]] = {}


def spark_run_id() -> str | None:
    """In a write task, Spark's ``runId`` of the query (the job group); None outside one."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.getLocalProperty("spark.jobGroup.id") or None


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    task: int
    pre_commits: list[dict[str, Any]] = field(default_factory=list)
    markers: list[list[Any]] = field(default_factory=list)
    rows: int = 0
    late_rows: int = 0
    #: the query run whose task built the message
    run: str | None = field(default_factory=spark_run_id)


def make_target(options: SinkOptions, late: bool = False) -> AnyTarget:
    """The configured target (or, with ``late``, the late-data side output)."""
    return targets.factory(options.target).create(options.target_options, late)


def store_location(options: SinkOptions) -> str:
    assert options.checkpoint_location is not None
    return _store_location(options.checkpoint_location, options.state_location)


def carries_markers(schema: StructType) -> bool:
    """Whether the rows carry every marker column; a ``kind`` alone is the user's data (as
    ``flinkish.windows``' ``result`` and ``late``)."""
    return set(MARKER_FIELDS) <= set(schema.fieldNames())


def _data_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)
    if not carries_markers(schema):
        return arrow
    return pa.schema([f for f in arrow if f.name not in MARKER_COLUMNS])


class FlinkishStreamWriter(DataSourceStreamArrowWriter):
    """Built on the driver once per micro-batch, then pickled to the write tasks."""

    def __init__(self, schema: StructType, raw_options: dict[str, str]) -> None:
        self._options = parse_sink_options(raw_options)
        self._has_markers = carries_markers(schema)
        self._data_schema = _data_schema(schema)
        # flinkish.windows' rows come judged: its ``late`` rows are the late ones
        self._window_output = not self._has_markers and is_window_output(schema.fieldNames())
        self._event_time = (self._options.event_time_column
                            if self._options.event_time_column in schema.fieldNames()
                            and not self._window_output else None)
        if self._event_time is not None:
            kind = schema[self._event_time].dataType.typeName()
            if kind not in ("timestamp", "timestamp_ntz"):
                raise OptionError(
                    f"option eventTimeColumn: column {self._event_time!r} is {kind}, not a "
                    "timestamp; late data is judged on the source's eventTime column")
        upsert_key = self._options[UPSERT_KEY]
        if self._window_output and upsert_key and self._options.late_data is LateData.KEEP:
            raise OptionError(
                f"option upsertKey: flinkish.windows' late rows have no window, so they "
                f"cannot be upserted on {','.join(upsert_key)}; set "
                "lateData=side (with lateData.table) to append them to a table of their own, "
                "or lateData=drop to count and drop them, or write windows.split()'s results "
                "alone")
        self._target = make_target(self._options)
        self._policy = RetryPolicy(self._options.outage_timeout_ms / 1000)
        self._side = make_target(self._options, late=True) if (
            self._options.late_data is LateData.SIDE) else None
        self._schemas = self._table_schemas(schema)
        # a hash, not the options: the DSN may hold a password
        checked = (self._options.fingerprint, self._data_schema.to_string())
        if checked not in _CHECKED:  # Spark builds a writer per batch in one long-lived process
            if dropped_markers(schema):  # said once, not at every batch
                logger.warning(
                    "the flinkish sink got the source's rows without their marker columns "
                    "(kind, watermark, status): it commits exactly once but cannot compute a "
                    "combined watermark or judge late rows. Keep those columns in the "
                    "projection before writeStream (the sink drops them itself)")
            # retried: a fresh Python worker checks again, maybe while the target is away
            for target, kind in ((self._target, "data"), (self._side, "late")):
                if target is not None:
                    self._policy.call(target, "check", functools.partial(
                        target.check, self._schemas[kind]))
            _CHECKED.add(checked)
        self._query = ""
        self._run = uuid.uuid4().hex[:8]  # see TransactionId.run
        # the latest completed epoch's watermarks, for the tasks' late threshold (no valve
        # state: the tasks get a pickled copy)
        self._latest: EpochWatermark | None = None
        # (latest completed, pending) epochs, for a target that must not rewrite a decided one
        self._decided: tuple[int, frozenset[int]] = (-1, frozenset())
        if self._options.guarantee is not DeliveryGuarantee.NONE:
            if not self._options.checkpoint_location:
                raise OptionError(
                    "the flinkish sink needs the query's checkpointLocation: its id names the "
                    "query's transactions and owns the checkpoint store")
            self._query = query_id(self._options.checkpoint_location)
            view = CheckpointStore.reader(CheckpointStorage.open(store_location(self._options)))
            latest = latest_watermark(view)
            if latest is not None:
                self._latest = replace(latest, channels=(), valve=None, partitions={})
            if isinstance(self._target, ReusedIdsTarget):
                completed = view.latest_completed()
                self._decided = (-1 if completed is None else completed.checkpoint_id,
                                 frozenset(view.pending_ids()))

    # -- task side -------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        epoch = int(context.getLocalProperty("streaming.sql.batchId") or 0)
        task, attempt = context.partitionId(), context.attemptNumber()
        exactly_once = self._options.guarantee is DeliveryGuarantee.EXACTLY_ONCE
        threshold = late_threshold(self._latest, epoch)
        late_mode = self._options.late_data
        message = SinkCommitMessage(task)
        open_txns: dict[str, TaskTransaction] = {}
        if exactly_once and (epoch <= self._decided[0] or epoch in self._decided[1]):
            # a replay into a target that reuses its ids: the decided transactions hold the rows
            logger.info("flinkish sink, query %s: epoch %s was decided before; task %s "
                        "writes nothing", self._query, epoch, task)
            for _ in iterator:
                pass
            return message
        if exactly_once:
            self._policy.call(self._target, "recovery before writing",
                              lambda: self._resolve_leftovers(message.run))

        def emit(kind: str, rows: pa.RecordBatch) -> None:
            if rows.num_rows == 0:
                return
            rows = rows.select(self._schemas[kind].names)
            target = self._side if kind == "late" else self._target
            assert target is not None
            if not exactly_once:
                # a retry may write the rows again: at-least-once allows it
                self._policy.call(target, "write", lambda: target.write_direct(rows))
                return
            if kind not in open_txns:
                prefix = self._options.prefix + (LATE_SUFFIX if kind == "late" else "")
                open_txns[kind] = RetriedTransaction(
                    target, TransactionId(prefix, self._query, epoch, task, attempt, self._run),
                    self._schemas[kind], self._policy)
            open_txns[kind].write(rows)

        try:
            for batch in iterator:
                if self._has_markers:  # records are data, markers feed the valve, carriers go
                    kind = batch.column("kind")
                    records = pc.fill_null(pc.equal(kind, KIND_RECORD), True)
                    if not pc.all(records).as_py():  # else nothing to take out: no copy
                        markers = batch.filter(pc.is_in(kind, _marker_kinds()))
                        if markers.num_rows:
                            columns = [markers.column(name).to_pylist() for name in MARKER_FIELDS]
                            message.markers.extend(map(list, zip(*columns, strict=True)))
                        batch = batch.filter(records)
                data = pa.RecordBatch.from_arrays(
                    [batch.column(f.name) for f in self._data_schema], schema=self._data_schema)
                message.rows += data.num_rows
                late = None
                if self._window_output:
                    late = pc.fill_null(pc.equal(batch.column(KIND), LATE), False)
                elif self._event_time is not None:
                    late = late_mask(batch.column(self._event_time), threshold)
                if late is not None:
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
                failpoint("task_write", query=self._query, epoch=epoch)
            message.pre_commits = [t.pre_commit().to_json() for t in open_txns.values()]
        except BaseException:
            for t in open_txns.values():
                try:
                    t.abort()
                except Exception:  # keep the original failure; the driver rolls back leftovers
                    logger.exception("abort after a failed write")
            raise
        return message

    def _table_schemas(self, schema: StructType) -> dict[str, pa.Schema]:
        """The columns of the "data" and "late" tables; where flinkish.windows' results and late
        rows go apart, each leaves out the other's columns (null in all its rows)."""
        split = self._window_output and self._options.late_data is not LateData.KEEP
        late_only = late_columns((f.name, f.metadata) for f in schema.fields) if split else set()
        return {"data": pa.schema([f for f in self._data_schema if f.name not in late_only]),
                "late": pa.schema([f for f in self._data_schema
                                   if not (late_only and f.name in PANE_COLUMNS)])}

    def _resolve_leftovers(self, run: str | None) -> None:
        """Resolve what other writers left pre-committed where it would hold up the writes
        (a prepared transaction's row locks): Flink's recoverAndCommit at ``initializeState``,
        in the task since the driver cannot tell its two writer builds apart
        (docs/architecture.md, "Before a task writes")."""
        if not (self._target.leftovers_block_writes
                or (self._side is not None and self._side.leftovers_block_writes)):
            return
        view = self._coordinator(claim=False)
        if all(txn.run == self._run for txn in view.lingering()):
            return
        if run is None:  # not a micro-batch's task: no run to claim for
            return
        committed, rolled = self._coordinator_over(
            self._open_store(run)).recover_before_writes(self._run)
        logger.warning(
            "flinkish sink, query %s: before writing, resolved what an earlier run left "
            "pre-committed: committed %s (their epochs decided on them), rolled back %s",
            self._query, committed or "none", rolled or "none")

    # -- driver side -----------------------------------------------------------------------

    def _store(self, run: str | None) -> CheckpointStore:
        """This process's claim on the store: kept across a run's epochs, claimed anew by a new
        run (``run`` None: a batch without tasks)."""
        key = (store_location(self._options), self._query)
        held = _STORES.get(key)
        if held is not None and (run is None or held[0] == run):
            return held[1]
        store = self._open_store(run)
        _STORES[key] = (run, store)
        return store

    def _open_store(self, run: str | None) -> CheckpointStore:
        """A claim of the query's store for Spark run ``run``."""
        return CheckpointStore(CheckpointStorage.open(store_location(self._options)),
                               owner=self._query, retain=self._options.retain, run=run)

    def _check_write_tasks(self, tasks: int) -> None:
        """Warn once per query of too many write tasks (:func:`write_task_problem`)."""
        if (self._options.guarantee is not DeliveryGuarantee.EXACTLY_ONCE
                or self._query in _WARNED_TASKS):
            return
        limit = self._target.max_pending()
        problem = None if limit is None else write_task_problem(tasks, limit)
        if problem is not None:
            _WARNED_TASKS.add(self._query)
            logger.warning("flinkish sink, query %s: %s", self._query, problem)

    def _coordinator(self, run: str | None = None, *, claim: bool = True
                     ) -> TwoPhaseCommitCoordinator:
        if claim:
            store = self._store(run)
        else:  # reads only: this process's claim if it holds one, else a view claiming nothing
            held = _STORES.get((store_location(self._options), self._query))
            store = held[1] if held is not None else CheckpointStore.reader(
                CheckpointStorage.open(store_location(self._options)))
        return self._coordinator_over(store)

    def _coordinator_over(self, store: CheckpointStore) -> TwoPhaseCommitCoordinator:
        return TwoPhaseCommitCoordinator(
            store, self._target, self._options.prefix, self._query, side_target=self._side,
            transaction_timeout_s=self._options.transaction_timeout_ms / 1000)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self._options.guarantee is DeliveryGuarantee.NONE:
            return
        received = [m for m in messages if isinstance(m, SinkCommitMessage)]
        run = next((m.run for m in received if m.run), None)
        # without markers, Spark's event-time watermark of the batch is the next best
        spark_watermark = None
        if not self._has_markers and self._options.checkpoint_location:
            spark_watermark = spark_batch_watermark(self._options.checkpoint_location, batchId)

        def commit_epoch() -> EpochOutcome:
            # a retry part-way through is a replay: the recorded decision is finished
            self._check_write_tasks(len(messages))
            return self._coordinator(run).commit_epoch(
                batchId,
                [PreCommit.from_json(p) for m in received for p in m.pre_commits],
                [Marker.from_json(mk) for m in received for mk in m.markers],
                sum(m.rows for m in received),
                sum(m.late_rows for m in received),
                spark_watermark)

        outcome = self._policy.call(self._target, f"commit of epoch {batchId}", commit_epoch)
        logger.info(
            "epoch %s committed: watermark %s, %s rows (%s late)%s", batchId,
            outcome.watermark.watermark, outcome.checkpoint.state["rows"],
            outcome.checkpoint.state["late_rows"], " (replay)" if outcome.replayed else "")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self._options.guarantee is not DeliveryGuarantee.EXACTLY_ONCE:
            return
        pre_commits = [PreCommit.from_json(p) for m in messages
                       if isinstance(m, SinkCommitMessage) for p in m.pre_commits]

        def abort_epoch() -> None:
            # too many write tasks may be why the epoch failed
            self._check_write_tasks(len(messages))
            # abort only reads the store (was the epoch decided?): it claims nothing
            self._coordinator(claim=False).abort_epoch(batchId, pre_commits)

        self._policy.call(self._target, f"abort of epoch {batchId}", abort_epoch)
