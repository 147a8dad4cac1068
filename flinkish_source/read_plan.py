"""Which read tasks a micro-batch runs: Flink's model of a few readers, each owning many splits,
instead of Spark's task per partition (docs/architecture.md, "Offset planning").

With ``minPartitions`` large slices are split into pieces, as Spark's Kafka source splits them;
never under ``watermark.strategy=punctuated``, where a watermark depends on every flagged record
before it. Pure functions of the slices and the options, so a replayed batch gets the same tasks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from flinkish_source.options import SourceOptions, WatermarkKind
from flinkish_source.partition_reader import ReadTask, SlicePiece, SlicePlan

#: What a slice costs beyond its records, in records, when tasks are balanced: a slice with
#: nothing or little to read still costs a fetch and a few marker rows.
SLICE_COST = 200


def default_read_tasks() -> int:
    """The default of ``maxReadTasks``: the driver machine's cores. PySpark's driver-side
    reader has no SparkContext to ask for Spark's default parallelism (they agree under
    ``local[*]``)."""
    return max(1, os.cpu_count() or 1)


def task_limit(options: SourceOptions) -> int:
    """At most this many read tasks per batch."""
    limit = options.admission.max_read_tasks or default_read_tasks()
    return max(limit, options.admission.min_partitions or 0)


def _round(x: float) -> int:
    """Java's ``Math.round`` (half up), as Spark's calculator uses it."""
    return math.floor(x + 0.5)


def _part_count(size: int, total: int, min_parts: int) -> int:
    return max(_round(size / total * min_parts), 1)


def split(slices: Sequence[SlicePlan], min_partitions: int | None,
          splittable: bool = True) -> list[SlicePiece]:
    """Spark's ``KafkaOffsetRangeCalculator.getRanges`` on slices: with fewer slices with
    records than ``min_partitions``, large slices are split into about ``size / total *
    min_partitions`` nearly equal pieces."""
    pieces = [SlicePiece.whole(s) for s in slices]
    with_records = [s for s in slices if s.end > s.start]
    if not splittable or min_partitions is None or len(with_records) >= min_partitions:
        return pieces
    total = sum(s.end - s.start for s in with_records)
    unsplit = [s for s in with_records if _part_count(s.end - s.start, total, min_partitions) == 1]
    split_total = total - sum(s.end - s.start for s in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    out: list[SlicePiece] = []
    for s in slices:
        size = s.end - s.start
        if size <= 0 or any(u is s for u in unsplit):
            out.append(SlicePiece.whole(s))
            continue
        parts = min(_part_count(size, split_total, split_min), size)
        remaining, start = size, s.start
        for part in range(parts):
            this = remaining // (parts - part)
            remaining -= this
            out.append(SlicePiece(s, start, start + this))
            start += this
    return out


def group(pieces: Sequence[SlicePiece], limit: int) -> list[ReadTask]:
    """At most ``limit`` tasks, balanced by records (+ :data:`SLICE_COST` per piece): largest
    piece first, each to the least loaded task, the pieces of one slice to different tasks
    while there are enough. Within a task, pieces are in (topic, partition, offset) order."""
    if not pieces:
        return []
    count = min(limit, len(pieces))
    loads = [0] * count
    slices: list[set[tuple[str, int, int]]] = [set() for _ in range(count)]
    members: list[list[SlicePiece]] = [[] for _ in range(count)]

    def cost(p: SlicePiece) -> int:
        return p.end - p.start + SLICE_COST

    order = sorted(pieces, key=lambda p: (-cost(p), p.plan.topic, p.plan.partition, p.start))
    for piece in order:
        slice_key = (piece.plan.topic, piece.plan.partition, piece.plan.start)
        free = [i for i in range(count) if slice_key not in slices[i]] or list(range(count))
        target = min(free, key=lambda i: (loads[i], i))
        loads[target] += cost(piece)
        slices[target].add(slice_key)
        members[target].append(piece)
    tasks = [sorted(m, key=lambda p: (p.plan.topic, p.plan.partition, p.start)) for m in members]
    tasks.sort(key=lambda m: (m[0].plan.topic, m[0].plan.partition, m[0].start))
    return [ReadTask(i, tuple(m)) for i, m in enumerate(tasks)]


def plan_read_tasks(options: SourceOptions, slices: Sequence[SlicePlan]) -> list[ReadTask]:
    """The batch's read tasks for its slices (a pure function of the slices and options)."""
    splittable = options.event_time.watermark is not WatermarkKind.PUNCTUATED
    return group(split(slices, options.admission.min_partitions, splittable), task_limit(options))
