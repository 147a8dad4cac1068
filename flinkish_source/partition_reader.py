"""Reads one Kafka partition's slice of a micro-batch into Arrow batches, interleaving the
partition's watermark and status markers exactly where its generator emits them.

What a slice emits is a function of its :class:`SlicePlan` and of the records in Kafka, so a
replay yields the same rows. Marker rows carry ``offset`` = the position they apply at, so their
order survives a shuffle (sort on offset, status ACTIVE < watermark < status IDLE, watermark).
"""

from __future__ import annotations

import functools
import gc
import json
import logging
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pyarrow as pa

from flinkish_core.markers import KIND_RECORD, KIND_STATUS, KIND_WATERMARK, Marker
from flinkish_core.watermark import WatermarkStatus
from flinkish_source.event_time import EventTimeExtractor
from flinkish_source.options import SourceOptions, WatermarkKind
from flinkish_source.schema import arrow_schema
from flinkish_source.source_state import SliceOutcome, SourceStateStore
from flinkish_source.watermark_strategy import GeneratorState, WatermarkStrategy

logger = logging.getLogger(__name__)

CHUNK = 20_000
_TS_TYPE = {0: -1, 1: 0, 2: 1}  # librdkafka timestamp type -> Spark's timestampType
_MS = pa.timestamp("ms", "UTC")
_US = pa.timestamp("us", "UTC")


@dataclass(frozen=True)
class SlicePlan:
    """One partition's share of a micro-batch, as planned from the journaled offsets."""

    topic: str
    partition: int
    start: int
    end: int
    start_status: str | None  # None: the partition is new and must be announced
    end_status: str
    base: GeneratorState | None
    stop: int | None  # ending offset of a bounded partition
    # event times (ms) above this would push Spark's watermark past the combined one (the
    # carrier's event time, see flinkish_source.combined_watermark); None: no carrier yet
    horizon: int | None = None


@functools.cache
def _null_row(include_headers: bool) -> tuple[pa.Array, ...]:
    """One null of each output column, to build marker rows from."""
    return tuple(pa.nulls(1, f.type) for f in arrow_schema(include_headers))


@functools.cache
def _one() -> pa.Scalar:
    """Built on first use: converting a Python value makes pyarrow import pandas (0.2-0.3 s),
    which the driver-side reader process never needs."""
    return pa.scalar(1, pa.int64())


@functools.cache
def _compute() -> ModuleType:
    """``pyarrow.compute``, imported on first use (~30 ms): the driver-side reader never needs
    it."""
    import pyarrow.compute

    return pyarrow.compute


@functools.cache
def _kind_array(kind: str) -> pa.Array:
    return pa.array([kind], pa.string())


_OFFSET = arrow_schema(False).names.index("offset")  # the same with or without headers


