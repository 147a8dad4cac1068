"""Kafka through confluent-kafka: metadata, offsets and range reads; everything above it is
pure. (Read tasks fetch records with :mod:`flinkish_source.fetch_reader` where a query allows
it; :func:`range_reader` decides.)

Two quirks shape it. librdkafka needs a ``group.id`` even for manually assigned consumers, so
each consumer gets a throwaway one and never commits. And "latest offset" is taken from the high
watermark carried in a *fetch* response, not from ListOffsets alone: some Kafka-protocol brokers
(Tansu, the broker ``flinkish.demo`` embeds when there is no Docker, is one) answer ListOffsets
with the last record batch's base offset + 1, which would hide the tail of a multi-record
batch. The fetch-based high watermark is what real Kafka returns too, so the probe is correct
everywhere.

Read tasks read through :func:`read_range`. A task that reads several partitions announces its
ranges first (:func:`reading`); :func:`read_range` then serves them, in the announced order, from
one consumer that fetches the next ranges while the current one is read (a fetch round trip per
partition otherwise: ~50 ms each on a loopback broker). Consumers come from a per-process
:class:`ConsumerPool`, so the tasks a reused Python worker runs share them (as Spark's Kafka
consumer cache does), never two tasks at once.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from flinkish_core.secrets import scrub
from flinkish_source.options import FetchClient, SourceOptions

TopicPartitionKey = tuple[str, int]
logger = logging.getLogger(__name__)
_T = TypeVar("_T")
_R = TypeVar("_R", bound="PooledRangeReader")
_Opened = TypeVar("_Opened", bound="_Readable")


class _Readable(Protocol):
    opened: bool

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


#: How librdkafka reports a fetch offset the leader does not have: with
#: ``auto.offset.reset=error`` an _AUTO_OFFSET_RESET event, else OFFSET_OUT_OF_RANGE
_OUT_OF_RANGE = frozenset({KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET})


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


def error_hint(options: SourceOptions) -> str:
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
                        + error_hint(self._options)
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
                + error_hint(self._options)
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
        self._admin: AdminClient | None = None
        self._complaint: str | None = None
        # per partition: the latest offset ListOffsets reported, and the high watermark the
        # fetch probe found for it (see offset_ranges)
        self._probed: dict[TopicPartitionKey, tuple[int, int]] = {}

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                consumer_config(
                    self._options, **{"fetch.wait.max.ms": 10, "error_cb": self._noticed}
                )
            )
        return self._consumer

    def _admin_client(self) -> AdminClient:
        """For ListOffsets: one request per broker for all partitions (a consumer's
        ``get_watermark_offsets`` costs a round trip per partition, ~1.5 ms each)."""
        if self._admin is None:
            config: dict[str, Any] = dict(self._options.kafka_config)
            config.update({
                "socket.timeout.ms": min(60_000, max(1_000, self._options.poll_timeout_ms)),
                "log_level": 3,  # consumer settings among kafka.* only draw warnings here
                "error_cb": self._noticed,
            })
            self._admin = AdminClient(config)
        return self._admin

    def _noticed(self, error: KafkaError) -> None:
        self._complaint = error.str()

    def _complaints(self) -> str | None:
        """The clients' latest own error report since the last call (served by a poll: the
        consumer has no assignment outside :meth:`_probe_high_watermarks`, so a poll takes no
        records)."""
        if self._consumer is not None:
            self._consumer.poll(0)
        if self._admin is not None:
            self._admin.poll(0)
        complaint, self._complaint = self._complaint, None
        return complaint

    def _wait(self, what: str) -> BrokerWait:
        return BrokerWait(self._options, what, self._complaints)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None  # an AdminClient has no close(); dropping it destroys the handle

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
        wait = self._wait(f"could not read the offsets of {len(partitions)} partition(s)")
        earliest = wait.call(lambda timeout: self._list_offsets(partitions, "earliest", timeout))
        latest = wait.call(lambda timeout: self._list_offsets(partitions, "latest", timeout))
        reported = {tp: OffsetRange(earliest[tp], latest[tp]) for tp in partitions}
        # A partition whose reported latest offset did not move since its last probe got no new
        # record batch, so its high watermark did not move either: probe only the others.
        true_high = {tp: self._probed[tp][1] for tp, r in reported.items()
                     if tp in self._probed and self._probed[tp][0] == r.latest}
        to_probe = {tp: r for tp, r in reported.items()
                    if r.latest > r.earliest and tp not in true_high}
        if to_probe:
            found = self._probe_high_watermarks(self._client(), to_probe)
            for tp, high in found.items():
                self._probed[tp] = (reported[tp].latest, high)
            true_high.update(found)
        return {
            tp: OffsetRange(r.earliest, max(r.latest, true_high.get(tp, r.latest)))
            for tp, r in reported.items()
        }

    def _list_offsets(
        self, partitions: list[TopicPartitionKey], which: str, timeout: float
    ) -> dict[TopicPartitionKey, int]:
        """ListOffsets for every partition at once, at the consumers' isolation level (a
        read_committed consumer cannot read past the last stable offset)."""
        spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()
        futures = self._admin_client().list_offsets(
            {TopicPartition(t, p): spec for t, p in partitions},
            isolation_level=(
                IsolationLevel.READ_COMMITTED if self._options.read_committed
                else IsolationLevel.READ_UNCOMMITTED
            ),
            request_timeout=timeout,
        )
        return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}

    def _probe_high_watermarks(
        self, consumer: Consumer, ranges: dict[TopicPartitionKey, OffsetRange]
    ) -> dict[TopicPartitionKey, int]:
        """Fetch from the last reported offset; the fetch response carries the high watermark.

        The first message of a partition (a record or the end-of-partition event) comes from a
        fetch response whose high watermark librdkafka has cached by then
        (``get_watermark_offsets(cached=True)``): waiting for the end-of-partition event
        instead stalls planning under a steady producer, whose records keep every fetch
        non-empty."""
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
                # a short wait per call: consume() blocks until num_messages or the timeout
                answered = {(m.topic(), m.partition()): m
                            for m in consumer.consume(num_messages=1000, timeout=0.01)}
                for key, msg in answered.items():
                    if key not in waiting:
                        continue
                    err = msg.error()
                    if err is not None and err.code() in _OUT_OF_RANGE:
                        waiting.discard(key)  # records vanished meanwhile; keep the report
                        continue
                    _, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
                    if high >= 0:
                        found[key] = int(high)
                        waiting.discard(key)
                    elif err is not None and err.code() == KafkaError._PARTITION_EOF:
                        found[key] = msg.offset()
                        waiting.discard(key)
                if waiting and (time.monotonic() >= next_warning or wait.remaining() <= 0):
                    wait.unanswered(f"no fetch answer yet for {sorted(waiting)[:5]}")
                    next_warning = time.monotonic() + wait.step
        finally:
            consumer.unassign()
        return found


#: Idle consumers a process keeps per client configuration, and for how long: Spark's Kafka
#: consumer cache closes consumers idle for ``spark.kafka.consumer.cache.timeout`` (5 min).
POOL_CAPACITY = 4
POOL_IDLE_TIMEOUT_S = 300.0
#: How often the pool's daemon thread closes expired idle consumers (Spark: 1 min).
POOL_EVICT_INTERVAL_S = 60.0

PoolKey = tuple[tuple[str, str], ...]


def pool_key(config: dict[str, Any]) -> PoolKey:
    """Consumers are interchangeable when their settings are; ``group.id`` is a throwaway."""
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k != "group.id"))


@dataclass
class ConsumerPool:
    """Idle consumers of this process, keyed by client configuration (:func:`pool_key`).

    :meth:`borrow` hands out an idle consumer of the same configuration or a new one, and takes
    it back when the borrower is done, with its assignment cleared; one that saw an error is
    closed instead. A borrowed consumer is in no idle list, so no two borrowers ever share
    one. Idle consumers are closed after ``idle_timeout`` seconds, and beyond ``capacity`` per
    configuration. A forked child starts with an empty pool (a client's threads do not
    survive a fork, so the parent's consumers are left alone, never closed in the child).
    """

    capacity: int = POOL_CAPACITY
    idle_timeout: float = POOL_IDLE_TIMEOUT_S
    evict_interval: float = POOL_EVICT_INTERVAL_S
    factory: Callable[[dict[str, Any]], Any] = Consumer
    clock: Callable[[], float] = time.monotonic
    created: int = 0
    _idle: dict[PoolKey, list[tuple[Any, float]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pid: int = field(default_factory=os.getpid)
    _evictor: threading.Thread | None = None
    _forked: list[Any] = field(default_factory=list)

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._forked.extend(c for idle in self._idle.values() for c, _ in idle)
            self._idle, self._pid, self._evictor = {}, os.getpid(), None
            self._lock = threading.Lock()

    def acquire(self, config: dict[str, Any]) -> Any:
        """An idle consumer of this configuration, or a new one; hand it back with
        :meth:`release`."""
        consumer = self._take(pool_key(config))
        if consumer is None:
            consumer = self.factory(config)
            with self._lock:
                self.created += 1
        return consumer

    def release(self, config: dict[str, Any], consumer: Any, clean: bool = True) -> None:
        """Take a consumer back: kept for the next borrower with its assignment cleared, or
        closed if the borrower failed (``clean`` false) or the reset fails."""
        if clean and _reset(consumer):
            self._give_back(pool_key(config), consumer)
        else:
            _close(consumer)

    @contextlib.contextmanager
    def borrow(self, config: dict[str, Any]) -> Iterator[Any]:
        """:meth:`acquire` and :meth:`release` around a block (closed if the block fails)."""
        consumer = self.acquire(config)
        clean = False
        try:
            yield consumer
            clean = True
        except GeneratorExit:  # the borrower stopped early; the consumer itself is fine
            clean = True
            raise
        finally:
            self.release(config, consumer, clean)

    def _take(self, key: PoolKey) -> Any | None:
        expired: list[Any] = []
        with self._lock:
            self._check_fork()
            expired = self._expire_locked()
            idle = self._idle.get(key)
            consumer = idle.pop()[0] if idle else None
        for c in expired:
            _close(c)
        return consumer

    def _give_back(self, key: PoolKey, consumer: Any) -> None:
        with self._lock:
            self._check_fork()
            idle = self._idle.setdefault(key, [])
            idle.append((consumer, self.clock()))
            surplus = [c for c, _ in idle[: max(0, len(idle) - self.capacity)]]
            del idle[: len(surplus)]
            expired = self._expire_locked() + surplus
            if self._evictor is None and self.evict_interval > 0:
                self._evictor = threading.Thread(
                    target=self._evict_forever, name="flinkish-consumer-pool", daemon=True
                )
                self._evictor.start()
        for c in expired:
            _close(c)

    def _expire_locked(self) -> list[Any]:
        now = self.clock()
        expired: list[Any] = []
        for key in list(self._idle):
            keep = [(c, t) for c, t in self._idle[key] if now - t < self.idle_timeout]
            expired.extend(c for c, t in self._idle[key] if now - t >= self.idle_timeout)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        return expired

    def evict(self) -> int:
        """Close the consumers idle for longer than ``idle_timeout``; how many."""
        with self._lock:
            self._check_fork()
            expired = self._expire_locked()
        for c in expired:
            _close(c)
        return len(expired)

    def _evict_forever(self) -> None:
        me = threading.current_thread()
        while self._evictor is me and self._pid == os.getpid():
            time.sleep(self.evict_interval)
            self.evict()

    def idle(self) -> int:
        with self._lock:
            self._check_fork()
            return sum(len(v) for v in self._idle.values())

    def clear(self) -> None:
        """Close every idle consumer."""
        with self._lock:
            self._check_fork()
            idle = [c for v in self._idle.values() for c, _ in v]
            self._idle = {}
        for c in idle:
            _close(c)


def _reset(consumer: Any) -> bool:
    """Clear a consumer's assignment so the next borrower starts clean; False if it failed."""
    try:
        consumer.unassign()
        return True
    except Exception:
        return False


def _close(consumer: Any) -> None:
    with contextlib.suppress(Exception):
        consumer.close()


#: This process's consumers (a Python worker runs one task at a time, and Spark reuses it).
POOL = ConsumerPool()
atexit.register(POOL.clear)


def read_consumer_config(options: SourceOptions) -> dict[str, Any]:
    """Settings of the consumers that read records (every read of one query shares them)."""
    prefetch = {
        # Keep a few chunks queued and refill as soon as a chunk is taken. When the queue
        # reaches queued.min.messages, librdkafka postpones the partition's next fetch by
        # fetch.queue.backoff.ms (1 s by default), which stalls a reader that drains the queue
        # a chunk at a time; and a fetch held at most 50 ms (librdkafka: 500). A user's
        # kafka.* setting of any of them wins.
        "queued.min.messages": 100_000,
        "fetch.queue.backoff.ms": 10,
        "fetch.wait.max.ms": 50,
    }
    overrides = {k: v for k, v in prefetch.items() if k not in options.kafka_config}
    return consumer_config(options, **overrides)


RangeKey = tuple[str, int, int, int]  # topic, partition, start, end


@dataclass
class _Range:
    topic: str
    partition: int
    start: int
    end: int
    position: int  # the next offset this range expects from the consumer
    chunks: deque[list[Message]] = field(default_factory=deque)  # read, not yet served
    buffered: int = 0
    assigned: bool = False
    done: bool = False
    opened: bool = False  # read() was called
    short: ShortLog | None = None  # the partition's log ends before position (for now)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class PooledRangeReader:
    """What both range readers share: the task's announced ranges, each read once, and one
    consumer borrowed from the pool (handed back on close, or closed if reading failed)."""

    def __init__(self, options: SourceOptions, chunk: int, pool: ConsumerPool | None,
                 lookahead: int | None) -> None:
        self._options = options
        self._chunk = chunk
        self._pool = pool or POOL
        self._lookahead = lookahead if lookahead is not None else max(2 * chunk, 50_000)
        self._config: dict[str, Any] | None = None
        self._consumer: Any = None

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(failed=exc[0] is not None and exc[0] is not GeneratorExit)

    def close(self, failed: bool = False) -> None:
        """Hand the consumer back to the pool (closed instead if reading ``failed``)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            assert self._config is not None
            self._pool.release(self._config, consumer, clean=not failed)

    def _client(self) -> Any:
        if self._consumer is None:
            self._config = read_consumer_config(self._options)
            self._consumer = self._pool.acquire(self._config)
        return self._consumer

    def _offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """The partition's earliest and latest offset now, from one ListOffsets."""
        consumer, tp = self._client(), TopicPartition(topic, partition)
        low, high = BrokerWait(
            self._options, f"could not read the offsets of {topic}/{partition}"
        ).call(lambda t: consumer.get_watermark_offsets(tp, timeout=t, cached=False))
        return int(low), int(high)

    @staticmethod
    def _open(by_key: Mapping[RangeKey, _Opened], topic: str, partition: int, start: int,
              end: int) -> _Opened | None:
        """The announced range about to be read (None: an empty one, nothing to read)."""
        r = by_key.get((topic, partition, start, end))
        if r is None:
            if end > start:
                raise ValueError(f"{topic}/{partition} {start}..{end} was not announced")
            return None
        if r.opened:
            raise ValueError(f"{topic}/{partition} {start}..{end} is read twice")
        r.opened = True
        return r


class RangeReader(PooledRangeReader):
    """Reads offset ranges of several partitions with one pooled consumer.

    :meth:`read` serves one range; it may be called for the ranges in any order, but the
    consumer fetches ahead in the announced order: while a range is read, the next ones are
    assigned as long as the offsets still to serve before them stay within ``lookahead``, so
    a task of many small ranges fetches them all in one round trip, and a large range does not
    pile up in memory. A finished range's partition is unassigned at once, so nothing is
    fetched past its end. Ranges of one partition are read one after the other.
    """

    def __init__(self, options: SourceOptions, ranges: Sequence[RangeKey], chunk: int,
                 pool: ConsumerPool | None = None, lookahead: int | None = None) -> None:
        super().__init__(options, chunk, pool, lookahead)
        self._ranges = [_Range(t, p, s, e, s) for t, p, s, e in ranges if e > s]
        self._by_key = {(r.topic, r.partition, r.start, r.end): r for r in self._ranges}
        self._assigned: dict[tuple[str, int], _Range] = {}
        self._cursor = 0  # ranges before it were assigned once (or are being read)
        self._buffered = 0  # messages read and not yet served, all ranges
        self._current: _Range | None = None

    def _assign(self, ranges: list[_Range]) -> None:
        """Assign ranges in one call (one call per range delays the later ones' first fetch)."""
        todo = []
        for r in ranges:
            if not (r.assigned or r.done or (r.topic, r.partition) in self._assigned):
                r.assigned = True
                self._assigned[(r.topic, r.partition)] = r
                todo.append(TopicPartition(r.topic, r.partition, r.position))
        if todo:
            self._client().incremental_assign(todo)

    def _unassign(self, r: _Range) -> None:
        if r.assigned:
            r.assigned = False
            del self._assigned[(r.topic, r.partition)]
            self._client().incremental_unassign([r.tp])

    def _finish(self, r: _Range) -> None:
        r.done = True
        self._unassign(r)

    def _fetch_ahead(self) -> None:
        """Assign the current range, and the ranges after the ones already assigned while the
        offsets still to serve (read or not) stay under ``lookahead``."""
        current = self._current
        todo = [] if current is None or current.done or current.assigned else [current]
        ahead = self._buffered + sum(r.end - r.position for r in self._assigned.values())
        if current is not None and not current.assigned and not current.done:
            ahead += current.end - current.position
        taken = {(r.topic, r.partition) for r in todo}
        while self._cursor < len(self._ranges) and ahead < self._lookahead:
            r = self._ranges[self._cursor]
            if r.assigned or r.done or r is current or r.position != r.start:
                self._cursor += 1  # assigned before, or read out of turn
                continue
            key = (r.topic, r.partition)
            if key in self._assigned or key in taken:
                break  # another range of its partition first
            todo.append(r)
            taken.add(key)
            ahead += r.end - r.position
            self._cursor += 1
        self._assign(todo)

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[list[Message]]:
        """Records of one announced range, ``start <= offset < end``, in chunks (see
        :func:`read_range` for how the end, lost offsets and silence are handled)."""
        r = self._open(self._by_key, topic, partition, start, end)
        if r is None:
            return
        options = self._options
        timeout = options.poll_timeout_ms / 1000
        step = _retry_step(timeout)
        self._current = r
        last_progress = time.monotonic()
        next_warning = last_progress + step
        while True:
            if r.chunks:
                yield self._serve(r)
                last_progress = time.monotonic()
                next_warning = last_progress + step
                continue
            if r.done:
                break
            if (r.topic, r.partition) in self._assigned and self._assigned[
                    (r.topic, r.partition)] is not r:
                self._finish_other(self._assigned[(r.topic, r.partition)])
            self._fetch_ahead()
            self._poll()
            if r.chunks or r.done:
                continue
            fetch_pos = self._client().position([r.tp])[0].offset
            waited = time.monotonic() - last_progress
            if fetch_pos != OFFSET_END and fetch_pos >= r.end:
                self._finish(r)  # only transaction markers were left
            elif r.short is not None:
                skipped_to = r.short.wait(options, topic, partition, r.position, end)
                if skipped_to is not None:  # failOnDataLoss=false: the rest is gone
                    r.position, r.short = skipped_to, None
                    self._finish(r)
            elif waited > timeout:
                raise KafkaUnavailableError(
                    f"{topic}/{partition}: no records between offsets {r.position} and "
                    f"{end} within {timeout:g} s (option {WAIT_OPTION} bounds this wait); "
                    + error_hint(options)
                )
            elif time.monotonic() >= next_warning:
                logger.warning(
                    "%s/%d: still waiting for records between offsets %d and %d from "
                    "bootstrap servers %r after %.1f s, giving up in %.1f s (option %s=%d "
                    "bounds the wait)", topic, partition, r.position, end, _servers(options),
                    waited, timeout - waited, WAIT_OPTION, options.poll_timeout_ms,
                )
                next_warning = time.monotonic() + step
        self._current = None
        self._fetch_ahead()

    def _finish_other(self, other: _Range) -> None:
        """Another range of the same partition holds the assignment: it keeps what it has
        read so far and is fetched again when its turn comes."""
        self._unassign(other)

    def _serve(self, r: _Range) -> list[Message]:
        """The range's next chunk: its buffered chunks merged up to ``chunk`` messages."""
        out = r.chunks.popleft()
        while r.chunks and len(out) + len(r.chunks[0]) <= self._chunk:
            out = out + r.chunks.popleft()
        r.buffered -= len(out)
        self._buffered -= len(out)
        return out

    def _poll(self) -> None:
        """One consume call; its messages go to their ranges."""
        consumer = self._client()
        pending = sum(r.end - r.position for r in self._assigned.values())
        msgs = consumer.consume(num_messages=max(1, min(self._chunk, pending)), timeout=0.1)
        if not msgs:
            return
        topics = {r.topic for r in self._assigned.values()}
        if len(topics) == 1:
            # librdkafka hands out a partition's messages in runs: split at partition changes
            (topic,) = topics
            parts = [m.partition() for m in msgs]
            if parts.count(parts[0]) == len(parts):
                bounds = [0, len(msgs)]
            else:
                bounds = [0] + [i for i in range(1, len(parts)) if parts[i] != parts[i - 1]]
                bounds.append(len(msgs))
            for i, j in zip(bounds, bounds[1:], strict=False):
                owner = self._assigned.get((topic, parts[i]))
                if owner is not None and msgs[i].topic() == topic:
                    self._take(owner, msgs if j - i == len(msgs) else msgs[i:j])
            return
        by_partition: dict[tuple[str, int], list[Message]] = {}
        for msg in msgs:
            by_partition.setdefault((msg.topic(), msg.partition()), []).append(msg)
        for key, part in by_partition.items():
            owner = self._assigned.get(key)
            if owner is not None:
                self._take(owner, part)

    def _take(self, r: _Range, msgs: list[Message]) -> None:
        """Messages of one partition, in order: records of the range, end and error events."""
        options = self._options
        end = r.end
        first, last = msgs[0], msgs[-1]
        if not r.done and first.error() is None and last.error() is None:
            low, high = first.offset(), last.offset()
            errors = [m.error() for m in msgs]
            if low >= r.position and high < end and errors.count(None) == len(errors):
                # the common case: records only, all within the range (offsets only grow)
                self._keep(r, msgs)
                r.position, r.short = high + 1, None
                if r.position >= end:
                    self._finish(r)
                return
        out: list[Message] = []
        for msg in msgs:
            if r.done:
                break
            err = msg.error()
            if err is None:
                offset = msg.offset()
                if offset < r.position:
                    continue  # already read (a fetch from before a re-positioning)
                if offset >= end:
                    r.position = end
                    self._finish(r)
                    break
                out.append(msg)
                r.position, r.short = offset + 1, None
                if r.position >= end:
                    self._finish(r)
            elif err.code() == KafkaError._PARTITION_EOF:
                if msg.offset() >= end:
                    r.position = end
                    self._finish(r)
                else:  # waited out in read(): librdkafka keeps fetching
                    r.short = r.short or ShortLog(msg.offset())
            elif err.code() in _OUT_OF_RANGE:
                low, high = self._offsets(r.topic, r.partition)
                self._unassign(r)
                if low > r.position:  # deleted by retention, or the topic was recreated
                    r.position = retention_loss(options, r.topic, r.partition, r.position,
                                                low, end)
                    r.short = None
                else:  # the log ends before position, for now: fetched again after a pause
                    r.short = r.short or ShortLog(high)
                    time.sleep(SHORT_LOG_PAUSE_S)
                if r.position < end:
                    self._assign([r])
                else:
                    r.done = True
                break
            else:
                raise KafkaUnavailableError(f"{r.topic}/{r.partition}: {err.str()}")
        if out:
            self._keep(r, out)

    def _keep(self, r: _Range, msgs: list[Message]) -> None:
        r.chunks.append(msgs)
        r.buffered += len(msgs)
        self._buffered += len(msgs)


def range_reader(options: SourceOptions, ranges: Sequence[RangeKey], chunk: int) -> Any:
    """The reader of a task's ranges: Fetch requests decoded into Arrow
    (:class:`~flinkish_source.fetch_reader.FetchRangeReader`) where the query allows it
    (:func:`~flinkish_source.fetch_reader.eligible`), else :class:`RangeReader`."""
    from flinkish_source import fetch_reader

    if options.fetch_client is FetchClient.LIBRDKAFKA:
        return RangeReader(options, ranges, chunk)
    why_not = fetch_reader.eligible(options)
    if why_not is None:
        return fetch_reader.FetchRangeReader(options, ranges, chunk)
    _warn_librdkafka_once(why_not)
    return RangeReader(options, ranges, chunk)


@functools.cache
def _warn_librdkafka_once(why: str) -> None:
    logger.warning("kafkaConsumer.fetch=native: read tasks read records with librdkafka "
                   "instead: %s", why)


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
) -> Iterator[list[Message]]:
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


