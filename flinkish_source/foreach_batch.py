"""The valve for any sink: a ``foreachBatch`` wrapper that applies the valve to each
micro-batch, keeps its state in the checkpoint store, and hands the user function the batch's
records together with the combined watermark and the late-data split.

Records of epoch N whose event time is at or below the combined watermark epoch N-1 committed
are *late* (Flink's ``sideOutputLateData``): they are never dropped here, only classified, so the
user decides where they go.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpointing import CheckpointStorage, CheckpointStore
from checkpointing.failpoints import failpoint
from flinkish_source.epoch_valve import EpochWatermark, Marker, advance, initial
from flinkish_source.valve import MIN_WATERMARK

MARKER_COLUMNS = ("kind", "watermark", "status")
_LAST_TIMESTAMP_MS = (2**63 - 1) // 1000


@dataclass(frozen=True)
class WatermarkedBatch:
    """One micro-batch as the valve sees it."""

    epoch: int
    records: Any  # DataFrame: the batch's record rows, marker columns dropped
    on_time: Any  # DataFrame: records after the previous combined watermark
    late: Any  # DataFrame: records at or below it
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
    """

    def __init__(
        self,
        func: Callable[[WatermarkedBatch], None],
        checkpoint_location: str,
        *,
        state_location: str | None = None,
        event_time_column: str = "eventTime",
        retain: int = 100,
    ) -> None:
        self._func = func
        self._checkpoint = checkpoint_location
        self._location = state_location or checkpoint_location.rstrip("/") + "/flinkish"
        self._event_time = event_time_column
        self._retain = retain
        self._store: CheckpointStore | None = None

    def _open(self) -> CheckpointStore:
        if self._store is None:
            from flinkish_sink.options import query_id

            self._store = CheckpointStore(
                CheckpointStorage.open(self._location),
                owner=query_id(self._checkpoint), retain=self._retain,
            )
        return self._store

    def __call__(self, df: Any, epoch: int) -> None:
        from pyspark.sql import functions as F

        store = self._open()
        if "kind" not in df.columns:
            raise ValueError(
                "ValveForEachBatch needs the flinkish source's marker rows (column 'kind'); "
                "apply it to the source's output before dropping or filtering them"
            )
        df = df.persist()
        try:
            done = store.completed(epoch)
            if done is not None:
                result = EpochWatermark.from_json(done.state["watermark"])
            else:
                rows = (
                    df.filter(F.col("kind") != "record")
                    .select("topic", "partition", "offset", "kind", "watermark", "status")
                    .collect()
                )
                previous = store.latest_completed()
                result = advance(
                    initial() if previous is None
                    else EpochWatermark.from_json(previous.state["watermark"]),
                    epoch,
                    (Marker(*row) for row in rows),
                )
            records = df.filter(F.col("kind") == "record").drop(*MARKER_COLUMNS)
            threshold = result.previous_watermark
            if threshold == MIN_WATERMARK or self._event_time not in records.columns:
                is_late = F.lit(False)
            elif threshold >= _LAST_TIMESTAMP_MS:  # e.g. MAX_WATERMARK: every partition ended
                is_late = F.col(self._event_time).isNotNull()
            else:
                is_late = F.coalesce(
                    F.col(self._event_time) <= F.timestamp_millis(F.lit(threshold)), F.lit(False)
                )
            counts = records.agg(
                F.count(F.lit(1)).alias("rows"),
                F.sum(F.when(is_late, 1).otherwise(0)).alias("late"),
            ).first()
            total = int(counts["rows"]) if counts else 0
            late_rows = int(counts["late"] or 0) if counts else 0
            self._func(
                WatermarkedBatch(
                    epoch, records, records.filter(~is_late), records.filter(is_late), result,
                    total, late_rows,
                )
            )
            if done is None:
                store.complete(
                    epoch, {"watermark": result.to_json(), "rows": total, "late_rows": late_rows}
                )
                failpoint("foreach_batch_completed")
        finally:
            df.unpersist()
