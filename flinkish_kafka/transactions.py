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
  or another producer id answers ``INVALID_PRODUCER_ID_MAPPING``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["KafkaCommittable", "KafkaTransactionError", "TransactionClient",
           "TransactionFencedError"]


@dataclass(frozen=True)
class KafkaCommittable:
    """An open transaction a write task hands the driver to commit (Flink's
    ``KafkaCommittable``): who may end it, identified as the coordinator knows it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int

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


class TransactionClient:
    """Ends transactions of a cluster: ``config`` is a librdkafka-style client config
    (``bootstrap.servers``, ``security.protocol``, ``sasl.*``, ``ssl.*``, ``oauth_cb``), as
    :func:`flinkish_kafka.java_security.client_config` makes it; ``timeout_s`` bounds each
    :meth:`commit` / :meth:`abort`, retries included."""

    def __init__(self, config: Mapping[str, Any], timeout_s: float = 60.0) -> None:
        self._config = dict(config)
        self._timeout_s = timeout_s

    def commit(self, committable: KafkaCommittable) -> None:
        """Commit the transaction (idempotent: committing a committed one succeeds)."""
        raise NotImplementedError

    def abort(self, committable: KafkaCommittable) -> None:
        """Abort the transaction (idempotent: aborting an aborted one succeeds)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close every broker connection."""

    def __enter__(self) -> TransactionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
