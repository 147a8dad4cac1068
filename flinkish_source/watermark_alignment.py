"""Watermark alignment (Flink's FLIP-182 / FLIP-217): hold back partitions that run ahead.

A partition whose watermark is more than ``watermark.alignment.maxDrift`` ahead of the
partitions still catching up gets no new records in the next micro-batch, so the batch's
budget (``maxOffsetsPerTrigger``) goes to the partitions that hold the combined watermark back,
and the windows of the fast ones do not pile up in Spark's state. Flink's update interval is
our micro-batch: the decision is taken when a batch is planned, from the per-partition
watermarks the valve knows then, and journaled in the offset, so a replay plans the same batch.

The reference is the minimum watermark over the partitions that are ACTIVE *and still have
records to read*. That is the combined watermark, except that a partition with nothing left to
read, an idle one, or a finished bounded one holds nothing back: Flink's known alignment hangs
(a subtask without splits, alignment with idleness never resuming, finished subtasks holding the
group) all come from waiting on a split that cannot advance. A held partition keeps its backlog,
so it never turns idle while held, and its records are never late because of it: its watermark
is ahead, not behind (Flink's FLIP-471 marked paused splits idle and dropped their rows).

A micro-batch is a coarse update interval: a partition just within the drift could read a whole
batch's share and land far beyond it (Flink's readers pause within a fetch of crossing it). So a
partition that is not held reads at most as many records as keep its watermark within maxDrift
of where the reference is expected to be after the batch, by its *pace*: the event time its
last slice covered per offset (recorded by the read task). The partition expected to be the
slowest after the batch is never limited, so the group always advances; a partition whose pace
is not known yet is not limited either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from flinkish_core.epoch_valve import EpochWatermark, channel_name
from flinkish_core.watermark import WatermarkStatus
from flinkish_source.kafka_client import TopicPartitionKey
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
    """The partitions to hold back when planning from ``offsets`` (each partition's position)
    with ``available`` (how far each could read), given the valve state ``combined``; with
    ``pace`` and ``share`` (how the planner shares the batch's budget), the limits of the
    partitions that are not held (see the module docstring)."""
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
        paces = {tp: pace(tp) for tp in watermarks if tp not in held}
        # where each catching-up partition's watermark is expected after the batch; without a
        # pace, where it is now (the cautious guess for the reference)
        after = min(wm + admitted.get(tp, 0) * (paces.get(tp) or 0)
                    for tp, wm in watermarks.items())
        for tp, tp_pace in paces.items():
            if tp_pace is None or tp_pace <= 0:
                continue
            room = after + max_drift_ms - watermarks[tp]
            most = max(0, int(room // tp_pace))
            if most < lags[tp]:
                limits[tp] = most
                if most == 0:
                    held.add(tp)
    return AlignmentDecision(reference, frozenset(held), limits)


def pace_at(store: SourceStateStore, tp: TopicPartitionKey, at: int) -> float | None:
    """Event-time milliseconds per offset over the partition's last slice (the one that ended
    at ``at``), from what its read task recorded; None when unknown (nothing read yet, no
    event time, or a checkpoint from before slices recorded their earliest event time)."""
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
