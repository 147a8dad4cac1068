"""What the read path and the driver's clients share: the per-process consumer pool (as
Spark's Kafka consumer cache), the bounded waits for the brokers, and the rules for records
that are gone (:func:`lost_offsets`, :class:`ShortLog`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException

from flinkish_core.secrets import scrub
from flinkish_source.options import KafkaClient, SourceOptions

TopicPartitionKey = tuple[str, int]
RangeKey = tuple[str, int, int, int]  # topic, partition, start, end
logger = logging.getLogger(__name__)
_T = TypeVar("_T")


class KafkaUnavailableError(RuntimeError):
    """The brokers could not be reached, or answered with an error, within the bounded wait."""


class KafkaSecurityError(KafkaUnavailableError):
    """The brokers refused the client: authentication failed, or TLS verification did (an
    untrusted certificate on either side). Retrying cannot help, so it ends the wait at once."""


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (retention, deleted topic); see ``failOnDataLoss``."""


#: How librdkafka reports a fetch offset the leader does not have: with
#: ``auto.offset.reset=error`` an _AUTO_OFFSET_RESET event, else OFFSET_OUT_OF_RANGE
OUT_OF_RANGE = frozenset({KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET})


WAIT_OPTION = "kafkaConsumer.pollTimeoutMs"
#: Errors that mean "no broker answered (yet)": waited out up to the bound; others fail at once.
_UNANSWERED = frozenset({
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
    KafkaError._TIMED_OUT_QUEUE, KafkaError._RESOLVE, KafkaError._WAIT_COORD,
    KafkaError._NODE_UPDATE, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.BROKER_NOT_AVAILABLE, KafkaError.NETWORK_EXCEPTION,
})


#: librdkafka's codes for a refused login (reported by error_cb, out of band of any call)
_AUTHENTICATION = frozenset({
    KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.UNSUPPORTED_SASL_MECHANISM, KafkaError.ILLEGAL_SASL_STATE,
})
#: A TLS handshake that failed on a certificate: the client's own check is _SSL, the broker's
#: refusal of the client's certificate a transport error carrying OpenSSL's TLS alert.
_TLS_REFUSED = re.compile(
    r"SSL handshake failed|certificate verify failed|alert (?:certificate required|"
    r"bad certificate|unknown ca|certificate unknown|certificate revoked|certificate expired|"
    r"handshake failure|access denied|decrypt error)", re.IGNORECASE)


def security_failure(error: KafkaError | None) -> str | None:
    """"authentication failed", "TLS verification failed", or None (no refusal)."""
    if error is None:
        return None
    if error.code() in _AUTHENTICATION:
        return "authentication failed"
    if error.code() == KafkaError._SSL or _TLS_REFUSED.search(error.str() or ""):
        return "TLS verification failed"
    return None


def security_error(kafka: KafkaClient, what: str, error: KafkaError
                   ) -> KafkaSecurityError | None:
    """The error that ends a query whose client the brokers refused, or None."""
    kind = security_failure(error)
    if kind is None:
        return None
    check = (
        "the credentials (kafka.sasl.jaas.config, or sasl.username / sasl.password) and "
        "kafka.sasl.mechanism" if kind == "authentication failed" else
        "that the trust store (kafka.ssl.truststore.*, or ssl.ca.location) holds the CA of "
        "the brokers' certificates, that the host names match them (or "
        "kafka.ssl.endpoint.identification.algorithm), and, where the brokers require a "
        "client certificate, the key store (kafka.ssl.keystore.*)")
    return KafkaSecurityError(
        f"{what}: {kind} with bootstrap servers {servers(kafka)!r}: "
        f"{scrub(error.str(), kafka.secrets)}; check {check}; client settings: "
        f"{kafka.safe_config}")


_refusals = threading.local()


def note_refusal(error: KafkaError) -> None:
    """A read consumer's ``error_cb``: keeps a refusal for the polling thread (see
    :func:`raise_refusal`); one function for all, so pooled consumers stay interchangeable."""
    if security_failure(error) is not None:
        _refusals.error = error


