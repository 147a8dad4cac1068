"""librdkafka's mock cluster as a second real broker for the source's integration tests.

A Kafka implementation from another code base than the embedded Tansu, with no new dependency:
a confluent-kafka ``Producer({"test.mock.num.brokers": 3, ...})`` starts three brokers on
loopback inside its process, kept alive here in a helper process for as long as the fixture
lives (its stdin closing ends it). Other processes, Spark's workers included, bootstrap from the
brokers' addresses (``list_topics().brokers``).

What it does differently from a full Kafka, and what the tests therefore avoid on it: topics are
created on first use with 4 partitions (CreateTopics times out waiting for a controller), its
``read_committed`` does not filter aborted transactions, and ``offsets_for_times`` returns -1.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from flinkish_source.kafka import POOL

#: partitions of every topic the mock cluster creates
MOCK_PARTITIONS = 4

_HELPER = """
import sys
from confluent_kafka import Producer

cluster = Producer({"test.mock.num.brokers": 3, "bootstrap.servers": "unused:1"})
brokers = cluster.list_topics(timeout=30).brokers.values()
print(",".join(f"{b.host}:{b.port}" for b in brokers), flush=True)
sys.stdin.read()  # serve until the test closes stdin (or dies)
"""


@contextlib.contextmanager
def mock_cluster(timeout: float = 30) -> Iterator[str]:
    """Bootstrap servers of a 3-broker mock cluster, stopped when the block ends."""
    helper = subprocess.Popen([sys.executable, "-c", _HELPER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert helper.stdout is not None
        bootstrap = helper.stdout.readline().strip()  # the helper prints it, or exits
        if not bootstrap:
            raise RuntimeError(f"the mock cluster helper exited ({helper.wait(timeout)}) "
                               "before naming its brokers")
        yield bootstrap
    finally:
        if helper.stdin is not None:
            helper.stdin.close()
        try:
            helper.wait(timeout)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()


def mock_topic(bootstrap: str, name: str, timeout: float = 30) -> None:
    """Have the mock cluster create ``name`` (a metadata request for it does), and wait until
    its partitions have leaders."""
    producer = Producer({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = producer.list_topics(name, timeout=timeout).topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == MOCK_PARTITIONS \
                and all(p.leader >= 0 for p in topic.partitions.values()):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the mock cluster did not create topic {name} within {timeout:g} s")


@pytest.fixture(scope="session")
def mock_bootstrap() -> Iterator[str]:
    """One mock cluster for the session (integration/conftest.py imports the fixture): its
    brokers' ports stay theirs while a client that knows them (a consumer pooled in one of
    Spark's Python workers) may still connect."""
    with mock_cluster() as bootstrap:
        yield bootstrap
        POOL.clear()  # this process's idle consumers of the cluster, before it stops
