"""Spark's ``minOffsetsPerTrigger`` / ``maxTriggerDelay`` in the source's planning (the rule
alone; ``integration/test_kafka_features.py`` runs it through Spark)."""

from __future__ import annotations

from flinkish_source.offset_planner import PartitionPosition, Positions
from flinkish_source.options import parse_options
from flinkish_source.stream_reader import FlinkishStreamReader

DELAY = 10_000
T = 1_700_000_000_000  # wall-clock ms, as the planner passes them


def reader(**extra: str) -> FlinkishStreamReader:
    return FlinkishStreamReader(parse_options({
        "kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "includeMarkers": "false",
        "minOffsetsPerTrigger": "100", "maxTriggerDelay": f"{DELAY} ms", **extra}))


def at(**offsets: int) -> Positions:
    return {("t", int(p.lstrip("p"))): PartitionPosition(o, 0, "ACTIVE", 0, o, None, None)
            for p, o in offsets.items()}


def test_the_first_planning_goes_through_then_batches_wait_for_the_minimum() -> None:
    r = reader()
    assert not r._delay_batch(at(p0=0, p1=0), at(p0=3, p1=4), T + 1_000)  # the first: no wait
    assert r._delay_batch(at(p0=3, p1=4), at(p0=50, p1=49), T + 2_000)  # 92 < 100
    assert not r._delay_batch(at(p0=3, p1=4), at(p0=53, p1=54), T + 3_000)  # 100 records
    assert r._delay_batch(at(p0=53, p1=54), at(p0=60, p1=54), T + 4_000)


def test_the_delay_lets_a_small_batch_through_and_restarts() -> None:
    r = reader()
    r._delay_batch(at(p0=0), at(p0=1), T + 1_000)
    assert r._delay_batch(at(p0=1), at(p0=2), T + 1_000 + DELAY - 1)
    assert not r._delay_batch(at(p0=1), at(p0=2), T + 1_000 + DELAY)  # maxTriggerDelay passed
    assert r._delay_batch(at(p0=2), at(p0=3), T + 1_000 + DELAY + 1)  # counted from that batch


def test_a_new_partition_counts_from_where_it_entered() -> None:
    r = reader()
    r._delay_batch(at(p0=0), at(p0=0), T + 1_000)
    new = at(p0=0, p1=120)
    new[("t", 1)] = PartitionPosition(120, 20, "ACTIVE", 0, 120, None, None)
    assert not r._delay_batch(at(p0=0), new, T + 2_000)  # 100 records of partition 1


def test_no_pacing_without_the_option_or_under_available_now() -> None:
    plain = FlinkishStreamReader(parse_options({
        "kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "includeMarkers": "false"}))
    plain._delay_batch(at(p0=0), at(p0=1), T + 1_000)
    assert not plain._delay_batch(at(p0=1), at(p0=2), T + 1_001)
    r = reader()
    r._delay_batch(at(p0=0), at(p0=1), T + 1_000)
    r._target = {("t", 0): 2}  # prepareForTriggerAvailableNow's
    assert not r._delay_batch(at(p0=1), at(p0=2), T + 1_001)
