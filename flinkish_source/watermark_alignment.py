"""Watermark alignment (Flink's FLIP-182 / FLIP-217): hold back partitions that run ahead.

Decided when a batch is planned, from the valve's per-partition watermarks, and journaled in
the offset, so a replay plans the same batch. The reference leaves out the partitions that cannot
advance, and the partitions not held read up to a common event-time *level*, each by its *pace*:
docs/semantics.md, "Watermark alignment (FLIP-182 / FLIP-217)".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from flinkish_core.epoch_valve import EpochWatermark, channel_name
from flinkish_core.watermark import MIN_WATERMARK, WatermarkStatus
from flinkish_source.kafka.base import TopicPartitionKey
from flinkish_source.source_state import SourceStateStore

#: Shares a batch's budget: records each partition could read -> records it reads.
Share = Callable[[Mapping[TopicPartitionKey, int]], Mapping[TopicPartitionKey, int]]
#: A partition's pace (event-time milliseconds per offset; None: not known).
Pace = Callable[[TopicPartitionKey], float | None]


@dataclass(frozen=True)
class AlignmentDecision:
    """Which partitions a batch holds back or limits, and against which watermark."""

    reference: int | None  # min watermark of the partitions still catching up (None: none)
    held: frozenset[TopicPartitionKey]  # read nothing in this batch
    # read at most this many records in this batch (held partitions: 0)
    limits: Mapping[TopicPartitionKey, int] = field(default_factory=dict)


def decide(
    combined: EpochWatermark,
    offsets: Mapping[TopicPartitionKey, int],
    available: Mapping[TopicPartitionKey, int],
    max_drift_ms: int,
    pace: Pace | None = None,
    share: Share | None = None,
) -> AlignmentDecision:
    """The partitions to hold back when planning from ``offsets`` with ``available`` (how far
    each could read), given the valve state ``combined``; with ``pace`` and ``share``, the limits
    of the partitions that are not held."""
    snapshot = combined.valve
    if snapshot is None:
        return AlignmentDecision(None, frozenset())
    index = {name: i for i, name in enumerate(combined.channels)}
    watermarks: dict[TopicPartitionKey, int] = {}
    for tp in offsets:
        i = index.get(channel_name(*tp))
        if i is None:
            continue  # not announced yet: no watermark, nothing to hold it against
        wm, status, _aligned = snapshot["channels"][i]
        if status == WatermarkStatus.ACTIVE.value and available.get(tp, 0) > offsets[tp]:
            watermarks[tp] = int(wm)
    if not watermarks:
        return AlignmentDecision(None, frozenset())
    reference = min(watermarks.values())  # MIN_WATERMARK while one has not read anything yet
    held = {tp for tp, wm in watermarks.items() if wm > reference + max_drift_ms}
    limits = {tp: 0 for tp in held}
    if pace is not None and share is not None:
        lags = {tp: 0 if tp in held else available.get(tp, offsets[tp]) - offsets[tp]
                for tp in offsets}
        admitted = share(lags)
        free = {tp: wm for tp, wm in watermarks.items() if tp not in held}
        paces = {tp: pace(tp) for tp in free}
        known = {tp: p for tp, p in paces.items() if p is not None and p > 0}
        if len(known) == len(free) and reference > MIN_WATERMARK:
            most = _levelled(watermarks, free, known, lags, admitted, max_drift_ms)
            # the rest keep their share of the budget, so the levelled reads fit beside them
            most.update({tp: admitted.get(tp, 0) for tp in offsets
                         if tp not in free and tp not in held})
        else:
            most = _within_drift(watermarks, free, paces, lags, admitted, max_drift_ms)
        for tp, records in most.items():
            if records < lags[tp]:
                limits[tp] = records
                if records == 0 and tp in free:
                    held.add(tp)
    return AlignmentDecision(reference, frozenset(held), limits)


def _levelled(
    watermarks: Mapping[TopicPartitionKey, int],
    free: Mapping[TopicPartitionKey, int],
    paces: Mapping[TopicPartitionKey, float],
    lags: Mapping[TopicPartitionKey, int],
    admitted: Mapping[TopicPartitionKey, int],
    max_drift_ms: int,
) -> dict[TopicPartitionKey, int]:
    """Every pace known: the partitions not held read up to one common event-time level, the
    highest the budget reaches when it binds, else the drift past where the first runs out of
    records; within the drift of the held ones, and the slowest always reads."""
    def records_to(level: int, tp: TopicPartitionKey) -> int:
        return min(lags[tp], max(0, int((level - free[tp]) // paces[tp])))

    ends = {tp: int(free[tp] + lags[tp] * paces[tp]) for tp in free}  # all read
    still = [wm for tp, wm in watermarks.items() if tp not in free]  # held: they stay there
    ceiling = min(still) + max_drift_ms if still else None
    budget = sum(admitted.get(tp, 0) for tp in free)
    if budget >= sum(lags[tp] for tp in free):
        level = min([*ends.values(), *still]) + max_drift_ms
        most = {tp: records_to(level, tp) for tp in free}
    else:
        low = min(free.values())  # reaches nothing
        high = max(ends.values()) + 1  # reaches every record
        while high - low > 1:
            middle = (low + high) // 2
            if sum(records_to(middle, tp) for tp in free) <= budget:
                low = middle
            else:
                high = middle
        level = low if ceiling is None else min(low, ceiling)
        most = {tp: records_to(level, tp) for tp in free}
        # what whole records leave of the budget goes to the partitions whose next record
        # reaches the lowest event time
        left = budget - sum(most.values())
        for tp in sorted(free, key=lambda tp: (free[tp] + (most[tp] + 1) * paces[tp], tp)):
            if left <= 0:
                break
            if most[tp] < lags[tp] and (
                    ceiling is None or free[tp] + (most[tp] + 1) * paces[tp] <= ceiling):
                most[tp] += 1
                left -= 1
    slowest = min(free, key=lambda tp: (free[tp], tp))
    if most[slowest] == 0 and lags[slowest] > 0:
        most[slowest] = 1
        others = [tp for tp in most if tp != slowest and most[tp] > 0]
        if others and sum(most.values()) > budget:  # the record comes from the largest read
            most[max(others, key=lambda tp: (most[tp], tp))] -= 1
    return most


def _within_drift(
    watermarks: Mapping[TopicPartitionKey, int],
    free: Mapping[TopicPartitionKey, int],
    paces: Mapping[TopicPartitionKey, float | None],
    lags: Mapping[TopicPartitionKey, int],
    admitted: Mapping[TopicPartitionKey, int],
    max_drift_ms: int,
) -> dict[TopicPartitionKey, int]:
    """Some pace unknown: a partition with a pace reads at most what keeps it within the drift
    of where the slowest is expected after the batch (one without a pace: where it is now)."""
    after = min(wm + admitted.get(tp, 0) * (paces.get(tp) or 0)
                for tp, wm in watermarks.items())
    most = {}
    for tp, tp_pace in paces.items():
        if tp_pace is not None and tp_pace > 0:
            most[tp] = min(lags[tp], max(0, int((after + max_drift_ms - free[tp]) // tp_pace)))
    return most


def pace_at(store: SourceStateStore, tp: TopicPartitionKey, at: int) -> float | None:
    """Event-time milliseconds per offset over the partition's last slice (ending at ``at``);
    None when unknown."""
    topic, partition = tp
    state = store.find_state(topic, partition, at)
    if state is None:
        return None
    slices = [o for o in store.find_outcomes(topic, partition, at)
              if o.start < at and o.min_event_time is not None]
    if not slices:
        return None
    last = max(slices, key=lambda o: o.start)
    assert last.min_event_time is not None
    span = state.max_timestamp - last.min_event_time
    return span / (at - last.start) if span > 0 else None
