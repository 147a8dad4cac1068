"""Plans micro-batches: which offsets each Kafka partition reads, and its idle/active status.

Pure functions of (journaled start offset, what the cluster holds, the clock): everything a read
task needs to reproduce its records and markers on replay goes into the end offset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from flinkish_core.watermark import WatermarkStatus
from flinkish_source.kafka import DataLossError, OffsetRange, TopicPartitionKey
from flinkish_source.options import EARLIEST, LATEST, OptionError, SourceOptions, display
from flinkish_source.partition_reader import SlicePlan
from flinkish_source.watermark_strategy import GeneratorState

FORMAT_VERSION = 1
ACTIVE = WatermarkStatus.ACTIVE.value
IDLE = WatermarkStatus.IDLE.value

StateLoader = Callable[[TopicPartitionKey, int, GeneratorState], GeneratorState]
#: Watermark alignment's say in a batch: given each partition's position, how far each could
#: read and how the batch's budget would be shared (records each could read -> records it
#: reads), the most records some partitions may read (0: held back).
HoldDecider = Callable[
    [Mapping[TopicPartitionKey, int], Mapping[TopicPartitionKey, int],
     Callable[[Mapping[TopicPartitionKey, int]], Mapping[TopicPartitionKey, int]]],
    Mapping[TopicPartitionKey, int],
]


@dataclass(frozen=True)
class PartitionPosition:
    """One partition's entry in a journaled offset."""

    offset: int
    first: int  # where the partition entered the query: the start of its first slice
    status: str | None  # None until the partition has been announced downstream
    progress_at: int  # processing time (ms) the partition was last seen to get new records
    seen: int  # the latest offset seen then
    base: GeneratorState | None  # generator state at the start of the partition's last slice
    stop: int | None  # ending offset of a bounded partition
    held: bool = False  # held back by watermark alignment in the batch this offset ends
    capped: bool = False  # read less than its share then, to stay within the alignment drift

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"offset": self.offset, "first": self.first,
                               "progressAt": self.progress_at, "seen": self.seen}
        optional = {"status": self.status, "base": self.base.to_json() if self.base else None,
                    "stop": self.stop, "held": self.held or None, "capped": self.capped or None}
        out.update((k, v) for k, v in optional.items() if v is not None)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionPosition:
        return cls(
            offset=int(data["offset"]),
            first=int(data["first"]),
            status=data.get("status"),
            progress_at=int(data["progressAt"]),
            seen=int(data["seen"]),
            base=GeneratorState.from_json(data["base"]) if "base" in data else None,
            stop=int(data["stop"]) if "stop" in data else None,
            held=bool(data.get("held", False)),
            capped=bool(data.get("capped", False)),
        )


Positions = dict[TopicPartitionKey, PartitionPosition]


def to_json(positions: Positions) -> dict[str, Any]:
    topics: dict[str, dict[str, Any]] = {}
    for (topic, part), pos in sorted(positions.items()):
        topics.setdefault(topic, {})[str(part)] = pos.to_json()
    return {"version": FORMAT_VERSION, "topics": topics}


def from_json(data: Mapping[str, Any]) -> Positions:
    if data.get("version") != FORMAT_VERSION or not isinstance(data.get("topics"), dict):
        raise ValueError(
            f"not a flinkish source offset (version {FORMAT_VERSION}): {str(dict(data))[:200]}"
        )
    return {
        (topic, int(part)): PartitionPosition.from_json(entry)
        for topic, parts in data["topics"].items()
        for part, entry in parts.items()
    }


