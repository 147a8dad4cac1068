"""Secrets never leave: masking for option values, connection strings and free text, one copy
of the rule for every repr, log line, error message and record the source and the sink write.
A setting whose *name* looks secret has its value masked; a connection string (both libpq forms)
or a URI keeps its shape but not its password; free text has every known secret value replaced.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

MASK = "***"

#: Names of settings whose values are secret (Kafka ``sasl.*``/``ssl.*``, passwords, tokens…).
SECRET_KEY = re.compile(
    r"(sasl|ssl|password|passwd|secret|token|credential|api[._-]?key|private[._-]?key)",
    re.IGNORECASE,
)
#: Kafka client settings that match :data:`SECRET_KEY` but name a method (shown in
#: errors: "authentication failed with SASL mechanism SCRAM-SHA-512" is what one checks).
NOT_SECRET = frozenset({
    "sasl.mechanism", "sasl.mechanisms", "sasl.oauthbearer.method",
    "ssl.endpoint.identification.algorithm", "ssl.keystore.type", "ssl.truststore.type",
})
#: Connection-string keys whose values are secret (``sslmode``, ``sslcert`` are not).
_DSN_SECRET_KEY = re.compile(r"(password|passwd|secret|token)", re.IGNORECASE)

# key = value pairs of a libpq connection string: the value single-quoted (an unterminated
# quote runs to the end, as libpq reads it) or non-blank, backslash escapes in both.
_DSN_PAIR = re.compile(
    r"(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|(?:[^\s'\\]|\\.)+|(?=\s|$))"
)
# scheme://user:password@ (the userinfo of a URI): the password ends at the first '@' or '/'.
_URI_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#\s]*):(?P<pw>[^@/\s]*)@")
# ?password=… / &sslpassword=… in a URI's query
_URI_PARAM = re.compile(r"(?P<head>[?&](?P<key>[^=&#\s]+)=)(?P<value>[^&#\s]*)")
# shorter values are not replaced in free text: it would mangle unrelated words
_MIN_SCRUB = 3


def is_secret_key(key: str) -> bool:
    """Whether a setting called ``key`` holds a secret (``kafka.sasl.jaas.config`` …)."""
    name = key.lower()
    if name.startswith("kafka."):
        name = name[len("kafka."):]
    return name not in NOT_SECRET and SECRET_KEY.search(key) is not None


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy safe to log or put in an error: values of secret-looking keys masked."""
    return {k: (MASK if is_secret_key(str(k)) else v) for k, v in config.items()}


def secret_values(config: Mapping[str, Any]) -> list[str]:
    """The values of ``config``'s secret-looking keys (to :func:`scrub` them from text)."""
    return [str(v) for k, v in config.items() if is_secret_key(str(k)) and v not in (None, "")]


def _is_uri(dsn: str) -> bool:
    return re.match(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://", dsn) is not None


def mask_dsn(dsn: str | None) -> str | None:
    """``dsn`` with its password(s) masked, in either libpq form (or any URI)."""
    if dsn is None:
        return None
    if _is_uri(dsn):
        masked = _URI_USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", dsn)
        return _URI_PARAM.sub(
            lambda m: m.group("head") + (
                MASK if _DSN_SECRET_KEY.search(unquote(m.group("key"))) else m.group("value")
            ),
            masked,
        )
    return _DSN_PAIR.sub(
        lambda m: m.group("key") + m.group("eq") + (
            MASK if _DSN_SECRET_KEY.search(m.group("key")) and m.group("value")
            else m.group("value")
        ),
        dsn,
    )


def mask_uri(text: str | None) -> str | None:
    """A path or URI with the password of a ``scheme://user:password@`` part masked (and any
    secret-looking query parameter): for target paths and storage locations."""
    if text is None or not _is_uri(text):
        return text
    return mask_dsn(text)


def _unquote_libpq(value: str) -> str:
    if value.startswith("'"):
        value = value[1:-1] if value.endswith("'") and len(value) >= 2 else value[1:]
    return re.sub(r"\\(.)", r"\1", value)


def dsn_secrets(dsn: str | None) -> list[str]:
    """The password values in ``dsn`` as written and as decoded (to :func:`scrub` them from a
    driver's messages, which may quote either form)."""
    if not dsn:
        return []
    found: list[str] = []
    if _is_uri(dsn):
        found += [m.group("pw") for m in _URI_USERINFO.finditer(dsn)]
        found += [
            m.group("value") for m in _URI_PARAM.finditer(dsn)
            if _DSN_SECRET_KEY.search(unquote(m.group("key")))
        ]
        found += [unquote(v) for v in list(found)]
    else:
        raw = [
            m.group("value") for m in _DSN_PAIR.finditer(dsn)
            if _DSN_SECRET_KEY.search(m.group("key")) and m.group("value")
        ]
        found += raw + [_unquote_libpq(v) for v in raw]
    return [s for s in dict.fromkeys(found) if s]


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value in ``secrets`` masked, longest first (a secret
    containing another is masked whole); values too short to replace safely are left alone."""
    for secret in sorted({s for s in secrets if s and len(s) >= _MIN_SCRUB}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def fingerprint(*parts: object) -> str:
    """A stable hash of ``parts``, to identify options holding a secret (a cache key)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(repr(part).encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()
