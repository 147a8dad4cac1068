"""Open Kafka transactions and what became of them, for the transaction client's tests.

:func:`open_transaction` has a confluent-kafka producer begin a transaction, produce and flush,
and leave it open; its :class:`KafkaCommittable` comes from librdkafka's statistics (``eos``).
Run as a script (``python -m integration.kafka_transactions BOOTSTRAP TOPIC TXN_ID HOW``), a
child process does the same, prints the committable as JSON and then ends the way ``HOW`` says
(:data:`ENDINGS`), for the question of what librdkafka does with an open transaction when its
producer goes away.

What became of them: :mod:`integration.kafka_committed`.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Producer

from flinkish_kafka.transactions import KafkaCommittable

#: how the child ends after printing its committable
ENDINGS = ("del", "close", "exit", "os_exit")


def open_transaction(config: Mapping[str, Any], topic: str, transactional_id: str,
                     values: list[bytes], timeout: float = 30) -> tuple[Producer,
                                                                        KafkaCommittable]:
    """A producer with an open transaction holding ``values`` (flushed), and its committable.
    Keep the producer referenced while the transaction must stay open."""
    eos: dict[str, Any] = {}

    def stats(text: str) -> None:
        eos.update(json.loads(text).get("eos", {}))

    producer = Producer({**config, "transactional.id": transactional_id,
                         "compression.type": "none", "statistics.interval.ms": 50,
                         "stats_cb": stats})
    producer.init_transactions(timeout)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(timeout) == 0
    eos.clear()  # statistics from before the flush may name an older state
    deadline = time.monotonic() + timeout
    while eos.get("txn_state") != "InTransaction" or eos.get("producer_id", -1) < 0:
        assert time.monotonic() < deadline, f"no producer id in librdkafka's statistics: {eos}"
        producer.poll(0.05)
    return producer, KafkaCommittable(transactional_id, int(eos["producer_id"]),
                                      int(eos["producer_epoch"]))


def _child(bootstrap: str, topic: str, transactional_id: str, how: str) -> None:
    producer, committable = open_transaction({"bootstrap.servers": bootstrap}, topic,
                                             transactional_id, [b"child-0", b"child-1"])
    print(json.dumps(committable.to_json()), flush=True)
    sys.stdin.readline()  # the test says when
    if how == "del":
        del producer
        gc.collect()
        print("deleted", flush=True)
        sys.stdin.readline()
    elif how == "close":
        producer.close()
    elif how == "os_exit":
        os._exit(0)
    # "exit" (and after "del" or "close"): the interpreter exits normally


if __name__ == "__main__":
    _child(*sys.argv[1:5])
