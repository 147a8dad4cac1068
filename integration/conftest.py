"""Shared fixtures: one real broker and one SparkSession for the whole integration session."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from flinkish.demo.embedded_kafka import create_topic, kafka_for_tests
from flinkish.demo.spark_session import local_session
from flinkish_source.kafka import POOL
from integration.connect_session import connect_server  # noqa: F401  (one per session)
from integration.mock_cluster import mock_bootstrap  # noqa: F401  (one per session)
from integration.postgres_fixtures import postgres_dsn  # noqa: F401  (one server per session)
from integration.s3_server import s3  # noqa: F401  (one S3 server per session)

_names = itertools.count()

PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    with kafka_for_tests() as bootstrap:
        yield bootstrap
        # reads in this process leave idle consumers in the pool; close them before the broker
        # stops (they would log failed reconnects until the process exits)
        POOL.clear()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_session("flinkish-tests")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def topic(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Any:
    """A factory for fresh topics: topic(partitions) -> name."""

    def make(partitions: int) -> str:
        name = f"{request.node.name[:40].replace('[', '-').replace(']', '')}-{next(_names)}"
        create_topic(kafka_bootstrap, name, partitions)
        return name

    return make


@pytest.fixture
def rocksdb(spark: Any) -> Iterator[None]:
    """transformWithState needs the RocksDB state store; a query copies the session's
    configuration when it starts, so setting it for this test's queries is enough."""
    assert spark.conf.isModifiable(PROVIDER)
    before = spark.conf.get(PROVIDER, None)
    spark.conf.set(PROVIDER, ROCKSDB)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(PROVIDER)
        else:
            spark.conf.set(PROVIDER, before)
