"""Secured Kafka listeners in front of a plain broker: TLS, mutual TLS and SASL, on loopback.

The embedded broker cannot serve a secured listener itself (Tansu 0.6.0 with
``--authentication`` refuses PLAIN, finds no SCRAM user in its in-memory storage, and does not
serve TLS), so :class:`SecuredKafka` is a proxy of ours in front of it, in an asyncio loop on a
thread of the test process. Each listener (one per :class:`Security`) accepts a client, then

- terminates TLS with a server certificate made at test time (``tests/pki.py``), requiring a
  client certificate signed by the test CA in the mutual-TLS mode;
- with SASL, relays ApiVersions to the broker (a Kafka broker lists SaslHandshake and
  SaslAuthenticate there whether or not it authenticates itself; Tansu does) and answers
  SaslHandshake (v0 with bare SASL tokens after it, v1 with SaslAuthenticate v0..v2) itself,
  checking the credentials (:mod:`integration.sasl_server`); a bad one is answered with
  ``SASL_AUTHENTICATION_FAILED`` (58) and the broker's message, and the connection closed;
- then pipes the connection to the broker byte for byte, except for the two responses that
  name brokers to librdkafka (Metadata, FindCoordinator; its admin client's cluster description
  is a Metadata request too): their hosts and ports are rewritten to this listener's own, so a
  client told where a partition's leader is comes back through the proxy.

Why rewrite rather than start one broker per listener advertising the proxy's address: one
broker then serves every listener and the plain ``kafka_bootstrap`` alike, so a test creates
and fills its topic the usual way and reads it through any listener. The rewrite touches only
the broker list at the head of those responses (the rest is copied unparsed), and each broker
a response names gets a port of its own on the listener, so a multi-broker cluster (an external
one, or a container) is proxied as faithfully as the single embedded broker.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from flinkish.demo.ports import server_socket
from integration.sasl_server import (
    MECHANISMS,
    AuthenticationFailed,
    Exchange,
    Login,
    TokenCheck,
    exchange,
)

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
API_VERSIONS = 18
METADATA = 3
FIND_COORDINATOR = 10
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58
MAX_FRAME = 100 * 1024 * 1024


@dataclass(frozen=True)
class Security:
    """What a listener demands; ``protocol`` is the client's ``security.protocol``."""

    protocol: str
    tls: bool
    sasl: bool
    client_certificate: bool = False


SASL_SSL = Security("SASL_SSL", tls=True, sasl=True)
SSL = Security("SSL", tls=True, sasl=False)
MUTUAL_TLS = Security("SSL", tls=True, sasl=False, client_certificate=True)
SASL_PLAINTEXT = Security("SASL_PLAINTEXT", tls=False, sasl=True)


