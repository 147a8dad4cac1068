"""Kafka record batches (KIP-98, magic 2) encoded by the format's specification, for the logs
of tests/kafka_server.py."""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass

import cramjam

BASE_TS = 1_700_000_000_000


def varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(raw: bytes | None) -> bytes:
    return varint(-1) if raw is None else varint(len(raw)) + raw


@dataclass
class Rec:
    offset_delta: int
    key: bytes | None
    value: bytes | None
    ts_delta: int = 0
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def encode(self) -> bytes:
        body = (b"\x00" + varint(self.ts_delta) + varint(self.offset_delta) + _field(self.key)
                + _field(self.value) + varint(len(self.headers))
                + b"".join(_field(k.encode()) + _field(v) for k, v in self.headers))
        return varint(len(body)) + body


def compress(payload: bytes, codec: int, xerial: bool = False) -> bytes:
    """Records compressed as Kafka's producers write them: gzip, snappy (raw as librdkafka
    writes it, or in xerial's framing as the Java producer does), lz4 frames, zstd frames."""
    if codec == 1:
        return gzip.compress(payload)
    if codec == 2 and xerial:
        block = bytes(cramjam.snappy.compress_raw(payload))
        return (b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
                + struct.pack(">i", len(block)) + block)
    if codec == 2:
        return bytes(cramjam.snappy.compress_raw(payload))
    if codec == 3:
        return bytes(cramjam.lz4.compress(payload))
    if codec == 4:
        return bytes(cramjam.zstd.compress(payload))
    return b"\x00" * 8  # a codec Kafka does not define


def batch(base: int, records: list[Rec], *, codec: int = 0, log_append: bool = False,
          transactional: bool = False, control: bool = False, producer: int = -1,
          magic: int = 2, max_ts: int | None = None, last_delta: int | None = None,
          xerial: bool = False, payload: bytes | None = None) -> bytes:
    """One record batch; ``payload`` replaces the (compressed) records."""
    if payload is None:
        payload = b"".join(r.encode() for r in records)
        if codec:
            payload = compress(payload, codec, xerial)
    attributes = codec | (0x08 if log_append else 0) | (0x10 if transactional else 0) | (
        0x20 if control else 0)
    last = last_delta if last_delta is not None else max(r.offset_delta for r in records)
    top = max_ts if max_ts is not None else BASE_TS + max(r.ts_delta for r in records)
    after_length = struct.pack(">ibIhiqqqhii", 0, magic, 0, attributes, last, BASE_TS, top,
                               producer, 0, 0, len(records)) + payload
    return struct.pack(">qi", base, len(after_length)) + after_length


def plain(base: int, n: int, *, first: int = 0) -> bytes:
    return batch(base, [Rec(i, b"k%d" % (base + i), b"v%d" % (base + i), ts_delta=i)
                        for i in range(first, n)])


def control(base: int, producer: int, abort: bool) -> bytes:
    key = struct.pack(">hh", 0, 0 if abort else 1)
    return batch(base, [Rec(0, key, struct.pack(">hi", 0, 0))], control=True,
                 transactional=True, producer=producer)


def _bytes_field(raw: bytes | None) -> bytes:
    return struct.pack(">i", -1) if raw is None else struct.pack(">i", len(raw)) + raw


def legacy_message(offset: int, magic: int, key: bytes | None, value: bytes | None, *,
                   timestamp: int = BASE_TS, codec: int = 0) -> bytes:
    """One message of the old formats (v0: no timestamp; v1: a timestamp after the
    attributes), as a log entry: offset, size, then crc, magic, attributes, … (KIP-32)."""
    body = struct.pack(">bb", magic, codec)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    body += _bytes_field(key) + _bytes_field(value)
    import zlib

    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(message)) + message


def legacy_set(base: int, magic: int, n: int, *, codec: int = 0,
               timestamp: int = BASE_TS) -> bytes:
    """``n`` messages ``k<offset>``/``v<offset>`` from offset ``base``; with a codec, wrapped
    in one compressed message whose offset is the last inner one (inner offsets relative in
    v1, absolute in v0, as Kafka writes them)."""
    inner = b"".join(
        legacy_message((i if magic == 1 and codec else base + i), magic, b"k%d" % (base + i),
                       b"v%d" % (base + i), timestamp=timestamp)
        for i in range(n))
    if not codec:
        return inner
    wrapped = gzip.compress(inner) if codec == 1 else bytes(cramjam.snappy.compress_raw(inner))
    return legacy_message(base + n - 1, magic, None, wrapped, timestamp=timestamp, codec=codec)
