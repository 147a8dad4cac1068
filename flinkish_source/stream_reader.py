"""The Spark adapter: PySpark's ``DataSourceStreamReader`` over the pure planner and reader.

Driver-side calls run in one long-lived Python process per query; ``read`` runs in executor
workers on a separately pickled copy, so Kafka clients are created lazily and never pickled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
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

from flinkish_core.epoch_valve import EpochWatermark
from flinkish_core.errors import OptionError
from flinkish_core.watermark import MIN_WATERMARK
from flinkish_source import watermark_alignment as alignment
from flinkish_source.combined_watermark import (
    OFFSET_KEY,
    PlanningValve,
    carrier,
    closing_carrier,
    combined_after,
    delivered,
    horizon_limit,
    journal,
)
from flinkish_source.epoch_notices import NoticeListener, canonical
from flinkish_source.kafka import KafkaMetadata, TopicPartitionKey
from flinkish_source.kafka.group_offsets import GroupOffsetCommitter
from flinkish_source.kafka.metadata import OffsetRange
from flinkish_source.kafka.offsets_by_time import offsets_for_times
from flinkish_source.offset_planner import (
    OffsetPlanner,
    Positions,
    from_json,
    per_partition,
    to_json,
)
from flinkish_source.options import SourceOptions
from flinkish_source.partition_reader import ReadTask, SlicePlan, read_slice, read_task
from flinkish_source.read_plan import plan_read_tasks
from flinkish_source.source_state import SourceStateStore
from flinkish_source.watermark_strategy import GeneratorState

logger = logging.getLogger(__name__)


class ReadTaskInputPartition(InputPartition):
    """One read task: its pieces of slices, the batch's carrier watermark if it yields the
    carrier row, and in a closing batch the batch's end offset (the task that finishes last
    carries the watermark after the batch)."""

    def __init__(self, task: ReadTask, carrier: int | None = None,
                 closing: dict | None = None) -> None:
        super().__init__(task.index)
        self.task = task
        self.carrier = carrier
        self.closing = closing


class CarrierInputPartition(InputPartition):
    """The batch's carrier row (see :mod:`flinkish_source.combined_watermark`)."""

    def __init__(self, watermark: int) -> None:
        super().__init__(watermark)
        self.watermark = watermark


def _now_ms() -> int:
    return int(time.time() * 1000)


def _selection(options: SourceOptions) -> str:
    topics = options.topics
    if topics.subscribe:
        return "subscribe=" + ",".join(topics.subscribe)
    if topics.pattern is not None:
        return f"subscribePattern={topics.pattern}"
    return "assign=" + ",".join(f"{t}/{p}" for t, p in topics.assign)


def warn_missing_topics(options: SourceOptions, partitions: list[TopicPartitionKey]) -> None:
    """Say, at every planning, which subscribed topics Kafka does not have (yet): the source
    waits for them and reads them from their start once they appear."""
    if options.topics.subscribe:
        present = {t for t, _ in partitions}
        missing = [t for t in options.topics.subscribe if t not in present]
        if missing:
            logger.warning(
                "subscribed topics %s do not exist in Kafka (yet): nothing is read from them; "
                "they are read from their start once they appear", missing,
            )
    elif options.topics.pattern is not None and not partitions:
        logger.warning("no topic in Kafka matches subscribePattern=%s (yet)",
                       options.topics.pattern)


#: The reader's attributes that stay on the driver (None in the copy pickled to the executors)
_DRIVER_ONLY = ("_prepared", "_initial", "_metadata", "_state_store", "_committer", "_notices")


class FlinkishStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._planner = OffsetPlanner(options)
        self._metadata: KafkaMetadata | None = None
        self._target: dict[TopicPartitionKey, int] | None = None
        self._state_store: SourceStateStore | None = None
        self._committer: GroupOffsetCommitter | None = None
        self._notices: NoticeListener | None = None
        self._last_trigger_ms = 0  # Spark's lastTriggerMillis: 0 never delays the first batch
        self._latest: dict[TopicPartitionKey, int] = {}
        # prepareForTriggerAvailableNow's view of the cluster, for the initialOffset after it
        self._prepared: tuple[list[TopicPartitionKey], dict[TopicPartitionKey, Any]] | None = None
        # the first answer of initialOffset: Spark asks again when it runs the first batch
        # (and at each trigger until it plans one), and the query starts where it first said
        self._initial: dict | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What the read tasks get: none of the driver's clients, caches or listeners."""
        return {**self.__dict__, **dict.fromkeys(_DRIVER_ONLY)}

    @property
    def _store(self) -> SourceStateStore:
        """The driver's view of the recorded generator states and markers (it keeps an index
        of the read tasks' records across batches)."""
        if self._state_store is None:
            assert self._options.state_location is not None
            self._state_store = SourceStateStore(self._options.state_location)
        return self._state_store

    @property
    def metadata(self) -> KafkaMetadata:
        if self._metadata is None:
            self._metadata = KafkaMetadata(self._options)
        return self._metadata

    def _cluster(self, *, exact: bool = True
                 ) -> tuple[list[TopicPartitionKey], dict[TopicPartitionKey, Any]]:
        """The partitions and their offset ranges; ``exact=False`` for planning a batch of a
        running query (see :meth:`KafkaMetadata.offset_ranges`)."""
        partitions = self.metadata.partitions()
        warn_missing_topics(self._options, partitions)
        return partitions, self.metadata.offset_ranges(partitions, exact=exact)

    def initialOffset(self) -> dict:
        if self._initial is not None:
            return self._initial
        prepared, self._prepared = self._prepared, None
        partitions, ranges = prepared if prepared is not None else self._cluster()
        if self._options.topics.assign:
            missing = sorted(set(self._options.topics.assign) - set(partitions))
            if missing and self._options.offsets.fail_on_data_loss:
                from flinkish_source.kafka import DataLossError

                raise DataLossError(
                    f"assigned partitions {missing} do not exist in Kafka; create them or fix "
                    "the assign option (failOnDataLoss=false starts without them)"
                )
        bounds = self._options.offsets
        starts = self._offsets_at_times(bounds.starting_times, "starting", partitions, ranges)
        stops = self._offsets_at_times(bounds.ending_times, "ending", partitions, ranges)
        self._initial = to_json(self._planner.initial(partitions, ranges, _now_ms(), starts, stops))
        return self._initial

    def _offsets_at_times(
        self, times: int | dict[str, dict[int, int]] | None, which: str,
        partitions: list[TopicPartitionKey], ranges: Mapping[TopicPartitionKey, OffsetRange],
    ) -> dict[TopicPartitionKey, int] | None:
        """Where the starting (or ending) time puts each partition: its first record at or
        after the time; where there is none, the partition's end, or (starting, with
        ``startingOffsetsByTimestampStrategy=error``, Spark's default) an error."""
        if times is None:
            return None
        wanted = ({tp: times for tp in partitions} if isinstance(times, int) else
                  per_partition(f"{which}offsetsbytimestamp", times, partitions))
        out: dict[TopicPartitionKey, int] = {}
        for tp, offset in offsets_for_times(self._options, self.metadata, wanted,
                                            ranges).items():
            if offset is not None:
                out[tp] = offset
            elif which == "ending" or self._options.offsets.starting_times_latest:
                out[tp] = ranges[tp].latest
            else:
                raise OptionError(
                    f"{tp[0]}/{tp[1]} has no record at or after the starting time "
                    f"{wanted[tp]} (epoch ms): set startingOffsetsByTimestampStrategy=latest "
                    "to start such partitions at their end, or choose an earlier time"
                )
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self._options.admission.max_offsets_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._prepared = self._cluster()
        ranges = self._prepared[1]
        self._target = {tp: r.latest for tp, r in ranges.items()}
        if not any(r.latest > r.earliest for r in ranges.values()):
            logger.warning(
                "Trigger.AvailableNow: nothing to read in %s (%s partitions, all empty): the "
                "query will end without reading a record", _selection(self._options),
                len(ranges),
            )

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        # Spark plans from an epoch's end only once the epoch is in its commit log; the
        # query's initial offset ends no epoch
        if start != self._initial:
            self._commit_to_group(start)
        offset = self._latest_offset(start, limit)
        if self._options.kafka.commit_group is not None and offset != start:
            self._expect_notice(offset)
        return offset

    def _latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        self._prepared = None
        partitions, ranges = self._cluster(exact=False)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        positions = from_json(start)
        if self._options.state_location is not None:
            self._store.new_round()
        combined = combined_after(self._options, start, positions, self._store) if (
            self._options.event_time.needs_state) else None
        hold = None
        drift = self._options.event_time.alignment_max_drift_ms
        if combined is not None and drift is not None:
            def hold(offsets: Any, available: Any, share: Any) -> Mapping[TopicPartitionKey, int]:
                return alignment.decide(
                    combined, offsets, available, drift,
                    lambda tp: alignment.pace_at(self._store, tp, offsets[tp]), share).limits
        now = _now_ms()
        end = self._planner.latest(positions, partitions, ranges, now, max_rows, self._target,
                                   self._load_state, hold)
        self._latest = {tp: r.latest for tp, r in ranges.items()}
        if self._delay_batch(positions, end, now):
            return start
        offset = to_json(end)
        if combined is not None:
            offset[OFFSET_KEY] = self._planning_valve(start, positions, end, combined,
                                                      self._closing(end))
        return offset

    def _commit_to_group(self, end: dict, notice: bool = False) -> None:
        """Commit the epoch that ends at ``end`` to the query's consumer group, if it names one
        (:mod:`flinkish_source.kafka.group_offsets`)."""
        if self._options.kafka.commit_group is None:
            return
        self._group.epoch_committed(
            canonical(end), {tp: pos.offset for tp, pos in from_json(end).items()}, notice)

    @property
    def _group(self) -> GroupOffsetCommitter:
        if self._committer is None:
            self._committer = GroupOffsetCommitter(self._options.kafka)
        return self._committer

    def _expect_notice(self, end: dict) -> None:
        """Spark is about to run the batch that ends at ``end``: the query's listener may say
        when Spark has committed it; listen for that from the first batch on."""
        self._group.planned(canonical(end))
        if self._notices is None:
            self._notices = NoticeListener(self._on_notice)

    def _on_notice(self, end: Any) -> None:
        """The query's listener says Spark committed the epoch that ends at ``end``: any
        flinkish query's on this machine, so first whether this reader planned it."""
        if self._group.expects(canonical(end)):
            self._commit_to_group(end, notice=True)

    def _closing(self, end: Positions) -> bool:
        """Whether the batch ending at ``end`` ends the input for now: every partition at
        Trigger.AvailableNow's target or at its stop (``endingOffsets``)."""
        target = self._target
        return bool(end) and all(
            (pos.stop is not None and pos.offset >= pos.stop)
            or (target is not None and pos.offset >= target.get(tp, pos.offset))
            for tp, pos in end.items())

    def _delay_batch(self, positions: Positions, end: Positions, now: int) -> bool:
        """Spark's ``minOffsetsPerTrigger``/``maxTriggerDelay`` (not under Trigger.AvailableNow,
        which reads to its target); status and carrier-only batches wait too."""
        minimum = self._options.admission.min_offsets_per_trigger
        if minimum is None or self._target is not None:
            return False
        admitted = sum(pos.offset - positions[tp].offset if tp in positions else
                       pos.offset - pos.first for tp, pos in end.items())
        waited = now - self._last_trigger_ms
        if admitted < minimum and waited < self._options.admission.max_trigger_delay_ms:
            return True
        self._last_trigger_ms = now
        return False

    def _planning_valve(self, start: dict, positions: Positions, end: Positions,
                        combined: EpochWatermark, closing: bool) -> dict:
        """The planning-time valve entry of the end offset: the combined watermark after the batch
        ``start`` ends, with this batch's slices; or, when this batch reads nothing and Spark has
        that watermark already, ``start``'s own entry, so a quiet topic plans no batch."""
        slices = OffsetPlanner.slices(positions, end)
        journaled = PlanningValve.from_offset(start)
        if not slices and OFFSET_KEY in start and (
                journaled.before.watermark == combined.watermark
                or delivered(start, combined, self._store)):
            return dict(start[OFFSET_KEY])
        return journal(combined, slices, closing=closing and bool(slices))

    def reportLatestOffset(self) -> dict | None:
        """What Kafka holds, as of the last planning, in Spark's Kafka source's shape, so a
        listener sees each partition's lag (see ``flinkish.lag``)."""
        if not self._latest:
            return None
        out: dict[str, dict[str, int]] = {}
        for (topic, part), latest in sorted(self._latest.items()):
            out.setdefault(topic, {})[str(part)] = latest
        return out

    def _load_state(self, tp: TopicPartitionKey, at: int, base: GeneratorState) -> GeneratorState:
        """The generator state a read task recorded at ``at``; if it is missing (a sink that
        did not consume the whole slice), rebuild it by re-reading the slice here."""
        store = self._store
        state = store.find_state(tp[0], tp[1], at)
        if state is None:
            logger.warning(
                "no watermark state for %s/%s at offset %s in %s: the batch's read task did not "
                "finish its slice; re-reading offsets %s..%s on the driver to rebuild it",
                tp[0], tp[1], at, self._options.state_location, base.at, at - 1,
            )
            plan = SlicePlan(tp[0], tp[1], base.at, at, "ACTIVE", "ACTIVE", base, None)
            for _ in read_slice(self._options, plan):
                pass
            store.partition_file_written(tp[0], tp[1])
            state = store.load(tp[0], tp[1], at)
            assert state is not None
        return state

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """The batch's read tasks; the first also yields the carrier row (a partition of its own
        does when nothing is read). In a closing batch every task learns the batch's end, and what
        an earlier run of the batch delivered is forgotten."""
        plans = OffsetPlanner.slices(from_json(start), from_json(end))
        journaled = PlanningValve.from_offset(end)
        watermark = journaled.before.watermark if OFFSET_KEY in end else MIN_WATERMARK
        if watermark != MIN_WATERMARK:
            horizon = horizon_limit(watermark, self._options.event_time.horizon_ms)
            plans = [replace(plan, horizon=horizon) for plan in plans]
        tasks = plan_read_tasks(self._options, plans)
        carried = None if watermark == MIN_WATERMARK else watermark
        if not tasks:
            return [] if carried is None else [CarrierInputPartition(carried)]
        closing = end if journaled.closing else None
        if closing is not None:
            self._store.forget_closing()
        return [ReadTaskInputPartition(task, carried if task.index == 0 else None, closing)
                for task in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, CarrierInputPartition):
            return iter([carrier(self._options.include_headers, partition.watermark,
                                 self._options.event_time.horizon_ms)])
        assert isinstance(partition, ReadTaskInputPartition)
        return self._read_task(partition)

    def _read_task(self, partition: ReadTaskInputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_task(self._options, partition.task)
        if partition.carrier is not None:
            yield carrier(self._options.include_headers, partition.carrier,
                          self._options.event_time.horizon_ms)
        if partition.closing is not None:
            yield from closing_carrier(self._options, partition.closing, self._store)

    def commit(self, end: dict) -> None:
        """Spark will never plan from before ``end`` again: forget older generator states. The
        consumer group has that epoch already (``latestOffset`` planned from ``end`` first)."""
        if self._options.state_location is None:
            return
        positions: Positions = from_json(end)
        self._store.prune_all({tp: pos.base.at for tp, pos in positions.items()
                               if pos.base is not None})

    def stop(self) -> None:
        if self._notices is not None:
            self._notices.close()
            self._notices = None
        if self._committer is not None:
            self._committer.close()
            self._committer = None
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None
