"""Read tasks' offset ranges through Kafka Fetch requests decoded into Arrow
(:mod:`flinkish_source.kafka.protocol`), ``kafkaConsumer.fetch=native`` (experimental), with
:class:`~flinkish_source.kafka.librdkafka.RangeReader`'s contract: records
``start <= offset < end`` of each announced range, in chunks, the end reached even across
transaction markers and compacted offsets, lost offsets per ``failOnDataLoss``, and every wait
for the brokers bounded by ``kafkaConsumer.pollTimeoutMs`` with a warning per slice.

Partition leaders and earliest offsets come from a pooled librdkafka consumer, which knows the
cluster; records come over one connection per leader
(:class:`~flinkish_source.kafka.protocol.FetchConnection`, on the project's Kafka connection).
One Fetch request asks for the range being read and for the next announced ranges on that
leader (a task of many small ranges reads them in one round trip), as long as what is buffered
for them stays under the look-ahead.

:func:`eligible` says when this path can read for a query (plaintext clusters: the
connection speaks TLS and SASL, but the source hands it the query's settings untranslated). A
range it cannot decode (an old message format, a snappy, lz4 or zstd batch without the
``native`` extra) is read on from there with librdkafka.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from flinkish_core.secrets import scrub
from flinkish_source.kafka.base import (
    SHORT_LOG_PAUSE_S,
    BrokerWait,
    ConsumerPool,
    PooledRangeReader,
    RangeKey,
    ShortLog,
    no_records_reason,
    retention_loss,
)
from flinkish_source.kafka.librdkafka import RangeReader
from flinkish_source.options import SourceOptions

logger = logging.getLogger(__name__)

#: Bytes a Fetch asks for per partition and in all (librdkafka's defaults are 1 MiB and 50 MiB;
#: a larger share per partition keeps a chunk's worth of records in one round trip), and how
#: long the broker may hold a Fetch that has nothing to return yet: what this path uses unless
#: the query sets librdkafka's settings of the same meaning (see FetchSettings)
PARTITION_MAX_BYTES = 4 << 20
REQUEST_MAX_BYTES = 64 << 20
MAX_WAIT_MS = 100
#: librdkafka's defaults of ``client.id`` and ``receive.message.max.bytes`` (the largest
#: response, and here also the largest decompressed batch, the client accepts)
CLIENT_ID = "flinkish"
RECEIVE_MAX_BYTES = 100_000_000
#: A connection or an answer that takes longer counts as a failed attempt (retried within
#: kafkaConsumer.pollTimeoutMs)
SOCKET_TIMEOUT_S = 30.0
#: Client settings that take the connection beyond a plain socket: librdkafka reads then
_SECURE_PREFIXES = ("sasl.", "ssl.")
_PLAIN_PROTOCOLS = ("plaintext", "")


#: (query, topic, partition) whose hand-over to librdkafka this process has reported: once is
#: enough to tell the operator, the rest would flood the log of a query reading an old topic.
#: A query is known here by its checkpointing.location (its bootstrap servers without one).
_FELL_BACK: set[tuple[str, str, int]] = set()


def warn_fallback(options: SourceOptions, topic: str, partition: int, what: str) -> None:
    """A WARNING, once per query and partition (in each worker process): the native path hands
    a range to librdkafka (no record is skipped or failed, but the operator should know why
    it is slower)."""
    key = (options.state_location or str(options.kafka_config.get("bootstrap.servers")),
           topic, partition)
    if key in _FELL_BACK:
        logger.debug("%s/%d: %s", topic, partition, what)
        return
    _FELL_BACK.add(key)
    logger.warning("%s/%d: %s; further hand-overs of this partition are logged at DEBUG",
                   topic, partition, what)


@dataclass(frozen=True)
class FetchSettings:
    """The query's librdkafka settings that apply to Fetch requests, under their librdkafka
    names (``kafka.client.id``, ``kafka.fetch.max.bytes``, …), else this path's defaults."""

    client_id: str
    partition_max_bytes: int
    request_max_bytes: int
    max_wait_ms: int
    min_bytes: int
    max_response: int

    @classmethod
    def of(cls, options: SourceOptions) -> FetchSettings:
        config = options.kafka_config

        def number(key: str, default: int) -> int:
            raw = str(config.get(key, default)).strip()
            if not raw.isdigit() or int(raw) <= 0:
                raise ValueError(f"option kafka.{key}: {raw!r} is not a positive integer")
            return int(raw)

        return cls(
            client_id=str(config.get("client.id", CLIENT_ID)),
            partition_max_bytes=number("max.partition.fetch.bytes", PARTITION_MAX_BYTES),
            request_max_bytes=number("fetch.max.bytes", REQUEST_MAX_BYTES),
            max_wait_ms=number("fetch.wait.max.ms", MAX_WAIT_MS),
            min_bytes=number("fetch.min.bytes", 1),
            max_response=number("receive.message.max.bytes", RECEIVE_MAX_BYTES),
        )


