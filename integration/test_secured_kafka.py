"""Reading secured Kafka: TLS, mutual TLS, SASL PLAIN / SCRAM / OAUTHBEARER, through the
project's secured listeners (:mod:`integration.secured_listener`) in front of the session's
broker.

First the listeners themselves, with confluent-kafka's own clients (librdkafka's option names):
each security setting produces and consumes, and each bad credential is refused with the error
a Kafka broker gives. Then the flinkish source reading a topic exactly through them.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from flinkish_kafka.java_security import client_config, translate
from integration.connect_session import FAKE_AWS_ENV, Child, run_client
from integration.kafka_helpers import Collector, produce, run_available_now, source, start
from integration.sasl_server import Login, msk_iam_principal, token_check
from integration.secured_listener import (
    MUTUAL_TLS,
    SASL_PLAINTEXT,
    SASL_SSL,
    SSL,
    SecuredKafka,
    Security,
)
from integration.token_endpoint import TokenEndpoint
from tests.pki import KEY_PW, STORE_PW, Pki

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "alice-secret"
#: Azure Event Hubs' Kafka endpoint: PLAIN, this user name, the connection string as password
EVENT_HUBS_USER = "$ConnectionString"
EVENT_HUBS_PASSWORD = ("Endpoint=sb://flinkish-test.servicebus.windows.net/;"
                       "SharedAccessKeyName=RootManageSharedAccessKey;"
                       "SharedAccessKey=Zmxpbmtpc2gtdGVzdC1rZXk=")
CLIENT_ID, CLIENT_SECRET = "flinkish-oidc-client", "oidc-client-secret"
PARTITIONS, PER_PARTITION = 3, 10


@dataclass(frozen=True)
class Certificates:
    """The files and stores the tests' clients and listeners use."""

    ca_pem: str
    wrong_ca_pem: str  # an unrelated CA's
    server_pem: str  # the listeners' chain and key
    client_pem: str  # the client's key (encrypted with KEY_PW) and chain
    jks_trust: dict[str, str]  # Java options: the CA in a JKS trust store
    pkcs12_trust: dict[str, str]  # Java options: the CA in a PKCS#12 trust store
    jks_keystore: dict[str, str]  # Java options: the client's key and chain in a JKS store


#: how the listener names the client it authenticated by its certificate (tests/pki.py's)
CLIENT_PRINCIPAL = "CN=flinkish-client"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    made = Pki(tmp_path_factory.mktemp("pki"))
    client = made.keystore("PEM")["ssl.keystore.location"]
    return Certificates(
        ca_pem=made.ca_pem, wrong_ca_pem=Pki(tmp_path_factory.mktemp("other-ca")).ca_pem,
        server_pem=made.server_pem, client_pem=client,
        jks_trust={f"kafka.{k}": v for k, v in made.truststore("JKS").items()},
        pkcs12_trust={f"kafka.{k}": v for k, v in made.truststore("PKCS12").items()},
        jks_keystore={f"kafka.{k}": v for k, v in made.keystore("JKS").items()})


@pytest.fixture(scope="module")
def token_endpoint() -> Iterator[TokenEndpoint]:
    with TokenEndpoint(CLIENT_ID, CLIENT_SECRET) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def secured(kafka_bootstrap: str, pki: Certificates) -> Iterator[SecuredKafka]:
    """Every secured listener of this module, in front of the session's broker."""
    users = {USER: PASSWORD, EVENT_HUBS_USER: EVENT_HUBS_PASSWORD}
    with SecuredKafka(kafka_bootstrap, pki.server_pem, pki.ca_pem, users,
                      token_check({USER, CLIENT_ID})) as listeners:
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


def _librdkafka_settings(pki: Certificates
                         ) -> dict[str, tuple[Security, dict[str, Any], Login | None]]:
    """librdkafka's settings for each way in, and the login the listener must record."""
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
            "ssl.ca.location": pki.ca_pem, "ssl.certificate.location": pki.client_pem,
            "ssl.key.location": pki.client_pem, "ssl.key.password": KEY_PW},
            Login("SSL", CLIENT_PRINCIPAL)),
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
    secured: SecuredKafka, pki: Certificates, topic: Any, name: str
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
    secured: SecuredKafka, pki: Certificates, case: str
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


def librdkafka_sasl_ssl(pki: Certificates) -> dict[str, str]:
    """SASL_SSL with SCRAM-SHA-512, in librdkafka's names (what worked before the Java names
    were translated)."""
    return {"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanisms": "SCRAM-SHA-512",
            "kafka.sasl.username": USER, "kafka.sasl.password": PASSWORD,
            "kafka.ssl.ca.location": pki.ca_pem}


