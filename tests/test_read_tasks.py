"""Read tasks (Flink's reader model) against a fake Kafka: a batch's grouped plan, with or
without ``minPartitions`` splitting large slices, yields exactly the records and markers of the
per-partition plan (``read_slice`` per slice), records the same generator states and slice
markers (one record per task), and the planning-time valve sees the same combined watermark."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import flinkish_source.kafka as kafka_source
from flinkish_source.options import SourceOptions, parse_options
from flinkish_source.partition_reader import (
    COALESCE_ROWS,
    ReadTask,
    SlicePiece,
    SlicePlan,
    read_slice,
    read_task,
)
from flinkish_source.read_plan import (
    SLICE_COST,
    default_read_tasks,
    group,
    plan_read_tasks,
    split,
    task_limit,
)
from flinkish_source.schema import arrow_schema
from flinkish_source.source_state import TASKS_DIR, SourceStateStore
from flinkish_source.watermark_strategy import GeneratorState

MAX = 9223372036854775807
ACTIVE, IDLE = "ACTIVE", "IDLE"


@dataclass
class Msg:
    _topic: str
    _partition: int
    _offset: int
    _ts: int
    _value: bytes | None = b"{}"
    _headers: list[tuple[str, bytes | None]] | None = None
    _ts_type: int = 1

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (self._ts_type, self._ts)

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition


@dataclass
class Logs:
    """Several partitions' records (gaps allowed: compacted offsets); replaces read_range."""

    logs: dict[tuple[str, int], list[Msg]] = field(default_factory=dict)
    chunk: int = 3
    calls: list[tuple[str, int, int, int]] = field(default_factory=list)

    def add(self, topic: str, partition: int, offset: int, ts: int, **extra: Any) -> None:
        self.logs.setdefault((topic, partition), []).append(Msg(topic, partition, offset, ts,
                                                                **extra))

    def read_range(self, options: Any, topic: str, partition: int, start: int, end: int,
                   chunk: int) -> Iterator[list[Msg]]:
        self.calls.append((topic, partition, start, end))
        wanted = [m for m in self.logs.get((topic, partition), []) if start <= m.offset() < end]
        step = min(self.chunk, chunk)
        for i in range(0, len(wanted), step):
            yield wanted[i:i + step]


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> Logs:
    fake = Logs()
    monkeypatch.setattr(kafka_source, "read_range", fake.read_range)
    return fake


def opts(state: Path | None, **extra: str) -> SourceOptions:
    raw = {"kafka.bootstrap.servers": "b:1", "subscribe": "t,u"}
    if state is not None:
        raw["checkpointing.location"] = str(state)
    return parse_options(raw | extra)


def by_partition(batches: list[pa.RecordBatch]) -> dict[tuple[str, int], list[tuple[Any, ...]]]:
    """Every output row (all columns, timestamps as integers), per partition, in order."""
    out: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for batch in batches:
        assert batch.schema.equals(arrow_schema("headers" in batch.schema.names))
        table = pa.Table.from_batches([batch])
        for name in ("timestamp", "eventTime"):
            at = table.schema.get_field_index(name)
            table = table.set_column(at, name, table.column(name).cast(pa.int64()))
        for row in table.to_pylist():
            out.setdefault((row["topic"], row["partition"]), []).append(tuple(row.values()))
    return out


def per_partition_plan(options: SourceOptions, plans: list[SlicePlan]) -> list[pa.RecordBatch]:
    return [b for plan in plans for b in read_slice(options, plan)]


def grouped(options: SourceOptions, plans: list[SlicePlan]) -> list[pa.RecordBatch]:
    return [b for task in plan_read_tasks(options, plans) for b in read_task(options, task)]


def recorded(location: Path, plans: list[SlicePlan]) -> list[Any]:
    """The generator state and slice outcome recorded for each slice that read offsets."""
    store = SourceStateStore(str(location))
    found = []
    for plan in plans:
        if plan.end > plan.start:
            outcomes = store.find_outcomes(plan.topic, plan.partition, plan.end)
            found.append((plan.topic, plan.partition,
                          store.find_state(plan.topic, plan.partition, plan.end),
                          [o.to_json() for o in outcomes]))
    return found


