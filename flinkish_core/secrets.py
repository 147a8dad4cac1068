"""Secrets never leave: masking for option values, connection strings and free text.

One copy of the rule, used by the source (Kafka client settings) and the sink (PostgreSQL DSNs,
target paths) for every repr, log line, error message and record they write:

* a setting whose *name* looks secret (``sasl``, ``ssl``, ``password``, ``secret``, ``token``,
  ``credential``, ``key`` as in ``api.key``) has its value replaced by :data:`MASK`, but for
  the few Kafka client settings that name a method or a file, which an error must show
  (:data:`NOT_SECRET`: ``sasl.mechanism`` …);
* a PostgreSQL connection string keeps its shape but not its password, in both libpq forms:
  ``host=h password=pw`` (also quoted, ``password='p w'``) and
  ``postgresql://user:pw@host/db?password=pw``; a URI of any scheme loses the password of its
  ``user:password@`` part;
* free text (a driver's error message) has every known secret value replaced, raw and
  percent-decoded, before it is shown.

A value that must still identify a setting (a cache key) uses :func:`fingerprint`: a hash,
never the secret in clear.
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

# key = value pairs of a libpq connection string: the value is single-quoted (backslash
# escapes inside; an unterminated quote runs to the end, as libpq reads it before it
# complains) or a run of non-blank characters (backslash escapes allowed there too).
_DSN_PAIR = re.compile(
    r"(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|(?:[^\s'\\]|\\.)+|(?=\s|$))"
)
# scheme://user:password@ (the userinfo of a URI): the password ends at the first '@' or '/'.
_URI_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#\s]*):(?P<pw>[^@/\s]*)@")
# ?password=… / &sslpassword=… in a URI's query
_URI_PARAM = re.compile(r"(?P<head>[?&](?P<key>[^=&#\s]+)=)(?P<value>[^&#\s]*)")
# Too short to replace safely in free text (it would mangle unrelated words).
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
    """``text`` with every secret value in ``secrets`` replaced by :data:`MASK` (longest
    first, so a secret containing another is masked whole). Values shorter than 3 characters
    are left alone: replacing them would garble the text and hide nothing."""
    for secret in sorted({s for s in secrets if s and len(s) >= _MIN_SCRUB}, key=len,
                         reverse=True):
        text = text.replace(secret, MASK)
    return text


def fingerprint(*parts: object) -> str:
    """A stable hash of ``parts`` (e.g. options holding a password): equal inputs, equal
    fingerprints, and the secret is not recoverable from it."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(repr(part).encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()
