"""Reading secured Kafka: TLS, mutual TLS, SASL PLAIN / SCRAM / OAUTHBEARER, through the
project's secured listeners (:mod:`integration.secured_listener`) in front of the session's
broker.

First the listeners themselves, with confluent-kafka's own clients (librdkafka's option names):
each security setting produces and consumes, and each bad credential is refused with the error
a Kafka broker gives. Then the flinkish source reading a topic exactly through them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from integration.kafka_helpers import produce, run_available_now, source
from integration.pki import KEY_PASSWORD, Pki
from integration.sasl_server import Login
from integration.secured_listener import (
    MUTUAL_TLS,
    SASL_PLAINTEXT,
    SASL_SSL,
    SSL,
    SecuredKafka,
    Security,
    token_check,
)
from integration.token_endpoint import TokenEndpoint

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "alice-secret"
CLIENT_ID, CLIENT_SECRET = "flinkish-oidc-client", "oidc-client-secret"
PARTITIONS, PER_PARTITION = 3, 10


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def token_endpoint() -> Iterator[TokenEndpoint]:
    with TokenEndpoint(CLIENT_ID, CLIENT_SECRET) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def secured(kafka_bootstrap: str, pki: Pki) -> Iterator[SecuredKafka]:
    """Every secured listener of this module, in front of the session's broker."""
    users = {USER: PASSWORD}
    with SecuredKafka(kafka_bootstrap, pki, users, token_check({USER, CLIENT_ID})) as listeners:
        yield listeners


@pytest.fixture(scope="module")
def records_topic(kafka_bootstrap: str) -> str:
    """A small topic, produced once through the plain listener, that the queries read."""
    from flinkish.demo.embedded_kafka import create_topic

    name = f"secured-{time.monotonic_ns()}"
    create_topic(kafka_bootstrap, name, PARTITIONS)
    produce(kafka_bootstrap, name, [
        (p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), 1_700_000_000_000 + i)
        for p in range(PARTITIONS) for i in range(PER_PARTITION)])
    return name


def expected_records() -> list[tuple[int, int, bytes, bytes]]:
    return sorted((p, i, f"k{p}-{i}".encode(), f"v{p}-{i}".encode())
                  for p in range(PARTITIONS) for i in range(PER_PARTITION))


# librdkafka's settings for each way in, and the login the listener must record for it
def _librdkafka_settings(pki: Pki) -> dict[str, tuple[Security, dict[str, Any], Login | None]]:
    sasl = {"ssl.ca.location": pki.ca_pem, "sasl.username": USER, "sasl.password": PASSWORD}
    return {
        "sasl-ssl-plain": (SASL_SSL, {"sasl.mechanisms": "PLAIN", **sasl},
                           Login("PLAIN", USER)),
        "sasl-ssl-scram-256": (SASL_SSL, {"sasl.mechanisms": "SCRAM-SHA-256", **sasl},
                               Login("SCRAM-SHA-256", USER)),
        "sasl-ssl-scram-512": (SASL_SSL, {"sasl.mechanisms": "SCRAM-SHA-512", **sasl},
                               Login("SCRAM-SHA-512", USER)),
        "sasl-ssl-oauthbearer-unsecured-jwt": (SASL_SSL, {
            "sasl.mechanisms": "OAUTHBEARER", "ssl.ca.location": pki.ca_pem,
            "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": f"principal={USER}"}, None),
        "sasl-plaintext-scram-512": (SASL_PLAINTEXT, {
            "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": USER,
            "sasl.password": PASSWORD}, Login("SCRAM-SHA-512", USER)),
        "ssl": (SSL, {"ssl.ca.location": pki.ca_pem}, None),
        "mutual-tls": (MUTUAL_TLS, {
            "ssl.ca.location": pki.ca_pem, "ssl.certificate.location": pki.client_cert_pem,
            "ssl.key.location": pki.client_key_pem, "ssl.key.password": KEY_PASSWORD},
            Login("SSL", pki.client_principal)),
    }


SETTINGS = ["sasl-ssl-plain", "sasl-ssl-scram-256", "sasl-ssl-scram-512",
            "sasl-ssl-oauthbearer-unsecured-jwt", "sasl-plaintext-scram-512", "ssl",
            "mutual-tls"]


def _client_config(secured: SecuredKafka, security: Security, settings: dict[str, Any],
                   errors: list[KafkaError]) -> dict[str, Any]:
    return {"bootstrap.servers": secured.bootstrap(security),
            "security.protocol": security.protocol, "error_cb": errors.append, **settings}


