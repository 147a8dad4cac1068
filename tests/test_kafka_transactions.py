"""The transaction client: its encodings against the byte layouts of Kafka's message
definitions (``clients/src/main/resources/common/message/*.json``), and its retries and error
mapping against a scripted coordinator (:mod:`tests.fake_coordinator`)."""

from __future__ import annotations

import base64
import json
import struct
import time

import pytest

from flinkish_core.errors import OptionError
from flinkish_kafka.connection import (
    BrokerConnection,
    Reader,
    UnsupportedVersionError,
    _OAuthBearer,
    _Plain,
    _Scram,
    _unsecured_jwt,
    request_frame,
)
from flinkish_kafka.transactions import (
    KafkaCommittable,
    KafkaTransactionError,
    TransactionClient,
    TransactionFencedError,
    TransactionTimeoutError,
    decode_end_txn,
    decode_find_coordinator,
    encode_end_txn,
    encode_find_coordinator,
)
from tests.fake_coordinator import (
    API_VERSIONS,
    DROP,
    END_TXN,
    FIND_COORDINATOR,
    FakeCoordinator,
)

TXN = KafkaCommittable("sink-0-7", 4242, 3)


def s16(text: str) -> bytes:  # STRING: int16 length
    return struct.pack(">h", len(text)) + text.encode()


def compact(text: str) -> bytes:  # COMPACT_STRING: uvarint length + 1 (all short here)
    return bytes([len(text) + 1]) + text.encode()


# --- encodings ------------------------------------------------------------------------------

def test_request_header_v1_and_v2() -> None:
    head = struct.pack(">hhi", 26, 1, 7) + s16("ab")
    assert request_frame(26, 1, 7, "ab", False, b"B") == struct.pack(">i", len(head) + 1) \
        + head + b"B"
    # v2: the client id keeps its int16 length; an empty tagged-field section follows
    head = struct.pack(">hhi", 26, 3, 7) + s16("ab")
    assert request_frame(26, 3, 7, "ab", True, b"B") == struct.pack(">i", len(head) + 2) \
        + head + b"\x00B"


def test_find_coordinator_requests() -> None:
    # v1-v2: Key (string), KeyType (int8, 1 = transaction)
    assert encode_find_coordinator(1, ["tx"]) == s16("tx") + b"\x01"
    assert encode_find_coordinator(2, ["tx"]) == s16("tx") + b"\x01"
    # v3: flexible
    assert encode_find_coordinator(3, ["tx"]) == compact("tx") + b"\x01" + b"\x00"
    # v4+: KeyType, then CoordinatorKeys (compact array of compact strings)
    assert encode_find_coordinator(4, ["a", "bc"]) == b"\x01" + b"\x03" + compact("a") \
        + compact("bc") + b"\x00"
    assert encode_find_coordinator(6, ["a"]) == b"\x01\x02" + compact("a") + b"\x00"
    with pytest.raises(ValueError, match="one key"):
        encode_find_coordinator(3, ["a", "b"])


def test_find_coordinator_responses() -> None:
    v1 = struct.pack(">ih", 5, 0) + struct.pack(">h", -1) + struct.pack(">i", 2) + s16("h2") \
        + struct.pack(">i", 9092)
    (found,) = decode_find_coordinator(1, Reader(v1), ["tx"])
    assert (found.key, found.error, found.node_id, found.host, found.port) == ("tx", 0, 2, "h2",
                                                                               9092)
    v3 = struct.pack(">ih", 5, 15) + compact("loading") + struct.pack(">i", -1) + compact("") \
        + struct.pack(">i", -1) + b"\x00"
    (found,) = decode_find_coordinator(3, Reader(v3, flexible=True), ["tx"])
    assert (found.error, found.message, found.node_id) == (15, "loading", -1)
    v4 = struct.pack(">i", 0) + b"\x03"
    for key, node, error in (("a", 1, 0), ("bc", 3, 16)):
        v4 += compact(key) + struct.pack(">i", node) + compact(f"h{node}") \
            + struct.pack(">ih", 9000 + node, error) + b"\x00" + b"\x00"  # null message, tags
    v4 += b"\x00"
    got = decode_find_coordinator(4, Reader(v4, flexible=True), ["a", "bc"])
    assert [(c.key, c.node_id, c.host, c.port, c.error, c.message) for c in got] == [
        ("a", 1, "h1", 9001, 0, None), ("bc", 3, "h3", 9003, 16, None)]


def test_end_txn_requests_and_responses() -> None:
    fields = struct.pack(">qhb", 4242, 3, 1)
    assert encode_end_txn(0, TXN, True) == s16("sink-0-7") + fields
    assert encode_end_txn(2, TXN, True) == s16("sink-0-7") + fields
    assert encode_end_txn(3, TXN, False) == compact("sink-0-7") + struct.pack(">qhb", 4242, 3, 0) \
        + b"\x00"
    assert decode_end_txn(1, Reader(struct.pack(">ih", 0, 47))) == 47
    assert decode_end_txn(3, Reader(struct.pack(">ih", 0, 90) + b"\x00", flexible=True)) == 90


