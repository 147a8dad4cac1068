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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from flinkish_core.secrets import scrub
from flinkish_source.options import SourceOptions

TopicPartitionKey = tuple[str, int]
logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The option that bounds every wait for the brokers (see :class:`BrokerWait`).
WAIT_OPTION = "kafkaConsumer.pollTimeoutMs"
#: Errors that mean "no broker answered (yet)": waited out up to the bound, with a warning per
#: slice. Anything else (authentication, an unknown partition …) fails at once.
_UNANSWERED = frozenset({
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
    KafkaError._TIMED_OUT_QUEUE, KafkaError._RESOLVE, KafkaError._WAIT_COORD,
    KafkaError._NODE_UPDATE, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.BROKER_NOT_AVAILABLE, KafkaError.NETWORK_EXCEPTION,
})


class KafkaUnavailableError(RuntimeError):
    """The brokers could not be reached, or answered with an error, within the bounded wait."""


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (retention, deleted topic); see ``failOnDataLoss``."""


@dataclass(frozen=True)
class OffsetRange:
    earliest: int
    latest: int


def _servers(options: SourceOptions) -> str:
    return str(options.kafka_config.get("bootstrap.servers"))


def _error_hint(options: SourceOptions) -> str:
    """What to check, with the client settings in use (secrets masked)."""
    return (
        f"bootstrap servers {_servers(options)!r}; check "
        "kafka.bootstrap.servers and the kafka.security.*/sasl.*/ssl.* settings "
        f"({WAIT_OPTION} sets how long to wait); client settings: "
        f"{options.safe_kafka_config}"
    )


def _retry_step(bound_s: float) -> float:
    """How long one attempt may wait before the source says, in the log, that it is waiting:
    a sixth of the bound, between 0.5 and 10 s (about a dozen warnings before it gives up)."""
    return min(10.0, max(0.5, bound_s / 6))


class BrokerWait:
    """One bounded wait for the brokers (``kafkaConsumer.pollTimeoutMs``), split into slices.

    Each unanswered slice logs a warning saying what the source waits for, from which servers
    (client settings masked), how long it has waited and how long it will still wait; at the
    bound it raises :class:`KafkaUnavailableError` naming the servers and the option. Errors
    that are not "no answer yet" (e.g. failed authentication) raise at once. ``complaints``
    returns the client's latest own report (its ``error_cb``, e.g. ``Connect to
    ipv4#127.0.0.1:1 failed: Connection refused``), more telling than the call's error.
    """

    def __init__(
        self, options: SourceOptions, what: str,
        complaints: Callable[[], str | None] | None = None,
    ) -> None:
        self._options = options
        self.what = what
        self.bound = options.poll_timeout_ms / 1000
        self.step = _retry_step(self.bound)
        self.started = time.monotonic()
        self._complaints = complaints

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return max(0.0, self.bound - self.elapsed())

    def call(self, attempt: Callable[[float], _T]) -> _T:
        """``attempt(timeout_s)`` until it answers, retrying unanswered slices to the bound."""
        while True:
            begun = time.monotonic()
            try:
                return attempt(max(0.001, min(self.step, self.remaining())))
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                code = error.code() if isinstance(error, KafkaError) else None
                reason = scrub(
                    error.str() if isinstance(error, KafkaError) else str(exc),
                    self._options.kafka_secrets,
                )
                if code not in _UNANSWERED:
                    raise KafkaUnavailableError(
                        f"{self.what}: the brokers answered with an error: {reason}; "
                        + _error_hint(self._options)
                    ) from exc
            # a call that failed fast must not spin: one attempt per slice
            time.sleep(max(0.0, min(self.step - (time.monotonic() - begun), self.remaining())))
            self.unanswered(reason)

    def unanswered(self, reason: str | None = None) -> None:
        """One slice went unanswered: log a warning, or raise at the bound."""
        complaint = self._complaints() if self._complaints is not None else None
        detail = "; ".join(dict.fromkeys(
            scrub(r, self._options.kafka_secrets) for r in (complaint, reason) if r
        )) or "no answer"
        if self.remaining() <= 0:
            raise KafkaUnavailableError(
                f"{self.what}: no answer from bootstrap servers {_servers(self._options)!r} "
                f"within {self.bound:g} s (option {WAIT_OPTION}="
                f"{self._options.poll_timeout_ms} bounds this wait; last error: {detail}); "
                + _error_hint(self._options)
            )
        logger.warning(
            "%s: still waiting for bootstrap servers %r after %.1f s, giving up in %.1f s "
            "(option %s=%d bounds the wait); last error: %s; client settings: %s",
            self.what, _servers(self._options), self.elapsed(), self.remaining(), WAIT_OPTION,
            self._options.poll_timeout_ms, detail, self._options.safe_kafka_config,
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
    """Driver-side view of the cluster: which partitions exist and which offsets they hold.

    Every call waits for the brokers at most ``kafkaConsumer.pollTimeoutMs`` (see
    :class:`BrokerWait`), logging a warning per unanswered slice of the wait."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._consumer: Consumer | None = None
        self._complaint: str | None = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                consumer_config(
                    self._options, **{"fetch.wait.max.ms": 10, "error_cb": self._noticed}
                )
            )
        return self._consumer

    def _noticed(self, error: KafkaError) -> None:
        self._complaint = error.str()

    def _complaints(self) -> str | None:
        """The client's latest own error report since the last call (served by a poll: this
        consumer has no assignment outside :meth:`_probe_high_watermarks`, so a poll takes no
        records)."""
        if self._consumer is not None:
            self._consumer.poll(0)
        complaint, self._complaint = self._complaint, None
        return complaint

    def _wait(self, what: str) -> BrokerWait:
        return BrokerWait(self._options, what, self._complaints)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def partitions(self) -> list[TopicPartitionKey]:
        """Every partition the topic selection names right now, sorted."""
        selection = self._options.topics
        client = self._client()
        metadata = self._wait("could not list Kafka topics (metadata request)").call(
            lambda timeout: client.list_topics(timeout=timeout)
        )
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
        reported: dict[TopicPartitionKey, OffsetRange] = {}
        wait = self._wait(f"could not read the offsets of {len(partitions)} partition(s)")
        for topic, part in partitions:
            tp = TopicPartition(topic, part)
            low, high = wait.call(
                lambda timeout, tp=tp: consumer.get_watermark_offsets(  # type: ignore[misc]
                    tp, timeout=timeout, cached=False
                )
            )
            reported[(topic, part)] = OffsetRange(low, high)
        to_probe = {tp: r for tp, r in reported.items() if r.latest > r.earliest}
        if not to_probe:
            return reported
        true_high = self._probe_high_watermarks(consumer, to_probe)
        return {
            tp: OffsetRange(r.earliest, max(r.latest, true_high.get(tp, r.latest)))
            for tp, r in reported.items()
        }

    def _probe_high_watermarks(
        self, consumer: Consumer, ranges: dict[TopicPartitionKey, OffsetRange]
    ) -> dict[TopicPartitionKey, int]:
        """Fetch from the last reported offset; the fetch response carries the high watermark."""
        consumer.assign(
            [TopicPartition(t, p, max(r.latest - 1, r.earliest)) for (t, p), r in ranges.items()]
        )
        waiting = set(ranges)
        found: dict[TopicPartitionKey, int] = {}
        # consume() serves error_cb itself, so the complaint is read without a poll
        wait = BrokerWait(
            self._options, f"could not probe the high watermarks of {len(ranges)} partition(s)",
            lambda: self._complaint,
        )
        next_warning = time.monotonic() + wait.step
        try:
            while waiting:
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
                if waiting and (time.monotonic() >= next_warning or wait.remaining() <= 0):
                    wait.unanswered(f"no fetch answer yet for {sorted(waiting)[:5]}")
                    next_warning = time.monotonic() + wait.step
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
    step = _retry_step(timeout)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        position = start
        last_progress = next_warning = time.monotonic()
        next_warning += step
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
                    low, _ = BrokerWait(
                        options, f"could not read the offsets of {topic}/{partition}"
                    ).call(lambda t: consumer.get_watermark_offsets(tp, timeout=t, cached=False))
                    position = _lost(options, topic, partition, position, min(low, end),
                                     "deleted by retention or the topic was recreated")
                    if position < end:
                        consumer.assign([TopicPartition(topic, partition, position)])
                else:
                    raise KafkaUnavailableError(f"{topic}/{partition}: {err.str()}")
            if out:
                last_progress = time.monotonic()
                next_warning = last_progress + step
                yield out
            elif position < end:
                fetch_pos = consumer.position([tp])[0].offset
                waited = time.monotonic() - last_progress
                if fetch_pos != OFFSET_END and fetch_pos >= end:
                    position = end  # only transaction markers were left
                elif waited > timeout:
                    raise KafkaUnavailableError(
                        f"{topic}/{partition}: no records between offsets {position} and "
                        f"{end} within {timeout:g} s (option {WAIT_OPTION} bounds this wait); "
                        + _error_hint(options)
                    )
                elif time.monotonic() >= next_warning:
                    logger.warning(
                        "%s/%d: still waiting for records between offsets %d and %d from "
                        "bootstrap servers %r after %.1f s, giving up in %.1f s (option %s=%d "
                        "bounds the wait)", topic, partition, position, end, _servers(options),
                        waited, timeout - waited, WAIT_OPTION, options.poll_timeout_ms,
                    )
                    next_warning = time.monotonic() + step
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
