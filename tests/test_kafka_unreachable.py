"""An unreachable broker: the source's metadata and offset calls say in the log that they are
waiting (for what, from which servers, how long so far and how long still), then fail with an
error naming the servers and the option that bounds the wait. Against a real refused
connection (a loopback port nobody listens on), no Spark, no broker."""

from __future__ import annotations

import logging
import time

import pytest

from flinkish.demo.ports import free_port, server_socket
from flinkish_source.kafka import KafkaMetadata, KafkaUnavailableError, read_range
from flinkish_source.kafka.base import WAIT_OPTION, BrokerWait
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
    metadata = KafkaMetadata(_options(servers))
    started = time.monotonic()
    try:
        with pytest.raises(KafkaUnavailableError) as failure:
            metadata.partitions()
    finally:
        metadata.close()
    _check(caplog, failure.value, servers, "could not list Kafka topics",
           time.monotonic() - started)


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
    wait = BrokerWait(options, "x")
    assert wait.bound == 120.0 and wait.step == 10.0  # about a dozen warnings before failing
    small = BrokerWait(_options("127.0.0.1:1"), "x")
    assert small.step == 0.5


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

    config = consumer_config(_options("unused:1"))
    # backoff 100 ms doubling to 1 s: about 6 in 3 s (the first one at once)
    assert _connections_in(3, config) <= 9
    # a user's kafka.* settings still win
    config = consumer_config(_options("unused:1", **{
        "kafka.metadata.recovery.strategy": "rebootstrap", "kafka.reconnect.backoff.max.ms": "5"}))
    assert config["metadata.recovery.strategy"] == "rebootstrap"
    assert str(config["reconnect.backoff.max.ms"]) == "5"