def scenario(kafka: Logs, base: dict[tuple[str, int], GeneratorState] | None = None
             ) -> list[SlicePlan]:
    """Slices of all kinds over two topics: new partitions, resumes from IDLE (one whose first
    offsets were compacted away), going IDLE, a bounded partition reaching its stop, a
    status-only slice and a large slice; event times out of order."""
    rng = random.Random(7)
    sizes = {("t", 0): 40, ("t", 1): 7, ("t", 2): 12, ("t", 3): 0, ("u", 0): 25, ("u", 1): 3}
    for (topic, part), n in sizes.items():
        for o in range(n):
            if (topic, part) == ("t", 2) and o in (4, 5, 6):
                continue  # compacted away
            kafka.add(topic, part, o, 1_000 * part + 37 * ((o * 7) % 13) + rng.randrange(50))

    def b(tp: tuple[str, int], at: int) -> GeneratorState:
        if base is not None and tp in base:
            return base[tp]
        return GeneratorState(at)

    return [
        SlicePlan("t", 0, 0, 40, None, ACTIVE, b(("t", 0), 0), None),
        SlicePlan("t", 1, 2, 7, IDLE, IDLE, GeneratorState(2, 900, 899), None),
        SlicePlan("t", 2, 4, 12, IDLE, ACTIVE, GeneratorState(4, 2_100, 2_099, 1), None),
        SlicePlan("t", 3, 0, 0, ACTIVE, IDLE, GeneratorState(0), None),
        SlicePlan("u", 0, 5, 25, ACTIVE, ACTIVE, GeneratorState(5, 300, 299), 25),
        SlicePlan("u", 1, 0, 3, None, IDLE, GeneratorState(0), 3),
    ]


CONFIGS = [
    {},
    {"maxReadTasks": "1"},
    {"maxReadTasks": "2"},
    {"maxReadTasks": "64"},
    {"minPartitions": "9"},
    {"maxReadTasks": "7", "minPartitions": "7"},
    {"minPartitions": "40"},
]
STRATEGIES = [
    {"watermark.maxOutOfOrderness": "150 ms"},
    {"watermark.strategy": "monotonous", "idleTimeout": "1 s"},
    {"eventTime.field": "ts", "eventTime.onError": "skip"},
    {"watermark.strategy": "none"},
    {"includeMarkers": "false"},
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: ",".join(s) or "default")
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(
    f"{k}={v}" for k, v in c.items()) or "default")
def test_grouped_plan_yields_the_records_and_markers_of_the_per_partition_plan(
    kafka: Logs, tmp_path: Path, strategy: dict[str, str], config: dict[str, str]
) -> None:
    plans = scenario(kafka)
    if "eventTime.field" in strategy:  # JSON event times, one unreadable
        for log in kafka.logs.values():
            for m in log:
                m._value = (b"{}" if m.offset() == 3 else
                            json.dumps({"ts": m._ts + 5}).encode())
    needs_state = "watermark.strategy" not in strategy or strategy.get(
        "watermark.strategy") != "none"
    needs_state = needs_state and "includeMarkers" not in strategy
    if not needs_state:
        plans = [replace(p, base=None) for p in plans]
    whole = opts(tmp_path / "whole" if needs_state else None, **strategy)
    split_opts = opts(tmp_path / "tasks" if needs_state else None, **strategy, **config)
    expected = by_partition(per_partition_plan(whole, plans))
    got = by_partition(grouped(split_opts, plans))
    assert got == expected
    if needs_state:
        assert recorded(tmp_path / "tasks", plans) == recorded(tmp_path / "whole", plans)
        tasks = plan_read_tasks(split_opts, plans)
        written = list((tmp_path / "tasks" / TASKS_DIR).iterdir())
        assert 1 <= len(written) <= len(tasks)  # one record per task, none per partition
        assert not [p for p in (tmp_path / "tasks" / "source").iterdir() if p.name != "~tasks"]


