"""Kafka's Fetch request, its record batches decoded straight into Arrow.

Why: librdkafka hands Python one ``Message`` object per record, and taking them apart costs
more CPU than Spark spends on the rows (about 0.9 CPU-seconds per million records for
``consume()`` alone, before a column is built). Here a read task sends Fetch (version 4, which
every broker since Kafka 0.11 answers and Kafka 4 still does) to the partition's leader over
:class:`flinkish_kafka.connection.BrokerConnection` (the project's one Kafka protocol
connection: framing, ApiVersions, TLS, SASL) and
:mod:`flinkish_source.kafka._record_batch` (C) decodes the response's record batches into the
buffers of the key, value, offset and timestamp columns (and the headers', when the query reads
them).

Only what a read needs is spoken here: metadata, offsets and everything else stay with
librdkafka (:mod:`flinkish_source.kafka.librdkafka`), which also reads whatever this path does not:
a client configured for TLS or SASL (see :func:`flinkish_source.kafka.native.eligible`) and
batches in an old message format. Every
codec Kafka defines is decompressed here: gzip with zlib; snappy, lz4 and zstd with cramjam, an
optional dependency (the ``native`` extra: ``pip install 'flinkish[native]'``). Without it, a
batch in those codecs is read with librdkafka from its offset, with the fallback's WARNING
naming the install command.

Transactions follow Kafka's consumer: with ``read_committed`` a fetch returns records up to the
last stable offset and the aborted transactions among them; batches of an aborted transaction
are dropped from its first offset up to its abort marker, and control batches never reach the
output.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from flinkish_kafka.connection import BrokerConnection, ResponseTooLarge, UnsupportedVersionError
from flinkish_source.kafka import _record_batch  # type: ignore[attr-defined]
from flinkish_source.schema import arrow_schema

FETCH = 1
FETCH_VERSION = 4
_BATCH = struct.Struct(">qiibIhiqqqhii")  # the 61-byte record batch header
_MAGIC_AT = 16  # where every message format (v0, v1, v2) keeps its magic byte
_CONTROL_KEY = struct.Struct(">hh")  # version, type (0 abort, 1 commit)

#: Kafka error codes a read handles itself (the rest are reported by name and number)
OFFSET_OUT_OF_RANGE = 1
RETRIABLE = {
    3: "UNKNOWN_TOPIC_OR_PARTITION", 5: "LEADER_NOT_AVAILABLE", 6: "NOT_LEADER_OR_FOLLOWER",
    7: "REQUEST_TIMED_OUT", 13: "NETWORK_EXCEPTION", 74: "FENCED_LEADER_EPOCH",
    75: "UNKNOWN_LEADER_EPOCH",
}

#: names of the other codes a Fetch may answer, for the log (the reader hands them over)
_NAMES = {29: "TOPIC_AUTHORIZATION_FAILED", 35: "UNSUPPORTED_VERSION",
          76: "UNSUPPORTED_COMPRESSION_TYPE"}

_MODE_STRICT, _MODE_PLAIN, _MODE_ONE = 0, 1, 2  # see _record_batch.decode
_STOP_BATCH, _STOP_FULL = 2, 3  # the decoder's stops the caller acts on (0, 1: done here)


class UnsupportedBatch(Exception):
    """A record batch this path does not decode (an old message format, a payload its codec
    could not decompress): the caller reads the rest of the range with librdkafka."""


class FetchRefused(UnsupportedBatch):
    """The broker does not serve Fetch v4 (its ApiVersions says so: Kafka 4 dropped old
    versions, KIP-896), or answered with more than the client accepts: librdkafka reads."""


class BrokerError(Exception):
    """A broker answered a partition's fetch with an error code."""

    def __init__(self, topic: str, partition: int, code: int) -> None:
        name = RETRIABLE.get(code) or _NAMES.get(code, "an error")
        super().__init__(f"{topic}/{partition}: the broker answered the fetch with {name} "
                         f"(Kafka error code {code})")
        self.topic, self.partition, self.code = topic, partition, code

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE


