"""KafkaMetadata.offset_ranges probes a partition's high watermark with a fetch only when the
latest offset ListOffsets reports for it moved since its last probe (no new record batch, no
new high watermark), so planning a batch of a quiet topic with many partitions costs no fetch;
and, planning a running query's batch, only where the partition stood still since the last
planning, so a steady producer costs none either."""

from __future__ import annotations

from typing import Any

import pytest

from flinkish_source.kafka import KafkaMetadata, OffsetRange
from flinkish_source.options import parse_options

Partition = tuple[str, int]


def faked(monkeypatch: pytest.MonkeyPatch, reported: dict[Partition, tuple[int, int]],
          true_high: dict[Partition, int]) -> tuple[KafkaMetadata, list[list[Partition]]]:
    """A KafkaMetadata whose ListOffsets answers ``reported`` (earliest, latest) and whose
    probe finds ``true_high``; and the list of the partitions each probe asked about."""
    metadata = KafkaMetadata(parse_options({"kafka.bootstrap.servers": "b:1", "subscribe": "t",
                                            "includeMarkers": "false"}))
    probed: list[list[Partition]] = []

    def list_offsets(partitions: Any, timeout: float) -> tuple[dict[Any, int], dict[Any, int]]:
        return ({tp: reported[tp][0] for tp in partitions},
                {tp: reported[tp][1] for tp in partitions})

    def probe(consumer: Any, ranges: dict[Any, OffsetRange]) -> dict[Any, int]:
        probed.append(sorted(ranges))
        return {tp: true_high[tp] for tp in ranges}

    monkeypatch.setattr(metadata, "_list_offsets", list_offsets)
    monkeypatch.setattr(metadata, "_probe_high_watermarks", probe)
    monkeypatch.setattr(metadata, "_client", lambda: None)
    return metadata, probed