@pytest.mark.parametrize("name", SETTINGS)
def test_listener_produces_and_consumes_with_each_security_setting(
    secured: SecuredKafka, pki: Pki, topic: Any, name: str
) -> None:
    """Through the listener: produce, consume every record back, commit the group's offsets
    (Metadata and FindCoordinator both send the client back to the listener)."""
    security, settings, login = _librdkafka_settings(pki)[name]
    errors: list[KafkaError] = []
    config = _client_config(secured, security, settings, errors)
    name_of_topic = topic(2)
    before = len(secured.logins)
    producer = Producer(config)
    for i in range(20):
        producer.produce(name_of_topic, value=f"r{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0, errors
    consumer = Consumer({**config, "group.id": f"group-{name}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(name_of_topic, p, 0) for p in range(2)])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < 20 and time.monotonic() < deadline:
            got += [m.value() for m in consumer.consume(20, 0.5) if m.error() is None]
        assert sorted(got) == sorted(f"r{i}".encode() for i in range(20)), errors
        committed = consumer.commit(asynchronous=False)
        assert committed is not None and {(tp.partition, tp.offset) for tp in committed} == {
            (0, 10), (1, 10)}
    finally:
        consumer.close()
    logins = secured.logins[before:]
    if login is not None:
        assert login in logins
    elif security.sasl:  # OAUTHBEARER: librdkafka's unsecured JWT, subject alice
        assert {(x.mechanism, x.principal) for x in logins} == {("OAUTHBEARER", USER)}
        assert all(x.token and x.token.count(".") == 2 for x in logins)
    else:
        assert logins == []  # TLS without a client certificate authenticates nobody


def _first_error(config: dict[str, Any], errors: list[KafkaError]) -> tuple[KafkaError, float]:
    """The first error a consumer reports, and how long it took."""
    started = time.monotonic()
    consumer = Consumer({**config, "group.id": "refused"})
    try:
        deadline = started + 30
        while not errors and time.monotonic() < deadline:
            consumer.poll(0.1)
    finally:
        consumer.close()
    assert errors, "no error within 30 s"
    return errors[0], time.monotonic() - started


@pytest.mark.parametrize("case", ["wrong-password-plain", "wrong-password-scram",
                                  "unknown-user-scram", "wrong-ca", "no-client-certificate"])
def test_listener_refuses_bad_credentials_as_kafka_does(
    secured: SecuredKafka, pki: Pki, case: str
) -> None:
    sasl = {"ssl.ca.location": pki.ca_pem, "sasl.username": USER, "sasl.password": "wrong"}
    security, settings, expected = {
        "wrong-password-plain": (SASL_SSL, {"sasl.mechanisms": "PLAIN", **sasl},
                                 "Authentication failed: Invalid username or password"),
        "wrong-password-scram": (SASL_SSL, {"sasl.mechanisms": "SCRAM-SHA-512", **sasl},
                                 "invalid credentials with SASL mechanism SCRAM-SHA-512"),
        "unknown-user-scram": (SASL_SSL, {"sasl.mechanisms": "SCRAM-SHA-256", **sasl,
                                          "sasl.username": "mallory"},
                               "invalid credentials with SASL mechanism SCRAM-SHA-256"),
        "wrong-ca": (SSL, {"ssl.ca.location": pki.wrong_ca_pem}, "certificate verify failed"),
        "no-client-certificate": (MUTUAL_TLS, {"ssl.ca.location": pki.ca_pem},
                                  "certificate required"),
    }[case]
    errors: list[KafkaError] = []
    before = len(secured.logins)
    error, took = _first_error(_client_config(secured, security, settings, errors), errors)
    assert expected in error.str(), error
    if security.sasl:
        assert error.code() == KafkaError._AUTHENTICATION, error
    assert took < 10
    assert secured.logins[before:] == []


def test_source_reads_exactly_through_sasl_ssl_with_librdkafka_names(
    spark: Any, secured: SecuredKafka, pki: Pki, records_topic: str, tmp_path: Path
) -> None:
    """``kafka.*`` options in librdkafka's names reach the driver's and the read tasks'
    clients: every record exactly once, over SASL_SSL with SCRAM-SHA-512."""
    before = len(secured.logins)
    df = source(spark, secured.bootstrap(SASL_SSL), records_topic, str(tmp_path / "state"),
                **{"kafka.security.protocol": "SASL_SSL",
                   "kafka.sasl.mechanisms": "SCRAM-SHA-512",
                   "kafka.sasl.username": USER, "kafka.sasl.password": PASSWORD,
                   "kafka.ssl.ca.location": pki.ca_pem})
    rows = run_available_now(df, str(tmp_path / "checkpoint"))
    got = sorted((r.partition, r.offset, r.key, r.value) for r in rows if r.kind == "record")
    assert got == expected_records()
    assert Login("SCRAM-SHA-512", USER) in secured.logins[before:]