@dataclass(frozen=True)
class FetchWant:
    """One partition of a Fetch request."""

    topic: str
    partition: int
    offset: int
    max_bytes: int


@dataclass
class PartitionFetch:
    """One partition of a Fetch response."""

    topic: str
    partition: int
    error: int
    high_watermark: int
    last_stable_offset: int
    aborted: list[tuple[int, int]]  # (producer id, first offset), by first offset
    records: memoryview


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def encode_fetch(wants: Sequence[FetchWant], max_wait_ms: int, max_bytes: int,
                 read_committed: bool, min_bytes: int = 1) -> bytes:
    """A Fetch v4 request's body (a consumer's: replica id -1)."""
    topics: dict[str, list[FetchWant]] = {}
    for want in wants:
        topics.setdefault(want.topic, []).append(want)
    body = [struct.pack(">iiiib", -1, max_wait_ms, min_bytes, max_bytes,
                        1 if read_committed else 0),
            struct.pack(">i", len(topics))]
    for topic, parts in topics.items():
        body.append(_string(topic))
        body.append(struct.pack(">i", len(parts)))
        body.extend(struct.pack(">iqi", w.partition, w.offset, w.max_bytes) for w in parts)
    return b"".join(body)


def decode_fetch(response: memoryview) -> list[PartitionFetch]:
    """The partitions of a Fetch v4 response body (after the correlation id); the records are
    views into ``response``."""
    pos = 4  # throttle_time_ms
    out: list[PartitionFetch] = []
    (topics,) = struct.unpack_from(">i", response, pos)
    pos += 4
    for _ in range(topics):
        (length,) = struct.unpack_from(">h", response, pos)
        topic = bytes(response[pos + 2:pos + 2 + length]).decode("utf-8")
        pos += 2 + length
        (parts,) = struct.unpack_from(">i", response, pos)
        pos += 4
        for _ in range(parts):
            partition, error, high, stable, count = struct.unpack_from(">ihqqi", response, pos)
            pos += 26
            aborted = []
            for _ in range(max(count, 0)):
                aborted.append(struct.unpack_from(">qq", response, pos))
                pos += 16
            (size,) = struct.unpack_from(">i", response, pos)
            pos += 4
            records = response[pos:pos + max(size, 0)]
            pos += max(size, 0)
            out.append(PartitionFetch(topic, partition, error, high, stable,
                                      sorted(aborted, key=lambda a: a[1]), records))
    return out


class FetchConnection:
    """One connection to one broker for Fetch requests, one in flight at a time: a
    :class:`flinkish_kafka.connection.BrokerConnection` (framing, ApiVersions, TLS and SASL
    from ``config``, librdkafka's settings). A broker that does not serve Fetch v4 raises
    :class:`FetchRefused` at once (librdkafka then reads) rather than closing the connection
    at every Fetch until the wait gives up; so does an answer larger than ``max_response``
    (``receive.message.max.bytes``)."""

    def __init__(self, host: str, port: int, config: Mapping[str, Any], timeout_s: float,
                 client_id: str, max_response: int) -> None:
        try:
            self._connection = BrokerConnection(
                host, port, config, timeout_s,
                speaks={FETCH: (FETCH_VERSION, FETCH_VERSION, 99, "Fetch")},
                client_id=client_id, max_response=max_response)
        except UnsupportedVersionError as exc:
            raise FetchRefused(str(exc)) from None
        self.address = self._connection.address
        low, high = self._connection.broker_versions.get(FETCH, (0, -1))
        if not low <= FETCH_VERSION <= high:
            self.close()
            raise FetchRefused(f"broker {self.address} serves Fetch versions {low}..{high}, "
                               f"not {FETCH_VERSION}")

    def close(self) -> None:
        self._connection.close()

    def fetch(self, wants: Sequence[FetchWant], max_wait_ms: int, max_bytes: int,
              read_committed: bool, min_bytes: int = 1) -> list[PartitionFetch]:
        body = encode_fetch(wants, max_wait_ms, max_bytes, read_committed, min_bytes)
        try:
            reader = self._connection.call(FETCH, FETCH_VERSION, body)
        except ResponseTooLarge as exc:
            raise FetchRefused(f"broker {self.address} answered with {exc.size} bytes, more "
                               f"than receive.message.max.bytes={exc.limit}") from None
        return decode_fetch(reader.data[reader.pos:])


