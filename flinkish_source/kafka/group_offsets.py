"""Completed epochs' end offsets committed to a Kafka consumer group, for monitoring only.

Flink's ``KafkaSource`` commits the offsets of every completed checkpoint to its consumer group
(``commit.offsets.on.checkpoint``) so that the tools Kafka users already run (lag exporters,
``kafka-consumer-groups``) show the job's progress; Spark's Kafka source never does
(SPARK-27549). flinkish does what Flink does: when a query names a group
(``SourceOptions.commit_group``), the driver commits the end offsets of each epoch once Spark
has durably committed that epoch. The checkpoint stays the only truth: nothing ever reads these
offsets back, and a failed commit is logged and superseded by the next epoch's, never failing
the query.

Spark calls the reader's ``commit(end)`` for epoch N when it plans epoch N+1, after N's commit
log is written, so the group's offsets trail the query by one micro-batch, and the last epoch
of a run is committed when the query next starts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flinkish_source.kafka.base import TopicPartitionKey
from flinkish_source.options import SourceOptions

logger = logging.getLogger(__name__)


class GroupOffsetCommitter:
    """Commits offsets to ``options.commit_group`` with a consumer that never subscribes, so
    it never joins the group or takes partitions from another member (Kafka accepts such
    commits from a "simple" consumer: generation -1, no member id)."""

    def __init__(self, options: SourceOptions) -> None:
        assert options.commit_group is not None
        self._options = options
        self._consumer: Any = None
        self.committed: dict[TopicPartitionKey, int] = {}

    def _client(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer({
                **self._options.client_config(),
                "group.id": self._options.commit_group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "log_level": 3,
            })
        return self._consumer

    def commit(self, offsets: Mapping[TopicPartitionKey, int]) -> bool:
        """Commit ``offsets`` (the next offset to read, per partition); False, with a warning,
        when Kafka refused or could not be reached (the next epoch's commit supersedes it)."""
        from confluent_kafka import KafkaException, TopicPartition

        changed = {tp: o for tp, o in offsets.items() if self.committed.get(tp) != o}
        if not changed:
            return True
        try:
            results = self._client().commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(changed.items())],
                asynchronous=False,
            )
        except KafkaException as exc:
            logger.warning(
                "could not commit offsets of %s partitions to consumer group %s (monitoring "
                "only; the next epoch commits again): %s", len(changed),
                self._options.commit_group, exc)
            return False
        failed = [r for r in results or [] if r.error is not None]
        for r in results or []:
            if r.error is None:
                self.committed[(r.topic, r.partition)] = r.offset
        if failed:
            logger.warning(
                "consumer group %s refused the offsets of %s (monitoring only; the next epoch "
                "commits again): %s", self._options.commit_group,
                ", ".join(f"{r.topic}/{r.partition}" for r in failed), failed[0].error)
            return False
        return True

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
