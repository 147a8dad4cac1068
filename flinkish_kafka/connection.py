"""A blocking connection to one Kafka broker, for the request librdkafka cannot send for us:
EndTxn for another producer's transaction (:mod:`flinkish_kafka.transactions`).

A new connection does what Kafka's clients do: TLS, ApiVersions (each request then at the
highest version both sides speak: Kafka 4 dropped old ones, KIP-896), then SASL (PLAIN, SCRAM,
OAUTHBEARER). Settings are librdkafka's, as :func:`flinkish_kafka.java_security.client_config`
builds them, ``oauth_cb`` included. Every socket operation has a timeout; errors name the broker
and never carry a secret of the config.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import socket
import ssl
import struct
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partialmethod
from typing import Any

from flinkish_core.errors import OptionError
from flinkish_core.secrets import scrub, secret_values

__all__ = ["API_VERSIONS", "AuthenticationError", "BrokerConnection", "BrokerUnavailable",
           "Reader", "Security", "UnsupportedVersionError", "Writer", "broker_addresses",
           "error_name"]

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
UNSUPPORTED_VERSION = 35

#: The APIs this client sends: api key -> (lowest, highest version, first flexible one, name).
SPOKEN: dict[int, tuple[int, int, int, str]] = {
    API_VERSIONS: (0, 3, 3, "ApiVersions"),
    # v0 (bare SASL tokens after it) is Kafka < 1.0's; removed in 4.0
    SASL_HANDSHAKE: (1, 1, 99, "SaslHandshake"),
    SASL_AUTHENTICATE: (0, 2, 2, "SaslAuthenticate"),
}

#: Kafka's names for the error codes this package reports (``Errors.java``)
ERROR_NAMES: dict[int, str] = {
    -1: "UNKNOWN_SERVER_ERROR", 7: "REQUEST_TIMED_OUT", 13: "NETWORK_EXCEPTION",
    14: "COORDINATOR_LOAD_IN_PROGRESS", 15: "COORDINATOR_NOT_AVAILABLE", 16: "NOT_COORDINATOR",
    33: "UNSUPPORTED_SASL_MECHANISM", 34: "ILLEGAL_SASL_STATE", 35: "UNSUPPORTED_VERSION",
    42: "INVALID_REQUEST", 47: "INVALID_PRODUCER_EPOCH", 48: "INVALID_TXN_STATE",
    49: "INVALID_PRODUCER_ID_MAPPING", 51: "CONCURRENT_TRANSACTIONS",
    53: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", 58: "SASL_AUTHENTICATION_FAILED",
    59: "UNKNOWN_PRODUCER_ID", 90: "PRODUCER_FENCED", 105: "TRANSACTIONAL_ID_NOT_FOUND",
    120: "TRANSACTION_ABORTABLE",
}

MAX_RESPONSE = 64 * 1024 * 1024


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, "UNKNOWN_ERROR")


class BrokerUnavailable(ConnectionError):
    """The broker could not be reached, or the connection broke or timed out: worth retrying
    on a new connection."""


class UnsupportedVersionError(Exception):
    """The broker speaks no version of an API this client speaks (or none at all)."""


class AuthenticationError(Exception):
    """TLS or SASL refused the client: retrying with the same settings cannot succeed."""


class Writer:
    """Kafka's primitive types, appended; ``flexible`` picks the compact forms (KIP-482)."""

    def __init__(self, flexible: bool = False) -> None:
        self.flexible = flexible
        self.parts: list[bytes] = []

    def _fixed(self, fmt: str, value: int) -> Writer:
        self.parts.append(struct.pack(fmt, value))
        return self

    int8 = partialmethod(_fixed, ">b")
    int16 = partialmethod(_fixed, ">h")
    int32 = partialmethod(_fixed, ">i")
    int64 = partialmethod(_fixed, ">q")

    def boolean(self, value: bool) -> Writer:
        return self.int8(1 if value else 0)

    def uvarint(self, value: int) -> Writer:
        out = bytearray()
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        self.parts.append(bytes(out))
        return self

    def _length(self, length: int | None, legacy: str) -> None:
        if self.flexible:
            self.uvarint(0 if length is None else length + 1)
        else:
            self.parts.append(struct.pack(legacy, -1 if length is None else length))

    def string(self, text: str | None) -> Writer:
        raw = None if text is None else text.encode("utf-8")
        self._length(None if raw is None else len(raw), ">h")
        if raw:
            self.parts.append(raw)
        return self

    def bytes_(self, data: bytes) -> Writer:
        self._length(len(data), ">i")
        self.parts.append(data)
        return self

    def array_length(self, length: int) -> Writer:
        self._length(length, ">i")
        return self

    def tags(self) -> Writer:
        """An empty tagged-field section (flexible versions only)."""
        if self.flexible:
            self.uvarint(0)
        return self

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class Reader:
    """Kafka's primitive types, read in order from a response body."""

    def __init__(self, data: bytes | bytearray | memoryview, flexible: bool = False) -> None:
        self.data, self.pos, self.flexible = memoryview(data), 0, flexible

    def _fixed(self, fmt: str) -> int:
        return int(struct.unpack(fmt, self._raw(struct.calcsize(fmt)))[0])

    int8 = partialmethod(_fixed, ">b")
    int16 = partialmethod(_fixed, ">h")
    int32 = partialmethod(_fixed, ">i")
    int64 = partialmethod(_fixed, ">q")

    def uvarint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self._fixed(">B")
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ValueError("a varint longer than 5 bytes")

    def _length(self, legacy: str) -> int:
        """A length, -1 for null."""
        return self.uvarint() - 1 if self.flexible else self._fixed(legacy)

    def _raw(self, length: int) -> bytes:
        if self.pos + length > len(self.data):
            raise ValueError(f"the response ends at byte {len(self.data)}, inside a field")
        raw = bytes(self.data[self.pos:self.pos + length])
        self.pos += length
        return raw

    def string(self) -> str | None:
        length = self._length(">h")
        return None if length < 0 else self._raw(length).decode("utf-8")

    def bytes_(self) -> bytes | None:
        length = self._length(">i")
        return None if length < 0 else self._raw(length)

    def array_length(self) -> int:
        return max(self._length(">i"), 0)

    def tags(self) -> None:
        """Skips a tagged-field section (flexible versions only): every tag is unknown here."""
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()  # the tag
                self._raw(self.uvarint())


