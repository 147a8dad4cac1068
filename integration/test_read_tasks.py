"""Grouped read tasks against the real broker: the same planned batches read one task per
partition (``read_slice``) and as grouped, split read tasks (``read_task`` over
``plan_read_tasks``) give exactly the same records and markers, and record the same generator
states and slice markers; and through Spark, a query with ``minPartitions`` splitting slices
across many tasks emits what a query read by one task emits."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from integration.kafka_helpers import markers, produce, run_available_now, source

BASE = 1_700_000_000_000
JITTER = [0, -1_500, 700, -300, 1_200, -2_500, 400]


def skewed(partitions: int, counts: list[int]) -> list[tuple[int, bytes, bytes, int]]:
    records = []
    for p in range(partitions):
        for i in range(counts[p % len(counts)]):
            ts = BASE - p * 100_000 + i * 1_000 + JITTER[i % len(JITTER)]
            records.append((p, f"k{p}-{i}".encode(), json.dumps({"p": p, "i": i}).encode(), ts))
    return records


def per_partition(batches: list[pa.RecordBatch]) -> dict[tuple[str, int], list[Any]]:
    out: dict[tuple[str, int], list[Any]] = {}
    for batch in batches:
        table = pa.Table.from_batches([batch])
        for row in table.to_pylist():
            out.setdefault((row["topic"], row["partition"]), []).append(row)
    return out


@pytest.mark.parametrize("config", [
    {"maxReadTasks": "1"}, {"maxReadTasks": "2"}, {"minPartitions": "12"},
], ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_grouped_tasks_read_what_one_task_per_partition_reads(
    kafka_bootstrap: str, topic: Any, tmp_path: Any, config: dict[str, str]
) -> None:
    from flinkish_source.kafka import KafkaMetadata
    from flinkish_source.offset_planner import OffsetPlanner
    from flinkish_source.options import parse_options
    from flinkish_source.partition_reader import read_slice, read_task
    from flinkish_source.read_plan import plan_read_tasks
    from flinkish_source.source_state import SourceStateStore

    name = topic(7)
    produce(kafka_bootstrap, name, skewed(6, [120, 5, 40, 1, 77, 9]))  # partition 6 stays empty

    def options(where: str, **extra: str) -> Any:
        return parse_options({
            "kafka.bootstrap.servers": kafka_bootstrap, "subscribe": name,
            "startingOffsets": "earliest", "watermark.maxOutOfOrderness": "2 seconds",
            "idleTimeout": "1 minute", "endingOffsets": "latest",
            "checkpointing.location": str(tmp_path / where),
            "kafkaConsumer.pollTimeoutMs": "20000", **extra,
        })

    whole, grouped = options("whole"), options("grouped", **config)
    metadata = KafkaMetadata(whole)
    try:
        partitions = metadata.partitions()
        ranges = metadata.offset_ranges(partitions)
    finally:
        metadata.close()
    planner = OffsetPlanner(whole)
    start = planner.initial(partitions, ranges, 0)
    # two batches: the second starts from the state the first recorded
    end = planner.latest(start, partitions, ranges, 1, limit=150)
    stores = {w: SourceStateStore(str(tmp_path / w)) for w in ("whole", "grouped")}

    def load(tp: tuple[str, int], at: int, base: Any) -> Any:
        return stores["whole"].find_state(tp[0], tp[1], at)

    for first, last in [(start, end), (end, None)]:
        if last is None:  # the second batch starts from the state the first one recorded
            last = planner.latest(first, partitions, ranges, 2, load_state=load)
        plans = OffsetPlanner.slices(first, last)
        expected = per_partition([b for plan in plans for b in read_slice(whole, plan)])
        tasks = plan_read_tasks(grouped, plans)
        assert len(tasks) <= max(int(config.get("maxReadTasks", "0")),
                                 int(config.get("minPartitions", "0")))
        got = per_partition([b for task in tasks for b in read_task(grouped, task)])
        assert got == expected
        stores["grouped"].new_round()  # as the driver does before each planning
        assert sum(1 for rows in got.values() for r in rows if r["kind"] == "record") == sum(
            p.end - p.start for p in plans)
        for plan in plans:
            if plan.end > plan.start:
                at = (plan.topic, plan.partition, plan.end)
                assert stores["grouped"].find_state(*at) == stores["whole"].find_state(*at)
                assert [o.to_json() for o in stores["grouped"].find_outcomes(*at)] == [
                    o.to_json() for o in stores["whole"].find_outcomes(*at)]


def test_a_query_split_over_many_tasks_emits_what_one_task_emits(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    name = topic(4)
    produce(kafka_bootstrap, name, skewed(4, [300, 20, 0, 90]))
    runs = {}
    for label, extra in (("one", {"maxReadTasks": "1"}),
                         ("split", {"minPartitions": "10", "maxReadTasks": "10"})):
        df = source(spark, kafka_bootstrap, name, str(tmp_path / label / "state"),
                    **{"watermark.maxOutOfOrderness": "2 seconds", "idleTimeout": "1 minute",
                       "maxOffsetsPerTrigger": "200", **extra})
        runs[label] = run_available_now(df, str(tmp_path / label / "ck"))
    one, split = runs["one"], runs["split"]
    for p in range(4):
        assert [(r.offset, r.key, r.eventTime) for r in split
                if r.partition == p and r.kind == "record"] == [
            (r.offset, r.key, r.eventTime) for r in one if r.partition == p and r.kind == "record"]
        assert markers(split, p) == markers(one, p)
    assert len([r for r in one if r.kind == "record"]) == 410
    assert any(m[0] == "watermark" for m in markers(split, 0))
