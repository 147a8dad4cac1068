"""FetchRangeReader's contract where a real broker cannot be made to misbehave on demand: a
broker on a loopback socket answering Fetch v4 as the test says (records encoded by Kafka's
format in record_batches.py), and a stand-in for the librdkafka consumer that serves metadata
and earliest offsets. Lost offsets fail or are skipped per failOnDataLoss, a leader that moved
is looked up again, a dropped connection is made again, a partition that now ends before the
planned end is lost data, an unreachable leader fails after the bound naming the option,
several ranges on one leader share a request, and a batch it cannot decode hands the rest of
the range to librdkafka."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from record_batches import Rec, batch, plain
from test_consumer_pool import FakeConsumer

import flinkish_source.kafka as kafka_source
import flinkish_source.kafka.base as kafka_base
import flinkish_source.kafka.native as native
from flinkish.demo.ports import free_port, server_socket
from flinkish_source.kafka import DataLossError, KafkaUnavailableError
from flinkish_source.kafka.base import ConsumerPool
from flinkish_source.kafka.librdkafka import RangeReader
from flinkish_source.kafka.native import FetchRangeReader, eligible
from flinkish_source.kafka.protocol import RecordChunk
from flinkish_source.options import parse_options

#: what the broker answers for one partition: (error code, high watermark, records)
Answer = tuple[int, int, bytes]


class FakeBroker:
    """Answers Fetch v4 requests on 127.0.0.1 with ``answer(topic, partition, offset)``;
    ``drop`` closes the connection instead of answering the request with that number."""

    def __init__(self, answer: Callable[[str, int, int], Answer]) -> None:
        self.answer = answer
        self.requests: list[list[tuple[str, int, int]]] = []
        self.drop: set[int] = set()
        self.fetch_versions = (0, 11)  # what ApiVersions says the broker serves
        self.client_ids: list[bytes] = []
        self.settings: list[tuple[int, int, int]] = []  # max wait, min bytes, max bytes
        self._server = server_socket()
        self.port = self._server.getsockname()[1]
        self._stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self._stopped = True
        self._server.close()

    def _serve(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with conn:
            while True:
                head = _recv(conn, 4)
                if head is None:
                    return
                body = _recv(conn, struct.unpack(">i", head)[0])
                assert body is not None
                api, version, correlation, client = struct.unpack_from(">hhih", body)
                self.client_ids.append(body[10:10 + client])
                if api == 18:  # ApiVersions: v0 to v2, as Kafka 2.0 (KIP-511 for others)
                    low, high = self.fetch_versions
                    error = 35 if version > 2 else 0  # UNSUPPORTED_VERSION, in v0's layout
                    answer = struct.pack(">ihi", correlation, error, 2) + struct.pack(
                        ">hhhhhh", 1, low, high, 18, 0, 2)
                    if version >= 1:
                        answer += struct.pack(">i", 0)  # throttle time
                    conn.sendall(struct.pack(">i", len(answer)) + answer)
                    continue
                assert (api, version) == (1, 4)
                self.settings.append(struct.unpack_from(">iii", body, 10 + client + 4))
                wants = _decode_request(body, 10 + client)
                self.requests.append(wants)
                if len(self.requests) in self.drop:
                    return
                conn.sendall(_response(correlation, wants, self.answer))


def _recv(conn: socket.socket, n: int) -> bytes | None:
    """``n`` bytes, or None once the client closed the connection (or reset it, closing with
    an answer unread)."""
    data = b""
    while len(data) < n:
        try:
            chunk = conn.recv(n - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def _decode_request(body: bytes, pos: int) -> list[tuple[str, int, int]]:
    pos += 4 + 4 + 4 + 4 + 1  # replica, max wait, min bytes, max bytes, isolation
    wants = []
    (topics,) = struct.unpack_from(">i", body, pos)
    pos += 4
    for _ in range(topics):
        (length,) = struct.unpack_from(">h", body, pos)
        topic = body[pos + 2:pos + 2 + length].decode()
        pos += 2 + length
        (parts,) = struct.unpack_from(">i", body, pos)
        pos += 4
        for _ in range(parts):
            partition, offset, _max = struct.unpack_from(">iqi", body, pos)
            pos += 16
            wants.append((topic, partition, offset))
    return wants


def _response(correlation: int, wants: list[tuple[str, int, int]],
              answer: Callable[[str, int, int], Answer]) -> bytes:
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for topic, partition, offset in wants:
        by_topic.setdefault(topic, []).append((partition, offset))
    out = [struct.pack(">ii", correlation, 0), struct.pack(">i", len(by_topic))]
    for topic, parts in by_topic.items():
        out.append(struct.pack(">h", len(topic)) + topic.encode() + struct.pack(">i", len(parts)))
        for partition, offset in parts:
            error, high, records = answer(topic, partition, offset)
            out.append(struct.pack(">ihqqi", partition, error, high, high, -1))
            out.append(struct.pack(">i", len(records)) + records)
    body = b"".join(out)
    return struct.pack(">i", len(body)) + body


@dataclass
class Node:
    host: str
    port: int


@dataclass
class Part:
    leader: int


@dataclass
class Topic:
    partitions: dict[int, Part]
    error: Any = None


@dataclass
class Cluster:
    brokers: dict[int, Node]
    topics: dict[str, Topic]


@dataclass
class MetadataConsumer:
    """What FetchRangeReader asks librdkafka: where partitions live, earliest offsets."""

    leader: Callable[[], Node]
    earliest: int = 0
    lookups: int = 0
    closed: bool = False
    config: dict[str, Any] = field(default_factory=dict)

    def list_topics(self, topic: str, timeout: float) -> Cluster:
        self.lookups += 1
        return Cluster({1: self.leader()}, {topic: Topic({p: Part(1) for p in range(4)})})

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return self.earliest, 10**6

    def unassign(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def options(**extra: str) -> Any:
    return parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t",
                          "includeMarkers": "false", "kafkaConsumer.pollTimeoutMs": "1500",
                          "kafkaConsumer.fetch": "native", **extra})


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    made = FakeBroker(lambda t, p, o: (0, 100, plain(o, min(10, 100 - o))))
    yield made
    made.close()


@pytest.fixture
def consumer(broker: FakeBroker, monkeypatch: pytest.MonkeyPatch) -> MetadataConsumer:
    made = MetadataConsumer(lambda: Node("127.0.0.1", broker.port))
    pool = ConsumerPool(factory=lambda config: made, evict_interval=0)
    monkeypatch.setattr(kafka_base, "POOL", pool)
    return made


def read(reader: FetchRangeReader, topic: str, partition: int, start: int, end: int
         ) -> list[int]:
    return [m.offset() for chunk in reader.read(topic, partition, start, end) for m in chunk]


def test_ranges_on_one_leader_share_requests(broker: FakeBroker,
                                             consumer: MetadataConsumer) -> None:
    ranges = [("t", p, 5, 25) for p in range(4)]
    with FetchRangeReader(options(), ranges, 100) as reader:
        got = [read(reader, *r) for r in ranges]
    assert got == [list(range(5, 25))] * 4
    assert len(broker.requests[0]) == 4  # the first request asked for every range
    assert len(broker.requests) <= 4
    assert consumer.lookups == 1


def test_lost_offsets_fail_or_skip_to_the_earliest(broker: FakeBroker,
                                                   consumer: MetadataConsumer) -> None:
    broker.answer = lambda t, p, o: ((1, 100, b"") if o < 40
                                     else (0, 100, plain(o, min(10, 100 - o))))
    consumer.earliest = 40
    with pytest.raises(DataLossError, match=r"t/0: offsets 10..39 .* no longer in Kafka"), \
            FetchRangeReader(options(), [("t", 0, 10, 50)], 100) as reader:
        read(reader, "t", 0, 10, 50)
    lenient = options(failOnDataLoss="false")
    with FetchRangeReader(lenient, [("t", 0, 10, 50)], 100) as reader:
        assert read(reader, "t", 0, 10, 50) == list(range(40, 50))


def test_a_partition_that_ends_before_the_planned_end_for_the_whole_wait_is_lost_data(
    broker: FakeBroker, consumer: MetadataConsumer
) -> None:
    broker.answer = lambda t, p, o: (0, 30, plain(o, 30 - o) if o < 30 else b"")
    started = time.monotonic()
    with pytest.raises(DataLossError, match="offsets 30..49 .*high watermark stayed at 30"), \
            FetchRangeReader(options(), [("t", 0, 0, 50)], 100) as reader:
        read(reader, "t", 0, 0, 50)
    assert 1.5 <= time.monotonic() - started < 4  # kafkaConsumer.pollTimeoutMs=1500
    with FetchRangeReader(options(failOnDataLoss="false"), [("t", 0, 0, 50)], 100) as reader:
        assert read(reader, "t", 0, 0, 50) == list(range(30))


@pytest.mark.parametrize("error", [0, 1])  # an empty answer, or OFFSET_OUT_OF_RANGE
def test_a_high_watermark_below_the_read_position_is_waited_out(
    broker: FakeBroker, consumer: MetadataConsumer, error: int
) -> None:
    """A new leader reports high watermark 30 (or has no offset 30 yet) for its first three
    answers from offset 30: waited out, every record read, one ListOffsets per answer."""
    calls = {"behind": 0}
    lookups = {"n": 0}

    def answer(t: str, p: int, o: int) -> Answer:
        if o >= 30 and calls["behind"] < 3:
            calls["behind"] += 1
            return error, 30, b""
        return 0, 100, plain(o, min(10, 100 - o))

    def offsets(tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        lookups["n"] += 1
        return 0, 30

    broker.answer = answer
    consumer.get_watermark_offsets = offsets  # type: ignore[method-assign]
    with FetchRangeReader(options(), [("t", 0, 0, 50)], 100) as reader:
        assert read(reader, "t", 0, 0, 50) == list(range(50))
    assert lookups["n"] == (3 if error else 0)


def test_a_leader_that_moved_is_looked_up_again(broker: FakeBroker,
                                                consumer: MetadataConsumer) -> None:
    calls = {"n": 0}

    def answer(t: str, p: int, o: int) -> Answer:
        calls["n"] += 1
        if calls["n"] == 1:
            return 6, -1, b""  # NOT_LEADER_OR_FOLLOWER
        return 0, 100, plain(o, min(10, 100 - o))

    broker.answer = answer
    with FetchRangeReader(options(), [("t", 0, 0, 20)], 100) as reader:
        assert read(reader, "t", 0, 0, 20) == list(range(20))
    assert consumer.lookups == 2


def test_a_dropped_connection_is_made_again(broker: FakeBroker,
                                            consumer: MetadataConsumer) -> None:
    broker.drop = {1}
    with FetchRangeReader(options(), [("t", 0, 0, 20)], 100) as reader:
        assert read(reader, "t", 0, 0, 20) == list(range(20))
    assert len(broker.requests) >= 2


@pytest.mark.parametrize("code", [76, 29])  # UNSUPPORTED_COMPRESSION_TYPE, an unknown one
def test_an_error_the_reader_cannot_wait_out_hands_the_range_to_librdkafka(
    broker: FakeBroker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    code: int
) -> None:
    """Apache Kafka answers Fetch v4 for a zstd batch with error 76 (zstd needs Fetch v10):
    librdkafka, which speaks v10, reads on from there; so for any error code the native path
    does not handle (librdkafka reports it itself where it cannot read either)."""
    broker.answer = lambda t, p, o: (0, 20, plain(o, 10 - o)) if o < 10 else (code, 20, b"")
    made = LibrdkafkaToo({("t", 0): list(range(20))}, leader=lambda: Node("127.0.0.1",
                                                                          broker.port))
    monkeypatch.setattr(kafka_base, "POOL",
                        ConsumerPool(factory=lambda config: made, evict_interval=0))
    monkeypatch.setattr(native, "_FELL_BACK", set())
    caplog.set_level(logging.WARNING, logger="flinkish_source.kafka.native")
    started = time.monotonic()
    with FetchRangeReader(options(), [("t", 0, 0, 20)], 100) as reader:
        assert read(reader, "t", 0, 0, 20) == list(range(20))
    assert time.monotonic() - started < 1
    assert "t/0: reading offsets 10..19 with librdkafka (t/0: the broker answered the " \
        "fetch with" in caplog.text and f"(Kafka error code {code}) at offset 10)" in caplog.text


def test_an_unreachable_leader_fails_after_the_bound_naming_the_option(
    consumer: MetadataConsumer, caplog: pytest.LogCaptureFixture
) -> None:
    refused = free_port()
    consumer.leader = lambda: Node("127.0.0.1", refused)
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError) as failure, \
            FetchRangeReader(options(), [("t", 0, 0, 20)], 100) as reader:
        read(reader, "t", 0, 0, 20)
    took = time.monotonic() - started
    assert 1.4 <= took < 4
    assert "kafkaConsumer.pollTimeoutMs=1500 bounds this wait" in str(failure.value)
    assert f"127.0.0.1:{refused}" in str(failure.value)
    assert any("still waiting" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("refusal", ["versions", "size"])
def test_a_broker_refusing_fetch_v4_or_answering_too_much_hands_over_to_librdkafka(
    broker: FakeBroker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    refusal: str
) -> None:
    """Kafka 4 dropped old protocol versions (KIP-896): a broker whose ApiVersions leaves
    out Fetch v4 is read with librdkafka at once, not retried until the wait gives up; so is
    one whose answer exceeds kafka.receive.message.max.bytes."""
    extra = {}
    if refusal == "versions":
        broker.fetch_versions = (12, 17)
    else:
        extra = {"kafka.receive.message.max.bytes": "100"}
    made = LibrdkafkaToo({("t", 0): list(range(20))}, leader=lambda: Node("127.0.0.1",
                                                                          broker.port))
    monkeypatch.setattr(kafka_base, "POOL",
                        ConsumerPool(factory=lambda config: made, evict_interval=0))
    monkeypatch.setattr(native, "_FELL_BACK", set())
    caplog.set_level(logging.WARNING, logger="flinkish_source.kafka.native")
    started = time.monotonic()
    with FetchRangeReader(options(**extra), [("t", 0, 0, 20)], 100) as reader:
        assert read(reader, "t", 0, 0, 20) == list(range(20))
    assert time.monotonic() - started < 1
    why = ("serves Fetch versions 12..17, not 4" if refusal == "versions"
           else "more than receive.message.max.bytes=100")
    assert why in caplog.text and "t/0: reading offsets 0..19 with librdkafka" in caplog.text


def test_the_client_settings_that_apply_to_fetch_requests_are_sent(
    broker: FakeBroker, consumer: MetadataConsumer
) -> None:
    settings = {"kafka.client.id": "billing-etl", "kafka.fetch.wait.max.ms": "250",
                "kafka.fetch.min.bytes": "3", "kafka.fetch.max.bytes": "5000000"}
    with FetchRangeReader(options(**settings), [("t", 0, 0, 20)], 100) as reader:
        assert read(reader, "t", 0, 0, 20) == list(range(20))
    assert set(broker.client_ids) == {b"billing-etl"}
    assert set(broker.settings) == {(250, 3, 5000000)}


def test_which_queries_the_native_path_reads_for() -> None:
    assert eligible(options()) is None
    assert eligible(options(**{"kafka.security.protocol": "PLAINTEXT"})) is None
    assert "SASL_SSL" in str(eligible(options(**{"kafka.security.protocol": "SASL_SSL"})))
    assert eligible(options(**{"kafka.ssl.ca.location": "/ca.pem"})) is not None
    assert eligible(options(includeHeaders="true")) is None  # headers are decoded too
    assert "check.crcs" in str(eligible(options(**{"kafka.check.crcs": "true"})))
    assert "client.rack" in str(eligible(options(**{"kafka.client.rack": "use1-az1"})))


def test_a_bad_fetch_option_names_the_choices() -> None:
    from flinkish_core.errors import OptionError

    with pytest.raises(OptionError, match="kafkaConsumer.fetch: 'fast' is not one of librdkafka"):
        options(**{"kafkaConsumer.fetch": "fast"})


@dataclass
class LibrdkafkaToo(FakeConsumer):
    """The pool's consumer, for metadata and, after a hand-over, for the records too."""

    leader: Callable[[], Node] = field(default=lambda: Node("127.0.0.1", 0))

    def list_topics(self, topic: str, timeout: float) -> Cluster:
        return Cluster({1: self.leader()}, {topic: Topic({0: Part(1)})})


