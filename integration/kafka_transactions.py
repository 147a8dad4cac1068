"""Open Kafka transactions and what became of them, for the transaction client's tests.

:func:`open_transaction` has a confluent-kafka producer begin a transaction, produce and flush,
and leave it open; its :class:`KafkaCommittable` comes from librdkafka's statistics (``eos``).
Run as a script (``python -m integration.kafka_transactions BOOTSTRAP TOPIC TXN_ID HOW``), a
child process does the same, prints the committable as JSON and then ends the way ``HOW`` says
(:data:`ENDINGS`), for the question of what librdkafka does with an open transaction when its
producer goes away.

:func:`partition_view` reads a partition's record batches with Fetch (read_uncommitted, the
whole log) and tells each record's fate from its producer's next control batch: committed,
aborted, or still open. The embedded broker's Fetch does not list aborted transactions, so
this is the committed view a real Kafka's ``read_committed`` serves, computed from the markers.
"""

from __future__ import annotations

import gc
import json
import os
import struct
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from flinkish_kafka.transactions import KafkaCommittable
from flinkish_source.kafka.protocol import BrokerConnection, FetchWant, _control_type, _varint

_BATCH = struct.Struct(">qiibIhiqqqhii")  # the 61-byte record batch header (magic 2)
_TRANSACTIONAL, _CONTROL = 0x10, 0x20
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


@dataclass(frozen=True)
class Record:
    offset: int
    value: bytes
    producer_id: int
    fate: str  # "committed" (or not transactional), "aborted", "open"


def _records(batch: bytes, count: int) -> list[tuple[int, bytes | None, bytes]]:
    """(offset delta, key, value) of an uncompressed v2 batch's records."""
    out, pos = [], _BATCH.size
    for _ in range(count):
        _, pos = _varint(batch, pos)  # length
        pos += 1  # attributes
        _, pos = _varint(batch, pos)  # timestamp delta
        delta, pos = _varint(batch, pos)
        length, pos = _varint(batch, pos)
        key = None if length < 0 else batch[pos:pos + length]
        pos += max(length, 0)
        length, pos = _varint(batch, pos)
        value = batch[pos:pos + max(length, 0)]
        pos += max(length, 0)
        headers, pos = _varint(batch, pos)
        for _ in range(headers):
            for _ in range(2):
                length, pos = _varint(batch, pos)
                pos += max(length, 0)
        out.append((delta, key, value))
    return out


def partition_view(bootstrap: str, topic: str, partition: int = 0) -> list[Record]:
    """Every data record of the partition with its fate, read from the whole log."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    connection = BrokerConnection(host, int(port), 10, "txn-view", 64 << 20)
    batches: list[tuple[int, int, int, bytes]] = []  # base offset, attributes, producer, bytes
    try:
        offset, high = 0, None
        while high is None or offset < high:
            (fetched,) = connection.fetch([FetchWant(topic, partition, offset, 8 << 20)], 100,
                                          8 << 20, read_committed=False)
            assert fetched.error == 0, fetched.error
            high = fetched.high_watermark
            data, pos = bytes(fetched.records), 0
            while pos + _BATCH.size <= len(data):
                (base, length, _, magic, _, attributes, last_delta, _, _, producer, _, _,
                 _) = _BATCH.unpack_from(data, pos)
                if pos + 12 + length > len(data):
                    break  # cut at the fetch's size: fetched again from its offset
                assert magic == 2 and attributes & 0x07 == 0
                if base >= offset:
                    batches.append((base, attributes, producer, data[pos:pos + 12 + length]))
                offset = max(offset, base + last_delta + 1)
                pos += 12 + length
    finally:
        connection.close()
    out: list[Record] = []
    open_records: dict[int, list[Record]] = {}  # producer -> records awaiting a marker
    for base, attributes, producer, batch in batches:
        count = _BATCH.unpack_from(batch)[-1]
        if attributes & _CONTROL:
            fate = "committed" if _control_type(batch[_BATCH.size:]) == 1 else "aborted"
            out += [Record(r.offset, r.value, r.producer_id, fate)
                    for r in open_records.pop(producer, [])]
            continue
        records = [Record(base + delta, value, producer,
                          "open" if attributes & _TRANSACTIONAL else "committed")
                   for delta, _, value in _records(batch, count)]
        if attributes & _TRANSACTIONAL:
            open_records.setdefault(producer, []).extend(records)
        else:
            out += records
    out += [r for records in open_records.values() for r in records]
    return sorted(out, key=lambda r: r.offset)


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    return [r.value for r in partition_view(bootstrap, topic) if r.fate == "committed"]


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
