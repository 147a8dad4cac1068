"""Committing or aborting another producer's Kafka transaction, as Flink's KafkaSink committer
does: a write task leaves its librdkafka transaction open and hands the driver a
:class:`KafkaCommittable`; the driver ends it with FindCoordinator and EndTxn, since librdkafka
cannot resume a transaction. The coordinator's rules this relies on: the guide "Exactly once
into Kafka", section "What the sink relies on in Kafka's clients and brokers".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
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
#: v0 has no key type. EndTxn stops at v4: v5 is transaction version 2 (KIP-890), which bumps
#: the epoch at every EndTxn; librdkafka's producers run version 1.
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
        return asdict(self)

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
    """The coordinator aborted the transaction at its ``transaction.timeout.ms``, or a newer
    producer initialised the transactional id: its records are lost to the committed view."""


class TransactionTimeoutError(KafkaTransactionError):
    """The transaction could not be ended within the client's timeout; its outcome is unknown,
    and ending it again later is safe."""


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
    return (Writer(flexible=version >= 3).string(committable.transactional_id)
            .int64(committable.producer_id).int16(committable.producer_epoch)
            .boolean(committed).tags().getvalue())


def decode_end_txn(version: int, reader: Reader) -> int:
    """An EndTxn response body's error code."""
    reader.int32()  # throttle time
    return reader.int16()


class TransactionClient:
    """Ends transactions of a cluster, given a librdkafka client config as
    :func:`flinkish_kafka.java_security.client_config` makes it; ``timeout_s`` bounds each
    :meth:`commit` / :meth:`abort`, retries (what Kafka's producer retries) included.
    Thread-safe, one request at a time, a connection kept per coordinator.
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
        """The coordinator of ``transactional_id``, found once (on any broker that answers, the
        connected ones first) and remembered; raises :class:`BrokerUnavailable` for what is
        worth retrying."""
        if transactional_id in self._coordinators:
            return self._coordinators[transactional_id]
        problems = []
        for address in [*self._connections, *self._bootstrap]:
            try:
                connection = self._connection(address, deadline)
                version = connection.version(FIND_COORDINATOR)
                reader = connection.call(FIND_COORDINATOR, version,
                                         encode_find_coordinator(version, [transactional_id]),
                                         _remaining(deadline))
                for found in decode_find_coordinator(version, reader, [transactional_id]):
                    self._found(found, connection.address)
                return self._coordinators[transactional_id]
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
            connection = BrokerConnection(*address, self._config, _remaining(deadline),
                                          speaks=SPEAKS,
                                          client_id=str(self._config.get("client.id", "flinkish")))
            self._connections[address] = connection
        return connection

    def _drop_broken(self) -> None:
        for address, connection in list(self._connections.items()):
            if connection.closed:
                del self._connections[address]


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)