def test_only_partitions_whose_reported_latest_moved_are_probed(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # ListOffsets answers like Tansu: the last record batch's base offset + 1
    reported = {("t", 0): (0, 5), ("t", 1): (0, 9), ("t", 2): (3, 3)}
    true_high = {("t", 0): 8, ("t", 1): 12}
    metadata, probed = faked(monkeypatch, reported, true_high)
    partitions = sorted(reported)
    expected = {("t", 0): OffsetRange(0, 8), ("t", 1): OffsetRange(0, 12),
                ("t", 2): OffsetRange(3, 3)}
    assert metadata.offset_ranges(partitions) == expected
    assert metadata.offset_ranges(partitions) == expected
    assert probed == [[("t", 0), ("t", 1)]]  # the empty partition never, the rest once
    reported[("t", 1)] = (0, 13)  # a new batch on partition 1
    true_high[("t", 1)] = 15
    assert metadata.offset_ranges(partitions)[("t", 1)] == OffsetRange(0, 15)
    assert probed[1:] == [[("t", 1)]]


def test_planning_probes_only_partitions_that_stood_still(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running query's planning (``exact=False``) takes a partition that grew since the last
    planning at its reported latest (its next record batch reveals a hidden tail), and probes
    one that stood still, so no tail stays hidden; ``exact`` probes every partition."""
    reported = {("t", 0): (0, 5), ("t", 1): (0, 9)}
    true_high = {("t", 0): 8, ("t", 1): 12}
    metadata, probed = faked(monkeypatch, reported, true_high)
    partitions = sorted(reported)

    def latest(exact: bool) -> dict[Any, int]:
        return {tp: r.latest for tp, r in metadata.offset_ranges(partitions,
                                                                 exact=exact).items()}

    assert latest(False) == {("t", 0): 8, ("t", 1): 12}  # never seen: probed
    assert probed == [[("t", 0), ("t", 1)]]
    # partition 1 grows steadily: its tail behind 20 waits for its next batch, unprobed
    reported[("t", 1)], true_high[("t", 1)] = (0, 20), 23
    assert latest(False) == {("t", 0): 8, ("t", 1): 20}
    reported[("t", 1)], true_high[("t", 1)] = (0, 24), 30
    assert latest(False) == {("t", 0): 8, ("t", 1): 24}
    assert probed == [[("t", 0), ("t", 1)]]
    # it stops: the next planning probes it and finds the tail
    assert latest(False) == {("t", 0): 8, ("t", 1): 30}
    assert probed[1:] == [[("t", 1)]]
    # exact: a partition that moved is probed at once
    reported[("t", 0)], true_high[("t", 0)] = (0, 10), 11
    assert latest(True) == {("t", 0): 11, ("t", 1): 30}
    assert probed[2:] == [[("t", 0)]]


class SteadyProducerConsumer:
    """A consumer on a partition a producer keeps writing to: every fetch returns records, so
    the end-of-partition event never comes; each fetch response's high watermark is cached."""

    def __init__(self) -> None:
        self.high = {("t", 0): 100, ("t", 1): 200}
        self.positions: dict[tuple[str, int], int] = {}
        self.fetched: list[Any] = []  # messages of the last fetch response not taken yet
        self.calls = 0  # fetch responses

    def assign(self, tps: list[Any]) -> None:
        self.positions = {(tp.topic, tp.partition): tp.offset for tp in tps}

    def unassign(self) -> None:
        self.positions = {}

    def _fetch(self) -> None:
        from test_consumer_pool import Msg

        self.calls += 1
        for key, pos in self.positions.items():
            self.high[key] += 3  # the producer wrote more meanwhile
            self.fetched.append(Msg(key[0], key[1], pos))
            self.positions[key] = pos + 1

    def poll(self, timeout: float) -> Any:
        if not self.fetched:
            self._fetch()
        return self.fetched.pop(0)

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        if not self.fetched and timeout > 0:
            self._fetch()
        out, self.fetched = self.fetched[:num_messages], self.fetched[num_messages:]
        return out

    def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
        assert cached  # the fetch response's high watermark, no ListOffsets round trip
        return 0, self.high[(tp.topic, tp.partition)]


def test_the_probe_takes_the_first_fetch_answer_under_a_steady_producer() -> None:
    options = parse_options({"kafka.bootstrap.servers": "b:1", "subscribe": "t",
                             "includeMarkers": "false", "kafkaConsumer.pollTimeoutMs": "1000"})
    consumer = SteadyProducerConsumer()
    ranges = {("t", 0): OffsetRange(0, 90), ("t", 1): OffsetRange(0, 150)}
    found = KafkaMetadata(options)._probe_high_watermarks(consumer, ranges)  # type: ignore[arg-type]
    assert found == {("t", 0): 103, ("t", 1): 203}
    assert consumer.calls == 1


class ResponsesConsumer:
    """Fetch responses as they come, one per poll: each sets the cached high watermark of the
    partitions it answers and queues their records, which poll() hands out one at a time
    (the records of the partitions answered first come first)."""

    def __init__(self, cached: dict[Partition, int], responses: list[dict[Partition, int]]
                 ) -> None:
        self.high = dict(cached)
        self.responses = responses
        self.queued: list[Any] = []
        self.polls = 0

    def assign(self, tps: list[Any]) -> None:
        pass

    def unassign(self) -> None:
        self.queued = []

    def poll(self, timeout: float) -> Any:
        from test_consumer_pool import Msg

        self.polls += 1
        if self.responses:
            response = self.responses.pop(0)
            self.high.update(response)
            self.queued += [Msg(t, p, o) for (t, p), high in response.items()
                            for o in range(high - 1000, high)]
        return self.queued.pop(0) if self.queued else None

    def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
        assert cached
        return 0, self.high.get((tp.topic, tp.partition), -1001)


def test_partitions_answered_by_the_same_fetch_response_need_not_be_read() -> None:
    """Three partitions in one fetch response: one poll answers them all, though only the
    first partition's records come out of it; a partition whose cached high watermark is
    left from an earlier probe (at the reported latest offset, unchanged) waits for a response
    to this probe."""
    options = parse_options({"kafka.bootstrap.servers": "b:1", "subscribe": "t",
                             "includeMarkers": "false"})
    ranges = {("t", p): OffsetRange(0, 5_000) for p in range(4)}
    consumer = ResponsesConsumer(
        {("t", 3): 5_000},
        [{("t", 0): 6_000, ("t", 1): 7_000, ("t", 2): 8_000}, {}, {("t", 3): 9_000}])
    found = KafkaMetadata(options)._probe_high_watermarks(consumer, ranges)  # type: ignore[arg-type]
    assert found == {("t", 0): 6_000, ("t", 1): 7_000, ("t", 2): 8_000, ("t", 3): 9_000}
    assert consumer.polls == 3
