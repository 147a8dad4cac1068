"""The Kafka read path: one interface (:class:`~flinkish_source.kafka.base.PooledRangeReader`:
a read task's announced offset ranges, each read once, ``start <= offset < end``, in chunks),
two implementations: :mod:`~flinkish_source.kafka.librdkafka` (the default) and
:mod:`~flinkish_source.kafka.native` (``kafkaConsumer.fetch=native``, experimental: Fetch
requests decoded in C, handing whatever it does not handle to librdkafka). The driver's view of
the cluster is :mod:`~flinkish_source.kafka.metadata`.

Modules import downwards only: base <- librdkafka <- native <- this package's functions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator, Sequence

from confluent_kafka import Message

from flinkish_source.kafka.base import (
    POOL,
    DataLossError,
    KafkaUnavailableError,
    PooledRangeReader,
    RangeKey,
    TopicPartitionKey,
)
from flinkish_source.kafka.librdkafka import RangeReader
from flinkish_source.kafka.metadata import KafkaMetadata, OffsetRange
from flinkish_source.options import FetchClient, SourceOptions

__all__ = ["POOL", "DataLossError", "KafkaMetadata", "KafkaUnavailableError", "OffsetRange",
           "RangeKey", "TopicPartitionKey", "range_reader", "read_range", "reading"]

logger = logging.getLogger(__name__)


def range_reader(options: SourceOptions, ranges: Sequence[RangeKey], chunk: int
                 ) -> PooledRangeReader:
    """The reader of a task's ranges: librdkafka's, or with ``kafkaConsumer.fetch=native``
    Fetch requests decoded into Arrow (:class:`~flinkish_source.kafka.native.FetchRangeReader`)
    where the query allows it (:func:`~flinkish_source.kafka.native.eligible`)."""
    from flinkish_source.kafka import native

    if options.fetch_client is FetchClient.LIBRDKAFKA:
        return RangeReader(options, ranges, chunk)
    why_not = native.eligible(options)
    if why_not is None:
        return native.FetchRangeReader(options, ranges, chunk)
    _warn_librdkafka_once(why_not)
    return RangeReader(options, ranges, chunk)


@functools.cache
def _warn_librdkafka_once(why: str) -> None:
    logger.warning("kafkaConsumer.fetch=native: read tasks read records with librdkafka "
                   "instead: %s", why)


_announced = threading.local()


def _registry() -> dict[RangeKey, PooledRangeReader]:
    registry: dict[RangeKey, PooledRangeReader] | None = getattr(_announced, "ranges", None)
    if registry is None:
        registry = _announced.ranges = {}
    return registry


@contextlib.contextmanager
def reading(options: SourceOptions, ranges: Sequence[RangeKey], chunk: int) -> Iterator[None]:
    """Announce the ranges a read task is about to read, in order: inside the block,
    :func:`read_range` serves them from one pooled consumer that fetches ahead (see
    :class:`RangeReader`). Nothing connects until the first read."""
    reader = range_reader(options, ranges, chunk)
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

    Stops at ``end`` even when the last offsets are transaction markers or compacted away: the
    consumer's position and the end-of-partition event tell us when ``end`` is passed. Records
    that vanished (retention, a recreated topic) raise :class:`DataLossError` unless
    ``failOnDataLoss`` is false, in which case reading resumes at the earliest offset left.
    A range announced with :func:`reading` is served by that task's consumer; any other by a
    consumer of the pool, for this range alone.
    """
    announced = _registry().get((topic, partition, start, end))
    if announced is not None:
        yield from announced.read(topic, partition, start, end)
        return
    if end <= start:
        return
    with range_reader(options, [(topic, partition, start, end)], chunk) as own:
        yield from own.read(topic, partition, start, end)