def request_frame(api: int, version: int, correlation: int, client_id: str, flexible: bool,
                  body: bytes) -> bytes:
    """A request, size-prefixed: header v1 (api key, version, correlation id, client id as a
    classic nullable string even in v2), plus v2's empty tagged fields when ``flexible``."""
    header = Writer().int16(api).int16(version).int32(correlation).string(client_id)
    if flexible:
        header.uvarint(0)
    head = header.getvalue()
    return struct.pack(">i", len(head) + len(body)) + head + body


def broker_addresses(servers: str) -> list[tuple[str, int]]:
    """``bootstrap.servers`` as (host, port) pairs (``host:port``, ``[v6]:port``; scheme
    prefixes like ``SASL_SSL://`` are dropped, as librdkafka does)."""
    out = []
    for item in servers.split(","):
        item = item.strip().rpartition("://")[2]
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise OptionError(f"option bootstrap.servers: {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise OptionError("option bootstrap.servers is required (host:port[,host:port…])")
    return out


# --- TLS ------------------------------------------------------------------------------------

def _tls_context(config: Mapping[str, Any]) -> ssl.SSLContext:
    """An SSL context from librdkafka's ``ssl.*`` settings."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    verify = str(config.get("enable.ssl.certificate.verification", "true")).lower() != "false"
    algorithm = str(config.get("ssl.endpoint.identification.algorithm", "https")).lower()
    if algorithm not in ("https", "none", ""):
        raise OptionError(f"option ssl.endpoint.identification.algorithm={algorithm}: "
                          "accepted are https and none")
    context.check_hostname = verify and algorithm == "https"
    context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    try:
        if config.get("ssl.ca.location"):
            location = str(config["ssl.ca.location"])
            if os.path.isdir(location):
                context.load_verify_locations(capath=location)
            else:
                context.load_verify_locations(cafile=location)
        elif config.get("ssl.ca.pem"):
            context.load_verify_locations(cadata=str(config["ssl.ca.pem"]))
        elif verify:
            context.load_default_certs()
    except (OSError, ssl.SSLError) as exc:
        raise OptionError(f"option ssl.ca.location / ssl.ca.pem: the CA certificates cannot be "
                          f"read ({exc.__class__.__name__}: {exc})") from None
    password = config.get("ssl.key.password")
    if config.get("ssl.certificate.location") or config.get("ssl.key.location"):
        certificate = config.get("ssl.certificate.location") or config.get("ssl.key.location")
        key = config.get("ssl.key.location") or certificate
        _load_chain(context, str(certificate), str(key), password)
    elif config.get("ssl.certificate.pem") or config.get("ssl.key.pem"):
        if not (config.get("ssl.certificate.pem") and config.get("ssl.key.pem")):
            raise OptionError("options ssl.certificate.pem and ssl.key.pem go together")
        # ssl loads a chain from files only: a private file, gone once loaded
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
            pem.write(f"{config['ssl.key.pem']}\n{config['ssl.certificate.pem']}\n")
            pem.flush()
            _load_chain(context, pem.name, pem.name, password)
    if config.get("ssl.keystore.location"):
        raise OptionError("option ssl.keystore.location (PKCS#12) is not read by this client: "
                          "give kafka.ssl.keystore.* (converted to PEM) or ssl.certificate.location"
                          " and ssl.key.location")
    return context


def _load_chain(context: ssl.SSLContext, certificate: str, key: str, password: Any) -> None:
    try:
        context.load_cert_chain(certificate, key, None if password is None else str(password))
    except (OSError, ssl.SSLError) as exc:
        raise OptionError(f"options ssl.certificate.* / ssl.key.*: the client certificate or key "
                          f"cannot be loaded ({exc.__class__.__name__}; a wrong "
                          f"ssl.key.password?)") from None


# --- SASL -----------------------------------------------------------------------------------

class _Sasl:
    """One client side of a SASL exchange: ``first()`` then ``step(server)`` until ``done``."""

    done = False

    def first(self) -> bytes:
        raise NotImplementedError

    def step(self, server: bytes) -> bytes | None:
        """The next client message, or None when the exchange is complete."""
        self.done = True
        return None


class _Plain(_Sasl):
    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user, password

    def first(self) -> bytes:
        return f"\0{self.user}\0{self.password}".encode()


class _Scram(_Sasl):
    """RFC 5802 (SCRAM-SHA-256: RFC 7677) without channel binding, as Kafka's ScramSaslClient."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self.hash = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        self.user = user.replace("=", "=3D").replace(",", "=2C")
        self.password = password
        self.nonce = base64.b64encode(secrets.token_bytes(24)).decode()
        self.state = 0
        self.server_signature = b""

    def first(self) -> bytes:
        self.client_first_bare = f"n={self.user},r={self.nonce}"
        return f"n,,{self.client_first_bare}".encode()

    def _hmac(self, key: bytes, text: bytes) -> bytes:
        return hmac.new(key, text, self.hash).digest()

    def step(self, server: bytes) -> bytes | None:
        text = server.decode()
        fields = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
        if self.state == 0:
            if "e" in fields:
                raise AuthenticationError(f"the server refused the SCRAM login: {fields['e']}")
            nonce = fields.get("r", "")
            if not nonce.startswith(self.nonce) or "s" not in fields or "i" not in fields:
                raise AuthenticationError("the server's SCRAM first message is malformed")
            salted = hashlib.pbkdf2_hmac(self.hash, self.password.encode(),
                                         base64.b64decode(fields["s"]), int(fields["i"]))
            client_key = self._hmac(salted, b"Client Key")
            stored = hashlib.new(self.hash, client_key).digest()
            final_bare = f"c=biws,r={nonce}"
            auth = f"{self.client_first_bare},{text},{final_bare}".encode()
            signature = self._hmac(stored, auth)
            proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
            self.server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth)
            self.state = 1
            return f"{final_bare},p={base64.b64encode(proof).decode()}".encode()
        if "e" in fields:
            raise AuthenticationError(f"the server refused the SCRAM login: {fields['e']}")
        if base64.b64decode(fields.get("v", "")) != self.server_signature:
            raise AuthenticationError("the server's SCRAM signature is wrong (not the server "
                                      "that holds these credentials)")
        self.done = True
        return None


