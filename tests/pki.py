"""Certificates made at test time (a CA, a server certificate for 127.0.0.1, a client
certificate) and the Java key and trust stores that hold them, in every format the Kafka client
reads: PEM (file or inline), PKCS12 (``cryptography``) and JKS (``keytool``)."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

STORE_PW = "st0re-pass-w0rd"
KEY_PW = "k3y-pass-w0rd"
KEYTOOL = shutil.which("keytool")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key: Any, issuer: str, issuer_key: Any, ca: bool = False,
          hosts: tuple[str, ...] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), *(x509.IPAddress(ipaddress.ip_address(h))
                                          for h in hosts)]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, with their keys,
    in every store format."""

    def __init__(self, root: Path, ca_name: str = "flinkish test CA") -> None:
        self.root = root
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = _cert(ca_name, self.ca_key, ca_name, self.ca_key,
                        ca=True)
        self.server_key = ec.generate_private_key(ec.SECP256R1())
        self.server = _cert("localhost", self.server_key, ca_name, self.ca_key,
                            hosts=("127.0.0.1",))
        self.client_key = ec.generate_private_key(ec.SECP256R1())
        self.client = _cert("flinkish-client", self.client_key, ca_name,
                            self.ca_key)
        self.ca_pem = self._write("ca.pem", self.ca.public_bytes(serialization.Encoding.PEM))
        self.server_pem = self._write("server.pem", self.server.public_bytes(
            serialization.Encoding.PEM) + self._key_pem(self.server_key))

    def _write(self, name: str, data: bytes) -> str:
        path = self.root / name
        path.write_bytes(data)
        return str(path)

    @staticmethod
    def _key_pem(key: Any, password: str | None = None) -> bytes:
        encryption: Any = (serialization.BestAvailableEncryption(password.encode())
                           if password else serialization.NoEncryption())
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 encryption)

    def truststore(self, kind: str) -> dict[str, str]:
        """Java options naming a trust store of ``kind`` that holds the CA."""
        if kind == "PEM":
            return {"ssl.truststore.type": "PEM", "ssl.truststore.location": self.ca_pem}
        if kind == "PEM-inline":
            return {"ssl.truststore.type": "PEM",
                    "ssl.truststore.certificates": Path(self.ca_pem).read_text()}
        if kind == "PKCS12":
            data = pkcs12.serialize_key_and_certificates(
                None, None, None, [self.ca],
                serialization.BestAvailableEncryption(STORE_PW.encode()))
            path = self._write("trust.p12", data)
        else:
            assert KEYTOOL is not None
            path = str(self.root / "trust.jks")
            Path(path).unlink(missing_ok=True)
            subprocess.run([KEYTOOL, "-importcert", "-noprompt", "-alias", "ca", "-file",
                            self.ca_pem, "-keystore", path, "-storetype", "JKS",
                            "-storepass", STORE_PW], check=True, capture_output=True)
        return {"ssl.truststore.type": kind, "ssl.truststore.location": path,
                "ssl.truststore.password": STORE_PW}

    def keystore(self, kind: str) -> dict[str, str]:
        """Java options naming a key store of ``kind`` with the client's key and chain."""
        chain = b"".join(c.public_bytes(serialization.Encoding.PEM)
                         for c in (self.client, self.ca))
        if kind == "PEM":
            path = self._write("client.pem", self._key_pem(self.client_key, KEY_PW) + chain)
            return {"ssl.keystore.type": "PEM", "ssl.keystore.location": path,
                    "ssl.key.password": KEY_PW}
        if kind == "PEM-inline":
            return {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": chain.decode(),
                    "ssl.keystore.key": self._key_pem(self.client_key, KEY_PW).decode(),
                    "ssl.key.password": KEY_PW}
        p12 = self._write("client.p12", pkcs12.serialize_key_and_certificates(
            b"client", self.client_key, self.client, [self.ca],
            serialization.BestAvailableEncryption(STORE_PW.encode())))
        if kind == "PKCS12":
            return {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": p12,
                    "ssl.keystore.password": STORE_PW}
        assert KEYTOOL is not None
        path = str(self.root / "client.jks")
        Path(path).unlink(missing_ok=True)
        subprocess.run([KEYTOOL, "-importkeystore", "-noprompt", "-srckeystore", p12,
                        "-srcstoretype", "PKCS12", "-srcstorepass", STORE_PW,
                        "-destkeystore", path, "-deststoretype", "JKS", "-deststorepass",
                        STORE_PW, "-destkeypass", KEY_PW], check=True, capture_output=True)
        return {"ssl.keystore.type": "JKS", "ssl.keystore.location": path,
                "ssl.keystore.password": STORE_PW, "ssl.key.password": KEY_PW}