def raise_refusal(kafka: KafkaClient, what: str) -> None:
    """Raise :class:`KafkaSecurityError` if this thread's last poll served a refusal."""
    error = getattr(_refusals, "error", None)
    if error is not None:
        _refusals.error = None
        failure = security_error(kafka, what, error)
        assert failure is not None
        raise failure


def servers(kafka: KafkaClient) -> str:
    return str(kafka.config.get("bootstrap.servers"))


def error_hint(kafka: KafkaClient) -> str:
    """What to check, with the client settings in use (secrets masked)."""
    return (f"bootstrap servers {servers(kafka)!r}; check kafka.bootstrap.servers and the "
            f"kafka.security.*/sasl.*/ssl.* settings ({WAIT_OPTION} sets how long to wait); "
            f"client settings: {kafka.safe_config}")


def no_records_reason(kafka: KafkaClient, position: int, high: int) -> str:
    """Why fetches from ``position`` bring no records, given the high watermark of the
    partition's last fetch answer (negative: none came)."""
    if high < 0:
        return ("no fetch answer for the partition yet: the broker does not answer fetches "
                "(see the client's errors)")
    if high <= position:
        return f"the broker's high watermark is {high}: no records from offset {position} on yet"
    held = ("under read_committed, a transaction still open holds them back (until its "
            "producer commits or aborts it), or " if kafka.read_committed else "")
    return (f"the broker reports high watermark {high}, above offset {position}, yet its fetch "
            f"answers from offset {position} bring no records: {held}the broker has not made "
            "them readable (stalled on its writes: its producers' requests time out too, "
            "'Timed out ProduceRequest')")


FIRST_ATTEMPT_S = 1.0


def retry_step(bound_s: float) -> float:
    """How long one attempt waits before a warning: a sixth of the bound, at least 0.5 s."""
    return max(0.5, bound_s / 6)


#: How long every bootstrap server must have refused the connection, in a row, before a wait
#: for a cluster the client never reached ends (see :class:`RefusalWatch`).
REFUSED_FOR_S = 4.0
_CONNECTION_REFUSED = re.compile(r"^(?P<name>\S+)/bootstrap: Connect to \S+ failed: "
                                 r"Connection refused")


def bootstrap_names(bootstrap_servers: str) -> frozenset[str]:
    """librdkafka's names of the bootstrap servers (``host:port``, port 9092 when left out)."""
    entries = (entry.strip().rpartition("://")[2] for entry in bootstrap_servers.split(","))
    return frozenset(e if re.search(r":\d+$", e) else f"{e}:9092" for e in entries if e)


