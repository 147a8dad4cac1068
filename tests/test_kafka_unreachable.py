"""An unreachable broker: the source's metadata and offset calls say in the log that they are
waiting (for what, from which servers, how long so far and how long still), then fail with an
error naming the servers and the option that bounds the wait. Against a real refused
connection (a loopback port nobody listens on), no Spark, no broker."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError

from flinkish.demo.ports import free_port, server_socket
from flinkish_source.kafka import KafkaMetadata, KafkaUnavailableError, read_range
from flinkish_source.kafka.base import REFUSED_FOR_S, WAIT_OPTION, BrokerWait, RefusalWatch
from flinkish_source.options import SourceOptions, parse_options

SECRET = "sasl-S3cret-never-logged"
BOUND_MS = 2000


@pytest.fixture
def servers() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens: connecting is refused


def _options(servers: str, **extra: str) -> SourceOptions:
    return parse_options({
        "kafka.bootstrap.servers": servers, "subscribe": "t", "includeMarkers": "false",
        "kafkaConsumer.pollTimeoutMs": str(BOUND_MS), "kafka.sasl.password": SECRET, **extra,
    })


def _check(caplog: pytest.LogCaptureFixture, failure: KafkaUnavailableError, servers: str,
           what: str, took: float) -> None:
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name.startswith("flinkish_source.kafka")]
    assert warnings, "no warning while waiting"
    first = warnings[0]
    assert what in first and repr(servers) in first
    assert "still waiting" in first and "giving up in" in first and WAIT_OPTION in first
    assert "Connection refused" in first  # the client's own reason, not just "timed out"
    assert "'sasl.password': '***'" in first  # the client settings, masked
    message = str(failure)
    assert what in message and repr(servers) in message
    assert f"option {WAIT_OPTION}={BOUND_MS} bounds this wait" in message
    for text in [*warnings, message]:
        assert SECRET not in text
    assert BOUND_MS / 1000 - 0.1 <= took < BOUND_MS / 1000 + 3


def test_listing_topics_warns_while_waiting_then_names_servers_and_option(
    caplog: pytest.LogCaptureFixture, servers: str
) -> None:
    caplog.set_level(logging.WARNING)
    failure, took = _listing_fails(_options(servers))
    _check(caplog, failure, servers, "could not list Kafka topics", took)


def _listing_fails(options: SourceOptions) -> tuple[KafkaUnavailableError, float]:
    """The error listing the topics ends in, and how long it took."""
    metadata = KafkaMetadata(options)
    started = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailableError) as failure:
            metadata.partitions()
    finally:
        metadata.close()
    return failure.value, time.monotonic() - started


def test_reading_offsets_warns_while_waiting_then_names_servers_and_option(
    caplog: pytest.LogCaptureFixture, servers: str
) -> None:
    caplog.set_level(logging.WARNING)
    metadata = KafkaMetadata(_options(servers))
    started = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailableError) as failure:
            metadata.offset_ranges([("t", 0), ("t", 1)])
    finally:
        metadata.close()
    _check(caplog, failure.value, servers, "could not read the offsets of 2 partition(s)",
           time.monotonic() - started)
    # one bound for the whole call, not one per partition
    assert time.monotonic() - started < 2 * BOUND_MS / 1000


def test_a_read_task_warns_while_no_records_come(
    caplog: pytest.LogCaptureFixture, servers: str
) -> None:
    caplog.set_level(logging.WARNING)
    options = _options(servers)
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError) as failure:
        for _ in read_range(options, "t", 0, 0, 10, 100):
            pass
    took = time.monotonic() - started
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("t/0: still waiting for records between offsets 0 and 10" in w
               and repr(servers) in w and WAIT_OPTION in w for w in warnings)
    assert WAIT_OPTION in str(failure.value) and repr(servers) in str(failure.value)
    assert SECRET not in str(failure.value) and not any(SECRET in w for w in warnings)
    assert took < BOUND_MS / 1000 + 3


def test_the_bound_is_the_documented_option_and_warnings_are_paced() -> None:
    options = _options("127.0.0.1:1", **{"kafkaConsumer.pollTimeoutMs": "120000"})
    wait = BrokerWait(options.kafka, "x")
    assert wait.bound == 120.0 and wait.step == 20.0  # a warning every sixth of the bound
    small = BrokerWait(_options("127.0.0.1:1").kafka, "x")
    assert small.step == 0.5


def test_a_wait_warns_every_sixth_of_the_bound_however_short_its_attempts(
    caplog: pytest.LogCaptureFixture
) -> None:
    """Attempts are short while only refused connections are reported; warnings keep the
    documented cadence all the same."""
    caplog.set_level(logging.WARNING)
    wait = BrokerWait(_options("127.0.0.1:1", **{"kafkaConsumer.pollTimeoutMs": "3000"}).kafka,
                      "x")
    with pytest.raises(KafkaUnavailableError):
        wait.call(lambda timeout: _unanswered(min(timeout, 0.1)))
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 5


def _unanswered(seconds: float) -> None:
    from confluent_kafka import KafkaError, KafkaException

    time.sleep(seconds)
    raise KafkaException(KafkaError(KafkaError._TIMED_OUT))


def test_a_refused_connection_to_every_bootstrap_server_fails_in_seconds_once(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens at either server: the default two-minute bound is not waited out; one
    short error says so, with no warning before it and no raw librdkafka lines on stderr."""
    caplog.set_level(logging.WARNING)
    both = f"127.0.0.1:{free_port()},localhost:{free_port()}"
    failure, took = _listing_fails(parse_options({
        "kafka.bootstrap.servers": both, "subscribe": "t", "includeMarkers": "false"}))
    assert REFUSED_FOR_S <= took <= 15
    message = str(failure)
    assert "connection refused by every bootstrap server" in message and repr(both) in message
    assert "kafka.bootstrap.servers" in message and len(message) < 300
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "%3|" not in capfd.readouterr().err


