"""The only module that talks to Kafka (confluent-kafka); everything above it is pure.

Two quirks shape it. librdkafka needs a ``group.id`` even for manually assigned consumers, so
each consumer gets a throwaway one and never commits. And "latest offset" is taken from the high
watermark carried in a *fetch* response, not from ListOffsets alone: some Kafka-protocol brokers
(Tansu, the broker ``flinkish.demo`` embeds when there is no Docker, is one) answer ListOffsets
with the last record batch's base offset + 1, which would hide the tail of a multi-record
batch. The fetch-based high watermark is what real Kafka returns too, so the probe is correct
everywhere.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from flinkish_source.options import SourceOptions

TopicPartitionKey = tuple[str, int]
logger = logging.getLogger(__name__)


class KafkaUnavailableError(RuntimeError):
    """The brokers could not be reached, or answered with an error, within the bounded wait."""


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (retention, deleted topic); see ``failOnDataLoss``."""


@dataclass(frozen=True)
class OffsetRange:
    earliest: int
    latest: int


def _error_hint(options: SourceOptions) -> str:
    """What to check, with the client settings in use (secrets masked)."""
    return (
        f"bootstrap servers {options.kafka_config.get('bootstrap.servers')!r}; check "
        "kafka.bootstrap.servers and the kafka.security.*/sasl.*/ssl.* settings "
        "(kafkaConsumer.pollTimeoutMs sets how long to wait); client settings: "
        f"{options.safe_kafka_config}"
    )


def consumer_config(options: SourceOptions, **overrides: Any) -> dict[str, Any]:
    """librdkafka settings for a manually assigned, never-committing consumer."""
    config: dict[str, Any] = dict(options.kafka_config)
    config.update(
        {
            "group.id": f"flinkish-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "socket.timeout.ms": min(60_000, max(1_000, options.poll_timeout_ms)),
            "log_level": 3,
        }
    )
    config.update(overrides)
    return config