class RefusalWatch:
    """Whether nothing listens at the bootstrap servers: each refused the connection, with no
    other report in between, for :data:`REFUSED_FOR_S`, before any broker ever answered. A
    wrong host or port then fails in seconds; a cluster that answered once gets the whole
    wait. Fed by the clients' ``error_cb``."""

    def __init__(self, bootstrap_servers: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._names = bootstrap_names(bootstrap_servers)
        self._clock = clock
        self._refused: set[str] = set()
        self._since: float | None = None
        self.reached = False  # a broker answered

    def note(self, error: KafkaError) -> None:
        found = _CONNECTION_REFUSED.match(error.str() or "")
        if found is not None and found.group("name") in self._names:
            self._refused.add(found.group("name"))
            if self._since is None:
                self._since = self._clock()
        elif error.code() != KafkaError._ALL_BROKERS_DOWN:  # which follows every refusal
            self._refused, self._since = set(), None

    def answered(self) -> None:
        self.reached = True

    def refusing(self) -> bool:
        """Whether every report so far, if any, was a refused connection."""
        return not self.reached and self._since is not None

    def refused_for(self) -> float:
        """For how long every bootstrap server has refused connections (0: not so)."""
        if self.reached or self._since is None or self._refused != self._names:
            return 0.0
        return self._clock() - self._since

    def error(self, what: str, servers: str) -> KafkaUnavailableError:
        return KafkaUnavailableError(
            f"{what}: connection refused by every bootstrap server for "
            f"{self.refused_for():.0f} s: nothing listens at {servers!r}; check "
            "kafka.bootstrap.servers (the brokers' host:port)")


class BrokerWait:
    """One bounded wait for the brokers (``kafkaConsumer.pollTimeoutMs``), in attempts: a
    warning every sixth of the bound, :class:`KafkaUnavailableError` at it.

    ``complaints`` gives the client's latest ``error_cb`` report, more telling than the call's
    error. librdkafka reports a refused login or connection only there while the call waits
    out its timeout, so attempts stay short (:data:`FIRST_ATTEMPT_S`) until a broker answers:
    a wrong password, an untrusted certificate or a wrong port fails within seconds.
    """

    def __init__(
        self, kafka: KafkaClient, what: str,
        complaints: Callable[[], KafkaError | None] | None = None,
        refusals: RefusalWatch | None = None,
    ) -> None:
        self._kafka = kafka
        self.what = what
        self.bound = kafka.poll_timeout_ms / 1000
        self.step = retry_step(self.bound)
        self.started = time.monotonic()
        self._next_warning = self.started + self.step
        self._complaints = complaints
        self._refusals = refusals
        self._latest: KafkaError | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return max(0.0, self.bound - self.elapsed())

    def _short(self, first: bool) -> bool:
        """Short: the first attempt of a client that may be refused (not plaintext) or that no
        broker answered yet, and any while every report is a refused connection."""
        if self._refusals is not None and self._refusals.refusing():
            return True
        protocol = str(self._kafka.config.get("security.protocol", "plaintext"))
        unreached = self._refusals is not None and not self._refusals.reached
        return first and (protocol.strip().lower() != "plaintext" or unreached)

    def call(self, attempt: Callable[[float], _T]) -> _T:
        """``attempt(timeout_s)`` until it answers, retrying unanswered attempts to the bound."""
        first = True
        while True:
            begun = time.monotonic()
            limit = FIRST_ATTEMPT_S if self._short(first) else self.step
            try:
                answer = attempt(max(0.001, min(limit, self.remaining())))
            except KafkaException as exc:
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                reason = scrub(str(exc) if error is None else error.str(), self._kafka.secrets)
                refused = None if error is None else security_error(self._kafka, self.what, error)
                if refused is not None:
                    raise refused from exc
                if error is None or error.code() not in _UNANSWERED:
                    raise KafkaUnavailableError(
                        f"{self.what}: the brokers answered with an error: {reason}; "
                        + error_hint(self._kafka)) from exc
            else:
                if self._refusals is not None:
                    self._refusals.answered()
                return answer
            first = False
            # a call that failed fast must not spin: one attempt per slice
            time.sleep(max(0.0, min(limit - (time.monotonic() - begun), self.remaining())))
            self.unanswered(reason)

    def unanswered(self, reason: str | None = None) -> None:
        """An attempt went unanswered: raise at the bound (at once when the client was refused,
        or nothing listens), log a warning every sixth of the bound."""
        # the client's latest report (the previous one if it made none since)
        latest = self._complaints() if self._complaints is not None else None
        complaint = self._latest = latest if latest is not None else self._latest
        refused = (security_error(self._kafka, self.what, complaint)
                   if complaint is not None else None)
        if refused is not None:
            raise refused
        if self._refusals is not None and self._refusals.refused_for() >= REFUSED_FOR_S:
            raise self._refusals.error(self.what, servers(self._kafka))
        detail = "; ".join(dict.fromkeys(
            scrub(r, self._kafka.secrets)
            for r in (complaint.str() if complaint is not None else None, reason) if r
        )) or "no answer"
        if self.remaining() <= 0:
            raise KafkaUnavailableError(
                f"{self.what}: no answer from bootstrap servers {servers(self._kafka)!r} "
                f"within {self.bound:g} s (option {WAIT_OPTION}="
                f"{self._kafka.poll_timeout_ms} bounds this wait; last error: {detail}); "
                + error_hint(self._kafka)
            )
        if time.monotonic() < self._next_warning - 0.05:  # an attempt ends a little early
            return
        self._next_warning = time.monotonic() + self.step
        logger.warning(
            "%s: still waiting for bootstrap servers %r after %.1f s, giving up in %.1f s "
            "(option %s=%d bounds the wait); last error: %s; client settings: %s",
            self.what, servers(self._kafka), self.elapsed(), self.remaining(), WAIT_OPTION,
            self._kafka.poll_timeout_ms, detail, self._kafka.safe_config,
        )


class ClientLog:
    """The Kafka clients' ``logger``: their lines go to the Python logger
    ``flinkish_source.kafka.client`` at DEBUG, not stderr (their errors reach the waits through
    ``error_cb``)."""

    _logger = logging.getLogger("flinkish_source.kafka.client")

    def log(self, level: int, message: str, *args: Any) -> None:
        self._logger.debug(message, *args)

    def __repr__(self) -> str:  # the consumer pool keys consumers by their settings' reprs
        return "ClientLog()"


CLIENT_LOG = ClientLog()


def consumer_config(kafka: KafkaClient, **overrides: Any) -> dict[str, Any]:
    """librdkafka settings for a manually assigned, never-committing consumer."""
    return {**kafka.client_config(), "group.id": f"flinkish-{uuid.uuid4().hex}",
            "error_cb": note_refusal, "enable.auto.commit": False, "enable.partition.eof": True,
            "auto.offset.reset": "error", "socket.timeout.ms": socket_timeout_ms(kafka),
            "log_level": 3, "logger": CLIENT_LOG, **overrides}


def socket_timeout_ms(kafka: KafkaClient) -> int:
    """librdkafka's ``socket.timeout.ms``: ``kafkaConsumer.pollTimeoutMs`` clamped to 1-60 s."""
    return min(60_000, max(1_000, kafka.poll_timeout_ms))


#: Idle consumers kept per client configuration, for as long as Spark's Kafka consumer cache
#: keeps them (``spark.kafka.consumer.cache.timeout``), evicted as often.
POOL_CAPACITY = 4
POOL_IDLE_TIMEOUT_S = 300.0
POOL_EVICT_INTERVAL_S = 60.0

PoolKey = tuple[tuple[str, str], ...]


def pool_key(config: dict[str, Any]) -> PoolKey:
    """Consumers are interchangeable when their settings are; ``group.id`` is a throwaway."""
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k != "group.id"))


