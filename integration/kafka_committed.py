"""What a ``read_committed`` consumer of a real Kafka sees of a topic, read from the raw record
batches (for the transaction client's and the Kafka sink's tests).

The embedded broker writes the COMMIT / ABORT control batches and the right last stable
offset, but answers Fetch with an empty list of aborted transactions, so librdkafka's
``read_committed`` consumer shows aborted records there. :func:`partition_view` reads a
partition's whole log (read_uncommitted) and tells each record's fate from its producer's next
control batch: committed (or not transactional), aborted, or still open.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from flinkish_kafka.connection import BrokerConnection, Reader, Writer

_FETCH = 1  # Fetch v4: every broker since Kafka 0.11 answers it, Kafka 4 too
_BATCH = struct.Struct(">qiibIhiqqqhii")  # the 61-byte record batch header
_TRANSACTIONAL, _CONTROL = 0x10, 0x20
COMMITTED, ABORTED, OPEN = "committed", "aborted", "open"


@dataclass
class _Fetched:
    """One partition of a Fetch v4 response."""

    error: int
    high_watermark: int
    last_stable_offset: int
    records: bytes


def _fetch(connection: BrokerConnection, topic: str, partition: int, offset: int,
           max_bytes: int, read_committed: bool) -> _Fetched:
    """One partition fetched from ``offset``, without waiting for records."""
    body = (Writer().int32(-1).int32(100).int32(0).int32(max_bytes)
            .int8(1 if read_committed else 0).int32(1).string(topic).int32(1)
            .int32(partition).int64(offset).int32(max_bytes).getvalue())
    answer: Reader = connection.call(_FETCH, 4, body)
    answer.int32()  # throttle time
    assert answer.int32() == 1 and answer.string() == topic and answer.int32() == 1
    answer.int32()  # partition
    error, high, stable = answer.int16(), answer.int64(), answer.int64()
    for _ in range(max(answer.int32(), 0)):  # aborted transactions: read from the markers
        answer.int64(), answer.int64()
    return _Fetched(error, high, stable, answer.bytes_() or b"")


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = raw[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


def _control_type(records: bytes) -> int:
    """The type of a control batch's record (0 abort, 1 commit), from its key."""
    pos = _varint(records, 0)[1] + 1  # length, attributes
    pos = _varint(records, _varint(records, pos)[1])[1]  # timestamp delta, offset delta
    _, pos = _varint(records, pos)  # key length
    return int(struct.unpack_from(">hh", records, pos)[1])


@dataclass(frozen=True)
class Record:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    producer_id: int
    fate: str  # COMMITTED (or not transactional), ABORTED, OPEN


def _records(batch: bytes) -> list[tuple[int, bytes | None, bytes | None,
                                          tuple[tuple[str, bytes | None], ...]]]:
    """(offset delta, key, value, headers) of an uncompressed v2 batch's records."""
    (count,) = struct.unpack_from(">i", batch, _BATCH.size - 4)
    pos, out = _BATCH.size, []
    for _ in range(count):
        _, pos = _varint(batch, pos)  # length
        pos += 1  # attributes
        _, pos = _varint(batch, pos)  # timestamp delta
        delta, pos = _varint(batch, pos)
        size, pos = _varint(batch, pos)
        key = None if size < 0 else bytes(batch[pos:pos + size])
        pos += max(size, 0)
        size, pos = _varint(batch, pos)
        value = None if size < 0 else bytes(batch[pos:pos + size])
        pos += max(size, 0)
        count_headers, pos = _varint(batch, pos)
        headers = []
        for _ in range(count_headers):
            size, pos = _varint(batch, pos)
            name = bytes(batch[pos:pos + size]).decode()
            pos += size
            size, pos = _varint(batch, pos)
            headers.append((name, None if size < 0 else bytes(batch[pos:pos + size])))
            pos += max(size, 0)
        out.append((delta, key, value, tuple(headers)))
    return out


def _connect(bootstrap: str) -> BrokerConnection:
    """A connection to the embedded brokers' one broker (the leader of every partition)."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    return BrokerConnection(host, int(port), {}, 30, speaks={_FETCH: (4, 4, 99, "Fetch")},
                            client_id="txn-view", max_response=1 << 28)


def partition_view(bootstrap: str, topic: str, partition: int = 0) -> list[Record]:
    """Every data record of the partition with its fate, read from the whole log."""
    connection = _connect(bootstrap)
    batches: list[tuple[int, int, int, bytes]] = []  # base offset, attributes, producer, bytes
    try:
        offset, high = 0, None
        while high is None or offset < high:
            fetched = _fetch(connection, topic, partition, offset, 8 << 20,
                             read_committed=False)
            assert fetched.error == 0, f"{topic}[{partition}]: Fetch error {fetched.error}"
            high = fetched.high_watermark
            data, pos = bytes(fetched.records), 0
            while pos + _BATCH.size <= len(data):
                (base, length, _, magic, _, attributes, last_delta, _, _, producer, _, _,
                 _) = _BATCH.unpack_from(data, pos)
                if pos + 12 + length > len(data):
                    break  # cut at the fetch's size: fetched again from its offset
                assert magic == 2
                assert not attributes & 0x07, "the producers here write uncompressed batches"
                batch = data[pos:pos + 12 + length]
                if base >= offset:
                    batches.append((base, attributes, producer, batch))
                offset = max(offset, base + last_delta + 1)
                pos += 12 + length
    finally:
        connection.close()
    out: list[Record] = []
    held: dict[int, list[Record]] = {}  # producer -> records awaiting a marker
    for base, attributes, producer, batch in batches:
        if attributes & _CONTROL:
            fate = COMMITTED if _control_type(batch[_BATCH.size:]) == 1 else ABORTED
            out += [Record(r.offset, r.key, r.value, r.headers, r.producer_id, fate)
                    for r in held.pop(producer, [])]
            continue
        transactional = bool(attributes & _TRANSACTIONAL)
        records = [Record(base + delta, key, value, headers, producer,
                          OPEN if transactional else COMMITTED)
                   for delta, key, value, headers in _records(batch)]
        if transactional:
            held.setdefault(producer, []).extend(records)
        else:
            out += records
    out += [r for records in held.values() for r in records]
    return sorted(out, key=lambda r: r.offset)


def stable_offsets(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
    """The partition's (last stable offset, high watermark): equal when no transaction is
    open in it."""
    connection = _connect(bootstrap)
    try:
        fetched = _fetch(connection, topic, partition, 0, 1, read_committed=True)
    finally:
        connection.close()
    return fetched.last_stable_offset, fetched.high_watermark


def committed_values(bootstrap: str, topic: str, partitions: int = 1) -> list[bytes | None]:
    """The committed view's values, partition after partition."""
    return [r.value for p in range(partitions) for r in partition_view(bootstrap, topic, p)
            if r.fate == COMMITTED]


def settled_values(bootstrap: str, topic: str, partitions: int = 1) -> list[bytes | None]:
    """:func:`committed_values`, checking that no transaction is left open (records without
    a marker, or a last stable offset behind the high watermark)."""
    for partition in range(partitions):
        left = [r for r in partition_view(bootstrap, topic, partition) if r.fate == OPEN]
        assert not left, f"{topic}[{partition}]: {len(left)} records in an open transaction"
        stable, high = stable_offsets(bootstrap, topic, partition)
        assert stable == high, (
            f"{topic}[{partition}]: last stable offset {stable} behind the high watermark "
            f"{high}: a transaction is open")
    return committed_values(bootstrap, topic, partitions)
