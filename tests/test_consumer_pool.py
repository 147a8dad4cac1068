"""The consumer pool (consumers reused across the tasks of a Python worker, never shared by two
at once, closed when idle) and the range reader (one consumer reads a task's ranges, fetching
the next ones while the current one is read), against a fake librdkafka consumer."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, TopicPartition

import flinkish_source.kafka as kafka_source
import flinkish_source.kafka.base as kafka_base
from flinkish_source.kafka import read_range, reading
from flinkish_source.kafka.base import ConsumerPool, pool_key
from flinkish_source.kafka.librdkafka import RangeReader
from flinkish_source.options import parse_options

OPTIONS = parse_options({"kafka.bootstrap.servers": "b:1", "subscribe": "t",
                         "includeMarkers": "false", "kafkaConsumer.pollTimeoutMs": "2000"})


@dataclass
class Err:
    _code: int

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return f"error {self._code}"


@dataclass
class Msg:
    _topic: str
    _partition: int
    _offset: int
    _error: Err | None = None

    def error(self) -> Err | None:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


@dataclass
class FakeConsumer:
    """Partitions as lists of existing offsets (gaps: transaction markers, compaction); an
    assigned partition delivers its messages round-robin with the others, then one EOF."""

    logs: dict[tuple[str, int], list[int]]
    config: dict[str, Any] = field(default_factory=dict)
    assigned: dict[tuple[str, int], int] = field(default_factory=dict)
    eof: set[tuple[str, int]] = field(default_factory=set)
    closed: bool = False
    in_use: int = 0
    most_assigned: int = 0
    assigned_ever: list[tuple[str, int, int]] = field(default_factory=list)
    leader_lookups: list[str] = field(default_factory=list)

    def list_topics(self, topic: str, timeout: float) -> None:
        assert any(t == topic for t, _ in self.assigned), "asked before assigning"
        self.leader_lookups.append(topic)

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            key = (tp.topic, tp.partition)
            assert key not in self.assigned, f"{key} assigned twice"
            self.assigned[key] = tp.offset
            self.eof.discard(key)
            self.assigned_ever.append((tp.topic, tp.partition, tp.offset))
        self.most_assigned = max(self.most_assigned, len(self.assigned))

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            del self.assigned[(tp.topic, tp.partition)]

    def unassign(self) -> None:
        self.assigned.clear()

    def close(self) -> None:
        self.closed = True

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.assigned.get(
            (tp.topic, tp.partition), -1001)) for tp in tps]

    def consume(self, num_messages: int, timeout: float) -> list[Msg]:
        out: list[Msg] = []
        progress = True
        while len(out) < num_messages and progress:
            progress = False
            for key in sorted(self.assigned):
                if len(out) >= num_messages:
                    break
                position = self.assigned[key]
                later = [o for o in self.logs.get(key, []) if o >= position]
                if later:
                    out.append(Msg(key[0], key[1], later[0]))
                    self.assigned[key] = later[0] + 1
                    progress = True
                elif key not in self.eof:
                    end = max(self.logs.get(key, [-1])) + 1
                    self.assigned[key] = max(position, end)
                    out.append(Msg(key[0], key[1], self.assigned[key],
                                   Err(KafkaError._PARTITION_EOF)))
                    self.eof.add(key)
                    progress = True
        return out


@pytest.fixture
def logs() -> dict[tuple[str, int], list[int]]:
    return {("t", p): list(range(100)) for p in range(8)}


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch, logs: dict[tuple[str, int], list[int]]
         ) -> ConsumerPool:
    made = ConsumerPool(factory=lambda config: FakeConsumer(logs, config), evict_interval=0)
    monkeypatch.setattr(kafka_base, "POOL", made)
    return made


def offsets(chunks: Iterator[list[Any]]) -> list[int]:
    return [m.offset() for chunk in chunks for m in chunk]


def test_a_task_reads_its_ranges_with_one_consumer_fetching_ahead(pool: ConsumerPool) -> None:
    ranges = [("t", p, 10 * p, 10 * p + 5) for p in range(8)]
    with reading(OPTIONS, ranges, 1_000):
        for topic, part, start, end in ranges:
            assert offsets(read_range(OPTIONS, topic, part, start, end, 1_000)) == list(
                range(start, end))
    assert pool.created == 1 and pool.idle() == 1
    (consumer,) = [c for idle in pool._idle.values() for c, _ in idle]
    assert consumer.most_assigned == 8  # all small ranges fetched in one go
    assert consumer.assigned == {}  # handed back without an assignment
    # the next task of this worker takes the same consumer
    with reading(OPTIONS, [("t", 0, 50, 60)], 1_000):
        assert offsets(read_range(OPTIONS, "t", 0, 50, 60, 1_000)) == list(range(50, 60))
    assert pool.created == 1


def test_a_pooled_consumer_asks_for_the_leaders_of_a_topic_new_to_it(
    pool: ConsumerPool, logs: dict[tuple[str, int], list[int]]
) -> None:
    """A connected consumer learns a new topic's leaders only at librdkafka's next scan (up to
    a second later): the reader asks right after assigning, once per consumer and topic."""
    logs.update({("u", p): list(range(50)) for p in range(2)})

    def task(ranges: list[tuple[str, int, int, int]]) -> FakeConsumer:
        with reading(OPTIONS, ranges, 1_000):
            for r in ranges:
                assert offsets(read_range(OPTIONS, *r, 1_000)) == list(range(r[2], r[3]))
        (idle,) = [c for v in pool._idle.values() for c, _ in v]
        return cast(FakeConsumer, idle)

    first = task([("t", 0, 0, 10), ("t", 1, 0, 10)])
    assert first.leader_lookups == ["t"]
    again = task([("t", 2, 0, 10), ("u", 0, 0, 10), ("u", 1, 5, 50)])
    assert again is first and first.leader_lookups == ["t", "u"]
    assert task([("u", 1, 0, 5)]).leader_lookups == ["t", "u"]
    pool.clear()  # a closed consumer is forgotten; its successor asks afresh
    assert task([("u", 0, 10, 20)]).leader_lookups == ["u"]


def test_large_ranges_are_fetched_ahead_only_near_their_turn(
    pool: ConsumerPool, logs: dict[tuple[str, int], list[int]]
) -> None:
    for p in range(4):
        logs[("t", p)] = list(range(1_000))
    ranges = [("t", p, 0, 1_000) for p in range(4)]
    reader = RangeReader(OPTIONS, ranges, 100, pool=pool, lookahead=300)
    got = {p: offsets(reader.read("t", p, 0, 1_000)) for p in range(4)}
    reader.close()
    assert got == {p: list(range(1_000)) for p in range(4)}
    consumer = pool._idle[next(iter(pool._idle))][0][0]
    assert consumer.most_assigned == 2  # the current range and the next, never all four


def test_ranges_end_inside_gaps_and_at_the_partitions_end(
    pool: ConsumerPool, logs: dict[tuple[str, int], list[int]]
) -> None:
    logs[("t", 0)] = [0, 1, 2, 5, 6]  # 3, 4 are transaction markers; 7 is the end
    logs[("t", 1)] = [0, 1]
    ranges = [("t", 0, 1, 5), ("t", 0, 5, 7), ("t", 1, 0, 2), ("t", 2, 3, 3)]
    with reading(OPTIONS, ranges, 10):
        got = [offsets(read_range(OPTIONS, *r, 10)) for r in ranges]
    assert got == [[1, 2], [5, 6], [0, 1], []]


def test_a_range_that_lost_records_fails_or_skips(
    pool: ConsumerPool, logs: dict[tuple[str, int], list[int]]
) -> None:
    """The partition ends at 2 where the plan said 5, for longer than the bounded wait."""
    logs[("t", 0)] = [0, 1]
    started = time.monotonic()
    with pytest.raises(kafka_source.DataLossError,
                       match="offsets 2..4 .*high watermark stayed at 2.*unclean leader"):
        offsets(read_range(OPTIONS, "t", 0, 0, 5, 10))
    assert 2 <= time.monotonic() - started < 4  # kafkaConsumer.pollTimeoutMs=2000
    lenient = parse_options({"kafka.bootstrap.servers": "b:1", "subscribe": "t",
                             "includeMarkers": "false", "failOnDataLoss": "false",
                             "kafkaConsumer.pollTimeoutMs": "500"})
    assert offsets(read_range(lenient, "t", 0, 0, 5, 10)) == [0, 1]


@dataclass
class CatchingUpLeader(FakeConsumer):
    """A new leader that reports an end of log below offsets already read (an EOF event, or
    OFFSET_OUT_OF_RANGE from position) for its first ``behind`` fetches, then has them."""

    behind: int = 3
    out_of_range: bool = False
    list_offsets: int = 0

    def consume(self, num_messages: int, timeout: float) -> list[Msg]:
        if self.behind > 0 and self.assigned:
            self.behind -= 1
            key, position = next(iter(self.assigned.items()))
            if self.out_of_range:
                return [Msg(key[0], key[1], position, Err(KafkaError.OFFSET_OUT_OF_RANGE))]
            self.eof.add(key)
            return [Msg(key[0], key[1], 2, Err(KafkaError._PARTITION_EOF))]
        self.eof.clear()
        return super().consume(num_messages, timeout)

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.list_offsets += 1
        return 0, 2


@pytest.mark.parametrize("out_of_range", [False, True])
def test_a_high_watermark_below_the_read_position_is_waited_out(
    monkeypatch: pytest.MonkeyPatch, logs: dict[tuple[str, int], list[int]], out_of_range: bool
) -> None:
    made = CatchingUpLeader(logs, out_of_range=out_of_range)
    monkeypatch.setattr(kafka_base, "POOL",
                        ConsumerPool(factory=lambda config: made, evict_interval=0))
    assert offsets(read_range(OPTIONS, "t", 0, 5, 20, 100)) == list(range(5, 20))
    # one ListOffsets per OFFSET_OUT_OF_RANGE answer, never a crawl offset by offset
    assert made.list_offsets == (3 if out_of_range else 0)


def test_a_failed_read_closes_its_consumer_instead_of_pooling_it(
    pool: ConsumerPool, logs: dict[tuple[str, int], list[int]]
) -> None:
    logs[("t", 0)] = [0, 1]
    with pytest.raises(kafka_source.DataLossError), reading(OPTIONS, [("t", 0, 0, 5)], 10):
        offsets(read_range(OPTIONS, "t", 0, 0, 5, 10))
    assert pool.created == 1 and pool.idle() == 0
    # stopping early is not a failure: the consumer goes back
    chunks = cast(Generator[list[Any], None, None], read_range(OPTIONS, "t", 1, 0, 100, 10))
    next(chunks)
    chunks.close()
    assert pool.idle() == 1


def test_a_consumer_is_never_lent_twice_at_once(logs: dict[tuple[str, int], list[int]]) -> None:
    # room for every thread's consumer: a new one is made only when all idle ones are lent out
    pool = ConsumerPool(factory=lambda config: FakeConsumer(logs, config), capacity=6,
                        evict_interval=0)
    config = {"bootstrap.servers": "b:1", "group.id": "a"}
    in_use: set[int] = set()
    clash = threading.Event()
    lock = threading.Lock()
    start = threading.Barrier(6)

    def task() -> None:
        start.wait()
        for _ in range(200):
            own = dict(config, **{"group.id": str(threading.get_ident())})
            c = pool.acquire(own)
            with lock:
                if id(c) in in_use:
                    clash.set()
                in_use.add(id(c))
            with lock:
                in_use.discard(id(c))
            pool.release(own, c)

    threads = [threading.Thread(target=task) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not clash.is_set()
    assert pool.created <= 6
    assert pool.idle() <= pool.capacity


def test_idle_consumers_expire_and_the_pool_keeps_a_few_per_configuration(
    logs: dict[tuple[str, int], list[int]]
) -> None:
    now = [0.0]
    pool = ConsumerPool(factory=lambda config: FakeConsumer(logs, config), capacity=2,
                        idle_timeout=300, evict_interval=0, clock=lambda: now[0])
    a = {"bootstrap.servers": "b:1", "group.id": "x"}
    b = {"bootstrap.servers": "b:2", "group.id": "y"}
    assert pool_key(a) == pool_key(dict(a, **{"group.id": "other"})) != pool_key(b)
    held = [pool.acquire(a) for _ in range(3)] + [pool.acquire(b)]
    for c in held[:3]:
        pool.release(a, c)
    pool.release(b, held[3])
    assert pool.idle() == 3 and held[0].closed  # beyond the capacity: the oldest is closed
    now[0] = 200
    assert pool.acquire(b) is held[3]  # same configuration: reused
    pool.release(b, held[3])
    now[0] = 301
    assert pool.evict() == 2  # a's two, idle since 0; b's was used at 200
    assert all(c.closed for c in held[:3]) and not held[3].closed
    assert pool.acquire(a) is not held[1] and pool.created == 5
    pool.clear()
    assert held[3].closed


def test_a_forked_worker_starts_with_an_empty_pool(
    logs: dict[tuple[str, int], list[int]]
) -> None:
    pool = ConsumerPool(factory=lambda config: FakeConsumer(logs, config), evict_interval=0)
    config = {"bootstrap.servers": "b:1"}
    parent = pool.acquire(config)
    pool.release(config, parent)
    pool._pid = -1  # as seen from a child after fork()
    assert pool.acquire(config) is not parent
    assert not parent.closed  # the parent's client is not touched from the child
