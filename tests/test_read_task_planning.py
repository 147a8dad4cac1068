"""The stream reader with grouped read tasks, driven the way Spark drives it (plan, run the read
tasks, commit, repeat) against a fake Kafka: the planning-time valve agrees with a sink's valve
over the same batches whatever the grouping and splitting, the driver reads one record per read
task (not one per partition) and prunes them, and falls back to per-partition records (an old
checkpoint) and to re-reading (a record that is gone)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import checkpointing.storage
import flinkish_source.kafka as kafka_source
from flinkish_core.epoch_valve import EpochWatermark, advance, initial
from flinkish_core.markers import KIND_CARRIER, MARKER_FIELDS, MARKER_KINDS, Marker
from flinkish_source import stream_reader
from flinkish_source.combined_watermark import OFFSET_KEY
from flinkish_source.kafka import OffsetRange
from flinkish_source.options import parse_options
from flinkish_source.source_state import TASKS_DIR
from flinkish_source.stream_reader import (
    CarrierInputPartition,
    FlinkishStreamReader,
    ReadTaskInputPartition,
)

TOPIC = "t"


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
    partitions: int
    logs: dict[int, list[int]] = field(default_factory=dict)
    now: int = 0
    reads: int = 0

    def add(self, partition: int, *timestamps: int) -> None:
        self.logs.setdefault(partition, []).extend(timestamps)

    def read_range(self, options: Any, topic: str, partition: int, start: int, end: int,
                   chunk: int) -> Iterator[list[Message]]:
        self.reads += 1
        log = self.logs.get(partition, [])
        wanted = [Message(partition, o, log[o]) for o in range(start, min(end, len(log)))]
        for i in range(0, len(wanted), 4):
            yield wanted[i:i + 4]

    def ranges(self) -> tuple[list[tuple[str, int]], dict[tuple[str, int], OffsetRange]]:
        tps = [(TOPIC, p) for p in range(self.partitions)]
        return tps, {tp: OffsetRange(0, len(self.logs.get(tp[1], []))) for tp in tps}


@dataclass
class Run:
    reader: FlinkishStreamReader
    offset: dict[str, Any]
    sink: EpochWatermark = field(default_factory=initial)
    history: list[EpochWatermark] = field(default_factory=list)
    carriers: list[tuple[int, int]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    tasks: list[int] = field(default_factory=list)
    batches: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    epochs: int = 0

    def step(self, limit: int | None = None) -> bool:
        end = self.reader.latestOffset(
            self.offset, ReadAllAvailable() if limit is None else ReadMaxRows(limit))
        if end == self.offset:
            return False
        end = json.loads(json.dumps(end))
        partitions = self.reader.partitions(self.offset, end)
        self.tasks.append(sum(isinstance(p, ReadTaskInputPartition) for p in partitions))
        rows = []
        for partition in partitions:
            for batch in self.reader.read(partition):
                table = pa.Table.from_batches([batch])
                for name in ("timestamp", "eventTime"):
                    at = table.schema.get_field_index(name)
                    table = table.set_column(at, name, table.column(name).cast(pa.int64()))
                rows.extend(table.to_pylist())
        carriers = [r for r in rows if r["kind"] == KIND_CARRIER]
        if carriers:
            self.carriers.append((self.epochs, carriers[0]["watermark"]))
        markers = [Marker.from_json([r[f] for f in MARKER_FIELDS])
                   for r in rows if r["kind"] in MARKER_KINDS]
        self.sink = advance(self.sink, self.epochs, markers)
        self.history.append(self.sink)
        self.rows.extend(r for r in rows if r["kind"] != KIND_CARRIER)
        self.reader.commit(self.offset)  # Spark commits the previous end when it plans on
        self.batches.append((self.offset, end))
        self.offset = end
        self.epochs += 1
        return True

    def settle(self, limit: int | None = None) -> int:
        ran = 0
        while self.step(limit):
            ran += 1
            assert ran < 50
        return ran


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    fake = Cluster(12)
    monkeypatch.setattr(kafka_source, "read_range", fake.read_range)
    monkeypatch.setattr(stream_reader, "_now_ms", lambda: fake.now)
    monkeypatch.setattr(FlinkishStreamReader, "_cluster", lambda self, exact=True: fake.ranges())
    return fake


def start(state: Path, **extra: str) -> Run:
    options = parse_options({
        "kafka.bootstrap.servers": "b:1", "subscribe": TOPIC, "startingOffsets": "earliest",
        "checkpointing.location": str(state), "idleTimeout": "10 s",
        "watermark.maxOutOfOrderness": "1 s", **extra,
    })
    reader = FlinkishStreamReader(options)
    return Run(reader, json.loads(json.dumps(reader.initialOffset())))


def feed(cluster: Cluster, round_: int) -> None:
    for p in range(cluster.partitions):
        if p == 11 and round_ > 0:
            continue  # goes quiet, later idle
        n = 1 + (p * 7 + round_ * 3) % 9 + (30 if p == 0 else 0)
        cluster.add(p, *[10_000 * round_ + 1_000 * p + 97 * ((i * 5) % 11) for i in range(n)])


def drive(cluster: Cluster, run: Run) -> None:
    for round_ in range(4):
        feed(cluster, round_)
        cluster.now += 4_000
        run.settle(limit=40)
    cluster.now += 20_000
    run.settle()


def per_partition(rows: list[dict[str, Any]]) -> dict[int, list[tuple[Any, ...]]]:
    out: dict[int, list[tuple[Any, ...]]] = {}
    for r in rows:
        out.setdefault(r["partition"], []).append(tuple(r.values()))
    return out


@pytest.mark.parametrize("extra", [
    {"maxReadTasks": "1"}, {"maxReadTasks": "3"}, {"minPartitions": "20"},
    {"maxReadTasks": "4", "minPartitions": "4"},
], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_any_grouping_gives_the_rows_and_valve_of_one_task_per_partition(
    cluster: Cluster, tmp_path: Path, extra: dict[str, str]
) -> None:
    baseline = start(tmp_path / "one-per-partition", maxReadTasks="64")
    drive(cluster, baseline)
    cluster.logs.clear()
    cluster.now = 0
    run = start(tmp_path / "grouped", **extra)
    drive(cluster, run)
    assert run.epochs == baseline.epochs
    assert per_partition(run.rows) == per_partition(baseline.rows)
    assert [h.watermark for h in run.history] == [h.watermark for h in baseline.history]
    assert run.carriers == baseline.carriers
    # the carrier of each batch is the sink's combined watermark after the batch before
    assert run.carriers == [(n, run.history[n - 1].watermark) for n in range(1, run.epochs)
                            if run.history[n - 1].watermark != -2**63]
    assert run.sink.watermark > 30_000
    limit = int(extra.get("maxReadTasks", "0")) or int(extra.get("minPartitions", "0"))
    assert max(run.tasks) <= max(limit, 1)


def test_the_driver_reads_one_record_per_task_and_prunes_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    run = start(tmp_path, maxReadTasks="2")
    feed(cluster, 0)
    assert run.step()
    assert run.tasks == [2]
    records = tmp_path / TASKS_DIR
    assert len(list(records.iterdir())) == 2
    assert not [p for p in (tmp_path / "source").iterdir() if p.name != "~tasks"]
    store = run.reader._store
    for round_ in range(1, 6):
        feed(cluster, round_)
        cluster.now += 1_000
        reads = store._index.reads
        assert run.step()
        # planning this batch read the last batch's records once: one per task, not per partition
        assert store._index.reads - reads <= run.tasks[-2]
    # pruned as before: only records that hold a slice end at or after its partition's base
    assert len(list(records.iterdir())) <= 3 * 2 + 1


def test_committing_a_batch_prunes_without_an_fsync(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark commits the source inside every batch's walCommit: the records it forgets there
    are removed without waiting for the disk (a crash may bring one back, pruned next time)."""
    run = start(tmp_path, maxReadTasks="2")
    synced: list[str] = []
    monkeypatch.setattr(checkpointing.storage, "sync_local", synced.append)
    records = tmp_path / TASKS_DIR
    pruned = 0
    for round_ in range(4):
        feed(cluster, round_)
        cluster.now += 1_000
        assert run.step()
        before = len(list(records.iterdir()))
        synced.clear()
        run.reader.commit(run.offset)  # Spark, when it plans the next batch
        assert synced == []
        pruned += before - len(list(records.iterdir()))
    assert pruned > 0


