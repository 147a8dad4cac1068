"""The Spark adapter: PySpark's ``DataSourceStreamReader`` over the pure planner and reader.

Driver-side calls (offsets, planning) run in one long-lived Python process per query; ``read``
runs in executor workers on a separately pickled copy, so Kafka clients are created lazily and
never pickled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from flinkish_core.watermark import MIN_WATERMARK
from flinkish_source.combined_watermark import (
    OFFSET_KEY,
    PlanningValve,
    carrier,
    combined_after,
    horizon_limit,
    journal,
)
from flinkish_source.kafka_client import KafkaMetadata, TopicPartitionKey
from flinkish_source.offset_planner import OffsetPlanner, Positions, from_json, to_json
from flinkish_source.options import SourceOptions
from flinkish_source.partition_reader import SlicePlan, read_slice
from flinkish_source.source_state import SourceStateStore
from flinkish_source.watermark_strategy import GeneratorState

logger = logging.getLogger(__name__)


class SliceInputPartition(InputPartition):
    def __init__(self, plan: SlicePlan) -> None:
        super().__init__(plan)
        self.plan = plan


class CarrierInputPartition(InputPartition):
    """The batch's carrier row (see :mod:`flinkish_source.combined_watermark`)."""

    def __init__(self, watermark: int) -> None:
        super().__init__(watermark)
        self.watermark = watermark


def _now_ms() -> int:
    return int(time.time() * 1000)


class FlinkishStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._planner = OffsetPlanner(options)
        self._metadata: KafkaMetadata | None = None
        self._target: dict[TopicPartitionKey, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_metadata"] = None
        return state

    @property
    def metadata(self) -> KafkaMetadata:
        if self._metadata is None:
            self._metadata = KafkaMetadata(self._options)
        return self._metadata

    def _cluster(self) -> tuple[list[TopicPartitionKey], dict[TopicPartitionKey, Any]]:
        partitions = self.metadata.partitions()
        return partitions, self.metadata.offset_ranges(partitions)

    def initialOffset(self) -> dict:
        partitions, ranges = self._cluster()
        if self._options.topics.assign:
            missing = sorted(set(self._options.topics.assign) - set(partitions))
            if missing and self._options.fail_on_data_loss:
                from flinkish_source.kafka_client import DataLossError

                raise DataLossError(
                    f"assigned partitions {missing} do not exist in Kafka; create them or fix "
                    "the assign option (failOnDataLoss=false starts without them)"
                )
        return to_json(self._planner.initial(partitions, ranges, _now_ms()))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self._options.max_offsets_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        _, ranges = self._cluster()
        self._target = {tp: r.latest for tp, r in ranges.items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        partitions, ranges = self._cluster()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        positions = from_json(start)
        end = self._planner.latest(
            positions, partitions, ranges, _now_ms(), max_rows, self._target, self._load_state,
        )
        offset = to_json(end)
        if self._options.needs_state:
            offset[OFFSET_KEY] = self._planning_valve(start, positions, end)
        return offset

    def _planning_valve(self, start: dict, positions: Positions, end: Positions) -> dict:
        """The planning-time valve entry of the end offset: the combined watermark after the
        batch ``start`` ends, with this batch's slices; or, when this batch reads nothing and
        the combined watermark did not move, ``start``'s own entry, so a quiet topic plans no
        batch (the valve state it would have journaled is derived again next time)."""
        combined = combined_after(self._options, start, positions)
        slices = OffsetPlanner.slices(positions, end)
        journaled = PlanningValve.from_offset(start)
        if not slices and OFFSET_KEY in start and (
                journaled.before.watermark == combined.watermark):
            return dict(start[OFFSET_KEY])
        return journal(combined, slices)

    def reportLatestOffset(self) -> dict | None:
        return None

    def _load_state(
        self, tp: TopicPartitionKey, at: int, base: GeneratorState
    ) -> GeneratorState:
        """The generator state a read task recorded at ``at``; if it is missing (a sink that
        did not consume the whole slice), rebuild it by re-reading the slice here."""
        assert self._options.state_location is not None
        store = SourceStateStore(self._options.state_location)
        state = store.load(tp[0], tp[1], at)
        if state is None:
            logger.warning(
                "no watermark state for %s/%s at offset %s in %s: the batch's read task did not "
                "finish its slice; re-reading offsets %s..%s on the driver to rebuild it",
                tp[0], tp[1], at, self._options.state_location, base.at, at - 1,
            )
            plan = SlicePlan(tp[0], tp[1], base.at, at, "ACTIVE", "ACTIVE", base, None)
            for _ in read_slice(self._options, plan):
                pass
            state = store.load(tp[0], tp[1], at)
            assert state is not None
        return state

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        plans = OffsetPlanner.slices(from_json(start), from_json(end))
        if OFFSET_KEY not in end:
            return [SliceInputPartition(plan) for plan in plans]
        watermark = PlanningValve.from_offset(end).before.watermark
        if watermark == MIN_WATERMARK:
            return [SliceInputPartition(plan) for plan in plans]
        horizon = horizon_limit(watermark, self._options.horizon_ms)
        return [SliceInputPartition(replace(plan, horizon=horizon)) for plan in plans] + [
            CarrierInputPartition(watermark)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, CarrierInputPartition):
            return iter([carrier(self._options.include_headers, partition.watermark,
                                 self._options.horizon_ms)])
        assert isinstance(partition, SliceInputPartition)
        return read_slice(self._options, partition.plan)

    def commit(self, end: dict) -> None:
        """Spark will never plan from before ``end`` again: forget older generator states."""
        if self._options.state_location is None:
            return
        store = SourceStateStore(self._options.state_location)
        positions: Positions = from_json(end)
        for (topic, part), pos in positions.items():
            if pos.base is not None:
                store.prune(topic, part, pos.base.at)

    def stop(self) -> None:
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None