#: How long a reader pauses before fetching again from an offset the leader said was out of
#: range while its earliest offset is not past it (a new leader still catching up)
SHORT_LOG_PAUSE_S = 0.05


@dataclass
class ShortLog:
    """A partition whose log ends (``high``: its high watermark) before offsets a range still
    needs, seen first at ``since``. After a leader change the new leader may briefly report a
    high watermark below offsets already read (what KIP-320's leader epochs exist for), so
    Kafka's consumer waits, and so do the readers: up to ``kafkaConsumer.pollTimeoutMs``, with
    a warning per slice, before the offsets count as lost (an unclean leader election
    truncated the log, or the topic was recreated)."""

    high: int
    since: float = field(default_factory=time.monotonic)
    next_warning: float = 0.0

    def wait(self, options: SourceOptions, topic: str, partition: int, position: int,
             end: int) -> int | None:
        """None: keep waiting; else the bound passed and this is where reading resumes
        (:func:`lost_offsets`: raises unless ``failOnDataLoss`` is false)."""
        waited, bound = time.monotonic() - self.since, options.poll_timeout_ms / 1000
        if waited >= bound:
            return lost_offsets(
                options, topic, partition, position, end,
                f"its high watermark stayed at {self.high}, below the planned offsets, for "
                f"{waited:.1f} s (option {WAIT_OPTION}={options.poll_timeout_ms} bounds this "
                "wait): an unclean leader election truncated the log, or the topic was "
                "recreated")
        if time.monotonic() >= self.next_warning:
            logger.warning(
                "%s/%d: the leader reports high watermark %d, below offset %d still to read: "
                "waiting for it to catch up (a leader change), %.1f s so far, giving up in "
                "%.1f s (option %s)", topic, partition, self.high, position, waited,
                bound - waited, WAIT_OPTION)
            self.next_warning = time.monotonic() + _retry_step(bound)
        return None


def retention_loss(options: SourceOptions, topic: str, partition: int, position: int,
                   earliest: int, end: int) -> int:
    """The partition's earliest offset passed ``position``: records the query still needs
    were deleted (the only case Spark's Kafka source, too, reports as data loss at once)."""
    return min(end, lost_offsets(options, topic, partition, position, min(earliest, end),
                                 "deleted by retention or the topic was recreated"))


def lost_offsets(
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
    return resume
