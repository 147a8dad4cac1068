"""Driver-side view of the cluster: which partitions exist and which offsets they hold.

"Latest offset" is ListOffsets' answer, raised to the high watermark a fetch response carries
where that is higher (Tansu answers ListOffsets with the last batch's base offset + 1). The
probe is slow on a busy broker, so a running query probes only the partitions that stood still
since the last planning; ``exact=True`` probes all, where one answer must be the whole truth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from flinkish_source.kafka.base import (
    CLIENT_LOG,
    OUT_OF_RANGE,
    BrokerWait,
    RefusalWatch,
    TopicPartitionKey,
    consumer_config,
    security_failure,
    socket_timeout_ms,
)
from flinkish_source.options import SourceOptions


@dataclass(frozen=True)
class OffsetRange:
    earliest: int
    latest: int


class KafkaMetadata:
    """Driver-side view of the cluster; every call waits at most ``kafkaConsumer.pollTimeoutMs``."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None
        self._complaint: KafkaError | None = None
        self._refusals = RefusalWatch(str(options.kafka.config.get("bootstrap.servers", "")))
        # per partition: the latest offset ListOffsets reported, and the high watermark the
        # fetch probe found for it (see offset_ranges)
        self._probed: dict[TopicPartitionKey, tuple[int, int]] = {}
        # per partition: the latest offset ListOffsets reported at the previous call
        self._reported: dict[TopicPartitionKey, int] = {}

    def _client(self) -> Consumer:
        """For the high-watermark probe only: its fetches stay in flight up to
        ``fetch.wait.max.ms`` after an unassign, and a broker answers a connection's requests
        in order, so a metadata request behind one would wait them out."""
        if self._consumer is None:
            self._consumer = Consumer(consumer_config(self._options.kafka, **{
                "fetch.wait.max.ms": 10, "error_cb": self._noticed,
                "enable.sparse.connections": self._sparse(),
            }))
        return self._consumer

    def _admin_client(self) -> AdminClient:
        """For metadata and ListOffsets (one request per broker for all partitions). The first
        call also creates the probe's consumer, which connects meanwhile."""
        if self._admin is None:
            config: dict[str, Any] = self._options.kafka.client_config()
            config.update({
                "socket.timeout.ms": socket_timeout_ms(self._options.kafka),
                "log_level": 3,  # consumer settings among kafka.* only draw warnings here
                "logger": CLIENT_LOG,
                "error_cb": self._noticed,
                "enable.sparse.connections": self._sparse(),
            })
            self._admin = AdminClient(config)
            self._client()
        return self._admin

    def _sparse(self) -> Any:
        """``enable.sparse.connections`` off unless the user's options say otherwise: sparse, a new
        client (librdkafka >= 2.10) drops its bootstrap connection once the brokers are known and
        may hold a request sent there until its next connection attempt."""
        return self._options.kafka.config.get("enable.sparse.connections", False)

    def _noticed(self, error: KafkaError) -> None:
        """A client's ``error_cb``; a refusal is kept over the reports that follow it: it is the
        cause."""
        self._refusals.note(error)
        if security_failure(self._complaint) is None:
            self._complaint = error

    def _complaints(self) -> KafkaError | None:
        """The clients' latest own error report since the last call."""
        if self._consumer is not None:
            self._consumer.poll(0)
        if self._admin is not None:
            self._admin.poll(0)
        complaint, self._complaint = self._complaint, None
        return complaint

    def _wait(self, what: str) -> BrokerWait:
        return BrokerWait(self._options.kafka, what, self._complaints, self._refusals)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None  # an AdminClient has no close(); dropping it destroys the handle

    def partitions(self) -> list[TopicPartitionKey]:
        """Every partition the topic selection names right now, sorted."""
        selection = self._options.topics
        client = self._admin_client()
        metadata = self._wait("could not list Kafka topics (metadata request)").call(
            lambda timeout: client.list_topics(timeout=timeout)
        )
        assigned = set(selection.assign)
        return sorted((name, p) for name, topic in metadata.topics.items()
                      if selection.matches(name) and topic.error is None
                      for p in topic.partitions if not assigned or (name, p) in assigned)

    def offset_ranges(
        self, partitions: list[TopicPartitionKey], *, exact: bool = True
    ) -> dict[TopicPartitionKey, OffsetRange]:
        """Earliest and latest offset of each partition. With ``exact``, the true latest of every
        partition; without, a partition whose reported latest offset moved since the previous call
        is taken at its reported latest."""
        if not partitions:
            return {}
        wait = self._wait(f"could not read the offsets of {len(partitions)} partition(s)")
        earliest, latest = wait.call(lambda timeout: self._list_offsets(partitions, timeout))
        reported = {tp: OffsetRange(earliest[tp], latest[tp]) for tp in partitions}
        before, self._reported = self._reported, {tp: r.latest for tp, r in reported.items()}
        # A partition whose reported latest offset did not move since its last probe got no new
        # record batch, so its high watermark did not move either.
        true_high = {tp: self._probed[tp][1] for tp, r in reported.items()
                     if tp in self._probed and self._probed[tp][0] == r.latest}
        to_probe = {tp: r for tp, r in reported.items()
                    if r.latest > r.earliest and tp not in true_high
                    and (exact or before.get(tp) in (None, r.latest))}
        if to_probe:
            found = self._probe_high_watermarks(self._client(), to_probe)
            for tp, high in found.items():
                self._probed[tp] = (reported[tp].latest, high)
            true_high.update(found)
        return {tp: OffsetRange(r.earliest, max(r.latest, true_high.get(tp, r.latest)))
                for tp, r in reported.items()}

    def _isolation(self) -> IsolationLevel:
        """The read consumers' isolation level (ListOffsets answers at it)."""
        return (IsolationLevel.READ_COMMITTED if self._options.kafka.read_committed
                else IsolationLevel.READ_UNCOMMITTED)

    def _list_offsets(
        self, partitions: list[TopicPartitionKey], timeout: float
    ) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]]:
        """Earliest and latest offsets by ListOffsets for every partition at once, at the
        consumers' isolation level; both requests are in flight together."""
        asked = [
            self._admin_client().list_offsets(
                {TopicPartition(t, p): spec for t, p in partitions},
                isolation_level=self._isolation(), request_timeout=timeout)
            for spec in (OffsetSpec.earliest(), OffsetSpec.latest())
        ]
        earliest, latest = (
            {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}
            for futures in asked
        )
        return earliest, latest

    def offsets_for_times(
        self, times: dict[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int | None]:
        """Kafka's ListOffsets by timestamp: per partition the earliest offset whose record
        timestamp is at or after the time, None where no record is (Kafka answers -1)."""
        if not times:
            return {}
        def attempt(timeout: float) -> dict[TopicPartitionKey, int | None]:
            futures = self._admin_client().list_offsets(
                {TopicPartition(t, p): OffsetSpec.for_timestamp(ts)
                 for (t, p), ts in times.items()},
                isolation_level=self._isolation(), request_timeout=timeout)
            return {(tp.topic, tp.partition): (None if f.result().offset < 0
                                               else int(f.result().offset))
                    for tp, f in futures.items()}

        return self._wait(f"could not look up offsets by time of {len(times)} partition(s)"
                          ).call(attempt)

    def _probe_high_watermarks(
        self, consumer: Consumer, ranges: dict[TopicPartitionKey, OffsetRange]
    ) -> dict[TopicPartitionKey, int]:
        """Fetch from the reported latest offset: the fetch response carries the high watermark,
        which librdkafka caches (``get_watermark_offsets(cached=True)``). A partition's first
        message comes from a fetch response, so its cached value is the answer; another partition is
        answered as soon as its cached value changed since the assignment and reached the reported
        latest offset, without taking its records first. Waiting for the end-of-partition event
        instead stalls planning under a steady producer."""

        def cached(tp: TopicPartitionKey) -> int:
            return int(consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1])

        before = {tp: cached(tp) for tp in ranges}
        consumer.assign([TopicPartition(t, p, r.latest) for (t, p), r in ranges.items()])
        waiting = set(ranges)
        found: dict[TopicPartitionKey, int] = {}
        # poll() serves error_cb itself, so the complaint is read without a poll
        wait = BrokerWait(self._options.kafka, f"could not probe the high watermarks of "
                          f"{len(ranges)} partition(s)", lambda: self._complaint)
        next_warning = time.monotonic() + wait.step
        try:
            while waiting:
                msg = consumer.poll(timeout=0.01)  # returns with the first message there is
                if msg is not None and (msg.topic(), msg.partition()) in waiting:
                    key, err = (msg.topic(), msg.partition()), msg.error()
                    high = cached(key)
                    if err is not None and err.code() in OUT_OF_RANGE:
                        waiting.discard(key)  # records vanished meanwhile; keep the report
                    elif high >= 0:
                        found[key] = high
                        waiting.discard(key)
                    elif err is not None and err.code() == KafkaError._PARTITION_EOF:
                        found[key] = msg.offset()
                        waiting.discard(key)
                if msg is not None:
                    for tp in list(waiting):
                        high = cached(tp)
                        if high != before[tp] and high >= ranges[tp].latest:
                            found[tp] = high
                            waiting.discard(tp)
                if waiting and (time.monotonic() >= next_warning or wait.remaining() <= 0):
                    wait.unanswered(f"no fetch answer yet for {sorted(waiting)[:5]}")
                    next_warning = time.monotonic() + wait.step
        finally:
            consumer.unassign()
        return found