class _Cursor:
    """Reads Kafka's primitive types from a response; ``flexible`` picks the compact forms."""

    def __init__(self, data: bytes, pos: int, flexible: bool) -> None:
        self.data, self.pos, self.flexible = data, pos, flexible

    def fixed(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def length(self, legacy: str) -> int:
        """A string's or array's length (-1 for null)."""
        return self.uvarint() - 1 if self.flexible else int(self.fixed(legacy))

    def string(self) -> str | None:
        n = self.length(">h")
        if n < 0:
            return None
        text = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return text

    def tags(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()
                self.pos += self.uvarint()


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str, flexible: bool) -> bytes:
    raw = text.encode()
    return (_uvarint(len(raw) + 1) if flexible else struct.pack(">h", len(raw))) + raw


def _nullable_string(text: str | None, flexible: bool) -> bytes:
    if text is not None:
        return _string(text, flexible)
    return b"\x00" if flexible else struct.pack(">h", -1)


@dataclass(frozen=True)
class _Address:
    """Where a broker's host and port sit in a response."""

    start: int
    end: int
    host: str
    port: int


def _address(cursor: _Cursor, found: list[_Address]) -> None:
    start = cursor.pos
    host = cursor.string() or ""
    port = int(cursor.fixed(">i"))
    if host and port >= 0:  # a coordinator lookup that failed names no broker
        found.append(_Address(start, cursor.pos, host, port))


def _flexible(api: int, version: int) -> bool:
    """Whether a response of these (Metadata v9+, FindCoordinator v3+) uses the compact
    encodings and tagged fields (KIP-482)."""
    return (api == METADATA and version >= 9) or (api == FIND_COORDINATOR and version >= 3)


def _broker_addresses(payload: bytes, api: int, version: int) -> list[_Address]:
    """The broker addresses in a Metadata or FindCoordinator response (``payload`` from the
    correlation id on). Everything after them is left unread."""
    c = _Cursor(payload, 4, _flexible(api, version))
    c.tags()  # the response header's
    found: list[_Address] = []
    if api == METADATA:
        if version >= 3:
            c.fixed(">i")  # throttle
        for _ in range(c.length(">i")):
            c.fixed(">i")  # node id
            _address(c, found)
            if version >= 1:
                c.string()  # rack
            c.tags()
    else:  # FindCoordinator
        if version >= 1:
            c.fixed(">i")
        if version < 4:
            c.fixed(">h")  # error code
            if version >= 1:
                c.string()
            c.fixed(">i")
            _address(c, found)
        else:
            for _ in range(c.length(">i")):
                c.string()  # key
                c.fixed(">i")
                _address(c, found)
                c.fixed(">h")
                c.string()
                c.tags()
    return found


def _rewritten(payload: bytes, found: list[_Address], ports: list[int], flexible: bool) -> bytes:
    out, at = bytearray(), 0
    for address, port in zip(found, ports, strict=True):
        out += payload[at:address.start] + _string("127.0.0.1", flexible) + struct.pack(">i", port)
        at = address.end
    return bytes(out + payload[at:])


class _Stream:
    """A client connection, in TLS when given an SSL context.

    TLS is spoken through an ``SSLObject`` on memory buffers rather than asyncio's own TLS
    transport, which drops the alert OpenSSL writes when a handshake fails (Python 3.11's
    ``sslproto`` aborts without flushing it): a client refused for want of a certificate would
    only see the connection close, where a Kafka broker's client is told
    "certificate required"."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 tls: ssl.SSLContext | None) -> None:
        self.reader, self.writer = reader, writer
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self.tls = None if tls is None else tls.wrap_bio(self._in, self._out, server_side=True)
        self._buffer = bytearray()

    async def handshake(self) -> None:
        assert self.tls is not None
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self.drain()
                await self._receive()
            except ssl.SSLError:
                await self.drain()  # the alert, so the client learns why
                raise
        await self.drain()

    async def _receive(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            raise asyncio.IncompleteReadError(b"", None)
        self._in.write(data)

    async def readexactly(self, n: int) -> bytes:
        if self.tls is None:
            return await self.reader.readexactly(n)
        while len(self._buffer) < n:
            try:
                chunk = self.tls.read(65536)
            except ssl.SSLWantReadError:
                await self.drain()
                await self._receive()
                continue
            except ssl.SSLZeroReturnError:
                chunk = b""
            if not chunk:  # the client's close_notify
                raise asyncio.IncompleteReadError(bytes(self._buffer), n)
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def write(self, data: bytes) -> None:
        if self.tls is None:
            self.writer.write(data)
        else:
            self.tls.write(data)

    async def drain(self) -> None:
        if self.tls is not None and self._out.pending:
            self.writer.write(self._out.read())
        await self.writer.drain()

    def peer_subject(self) -> dict[str, str]:
        assert self.tls is not None
        subject: Any = (self.tls.getpeercert() or {}).get("subject", ())
        return {key: value for rdn in subject for key, value in rdn}

    def close(self) -> None:
        self.writer.close()


Reader = _Stream | asyncio.StreamReader
Writer = _Stream | asyncio.StreamWriter


async def _frame(reader: Reader) -> bytes | None:
    """One size-prefixed frame, or None at the end of the stream."""
    try:
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        if not 0 <= size <= MAX_FRAME:
            return None
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        return None


def _send(writer: Writer, payload: bytes) -> None:
    writer.write(struct.pack(">i", len(payload)) + payload)


def _request_body(frame: bytes, flexible: bool) -> _Cursor:
    """A cursor at a request's body: past api key, version, correlation id, client id (always a
    classic nullable string) and, in flexible versions, the header's tagged fields."""
    c = _Cursor(frame, 8, flexible=False)
    c.string()
    c.flexible = flexible
    c.tags()
    return c