def eligible(options: SourceOptions) -> str | None:
    """None when read tasks of a ``kafkaConsumer.fetch=native`` query can fetch natively;
    otherwise why not."""
    security = str(options.kafka_config.get("security.protocol", "")).strip()
    if security.lower() not in _PLAIN_PROTOCOLS:
        return f"kafka.security.protocol={security} (only plaintext connections are native)"
    if options.client_security.active or any(
            k.startswith(_SECURE_PREFIXES) for k in options.kafka_config):
        return "kafka.sasl.*/kafka.ssl.* settings (only plaintext connections are native)"
    if str(options.kafka_config.get("check.crcs", "false")).strip().lower() == "true":
        return "kafka.check.crcs=true (the native decoder does not verify CRCs)"
    if options.kafka_config.get("client.rack"):
        return ("kafka.client.rack (fetching from the closest replica, KIP-392, needs Fetch "
                "v11; the native path sends v4 to the leader)")
    try:
        from flinkish_source.kafka import protocol  # noqa: F401  (needs the compiled decoder)
    except ImportError as exc:
        return f"the record batch decoder is not built ({exc})"
    return None


@dataclass
class _FetchRange:
    topic: str
    partition: int
    start: int
    end: int
    decoder: Any  # protocol.PartitionDecoder
    chunks: deque[Any] = field(default_factory=deque)  # decoded, not yet served
    buffered: int = 0
    opened: bool = False
    fallback: str | None = None  # why the rest is read with librdkafka
    short: ShortLog | None = None  # the log ends before position (for now)

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