class _OAuthBearer(_Sasl):
    """RFC 7628's client initial response: the bearer token and SASL extensions."""

    def __init__(self, token: str, extensions: Mapping[str, str]) -> None:
        self.token, self.extensions = token, extensions

    def first(self) -> bytes:
        pairs = "".join(f"{k}={v}\x01" for k, v in self.extensions.items())
        return f"n,,\x01auth=Bearer {self.token}\x01{pairs}\x01".encode()

    def step(self, server: bytes) -> bytes | None:
        if server:  # an error document: RFC 7628 has the client answer with a lone \x01
            raise AuthenticationError(f"the server refused the OAUTHBEARER token: "
                                      f"{server.decode(errors='replace')}")
        return super().step(server)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsecured_jwt(config: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """librdkafka's unsecured JWT (``enable.sasl.oauthbearer.unsecure.jwt``): ``alg: none``,
    subject ``principal``, ``scope`` and lifetime from ``sasl.oauthbearer.config``."""
    # blank-separated name=value pairs
    text = str(config.get("sasl.oauthbearer.config", ""))
    settings = dict(item.split("=", 1) for item in text.split() if "=" in item)
    if not settings.get("principal"):
        raise OptionError("option sasl.oauthbearer.config needs principal=… for an unsecured "
                          "JWT (enable.sasl.oauthbearer.unsecure.jwt)")
    now = int(time.time())
    claims: dict[str, Any] = {"sub": settings["principal"], "iat": now,
                              "exp": now + int(settings.get("lifeSeconds", "3600"))}
    if settings.get("scope"):
        claims["scope"] = settings["scope"].split(",")
    token = (f"{_b64url(json.dumps({'alg': 'none'}).encode())}."
             f"{_b64url(json.dumps(claims).encode())}.")
    extensions = {k[len("extension_"):]: v for k, v in settings.items()
                  if k.startswith("extension_")}
    return token, extensions


def _oidc_token(config: Mapping[str, Any], timeout_s: float) -> tuple[str, dict[str, str]]:
    """OIDC client credentials (``sasl.oauthbearer.method=oidc``): a token from the identity
    provider's token endpoint (RFC 6749 4.4, HTTP Basic client authentication)."""
    url = config.get("sasl.oauthbearer.token.endpoint.url")
    client_id = config.get("sasl.oauthbearer.client.id")
    client_secret = config.get("sasl.oauthbearer.client.secret")
    if not (url and client_id and client_secret):
        raise OptionError("sasl.oauthbearer.method=oidc needs sasl.oauthbearer.token.endpoint.url,"
                          " sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret")
    form = {"grant_type": "client_credentials"}
    if config.get("sasl.oauthbearer.scope"):
        form["scope"] = str(config["sasl.oauthbearer.scope"])
    basic = base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()
    request = urllib.request.Request(
        str(url), data=urllib.parse.urlencode(form).encode(), method="POST",
        headers={"Authorization": f"Basic {basic}",
                 "Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310
            token = json.load(answer)["access_token"]
    except (OSError, ValueError, KeyError) as exc:
        raise AuthenticationError(f"the OIDC token endpoint {url} gave no token "
                                  f"({exc.__class__.__name__}: {exc})") from None
    extensions = dict(item.split("=", 1) for item in
                      str(config.get("sasl.oauthbearer.extensions", "")).split(",") if "=" in item)
    return str(token), extensions


def _bearer(config: Mapping[str, Any], timeout_s: float) -> _OAuthBearer:
    callback: Callable[[str], Any] | None = config.get("oauth_cb")
    if callback is not None:
        answer = callback(str(config.get("sasl.oauthbearer.config", "")))
        token = answer[0]
        extensions = answer[3] if len(answer) > 3 and answer[3] else {}
        return _OAuthBearer(str(token), dict(extensions))
    if str(config.get("sasl.oauthbearer.method", "default")).lower() == "oidc":
        return _OAuthBearer(*_oidc_token(config, timeout_s))
    if str(config.get("enable.sasl.oauthbearer.unsecure.jwt", "false")).lower() == "true":
        return _OAuthBearer(*_unsecured_jwt(config))
    raise OptionError("SASL mechanism OAUTHBEARER needs a token: an oauth_cb callable, "
                      "sasl.oauthbearer.method=oidc with its endpoint and client, or "
                      "enable.sasl.oauthbearer.unsecure.jwt=true with sasl.oauthbearer.config")


def _sasl_exchange(mechanism: str, config: Mapping[str, Any], timeout_s: float) -> _Sasl:
    if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        user, password = config.get("sasl.username"), config.get("sasl.password")
        if user is None or password is None:
            raise OptionError(f"SASL mechanism {mechanism} needs sasl.username and sasl.password")
        if mechanism == "PLAIN":
            return _Plain(str(user), str(password))
        return _Scram(mechanism, str(user), str(password))
    if mechanism == "OAUTHBEARER":
        return _bearer(config, timeout_s)
    raise OptionError(f"option sasl.mechanisms={mechanism}: this client speaks PLAIN, "
                      "SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER")


def _api_ranges(reader: Reader) -> dict[int, tuple[int, int]]:
    """ApiVersions' ``ApiKeys``: api key -> (min, max version)."""
    versions = {}
    for _ in range(reader.array_length()):
        api, low, high = reader.int16(), reader.int16(), reader.int16()
        reader.tags()
        versions[api] = (low, high)
    return versions


# --- the connection -------------------------------------------------------------------------

@dataclass(frozen=True)
class Security:
    """What ``security.protocol`` asks of a connection."""

    tls: bool
    sasl: bool

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Security:
        protocol = str(config.get("security.protocol", "plaintext")).upper()
        if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise OptionError(f"option security.protocol={protocol}: accepted are PLAINTEXT, "
                              "SSL, SASL_PLAINTEXT and SASL_SSL")
        return cls(tls=protocol.endswith("SSL"), sasl=protocol.startswith("SASL"))


class BrokerConnection:
    """One authenticated connection to one broker, one request in flight at a time.

    ``speaks`` adds the APIs the caller will send (api key -> (min, max, first flexible
    version, name)); ``max_response`` bounds an answer's size.
    """

    def __init__(self, host: str, port: int, config: Mapping[str, Any], timeout_s: float,
                 speaks: Mapping[int, tuple[int, int, int, str]] | None = None,
                 client_id: str = "flinkish", max_response: int = MAX_RESPONSE) -> None:
        self.address = f"{host}:{port}"
        self._max_response = max_response
        self._secrets = secret_values(config)
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._correlation = 0
        self._speaks = {**SPOKEN, **(speaks or {})}
        self.broker_versions: dict[int, tuple[int, int]] = {}
        security = Security.of(config)
        context = _tls_context(config) if security.tls else None
        try:
            raw = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise BrokerUnavailable(self._say(f"cannot connect: {exc}")) from None
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock: socket.socket = raw
        self.closed = False
        try:
            if context is not None:
                try:
                    self._sock = context.wrap_socket(raw, server_hostname=host)
                except ssl.SSLCertVerificationError as exc:
                    raise AuthenticationError(self._say(
                        f"the TLS handshake failed: {exc.verify_message}")) from None
                except (ssl.SSLError, OSError) as exc:
                    raise BrokerUnavailable(self._say(f"the TLS handshake failed: {exc}")) from None
            self._negotiate()
            if security.sasl:
                self._authenticate(config)
        except BaseException:
            self.close()
            raise

    def _say(self, text: str) -> str:
        return scrub(f"broker {self.address}: {text}", self._secrets)

    def close(self) -> None:
        self.closed = True
        self._sock.close()

    def version(self, api: int) -> int:
        """The highest version of ``api`` both this client and the broker speak."""
        low, high, _, name = self._speaks[api]
        broker_low, broker_high = self.broker_versions.get(api, (0, -1))
        if max(low, broker_low) > min(high, broker_high):
            broker = (f"versions {broker_low}..{broker_high}" if api in self.broker_versions
                      else "no version")
            raise UnsupportedVersionError(self._say(
                f"the broker speaks {broker} of {name} (API key {api}); "
                f"this client speaks {low}..{high}"))
        return min(high, broker_high)

    def flexible(self, api: int, version: int) -> bool:
        return version >= self._speaks[api][2]

    def call(self, api: int, version: int, body: bytes, timeout_s: float | None = None
             ) -> Reader:
        """Sends one request; the response body (after its header) to read. ``timeout_s``
        bounds each socket operation (the connection's timeout by default)."""
        flexible = self.flexible(api, version)
        self._sock.settimeout(self._timeout_s if timeout_s is None else max(timeout_s, 0.001))
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        frame = request_frame(api, version, self._correlation, self._client_id, flexible, body)
        try:
            self._sock.sendall(frame)
            (size,) = struct.unpack(">i", self._read(4))
            payload = self._read(size) if 4 <= size <= self._max_response else None
        except (OSError, ssl.SSLError) as exc:  # socket.timeout is an OSError
            self.close()
            raise BrokerUnavailable(self._say(
                f"{self._speaks[api][3]} failed: {exc.__class__.__name__}: {exc}")) from None
        if payload is None:
            self.close()
            raise BrokerUnavailable(self._say(
                f"answered a frame of {size} bytes (this client accepts 4 to "
                f"{self._max_response})"))
        reader = Reader(payload, flexible and api != API_VERSIONS)
        correlation = reader.int32()
        if correlation != self._correlation:
            self.close()
            raise BrokerUnavailable(self._say(
                f"answered request {correlation}, expected {self._correlation}"))
        reader.tags()  # response header v1 (flexible, but for ApiVersions)
        reader.flexible = flexible
        return reader

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            read = self._sock.recv_into(view[got:], n - got)
            if read == 0:
                raise BrokerUnavailable(self._say("closed the connection"))
            got += read
        return buf

    def _negotiate(self) -> None:
        """ApiVersions at our highest version; a broker that does not speak it answers
        ``UNSUPPORTED_VERSION`` with its own range (KIP-511), asked again at that (at v0 when
        that answer is unreadable, as librdkafka's mock cluster's is)."""
        version = SPOKEN[API_VERSIONS][1]
        while True:
            body = Writer(self.flexible(API_VERSIONS, version))
            if body.flexible:
                body.string("flinkish").string("1").tags()
            reader = self.call(API_VERSIONS, version, body.getvalue())
            error = reader.int16()
            if error == UNSUPPORTED_VERSION and version > 0:
                reader.flexible = False
                try:
                    highest = _api_ranges(reader).get(API_VERSIONS, (0, 0))[1]
                except ValueError:
                    highest = 0
                version = max(0, min(highest, version - 1))
                continue
            if error:
                raise UnsupportedVersionError(self._say(
                    f"ApiVersions answered {error_name(error)} ({error})"))
            self.broker_versions = _api_ranges(reader)
            return

    def _authenticate(self, config: Mapping[str, Any]) -> None:
        mechanism = str(config.get("sasl.mechanisms", config.get("sasl.mechanism", "GSSAPI")))
        mechanism = mechanism.strip().upper()
        exchange = _sasl_exchange(mechanism, config, self._timeout_s)
        reader = self.call(SASL_HANDSHAKE, self.version(SASL_HANDSHAKE),
                           Writer().string(mechanism).getvalue())
        error = reader.int16()
        offered = [reader.string() for _ in range(reader.array_length())]
        if error:
            raise AuthenticationError(self._say(
                f"SASL mechanism {mechanism} refused ({error_name(error)}); the broker offers "
                f"{', '.join(str(m) for m in offered) or 'none'}"))
        version = self.version(SASL_AUTHENTICATE)
        message: bytes | None = exchange.first()
        while message is not None:
            reader = self.call(SASL_AUTHENTICATE, version,
                               Writer(self.flexible(SASL_AUTHENTICATE, version))
                               .bytes_(message).tags().getvalue())
            error = reader.int16()
            text = reader.string()
            answer = reader.bytes_() or b""
            if error:
                raise AuthenticationError(self._say(
                    f"SASL {mechanism} authentication failed ({error_name(error)}): "
                    f"{text or 'no reason given'}"))
            try:
                message = exchange.step(answer)
            except AuthenticationError as exc:
                raise AuthenticationError(self._say(f"SASL {mechanism}: {exc}")) from None
