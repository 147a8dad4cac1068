"""A scripted Kafka transaction coordinator on loopback, for the transaction client's tests.

Brokers (one thread per connection) answer ApiVersions with the ranges a test sets, and
FindCoordinator and EndTxn with the answers a test queues: an error code, or :data:`DROP` to
close the connection instead of answering. Every request is recorded with its decoded fields.
Responses are written out here from Kafka's message definitions, independently of the
client's encoder; requests are read with the client's :class:`~flinkish_kafka.connection.Reader`
(the requests' bytes are checked against the definitions in the tests' encoding cases).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from flinkish.demo.ports import server_socket
from flinkish_kafka.connection import Reader
from tests.kafka_server import _recv
from tests.kafka_server import _uvarint as uvarint

API_VERSIONS, FIND_COORDINATOR, END_TXN = 18, 10, 26
FLEXIBLE_FROM = {API_VERSIONS: 3, FIND_COORDINATOR: 3, END_TXN: 3}
DROP = "drop"


def string(text: str | None, flexible: bool) -> bytes:
    if text is None:
        return uvarint(0) if flexible else struct.pack(">h", -1)
    raw = text.encode()
    return (uvarint(len(raw) + 1) if flexible else struct.pack(">h", len(raw))) + raw


@dataclass
class Request:
    node: int
    api: int
    version: int
    fields: dict[str, Any]


@dataclass
class FakeCoordinator:
    """``brokers`` brokers; FindCoordinator names ``coordinator`` (a node id) for every key."""

    brokers: int = 1
    coordinator: int = 1
    versions: dict[int, tuple[int, int]] = field(default_factory=lambda: {
        API_VERSIONS: (0, 3), FIND_COORDINATOR: (0, 4), END_TXN: (0, 3)})
    find_answers: list[int | str] = field(default_factory=list)  # queued; then 0
    end_answers: list[int | str] = field(default_factory=list)  # queued; then 0
    requests: list[Request] = field(default_factory=list)
    #: how an ApiVersions above our range is refused: "kip-511" (v0's layout, as Kafka), or
    #: "mock" (librdkafka's mock cluster: the request's flexible layout, the array counted
    #: without KIP-482's +1)
    refusal: str = "kip-511"

    def __post_init__(self) -> None:
        self.ports: dict[int, int] = {}
        self._servers: list[socket.socket] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        for node in range(1, self.brokers + 1):
            server = server_socket()
            self._servers.append(server)
            self.ports[node] = server.getsockname()[1]
            threading.Thread(target=self._accept, args=(node, server), daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports.values())

    def of(self, api: int) -> list[Request]:
        return [r for r in self.requests if r.api == api]

    def close(self) -> None:
        for sock in self._servers + self._conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked on it
            sock.close()

    def __enter__(self) -> FakeCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self, node: int, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(node, conn), daemon=True).start()

    def _serve(self, node: int, conn: socket.socket) -> None:
        with conn:
            while (frame := _recv_frame(conn)) is not None:
                api, version, correlation = struct.unpack_from(">hhi", frame)
                (client_length,) = struct.unpack_from(">h", frame, 8)
                pos = 10 + max(client_length, 0)
                flexible = version >= FLEXIBLE_FROM[api]
                body = Reader(frame[pos:], flexible)
                body.tags()  # request header v2's
                with self._lock:
                    answer = self._answer(node, api, version, body)
                if answer is None:
                    return
                header = struct.pack(">i", correlation)
                if flexible and api != API_VERSIONS:
                    header += uvarint(0)
                conn.sendall(struct.pack(">i", len(header) + len(answer)) + header + answer)

    def _answer(self, node: int, api: int, version: int, body: Reader) -> bytes | None:
        flexible = body.flexible
        tags = uvarint(0) if flexible else b""
        if api == API_VERSIONS:
            self.requests.append(Request(node, api, version, {}))
            low, high = self.versions[API_VERSIONS]
            if version > high and self.refusal == "mock":
                return struct.pack(">h", 35) + b"\x01" + struct.pack(">hhh", API_VERSIONS, low,
                                                                      high) + b"\x00" * 6
            if version > high:  # KIP-511: v0's layout, the error and our range
                return struct.pack(">hi", 35, 1) + struct.pack(">hhh", API_VERSIONS, low, high)
            items = b"".join(struct.pack(">hhh", key, lo, hi) + tags
                             for key, (lo, hi) in self.versions.items())
            count = uvarint(len(self.versions) + 1) if flexible else struct.pack(
                ">i", len(self.versions))
            out = struct.pack(">h", 0) + count + items
            if version >= 1:
                out += struct.pack(">i", 0)
            return out + tags
        host, port = "127.0.0.1", self.ports[self.coordinator]
        if api == FIND_COORDINATOR:
            if version < 4:
                keys = [body.string() or ""]
                fields: dict[str, Any] = {"key_type": body.int8(), "keys": keys}
            else:
                fields = {"key_type": body.int8()}
                fields["keys"] = keys = [body.string() or "" for _ in range(body.array_length())]
            self.requests.append(Request(node, api, version, fields))
            error = self.find_answers.pop(0) if self.find_answers else 0
            if error == DROP:
                return None
            assert isinstance(error, int)
            if version < 4:
                out = struct.pack(">i", 0) + struct.pack(">h", error) + string(None, flexible)
                return out + struct.pack(">i", self.coordinator) + string(host, flexible) \
                    + struct.pack(">i", port) + tags
            out = struct.pack(">i", 0) + uvarint(len(keys) + 1)
            for key in keys:
                out += string(key, True) + struct.pack(">i", self.coordinator) \
                    + string(host, True) + struct.pack(">ih", port, error) + string(None, True) \
                    + tags
            return out + tags
        assert api == END_TXN
        fields = {"transactional_id": body.string(), "producer_id": body.int64(),
                  "producer_epoch": body.int16(), "committed": body.int8() == 1,
                  "node": node}
        self.requests.append(Request(node, api, version, fields))
        error = self.end_answers.pop(0) if self.end_answers else 0
        if error == DROP:
            return None
        assert isinstance(error, int)
        return struct.pack(">ih", 0, error) + tags


def _recv_frame(conn: socket.socket) -> bytes | None:
    head = _recv(conn, 4)
    if head is None:
        return None
    return _recv(conn, struct.unpack(">i", head)[0])
