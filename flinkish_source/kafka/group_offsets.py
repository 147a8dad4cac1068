"""Completed epochs' end offsets committed to a Kafka consumer group, for monitoring only
(Flink's ``commit.offsets.on.checkpoint``; Spark's Kafka source never commits).

Committed once Spark has the epoch in its commit log: when Spark plans from the epoch's end, or
when the session's listener passes on its progress (:mod:`flinkish_source.epoch_notices`),
whichever comes first, and only for an epoch this reader planned and has not committed. Nothing
reads these offsets back; a failed commit is logged and tried again, never failing the query.
See docs/semantics.md, "Consumer-group offsets".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from flinkish_source.kafka.base import TopicPartitionKey
from flinkish_source.options import KafkaClient

logger = logging.getLogger(__name__)

#: How long the same offsets wait before they are tried again after a failed commit: Spark
#: plans every few milliseconds while there is no data, each planning a warning otherwise.
RETRY_INTERVAL_S = 30.0

#: How many planned epochs are remembered for completed-epoch notices: Spark runs one batch at a
#: time, and a notice arrives before the next few are planned.
PLANNED_KEPT = 8


class GroupOffsetCommitter:
    """Commits offsets to ``kafka.commit_group`` with a consumer that never subscribes, so it
    never joins the group or takes partitions from another member (Kafka accepts such commits
    from a "simple" consumer: generation -1, no member id)."""

    def __init__(self, kafka: KafkaClient) -> None:
        assert kafka.commit_group is not None
        self._kafka = kafka
        self._consumer: Any = None
        self.committed: dict[TopicPartitionKey, int] = {}
        # the offsets of the last failed commit and when it failed (monotonic seconds)
        self._failed: tuple[dict[TopicPartitionKey, int], float] | None = None
        # planning and completed-epoch notices commit from different threads
        self._lock = threading.Lock()
        # the epochs planned and not committed yet, oldest first (their end offsets' keys)
        self._planned: deque[str] = deque(maxlen=PLANNED_KEPT)

    def _client(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer({
                **self._kafka.client_config(),
                "group.id": self._kafka.commit_group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "log_level": 3,
            })
        return self._consumer

    def planned(self, epoch: str) -> None:
        """Spark is about to run the epoch ``epoch`` (its end offset's key)."""
        with self._lock:
            self._planned.append(epoch)

    def expects(self, epoch: str) -> bool:
        """Whether ``epoch`` is planned and not committed yet."""
        with self._lock:
            return epoch in self._planned

    def epoch_committed(self, epoch: str, offsets: Mapping[TopicPartitionKey, int],
                        notice: bool = False) -> bool:
        """Spark has committed ``epoch``, which ends at ``offsets``: commit them, and forget the
        epochs up to it. A ``notice`` counts only for an epoch still planned."""
        with self._lock:
            if epoch in self._planned:
                while self._planned.popleft() != epoch:
                    pass
            elif notice:
                return False
            return self._commit_changed(offsets)

    def _commit_changed(self, offsets: Mapping[TopicPartitionKey, int]) -> bool:
        """Commit ``offsets`` unless the group holds them already; False, with a warning, when Kafka
        refused or could not be reached."""
        changed = {tp: o for tp, o in offsets.items() if self.committed.get(tp) != o}
        if not changed:
            return True
        if self._failed is not None:
            failed, at = self._failed
            if failed == dict(offsets) and time.monotonic() - at < RETRY_INTERVAL_S:
                return False
        ok = self._commit(changed)
        self._failed = None if ok else (dict(offsets), time.monotonic())
        return ok

    def _commit(self, changed: Mapping[TopicPartitionKey, int]) -> bool:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            results = self._client().commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(changed.items())],
                asynchronous=False,
            )
        except KafkaException as exc:
            logger.warning(
                "could not commit offsets of %s partitions to consumer group %s (monitoring "
                "only; the next epoch commits again): %s", len(changed),
                self._kafka.commit_group, exc)
            return False
        failed = [r for r in results or [] if r.error is not None]
        for r in results or []:
            if r.error is None:
                self.committed[(r.topic, r.partition)] = r.offset
        if failed:
            logger.warning(
                "consumer group %s refused the offsets of %s (monitoring only; the next epoch "
                "commits again): %s", self._kafka.commit_group,
                ", ".join(f"{r.topic}/{r.partition}" for r in failed), failed[0].error)
            return False
        return True

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