def test_punctuated_slices_are_grouped_but_never_split(kafka: Logs, tmp_path: Path) -> None:
    for o in range(30):
        flag = o % 4 == 1
        kafka.add("t", 0, o, 100 * o, _value=json.dumps({"wm": flag}).encode())
    plans = [SlicePlan("t", 0, 0, 30, None, ACTIVE, GeneratorState(0), None),
             SlicePlan("t", 1, 0, 0, None, IDLE, GeneratorState(0), None)]
    strategy = {"watermark.strategy": "punctuated", "watermark.punctuation.field": "wm"}
    grouped_opts = opts(tmp_path / "b", **strategy, minPartitions="8")
    assert [len(t.pieces) for t in plan_read_tasks(grouped_opts, plans)] == [1, 1]
    expected = by_partition(per_partition_plan(opts(tmp_path / "a", **strategy), plans))
    assert by_partition(grouped(grouped_opts, plans)) == expected
    assert recorded(tmp_path / "b", plans) == recorded(tmp_path / "a", plans)


def test_replaying_a_task_yields_identical_batches_and_rewrites_its_own_record(
    kafka: Logs, tmp_path: Path
) -> None:
    plans = scenario(kafka)
    options = opts(tmp_path, minPartitions="9", maxReadTasks="9")
    tasks = plan_read_tasks(options, plans)
    assert plan_read_tasks(options, plans) == tasks  # a pure function of slices and options
    first = [[b.to_pydict() for b in read_task(options, t)] for t in tasks]
    names = sorted(p.name for p in (tmp_path / TASKS_DIR).iterdir())
    again = [[b.to_pydict() for b in read_task(options, t)] for t in tasks]
    assert again == first
    assert sorted(p.name for p in (tmp_path / TASKS_DIR).iterdir()) == names


# ---------------------------------------------------------------- splitting, piece by piece


def rows_of(batches: list[pa.RecordBatch]) -> list[tuple[str, int, Any]]:
    out = []
    for batch in batches:
        d = batch.to_pydict()
        for kind, offset, wm, status in zip(d["kind"], d["offset"], d["watermark"], d["status"],
                                            strict=True):
            out.append((kind, offset, wm if kind == "watermark" else status))
    return out


def test_pieces_of_a_split_slice_each_emit_their_share(kafka: Logs, tmp_path: Path) -> None:
    for o in range(9):
        kafka.add("t", 0, o, [500, 100, 900, 300, 200, 800, 400, 700, 600][o])
    plan = SlicePlan("t", 0, 0, 9, None, IDLE, GeneratorState(0), 9)
    options = opts(tmp_path, idleTimeout="1 s", endingOffsets="latest")
    pieces = [SlicePiece(plan, 0, 3), SlicePiece(plan, 3, 6), SlicePiece(plan, 6, 9)]
    outputs = [rows_of(list(read_task(options, ReadTask(i, (p,))))) for i, p in enumerate(pieces)]
    assert outputs == [
        [("status", 0, ACTIVE), ("record", 0, None), ("record", 1, None), ("record", 2, None)],
        [("record", 3, None), ("record", 4, None), ("record", 5, None)],
        [("record", 6, None), ("record", 7, None), ("record", 8, None),
         ("watermark", 9, 899), ("watermark", 9, MAX), ("status", 9, IDLE)],
    ]
    # the last piece read the earlier pieces again for their event times; it alone recorded
    assert ("t", 0, 0, 6) in kafka.calls
    store = SourceStateStore(str(tmp_path))
    assert store.find_state("t", 0, 9) == GeneratorState(9, 900, MAX, 0)
    (outcome,) = store.find_outcomes("t", 0, 9)
    assert [(m.kind, m.offset) for m in outcome.markers] == [
        ("status", 0), ("watermark", 9), ("watermark", 9), ("status", 9)]
    assert len(list((tmp_path / TASKS_DIR).iterdir())) == 1