def test_scram_sha_256_matches_rfc_7677() -> None:
    scram = _Scram("SCRAM-SHA-256", "user", "pencil")
    scram.nonce = "rOprNGfwEbeRWgbNEkqO"
    assert scram.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = scram.step(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                       b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert scram.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None
    assert scram.done


def test_scram_refuses_a_wrong_server_signature() -> None:
    from flinkish_kafka.connection import AuthenticationError

    scram = _Scram("SCRAM-SHA-512", "u=,x", "pw")
    assert scram.first().startswith(b"n,,n=u=3D=2Cx,r=")  # RFC 5802's escapes
    scram.step(f"r={scram.nonce}srv,s={base64.b64encode(b'salt').decode()},i=4096".encode())
    with pytest.raises(AuthenticationError, match="signature"):
        scram.step(b"v=" + base64.b64encode(b"forged"))


def test_plain_and_oauthbearer_messages() -> None:
    assert _Plain("alice", "pw").first() == b"\0alice\0pw"
    assert _OAuthBearer("tok", {"logicalCluster": "lkc-1"}).first() == \
        b"n,,\x01auth=Bearer tok\x01logicalCluster=lkc-1\x01\x01"


def test_unsecured_jwt_as_librdkafka_makes_it() -> None:
    token, extensions = _unsecured_jwt({"sasl.oauthbearer.config":
                                        "principal=alice scope=a,b lifeSeconds=60 extension_x=1"})
    header, claims, signature = token.split(".")
    assert signature == ""
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "none"}
    body = json.loads(base64.urlsafe_b64decode(claims + "=="))
    assert body["sub"] == "alice" and body["scope"] == ["a", "b"]
    assert body["exp"] - body["iat"] == 60
    assert extensions == {"x": "1"}
    with pytest.raises(OptionError, match="principal"):
        _unsecured_jwt({"sasl.oauthbearer.config": "scope=a"})


def test_committable_json_round_trip() -> None:
    assert KafkaCommittable.from_json(json.loads(json.dumps(TXN.to_json()))) == TXN


@pytest.mark.parametrize(("txn_id", "pid", "epoch"), [("", 1, 0), ("t", -1, 0), ("t", 1, -1),
                                                       ("t", 1, 32768)])
def test_committable_refuses_ids_no_transaction_has(txn_id: str, pid: int, epoch: int) -> None:
    with pytest.raises(ValueError, match="init_transactions"):
        KafkaCommittable(txn_id, pid, epoch)


# --- negotiation ----------------------------------------------------------------------------

@pytest.mark.parametrize(("refusal", "asked"), [("kip-511", [3, 2]), ("mock", [3, 0])])
def test_api_versions_falls_back_to_the_brokers_version(refusal: str, asked: list[int]) -> None:
    """A broker that speaks ApiVersions up to v2 answers our v3 in v0's layout with
    UNSUPPORTED_VERSION and its range (KIP-511): we ask again at v2. librdkafka's mock cluster
    answers in a layout that cannot be read: we ask again at v0."""
    with FakeCoordinator(versions={API_VERSIONS: (0, 2), FIND_COORDINATOR: (0, 2),
                                   END_TXN: (0, 1)}, refusal=refusal) as broker:
        connection = BrokerConnection("127.0.0.1", broker.ports[1], {}, 5)
        connection.close()
        assert [r.version for r in broker.of(API_VERSIONS)] == asked
        assert connection.broker_versions[END_TXN] == (0, 1)


@pytest.mark.parametrize(("find", "end", "used"), [
    ((0, 2), (0, 1), (2, 1)),  # Kafka 2.x
    ((0, 4), (0, 3), (4, 3)),
    ((1, 6), (0, 5), (6, 4)),  # Kafka 4: v0s gone; EndTxn v5 is transaction version 2
])
def test_highest_common_versions(find: tuple[int, int], end: tuple[int, int],
                                 used: tuple[int, int]) -> None:
    with FakeCoordinator(versions={API_VERSIONS: (0, 3), FIND_COORDINATOR: find,
                                   END_TXN: end}) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 5) as client:
        client.commit(TXN)
        (found,) = broker.of(FIND_COORDINATOR)
        (ended,) = broker.of(END_TXN)
        assert (found.version, ended.version) == used
        assert found.fields == {"key_type": 1, "keys": ["sink-0-7"]}
        assert ended.fields == {"transactional_id": "sink-0-7", "producer_id": 4242,
                                "producer_epoch": 3, "committed": True, "node": 1}