class _Batches:
    """Builds output batches (records and markers) against the exact declared schema."""

    def __init__(self, plan: SlicePlan, include_headers: bool) -> None:
        self.plan = plan
        self.headers = include_headers
        self.schema = arrow_schema(include_headers)
        self.emitted: list[Marker] = []  # the slice's markers so far, in emission order
        self._marker_columns: list[pa.Array] | None = None

    def marker(self, position: int, kind: str, watermark: int | None = None,
               status: str | None = None) -> pa.RecordBatch:
        self.emitted.append(
            Marker(self.plan.topic, self.plan.partition, position, kind, watermark, status)
        )
        if self._marker_columns is None:
            columns = list(_null_row(self.headers))
            columns[self.schema.names.index("topic")] = pa.array([self.plan.topic], pa.string())
            columns[self.schema.names.index("partition")] = pa.array([self.plan.partition],
                                                                     pa.int32())
            self._marker_columns = columns
        columns = list(self._marker_columns)
        columns[_OFFSET] = pa.array([position], pa.int64())
        columns[-3] = _kind_array(kind)
        if watermark is not None:
            columns[-2] = pa.array([watermark], pa.int64())
        if status is not None:
            columns[-1] = pa.array([status], pa.string())
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def records(self, msgs: Sequence[Any], event_ms: list[int | None] | None) -> pa.RecordBatch:
        n = len(msgs)
        keys, values, offsets, ts, ts_type = _message_columns(msgs)
        columns: list[pa.Array] = [
            keys,
            values,
            pa.repeat(pa.scalar(self.plan.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.plan.partition, pa.int32()), n),
            offsets,
            ts,
            ts_type,
        ]
        if self.headers:
            columns.append(pa.array(
                [[{"key": k, "value": v} for k, v in (m.headers() or ())] for m in msgs],
                self.schema.field("headers").type,
            ))
        columns.append(
            ts if event_ms is None
            else pa.array([None if e is None else e * 1000 for e in event_ms],
                          pa.timestamp("us", "UTC"))
        )
        columns += [
            pa.repeat(pa.scalar(KIND_RECORD, pa.string()), n),
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _message_columns(msgs: Sequence[Any]) -> tuple[pa.Array, ...]:
    """Key, value, offset, timestamp and timestamp type columns of librdkafka's messages: one
    comprehension per field and Arrow's kernels for the rest (the per-record cost that counts)."""
    n = len(msgs)
    stamps = [m.timestamp() for m in msgs]
    kinds = [kind for kind, _ in stamps]
    first, last = msgs[0].offset(), msgs[-1].offset()
    if n > 64 and last - first + 1 == n:  # no gap (offsets only grow): first, first + 1, ...
        offsets = _compute().cumulative_sum(pa.repeat(_one(), n), start=first - 1)
    else:
        offsets = pa.array([m.offset() for m in msgs], pa.int64())
    if kinds.count(kinds[0]) == n:  # one timestamp type per partition, in practice
        ts_type = pa.repeat(pa.scalar(_TS_TYPE.get(kinds[0], -1), pa.int32()), n)
    else:
        ts_type = pa.array([_TS_TYPE.get(k, -1) for k in kinds], pa.int32())
    if kinds[0] and kinds.count(0) == 0:
        ts = pa.array([ms for _, ms in stamps], pa.int64()).cast(_MS).cast(_US)
    else:
        ts = pa.array([ms * 1000 if kind else None for kind, ms in stamps], _US)
    return (pa.array([m.key() for m in msgs], pa.binary()),
            pa.array([m.value() for m in msgs], pa.binary()), offsets, ts, ts_type)


def _flagged(options: SourceOptions, value: bytes | None, headers: Any) -> bool:
    """Does this record carry a punctuated watermark (its own event time)?"""
    if options.event_time.punctuation_header is not None:
        for name, raw in headers or ():
            if name == options.event_time.punctuation_header:
                text = (raw or b"").decode("utf-8", "replace").strip().lower()
                return text not in ("", "0", "false", "no")
        return False
    try:
        document = json.loads(value) if value is not None else None
    except ValueError:
        return False
    flag: Any = document
    for part in (options.event_time.punctuation_field or "").split("."):
        flag = flag.get(part) if isinstance(flag, dict) else None
    return bool(flag)


@dataclass(frozen=True)
class SlicePiece:
    """Offsets ``start..end-1`` of a slice, read by one task: the whole slice, or a piece of a
    large one ``minPartitions`` split (:mod:`flinkish_source.read_plan`). The pieces emit between
    them what the whole slice emits: the last one emits the end markers and records the state,
    after re-reading the earlier pieces' event times."""

    plan: SlicePlan
    start: int
    end: int

    @property
    def first(self) -> bool:
        return self.start == self.plan.start

    @property
    def last(self) -> bool:
        return self.end == self.plan.end

    @classmethod
    def whole(cls, plan: SlicePlan) -> SlicePiece:
        return cls(plan, plan.start, plan.end)


@dataclass(frozen=True)
class ReadTask:
    """What one Spark read task does: its pieces, one after the other, with one consumer."""

    index: int
    pieces: tuple[SlicePiece, ...]


@dataclass(frozen=True)
class SliceRecord:
    """What the last piece of a slice hands to the next batch's planning."""

    state: GeneratorState
    outcome: SliceOutcome
    topic: str
    partition: int


class _PieceReader:
    """Turns one piece's chunks of Kafka messages into record and marker batches."""

    def __init__(self, options: SourceOptions, piece: SlicePiece) -> None:
        plan = piece.plan
        self.options = options
        self.piece = piece
        self.plan = plan
        self.out = _Batches(plan, options.include_headers)
        self.markers = options.event_time.include_markers
        strategy = WatermarkStrategy.from_options(options.event_time)
        self.generator = (strategy.create_generator(plan.base)
                          if self.markers and plan.base is not None else None)
        self.extractor = EventTimeExtractor(options.event_time)
        self.punctuated = (self.generator is not None
                           and options.event_time.watermark is WatermarkKind.PUNCTUATED)
        self.status = plan.start_status
        self.before: list[Marker] = []  # markers earlier pieces emitted for the slice
        self.ahead = 0  # records beyond the horizon (see SlicePlan.horizon)
        self.earliest: int | None = None  # the slice's earliest event time (ms) so far

    def _saw(self, low: int | None) -> None:
        if low is not None and (self.earliest is None or low < self.earliest):
            self.earliest = low

    def begin(self) -> Iterator[pa.RecordBatch]:
        """[ACTIVE] at the slice's start; for a later piece, what the earlier ones left."""
        plan, piece = self.plan, self.piece
        if not self.markers:
            return
        if self.status is None:
            self.status = WatermarkStatus.ACTIVE.value
            if piece.first:
                yield self.out.marker(plan.start, KIND_STATUS, status=self.status)
            else:
                self.before.append(Marker(plan.topic, plan.partition, plan.start, KIND_STATUS,
                                          None, self.status))
        if piece.first:
            return
        if self.status != WatermarkStatus.ACTIVE.value or (
                piece.last and self.generator is not None):
            first = self._earlier(with_event_times=piece.last and self.generator is not None)
            if first is not None and self.status != WatermarkStatus.ACTIVE.value:
                self.status = WatermarkStatus.ACTIVE.value
                self.before.append(Marker(plan.topic, plan.partition, first, KIND_STATUS, None,
                                          self.status))

    def _earlier(self, with_event_times: bool) -> int | None:
        """The offset of the slice's first record before this piece (None: none); with
        ``with_event_times``, fold the event times of all of them into the generator."""
        from flinkish_source import kafka

        plan, generator = self.plan, self.generator
        first: int | None = None
        chunk = CHUNK if with_event_times else 1
        for msgs in kafka.read_range(self.options, plan.topic, plan.partition, plan.start,
                                     self.piece.start, chunk):
            if first is None:
                first = msgs[0].offset()
            if not with_event_times:
                break
            assert generator is not None
            if self.extractor.from_kafka_timestamp:
                times = []
                for m in msgs:
                    kind, ms = m.timestamp()
                    if not kind:
                        self.extractor.failed(plan.topic, plan.partition, m.offset(), None)
                        generator.on_event_time_error()
                    else:
                        times.append(ms)
            else:
                times = [t for t in _event_times(self.extractor, generator, plan, msgs)
                         if t is not None]
            self._saw(min(times) if times else None)
            generator.on_max_event_time(max(times) if times else None)
        return first

    def chunk(self, msgs: Sequence[Any]) -> Iterator[pa.RecordBatch]:
        plan, generator, extractor, out = self.plan, self.generator, self.extractor, self.out
        if self.markers and self.status != WatermarkStatus.ACTIVE.value:
            self.status = WatermarkStatus.ACTIVE.value
            yield out.marker(msgs[0].offset(), KIND_STATUS, status=self.status)
        event_ms = None if extractor.from_kafka_timestamp else _event_times(
            extractor, generator, plan, msgs
        )
        batch = out.records(msgs, event_ms)
        if plan.horizon is not None:
            self.ahead += _beyond(batch.column("eventTime"), plan.horizon)
        if generator is None:
            yield batch
            return
        # microseconds (None: no event time)
        extremes = _compute().min_max(batch.column("eventTime"))
        low, top = extremes["min"].value, extremes["max"].value
        self._saw(None if low is None else low // 1000)
        if self.punctuated:
            yield from _punctuate(self.options, out, generator, batch, msgs)
        else:
            column = batch.column("eventTime")
            if extractor.from_kafka_timestamp and column.null_count:
                for i in (j for j, m in enumerate(msgs) if not m.timestamp()[0]):
                    extractor.failed(plan.topic, plan.partition, msgs[i].offset(), None)
                    generator.on_event_time_error()
            generator.on_max_event_time(None if top is None else top // 1000)
            yield batch

    def finish(self) -> Iterator[pa.RecordBatch]:
        """The slice's end markers, from its last piece: [watermark] [MAX] [IDLE]."""
        plan, generator, out = self.plan, self.generator, self.out
        if self.piece.last:
            if generator is not None:
                watermark = generator.on_periodic_emit()
                if watermark is not None:
                    yield out.marker(plan.end, KIND_WATERMARK, watermark=watermark)
                if plan.stop is not None and plan.end >= plan.stop:
                    final = generator.on_end_of_input()
                    if final is not None:
                        yield out.marker(plan.end, KIND_WATERMARK, watermark=final)
            if self.markers and plan.end_status != self.status:
                yield out.marker(plan.end, KIND_STATUS, status=plan.end_status)
        if self.ahead:
            logger.warning(
                "%s/%s offsets %s..%s: %s records have event times more than the horizon "
                "(watermark.horizon) ahead of the combined watermark; they push Spark's own "
                "watermark past it, so stateful operators may drop lagging partitions' rows "
                "as late. Raise watermark.horizon above the largest skew between partitions.",
                plan.topic, plan.partition, self.piece.start, self.piece.end - 1, self.ahead,
            )

    def record(self) -> SliceRecord | None:
        """What the last piece of a slice that read offsets hands over (None otherwise)."""
        plan = self.plan
        if (self.generator is None or not self.options.state_location or not self.piece.last
                or plan.end <= plan.start):
            return None
        outcome = SliceOutcome(plan.start, plan.start_status, plan.end_status,
                               tuple(self.before) + tuple(self.out.emitted), self.earliest)
        return SliceRecord(self.generator.state(plan.end), outcome, plan.topic, plan.partition)


def read_slice(options: SourceOptions, plan: SlicePlan) -> Iterator[pa.RecordBatch]:
    """Stream the slice: [ACTIVE] records/[punctuated watermarks] [watermark] [MAX] [IDLE];
    then record the generator state and the slice's markers at
    ``source/<topic>/<partition>/<end>``."""
    record = yield from _read_piece(options, SlicePiece.whole(plan))
    if record is not None:
        assert options.state_location is not None
        SourceStateStore(options.state_location).save(
            plan.topic, plan.partition, record.state, record.outcome
        )


def _read_piece(options: SourceOptions, piece: SlicePiece
                ) -> Generator[pa.RecordBatch, None, SliceRecord | None]:
    """Stream one piece of a slice; what its slice hands to the next batch, if it is the
    slice's last piece."""
    from flinkish_source import kafka

    reader = _PieceReader(options, piece)
    yield from reader.begin()
    for msgs in kafka.read_range(options, piece.plan.topic, piece.plan.partition, piece.start,
                                 piece.end, CHUNK):
        yield from reader.chunk(msgs)
    yield from reader.finish()
    return reader.record()


#: Output batches with fewer rows than this are merged with their neighbours (in order) before
#: they go to Spark: many small partitions would otherwise make many one-row marker batches.
COALESCE_ROWS = 4096


def _coalesced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The same rows in the same order, small batches merged."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if batch.num_rows >= COALESCE_ROWS:
            if pending:
                yield _concat(pending)
                pending, rows = [], 0
            yield batch
            continue
        pending.append(batch)
        rows += batch.num_rows
        if rows >= COALESCE_ROWS:
            yield _concat(pending)
            pending, rows = [], 0
    if pending:
        yield _concat(pending)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


#: Allocations of container objects between two young-generation collections while a read task
#: runs (Python's default is 700).
READ_GC_THRESHOLD = 50_000


def read_task(options: SourceOptions, task: ReadTask) -> Iterator[pa.RecordBatch]:
    """Stream a read task's pieces one after the other with one consumer that fetches ahead;
    then record the generator state and markers of each slice it finished, in one record.

    A read task allocates a few objects per record, almost none in cycles; at Python's default
    threshold the cyclic collector rescanned the worker's long-lived objects, ~40% of a task's
    CPU: young collections are spaced out while it runs."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], READ_GC_THRESHOLD), *thresholds[1:])
    try:
        yield from _coalesced(_read_task(options, task))
    finally:
        gc.set_threshold(*thresholds)


def _read_task(options: SourceOptions, task: ReadTask) -> Iterator[pa.RecordBatch]:
    from flinkish_source import kafka

    ranges = [(p.plan.topic, p.plan.partition, p.start, p.end) for p in task.pieces]
    records: list[SliceRecord] = []
    with kafka.reading(options, ranges, CHUNK):
        for piece in task.pieces:
            record = yield from _read_piece(options, piece)
            if record is not None:
                records.append(record)
    if records:
        assert options.state_location is not None
        SourceStateStore(options.state_location).save_task(
            [(r.topic, r.partition, r.state, r.outcome) for r in records]
        )


def _beyond(event_time: pa.Array, horizon_ms: int) -> int:
    """How many event times lie after ``horizon_ms``."""
    pc = _compute()
    micros = event_time.cast(pa.int64())
    top = pc.max(micros).as_py()
    if top is None or top <= horizon_ms * 1000:
        return 0
    return int(pc.sum(pc.greater(micros, horizon_ms * 1000)).as_py() or 0)


def _event_times(
    extractor: EventTimeExtractor, generator: Any, plan: SlicePlan, msgs: Sequence[Any]
) -> list[int | None]:
    times: list[int | None] = []
    for m in msgs:
        event_time, raw = extractor.extract(m.value(), m.headers())
        if event_time is None:
            extractor.failed(plan.topic, plan.partition, m.offset(), raw)
            if generator is not None:
                generator.on_event_time_error()
            else:
                logger.warning(
                    "%s/%s offset %s: no event time (eventTime.onError=skip)",
                    plan.topic, plan.partition, m.offset(),
                )
        times.append(event_time)
    return times


def _punctuate(
    options: SourceOptions, out: _Batches, generator: Any, batch: pa.RecordBatch,
    msgs: Sequence[Any],
) -> Iterator[pa.RecordBatch]:
    """Split the batch right after each flagged record and emit its watermark there."""
    event_us = batch.column("eventTime").cast(pa.int64()).to_pylist()
    begin = 0
    for i, m in enumerate(msgs):
        if event_us[i] is None or not _flagged(options, m.value(), m.headers()):
            continue
        watermark = generator.on_punctuation(event_us[i] // 1000)
        if watermark is not None:
            yield batch.slice(begin, i + 1 - begin)
            yield out.marker(m.offset() + 1, KIND_WATERMARK, watermark=watermark)
            begin = i + 1
    if begin < len(msgs):
        yield batch.slice(begin)
