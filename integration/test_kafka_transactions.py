"""Committing another producer's transaction on real brokers, as the exactly-once Kafka sink's
driver does: a confluent-kafka producer leaves its transaction open and the transaction client
(:mod:`flinkish_kafka.transactions`) ends it from a connection of its own, plainly and through
the project's TLS / SASL listeners (:mod:`integration.secured_listener`).

Fates are read from the partition's control batches (:mod:`integration.kafka_transactions`):
the embedded broker's Fetch lists no aborted transactions.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from cryptography.hazmat.primitives import serialization

from flinkish_kafka.connection import AuthenticationError
from flinkish_kafka.java_security import client_config, translate
from flinkish_kafka.transactions import (
    KafkaCommittable,
    TransactionClient,
    TransactionFencedError,
    TransactionTimeoutError,
)
from integration.connect_session import FAKE_AWS_ENV
from integration.kafka_committed import committed_values, partition_view
from integration.kafka_transactions import open_transaction
from integration.mock_cluster import mock_topic
from integration.sasl_server import Login, msk_iam_principal, token_check
from integration.secured_listener import (
    MUTUAL_TLS,
    SASL_PLAINTEXT,
    SASL_SSL,
    SSL,
    SecuredKafka,
    Security,
)
from integration.token_endpoint import TokenEndpoint, unsigned_jwt
from tests.pki import KEY_PW, Pki

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "alice-secret"
CLIENT_ID, CLIENT_SECRET = "flinkish-oidc-client", "oidc-client-secret"
VALUES = [b"v0", b"v1", b"v2"]


def fates(bootstrap: str, topic: str) -> list[str]:
    return [r.fate for r in partition_view(bootstrap, topic)]


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Markers are written after the coordinator answers EndTxn (asynchronously on Kafka)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def one_partition(topic: Callable[[int], str]) -> str:
    return topic(1)


def test_commit_from_another_connection(kafka_bootstrap: str, one_partition: str) -> None:
    producer, committable = open_transaction({"bootstrap.servers": kafka_bootstrap},
                                             one_partition, f"{one_partition}-tx", VALUES)
    assert fates(kafka_bootstrap, one_partition) == ["open"] * 3
    with TransactionClient({"bootstrap.servers": kafka_bootstrap}, 30) as client:
        client.commit(committable)
        wait_for(lambda: committed_values(kafka_bootstrap, one_partition) == VALUES,
                 "the records committed")
        # a replayed commit (Spark replays the batch after a crash) answers success
        client.commit(committable)
    assert committed_values(kafka_bootstrap, one_partition) == VALUES
    del producer  # destroying it leaves its (committed) transaction alone


def test_abort_from_another_connection(kafka_bootstrap: str, one_partition: str) -> None:
    producer, committable = open_transaction({"bootstrap.servers": kafka_bootstrap},
                                             one_partition, f"{one_partition}-tx", VALUES)
    with TransactionClient({"bootstrap.servers": kafka_bootstrap}, 30) as client:
        client.abort(committable)
        wait_for(lambda: fates(kafka_bootstrap, one_partition) == ["aborted"] * 3,
                 "the records aborted")
        client.abort(committable)
    assert committed_values(kafka_bootstrap, one_partition) == []
    del producer


def test_commit_after_a_newer_producer_is_refused(kafka_bootstrap: str,
                                                  one_partition: str) -> None:
    """A second ``init_transactions()`` on the transactional id aborts the open transaction
    and bumps the epoch (Flink's way of aborting lingering transactions): the old committable
    can no longer commit. Kafka answers ``PRODUCER_FENCED`` (see the mock cluster's test and
    the unit tests); the embedded broker (Tansu 0.6) closes the connection instead, on every
    EndTxn it refuses, so there the commit gives up at its timeout."""
    txn_id = f"{one_partition}-tx"
    producer, committable = open_transaction({"bootstrap.servers": kafka_bootstrap},
                                             one_partition, txn_id, VALUES)
    newer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": txn_id})
    newer.init_transactions(30)
    wait_for(lambda: fates(kafka_bootstrap, one_partition) == ["aborted"] * 3,
             "the newer producer's init aborting the open transaction")
    with TransactionClient({"bootstrap.servers": kafka_bootstrap}, 2) as client, \
            pytest.raises(TransactionTimeoutError, match=f"{txn_id}.*closed the connection"):
        client.commit(committable)
    assert committed_values(kafka_bootstrap, one_partition) == []
    del producer, newer


@pytest.mark.parametrize(("ending", "fate"), [
    ("del", "open"), ("exit", "open"), ("os_exit", "open"), ("close", "aborted")])
def test_what_librdkafka_does_with_an_open_transaction_at_its_end(
        kafka_bootstrap: str, one_partition: str, ending: str, fate: str) -> None:
    """The sink's write tasks rely on this: a producer destroyed (its object collected, its
    process exiting normally or by ``os._exit``) leaves its transaction open for the driver to
    commit; ``Producer.close()`` aborts it."""
    child = subprocess.Popen(
        [sys.executable, "-m", "integration.kafka_transactions", kafka_bootstrap,
         one_partition, f"{one_partition}-tx", ending],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        committable = KafkaCommittable.from_json(json.loads(child.stdout.readline()))
        child.stdin.write("\n")
        child.stdin.flush()
        if ending == "del":
            assert child.stdout.readline().strip() == "deleted"
            child.stdin.write("\n")
            child.stdin.flush()
        assert child.wait(60) == 0
    finally:
        child.kill()
        child.wait()
    # an abort by close() is answered before close() returns; give a late one time to show
    time.sleep(1)
    assert fates(kafka_bootstrap, one_partition) == [fate] * 2
    if fate == "open":
        with TransactionClient({"bootstrap.servers": kafka_bootstrap}, 30) as client:
            client.commit(committable)
        wait_for(lambda: committed_values(kafka_bootstrap, one_partition) ==
                 [b"child-0", b"child-1"], "the left transaction committed")


def test_mock_cluster(mock_bootstrap: str) -> None:
    """librdkafka's mock cluster: its coordinator takes the EndTxn of a transaction another
    client left open, writes the COMMIT marker, and fences a stale epoch as Kafka does."""
    name = f"txn-mock-{time.monotonic_ns()}"
    mock_topic(mock_bootstrap, name)
    producer, committable = open_transaction({"bootstrap.servers": mock_bootstrap}, name,
                                             f"{name}-tx", VALUES)
    metadata = producer.list_topics(name, timeout=30)
    leader = metadata.brokers[metadata.topics[name].partitions[0].leader]
    address = f"{leader.host}:{leader.port}"
    assert fates(address, name) == ["open"] * 3
    with TransactionClient({"bootstrap.servers": mock_bootstrap}, 30) as client:
        client.commit(committable)
        wait_for(lambda: committed_values(address, name) == VALUES, "the records committed")
        client.commit(committable)
        # another epoch than the transactional id's (the mock cluster does not fence ids a
        # newer init_transactions() replaced: it keeps epochs per producer id)
        with pytest.raises(TransactionFencedError,
                           match=r"(INVALID_PRODUCER_EPOCH \(47\)|PRODUCER_FENCED \(90\))"):
            client.commit(KafkaCommittable(committable.transactional_id,
                                           committable.producer_id,
                                           committable.producer_epoch + 1))
    assert committed_values(address, name) == VALUES
    del producer


# --- through secured listeners -------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def token_endpoint() -> Iterator[TokenEndpoint]:
    with TokenEndpoint(CLIENT_ID, CLIENT_SECRET) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def secured(kafka_bootstrap: str, pki: Pki) -> Iterator[SecuredKafka]:
    with SecuredKafka(kafka_bootstrap, pki.server_pem, pki.ca_pem, {USER: PASSWORD},
                      token_check({USER, CLIENT_ID})) as listeners:
        yield listeners


def _client_pem(pki: Pki) -> tuple[str, str]:
    """The client certificate and its key (encrypted with KEY_PW), as inline PEM."""
    certificate = pki.client.public_bytes(serialization.Encoding.PEM).decode()
    key = pki.client_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(KEY_PW.encode())).decode()
    return certificate, key


def _ways_in(pki: Pki, tmp: Path, token_url: str
             ) -> dict[str, tuple[Security, dict[str, Any], Login | None]]:
    certificate, key = _client_pem(pki)
    (tmp / "client.pem").write_text(key + certificate)
    sasl = {"ssl.ca.location": pki.ca_pem, "sasl.username": USER, "sasl.password": PASSWORD}
    return {
        "ssl": (SSL, {"ssl.ca.location": pki.ca_pem}, None),
        "mutual-tls-files": (MUTUAL_TLS, {
            "ssl.ca.location": pki.ca_pem, "ssl.certificate.location": str(tmp / "client.pem"),
            "ssl.key.location": str(tmp / "client.pem"), "ssl.key.password": KEY_PW},
            Login("SSL", "CN=flinkish-client")),
        "mutual-tls-inline": (MUTUAL_TLS, {
            "ssl.ca.pem": Path(pki.ca_pem).read_text(), "ssl.certificate.pem": certificate,
            "ssl.key.pem": key, "ssl.key.password": KEY_PW}, Login("SSL", "CN=flinkish-client")),
        "sasl-ssl-plain": (SASL_SSL, {"sasl.mechanisms": "PLAIN", **sasl}, Login("PLAIN", USER)),
        "sasl-ssl-scram-512": (SASL_SSL, {"sasl.mechanisms": "SCRAM-SHA-512", **sasl},
                               Login("SCRAM-SHA-512", USER)),
        "sasl-plaintext-scram-256": (SASL_PLAINTEXT, {
            "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": USER,
            "sasl.password": PASSWORD}, Login("SCRAM-SHA-256", USER)),
        "oauthbearer-oauth-cb": (SASL_SSL, {
            "sasl.mechanisms": "OAUTHBEARER", "ssl.ca.location": pki.ca_pem,
            "oauth_cb": lambda _config: (unsigned_jwt(USER, "kafka"), time.time() + 3600)},
            Login("OAUTHBEARER", USER)),
        "oauthbearer-unsecured-jwt": (SASL_SSL, {
            "sasl.mechanisms": "OAUTHBEARER", "ssl.ca.location": pki.ca_pem,
            "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": f"principal={USER}"}, Login("OAUTHBEARER", USER)),
        "oauthbearer-oidc": (SASL_SSL, {
            "sasl.mechanisms": "OAUTHBEARER", "ssl.ca.location": pki.ca_pem,
            "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.token.endpoint.url": token_url,
            "sasl.oauthbearer.client.id": CLIENT_ID,
            "sasl.oauthbearer.client.secret": CLIENT_SECRET}, Login("OAUTHBEARER", CLIENT_ID)),
    }


WAYS = ["ssl", "mutual-tls-files", "mutual-tls-inline", "sasl-ssl-plain", "sasl-ssl-scram-512",
        "sasl-plaintext-scram-256", "oauthbearer-oauth-cb", "oauthbearer-unsecured-jwt",
        "oauthbearer-oidc"]


@pytest.mark.parametrize("way", WAYS)
def test_commit_through_a_secured_listener(kafka_bootstrap: str, secured: SecuredKafka,
                                           pki: Pki, token_endpoint: TokenEndpoint,
                                           tmp_path: Path, one_partition: str,
                                           way: str) -> None:
    security, settings, login = _ways_in(pki, tmp_path, token_endpoint.url)[way]
    producer, committable = open_transaction({"bootstrap.servers": kafka_bootstrap},
                                             one_partition, f"{one_partition}-tx", VALUES)
    logins = len(secured.logins)
    config = {"bootstrap.servers": secured.bootstrap(security),
              "security.protocol": security.protocol, **settings}
    with TransactionClient(config, 30) as client:
        client.commit(committable)
    wait_for(lambda: committed_values(kafka_bootstrap, one_partition) == VALUES,
             "the records committed")
    if login is not None:
        assert [(x.mechanism, x.principal) for x in secured.logins[logins:]][:1] == [
            (login.mechanism, login.principal)]
    del producer


def test_commit_with_msk_iam(kafka_bootstrap: str, secured: SecuredKafka, pki: Pki,
                             one_partition: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Java client's MSK IAM settings, translated (:mod:`flinkish_kafka.java_security`):
    the signer's token through ``oauth_cb``."""
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    producer, committable = open_transaction({"bootstrap.servers": kafka_bootstrap},
                                             one_partition, f"{one_partition}-tx", VALUES)
    logins = len(secured.logins)
    config = client_config(*translate({
        "bootstrap.servers": secured.bootstrap(SASL_SSL), "security.protocol": "SASL_SSL",
        "sasl.mechanism": "AWS_MSK_IAM",
        "sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
        "sasl.client.callback.handler.class":
            "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
        "ssl.ca.location": pki.ca_pem}))
    with TransactionClient(config, 30) as client:
        client.commit(committable)
    wait_for(lambda: committed_values(kafka_bootstrap, one_partition) == VALUES,
             "the records committed")
    token = secured.logins[logins].token
    assert token is not None and msk_iam_principal(token) == FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"]
    del producer