def per_partition(
    key: str, wanted: dict[str, dict[int, int]], partitions: list[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    """An option's per-partition values (offsets or times), which must name every partition
    of the query exactly."""
    given = {(t, p): o for t, parts in wanted.items() for p, o in parts.items()}
    missing = sorted(set(partitions) - set(given))
    unknown = sorted(set(given) - set(partitions))
    if missing or unknown:
        raise OptionError(
            f"option {display(key)} must name every partition of the query exactly: "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and unknown else "")
            + (f"not in the query or not in Kafka: {unknown}" if unknown else "")
        )
    return given


class OffsetPlanner:
    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def initial(
        self, partitions: list[TopicPartitionKey], ranges: Mapping[TopicPartitionKey, OffsetRange],
        now_ms: int, starts: Mapping[TopicPartitionKey, int] | None = None,
        stops_at: Mapping[TopicPartitionKey, int] | None = None,
    ) -> Positions:
        """Positions before the first batch, from startingOffsets / endingOffsets, or from the
        offsets the starting / ending times resolved to (``starts``, ``stops_at``)."""
        options = self._options
        starting = options.offsets.starting
        specific = per_partition("startingoffsets", starting, partitions) if isinstance(
            starting, dict) else {}
        if starts is not None:
            specific = dict(starts)
        ending: Any = options.offsets.ending
        stops = per_partition("endingoffsets", ending, partitions) if isinstance(
            ending, dict) else {}
        if stops_at is not None:
            ending, stops = "times", dict(stops_at)
        positions: Positions = {}
        for tp in partitions:
            r = ranges[tp]
            wanted = specific.get(tp, EARLIEST if starting == "earliest" else LATEST)
            offset = r.earliest if wanted == EARLIEST else r.latest if wanted == LATEST else wanted
            if offset < r.earliest:
                if options.offsets.fail_on_data_loss:
                    raise DataLossError(
                        f"startingOffsets for {tp[0]}/{tp[1]} is {offset} but the partition "
                        f"starts at {r.earliest} (older records were deleted); set "
                        "failOnDataLoss=false to start at the earliest offset left"
                    )
                offset = r.earliest
            stop = None
            if ending is not None:
                stop = stops.get(tp, LATEST)
                stop = r.latest if stop == LATEST else max(stop, offset)
            positions[tp] = self._new(offset, r.latest, now_ms, stop)
        return positions

    def _new(self, offset: int, latest: int, now_ms: int, stop: int | None) -> PartitionPosition:
        base = GeneratorState(offset) if self._options.event_time.needs_state else None
        return PartitionPosition(offset, offset, None, now_ms, latest, base, stop)

    def latest(
        self,
        start: Positions,
        partitions: list[TopicPartitionKey],
        ranges: Mapping[TopicPartitionKey, OffsetRange],
        now_ms: int,
        limit: int | None = None,
        target: Mapping[TopicPartitionKey, int] | None = None,
        load_state: StateLoader | None = None,
        hold: HoldDecider | None = None,
    ) -> Positions:
        """The end offset of the next batch (``start`` when there is nothing to do): ``limit``
        (maxOffsetsPerTrigger) shared by backlog, ``target`` per partition (Trigger.AvailableNow),
        ``hold`` from watermark alignment."""
        options = self._options
        current = set(partitions)
        vanished = sorted(tp for tp in start if tp not in current)
        if vanished and options.offsets.fail_on_data_loss:
            raise DataLossError(
                f"partitions {vanished} disappeared from Kafka (topic deleted?); set "
                "failOnDataLoss=false to go on without them"
            )
        positions: Positions = {tp: pos for tp, pos in start.items() if tp in current}
        for tp in partitions:
            if tp not in positions and not options.topics.assign:
                # discovered after the query started: read from its beginning, as Spark does
                stop = ranges[tp].latest if options.offsets.bounded else None
                positions[tp] = self._new(ranges[tp].earliest, ranges[tp].latest, now_ms, stop)

        available: dict[TopicPartitionKey, int] = {}
        for tp, pos in positions.items():
            cap = ranges[tp].latest
            if target is not None:
                cap = min(cap, target.get(tp, pos.offset))
            if pos.stop is not None:
                cap = min(cap, pos.stop)
            available[tp] = max(cap, pos.offset)
        lags = {tp: available[tp] - pos.offset for tp, pos in positions.items()}
        limits = hold({tp: pos.offset for tp, pos in positions.items()}, available,
                      lambda wanted: _prorate(dict(wanted), limit)) if hold is not None else {}
        admitted = _prorate({tp: min(lag, limits.get(tp, lag)) for tp, lag in lags.items()},
                            limit)
        held = {tp for tp, most in limits.items() if most == 0 and lags.get(tp, 0) > 0}
        # capped: reads less than its share of the budget without the limits
        share = _prorate({tp: 0 if tp in held else lag for tp, lag in lags.items()}, limit)
        capped = {tp for tp in limits if tp not in held and admitted[tp] < share[tp]}

        end: Positions = {}
        for tp, pos in positions.items():
            offset = pos.offset + admitted[tp]
            progress_at, seen = pos.progress_at, pos.seen
            if available[tp] > seen:
                progress_at, seen = now_ms, available[tp]
            status = ACTIVE if (pos.status is None or offset > pos.offset) else pos.status
            idle_timeout = options.event_time.idle_timeout_ms
            finished = pos.stop is not None and offset >= pos.stop
            if (idle_timeout is not None and not finished and offset == available[tp]
                    and now_ms - progress_at >= idle_timeout):
                status = IDLE
            base = pos.base
            has_slice = offset > pos.offset or status != pos.status
            if has_slice and base is not None and base.at != pos.offset:
                # Only a slice needs its start state; loading it for a quiet partition would
                # change the offset and make Spark run an empty batch.
                if load_state is None:
                    raise RuntimeError("generator state is needed but no loader was given")
                base = load_state(tp, pos.offset, base)
            end[tp] = replace(
                pos, offset=offset, status=status, progress_at=progress_at, seen=seen, base=base,
                held=tp in held, capped=tp in capped,
            )
        return end

    @staticmethod
    def slices(start: Positions, end: Positions) -> list[SlicePlan]:
        """What each partition's read task does for the batch (start, end]; a pure function of
        the two journaled offsets, as Spark requires for replay.

        A partition nothing was read from yet starts at its ``first`` offset as ``end`` journals it:
        Spark asks ``initialOffset`` again for the first batch's start when it runs it (and after a
        restart), and under ``startingOffsets=latest`` that answer has moved on."""
        plans = []
        for tp, pos in sorted(end.items()):
            before = start.get(tp)
            if before is not None and before.status is None:
                before = None
            first = before.offset if before is not None else pos.first
            start_status = before.status if before is not None else None
            if pos.offset == first and pos.status == start_status:
                continue
            plans.append(SlicePlan(tp[0], tp[1], first, pos.offset, start_status,
                                   pos.status or ACTIVE, pos.base, pos.stop))
        return plans


def _prorate(lags: dict[TopicPartitionKey, int], limit: int | None) -> dict[TopicPartitionKey, int]:
    """Share ``limit`` records between partitions in proportion to their backlog, exactly."""
    total = sum(lags.values())
    if limit is None or total <= limit:
        return dict(lags)
    shares = {tp: lag * limit // total for tp, lag in lags.items()}
    left = limit - sum(shares.values())
    for tp in sorted(lags, key=lambda tp: (-(lags[tp] * limit % total), tp)):
        if left == 0:
            break
        if shares[tp] < lags[tp]:
            shares[tp] += 1
            left -= 1
    return shares