@dataclass
class _Listener:
    security: Security
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    servers: list[asyncio.Server] = field(default_factory=list)


class SecuredKafka:
    """Secured listeners in front of the broker at ``upstream`` ("host:port"), started on
    demand by :meth:`bootstrap`; :attr:`logins` records every successful authentication.
    A context manager: leaving it closes every listener and connection."""

    def __init__(self, upstream: str, server_pem: str, ca_pem: str, users: dict[str, str],
                 check: TokenCheck, mechanisms: tuple[str, ...] = MECHANISMS) -> None:
        host, _, port = upstream.split(",")[0].rpartition(":")
        self.upstream = (host, int(port))
        self.server_pem = server_pem  # the listeners' certificate chain and key
        self.ca_pem = ca_pem  # what a client certificate must be signed by
        self.users = users
        self.check = check
        self.mechanisms = mechanisms
        self.logins: list[Login] = []
        self._listeners: dict[Security, _Listener] = {}
        self._connections: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="secured-kafka",
                                        daemon=True)

    def __enter__(self) -> SecuredKafka:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def bootstrap(self, security: Security) -> str:
        """The bootstrap servers of the listener for ``security`` (opened on first use)."""
        port = asyncio.run_coroutine_threadsafe(
            self._route(security, self.upstream), self._loop).result(30)
        return f"127.0.0.1:{port}"

    async def _close(self) -> None:
        for listener in self._listeners.values():
            for server in listener.servers:
                server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    def _tls(self, security: Security) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.server_pem)
        if security.client_certificate:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca_pem)
        return context

    async def _route(self, security: Security, broker: tuple[str, int]) -> int:
        """This listener's port for ``broker``, opening one on first sight of it."""
        listener = self._listeners.setdefault(security, _Listener(security))
        port = listener.ports.get(broker)
        if port is None:
            tls = self._tls(security) if security.tls else None
            server = await asyncio.start_server(
                lambda r, w: self._accept(_Stream(r, w, tls), listener, broker),
                sock=server_socket())
            listener.servers.append(server)
            port = listener.ports[broker] = server.sockets[0].getsockname()[1]
        return port

    def _accept(self, client: _Stream, listener: _Listener, broker: tuple[str, int]) -> None:
        task = asyncio.ensure_future(self._serve(client, listener, broker))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, client: _Stream, listener: _Listener, broker: tuple[str, int]) -> None:
        up_writer: asyncio.StreamWriter | None = None
        try:
            if client.tls is not None:
                await asyncio.wait_for(client.handshake(), 10)
            if listener.security.client_certificate:
                self.logins.append(Login("SSL", f"CN={client.peer_subject()['commonName']}"))
            up_reader, up_writer = await asyncio.open_connection(*broker)
            if listener.security.sasl and not await self._authenticate(
                    client, up_reader, up_writer):
                return
            pending: dict[int, tuple[int, int]] = {}
            ahead = asyncio.ensure_future(self._requests(client, up_writer, pending))
            back = asyncio.ensure_future(self._responses(up_reader, client, pending, listener))
            try:
                await asyncio.wait([ahead, back], return_when=asyncio.FIRST_COMPLETED)
            finally:
                ahead.cancel()
                back.cancel()
                await asyncio.gather(ahead, back, return_exceptions=True)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
            pass  # a client gone or refused mid-way: nothing to pipe any more
        finally:
            client.close()
            if up_writer is not None:
                up_writer.close()

    async def _authenticate(self, client: _Stream, up_reader: asyncio.StreamReader,
                            up_writer: asyncio.StreamWriter) -> bool:
        """Runs the SASL exchange; True once the client is logged in."""
        current: Exchange | None = None
        bare_tokens = False  # SaslHandshake v0: the SASL messages follow without Kafka framing
        while True:
            frame = await _frame(client)
            if frame is None:
                return False
            if bare_tokens and current is not None:
                try:
                    reply = current.step(frame)
                except AuthenticationFailed:
                    return False  # v0 has no way to say why: Kafka closes the connection
                _send(client, reply)
                await client.drain()
                if current.login is not None:
                    self.logins.append(current.login)
                    return True
                continue
            api, version, correlation = struct.unpack_from(">hhi", frame)
            if api == API_VERSIONS:
                _send(up_writer, frame)
                answer = await _frame(up_reader)
                if answer is None:
                    return False
                _send(client, answer)
            elif api == SASL_HANDSHAKE:
                mechanism = _request_body(frame, flexible=False).string() or ""
                known = mechanism in self.mechanisms
                current = exchange(mechanism, self.users, self.check) if known else None
                bare_tokens = known and version == 0
                listed = struct.pack(">i", len(self.mechanisms)) + b"".join(
                    _string(m, False) for m in self.mechanisms)
                _send(client, struct.pack(">ih", correlation,
                                          0 if known else UNSUPPORTED_SASL_MECHANISM) + listed)
            elif api == SASL_AUTHENTICATE and current is not None:
                flexible = version >= 2
                body = _request_body(frame, flexible)
                size = body.length(">i")
                message = frame[body.pos:body.pos + size]
                try:
                    reply, error, text = current.step(message), 0, None
                except AuthenticationFailed as failed:
                    reply, error, text = b"", SASL_AUTHENTICATION_FAILED, str(failed)
                out = struct.pack(">i", correlation) + (b"\x00" if flexible else b"")
                out += struct.pack(">h", error) + _nullable_string(text, flexible)
                out += (_uvarint(len(reply) + 1) if flexible
                        else struct.pack(">i", len(reply))) + reply
                if version >= 1:
                    out += struct.pack(">q", 0)  # session lifetime: no re-authentication
                _send(client, out + (b"\x00" if flexible else b""))
                await client.drain()
                if error:
                    return False
                if current.login is not None:
                    self.logins.append(current.login)
                    return True
            else:
                return False  # any other request before authentication: Kafka closes too
            await client.drain()

    async def _requests(self, reader: Reader, up_writer: asyncio.StreamWriter,
                        pending: dict[int, tuple[int, int]]) -> None:
        while (frame := await _frame(reader)) is not None:
            api, version, correlation = struct.unpack_from(">hhi", frame)
            if api in (METADATA, FIND_COORDINATOR):
                pending[correlation] = (api, version)
            _send(up_writer, frame)
            await up_writer.drain()

    async def _responses(self, up_reader: asyncio.StreamReader, writer: Writer,
                         pending: dict[int, tuple[int, int]], listener: _Listener) -> None:
        while (frame := await _frame(up_reader)) is not None:
            rewrite = pending.pop(struct.unpack_from(">i", frame)[0], None)
            if rewrite is not None:
                api, version = rewrite
                found = _broker_addresses(frame, api, version)
                ports = [await self._route(listener.security, (a.host, a.port)) for a in found]
                frame = _rewritten(frame, found, ports, _flexible(api, version))
            _send(writer, frame)
            await writer.drain()

