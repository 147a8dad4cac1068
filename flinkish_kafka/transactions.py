"""Committing or aborting another producer's Kafka transaction, as Flink's KafkaSink committer
does (``FlinkKafkaInternalProducer.resumeTransaction`` + ``commitTransaction``).

A write task produces with librdkafka in a transaction it leaves open and hands the driver a
:class:`KafkaCommittable`: the transactional id and the producer id and epoch the coordinator
gave it (librdkafka's statistics show them under ``eos``). The driver ends it here with the two
requests the Java producer would send: FindCoordinator (key type 1, transaction) to learn which
broker coordinates the transactional id, then EndTxn(transactional id, producer id, epoch,
committed) to that broker. librdkafka has no way to resume a transaction, hence this client.

The rules of Kafka's ``TransactionCoordinator.handleEndTransaction`` (core's
``kafka.coordinator.transaction.TransactionCoordinator``) this relies on:

* an EndTxn from any connection ends the transaction if the producer id and epoch are the
  transactional id's current ones: the coordinator keeps no tie to the producer's connection;
* ending a transaction that is already complete the same way (COMMIT on ``CompleteCommit``,
  ABORT on ``CompleteAbort``) with the same epoch answers ``NONE``: a retried or replayed
  commit succeeds (a commit after Spark's replay of a batch, say);
* while the markers are being written (``PrepareCommit`` / ``PrepareAbort``) the same request
  answers ``CONCURRENT_TRANSACTIONS``: retried here until it completes;
* the other outcome (ABORT after a completed COMMIT, or the reverse) answers
  ``INVALID_TXN_STATE``;
* a transaction that outlives ``transaction.timeout.ms`` is aborted by the coordinator itself
  (``abortTimedOutTransactions`` → ``prepareFenceProducerEpoch``), which bumps the epoch, so
  the old epoch then answers ``PRODUCER_FENCED`` (``INVALID_PRODUCER_EPOCH`` below EndTxn v2);
  so does a newer ``InitProducerId`` on the transactional id (a producer's
  ``init_transactions()``), which aborts the open transaction first. Both raise
  :class:`TransactionFencedError`: the records are lost to the committed view;
* an unknown transactional id (never used, or expired after ``transactional.id.expiration.ms``)
  or another producer id answers ``INVALID_PRODUCER_ID_MAPPING``;
* a retried COMMIT succeeds only while the transactional id has begun nothing newer: once its
  producer (or a new one with the same id and epoch) has started another transaction, a late
  retry with the same epoch would end that one. The sink commits each committable before the
  id is used again, as Flink's does.

These are transaction version 1's rules (EndTxn up to v4), the version librdkafka's producers
speak; Kafka 4's coordinator keeps them for such clients (``handleEndTxnRequest`` takes EndTxn
v5 alone for version 2, which bumps the epoch at every end).

How librdkafka's producers and the test brokers behave around this, as measured: the guide
"Exactly once into Kafka", section "What the sink relies on in Kafka's clients and brokers".
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flinkish_core.secrets import scrub, secret_values
from flinkish_kafka.connection import (
    BrokerConnection,
    BrokerUnavailable,
    Reader,
    Security,
    Writer,
    broker_addresses,
    error_name,
)

__all__ = ["KafkaCommittable", "KafkaTransactionError", "TransactionClient",
           "TransactionFencedError", "TransactionTimeoutError"]

FIND_COORDINATOR = 10
END_TXN = 26
#: api key -> (lowest, highest version spoken, first flexible version, name). FindCoordinator
#: v0 has no key type (groups only). EndTxn stops at v4: v5 is transaction version 2
#: (KIP-890 part 2), whose coordinator bumps the epoch at every EndTxn and judges retries by
#: that bump; the producers whose transactions end here (librdkafka's) run version 1, whose
#: rules (the same epoch ends, and retries, a transaction) are the ones this module relies on.
SPEAKS = {FIND_COORDINATOR: (1, 6, 3, "FindCoordinator"), END_TXN: (0, 4, 3, "EndTxn")}
TRANSACTION_KEY_TYPE = 1

NONE = 0
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
CONCURRENT_TRANSACTIONS = 51
INVALID_PRODUCER_EPOCH = 47
PRODUCER_FENCED = 90
#: what Kafka's producer retries on EndTxn (``TransactionManager.EndTxnHandler``: the
#: coordinator errors after a new lookup, the other retriable ones as they are)
RETRIED = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
           CONCURRENT_TRANSACTIONS, 7, 13}  # 7 REQUEST_TIMED_OUT, 13 NETWORK_EXCEPTION
FIND_AGAIN = {COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR}
FENCED = {INVALID_PRODUCER_EPOCH, PRODUCER_FENCED}

_FIRST_BACKOFF_S, _MAX_BACKOFF_S = 0.05, 1.0
@dataclass(frozen=True)
class KafkaCommittable:
    """An open transaction a write task hands the driver to commit (Flink's
    ``KafkaCommittable``): who may end it, identified as the coordinator knows it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int

    def __post_init__(self) -> None:
        if not self.transactional_id or self.producer_id < 0 \
                or not 0 <= self.producer_epoch <= 32767:
            raise ValueError(
                f"not an open transaction's ids: {self!r} (a transactional id, a producer id "
                f">= 0 and an epoch 0..32767, as librdkafka's statistics show them under eos "
                f"once init_transactions() has returned)")

    def to_json(self) -> dict[str, Any]:
        return {"transactional_id": self.transactional_id, "producer_id": self.producer_id,
                "producer_epoch": self.producer_epoch}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KafkaCommittable:
        return cls(str(data["transactional_id"]), int(data["producer_id"]),
                   int(data["producer_epoch"]))


