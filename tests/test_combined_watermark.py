"""The combined watermark at planning time (``flinkish_source.combined_watermark``) against a
fake Kafka, driven the way Spark drives the source: plan (latestOffset), run the read tasks
(partitions + read), repeat. What the driver journals must agree with what a sink computes from
the same batches' marker rows with the valve over epochs."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import flinkish_source.kafka as kafka_source
from flinkish_core.epoch_valve import EpochWatermark, advance, initial
from flinkish_core.markers import KIND_CARRIER, MARKER_FIELDS, MARKER_KINDS, Marker
from flinkish_core.watermark import LAST_CARRIER_MS, MAX_WATERMARK, MIN_WATERMARK
from flinkish_source import stream_reader
from flinkish_source.combined_watermark import OFFSET_KEY
from flinkish_source.kafka import OffsetRange
from flinkish_source.options import parse_options
from flinkish_source.stream_reader import FlinkishStreamReader

TOPIC = "t"
HORIZON = 3_600_000


@dataclass
class Message:
    _partition: int
    _offset: int
    _ts: int

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"{}"

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def headers(self) -> None:
        return None


@dataclass
class Cluster:
    """Partitions of one topic as lists of timestamps, and a clock."""

    partitions: int
    logs: dict[int, list[int]] = field(default_factory=dict)
    now: int = 0

    def add(self, partition: int, *timestamps: int) -> None:
        self.logs.setdefault(partition, []).extend(timestamps)

    def read_range(self, options: Any, topic: str, partition: int, start: int, end: int,
                   chunk: int) -> Iterator[list[Message]]:
        log = self.logs.get(partition, [])
        wanted = [Message(partition, o, log[o]) for o in range(start, min(end, len(log)))]
        if wanted:
            yield wanted

    def ranges(self) -> tuple[list[tuple[str, int]], dict[tuple[str, int], OffsetRange]]:
        tps = [(TOPIC, p) for p in range(self.partitions)]
        return tps, {tp: OffsetRange(0, len(self.logs.get(tp[1], []))) for tp in tps}


@dataclass
class Run:
    """Spark's loop over the source, with a sink that runs the valve over each epoch."""

    reader: FlinkishStreamReader
    cluster: Cluster
    offset: dict[str, Any]
    sink: EpochWatermark = field(default_factory=initial)
    sink_history: list[EpochWatermark] = field(default_factory=list)
    carriers: list[tuple[int, int]] = field(default_factory=list)  # (epoch, carrier watermark)
    batches: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def step(self, advance_ms: int = 0) -> bool:
        """Plan one batch and run it; False if Spark would plan none."""
        self.cluster.now += advance_ms
        end = self.reader.latestOffset(self.offset, ReadAllAvailable())
        if end == self.offset:
            return False
        end = json.loads(json.dumps(end))  # journaled as JSON by Spark
        rows = self.read(self.offset, end)
        epoch = len(self.batches)
        carriers = [r for r in rows if r["kind"] == KIND_CARRIER]
        assert len(carriers) <= 2  # the batch's, and a closing batch's own
        if carriers:  # Spark's watermark takes the largest
            self.carriers.append((epoch, max(c["watermark"] for c in carriers)))
        markers = [Marker.from_json([r[f] for f in MARKER_FIELDS])
                   for r in rows if r["kind"] in MARKER_KINDS]
        self.sink = advance(self.sink, epoch, markers)
        self.sink_history.append(self.sink)
        self.batches.append((self.offset, end))
        self.offset = end
        return True

    def read(self, start: dict[str, Any], end: dict[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for partition in self.reader.partitions(start, end):
            for batch in self.reader.read(partition):
                table = pa.Table.from_batches([batch])
                for name in ("timestamp", "eventTime"):  # as microseconds: the carrier's
                    at = table.schema.get_field_index(name)  # is past Python's datetime
                    table = table.set_column(at, name, table.column(name).cast(pa.int64()))
                rows.extend(table.to_pylist())
        return rows

    def settle(self, advance_ms: int = 0, limit: int = 10) -> int:
        """Plan until Spark would plan nothing more; the number of batches that ran."""
        ran = 0
        while self.step(advance_ms if ran == 0 else 0):
            ran += 1
            assert ran < limit, "the source keeps planning batches on a quiet topic"
        return ran


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    fake = Cluster(3)
    monkeypatch.setattr(kafka_source, "read_range", fake.read_range)
    monkeypatch.setattr(stream_reader, "_now_ms", lambda: fake.now)
    monkeypatch.setattr(FlinkishStreamReader, "_cluster", lambda self, exact=True: fake.ranges())
    return fake


def start_run(cluster: Cluster, tmp_path: Path, **extra: str) -> Run:
    options = parse_options({
        "kafka.bootstrap.servers": "b:1", "subscribe": TOPIC, "startingOffsets": "earliest",
        "checkpointing.location": str(tmp_path / "state"), "idleTimeout": "10 s",
        "watermark.maxOutOfOrderness": "1 s", "watermark.horizon": "1 hour", **extra,
    })
    reader = FlinkishStreamReader(options)
    return Run(reader, cluster, json.loads(json.dumps(reader.initialOffset())))


def journaled_watermark(offset: dict[str, Any]) -> int:
    return int(offset[OFFSET_KEY]["watermark"])


def test_carrier_of_each_batch_is_the_sinks_combined_watermark_of_the_one_before(
    cluster: Cluster, tmp_path: Path
) -> None:
    run = start_run(cluster, tmp_path)
    cluster.add(0, 10_000, 12_000)
    cluster.add(1, 5_000)
    cluster.add(2, 20_000, 21_000)
    assert run.step()
    assert run.carriers == []  # nothing combined before the first batch
    cluster.add(0, 15_000)
    cluster.add(1, 9_000, 8_000)
    assert run.step(1_000)
    cluster.add(2, 30_000)
    assert run.step(1_000)
    assert run.settle(1_000) <= 1
    # batch N carries the combined watermark the sink recorded after epoch N-1
    assert run.carriers == [(n, run.sink_history[n - 1].watermark)
                            for n in range(1, len(run.batches))
                            if run.sink_history[n - 1].watermark != MIN_WATERMARK]
    assert run.sink.watermark == 7_999  # partition 1 holds it back
    assert journaled_watermark(run.offset) == run.sink.watermark


def test_a_partition_going_idle_releases_the_watermark_in_a_batch_of_its_own(
    cluster: Cluster, tmp_path: Path
) -> None:
    run = start_run(cluster, tmp_path)
    for p, ts in ((0, 50_000), (1, 50_000), (2, 5_000)):
        cluster.add(p, ts)
    run.settle()
    assert run.sink.watermark == 3_999  # partition 2 lags
    before = len(run.batches)
    cluster.add(0, 60_000)
    cluster.add(1, 61_000)
    run.settle(1_000)
    assert run.sink.watermark == 3_999
    # 10 s without news from partition 2: IDLE in the next batch, then a batch whose only row
    # is the carrier of the released watermark, then nothing more
    cluster.add(0, 70_000)
    cluster.add(1, 71_000)
    assert run.settle(10_000) == 2
    assert run.sink.watermark == 68_999
    assert [row["kind"] for row in run.read(*run.batches[-1])] == [KIND_CARRIER]
    assert run.carriers[-1] == (len(run.batches) - 1, 68_999)
    assert len(run.batches) == before + 3
    # everything idle: the valve flushes the maximum, which a last batch carries
    assert run.settle(10_000) == 2
    assert run.sink.watermark == run.carriers[-1][1] == 69_999
    assert run.settle(60_000) == 0  # a quiet topic plans no batch


def test_replayed_batches_read_identically_and_plan_the_same(
    cluster: Cluster, tmp_path: Path
) -> None:
    run = start_run(cluster, tmp_path)
    cluster.add(0, 1_000, 2_000)
    cluster.add(1, 3_000)
    cluster.add(2, 4_000)
    run.settle()
    cluster.add(0, 9_000)
    cluster.add(1, 8_000)
    run.settle(1_000)
    for start, end in run.batches:
        assert run.read(start, end) == run.read(start, end)
    # re-planning from a journaled offset gives the journaled watermark again
    start, end = run.batches[-1]
    again = run.reader.latestOffset(start, ReadAllAvailable())
    assert again[OFFSET_KEY] == end[OFFSET_KEY]


def test_markers_a_task_did_not_record_are_re_read_on_the_driver(
    cluster: Cluster, tmp_path: Path
) -> None:
    run = start_run(cluster, tmp_path)
    cluster.add(0, 10_000)
    cluster.add(1, 11_000)
    cluster.add(2, 12_000)
    run.settle()
    for record in (tmp_path / "state" / "source").rglob("*"):
        if record.is_file():
            record.unlink()  # as if the tasks' rows had not all been consumed
    cluster.add(0, 20_000)
    assert run.settle(1_000) == 2  # the records, then the carrier of the watermark they moved
    assert run.carriers[-2] == (len(run.batches) - 2, 8_999)
    assert run.carriers == [(n, run.sink_history[n - 1].watermark)
                            for n in range(1, len(run.batches))]


def test_bounded_input_ends_at_max_watermark_clamped_to_sparks_last_timestamp(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.add(0, 1_000)
    cluster.add(1, 2_000)
    cluster.add(2, 3_000)
    run = start_run(cluster, tmp_path, endingOffsets="latest")
    run.settle()
    assert run.sink.watermark == MAX_WATERMARK
    assert run.carriers[-1][1] == MAX_WATERMARK
    carrier_row = next(r for r in run.read(*run.batches[-1]) if r["kind"] == KIND_CARRIER)
    assert carrier_row["eventTime"] == LAST_CARRIER_MS * 1000


def test_missing_subscribed_topics_and_available_now_on_nothing_are_logged(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from flinkish_source.stream_reader import warn_missing_topics

    options = parse_options({"kafka.bootstrap.servers": "b:1", "subscribe": "t,later",
                             "watermark.strategy": "none"})
    with caplog.at_level("WARNING", logger="flinkish_source.stream_reader"):
        warn_missing_topics(options, [(TOPIC, 0)])
    assert "subscribed topics ['later'] do not exist in Kafka (yet)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="flinkish_source.stream_reader"):
        warn_missing_topics(options, [(TOPIC, 0), ("later", 0)])
        start_run(cluster, tmp_path).reader.prepareForTriggerAvailableNow()
    assert "do not exist" not in caplog.text
    assert "Trigger.AvailableNow: nothing to read in subscribe=t" in caplog.text


def test_the_batch_that_reaches_available_nows_target_carries_its_own_watermark(
    cluster: Cluster, tmp_path: Path
) -> None:
    """No carrier-only batch after an AvailableNow run's records: the read task of the batch
    that reaches the target that finishes last yields the carrier of the watermark after the
    batch (Spark's watermark takes the larger of the batch's carriers)."""
    run = start_run(cluster, tmp_path)
    cluster.add(0, 10_000, 12_000)
    cluster.add(1, 5_000)
    cluster.add(2, 20_000)
    run.reader.prepareForTriggerAvailableNow()
    assert run.settle() == 1
    assert run.carriers == [(0, run.sink.watermark)]
    assert run.sink.watermark == 3_999
    tasks = run.reader.partitions(*run.batches[0])
    assert len(tasks) == 2
    assert all(isinstance(t, stream_reader.ReadTaskInputPartition)
               and t.closing == run.batches[0][1] for t in tasks)
    # the next run starts where this one ended, and ends the same way
    cluster.add(1, 9_000)
    cluster.add(2, 25_000)
    cluster.now += 1_000
    run.reader.prepareForTriggerAvailableNow()
    assert run.settle() == 1
    assert run.carriers[-1] == (1, run.sink.watermark) == (1, 7_999)
    # without a target the same records need a batch more: the carrier-only one
    other = start_run(cluster, tmp_path / "running")
    assert other.settle() == 2
    assert other.carriers == [(1, run.sink.watermark)]


def _carriers(reader: FlinkishStreamReader, partition: Any) -> list[int]:
    """The watermarks of the carrier rows a read task yields, run as Spark runs it: on a
    copy of the reader shipped to an executor."""
    worker = pickle.loads(pickle.dumps(reader))
    out: list[int] = []
    for batch in worker.read(partition):
        kinds = batch.column("kind").to_pylist()
        out += [w for k, w in zip(kinds, batch.column("watermark").to_pylist(), strict=True)
                if k == KIND_CARRIER]
    return out


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_the_read_task_that_finishes_last_carries_the_closing_watermark(
    cluster: Cluster, tmp_path: Path, order: tuple[int, int]
) -> None:
    """Each read task of a closing batch looks for the others' markers after recording its
    own: whichever finishes last finds them all and carries W; the earlier one yields nothing
    (it does not wait). What it delivered is recorded, so no carrier-only batch follows."""
    run = start_run(cluster, tmp_path)
    cluster.add(0, 10_000)
    cluster.add(1, 11_000)
    cluster.add(2, 12_000)
    run.reader.prepareForTriggerAvailableNow()
    end = run.reader.latestOffset(run.offset, ReadAllAvailable())
    end = json.loads(json.dumps(end))
    tasks = run.reader.partitions(run.offset, end)
    first, last = (tasks[i] for i in order)
    assert _carriers(run.reader, first) == []
    assert _carriers(run.reader, last) == [8_999]
    run.offset = end
    assert run.settle() == 0


def test_a_closing_batch_whose_tasks_do_not_all_finish_leaves_the_watermark_to_a_carrier_batch(
    cluster: Cluster, tmp_path: Path
) -> None:
    """When no read task finds every task's markers (rows not all consumed), nothing is
    recorded as delivered, also over what an earlier run of the batch delivered (the driver
    forgets it when it runs the batch again), and the next planning carries the watermark the
    usual way."""
    run = start_run(cluster, tmp_path)
    cluster.add(0, 10_000)
    cluster.add(1, 11_000)
    cluster.add(2, 12_000)
    run.reader.prepareForTriggerAvailableNow()
    assert run.settle() == 1
    assert run.carriers == [(0, 8_999)]
    for record in (tmp_path / "state" / "source" / "~tasks").iterdir():
        record.unlink()  # the batch replayed, ...
    tasks = run.reader.partitions(*run.batches[0])
    assert _carriers(run.reader, tasks[0]) == []  # ... only its first task's rows consumed
    assert run.settle() == 1  # the markers re-read on the driver, then the carrier batch
    assert [row["kind"] for row in run.read(*run.batches[-1])] == [KIND_CARRIER]
    assert run.carriers[-1] == (1, 8_999)


def counting_reader(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    starting: str) -> tuple[FlinkishStreamReader, list[bool]]:
    """A reader of the cluster (one record in partition 0) from ``startingOffsets=starting``,
    and the list of its looks at the cluster (``exact`` of each)."""
    asked: list[bool] = []

    def view(self: FlinkishStreamReader, exact: bool = True) -> Any:
        asked.append(exact)
        return cluster.ranges()

    monkeypatch.setattr(FlinkishStreamReader, "_cluster", view)
    cluster.add(0, 1_000)
    return FlinkishStreamReader(parse_options({
        "kafka.bootstrap.servers": "b:1", "subscribe": TOPIC, "startingOffsets": starting,
        "checkpointing.location": str(tmp_path / "state")})), asked


def test_available_nows_start_asks_kafka_once(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark calls prepareForTriggerAvailableNow, then initialOffset at once: they share one
    view of the cluster; plannings ask Kafka again (their clock decides idleness)."""
    reader, asked = counting_reader(cluster, tmp_path, monkeypatch, "earliest")
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    assert asked == [True]
    reader.latestOffset(start, ReadAllAvailable())
    assert asked == [True, False]


def test_the_query_starts_where_initial_offset_first_said(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark asks initialOffset again when it runs the first batch, and at each trigger until
    it plans one: the answer stays the first one (``startingOffsets=latest`` does not move on
    with records written meanwhile, which the first batch then reads), and Kafka is asked
    once."""
    reader, asked = counting_reader(cluster, tmp_path, monkeypatch, "latest")
    first = reader.initialOffset()
    cluster.add(0, 2_000)
    assert reader.initialOffset() == first
    assert asked == [True]
    end = reader.latestOffset(first, ReadAllAvailable())
    rows = [r for p in reader.partitions(first, end) for b in reader.read(p)
            for r in b.to_pylist() if r["kind"] == "record"]
    assert [r["offset"] for r in rows] == [1]
