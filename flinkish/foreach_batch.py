"""The valve for any sink: a ``foreachBatch`` wrapper that applies the valve to each
micro-batch and hands the user function its records with the combined watermark and the late
ones (at or below the epoch before's watermark) split off, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpointing import CheckpointStorage, CheckpointStore
from checkpointing.epoch_watermarks import STATE_KEY, advance_epoch, completed_watermark
from checkpointing.failpoints import failpoint
from checkpointing.query import query_id, store_location
from flinkish.batch_errors import spark_safe_errors
from flinkish_core.epoch_valve import EpochWatermark
from flinkish_core.late_data import late_cutoff_us
from flinkish_core.markers import KIND_RECORD, MARKER_COLUMNS, MARKER_FIELDS, MARKER_KINDS, Marker
from flinkish_core.watermark import MIN_WATERMARK


@dataclass(frozen=True)
class WatermarkedBatch:
    """One micro-batch as the valve sees it: what :class:`ValveForEachBatch` hands ``func``.

    Attributes:
        epoch: Spark's batch id.
        records: the batch's record rows, marker columns dropped (a DataFrame).
        on_time: the records after the combined watermark of the epoch before.
        late: the records at or below it.
        watermark: the valve's state after this epoch (its combined watermark and status).
        rows: how many records the batch has.
        late_rows: how many of them are late.
    """

    epoch: int
    records: Any  # DataFrames, these three
    on_time: Any
    late: Any
    watermark: EpochWatermark
    rows: int
    late_rows: int

    @property
    def combined_watermark(self) -> int | None:
        """The combined watermark after this epoch (None while it is Long.MIN_VALUE)."""
        value = self.watermark.watermark
        return None if value == MIN_WATERMARK else value


class ValveForEachBatch:
    """``df.writeStream.foreachBatch(ValveForEachBatch(func, checkpoint_location))``.

    ``checkpoint_location`` is the query's own ``checkpointLocation``: the valve's state lives
    in ``<checkpoint_location>/flinkish`` (or ``state_location``) and is owned by the query's
    id, so two queries cannot share it by mistake. ``func`` may be called again for an epoch
    after a crash (Spark's foreachBatch is at-least-once); it then gets the identical batch,
    watermark and late split, so an idempotent ``func`` gives exactly-once results.

    Args:
        func: called once per epoch with its :class:`WatermarkedBatch`.
        checkpoint_location: the query's ``checkpointLocation``.
        state_location: where the valve's state lives instead (default:
            ``<checkpoint_location>/flinkish``); a local path or a ``pyarrow.fs`` URI.
        event_time_column: the records' event-time column, which the late split reads.
        retain: how many completed epochs the valve's store keeps.
    """

    def __init__(self, func: Callable[[WatermarkedBatch], None], checkpoint_location: str, *,
                 state_location: str | None = None, event_time_column: str = "eventTime",
                 retain: int = 100) -> None:
        self._func = func
        self._checkpoint = checkpoint_location
        self._location = store_location(checkpoint_location, state_location)
        self._event_time = event_time_column
        self._retain = retain
        self._store: CheckpointStore | None = None

    def _open(self) -> CheckpointStore:
        if self._store is None:
            self._store = CheckpointStore(CheckpointStorage.open(self._location),
                                          owner=query_id(self._checkpoint), retain=self._retain)
        return self._store

    def __call__(self, df: Any, epoch: int) -> None:
        with spark_safe_errors():
            self._run(df, epoch)

    def _run(self, df: Any, epoch: int) -> None:
        from pyspark.sql import functions as F

        store = self._open()
        if "kind" not in df.columns:
            raise ValueError(
                "ValveForEachBatch needs the flinkish source's marker rows (column 'kind'); "
                "apply it to the source's output before dropping or filtering them")
        df = df.persist()
        try:
            done = result = completed_watermark(store, epoch)
            if result is None:
                rows = df.filter(F.col("kind").isin(*MARKER_KINDS)).select(*MARKER_FIELDS).collect()
                result = advance_epoch(store, epoch, (Marker(*row) for row in rows))
            records = df.filter(F.col("kind") == KIND_RECORD).drop(*MARKER_COLUMNS)
            cutoff = late_cutoff_us(result.previous_watermark)
            if cutoff is None or self._event_time not in records.columns:
                is_late = F.lit(False)
            else:
                is_late = F.coalesce(F.col(self._event_time) <= F.timestamp_micros(F.lit(cutoff)),
                                     F.lit(False))
            # a global aggregation: one row, its sum null when there is no record
            counts = records.agg(F.count(F.lit(1)).alias("rows"),
                                 F.sum(F.when(is_late, 1).otherwise(0)).alias("late")).first()
            total, late_rows = int(counts["rows"]), int(counts["late"] or 0)
            self._func(WatermarkedBatch(epoch, records, records.filter(~is_late),
                                        records.filter(is_late), result, total, late_rows))
            if done is None:
                store.complete(epoch, {STATE_KEY: result.to_json(), "rows": total,
                                       "late_rows": late_rows})
                failpoint("foreach_batch_completed", query=store.owner, epoch=epoch)
        finally:
            df.unpersist()