def _exchange(sock: socket.socket, payload: bytes) -> bytes:
    """Send one size-prefixed frame; the answer's payload (empty if the listener hung up)."""
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return b""
    size = struct.unpack(">i", head)[0]
    return sock.recv(size, socket.MSG_WAITALL) if size else b""


@pytest.mark.parametrize("password", [PASSWORD, "wrong"], ids=["right-password", "wrong-password"])
def test_listener_speaks_sasl_handshake_v0_and_old_metadata(
    secured: SecuredKafka, password: str
) -> None:
    """The pre-KIP-152 exchange old clients use (SaslHandshake v0, then bare SASL tokens), and
    a Metadata v0 response rewritten to name the listener: by hand, as no librdkafka build
    still sends either."""
    host, port = secured.bootstrap(SASL_PLAINTEXT).split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        client = struct.pack(">h", 3) + b"raw"
        answer = _exchange(sock, struct.pack(">hhi", 17, 0, 1) + client
                           + struct.pack(">h", 5) + b"PLAIN")
        assert answer[:6] == struct.pack(">ih", 1, 0) and b"SCRAM-SHA-512" in answer
        token = f"\0{USER}\0{password}".encode()
        sock.sendall(struct.pack(">i", len(token)) + token)
        head = sock.recv(4, socket.MSG_WAITALL)
        if password != PASSWORD:
            assert head == b"", "a refused v0 login must close the connection"
            return
        assert head == struct.pack(">i", 0)  # the empty server token: logged in
        answer = _exchange(sock, struct.pack(">hhi", 3, 0, 2) + client + struct.pack(">i", 0))
    correlation, brokers, _node = struct.unpack_from(">iii", answer)
    (length,) = struct.unpack_from(">h", answer, 12)
    advertised = answer[14:14 + length].decode()
    (advertised_port,) = struct.unpack_from(">i", answer, 14 + length)
    assert (correlation, brokers) == (2, 1)
    assert f"{advertised}:{advertised_port}" == secured.bootstrap(SASL_PLAINTEXT)


def test_source_reads_exactly_through_sasl_ssl_with_librdkafka_names(
    spark: Any, secured: SecuredKafka, pki: Certificates, records_topic: str, tmp_path: Path
) -> None:
    """``kafka.*`` options in librdkafka's names reach the driver's and the read tasks'
    clients: every record exactly once, over SASL_SSL with SCRAM-SHA-512."""
    before = len(secured.logins)
    df = source(spark, secured.bootstrap(SASL_SSL), records_topic, str(tmp_path / "state"),
                **librdkafka_sasl_ssl(pki))
    rows = run_available_now(df, str(tmp_path / "checkpoint"))
    got = sorted((r.partition, r.offset, r.key, r.value) for r in rows if r.kind == "record")
    assert got == expected_records()
    assert Login("SCRAM-SHA-512", USER) in secured.logins[before:]


PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
OIDC_HANDLER = ("org.apache.kafka.common.security.oauthbearer.secured."
                "OAuthBearerLoginCallbackHandler")
#: name -> the listener and the source options
OptionSets = dict[str, tuple[Security, dict[str, str]]]


