"""What Kafka users rely on, through Spark and a real broker: each completed epoch's offsets in
a consumer group, the latest offsets in Spark's progress (and the lag figures from them), and
Spark's trigger pacing (``minOffsetsPerTrigger`` / ``maxTriggerDelay``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import flinkish
from integration.kafka_helpers import Collector, produce, source, wait_for

pytestmark = pytest.mark.integration

BASE = 1_700_000_000_000


def records(first: int, last: int, partitions: int = 2) -> list[tuple[int, bytes, bytes, int]]:
    return [(p, b"k", b"{}", BASE + i * 1_000) for i in range(first, last)
            for p in range(partitions)]


def end_offsets(checkpoint: Path, batch: int) -> dict[tuple[str, int], int]:
    """The source's end offset of ``batch``, as Spark journaled it."""
    offset = json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[2])
    return {(t, int(p)): pos["offset"] for t, parts in offset["topics"].items()
            for p, pos in parts.items()}


class GroupReader:
    """A foreachBatch sink that, in each batch, reads what the consumer group holds."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int) -> None:
        self.bootstrap, self.group, self.topic, self.partitions = (
            bootstrap, group, topic, partitions)
        self.seen: dict[int, dict[tuple[str, int], int]] = {}

    def committed(self) -> dict[tuple[str, int], int]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                             "enable.auto.commit": False})
        try:
            got = consumer.committed([TopicPartition(self.topic, p)
                                      for p in range(self.partitions)], timeout=30)
        finally:
            consumer.close()
        return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0}

    def __call__(self, batch: Any, batch_id: int) -> None:
        batch.count()
        self.seen[batch_id] = self.committed()


def run(df: Any, checkpoint: Path, sink: Any) -> Any:
    query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None, query.exception()
    return query


def test_each_completed_epochs_offsets_are_committed_to_the_consumer_group(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    name = topic(2)
    produce(kafka_bootstrap, name, records(0, 30))
    flinkish.register(spark)
    group = f"flinkish-test-{name}"
    checkpoint = tmp_path / "ck"

    def events() -> Any:
        return source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                      **{"maxOffsetsPerTrigger": "20", "kafka.group.id": group})

    sink = GroupReader(kafka_bootstrap, group, name, 2)
    run(events(), checkpoint, sink)
    first_run = sorted(sink.seen)
    assert len(first_run) >= 3
    # while batch N runs, the group holds epoch N-1's end offsets: committed once Spark had
    # durably committed that epoch (before it planned batch N)
    assert sink.seen[first_run[0]] == {}
    for batch in first_run[1:]:
        assert sink.seen[batch] == end_offsets(checkpoint, batch - 1), batch

    # a restart goes on committing the epochs it completes, from the first run's last one
    produce(kafka_bootstrap, name, records(30, 50))
    sink.seen.clear()
    run(events(), checkpoint, sink)
    second_run = sorted(sink.seen)
    assert second_run and second_run[0] > first_run[-1]
    assert second_run[0] == first_run[-1] + 1
    for batch in second_run:
        assert sink.seen[batch] == end_offsets(checkpoint, batch - 1), batch


def test_an_available_now_run_leaves_its_last_epoch_in_the_consumer_group(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    """The daily batch job of a lag exporter's user: 900 records in 3 partitions, 100 a batch;
    when the query ends, the group holds where it ended, not the epoch before."""
    name = topic(3)
    produce(kafka_bootstrap, name, records(0, 300, partitions=3))
    group = f"daily-{name}"
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    **{"maxOffsetsPerTrigger": "100", "kafka.group.id": group})
    run(events, tmp_path / "ck", Collector())
    reader = GroupReader(kafka_bootstrap, group, name, 3)
    wait_for(lambda: reader.committed() == {(name, p): 300 for p in range(3)}, 60,
             f"group {group} at 300/300/300")


def test_an_epoch_is_in_the_consumer_group_right_after_it_and_stays_after_stop(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    """Batch 0 reads everything and the next trigger is an hour away: Spark does not call the
    reader again before it is stopped, so only the session's listener (added by ``register``)
    can have epoch 0 committed; it is, and ``stop()`` leaves it so."""
    name = topic(3)
    produce(kafka_bootstrap, name, records(0, 100, partitions=3))
    flinkish.register(spark)
    group = f"stopped-{name}"
    checkpoint = tmp_path / "ck"
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    **{"kafka.group.id": group})
    query = (events.writeStream.foreachBatch(Collector())
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="1 hour").start())
    reader = GroupReader(kafka_bootstrap, group, name, 3)
    everything = {(name, p): 100 for p in range(3)}
    try:
        wait_for(lambda: reader.committed() == everything, 120, f"group {group} at epoch 0's end")
    finally:
        query.stop()
    assert query.exception() is None and not query.isActive
    assert sorted(p.name for p in (checkpoint / "commits").iterdir()
                  if not p.name.startswith(".")) == ["0"]
    assert end_offsets(checkpoint, 0) == everything == reader.committed()


def test_progress_shows_the_latest_offsets_and_the_lag_figures(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    from flinkish_source.options import parse_options

    name = topic(2)
    produce(kafka_bootstrap, name, records(0, 40))
    state = str(tmp_path / "state")
    events = source(spark, kafka_bootstrap, name, state,
                    **{"maxOffsetsPerTrigger": "20", "groupIdPrefix": "lag-watch"})
    query = run(events, tmp_path / "ck", Collector())
    # groupIdPrefix: the group is named after the query's checkpointing.location
    group = parse_options({"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": name,
                           "checkpointing.location": state,
                           "groupIdPrefix": "lag-watch"}).kafka.commit_group
    assert group is not None and group.startswith("lag-watch-")
    last = max(p["batchId"] for p in query.recentProgress)
    assert GroupReader(kafka_bootstrap, group, name, 2).committed() == end_offsets(
        tmp_path / "ck", last)
    lags = {}
    for p in query.recentProgress:
        progress = json.loads(p.json)
        for lag in flinkish.source_lags(progress):
            lags[lag.batch_id] = lag
        assert progress["sources"][0]["latestOffset"] == {name: {"0": 40, "1": 40}}
    # 20 records a batch over two partitions: 30 of each partition behind after the first
    assert lags[0].offsets_behind_latest == {f"{name}/0": 30, f"{name}/1": 30}
    assert lags[0].max_offsets_behind_latest == 30
    last = max(b for b, lag in lags.items() if lag.offsets_behind_latest)
    assert lags[last].max_offsets_behind_latest == 0
    assert lags[last].watermark_lag_ms is not None and lags[last].watermark_lag_ms > 0


def test_min_offsets_per_trigger_waits_at_most_max_trigger_delay(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    name = topic(1)
    produce(kafka_bootstrap, name, records(0, 5, partitions=1))
    group = f"never-{name}"
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    **{"minOffsetsPerTrigger": "1000", "maxTriggerDelay": "4 seconds",
                       "includeMarkers": "false", "kafka.group.id": group,
                       "commitOffsetsOnCheckpoint": "false"})
    collector = Collector()
    query = (events.writeStream.foreachBatch(collector)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())

    def read_in() -> dict[int, int]:
        """Batch id -> its trigger's start (ms), for the batches that read records; a batch's
        progress is posted after its sink has the rows, so poll for it."""
        return {p["batchId"]: flinkish.lag.timestamp_ms(p["timestamp"])
                for p in query.recentProgress if p["numInputRows"] > 0}

    try:
        wait_for(lambda: len(collector.rows) >= 5 and read_in(), 120,
                 "the first batch (no wait before it)")
        produce(kafka_bootstrap, name, records(5, 8, partitions=1))
        wait_for(lambda: len(collector.rows) >= 8 and len(read_in()) >= 2, 120,
                 "the small batch once maxTriggerDelay has passed")
        stamps = read_in()
    finally:
        query.stop()
    batches = sorted(stamps)
    assert len(batches) == 2, stamps  # 3 records never reach the minimum: one delayed batch
    # the delay runs from the first batch's planning to the second's; each trigger starts a
    # little before its planning, so allow that much
    assert stamps[batches[1]] - stamps[batches[0]] >= 4_000 - 500
    # commitOffsetsOnCheckpoint=false: the named group never receives offsets
    assert GroupReader(kafka_bootstrap, group, name, 1).committed() == {}


@pytest.mark.parametrize("per_partition", [False, True], ids=["one time", "per partition"])
def test_a_query_starts_and_ends_at_times_on_a_broker_that_answers_them_wrong(
    per_partition: bool, spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    """The embedded broker answers ListOffsets by timestamp with 0 for every time: the source
    sees its records contradict that and scans for the right offsets."""
    name = topic(2)
    produce(kafka_bootstrap, name, records(0, 40))
    if per_partition:
        # partition 1 starts later; partition 0 has no record at or after its start time:
        # startingOffsetsByTimestampStrategy=latest starts it at its end, reading nothing
        times = {"startingOffsetsByTimestamp": json.dumps(
                     {name: {"0": BASE + 100_000, "1": BASE + 30_000}}),
                 "startingOffsetsByTimestampStrategy": "latest",
                 "endingOffsetsByTimestamp": json.dumps(
                     {name: {"0": BASE + 35_000, "1": BASE + 35_000}})}
        expected = [(1, o) for o in range(30, 35)]
    else:
        times = {"startingTimestamp": str(BASE + 25_000), "endingTimestamp": str(BASE + 35_000)}
        expected = [(p, o) for p in (0, 1) for o in range(25, 35)]
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    **{**times, "startingOffsets": None})
    collector = Collector()
    run(events, tmp_path / "ck", collector)
    read = sorted((r.partition, r.offset) for _, r in collector.rows if r.kind == "record")
    assert read == expected


def test_inspect_shows_the_lag_of_a_real_run(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    from flinkish.cli import main
    from flinkish.inspect import lags

    name = topic(2)
    produce(kafka_bootstrap, name, records(0, 40))
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    **{"maxOffsetsPerTrigger": "20"})
    checkpoint = tmp_path / "ck"
    query = (events.writeStream.format("flinkish").option("target", "parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None, query.exception()
    found = lags(str(checkpoint))
    assert found[0].offsets_behind_latest == {f"{name}/0": 30, f"{name}/1": 30}
    assert found[max(found)].max_offsets_behind_latest == 0
    assert found[max(found)].watermark_lag_ms is not None
    capsys.readouterr()
    assert main(["inspect", str(checkpoint), "--plot", str(tmp_path / "lag.png")]) == 0
    shown = capsys.readouterr().out
    assert "lag when each batch was planned" in shown and "30 / 30 / 30.0" in shown
    assert (tmp_path / "lag.png").exists()
