"""Java key stores and trust stores (JKS, PKCS12, PEM) converted, once per process where a client
is built, into the PEM text librdkafka takes in memory. Nothing is written: a file holding the
unencrypted key would outlive a process that cannot clean up (PySpark's workers leave with
``os._exit``), and its path would show in librdkafka's errors.

JKS is read here (its format is small and fixed: Sun's ``JavaKeyStore`` and ``KeyProtector``);
PKCS12 and PEM by ``cryptography``. Errors name the option and the problem, never a password.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from flinkish_core.errors import OptionError


@dataclass(frozen=True)
class StoreSpec:
    """A Java key store or trust store, as the options name it."""

    kind: str  # "truststore" or "keystore"
    store_type: str | None  # JKS, PKCS12, PEM; None: told by the file's content
    location: str | None = None
    password: str | None = field(default=None, repr=False)
    certificates: str | None = field(default=None, repr=False)  # inline PEM (type PEM)
    key: str | None = field(default=None, repr=False)  # inline PEM key (keystore, PEM)
    key_password: str | None = field(default=None, repr=False)

    def secrets(self) -> list[str]:
        return [s for s in (self.password, self.key, self.key_password) if s]


__all__ = ["StoreContent", "StorePem", "StoreSpec", "read_store", "store_pem"]

_JKS_MAGIC = 0xFEEDFEED
_JCEKS_MAGIC = 0xCECECECE
#: Sun's key protection algorithm (``KeyProtector``), the only one JKS private keys use
_SUN_KEY_PROTECTOR = bytes.fromhex("060a2b060104012a02110101")  # DER OID 1.3.6.1.4.1.42.2.17.1.1


@dataclass(frozen=True)
class StoreContent:
    """What a store holds that a client uses: trusted certificates, or a key and its chain."""

    certificates: list[Any]  # cryptography x509.Certificate; a key store: the key's chain first
    key: Any = None  # a private key (key stores)


@dataclass(frozen=True)
class StorePem:
    """One store as librdkafka's ``ssl.ca.pem`` (trust store), or ``ssl.certificate.pem`` and
    ``ssl.key.pem`` (key store)."""

    ca: str | None = None
    certificate: str | None = None
    key: str | None = field(default=None, repr=False)


def _option(spec: StoreSpec, what: str) -> str:
    return f"kafka.ssl.{spec.kind}.{what}"


def _bad(spec: StoreSpec, problem: str) -> OptionError:
    where = (f"option {_option(spec, 'location')} ({spec.location})" if spec.location
             else f"the inline PEM {spec.kind}")
    return OptionError(f"{where}: {problem}")


def _utf(data: bytes, at: int) -> tuple[str, int]:
    (length,) = struct.unpack_from(">H", data, at)
    return data[at + 2: at + 2 + length].decode("utf-8", "replace"), at + 2 + length


def _der_item(data: bytes, at: int) -> tuple[int, bytes, int]:
    """One DER element at ``at``: its tag, its content and where the next one starts."""
    tag, length = data[at], data[at + 1]
    at += 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[at: at + count], "big")
        at += count
    return tag, data[at: at + length], at + length


def _jks_password(password: str) -> bytes:
    return password.encode("utf-16-be")


def _unprotect_jks_key(spec: StoreSpec, protected: bytes, password: str) -> bytes:
    """The PKCS#8 key of a JKS private key entry (Sun's ``KeyProtector``: a SHA-1 key stream
    seeded by a salt, and a SHA-1 check of the result)."""
    _, info, _ = _der_item(protected, 0)  # EncryptedPrivateKeyInfo
    _, algorithm, after = _der_item(info, 0)
    _, encrypted, _ = _der_item(info, after)
    if not algorithm.startswith(_SUN_KEY_PROTECTOR):
        raise _bad(spec, "its private key is not protected with the JKS algorithm (a JCEKS "
                         "entry?); convert the store with keytool -importkeystore "
                         "-deststoretype PKCS12")
    salt, body, check = encrypted[:20], encrypted[20:-20], encrypted[-20:]
    pw = _jks_password(password)
    stream = bytearray()
    digest = salt
    while len(stream) < len(body):
        digest = hashlib.sha1(pw + digest).digest()
        stream += digest
    plain = bytes(a ^ b for a, b in zip(body, stream, strict=False))
    if hashlib.sha1(pw + plain).digest() != check:
        raise _bad(spec, f"the key password is wrong (option kafka.ssl.key.password, or "
                         f"{_option(spec, 'password')} when the key has the store's password)")
    return plain


def _read_jks(spec: StoreSpec, data: bytes) -> StoreContent:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_der_private_key

    magic, version, count = struct.unpack_from(">III", data, 0)
    if magic == _JCEKS_MAGIC:
        raise _bad(spec, "JCEKS stores are not read; convert it with keytool -importkeystore "
                         "-deststoretype PKCS12")
    if magic != _JKS_MAGIC or version not in (1, 2):
        raise _bad(spec, "not a JKS store")
    if spec.password:
        body, digest = data[:-20], data[-20:]
        expected = hashlib.sha1(
            _jks_password(spec.password) + b"Mighty Aphrodite" + body).digest()
        if expected != digest:
            raise _bad(spec, f"the store password is wrong (option "
                             f"{_option(spec, 'password')}), or the file is damaged")
    at = 12
    trusted: list[Any] = []
    keys: list[tuple[str, bytes, list[Any]]] = []

    def certificate() -> Any:
        nonlocal at
        if version == 2:
            _, at = _utf(data, at)  # the certificate type, X.509
        (length,) = struct.unpack_from(">I", data, at)
        cert = x509.load_der_x509_certificate(data[at + 4: at + 4 + length])
        at += 4 + length
        return cert

    for _ in range(count):
        (tag,) = struct.unpack_from(">I", data, at)
        alias, at = _utf(data, at + 4)
        at += 8  # the entry's date
        if tag == 1:
            (length,) = struct.unpack_from(">I", data, at)
            protected = data[at + 4: at + 4 + length]
            (chain_length,) = struct.unpack_from(">I", data, at + 4 + length)
            at += 8 + length
            keys.append((alias, protected, [certificate() for _ in range(chain_length)]))
        elif tag == 2:
            trusted.append(certificate())
        else:
            raise _bad(spec, f"entry {alias!r} is of an unknown kind ({tag})")
    if spec.kind == "truststore":
        return StoreContent(trusted + [c for _, _, chain in keys for c in chain[:1]])
    if len(keys) != 1:
        raise _bad(spec, f"a key store needs exactly one private key entry, it has "
                         f"{len(keys)}" + (f" ({', '.join(a for a, _, _ in keys)})"
                                           if keys else ""))
    _, protected, chain = keys[0]
    password = spec.key_password or spec.password
    if not password:
        raise _bad(spec, f"the private key needs a password ({_option(spec, 'password')} "
                         "or kafka.ssl.key.password)")
    key = load_der_private_key(_unprotect_jks_key(spec, protected, password), None)
    return StoreContent(chain, key)


def _read_pkcs12(spec: StoreSpec, data: bytes) -> StoreContent:
    from cryptography.hazmat.primitives.serialization import pkcs12

    password = spec.password.encode() if spec.password else None
    try:
        store = pkcs12.load_pkcs12(data, password)
    except ValueError:
        raise _bad(spec, f"cannot open the PKCS12 store: the password (option "
                         f"{_option(spec, 'password')}) is wrong or missing, or the file is "
                         "damaged") from None
    extra = [c.certificate for c in store.additional_certs]
    if spec.kind == "truststore":
        own = [store.cert.certificate] if store.cert is not None else []
        return StoreContent(own + extra)
    if store.key is None or store.cert is None:
        raise _bad(spec, "the PKCS12 key store holds no private key with its certificate")
    return StoreContent([store.cert.certificate] + extra, store.key)


def _read_pem(spec: StoreSpec, data: bytes | None) -> StoreContent:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    text = data if data is not None else (spec.certificates or "").encode()
    try:
        certificates = x509.load_pem_x509_certificates(text)
    except ValueError:
        raise _bad(spec, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)") from None
    if spec.kind == "truststore":
        return StoreContent(certificates)
    key_text = spec.key.encode() if spec.key is not None else text
    password = spec.key_password.encode() if spec.key_password else None
    try:
        key = load_pem_private_key(key_text, password)
    except (ValueError, TypeError):
        raise _bad(spec, "cannot read the PEM private key: kafka.ssl.key.password is wrong or "
                         "missing, or there is no -----BEGIN (ENCRYPTED) PRIVATE KEY----- "
                         "block") from None
    return StoreContent(certificates, key)


def read_store(spec: StoreSpec) -> StoreContent:
    """The certificates (and key) of a store, of its given type, else of the type its content
    shows (as Java's keystore.type.compat reads a PKCS12 file given as JKS). Whatever a client
    could not use fails here, at ``load()``."""
    content = _read(spec)
    if not content.certificates:
        raise _bad(spec, "holds no certificate; put the "
                   + ("brokers' CA certificate in it" if spec.kind == "truststore"
                      else "client's certificate chain in it with its key"))
    if content.key is not None and (content.key.public_key()
                                    != content.certificates[0].public_key()):
        raise _bad(spec, "the private key is not the one of the first certificate of the "
                         "chain; give the client certificate first, then its issuers")
    return content


def _read(spec: StoreSpec) -> StoreContent:
    data: bytes | None = None
    if spec.location is not None:
        try:
            with open(spec.location, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise _bad(spec, f"cannot be read ({exc.strerror}); the file must exist on the "
                             "driver and on every executor") from None
    if data is None or spec.store_type == "PEM" or (
            spec.store_type is None and b"-----BEGIN " in data[:8192]):
        return _read_pem(spec, data)
    if len(data) >= 4 and struct.unpack_from(">I", data)[0] in (_JKS_MAGIC, _JCEKS_MAGIC):
        try:
            return _read_jks(spec, data)
        except OptionError:
            raise
        except (struct.error, ValueError, IndexError):
            # no password: nothing checked the file before its entries were read
            check = ("" if spec.password else f"; give {_option(spec, 'password')} to have "
                     "its integrity checked")
            raise _bad(spec, "the JKS store is damaged (truncated or altered) and cannot be "
                             f"read{check}; export it again with keytool") from None
    if spec.store_type == "JKS" and not data.startswith(b"\x30"):
        raise _bad(spec, "not a JKS or PKCS12 store")
    return _read_pkcs12(spec, data)


_lock = threading.Lock()
#: per store: the store file's modification time when converted, and the PEM text
_converted: dict[StoreSpec, tuple[int | None, StorePem]] = {}


def store_pem(spec: StoreSpec) -> StorePem:
    """The PEM text of ``spec`` in this process, converted on first use and again when the
    store's file changed (a rotated certificate reaches the clients built after it)."""
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    modified = None
    if spec.location is not None:
        with contextlib.suppress(OSError):
            modified = os.stat(spec.location).st_mtime_ns
    with _lock:
        known = _converted.get(spec)
        if known is not None and known[0] == modified:
            return known[1]
        content = read_store(spec)
        chain = b"".join(c.public_bytes(Encoding.PEM) for c in content.certificates).decode()
        if spec.kind == "truststore":
            pem = StorePem(ca=chain)
        else:
            key = content.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
            pem = StorePem(certificate=chain, key=key.decode())
        _converted[spec] = (modified, pem)
        return pem
