"""The Kafka read path: a read task's announced offset ranges, each read once, ``start <= offset
< end``, in chunks. Modules import downwards only: base <- librdkafka <- this package.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

from confluent_kafka import Message

from flinkish_source.kafka.base import (
    POOL,
    DataLossError,
    KafkaUnavailableError,
    RangeKey,
    TopicPartitionKey,
)
from flinkish_source.kafka.librdkafka import RangeReader
from flinkish_source.kafka.metadata import KafkaMetadata, OffsetRange
from flinkish_source.options import SourceOptions

__all__ = ["POOL", "DataLossError", "KafkaMetadata", "KafkaUnavailableError", "OffsetRange",
           "RangeKey", "TopicPartitionKey", "read_range", "reading"]

_announced = threading.local()


def _registry() -> dict[RangeKey, RangeReader]:
    registry: dict[RangeKey, RangeReader] | None = getattr(_announced, "ranges", None)
    if registry is None:
        registry = _announced.ranges = {}
    return registry


@contextlib.contextmanager
def reading(options: SourceOptions, ranges: Sequence[RangeKey], chunk: int) -> Iterator[None]:
    """Announce the ranges a read task is about to read, in order: inside the block,
    :func:`read_range` serves them from one pooled consumer that fetches ahead (see
    :class:`RangeReader`). Nothing connects until the first read."""
    reader = RangeReader(options, ranges, chunk)
    registry = _registry()
    mine = [key for key in dict.fromkeys(ranges) if key not in registry]
    for key in mine:
        registry[key] = reader
    failed = False
    try:
        yield
    except BaseException as exc:
        failed = not isinstance(exc, GeneratorExit)
        raise
    finally:
        for key in mine:
            registry.pop(key, None)
        reader.close(failed=failed)


def read_range(
    options: SourceOptions, topic: str, partition: int, start: int, end: int, chunk: int
) -> Iterator[Sequence[Message]]:
    """Records of ``topic/partition`` with ``start <= offset < end``, in chunks of messages.

    Stops at ``end`` even when the last offsets are transaction markers or compacted away. Records
    that vanished raise :class:`DataLossError` unless ``failOnDataLoss`` is false (reading then
    resumes at the earliest offset left). A range announced with :func:`reading` is served by that
    task's consumer; any other by a pooled consumer, for this range alone."""
    announced = _registry().get((topic, partition, start, end))
    if announced is not None:
        yield from announced.read(topic, partition, start, end)
        return
    if end <= start:
        return
    with RangeReader(options, [(topic, partition, start, end)], chunk) as own:
        yield from own.read(topic, partition, start, end)