def test_refused_credentials_are_named_without_the_secret(secured: SecuredKafka,
                                                          pki: Pki) -> None:
    wrong = "not-alices-password"
    committable = KafkaCommittable("never-used", 1, 0)
    for mechanism in ("PLAIN", "SCRAM-SHA-256"):
        config = {"bootstrap.servers": secured.bootstrap(SASL_SSL), "security.protocol":
                  "SASL_SSL", "ssl.ca.location": pki.ca_pem, "sasl.mechanisms": mechanism,
                  "sasl.username": USER, "sasl.password": wrong}
        with TransactionClient(config, 10) as client, \
                pytest.raises(AuthenticationError, match=f"SASL {mechanism}") as raised:
            client.commit(committable)
        assert wrong not in str(raised.value)
        assert secured.bootstrap(SASL_SSL) in str(raised.value)


def test_an_unknown_server_certificate_is_refused(secured: SecuredKafka, pki: Pki,
                                                  tmp_path: Path) -> None:
    other = Pki(tmp_path)
    config = {"bootstrap.servers": secured.bootstrap(SSL), "security.protocol": "SSL",
              "ssl.ca.location": other.ca_pem}
    with TransactionClient(config, 10) as client, \
            pytest.raises(AuthenticationError, match="TLS handshake failed"):
        client.commit(KafkaCommittable("never-used", 1, 0))