@dataclass
class Columns:
    """Decoded records of one partition: Arrow arrays of equal length."""

    keys: pa.Array
    values: pa.Array
    offsets: pa.Array  # int64
    timestamps: pa.Array  # int64 milliseconds
    timestamp_types: pa.Array  # int32: 0 CreateTime, 1 LogAppendTime
    headers: pa.Array | None = None  # list<struct<key, value>> (the schema's), when asked

    def __len__(self) -> int:
        return len(self.offsets)


def _binary(n: int, offsets: bytes, data: bytes, valid: bytes | None, nulls: int) -> pa.Array:
    return pa.Array.from_buffers(
        pa.binary(), n,
        [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets),
         pa.py_buffer(data)],
        null_count=nulls,
    )


def _columns(decoded: tuple, with_headers: bool) -> Columns:
    (_, _, _, n, k_off, k_data, k_valid, k_nulls, v_off, v_data, v_valid, v_nulls, offsets,
     stamps, types, headers) = decoded
    return Columns(
        _binary(n, k_off, k_data, k_valid, k_nulls),
        _binary(n, v_off, v_data, v_valid, v_nulls),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(stamps)]),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(types)]),
        _headers(n, *headers) if with_headers else None,
    )


def _headers(n: int, count: int, lists: bytes, k_off: bytes, k_data: bytes, v_off: bytes,
             v_data: bytes, v_valid: bytes | None, v_nulls: int) -> pa.Array:
    """The headers column: per record a list of (key, value) structs."""
    keys = pa.Array.from_buffers(pa.string(), count,
                                 [None, pa.py_buffer(k_off), pa.py_buffer(k_data)])
    try:
        keys.validate(full=True)  # header keys are strings: UTF-8, as librdkafka decodes them
    except pa.ArrowInvalid as exc:
        raise UnsupportedBatch(f"a record header key is not UTF-8 ({exc})") from exc
    entries = pa.StructArray.from_arrays(
        [keys, _binary(count, v_off, v_data, v_valid, v_nulls)],
        fields=[pa.field("key", pa.string()), pa.field("value", pa.binary())])
    return pa.ListArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(lists)]), entries,
        type=arrow_schema(True).field("headers").type)


