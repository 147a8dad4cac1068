"""A fault-injecting Kafka-protocol server on loopback, for the read path's conformance tests.

It speaks what the read path needs, at the versions it advertises in ApiVersions: ApiVersions
(v0-v3), Metadata (v1), ListOffsets (v1) and Fetch (v4), so librdkafka (confluent-kafka) reads
its logs. A log is a list of encoded entries (record
batches, or v0/v1 message sets) and the test steers the faults: an error code per Fetch
answer, a high watermark other than the log's end, the partition's leader (one server object
runs several brokers, each on its own port), the Fetch versions ApiVersions admits, and batches
cut at the request's partition byte limit as Kafka cuts them. As Apache Kafka, it answers a
Fetch (v4) whose records would include a zstd batch with UNSUPPORTED_COMPRESSION_TYPE.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from flinkish.demo.ports import server_socket

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA, API_VERSIONS = 0, 1, 2, 3, 18


@dataclass
class Log:
    """One partition: entries ``(first offset, last offset, bytes)`` in order, its earliest
    offset and its high watermark (the log's end unless a test lowers it)."""

    entries: list[tuple[int, int, bytes]] = field(default_factory=list)
    earliest: int = 0
    high: int | None = None
    leader: int = 1
    # ListOffsets by timestamp: record timestamps by offset (Kafka's answer: the first offset
    # at or after the time, -1 for none), or a fixed answer, as brokers that get it wrong give
    times: dict[int, int] = field(default_factory=dict)
    time_answer: int | None = None
    # records from this offset on are counted in the high watermark but not served, as a
    # broker stalled on its writes does
    withheld: int | None = None

    def offset_for_time(self, timestamp: int) -> int:
        if self.time_answer is not None:
            return self.time_answer
        return min((o for o, ts in self.times.items() if ts >= timestamp), default=-1)

    def append(self, first: int, last: int, raw: bytes) -> None:
        self.entries.append((first, last, raw))

    @property
    def end(self) -> int:
        return self.entries[-1][1] + 1 if self.entries else self.earliest

    @property
    def high_watermark(self) -> int:
        return self.end if self.high is None else self.high


#: Fetch fault: (broker id, topic, partition, offset) -> an error code to answer, or None
FetchFault = Callable[[int, str, int, int], "int | None"]


class FaultyKafka:
    """``brokers`` brokers on 127.0.0.1 serving ``logs`` (``{(topic, partition): Log}``)."""

    def __init__(self, logs: dict[tuple[str, int], Log], brokers: int = 1) -> None:
        self.logs = logs
        self.fetch_versions = (4, 4)
        self.fault: FetchFault = lambda broker, topic, partition, offset: None
        self.requests: list[tuple[int, int, int]] = []  # (broker, api key, version)
        self._lock = threading.Lock()
        self._servers: dict[int, socket.socket] = {}
        self.ports: dict[int, int] = {}
        self._stopped = False
        self._sessions: dict[socket.socket, threading.Thread] = {}
        for node in range(1, brokers + 1):
            server = server_socket()
            self._servers[node], self.ports[node] = server, server.getsockname()[1]
            threading.Thread(target=self._accept, args=(node, server), daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports.values())

    def close(self) -> None:
        self._stopped = True
        for server in self._servers.values():
            server.close()

    def disconnect(self) -> None:
        """Close every client's connection and wait until no answer is being made: a request
        a closed client sent last can otherwise reach a fault after the test re-armed it."""
        with self._lock:
            sessions = list(self._sessions.items())
        for conn, thread in sessions:
            with contextlib.suppress(OSError):  # the client closed it already
                conn.shutdown(socket.SHUT_RDWR)
            thread.join(timeout=30)
            assert not thread.is_alive(), "a session did not end within 30 s"

    def _accept(self, node: int, server: socket.socket) -> None:
        while not self._stopped:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._session, args=(node, conn), daemon=True)
            with self._lock:  # disconnect() sees only started sessions
                self._sessions[conn] = thread
                thread.start()

    def _session(self, node: int, conn: socket.socket) -> None:
        try:
            self._serve(node, conn)
        finally:
            with self._lock:
                self._sessions.pop(conn, None)

    def _serve(self, node: int, conn: socket.socket) -> None:
        with conn:
            while True:
                head = _recv(conn, 4)
                if head is None:
                    return
                body = _recv(conn, struct.unpack(">i", head)[0])
                if body is None:
                    return
                api, version, correlation, client = struct.unpack_from(">hhih", body)
                with self._lock:
                    self.requests.append((node, api, version))
                pos = 10 + max(client, 0)
                if api == API_VERSIONS:
                    answer = self._api_versions(version)
                elif api == API_METADATA:
                    answer = self._metadata(Reader(body, pos))
                elif api == API_LIST_OFFSETS:
                    answer = self._list_offsets(Reader(body, pos))
                elif api == API_FETCH and version == 4:
                    answer = self._fetch(node, Reader(body, pos))
                else:
                    return  # an API or version it does not serve: as Kafka, close
                framed = struct.pack(">i", correlation) + answer
                try:
                    conn.sendall(struct.pack(">i", len(framed)) + framed)
                except OSError:
                    return

    def _api_versions(self, version: int) -> bytes:
        # Produce v3 (never served) too: librdkafka enables the v2 message format only when
        # a broker lists it along with Fetch v4
        apis = [(API_FETCH, *self.fetch_versions), (API_LIST_OFFSETS, 1, 1),
                (API_METADATA, 1, 1), (API_VERSIONS, 0, 3), (API_PRODUCE, 0, 3)]
        if version >= 3:  # flexible: compact array, tagged fields
            out = struct.pack(">h", 0) + _uvarint(len(apis) + 1)
            out += b"".join(struct.pack(">hhh", *a) + b"\x00" for a in apis)
            return out + struct.pack(">i", 0) + b"\x00"
        out = struct.pack(">hi", 0, len(apis)) + b"".join(struct.pack(">hhh", *a) for a in apis)
        return out + (struct.pack(">i", 0) if version >= 1 else b"")

    def _metadata(self, req: Reader) -> bytes:
        count = req.int32()
        wanted = None if count < 0 else {req.string() for _ in range(count)}
        topics: dict[str, list[tuple[int, Log]]] = {}
        for (topic, partition), log in sorted(self.logs.items()):
            if wanted is None or topic in wanted:
                topics.setdefault(topic, []).append((partition, log))
        out = [struct.pack(">i", len(self.ports))]
        for node, port in self.ports.items():
            out.append(struct.pack(">i", node) + _string("127.0.0.1") + struct.pack(">ih", port,
                                                                                    -1))
        out.append(struct.pack(">ii", 1, len(topics)))
        for topic, parts in topics.items():
            out.append(struct.pack(">h", 0) + _string(topic) + struct.pack(">bi", 0, len(parts)))
            for partition, log in parts:
                out.append(struct.pack(">hiiiiii", 0, partition, log.leader, 1, log.leader, 1,
                                       log.leader))
        return b"".join(out)

    def _list_offsets(self, req: Reader) -> bytes:
        req.int32()  # replica id
        out = []
        topics = req.int32()
        out.append(struct.pack(">i", topics))
        for _ in range(topics):
            topic = req.string()
            parts = req.int32()
            out.append(_string(topic) + struct.pack(">i", parts))
            for _ in range(parts):
                partition, timestamp = req.int32(), req.int64()
                log = self.logs[(topic, partition)]
                offset = (log.earliest if timestamp == -2 else log.high_watermark
                          if timestamp == -1 else log.offset_for_time(timestamp))
                out.append(struct.pack(">ihqq", partition, 0, -1, offset))
        return b"".join(out)

    def _fetch(self, node: int, req: Reader) -> bytes:
        req.int32(), req.int32(), req.int32()  # replica id, max wait, min bytes
        req.int32(), req.int8()  # max bytes, isolation level
        out = [struct.pack(">i", 0)]
        topics = req.int32()
        out.append(struct.pack(">i", topics))
        for _ in range(topics):
            topic = req.string()
            parts = req.int32()
            out.append(_string(topic) + struct.pack(">i", parts))
            for _ in range(parts):
                partition, offset, max_bytes = req.int32(), req.int64(), req.int32()
                log = self.logs[(topic, partition)]
                error = self.fault(node, topic, partition, offset)
                if error is None and log.leader != node:
                    error = 6  # NOT_LEADER_OR_FOLLOWER
                if error is None and not log.earliest <= offset <= log.end:
                    error = 1  # OFFSET_OUT_OF_RANGE
                records = b"" if error else _records(log, offset, max_bytes)
                if not error and _has_zstd(records):
                    # Apache Kafka serves zstd batches from Fetch v10 only (KIP-110)
                    error, records = 76, b""  # UNSUPPORTED_COMPRESSION_TYPE
                high = log.high_watermark if not error else -1
                out.append(struct.pack(">ihqqi", partition, error or 0, high, high, -1))
                out.append(struct.pack(">i", len(records)) + records)
        return b"".join(out)


