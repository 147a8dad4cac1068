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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flinkish_core.epoch_valve import EpochWatermark, channel_name
from flinkish_core.watermark import WatermarkStatus
from flinkish_source.kafka_client import TopicPartitionKey


@dataclass(frozen=True)
class AlignmentDecision:
    """Which partitions a batch holds back, and against which watermark."""

    reference: int | None  # min watermark of the partitions still catching up (None: none)
    held: frozenset[TopicPartitionKey]


def decide(
    combined: EpochWatermark,
    offsets: Mapping[TopicPartitionKey, int],
    available: Mapping[TopicPartitionKey, int],
    max_drift_ms: int,
) -> AlignmentDecision:
    """The partitions to hold back when planning from ``offsets`` (each partition's position)
    with ``available`` (how far each could read), given the valve state ``combined``."""
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
    held = frozenset(tp for tp, wm in watermarks.items() if wm > reference + max_drift_ms)
    return AlignmentDecision(reference, held)