class FetchRangeReader(PooledRangeReader):
    """Reads announced offset ranges with Fetch requests; see the module docstring."""

    def __init__(self, options: SourceOptions, ranges: Sequence[RangeKey], chunk: int,
                 pool: ConsumerPool | None = None, lookahead: int | None = None) -> None:
        from flinkish_source.kafka.protocol import PartitionDecoder

        super().__init__(options, chunk, pool, lookahead)
        headers = bool(options.include_headers or options.event_time_header
                       or options.punctuation_header)
        self._settings = FetchSettings.of(options)
        self._ranges = [_FetchRange(t, p, s, e, PartitionDecoder(
                            s, e, chunk, headers, self._settings.max_response))
                        for t, p, s, e in ranges if e > s]
        self._by_key = {(r.topic, r.partition, r.start, r.end): r for r in self._ranges}
        self._leaders: dict[tuple[str, int], tuple[str, int]] = {}
        self._connections: dict[tuple[str, int], Any] = {}

    def close(self, failed: bool = False) -> None:
        """Close the sockets; the consumer goes back to the pool (closed if reading failed)."""
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
        super().close(failed)

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[Any]:
        """Records of one announced range, ``start <= offset < end``, in chunks
        (:class:`~flinkish_source.kafka.protocol.RecordChunk`)."""
        r = self._open(self._by_key, topic, partition, start, end)
        if r is None:
            return
        wait: BrokerWait | None = None
        while True:
            while r.chunks:
                chunk = r.chunks.popleft()
                r.buffered -= len(chunk)
                wait = None
                yield chunk
            if r.decoder.done:
                return
            if r.fallback is not None:
                yield from self._read_with_librdkafka(r)
                return
            position = r.decoder.position
            if wait is None:
                wait = BrokerWait(self._options, f"could not fetch {topic}/{partition} "
                                  f"offsets {position}..{end - 1}")
                next_warning = time.monotonic() + wait.step
            why = self._fetch(r)
            if r.chunks or r.decoder.position != position or r.fallback is not None:
                r.short = None if r.decoder.position != position else r.short
                continue
            if r.short is not None:  # its own bounded wait (ShortLog)
                skipped_to = r.short.wait(self._options, topic, partition, position, end)
                if skipped_to is not None:  # failOnDataLoss=false: the rest is gone
                    r.decoder.position, r.short = skipped_to, None
                time.sleep(SHORT_LOG_PAUSE_S)
                continue
            if time.monotonic() >= next_warning or wait.remaining() <= 0:
                wait.unanswered(why or f"no records between offsets {position} and {end} yet")
                next_warning = time.monotonic() + wait.step
            time.sleep(min(0.05, wait.remaining()))

    def _read_with_librdkafka(self, r: _FetchRange) -> Iterator[Any]:
        warn_fallback(self._options, r.topic, r.partition,
                      f"reading offsets {r.decoder.position}..{r.end - 1} with librdkafka "
                      f"({r.fallback})")
        rest = (r.topic, r.partition, r.decoder.position, r.end)
        with RangeReader(self._options, [rest], self._chunk, self._pool) as own:
            yield from own.read(*rest)

    def _companions(self, r: _FetchRange, leader: tuple[str, int]) -> list[_FetchRange]:
        """``r`` and the next announced ranges to fetch with it: unfinished, on the same
        leader, one per partition, while their buffers stay under the look-ahead."""
        wanted, taken = [r], {r.key}
        ahead = r.buffered
        for other in self._ranges:
            if ahead >= self._lookahead:
                break
            if other is r or other.key in taken or other.opened:
                taken.add(other.key)
                continue
            taken.add(other.key)
            if other.decoder.done or other.fallback is not None:
                continue
            if self._leaders.get(other.key) != leader:
                continue
            wanted.append(other)
            ahead += other.buffered + min(other.end - other.decoder.position, self._chunk)
        return wanted

    def _fetch(self, r: _FetchRange) -> str | None:
        """One Fetch for ``r`` (and its companions); what comes back is decoded and buffered.
        Returns why ``r`` got no answer (a failed connection, a leader that moved), if so:
        the caller tries again within its bounded wait."""
        from flinkish_source.kafka.protocol import (
            OFFSET_OUT_OF_RANGE,
            BrokerError,
            FetchRefused,
            FetchWant,
            UnsupportedBatch,
        )

        leader = self._leader(r)
        if leader is None:
            return f"{r.topic}/{r.partition} has no leader"
        ranges = self._companions(r, leader)
        settings = self._settings
        wants = [FetchWant(x.topic, x.partition, x.decoder.position,
                           settings.partition_max_bytes) for x in ranges]
        try:
            answers = self._connection(leader).fetch(
                wants, settings.max_wait_ms, settings.request_max_bytes,
                self._options.read_committed, settings.min_bytes)
        except FetchRefused as exc:  # this leader's ranges are read with librdkafka
            self._connections.pop(leader, None)
            for x in ranges:
                x.fallback = f"{exc} at offset {x.decoder.position}"
            return None
        except OSError as exc:
            self._drop_connections()
            return scrub(f"broker {leader[0]}:{leader[1]}: {type(exc).__name__}: {exc}",
                         self._options.kafka_secrets)
        why = None
        by_key = {x.key: x for x in ranges}
        for fetched in answers:
            owner = by_key.get((fetched.topic, fetched.partition))
            if owner is None:
                continue
            if fetched.error == OFFSET_OUT_OF_RANGE:
                self._out_of_range(owner)
                continue
            if fetched.error:
                error = BrokerError(fetched.topic, fetched.partition, fetched.error)
                if not error.retriable:
                    # librdkafka reads on where it can (zstd batches answer Fetch v4 with
                    # UNSUPPORTED_COMPRESSION_TYPE: Kafka serves them from Fetch v10), and
                    # reports the error itself where it cannot
                    owner.fallback = f"{error} at offset {owner.decoder.position}"
                    continue
                self._leaders.clear()  # ask the cluster again where the partition lives
                if owner is r:
                    why = str(error)
                continue
            before = owner.decoder.position
            try:
                for columns in owner.decoder.decode(fetched):
                    self._keep(owner, columns)
            except UnsupportedBatch as exc:
                owner.fallback = str(exc)
                continue
            except ValueError as exc:  # a batch the decoder takes for malformed: librdkafka
                # reads it if it is not (and fails with its own error if it is)
                owner.fallback = f"the native decoder could not read it: {exc}"
                continue
            if owner.decoder.position == before and not owner.chunks:
                self._at_end_of_log(owner, fetched)
                if owner is r and r.short is None:
                    why = no_records_reason(self._options, before, fetched.high_watermark)
        return why

    def _keep(self, r: _FetchRange, columns: Any) -> None:
        from flinkish_source.kafka.protocol import RecordChunk

        r.chunks.append(RecordChunk(r.topic, r.partition, columns))
        r.buffered += len(columns)

    def _at_end_of_log(self, r: _FetchRange, fetched: Any) -> None:
        """Nothing came back from ``position``: the log ending before it is waited out
        (:class:`~flinkish_source.ShortLog`); below the high watermark (a
        transaction still open under read_committed), the caller waits too."""
        if fetched.high_watermark <= r.decoder.position < r.end and r.short is None:
            r.short = ShortLog(fetched.high_watermark)

    def _out_of_range(self, r: _FetchRange) -> None:
        """The leader has no offset ``position``: one ListOffsets says whether retention
        deleted it (earliest past it: lost) or the log ends before it (waited out)."""
        low, high = self._offsets(r.topic, r.partition)
        if low > r.decoder.position:
            r.decoder.position = retention_loss(
                self._options, r.topic, r.partition, r.decoder.position, low, r.end)
            r.short = None
        elif r.short is None:
            r.short = ShortLog(high)

    def _leader(self, r: _FetchRange) -> tuple[str, int] | None:
        """The host and port of the partition's leader (the cluster's metadata, once per
        reader, again after a broker said the leader moved); None: it has none now."""
        if r.key not in self._leaders:
            consumer = self._client()
            wait = BrokerWait(self._options, f"could not find the leader of {r.topic}/"
                              f"{r.partition} (metadata request)")
            for topic in sorted({x.topic for x in self._ranges}):
                metadata = wait.call(_metadata_of(consumer, topic))
                brokers = metadata.brokers
                described = metadata.topics.get(topic)
                if described is None or described.error is not None:
                    continue
                for number, part in described.partitions.items():
                    broker = brokers.get(part.leader)
                    if broker is not None:
                        self._leaders[(topic, number)] = (broker.host, broker.port)
        return self._leaders.get(r.key)

    def _connection(self, leader: tuple[str, int]) -> Any:
        from flinkish_source.kafka.protocol import FetchConnection

        connection = self._connections.get(leader)
        if connection is None:
            timeout = min(SOCKET_TIMEOUT_S, self._options.poll_timeout_ms / 1000)
            connection = self._connections[leader] = FetchConnection(
                *leader, self._options.kafka_config, timeout, self._settings.client_id,
                self._settings.max_response)
        return connection

    def _drop_connections(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
        self._leaders.clear()


def _metadata_of(consumer: Any, topic: str) -> Callable[[float], Any]:
    return lambda timeout: consumer.list_topics(topic, timeout=timeout)