class KafkaTransactionError(Exception):
    """The coordinator refused to end the transaction; ``code`` and ``name`` are Kafka's."""

    def __init__(self, message: str, code: int, name: str) -> None:
        super().__init__(message)
        self.code, self.name = code, name


class TransactionFencedError(KafkaTransactionError):
    """The transaction can no longer be ended with these ids: the coordinator aborted it at its
    ``transaction.timeout.ms`` (bumping the epoch), or a newer producer initialised the
    transactional id. Kafka's ``INVALID_PRODUCER_EPOCH`` (47) or ``PRODUCER_FENCED`` (90)."""


class TransactionTimeoutError(KafkaTransactionError):
    """The transaction could not be ended within the client's timeout: the coordinator kept
    answering a retriable error, or no broker could be reached. Its outcome is unknown; ending it
    again later is safe (see the module's rules)."""


def encode_find_coordinator(version: int, keys: list[str]) -> bytes:
    """A FindCoordinator request body for transactional ids: one ``Key`` below v4, the batched
    ``CoordinatorKeys`` from v4 on (KIP-699)."""
    body = Writer(flexible=version >= 3)
    if version < 4:
        if len(keys) != 1:
            raise ValueError(f"FindCoordinator v{version} takes one key")
        body.string(keys[0]).int8(TRANSACTION_KEY_TYPE)
    else:
        body.int8(TRANSACTION_KEY_TYPE).array_length(len(keys))
        for key in keys:
            body.string(key)
    return body.tags().getvalue()


@dataclass(frozen=True)
class Coordinator:
    """One key's answer to FindCoordinator."""

    key: str
    error: int
    node_id: int
    host: str
    port: int
    message: str | None = None


def decode_find_coordinator(version: int, reader: Reader, keys: list[str]) -> list[Coordinator]:
    """A FindCoordinator response body: one answer per key (below v4, the one key's)."""
    if version >= 1:
        reader.int32()  # throttle time
    if version < 4:
        error = reader.int16()
        message = reader.string() if version >= 1 else None
        node, host, port = reader.int32(), reader.string() or "", reader.int32()
        reader.tags()
        return [Coordinator(keys[0], error, node, host, port, message)]
    out = []
    for _ in range(reader.array_length()):
        key = reader.string() or ""
        node, host, port = reader.int32(), reader.string() or "", reader.int32()
        error, message = reader.int16(), reader.string()
        reader.tags()
        out.append(Coordinator(key, error, node, host, port, message))
    reader.tags()
    return out


def encode_end_txn(version: int, committable: KafkaCommittable, committed: bool) -> bytes:
    """An EndTxn request body."""
    return (Writer(flexible=version >= 3).string(committable.transactional_id)
            .int64(committable.producer_id).int16(committable.producer_epoch)
            .boolean(committed).tags().getvalue())


def decode_end_txn(version: int, reader: Reader) -> int:
    """An EndTxn response body's error code (v5's producer id and epoch are not read: this
    client stops at v4)."""
    reader.int32()  # throttle time
    return reader.int16()