def _records(log: Log, offset: int, max_bytes: int) -> bytes:
    """The entries from the one holding ``offset`` up to the high watermark: whole entries
    while they fit ``max_bytes`` (the first one always, KIP-74), then the next one cut at the
    limit, as Kafka sends a log segment's bytes."""
    out = b""
    for first, last, raw in log.entries:
        if last < offset or first >= log.high_watermark:
            continue
        if log.withheld is not None and first >= log.withheld:
            break
        if out and len(out) + len(raw) > max_bytes:
            return out + raw[:max_bytes - len(out)]
        out += raw
    return out


def _has_zstd(records: bytes) -> bool:
    """Whether a whole v2 record batch among ``records`` is zstd-compressed."""
    pos = 0
    while pos + 23 <= len(records):
        (length,) = struct.unpack_from(">i", records, pos + 8)
        magic, attributes = records[pos + 16], struct.unpack_from(">h", records, pos + 21)[0]
        if magic == 2 and attributes & 0x07 == 4:
            return True
        pos += 12 + length
    return False


class Reader:
    """Big-endian fields of a request body, in order."""

    def __init__(self, body: bytes, pos: int) -> None:
        self.body, self.pos = body, pos

    def _take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.body, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def int8(self) -> int:
        return self._take(">b")

    def int32(self) -> int:
        return self._take(">i")

    def int64(self) -> int:
        return self._take(">q")

    def string(self) -> str:
        length = self._take(">h")
        text = self.body[self.pos:self.pos + length].decode()
        self.pos += length
        return text


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _recv(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = conn.recv(n - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data