def test_a_batch_it_cannot_decode_hands_the_rest_of_the_range_to_librdkafka(
    broker: FakeBroker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Offsets 10 on come in an old message format (magic 1): librdkafka reads 10..19."""
    broker.answer = lambda t, p, o: (0, 20, plain(o, 10 - o) if o < 10
                                     else batch(10, [Rec(i, b"k", b"v") for i in range(10)],
                                                magic=1))
    made = LibrdkafkaToo({("t", 0): list(range(20))}, leader=lambda: Node("127.0.0.1",
                                                                          broker.port))
    monkeypatch.setattr(kafka_base, "POOL",
                        ConsumerPool(factory=lambda config: made, evict_interval=0))
    monkeypatch.setattr(native, "_FELL_BACK", set())
    caplog.set_level(logging.WARNING, logger="flinkish_source.kafka.native")
    with FetchRangeReader(options(), [("t", 0, 0, 20)], 100) as reader:
        chunks = list(reader.read("t", 0, 0, 20))
    assert [m.offset() for c in chunks for m in c] == list(range(20))
    assert isinstance(chunks[0], RecordChunk) and not isinstance(chunks[-1], RecordChunk)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "t/0: reading offsets 10..19 with librdkafka (message format " \
        "v1 (magic 1) at offset 10)" in warned[0].getMessage()
    with FetchRangeReader(options(), [("t", 0, 0, 20)], 100) as reader:
        list(reader.read("t", 0, 0, 20))
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1  # once


def test_a_batch_the_decoder_takes_for_malformed_is_handed_to_librdkafka(
    broker: FakeBroker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bad = bytearray(plain(10, 10))
    bad[61] = 0x7E  # the first record's length: past the batch's end
    broker.answer = lambda t, p, o: (0, 20, plain(o, 10 - o) if o < 10 else bytes(bad))
    made = LibrdkafkaToo({("t", 0): list(range(20))}, leader=lambda: Node("127.0.0.1",
                                                                          broker.port))
    monkeypatch.setattr(kafka_base, "POOL",
                        ConsumerPool(factory=lambda config: made, evict_interval=0))
    monkeypatch.setattr(native, "_FELL_BACK", set())
    caplog.set_level(logging.WARNING, logger="flinkish_source.kafka.native")
    with FetchRangeReader(options(), [("t", 0, 0, 20)], 100) as reader:
        assert read(reader, "t", 0, 0, 20) == list(range(20))
    assert "reading offsets 10..19 with librdkafka (the native decoder could not read it: " \
        "malformed Kafka record batch at base offset 10" in caplog.text


def test_librdkafka_reads_by_default_and_native_is_opt_in() -> None:
    from flinkish_source.options import FetchClient

    default = parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t",
                             "includeMarkers": "false"})
    assert default.fetch_client is FetchClient.LIBRDKAFKA
    assert isinstance(kafka_source.range_reader(default, [("t", 0, 0, 5)], 10),
                      RangeReader)
    assert isinstance(kafka_source.range_reader(options(), [("t", 0, 0, 5)], 10),
                      FetchRangeReader)