class TransactionClient:
    """Ends transactions of a cluster: ``config`` is a librdkafka-style client config
    (``bootstrap.servers``, ``security.protocol``, ``sasl.*``, ``ssl.*``, ``oauth_cb``), as
    :func:`flinkish_kafka.java_security.client_config` makes it; ``timeout_s`` bounds each
    :meth:`commit` / :meth:`abort`, retries included.

    Connections are kept, one per coordinator, and coordinators remembered per transactional
    id until a broker says it no longer is one. Retried, with backoff, is what Kafka's producer
    retries: ``COORDINATOR_LOAD_IN_PROGRESS``, ``CONCURRENT_TRANSACTIONS``, a lost connection,
    and ``COORDINATOR_NOT_AVAILABLE`` / ``NOT_COORDINATOR`` after finding the coordinator
    again. Thread-safe (one request at a time).
    """

    def __init__(self, config: Mapping[str, Any], timeout_s: float = 60.0) -> None:
        self._config = dict(config)
        self._timeout_s = timeout_s
        self._bootstrap = broker_addresses(str(self._config.get("bootstrap.servers", "")))
        Security.of(self._config)  # a wrong security.protocol fails here, not at a commit
        self._secrets = secret_values(self._config)
        self._connections: dict[tuple[str, int], BrokerConnection] = {}
        self._coordinators: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def commit(self, committable: KafkaCommittable) -> None:
        """Commit the transaction (idempotent: committing a committed one succeeds)."""
        self._end(committable, committed=True)

    def abort(self, committable: KafkaCommittable) -> None:
        """Abort the transaction (idempotent: aborting an aborted one succeeds)."""
        self._end(committable, committed=False)

    def commit_all(self, committables: Iterable[KafkaCommittable]) -> None:
        """Commit each transaction, their coordinators found with one request where the
        brokers speak FindCoordinator v4 (batched keys)."""
        todo = list(committables)
        with self._lock:
            deadline = time.monotonic() + self._timeout_s
            unknown = [c.transactional_id for c in todo
                       if c.transactional_id not in self._coordinators]
            with contextlib.suppress(BrokerUnavailable):  # each commit below retries
                self._find(sorted(set(unknown)), deadline)
        for committable in todo:
            self.commit(committable)

    def close(self) -> None:
        """Close every broker connection."""
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()

    def __enter__(self) -> TransactionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _say(self, text: str) -> str:
        return scrub(text, self._secrets)

    def _end(self, committable: KafkaCommittable, committed: bool) -> None:
        what = "commit" if committed else "abort"
        txn = (f"transaction {committable.transactional_id!r} (producer id "
               f"{committable.producer_id}, epoch {committable.producer_epoch})")
        with self._lock:
            deadline = time.monotonic() + self._timeout_s
            backoff, last, last_code = _FIRST_BACKOFF_S, "", -1
            while True:
                try:
                    address = self._coordinator(committable.transactional_id, deadline)
                    connection = self._connection(address, deadline)
                    version = connection.version(END_TXN)
                    error = decode_end_txn(version, connection.call(
                        END_TXN, version, encode_end_txn(version, committable, committed),
                        _remaining(deadline)))
                except BrokerUnavailable as exc:
                    self._coordinators.pop(committable.transactional_id, None)
                    self._drop_broken()
                    last, last_code = str(exc), -1
                else:
                    if error == NONE:
                        return
                    name = error_name(error)
                    said = (f"{what} of {txn} at coordinator {connection.address}: "
                            f"{name} ({error})")
                    if error in FENCED:
                        raise TransactionFencedError(self._say(
                            f"{said}: the coordinator aborted it at transaction.timeout.ms, or a "
                            f"newer producer initialised the transactional id"), error, name)
                    if error not in RETRIED:
                        raise KafkaTransactionError(self._say(said), error, name)
                    if error in FIND_AGAIN:
                        self._coordinators.pop(committable.transactional_id, None)
                    last, last_code = said, error
                if time.monotonic() + backoff >= deadline:
                    raise TransactionTimeoutError(self._say(
                        f"could not {what} {txn} within {self._timeout_s:g} s; last: {last}"),
                        last_code, error_name(last_code) if last_code >= 0 else "DISCONNECTED")
                time.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)

    def _coordinator(self, transactional_id: str, deadline: float) -> tuple[str, int]:
        """The coordinator of ``transactional_id``, found once and remembered; raises
        :class:`BrokerUnavailable` for what is worth retrying."""
        if transactional_id not in self._coordinators:
            self._find([transactional_id], deadline)
        return self._coordinators[transactional_id]

    def _find(self, keys: list[str], deadline: float) -> None:
        """FindCoordinator for ``keys`` on any broker that answers (the connected ones first,
        then the bootstrap servers); remembers the coordinators found."""
        if not keys:
            return
        problems = []
        for address in [*self._connections, *self._bootstrap]:
            try:
                connection = self._connection(address, deadline)
                version = connection.version(FIND_COORDINATOR)
                batches = [keys] if version >= 4 else [[key] for key in keys]
                for batch in batches:
                    reader = connection.call(FIND_COORDINATOR, version,
                                             encode_find_coordinator(version, batch),
                                             _remaining(deadline))
                    for found in decode_find_coordinator(version, reader, batch):
                        self._found(found, connection.address)
                return
            except BrokerUnavailable as exc:
                self._drop_broken()
                problems.append(str(exc))
        raise BrokerUnavailable(self._say("no broker found the transaction coordinator: "
                                          + "; ".join(problems)))

    def _found(self, found: Coordinator, broker: str) -> None:
        if found.error == NONE:
            self._coordinators[found.key] = (found.host, found.port)
            return
        name = error_name(found.error)
        said = (f"broker {broker} could not find the coordinator of transactional id "
                f"{found.key!r}: {name} ({found.error})"
                + (f": {found.message}" if found.message else ""))
        if found.error in (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE):
            raise BrokerUnavailable(self._say(said))
        raise KafkaTransactionError(self._say(said), found.error, name)

    def _connection(self, address: tuple[str, int], deadline: float) -> BrokerConnection:
        connection = self._connections.get(address)
        if connection is None:
            connection = BrokerConnection(address[0], address[1], self._config,
                                          _remaining(deadline), speaks=SPEAKS,
                                          client_id=str(self._config.get("client.id",
                                                                         "flinkish")))
            self._connections[address] = connection
        return connection

    def _drop_broken(self) -> None:
        """Forgets connections a failed call closed."""
        for address, connection in list(self._connections.items()):
            if connection.closed:
                del self._connections[address]


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)