def test_no_common_version_names_the_api_and_both_ranges() -> None:
    with FakeCoordinator(versions={API_VERSIONS: (0, 3), FIND_COORDINATOR: (0, 0)}) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 5) as client, \
            pytest.raises(UnsupportedVersionError,
                          match=r"speaks versions 0\.\.0 of FindCoordinator .*speaks 1\.\.6"):
        client.commit(TXN)
    with FakeCoordinator(versions={API_VERSIONS: (0, 3), FIND_COORDINATOR: (0, 4)}) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 5) as client, \
            pytest.raises(UnsupportedVersionError, match=r"speaks no version of EndTxn"):
        client.commit(TXN)


# --- retries and errors ---------------------------------------------------------------------

def test_abort_sends_committed_false_to_the_coordinator() -> None:
    with FakeCoordinator(brokers=2, coordinator=2) as broker, \
            TransactionClient({"bootstrap.servers": f"127.0.0.1:{broker.ports[1]}"}, 5) as client:
        client.abort(TXN)
        (ended,) = broker.of(END_TXN)
        assert ended.fields["committed"] is False and ended.node == 2
        assert [r.node for r in broker.of(FIND_COORDINATOR)] == [1]


@pytest.mark.parametrize("answers", [[51, 51, 0], [14, 0], [7, 13, 0]])
def test_retriable_end_txn_errors_are_retried(answers: list[int]) -> None:
    with FakeCoordinator(end_answers=list(answers)) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 10) as client:
        client.commit(TXN)
        assert len(broker.of(END_TXN)) == len(answers)
        assert len(broker.of(FIND_COORDINATOR)) == 1  # the coordinator stayed


@pytest.mark.parametrize("error", [15, 16])
def test_coordinator_moved_is_found_again(error: int) -> None:
    with FakeCoordinator(end_answers=[error]) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 10) as client:
        client.commit(TXN)
        assert len(broker.of(END_TXN)) == 2
        assert len(broker.of(FIND_COORDINATOR)) == 2


def test_lost_connections_are_retried() -> None:
    with FakeCoordinator(find_answers=[DROP, 15], end_answers=[DROP]) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 10) as client:
        client.commit(TXN)
        # a lost coordinator connection is found again, as Kafka's producer does (Sender:
        # lookupCoordinator after a disconnect)
        assert len(broker.of(FIND_COORDINATOR)) == 4
        assert len(broker.of(END_TXN)) == 2
        assert len(broker.of(API_VERSIONS)) == 3  # a new connection after each drop


@pytest.mark.parametrize("error", [47, 90])
def test_fenced(error: int) -> None:
    with FakeCoordinator(end_answers=[error]) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 5) as client:
        with pytest.raises(TransactionFencedError, match="sink-0-7.*4242.*epoch 3") as raised:
            client.commit(TXN)
        assert raised.value.code == error
        assert len(broker.of(END_TXN)) == 1


@pytest.mark.parametrize(("error", "name"), [
    (48, "INVALID_TXN_STATE"), (49, "INVALID_PRODUCER_ID_MAPPING"),
    (53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"), (-1, "UNKNOWN_SERVER_ERROR")])
def test_other_errors_are_raised_with_their_name(error: int, name: str) -> None:
    with FakeCoordinator(end_answers=[error]) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 5) as client:
        with pytest.raises(KafkaTransactionError, match=f"{name} \\({error}\\)") as raised:
            client.commit(TXN)
        assert not isinstance(raised.value, TransactionFencedError)
        assert (raised.value.code, raised.value.name) == (error, name)
        assert len(broker.of(END_TXN)) == 1


def test_find_coordinator_errors() -> None:
    with FakeCoordinator(find_answers=[14, 15, 0]) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 10) as client:
        client.commit(TXN)
        assert len(broker.of(FIND_COORDINATOR)) == 3
    with FakeCoordinator(find_answers=[53]) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 10) as client:
        with pytest.raises(KafkaTransactionError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            client.commit(TXN)
        assert broker.of(END_TXN) == []


def test_retries_stop_at_the_timeout() -> None:
    with FakeCoordinator(end_answers=[51] * 10_000) as broker, \
            TransactionClient({"bootstrap.servers": broker.bootstrap}, 1.0) as client:
        started = time.monotonic()
        with pytest.raises(TransactionTimeoutError, match="within 1 s.*CONCURRENT_TRANSACTIONS"):
            client.commit(TXN)
        assert time.monotonic() - started < 2.5
        assert len(broker.of(END_TXN)) > 2


def test_unreachable_broker_times_out_naming_it() -> None:
    with FakeCoordinator() as broker:
        bootstrap = broker.bootstrap
    with TransactionClient({"bootstrap.servers": bootstrap}, 0.5) as client, \
            pytest.raises(TransactionTimeoutError, match=f"broker {bootstrap}: cannot connect"):
        client.commit(TXN)


def test_bad_settings_fail_at_construction() -> None:
    with pytest.raises(OptionError, match="security.protocol=KERBEROS"):
        TransactionClient({"bootstrap.servers": "h:1", "security.protocol": "kerberos"})
    with pytest.raises(OptionError, match="bootstrap.servers"):
        TransactionClient({})