@dataclass
class PartitionDecoder:
    """Walks one partition's fetched record batches, ``start <= offset < end``, into
    :class:`Columns` of about ``chunk`` records; ``position`` is the next offset to fetch.

    Aborted transactions (``read_committed``) are tracked across fetches as Kafka's consumer
    tracks them: a producer's transactional batches are dropped from the first offset of an
    aborted transaction up to that producer's abort marker."""

    start: int
    end: int
    chunk: int
    headers: bool = False  # decode the records' headers too
    max_batch: int = 100_000_000  # a decompressed batch's bytes at most
    position: int = field(init=False)
    _aborting: set[int] = field(default_factory=set)  # producer ids inside an aborted txn
    _pending: list[tuple[int, int]] = field(default_factory=list)  # aborted, not yet reached

    def __post_init__(self) -> None:
        self.position = self.start

    @property
    def done(self) -> bool:
        return self.position >= self.end

    def decode(self, fetched: PartitionFetch) -> Iterator[Columns]:
        """The records of one fetch response's partition, in chunks; advances ``position``."""
        if fetched.aborted:
            known = set(self._pending)
            self._pending.extend(a for a in fetched.aborted if a not in known)
            self._pending.sort(key=lambda a: a[1])
        buf, pos = fetched.records, 0
        while not self.done:
            mode = _MODE_STRICT if (self._pending or self._aborting) else _MODE_PLAIN
            decoded = _record_batch.decode(buf, pos, self.position, self.end, self.chunk, mode,
                                           self.headers)
            stop, pos, after = decoded[0], decoded[1], decoded[2]
            self.position = max(self.position, min(after, self.end))
            if decoded[3]:
                yield _columns(decoded, self.headers)
            if stop == _STOP_BATCH:
                pos = yield from self._special(buf, pos)
            elif stop != _STOP_FULL:
                return

    def _special(self, buf: memoryview, pos: int) -> Generator[Columns, None, int]:
        """The batch at ``pos`` that the decoder left to us; the position after it."""
        (base,) = struct.unpack_from(">q", buf, pos)
        magic = buf[pos + _MAGIC_AT]
        if magic != 2:  # a v0/v1 message: none of the v2 fields below exist in it
            raise UnsupportedBatch(f"message format v{magic} (magic {magic}) at offset {base}")
        (base, length, _, magic, _, attributes, last_delta, _, _, producer, _, _,
         _) = _BATCH.unpack_from(buf, pos)
        after, size = base + last_delta + 1, length + 12
        while self._pending and self._pending[0][1] <= base + last_delta:
            self._aborting.add(self._pending.pop(0)[0])
        if attributes & 0x20:  # control: an abort marker ends its producer's transaction
            if _control_type(bytes(buf[pos + _BATCH.size:pos + size])) == 0:
                self._aborting.discard(producer)
        elif attributes & 0x10 and producer in self._aborting:
            pass  # a batch of an aborted transaction
        else:
            batch = buf[pos:pos + size] if attributes & 0x07 == 0 else _decompressed(
                bytes(buf[pos:pos + size]), attributes & 0x07, base, self.max_batch)
            decoded = _record_batch.decode(batch, 0, self.position, self.end, 1 << 62,
                                           _MODE_ONE, self.headers)
            if decoded[3]:
                yield _columns(decoded, self.headers)
        self.position = max(self.position, min(after, self.end))
        return pos + size


