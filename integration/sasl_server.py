"""The server side of the SASL mechanisms Kafka clients use, for the secured listener.

PLAIN (RFC 4616), SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677: the server keeps only the
salted keys) and OAUTHBEARER (RFC 7628's client initial response). Each exchange is a
:class:`Exchange` fed the client's messages one by one; a bad credential raises
:class:`AuthenticationFailed` with the message a Kafka broker sends (the listener answers it
with ``SASL_AUTHENTICATION_FAILED``). Tokens are judged by a callable the test supplies
(:func:`token_check` makes the usual one).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SCRAM_ITERATIONS = 4096  # Kafka's minimum


class AuthenticationFailed(Exception):
    """The client's credentials are wrong; the message is what the client is told."""


@dataclass(frozen=True)
class Login:
    """A completed authentication: who, how, and (OAUTHBEARER) the token and extensions."""

    mechanism: str
    principal: str
    token: str | None = None
    extensions: dict[str, str] = field(default_factory=dict)


#: judges a bearer token and its extensions: the principal, or AuthenticationFailed
TokenCheck = Callable[[str, dict[str, str]], str]


class Exchange:
    """One client's authentication: ``step`` takes a client message and returns the server's
    reply; ``login`` is set once the exchange has succeeded."""

    login: Login | None = None

    def step(self, message: bytes) -> bytes:
        raise NotImplementedError


class _Plain(Exchange):
    def __init__(self, users: dict[str, str]) -> None:
        self.users = users

    def step(self, message: bytes) -> bytes:
        parts = message.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        _authzid, user, password = (p.decode() for p in parts)
        expected = self.users.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        self.login = Login("PLAIN", user)
        return b""


def _attributes(message: str) -> dict[str, str]:
    return {part[0]: part[2:] for part in message.split(",") if len(part) >= 2 and part[1] == "="}


class _Scram(Exchange):
    def __init__(self, mechanism: str, users: dict[str, str]) -> None:
        self.mechanism = mechanism
        self.hash = hashlib.sha256 if mechanism == "SCRAM-SHA-256" else hashlib.sha512
        self.users = users
        self._state: tuple[str, str, str, bytes, bytes] | None = None

    def _hmac(self, key: bytes, text: bytes) -> bytes:
        return hmac.new(key, text, self.hash).digest()

    def _failed(self) -> AuthenticationFailed:
        return AuthenticationFailed(
            "Authentication failed during authentication due to invalid credentials with SASL "
            f"mechanism {self.mechanism}")

    def step(self, message: bytes) -> bytes:
        text = message.decode()
        if self._state is None:
            return self._first(text)
        return self._final(text)

    def _first(self, text: str) -> bytes:
        if not text.startswith(("n,", "y,")):
            raise AuthenticationFailed(f"Invalid SCRAM client first message for {self.mechanism}")
        bare = text.split(",", 2)[2]
        attrs = _attributes(bare)
        user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
        password = self.users.get(user)
        if password is None or "r" not in attrs:
            raise self._failed()
        salt = os.urandom(16)
        salted = hashlib.pbkdf2_hmac(self.hash().name, password.encode(), salt, SCRAM_ITERATIONS)
        client_key = self._hmac(salted, b"Client Key")
        server_key = self._hmac(salted, b"Server Key")
        nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={SCRAM_ITERATIONS}"
        stored_key = self.hash(client_key).digest()
        self._state = (user, bare, server_first, stored_key, server_key)
        return server_first.encode()

    def _final(self, text: str) -> bytes:
        assert self._state is not None
        user, client_first_bare, server_first, stored_key, server_key = self._state
        without_proof, _, proof_part = text.rpartition(",p=")
        attrs = _attributes(without_proof)
        if not proof_part or attrs.get("r") != _attributes(server_first)["r"]:
            raise self._failed()
        auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = base64.b64decode(proof_part)
        if len(proof) != len(signature):
            raise self._failed()
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(self.hash(client_key).digest(), stored_key):
            raise self._failed()
        self.login = Login(self.mechanism, user)
        verifier = base64.b64encode(self._hmac(server_key, auth_message)).decode()
        return f"v={verifier}".encode()


class _OAuthBearer(Exchange):
    def __init__(self, check: TokenCheck) -> None:
        self.check = check

    def step(self, message: bytes) -> bytes:
        # gs2 header, then key=value pairs each ended by \x01, then a final \x01 (RFC 7628 3.1)
        header, sep, rest = message.decode().partition("\x01")
        if not sep or not header.startswith(("n,", "y,")):
            raise AuthenticationFailed("Invalid OAUTHBEARER client first message")
        pairs = dict(kv.split("=", 1) for kv in rest.split("\x01") if "=" in kv)
        scheme, _, token = pairs.pop("auth", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationFailed("Invalid OAUTHBEARER client first message: no bearer token")
        principal = self.check(token, pairs)
        self.login = Login("OAUTHBEARER", principal, token, pairs)
        return b""


def exchange(mechanism: str, users: dict[str, str], check: TokenCheck) -> Exchange:
    """A fresh exchange for ``mechanism`` (one of MECHANISMS)."""
    if mechanism == "PLAIN":
        return _Plain(users)
    if mechanism.startswith("SCRAM-"):
        return _Scram(mechanism, users)
    if mechanism == "OAUTHBEARER":
        return _OAuthBearer(check)
    raise ValueError(mechanism)


def msk_iam_principal(token: str) -> str | None:
    """The access key id in an AWS MSK IAM token (base64url of a SigV4-presigned
    ``kafka-cluster:Connect`` URL, as ``aws-msk-iam-sasl-signer-python`` makes it), else None."""
    try:
        url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    parsed = urllib.parse.urlparse(url)
    query = urllib.parse.parse_qs(parsed.query)
    if parsed.scheme != "https" or not parsed.hostname or not parsed.hostname.startswith("kafka.") \
            or query.get("Action") != ["kafka-cluster:Connect"] \
            or "X-Amz-Signature" not in query or "X-Amz-Credential" not in query:
        return None
    return query["X-Amz-Credential"][0].split("/", 1)[0]


def unsecured_jwt_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT (its signature is not checked: the tests' tokens are unsigned)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    return claims if isinstance(claims, dict) else None


def token_check(principals: set[str]) -> TokenCheck:
    """Accepts an unexpired JWT whose subject is one of ``principals``, or a well-formed MSK IAM
    token (the tests sign with fake credentials: its form is what can be checked here)."""

    def check(token: str, extensions: dict[str, str]) -> str:
        claims = unsecured_jwt_claims(token)
        if claims is not None:
            if claims.get("sub") in principals and float(claims.get("exp", 0)) > time.time():
                return str(claims["sub"])
            raise AuthenticationFailed("{\"status\":\"invalid_token\"}")
        key = msk_iam_principal(token)
        if key is not None:
            return key
        raise AuthenticationFailed("{\"status\":\"invalid_token\"}")

    return check
