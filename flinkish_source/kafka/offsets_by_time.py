"""Offsets for a time (Spark's ``startingTimestamp`` family): per partition the earliest offset
whose record timestamp is at or after the time, as Kafka's ListOffsets answers it.

Tansu answers 0 for every time, librdkafka's mock cluster -1, so each answer is checked against
the records around it, and one that fails is replaced by a scan, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from flinkish_source.kafka.base import TopicPartitionKey
from flinkish_source.kafka.metadata import KafkaMetadata, OffsetRange
from flinkish_source.options import SourceOptions

logger = logging.getLogger(__name__)

_SCAN_CHUNK = 10_000


def offsets_for_times(
    options: SourceOptions, metadata: KafkaMetadata, times: Mapping[TopicPartitionKey, int],
    ranges: Mapping[TopicPartitionKey, OffsetRange],
) -> dict[TopicPartitionKey, int | None]:
    """Per partition the earliest offset whose record timestamp is >= its time, None where no
    record is (the partition's end is then the only offset "at or after" the time)."""
    answers = metadata.offsets_for_times(dict(times))
    out: dict[TopicPartitionKey, int | None] = {}
    for tp, target in sorted(times.items()):
        answer, r = answers.get(tp), ranges[tp]
        if _plausible(options, tp, target, answer, r):
            out[tp] = answer
            continue
        logger.warning(
            "the broker answered offset %s for %s/%s at time %s, which its records contradict "
            "(a broker that does not implement ListOffsets by timestamp); scanning offsets "
            "%s..%s for the first record at or after it", answer, tp[0], tp[1], target,
            r.earliest, r.latest - 1)
        out[tp] = scan(options, tp, target, r)
    return out


def _timestamp_at(options: SourceOptions, tp: TopicPartitionKey, offset: int) -> int | None:
    """The timestamp of the record at ``offset`` (None: no record there, e.g. a transaction
    marker or a compacted offset)."""
    from flinkish_source.kafka import read_range

    for chunk in read_range(options, tp[0], tp[1], offset, offset + 1, 1):
        for message in chunk:
            if message.offset() == offset:
                return int(message.timestamp()[1])
    return None


def _plausible(options: SourceOptions, tp: TopicPartitionKey, target: int,
               answer: int | None, r: OffsetRange) -> bool:
    if r.latest <= r.earliest:
        return answer is None or answer == r.earliest
    if answer is None:
        last = _timestamp_at(options, tp, r.latest - 1)
        return last is not None and last < target
    if not r.earliest <= answer < r.latest:
        return False
    at = _timestamp_at(options, tp, answer)
    if at is None or at < target:
        return False
    if answer == r.earliest:
        return True
    before = _timestamp_at(options, tp, answer - 1)
    return before is not None and before < target


def scan(options: SourceOptions, tp: TopicPartitionKey, target: int,
         r: OffsetRange) -> int | None:
    """The first record at or after ``target``, reading the partition in offset order."""
    from flinkish_source.kafka import read_range

    for chunk in read_range(options, tp[0], tp[1], r.earliest, r.latest, _SCAN_CHUNK):
        for message in chunk:
            if message.error() is None and message.timestamp()[1] >= target:
                return int(message.offset())
    return None
