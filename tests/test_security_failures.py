"""Converted key stores work with librdkafka, and a refusal (failed authentication, an
untrusted certificate on either side) ends the source's wait for the brokers within seconds,
with an error that says so and names the servers, instead of at ``kafkaConsumer.pollTimeoutMs``.

The TLS listener here is Python's ``ssl`` on loopback: it completes or refuses the handshake
(no Kafka behind it), which is all these checks need. SASL refusals come from a broker, so
here their classification is checked on librdkafka's own error values."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from pki import KEYTOOL, Pki

from flinkish.demo.ports import server_socket
from flinkish_source.kafka import KafkaMetadata, read_range
from flinkish_source.kafka.base import (
    BrokerWait,
    KafkaSecurityError,
    consumer_config,
    note_refusal,
    raise_refusal,
    security_failure,
)
from flinkish_source.options import SourceOptions, parse_options

SECRET = "Sasl-pa55word-n0t-shown"
#: the bound the refusals must beat by far
BOUND_MS = 60_000


class TlsListener:
    """Accepts TLS connections on loopback; records each completed handshake's client
    certificate common name ("" without one)."""

    def __init__(self, pki: Pki, require_client_certificate: bool) -> None:
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(pki.server_pem)
        if require_client_certificate:
            self._context.verify_mode = ssl.CERT_REQUIRED
            self._context.load_verify_locations(pki.ca_pem)
        self._socket = server_socket()
        self.port = self._socket.getsockname()[1]
        self.handshakes: list[str] = []
        self._closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(conn,), daemon=True).start()

    def _handshake(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        with contextlib.suppress(OSError), conn, self._context.wrap_socket(
                conn, server_side=True) as tls:
            peer = tls.getpeercert() or {}
            names = [v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"]
            self.handshakes.append(names[0] if names else "")
            tls.recv(64)  # the client's first request; there is no Kafka to answer it

    def close(self) -> None:
        self._closed = True
        self._socket.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def mutual_tls(pki: Pki) -> Iterator[TlsListener]:
    listener = TlsListener(pki, require_client_certificate=True)
    yield listener
    listener.close()


def _options(listener: TlsListener, **kafka: str) -> SourceOptions:
    return parse_options({
        "kafka.bootstrap.servers": f"127.0.0.1:{listener.port}",
        "kafka.security.protocol": "SSL", "subscribe": "t", "includeMarkers": "false",
        "kafkaConsumer.pollTimeoutMs": str(BOUND_MS),
        **{f"kafka.{k}": v for k, v in kafka.items()}})


@pytest.mark.parametrize("kind", [
    "PEM", "PEM-inline", "PKCS12",
    pytest.param("JKS", marks=pytest.mark.skipif(KEYTOOL is None, reason="needs keytool"))])
def test_converted_stores_complete_a_mutual_tls_handshake(pki: Pki, mutual_tls: TlsListener,
                                                          kind: str) -> None:
    options = _options(mutual_tls, **pki.truststore(kind), **pki.keystore(kind))
    consumer = Consumer(consumer_config(options.kafka))
    try:
        deadline = time.monotonic() + 30
        while "flinkish-client" not in mutual_tls.handshakes and time.monotonic() < deadline:
            with contextlib.suppress(KafkaException):
                consumer.list_topics(timeout=0.5)
        assert "flinkish-client" in mutual_tls.handshakes
    finally:
        consumer.close()


def _fails_fast(call: object, expected: str, listener: TlsListener) -> KafkaSecurityError:
    started = time.monotonic()
    with pytest.raises(KafkaSecurityError) as failure:
        call()  # type: ignore[operator]
    took = time.monotonic() - started
    assert took < 10, f"took {took:.1f} s; the bound is {BOUND_MS / 1000:g} s"
    message = str(failure.value)
    assert expected in message and f"'127.0.0.1:{listener.port}'" in message
    return failure.value


def _listing_fails_fast(options: SourceOptions, listener: TlsListener) -> KafkaSecurityError:
    """The driver's first look at the cluster (listing topics) refused by TLS."""
    metadata = KafkaMetadata(options)
    try:
        return _fails_fast(metadata.partitions, "TLS verification failed", listener)
    finally:
        metadata.close()