def test_a_resume_whose_first_piece_was_compacted_away(kafka: Logs, tmp_path: Path) -> None:
    for o in (5, 6, 7):
        kafka.add("t", 0, o, 10 * o)
    plan = SlicePlan("t", 0, 0, 8, IDLE, ACTIVE, GeneratorState(0, 5, 4), None)
    options = opts(tmp_path)
    pieces = [SlicePiece(plan, 0, 4), SlicePiece(plan, 4, 6), SlicePiece(plan, 6, 8)]
    outputs = [rows_of(list(read_task(options, ReadTask(i, (p,))))) for i, p in enumerate(pieces)]
    assert outputs == [
        [],
        [("status", 5, ACTIVE), ("record", 5, None)],
        [("record", 6, None), ("record", 7, None), ("watermark", 8, 69)],
    ]
    (outcome,) = SourceStateStore(str(tmp_path)).find_outcomes("t", 0, 8)
    assert [(m.kind, m.offset) for m in outcome.markers] == [("status", 5), ("watermark", 8)]


def test_a_resume_without_records_in_the_last_piece(kafka: Logs, tmp_path: Path) -> None:
    kafka.add("t", 0, 1, 50)
    plan = SlicePlan("t", 0, 0, 4, IDLE, IDLE, GeneratorState(0), None)
    options = opts(tmp_path)
    pieces = [SlicePiece(plan, 0, 2), SlicePiece(plan, 2, 4)]
    outputs = [rows_of(list(read_task(options, ReadTask(i, (p,))))) for i, p in enumerate(pieces)]
    assert outputs == [[("status", 1, ACTIVE), ("record", 1, None)],
                       [("watermark", 4, 49), ("status", 4, IDLE)]]


# ---------------------------------------------------------------- planning


def slice_(part: int, start: int, end: int, topic: str = "t") -> SlicePlan:
    return SlicePlan(topic, part, start, end, ACTIVE, ACTIVE, GeneratorState(start), None)