def test_a_server_that_answers_no_request_gets_the_whole_wait(servers: str) -> None:
    """Connected but silent (a slow or overloaded broker), beside a refusing one: not a
    refusal, so the whole bound is waited."""
    with server_socket() as silent:
        both = f"{servers},127.0.0.1:{silent.getsockname()[1]}"
        failure, took = _listing_fails(
            _options(both, **{"kafkaConsumer.pollTimeoutMs": "8000"}))
    assert took >= 8 - 0.1
    assert "within 8 s" in str(failure)


def _refused(name: str) -> KafkaError:
    return KafkaError(KafkaError._TRANSPORT, f"{name}/bootstrap: Connect to ipv4#{name} "
                      "failed: Connection refused (after 0ms in state CONNECT)")


def test_refusals_count_only_in_a_row_from_every_bootstrap_server_of_a_cluster_never_reached(
) -> None:
    now = [0.0]
    watch = RefusalWatch("a:1, PLAINTEXT://b", clock=lambda: now[0])
    watch.note(_refused("a:1"))
    now[0] = 10.0
    assert watch.refusing() and watch.refused_for() == 0  # b:9092 has not refused yet
    watch.note(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/2 brokers are down"))
    watch.note(_refused("b:9092"))
    assert watch.refused_for() == 10.0
    watch.note(KafkaError(KafkaError._RESOLVE, "b:9092/bootstrap: Failed to resolve 'b'"))
    assert not watch.refusing() and watch.refused_for() == 0  # a DNS failure: wait it out
    watch.note(_refused("a:1"))
    watch.note(_refused("b:9092"))
    now[0] = 20.0
    assert watch.refused_for() == 10.0
    watch.answered()  # a cluster that answered once is away, not absent
    watch.note(_refused("a:1"))
    assert not watch.refusing() and watch.refused_for() == 0


def _connections_in(seconds: float, config: dict[str, object]) -> int:
    """Connections an idle consumer built from ``config`` opens in ``seconds`` to a broker
    address where something accepts and hangs up at once (a port of a broker that is gone,
    taken by another server since)."""
    from confluent_kafka import Consumer

    with server_socket() as server:
        server.settimeout(0.05)
        config = {**config, "bootstrap.servers": f"127.0.0.1:{server.getsockname()[1]}",
                  "log_level": 0}
        consumer = Consumer(config)
        accepted, deadline = 0, time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.close()
                accepted += 1
        finally:
            consumer.close()
    return accepted


def test_an_idle_consumer_of_a_cluster_that_is_gone_backs_off_as_kafkas_java_client() -> None:
    """librdkafka's default re-bootstrap resets its backoff: ~16 connections a second, for as
    long as the pooled consumer lives, into whatever listens on the dead broker's port."""
    from flinkish_source.kafka.base import consumer_config

    config = consumer_config(_options("unused:1").kafka)
    # backoff 100 ms doubling to 1 s: about 6 in 3 s (the first one at once)
    assert _connections_in(3, config) <= 9
    # a user's kafka.* settings still win
    config = consumer_config(_options("unused:1", **{
        "kafka.metadata.recovery.strategy": "rebootstrap", "kafka.reconnect.backoff.max.ms": "5"}
    ).kafka)
    assert config["metadata.recovery.strategy"] == "rebootstrap"
    assert str(config["reconnect.backoff.max.ms"]) == "5"
