"""Certificates and key stores made at test time, for the secured listener's TLS.

One certificate authority signs the listener's server certificate (for ``127.0.0.1`` and
``localhost``, as subject alternative names, so hostname verification passes) and a client
certificate for mutual TLS; a second, unrelated authority stands for "the wrong CA". Every
form a client configuration names is written out: PEM files, a PKCS#12 keystore, and JKS stores
(made by the JDK's ``keytool``, which Spark's Java already brings), all under one directory
that the caller removes.
"""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

STORE_PASSWORD = "store-secret"
KEY_PASSWORD = "key-secret"
CLIENT_NAME = "flinkish-test-client"
#: how a listener names the client it authenticated by its certificate
CLIENT_PRINCIPAL = f"CN={CLIENT_NAME}"
_EC = ec.SECP256R1()


@dataclass(frozen=True)
class _Issued:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _authority(common_name: str) -> _Issued:
    key = ec.generate_private_key(_EC)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Issued(key, cert)


def _leaf(ca: _Issued, common_name: str, server: bool) -> _Issued:
    key = ec.generate_private_key(_EC)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(ca.cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                       critical=False)
    )
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return _Issued(key, builder.sign(ca.key, hashes.SHA256()))


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class Pki:
    """The test PKI under ``directory``: attributes are file paths (stores made on first use)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        ca = _authority("flinkish test CA")
        server = _leaf(ca, "flinkish test broker", server=True)
        self._client = _leaf(ca, CLIENT_NAME, server=False)
        self.ca_pem = self._write("ca.pem", _pem(ca.cert))
        self.server_cert_pem = self._write("server.pem", _pem(server.cert) + _pem(ca.cert))
        self.server_key_pem = self._write("server.key", server.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        self.client_cert_pem = self._write("client.pem", _pem(self._client.cert))
        #: the client's key, encrypted with KEY_PASSWORD (``ssl.key.password``)
        self.client_key_pem = self._write("client.key", self._client.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(KEY_PASSWORD.encode())))
        self.wrong_ca_pem = self._write("wrong-ca.pem", _pem(_authority("some other CA").cert))
        self._ca = ca

    def _write(self, name: str, data: bytes) -> str:
        path = self.directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        return str(path)

    @cached_property
    def client_keystore_p12(self) -> str:
        """The client's key and certificate chain as PKCS#12, protected by STORE_PASSWORD."""
        return self._write("client.p12", pkcs12.serialize_key_and_certificates(
            b"client", self._client.key, self._client.cert, [self._ca.cert],
            serialization.BestAvailableEncryption(STORE_PASSWORD.encode())))

    @cached_property
    def client_keystore_jks(self) -> str:
        """The client's key entry as JKS; its key password is KEY_PASSWORD (Java's
        ``ssl.key.password``), distinct from the store's."""
        path = self.directory / "client.jks"
        _keytool("-importkeystore", "-srckeystore", self.client_keystore_p12,
                 "-srcstoretype", "PKCS12", "-srcstorepass", STORE_PASSWORD,
                 "-srcalias", "client", "-destalias", "client",
                 "-destkeystore", str(path), "-deststoretype", "JKS",
                 "-deststorepass", STORE_PASSWORD, "-destkeypass", KEY_PASSWORD)
        return str(path)

    @cached_property
    def truststore_jks(self) -> str:
        """The CA as a JKS truststore, protected by STORE_PASSWORD."""
        path = self.directory / "truststore.jks"
        _keytool("-importcert", "-noprompt", "-alias", "flinkish-test-ca", "-file", self.ca_pem,
                 "-keystore", str(path), "-storetype", "JKS", "-storepass", STORE_PASSWORD)
        return str(path)


def _keytool(*args: str) -> None:
    done = subprocess.run(["keytool", *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"keytool {args[0]} failed: {done.stdout}{done.stderr}")