def test_per_partition_records_of_an_older_checkpoint_still_count(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A checkpoint written before task records (one record per partition and slice): the
    driver finds generator states and markers there."""
    run = start(tmp_path, maxReadTasks="64")
    feed(cluster, 0)
    assert run.step()
    # rewrite the batch's task records as the per-partition records an older version wrote
    store = run.reader._store
    store.refresh()
    for name, slices in list(store._index.records.items()):
        for topic, partition, state, outcome in slices:
            store.save(topic, partition, state, outcome)
        (tmp_path / TASKS_DIR / name).unlink()
    reader = FlinkishStreamReader(run.reader._options)  # a restarted driver
    run.reader = reader
    reads = cluster.reads
    feed(cluster, 1)
    assert run.step()
    assert cluster.reads - reads == 11  # the batch's eleven slices, nothing re-read
    assert run.carriers[-1] == (1, run.history[0].watermark)


def test_a_missing_task_record_is_rebuilt_by_re_reading(cluster: Cluster, tmp_path: Path) -> None:
    run = start(tmp_path, maxReadTasks="2")
    feed(cluster, 0)
    assert run.step()
    for record in (tmp_path / TASKS_DIR).iterdir():
        record.unlink()
    run.reader = FlinkishStreamReader(run.reader._options)  # nothing in memory either
    reads = cluster.reads
    feed(cluster, 1)
    assert run.step()
    # the twelve slices' markers (re-reading them also records the states the eleven
    # partitions read on need), then the batch
    assert cluster.reads - reads == 12 + 11
    assert run.carriers[-1] == (1, run.history[0].watermark)


def test_the_first_task_carries_the_watermark_or_a_partition_of_its_own_does(
    cluster: Cluster, tmp_path: Path
) -> None:
    run = start(tmp_path, maxReadTasks="2")
    for p in range(12):
        cluster.add(p, 50_000 if p else 5_000)
    run.settle()
    cluster.add(1, 60_000)
    run.settle()
    cluster.now += 11_000  # partition 0 goes idle: a batch of status markers, then one that
    run.settle()           # only carries the released watermark
    kinds = []
    for start_, end in run.batches:
        parts = run.reader.partitions(start_, end)
        tasks = [p for p in parts if isinstance(p, ReadTaskInputPartition)]
        carried = [p.watermark for p in parts if isinstance(p, CarrierInputPartition)]
        carried += [p.carrier for p in tasks if p.carrier is not None]
        assert all(p.carrier is None for p in tasks[1:])
        assert carried in ([], [end[OFFSET_KEY]["watermark"]])
        kinds.append((len(tasks), len(carried)))
    assert kinds[0] == (2, 0)  # nothing combined before the first batch
    assert (2, 1) in kinds  # the first read task carries it
    assert (0, 1) in kinds  # a batch with nothing to read carries in a partition of its own
    assert run.sink.watermark == 60_000 - 1_000 - 1  # everything idle: the maximum