def covered(tasks: list[ReadTask]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for task in tasks:
        for p in task.pieces:
            out.setdefault((p.plan.topic, p.plan.partition), []).append((p.start, p.end))
    return {k: sorted(v) for k, v in out.items()}


def test_at_most_the_limit_balanced_and_every_slice_once() -> None:
    slices = [slice_(p, 0, 10 + 5 * p) for p in range(256)]
    tasks = group(split(slices, None), 4)
    assert len(tasks) == 4 and [t.index for t in tasks] == [0, 1, 2, 3]
    assert covered(tasks) == {("t", p): [(0, 10 + 5 * p)] for p in range(256)}
    loads = [sum(p.end - p.start + SLICE_COST for p in t.pieces) for t in tasks]
    assert max(loads) - min(loads) <= 10 + 5 * 255 + SLICE_COST
    for task in tasks:
        assert list(task.pieces) == sorted(task.pieces, key=lambda p: p.plan.partition)
    assert group(split(slices[:3], None), 8) == group(split(slices[:3], None), 3)
    assert len(group(split(slices[:3], None), 8)) == 3
    assert group([], 4) == []


def test_min_partitions_splits_like_sparks_kafka_source() -> None:
    # KafkaOffsetRangeCalculator: no split when enough slices have records
    slices = [slice_(0, 0, 100), slice_(1, 0, 1), slice_(2, 5, 5)]
    assert [(p.start, p.end) for p in split(slices, 2)] == [(0, 100), (0, 1), (5, 5)]
    # one large slice, one small: the small one stays whole, the large one takes the rest
    pieces = split(slices, 4)
    assert [(p.plan.partition, p.start, p.end) for p in pieces] == [
        (0, 0, 33), (0, 33, 66), (0, 66, 100), (1, 0, 1), (2, 5, 5)]
    # proportional to size (rounding half up) among the slices large enough to split: 2 of
    # 42 records is 0.57 of 12 parts, whole; 30 and 10 share the other 11: 8.25 and 2.75
    pieces = split([slice_(0, 10, 40), slice_(1, 0, 10), slice_(2, 0, 2)], 12)
    assert [(p.plan.partition, p.start, p.end) for p in pieces] == [
        (0, 10, 13), (0, 13, 16), (0, 16, 20), (0, 20, 24), (0, 24, 28), (0, 28, 32),
        (0, 32, 36), (0, 36, 40), (1, 0, 3), (1, 3, 6), (1, 6, 10), (2, 0, 2)]
    # never more pieces than records
    assert [(p.start, p.end) for p in split([slice_(0, 0, 3)], 10)] == [(0, 1), (1, 2), (2, 3)]
    assert split([slice_(0, 0, 100)], 4, splittable=False) == [SlicePiece.whole(slice_(0, 0, 100))]


def test_pieces_of_one_slice_go_to_different_tasks() -> None:
    slices = [slice_(0, 0, 1_000), slice_(1, 0, 10), slice_(2, 0, 10)]
    tasks = group(split(slices, 6), 6)
    for task in tasks:
        parts = [p.plan.partition for p in task.pieces]
        assert len(parts) == len(set(parts))
    assert sum(len(t.pieces) for t in tasks) == 6


def test_task_limit_defaults_to_the_driver_cores_and_min_partitions_raises_it(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert default_read_tasks() == 6
    assert task_limit(opts(None, includeMarkers="false")) == 6
    assert task_limit(opts(None, includeMarkers="false", maxReadTasks="3")) == 3
    assert task_limit(opts(None, includeMarkers="false", minPartitions="10")) == 10
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert default_read_tasks() == 1


@pytest.mark.parametrize(("extra", "message"), [
    ({"maxReadTasks": "0"}, "option maxReadTasks: '0' is not a positive whole number"),
    ({"minPartitions": "x"}, "option minPartitions: 'x' is not a positive whole number"),
    ({"maxReadTasks": "2", "minPartitions": "3"}, "minPartitions asks for more read tasks"),
])
def test_bad_task_options(extra: dict[str, str], message: str) -> None:
    from flinkish_source.options import OptionError

    with pytest.raises(OptionError, match=message):
        opts(None, **extra)


def test_small_batches_are_coalesced_in_order(kafka: Logs, tmp_path: Path) -> None:
    kafka.chunk = 1
    plans = []
    for p in range(100):
        for o in range(3):
            kafka.add("t", p, o, 10 * o)
        plans.append(SlicePlan("t", p, 0, 3, None, ACTIVE, GeneratorState(0), None))
    options = opts(tmp_path, maxReadTasks="1")
    (task,) = plan_read_tasks(options, plans)
    batches = list(read_task(options, task))
    assert sum(b.num_rows for b in batches) == 100 * 5
    assert len(batches) <= 100 * 5 // COALESCE_ROWS + 1
    assert by_partition(batches) == by_partition(per_partition_plan(
        opts(tmp_path / "whole"), plans))


def test_a_read_task_spaces_young_collections_while_it_runs_and_restores_them(
    kafka: Logs, tmp_path: Path
) -> None:
    import gc

    from flinkish_source.partition_reader import READ_GC_THRESHOLD

    plans = scenario(kafka)
    options = opts(tmp_path / "state")
    (task, *_) = plan_read_tasks(options, plans)
    before = gc.get_threshold()
    assert before[0] < READ_GC_THRESHOLD
    batches = read_task(options, task)
    next(batches)
    assert gc.get_threshold() == (READ_GC_THRESHOLD, *before[1:])
    list(batches)
    assert gc.get_threshold() == before

    failing = read_task(options, task)
    next(failing)
    with pytest.raises(RuntimeError):
        failing.throw(RuntimeError("the task was killed"))
    assert gc.get_threshold() == before
    abandoned = read_task(options, task)
    next(abandoned)
    abandoned.close()
    assert gc.get_threshold() == before


def test_each_recorded_slice_names_its_earliest_event_time(kafka: Logs, tmp_path: Path) -> None:
    plans = scenario(kafka)
    options = opts(tmp_path / "state", minPartitions="9")  # split slices fold earlier pieces
    grouped(options, plans)
    store = SourceStateStore(str(tmp_path / "state"))
    for plan in plans:
        if plan.end <= plan.start:
            continue
        times = [m.timestamp()[1] for m in kafka.logs[(plan.topic, plan.partition)]
                 if plan.start <= m.offset() < plan.end]
        (outcome,) = store.find_outcomes(plan.topic, plan.partition, plan.end)
        assert outcome.min_event_time == min(times)