def _control_type(records: bytes) -> int | None:
    """The type of a control batch's record (0 abort, 1 commit), from its key."""
    pos = _varint(records, 0)[1] + 1  # length, attributes
    pos = _varint(records, _varint(records, pos)[1])[1]  # timestamp delta, offset delta
    key_len, pos = _varint(records, pos)
    return _CONTROL_KEY.unpack_from(records, pos)[1] if key_len >= 4 else None


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = raw[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


#: Kafka's record batch codecs (attributes bits 0-2)
CODECS = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
#: snappy as Kafka's Java producer writes it (xerial's SnappyOutputStream): this 8-byte magic,
#: two 4-byte version fields, then blocks of a 4-byte length and raw snappy
_XERIAL = b"\x82SNAPPY\x00"


def _decompressed(batch: bytes, codec: int, base: int, limit: int) -> bytes:
    """The batch with its records decompressed and its codec cleared; a batch that would
    exceed ``limit`` bytes is left to librdkafka."""
    name = CODECS.get(codec, f"codec {codec}")
    try:
        records = _decompress(batch[_BATCH.size:], codec, limit)
    except ModuleNotFoundError as exc:
        if exc.name != "cramjam":
            raise
        raise UnsupportedBatch(f"{name}-compressed record batch at offset {base}: the native "
                               f"path decompresses {name} with cramjam, which is not installed "
                               f"(pip install 'flinkish[native]')") from None
    except Exception as exc:  # the codec's own error: let librdkafka have its say
        raise UnsupportedBatch(f"{name}-compressed record batch at offset {base} could not be "
                               f"decompressed ({type(exc).__name__}: {exc})") from exc
    if records is None:
        raise UnsupportedBatch(f"{name}-compressed record batch at offset {base}")
    if len(records) > limit:
        raise UnsupportedBatch(f"{name}-compressed record batch at offset {base} decompresses "
                               f"to more than {limit} bytes (receive.message.max.bytes)")
    header = bytearray(batch[:_BATCH.size])
    struct.pack_into(">i", header, 8, _BATCH.size - 12 + len(records))
    (attributes,) = struct.unpack_from(">h", header, 21)
    struct.pack_into(">h", header, 21, attributes & ~0x07)
    return bytes(header) + records


def _decompress(payload: bytes, codec: int, limit: int) -> bytes | None:
    """A batch's records in the clear (None: a codec Kafka does not define). gzip stops one
    byte past ``limit``; cramjam's codecs have no such bound, so the caller checks after."""
    if codec == 1:
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        records = inflate.decompress(payload, limit + 1)
        if len(records) <= limit and not inflate.eof:
            raise zlib.error("incomplete or truncated gzip stream")
        return records
    if codec not in CODECS:
        return None
    import cramjam  # snappy, lz4 (frame format, KIP-57) and zstd

    if codec == 3:
        return bytes(cramjam.lz4.decompress(payload))
    if codec == 4:
        return bytes(cramjam.zstd.decompress(payload))
    if not payload.startswith(_XERIAL):  # librdkafka writes raw snappy
        return bytes(cramjam.snappy.decompress_raw(payload))
    blocks, pos = [], len(_XERIAL) + 8
    while pos < len(payload):
        (length,) = struct.unpack_from(">i", payload, pos)
        blocks.append(bytes(cramjam.snappy.decompress_raw(payload[pos + 4:pos + 4 + length])))
        pos += 4 + length
    return b"".join(blocks)


class RecordView:
    """One decoded record, with the accessors of confluent-kafka's ``Message`` that the
    per-record paths use (event time from a JSON field, punctuation)."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_timestamp", "_headers")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None,
                 value: bytes | None, timestamp: tuple[int, int],
                 headers: list[tuple[str, bytes | None]] | None = None) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._timestamp = key, value, timestamp
        self._headers = headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        """(librdkafka's timestamp type: 1 CreateTime, 2 LogAppendTime; milliseconds)"""
        return self._timestamp

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """(key, value) pairs, None when the record has none or they were not decoded (as
        librdkafka's ``Message.headers()``)."""
        return self._headers

    def error(self) -> None:
        return None


class RecordChunk(Sequence[RecordView]):
    """A chunk of one partition's records as Arrow columns (``columns``, what the reader
    builds rows from); indexing gives :class:`RecordView` objects, built on first use."""

    def __init__(self, topic: str, partition: int, columns: Columns) -> None:
        self.topic, self.partition, self.columns = topic, partition, columns
        self._views: list[RecordView] | None = None

    def __len__(self) -> int:
        return len(self.columns)

    def _all(self) -> list[RecordView]:
        if self._views is None:
            c = self.columns
            stamps = zip((t + 1 for t in c.timestamp_types.to_pylist()),
                         c.timestamps.to_pylist(), strict=True)
            headers: list[list[tuple[str, bytes | None]] | None] = (
                [None] * len(c) if c.headers is None else
                [[(h["key"], h["value"]) for h in hs] or None for hs in c.headers.to_pylist()])
            self._views = [
                RecordView(self.topic, self.partition, o, k, v, ts, h)
                for o, k, v, ts, h in zip(c.offsets.to_pylist(), c.keys.to_pylist(),
                                          c.values.to_pylist(), stamps, headers, strict=True)
            ]
        return self._views

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self._all()[index]
        if index in (0, -1) and self._views is None and self.columns.headers is None:
            # the first or last offset alone
            c, i = self.columns, index % len(self)
            return RecordView(self.topic, self.partition, c.offsets[i].as_py(),
                              c.keys[i].as_py(), c.values[i].as_py(),
                              (c.timestamp_types[i].as_py() + 1, c.timestamps[i].as_py()))
        return self._all()[index]

    def __iter__(self) -> Iterator[RecordView]:
        return iter(self._all())