class KafkaMetadata:
    """Driver-side view of the cluster: which partitions exist and which offsets they hold."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._consumer: Consumer | None = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                consumer_config(self._options, **{"fetch.wait.max.ms": 10})
            )
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def partitions(self) -> list[TopicPartitionKey]:
        """Every partition the topic selection names right now, sorted."""
        selection = self._options.topics
        timeout = self._options.poll_timeout_ms / 1000
        try:
            metadata = self._client().list_topics(timeout=timeout)
        except KafkaException as exc:
            raise KafkaUnavailableError(
                f"could not list Kafka topics within {timeout:g} s: {exc}; "
                + _error_hint(self._options)
            ) from exc
        found: list[TopicPartitionKey] = []
        for name, topic in metadata.topics.items():
            if not selection.matches(name) or topic.error is not None:
                continue
            found.extend((name, p) for p in topic.partitions)
        if selection.assign:
            found = [tp for tp in found if tp in set(selection.assign)]
        return sorted(found)

    def offset_ranges(
        self, partitions: list[TopicPartitionKey]
    ) -> dict[TopicPartitionKey, OffsetRange]:
        """Earliest and true latest offset of each partition (see the module docstring)."""
        if not partitions:
            return {}
        consumer = self._client()
        timeout = self._options.poll_timeout_ms / 1000
        reported: dict[TopicPartitionKey, OffsetRange] = {}
        try:
            for topic, part in partitions:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, part), timeout=timeout, cached=False
                )
                reported[(topic, part)] = OffsetRange(low, high)
        except KafkaException as exc:
            raise KafkaUnavailableError(
                f"could not read offsets of {topic}/{part} within {timeout:g} s: {exc}; "
                + _error_hint(self._options)
            ) from exc
        to_probe = {tp: r for tp, r in reported.items() if r.latest > r.earliest}
        if not to_probe:
            return reported
        true_high = self._probe_high_watermarks(consumer, to_probe, timeout)
        return {
            tp: OffsetRange(r.earliest, max(r.latest, true_high.get(tp, r.latest)))
            for tp, r in reported.items()
        }

    def _probe_high_watermarks(
        self, consumer: Consumer, ranges: dict[TopicPartitionKey, OffsetRange], timeout: float
    ) -> dict[TopicPartitionKey, int]:
        """Fetch from the last reported offset; the fetch response carries the high watermark."""
        consumer.assign(
            [TopicPartition(t, p, max(r.latest - 1, r.earliest)) for (t, p), r in ranges.items()]
        )
        waiting = set(ranges)
        found: dict[TopicPartitionKey, int] = {}
        deadline = time.monotonic() + timeout
        try:
            while waiting and time.monotonic() < deadline:
                # a short wait per call: consume() blocks until num_messages or the timeout,
                # and the end-of-partition events come right after the first fetch
                for msg in consumer.consume(num_messages=1000, timeout=0.01):
                    key = (msg.topic(), msg.partition())
                    err = msg.error()
                    if err is not None and err.code() == KafkaError._PARTITION_EOF:
                        found[key] = msg.offset()
                        waiting.discard(key)
                    elif err is not None and err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                        waiting.discard(key)  # records vanished meanwhile; keep the report
            if waiting:
                raise KafkaUnavailableError(
                    f"no fetch answer for {sorted(waiting)} within {timeout:g} s; "
                    + _error_hint(self._options)
                )
        finally:
            consumer.unassign()
        return found


def read_range(
    options: SourceOptions, topic: str, partition: int, start: int, end: int, chunk: int
) -> Iterator[list[Message]]:
    """Records of ``topic/partition`` with ``start <= offset < end``, in chunks of messages.

    Stops at ``end`` even when the last offsets are transaction markers or compacted away: the
    consumer's position and the end-of-partition event tell us when ``end`` is passed. Records
    that vanished (retention, a recreated topic) raise :class:`DataLossError` unless
    ``failOnDataLoss`` is false, in which case reading resumes at the earliest offset left.
    """
    prefetch = {
        # Keep a few chunks queued and refill as soon as a chunk is taken. When the queue
        # reaches queued.min.messages, librdkafka postpones the partition's next fetch by
        # fetch.queue.backoff.ms (1 s by default), which stalls a reader that drains the queue
        # a chunk at a time. A user's kafka.* setting of either still wins.
        "queued.min.messages": max(4 * chunk, 100_000),
        "fetch.queue.backoff.ms": 10,
    }
    overrides = {k: v for k, v in prefetch.items() if k not in options.kafka_config}
    consumer = Consumer(consumer_config(options, **{"fetch.wait.max.ms": 50, **overrides}))
    tp = TopicPartition(topic, partition)
    timeout = options.poll_timeout_ms / 1000
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        position = start
        last_progress = time.monotonic()
        while position < end:
            out: list[Message] = []
            # never ask for more than the slice still needs: consume() waits for the full
            # count (or the timeout) and the slice's tail is usually the partition's end
            wanted = max(1, min(chunk, end - position))
            for msg in consumer.consume(num_messages=wanted, timeout=0.5):
                err = msg.error()
                if err is None:
                    if msg.offset() >= end:
                        position = end
                        break
                    out.append(msg)
                    position = msg.offset() + 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= end:
                        position = end
                    else:
                        position = _lost(options, topic, partition, msg.offset(), end,
                                         "the partition now ends there")
                elif err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                    low, _ = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
                    position = _lost(options, topic, partition, position, min(low, end),
                                     "deleted by retention or the topic was recreated")
                    if position < end:
                        consumer.assign([TopicPartition(topic, partition, position)])
                else:
                    raise KafkaUnavailableError(f"{topic}/{partition}: {err.str()}")
            if out:
                last_progress = time.monotonic()
                yield out
            elif position < end:
                fetch_pos = consumer.position([tp])[0].offset
                if fetch_pos != OFFSET_END and fetch_pos >= end:
                    position = end  # only transaction markers were left
                elif time.monotonic() - last_progress > timeout:
                    raise KafkaUnavailableError(
                        f"{topic}/{partition}: no records between offsets {position} and "
                        f"{end} within {timeout:g} s; " + _error_hint(options)
                    )
    finally:
        consumer.close()


def _lost(
    options: SourceOptions, topic: str, partition: int, first: int, resume: int, why: str
) -> int:
    """Offsets ``first..resume-1`` are gone: fail, or (failOnDataLoss=false) say so and skip."""
    message = (
        f"{topic}/{partition}: offsets {first}..{resume - 1} planned for this micro-batch are no "
        f"longer in Kafka ({why})"
    )
    if options.fail_on_data_loss:
        raise DataLossError(
            message + "; set failOnDataLoss=false to skip lost offsets and continue"
        )
    logger.warning("%s; skipping them because failOnDataLoss=false", message)
    return max(resume, first + 1) if resume <= first else resume