def test_an_untrusted_broker_certificate_fails_listing_topics_fast(
        tmp_path: Path, mutual_tls: TlsListener) -> None:
    stranger = Pki(tmp_path)  # another CA: the broker's certificate is not trusted
    options = _options(mutual_tls, **stranger.truststore("PEM"), **stranger.keystore("PEM"))
    failure = _listing_fails_fast(options, mutual_tls)
    assert "certificate verify failed" in str(failure)
    assert "kafka.ssl.truststore" in str(failure)


def test_a_missing_client_certificate_fails_fast(pki: Pki, mutual_tls: TlsListener) -> None:
    failure = _listing_fails_fast(_options(mutual_tls, **pki.truststore("PEM")), mutual_tls)
    assert "certificate required" in str(failure)
    assert mutual_tls.handshakes == []


def test_a_read_task_refused_by_the_broker_fails_fast(tmp_path: Path,
                                                      mutual_tls: TlsListener) -> None:
    stranger = Pki(tmp_path)
    options = _options(mutual_tls, **stranger.truststore("PEM"))
    _fails_fast(lambda: list(read_range(options, "t", 0, 0, 10, 100)),
                "TLS verification failed", mutual_tls)


# --- classification -------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "text", "kind"), [
    (KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed during "
     "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256",
     "authentication failed"),
    (KafkaError.SASL_AUTHENTICATION_FAILED, "invalid credentials", "authentication failed"),
    (KafkaError.UNSUPPORTED_SASL_MECHANISM, "Unsupported SASL mechanism",
     "authentication failed"),
    (KafkaError._SSL, "SSL handshake failed: certificate verify failed",
     "TLS verification failed"),
    (KafkaError._TRANSPORT, "Receive failed: error:0A00045C:SSL routines::tlsv13 alert "
     "certificate required: SSL alert number 116", "TLS verification failed"),
    (KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:1 failed: Connection refused", None),
    (KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down", None),
    (KafkaError._TIMED_OUT, "Timed out", None),
])
def test_security_failures_are_told_from_no_answer_yet(code: int, text: str,
                                                       kind: str | None) -> None:
    assert security_failure(KafkaError(code, text)) == kind


def _sasl_options() -> SourceOptions:
    return parse_options({
        "kafka.bootstrap.servers": "b-1:9096,b-2:9096", "subscribe": "t",
        "includeMarkers": "false", "kafkaConsumer.pollTimeoutMs": str(BOUND_MS),
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                                  f"required username=svc password='{SECRET}';"})


def test_a_refused_login_ends_a_broker_wait_after_the_first_short_attempt() -> None:
    options = _sasl_options()
    refusal = KafkaError(KafkaError._AUTHENTICATION,
                         f"SASL authentication error: invalid credentials for {SECRET}")

    def attempt(timeout: float) -> None:
        time.sleep(timeout)  # librdkafka's call waits out its timeout without saying why
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))

    started = time.monotonic()
    with pytest.raises(KafkaSecurityError) as failure:
        BrokerWait(options.kafka, "could not list Kafka topics", lambda: refusal).call(attempt)
    assert time.monotonic() - started < 3
    message = str(failure.value)
    assert "authentication failed with bootstrap servers 'b-1:9096,b-2:9096'" in message
    assert "SCRAM-SHA-512" in message and "kafka.sasl.jaas.config" in message
    assert SECRET not in message


def test_a_read_consumer_refusal_is_raised_in_the_thread_that_polled() -> None:
    options = _sasl_options()
    raise_refusal(options.kafka, "nothing yet")  # no refusal: no error
    note_refusal(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    raise_refusal(options.kafka, "still nothing")
    note_refusal(KafkaError(KafkaError._AUTHENTICATION, "invalid credentials"))
    elsewhere: list[BaseException] = []

    def other_thread() -> None:
        try:
            raise_refusal(options.kafka, "other")
        except KafkaSecurityError as exc:
            elsewhere.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert elsewhere == []
    with pytest.raises(KafkaSecurityError, match="could not read t/0: authentication failed"):
        raise_refusal(options.kafka, "could not read t/0")
    raise_refusal(options.kafka, "taken once")