def java_option_sets(pki: Certificates, token_url: str) -> OptionSets:
    """Option sets as users write them for Spark's ``format("kafka")`` (the Java client's
    names), one per kind of cluster, each with the listener it reaches."""
    pem_trust = {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": pki.ca_pem}
    return {
        # Confluent Cloud, as Databricks users write it (the shaded class name)
        "confluent-cloud": (SASL_SSL, {
            "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": f"kafkashaded.{PLAIN_MODULE} required "
                                      f"username='{USER}' password='{PASSWORD}';",
            **pem_trust}),
        # MSK (or any cluster) with SCRAM, a JKS trust store
        "scram-sha-512": (SASL_SSL, {
            "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule"
                                      f' required username="{USER}" password="{PASSWORD}";',
            **pki.jks_trust}),
        # a self-managed cluster with mutual TLS: JKS trust and key stores
        "mutual-tls-jks": (MUTUAL_TLS, {
            "kafka.security.protocol": "SSL", **pki.jks_trust, **pki.jks_keystore,
            "kafka.ssl.endpoint.identification.algorithm": "https"}),
        # Azure Event Hubs' Kafka endpoint (a PKCS#12 trust store here)
        "event-hubs": (SASL_SSL, {
            "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": f'{PLAIN_MODULE} required username="{EVENT_HUBS_USER}" '
                                      f'password="{EVENT_HUBS_PASSWORD}";',
            **pki.pkcs12_trust}),
        # OAuth 2 client credentials against an identity provider (KIP-768)
        "oauthbearer-oidc": (SASL_SSL, {
            "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "OAUTHBEARER",
            "kafka.sasl.login.callback.handler.class": OIDC_HANDLER,
            "kafka.sasl.oauthbearer.token.endpoint.url": token_url,
            "kafka.sasl.jaas.config":
                f"{OAUTH_MODULE} required clientId='{CLIENT_ID}'"
                f" clientSecret='{CLIENT_SECRET}' scope='kafka'"
                " extension_logicalCluster='lkc-flinkish';",
            **pem_trust}),
        # AWS MSK with IAM through OAUTHBEARER (the signer's token), as AWS documents it
        "msk-iam": (SASL_SSL, {
            "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "OAUTHBEARER",
            "kafka.sasl.jaas.config": f"{OAUTH_MODULE} required;",
            "kafka.sasl.login.callback.handler.class":
                "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler",
            "kafka.sasl.client.callback.handler.class":
                "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler",
            **pki.jks_trust}),
        # the same with MSK's own mechanism name, which librdkafka lacks
        "msk-iam-aws-msk-iam": (SASL_SSL, {
            "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "AWS_MSK_IAM",
            "kafka.sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
            "kafka.sasl.client.callback.handler.class":
                "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
            **pki.jks_trust}),
    }


#: who each option set logs in as
JAVA_LOGINS = {
    "confluent-cloud": ("PLAIN", USER), "scram-sha-512": ("SCRAM-SHA-512", USER),
    "mutual-tls-jks": ("SSL", CLIENT_PRINCIPAL),
    "event-hubs": ("PLAIN", EVENT_HUBS_USER), "oauthbearer-oidc": ("OAUTHBEARER", CLIENT_ID),
    "msk-iam": ("OAUTHBEARER", FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"]),
    "msk-iam-aws-msk-iam": ("OAUTHBEARER", FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"]),
}
MSK_SETS = ("msk-iam", "msk-iam-aws-msk-iam")


@pytest.mark.parametrize("name", ["mutual-tls-jks", "scram-sha-512", "event-hubs",
                                  "two-cas"])
def test_java_stores_reach_librdkafka_in_memory(
    secured: SecuredKafka, pki: Certificates, token_endpoint: TokenEndpoint, topic: Any,
    tmp_path: Path, name: str
) -> None:
    """JKS and PKCS#12 stores, translated, as librdkafka's ``ssl.*.pem`` settings: the broker's
    CA is trusted (also when it is the second certificate of a trust store, as while a CA is
    rotated) and the client's certificate chain and key are presented (mutual TLS logs in as
    the certificate's subject)."""
    sets = java_option_sets(pki, token_endpoint.url)
    # another CA's name: librdkafka (OpenSSL's lookup by subject) tries only the first
    # certificate of a name, from a file as from memory
    other = Pki(tmp_path, ca_name="flinkish other CA")
    two_cas = tmp_path / "two-cas.pem"
    two_cas.write_bytes(Path(other.ca_pem).read_bytes() + Path(pki.ca_pem).read_bytes())
    sets["two-cas"] = (SASL_SSL, {**sets["confluent-cloud"][1],
                                  "kafka.ssl.truststore.location": str(two_cas)})
    security, options = sets[name]
    kafka = {k[len("kafka."):]: v for k, v in options.items()}
    kafka["bootstrap.servers"] = secured.bootstrap(security)
    config = client_config(*translate(kafka))
    assert not any(k.endswith(".location") for k in config)
    listed = topic(1)
    before = len(secured.logins)
    consumer = Consumer({**config, "group.id": "in-memory"})
    try:
        assert list(consumer.list_topics(listed, timeout=30).topics[listed].partitions) == [0]
    finally:
        consumer.close()
    login = JAVA_LOGINS["confluent-cloud" if name == "two-cas" else name]
    assert {(x.mechanism, x.principal) for x in secured.logins[before:]} == {login}


@pytest.mark.parametrize("name", MSK_SETS)
def test_msk_iam_token_is_exchanged_through_oauthbearer(
    secured: SecuredKafka, pki: Certificates, token_endpoint: TokenEndpoint, topic: Any,
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The MSK IAM option set, translated, drives a librdkafka client here: the token the
    signer makes from the (fake, static) AWS credentials reaches the listener through
    OAUTHBEARER, and is a SigV4-presigned ``kafka-cluster:Connect`` URL for that key and
    region."""
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    security, options = java_option_sets(pki, token_endpoint.url)[name]
    kafka = {k[len("kafka."):]: v for k, v in options.items()}
    kafka["bootstrap.servers"] = secured.bootstrap(security)
    config = client_config(*translate(kafka))
    listed = topic(1)
    before = len(secured.logins)
    consumer = Consumer({**config, "group.id": "msk-iam"})
    try:
        metadata = consumer.list_topics(listed, timeout=30)
        assert list(metadata.topics[listed].partitions) == [0]
    finally:
        consumer.close()
    logins = secured.logins[before:]
    assert logins and {(x.mechanism, x.principal) for x in logins} == {
        ("OAUTHBEARER", FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"])}
    token = logins[0].token
    assert token is not None and msk_iam_principal(token) == FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"]
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    assert url.startswith("https://kafka.eu-west-1.amazonaws.com/?")
    assert "%2Feu-west-1%2Fkafka-cluster%2Faws4_request" in url


def _start_all(spark: Any, bootstrap_of: Callable[[Security], str],
               option_sets: Mapping[str, tuple[Security, Mapping[str, str | None]]],
               topic: str, root: Path) -> dict[str, tuple[Any, Collector]]:
    """Each option set's availableNow query over ``topic``, all started before any is awaited
    (one Spark start-up cost shared by all)."""
    queries = {}
    for name, (security, options) in option_sets.items():
        df = source(spark, bootstrap_of(security), topic, str(root / name / "state"), **options)
        collector = Collector()
        queries[name] = (start(df, str(root / name / "checkpoint"), collector,
                               available_now=True), collector)
    return queries


def test_source_reads_exactly_with_java_client_option_sets(
    spark: Any, secured: SecuredKafka, pki: Certificates, token_endpoint: TokenEndpoint,
    records_topic: str, tmp_path: Path
) -> None:
    """The ``kafka.*`` options of Confluent Cloud, SCRAM with a JKS trust store, mutual TLS
    with JKS stores, Event Hubs and OAuth client credentials, unchanged from ``format("kafka")``:
    each query reads every record exactly once, logged in as its option set says. (MSK IAM
    needs AWS credentials in the workers' environment: it reads on the Connect server, below.)"""
    sets = java_option_sets(pki, token_endpoint.url)
    for name in MSK_SETS:
        del sets[name]
    before = len(secured.logins)
    queries = _start_all(spark, secured.bootstrap, sets, records_topic, tmp_path)
    failures = {}
    for name, (query, collector) in queries.items():
        query.awaitTermination(300)
        if query.isActive:
            query.stop()
            failures[name] = "did not finish in 300 s"
        elif query.exception() is not None:
            failures[name] = str(query.exception())[:2000]
        else:
            got = sorted((r.partition, r.offset, r.key, r.value)
                         for r in collector.snapshot() if r.kind == "record")
            if got != expected_records():
                failures[name] = f"read {len(got)} records, not exactly the topic's"
    assert not failures, "\n".join(f"{k}: {v}" for k, v in failures.items())
    logins = {(x.mechanism, x.principal) for x in secured.logins[before:]}
    assert {JAVA_LOGINS[name] for name in sets} <= logins
    assert {"client_id": CLIENT_ID, "scope": "kafka"} in token_endpoint.grants
    assert any(x.extensions.get("logicalCluster") == "lkc-flinkish"
               for x in secured.logins[before:])


def test_refused_clients_fail_the_query_fast_and_clearly(
    spark: Any, secured: SecuredKafka, pki: Certificates, token_endpoint: TokenEndpoint,
    records_topic: str, tmp_path: Path
) -> None:
    """A wrong password, a trust store without the brokers' CA and a missing client
    certificate each end their query within seconds (not at the 120 s bound of an unanswered
    poll), saying what failed and naming the servers, without the secret."""
    sets = java_option_sets(pki, token_endpoint.url)
    wrong = "not-the-password"
    wrong_password = dict(sets["confluent-cloud"][1])
    wrong_password["kafka.sasl.jaas.config"] = wrong_password["kafka.sasl.jaas.config"].replace(
        PASSWORD, wrong)
    wrong_ca = {**sets["confluent-cloud"][1], "kafka.ssl.truststore.location": pki.wrong_ca_pem}
    no_certificate = {k: v for k, v in sets["mutual-tls-jks"][1].items()
                      if not k.startswith(("kafka.ssl.keystore.", "kafka.ssl.key."))}
    cases = {  # the option set, the listener, what the error must say
        "wrong-password": (SASL_SSL, wrong_password, "authentication failed"),
        "wrong-ca": (SASL_SSL, wrong_ca, "TLS verification failed"),
        "no-client-certificate": (MUTUAL_TLS, no_certificate, "TLS verification failed"),
    }
    started = time.monotonic()
    queries = _start_all(
        spark, secured.bootstrap,
        # the source's default poll bound (120 s), which a refusal must not wait out
        {name: (security, {**options, "kafkaConsumer.pollTimeoutMs": None})
         for name, (security, options, _) in cases.items()},
        records_topic, tmp_path)
    problems = {}
    for name, (query, _) in queries.items():
        with contextlib.suppress(Exception):  # the query's own error, read below
            query.awaitTermination(150)
        took = time.monotonic() - started
        error = str(query.exception()) if not query.isActive and query.exception() else ""
        if query.isActive:
            query.stop()
        expected = cases[name][2]
        if expected not in error or secured.bootstrap(cases[name][0]) not in error:
            problems[name] = f"after {took:.0f} s: {error[:1500] or 'no error'}"
        elif took > 60:
            problems[name] = f"failed only after {took:.0f} s"
        elif wrong in error or STORE_PW in error:
            problems[name] = "the error shows a secret"
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())


def test_source_reads_exactly_through_secured_listeners_on_connect(
    connect_server: tuple[Child, int], secured: SecuredKafka, pki: Certificates,
    token_endpoint: TokenEndpoint, records_topic: str, tmp_path: Path
) -> None:
    """On a Spark Connect session (queries planned and read by the server's Python workers):
    librdkafka's names, the Confluent Cloud option set and MSK IAM (the server's environment
    holds fake AWS credentials, as an MSK client's machine holds real ones) each read every
    record exactly once into the flinkish Parquet sink."""
    java = java_option_sets(pki, token_endpoint.url)
    sets = {"librdkafka-scram-sha-512": (SASL_SSL, librdkafka_sasl_ssl(pki)),
            "confluent-cloud": java["confluent-cloud"], "msk-iam": java["msk-iam"]}
    jobs = [{"name": name, "kind": "records", "target": "parquet", "topic": records_topic,
             "bootstrap": secured.bootstrap(security), "options": options,
             "checkpoint": str(tmp_path / name / "checkpoint"),
             "path": str(tmp_path / name / "out"), "max_offsets": 1_000}
            for name, (security, options) in sets.items()]
    before = len(secured.logins)
    run_client(connect_server, tmp_path, jobs)
    for job in jobs:
        table = ds.dataset(job["path"], format="parquet").to_table(
            columns=["partition", "offset", "key", "value"])
        got = sorted(zip(*(table.column(c).to_pylist() for c in table.column_names),
                         strict=True))
        assert got == expected_records(), job["name"]
    logins = {(x.mechanism, x.principal) for x in secured.logins[before:]}
    assert {("SCRAM-SHA-512", USER), JAVA_LOGINS["confluent-cloud"],
            JAVA_LOGINS["msk-iam"]} <= logins


def test_kafka_sink_commits_through_secured_listeners(
    kafka_bootstrap: str, secured: SecuredKafka, pki: Certificates
) -> None:
    """No Spark: target kafka's connections (the task's transactional producer, the driver's
    EndTxn client) with the Java client's option sets, as a user writes them for the sink:
    each commits its records, logged in as the set says."""
    from flinkish.demo.embedded_kafka import create_topic
    from flinkish_sink.kafka_target import KafkaTarget, kafka_options
    from flinkish_sink.options import parse_sink_options
    from flinkish_sink.target import TransactionId
    from integration.kafka_committed import settled_values

    sets = {name: found for name, found in java_option_sets(pki, "http://unused").items()
            if name in ("scram-sha-512", "mutual-tls-jks", "event-hubs")}
    before = len(secured.logins)
    for name, (security, options) in sets.items():
        out = f"secured-sink-{name}-{time.monotonic_ns()}"
        create_topic(kafka_bootstrap, out, 1)
        parsed = parse_sink_options({
            **options, "target": "kafka", "topic": out, "checkpointLocation": "/unused",
            "kafka.bootstrap.servers": secured.bootstrap(security)})
        target = KafkaTarget(kafka_options(parsed.target_options))
        batch = pa.RecordBatch.from_pydict({"value": [f"{name}-{i}" for i in range(3)]})
        transaction = target.begin_transaction(
            TransactionId("flinkish", f"secured{name.replace('-', '')}", 0, 0, 0), batch.schema)
        transaction.write(batch)
        target.commit(transaction.pre_commit())
        target.close()
        assert settled_values(kafka_bootstrap, out, 1) == [
            f"{name}-{i}".encode() for i in range(3)], name
    logins = {(x.mechanism, x.principal) for x in secured.logins[before:]}
    assert {JAVA_LOGINS[name] for name in sets} <= logins