@dataclass
class ConsumerPool:
    """Idle consumers of this process, keyed by client configuration (:func:`pool_key`); a
    borrowed one is in no idle list, so never shared. A forked child starts with an empty pool:
    a client's threads do not survive a fork, so the parent's consumers are never closed there.
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
    _topics: dict[int, set[str]] = field(default_factory=dict)  # by id() of a live consumer

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._forked.extend(c for idle in self._idle.values() for c, _ in idle)
            self._idle, self._pid, self._evictor, self._topics = {}, os.getpid(), None, {}
            self._lock = threading.Lock()

    def acquire(self, config: dict[str, Any]) -> Any:
        """An idle consumer of this configuration, or a new one (see :meth:`release`)."""
        consumer = self._take(pool_key(config))
        if consumer is None:
            consumer = self.factory(config)
            with self._lock:
                self.created += 1
        return consumer

    def new_topics(self, consumer: Any, topics: set[str]) -> set[str]:
        """Which of ``topics`` were never assigned to ``consumer`` before (they are now)."""
        with self._lock:
            known = self._topics.setdefault(id(consumer), set())
            new = topics - known
            known.update(new)
        return new

    def _discard(self, consumer: Any) -> None:
        self._topics.pop(id(consumer), None)
        with contextlib.suppress(Exception):
            consumer.close()

    def release(self, config: dict[str, Any], consumer: Any, clean: bool = True) -> None:
        """Kept for the next borrower with its assignment cleared, or closed if the borrower
        failed (``clean`` false)."""
        if clean and _reset(consumer):
            self._give_back(pool_key(config), consumer)
        else:
            self._discard(consumer)

    def _take(self, key: PoolKey) -> Any | None:
        with self._lock:
            self._check_fork()
            expired = self._expire_locked()
            idle = self._idle.get(key)
            consumer = idle.pop()[0] if idle else None
        for c in expired:
            self._discard(c)
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
            self._discard(c)

    def _expire_locked(self) -> list[Any]:
        now = self.clock()
        expired = [c for idle in self._idle.values() for c, t in idle
                   if now - t >= self.idle_timeout]
        self._idle = {key: keep for key, idle in self._idle.items()
                      if (keep := [(c, t) for c, t in idle if now - t < self.idle_timeout])}
        return expired

    def evict(self) -> int:
        """Close the consumers idle for longer than ``idle_timeout``; how many."""
        with self._lock:
            self._check_fork()
            expired = self._expire_locked()
        for c in expired:
            self._discard(c)
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
        with self._lock:
            self._check_fork()
            idle = [c for v in self._idle.values() for c, _ in v]
            self._idle = {}
        for c in idle:
            self._discard(c)


def _reset(consumer: Any) -> bool:
    try:
        consumer.unassign()
        return True
    except Exception:
        return False


POOL = ConsumerPool()
atexit.register(POOL.clear)


def read_consumer_config(kafka: KafkaClient) -> dict[str, Any]:
    """Settings of the consumers that read records (a user's kafka.* settings win)."""
    prefetch = {
        # a full queue postpones the next fetch by fetch.queue.backoff.ms (1 s by default),
        # which stalls a reader that drains the queue a chunk at a time
        "queued.min.messages": 100_000,
        "fetch.queue.backoff.ms": 10,
        "fetch.wait.max.ms": 50,
    }
    overrides = {k: v for k, v in prefetch.items() if k not in kafka.config}
    return consumer_config(kafka, **overrides)


#: How long a reader pauses before fetching again from an offset the leader said was out of
#: range while its earliest offset is not past it (a new leader still catching up)
SHORT_LOG_PAUSE_S = 0.05


@dataclass
class ShortLog:
    """A partition whose log ends (``high``) before offsets a range still needs, seen first at
    ``since``. A new leader may briefly report a high watermark below offsets already read, so
    the readers wait, as Kafka's consumer does, up to ``kafkaConsumer.pollTimeoutMs`` before
    the offsets count as lost."""

    high: int
    since: float = field(default_factory=time.monotonic)
    next_warning: float = 0.0

    def wait(self, options: SourceOptions, topic: str, partition: int, position: int,
             end: int) -> int | None:
        """None: keep waiting; else the bound passed and this is where reading resumes
        (:func:`lost_offsets`: raises unless ``failOnDataLoss`` is false)."""
        waited, bound = time.monotonic() - self.since, options.kafka.poll_timeout_ms / 1000
        if waited >= bound:
            return lost_offsets(
                options, topic, partition, position, end,
                f"its high watermark stayed at {self.high}, below the planned offsets, for "
                f"{waited:.1f} s (option {WAIT_OPTION}={options.kafka.poll_timeout_ms} bounds this "
                "wait): an unclean leader election truncated the log, or the topic was "
                "recreated")
        if time.monotonic() >= self.next_warning:
            logger.warning(
                "%s/%d: the leader reports high watermark %d, below offset %d still to read: "
                "waiting for it to catch up (a leader change), %.1f s so far, giving up in "
                "%.1f s (option %s)", topic, partition, self.high, position, waited,
                bound - waited, WAIT_OPTION)
            self.next_warning = time.monotonic() + retry_step(bound)
        return None


def retention_loss(options: SourceOptions, topic: str, partition: int, position: int,
                   earliest: int, end: int) -> int:
    """The partition's earliest offset passed ``position``: records still needed were deleted."""
    return min(end, lost_offsets(options, topic, partition, position, min(earliest, end),
                                 "deleted by retention or the topic was recreated"))


def lost_offsets(options: SourceOptions, topic: str, partition: int, first: int, resume: int,
                 why: str) -> int:
    """Offsets ``first..resume-1`` are gone: fail, or (failOnDataLoss=false) say so and skip."""
    message = (f"{topic}/{partition}: offsets {first}..{resume - 1} planned for this "
               f"micro-batch are no longer in Kafka ({why})")
    if options.offsets.fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to skip lost offsets and "
                            "continue")
    logger.warning("%s; skipping them because failOnDataLoss=false", message)
    return resume
