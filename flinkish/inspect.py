"""``flinkish inspect``: where a query stands, read from its checkpoint store.

Reads only (``CheckpointStore.reader``), so it is safe beside a running query.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from checkpointing import CheckpointStorage, CheckpointStore
from checkpointing.query import resolve_store
from flinkish.lag import SourceLag, combined, json_value, source_lags
from flinkish_core.durations import format_duration
from flinkish_core.epoch_valve import EpochWatermark, advance
from flinkish_core.watermark import MAX_WATERMARK, MIN_WATERMARK
from flinkish_sink.target import WATERMARK_SPARK, WATERMARK_VALVE
from flinkish_sink.two_phase_commit import published_watermark
from flinkish_source.combined_watermark import OFFSET_KEY, PlanningValve
from flinkish_source.offset_planner import Positions
from flinkish_source.offset_planner import from_json as offset_from_json


@dataclass(frozen=True)
class EpochRow:
    epoch: int
    state: str  # "completed" or "pending" (decided, not yet completed)
    committed_at: int | None  # epoch ms
    watermark: int | None
    status: str | None
    idle_partitions: tuple[str, ...]
    rows: int | None
    late_rows: int | None
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: where ``watermark`` comes from: "valve" (the combined watermark of the source's
    #: markers), "spark" (Spark's event-time watermark of the batch: the rows carried no
    #: markers), None without one
    watermark_source: str | None = None
    #: the combined watermark the source journaled for the batch (Spark's offsets log), shown
    #: where the sink recorded Spark's watermark (see :func:`with_source_journal`)
    journaled_watermark: int | None = None


#: Said beside epochs whose watermark is Spark's (a query through with_watermark)
SPARK_EVENT_TIME_NOTE = (
    "Spark's progress (lastProgress eventTime) counts the row that carries the combined "
    "watermark into Spark: its max runs the horizon (a day by default) ahead of the data, the "
    "year 9999 once the input ended. The watermarks here are the true figures.")


class LocationNotFoundError(FileNotFoundError):
    """The location given to ``inspect`` does not exist (a typo, or the query never ran)."""


def _exists(location: str) -> bool:
    """Whether ``location`` (a local path or a ``pyarrow.fs`` URI) exists, without creating it
    (opening a checkpoint storage creates its directory)."""
    import pyarrow.fs as pafs

    from flinkish_core.locations import filesystem_of

    try:
        filesystem, path = filesystem_of(location, "the location")
    except ValueError:
        return True  # opening the storage reports it, with any credentials masked
    return bool(filesystem.get_file_info(path).type != pafs.FileType.NotFound)


def load_epochs(location: str) -> list[EpochRow]:
    """Every epoch the sink recorded at ``location`` (a query's checkpointLocation or its
    store); LocationNotFoundError when there is nothing at that location."""
    if not _exists(location):
        raise LocationNotFoundError(
            f"{location} does not exist: give the query's checkpointLocation (or the sink's "
            "store, its flinkish/ directory)")
    store = CheckpointStore.reader(CheckpointStorage.open(resolve_store(location)))
    rows = []
    for epoch in store.completed_ids():
        done = store.completed(epoch)
        if done is None:
            continue
        result = EpochWatermark.from_json(done.state["watermark"])
        watermark, source = published_watermark(result, done.state)
        rows.append(EpochRow(
            epoch, "completed", done.completed_ms, _wm(watermark), result.status,
            tuple(result.idle_partitions), done.state.get("rows"), done.state.get("late_rows"),
            result.partitions, source,
        ))
    for epoch in store.pending_ids():
        pending = store.pending(epoch)
        if pending is not None:
            rows.append(EpochRow(epoch, "pending", None, None, None, (),
                                 pending.state.get("rows"), pending.state.get("late_rows")))
    return rows


def held_partitions(checkpoint_location: str) -> dict[int, list[str]]:
    """Batch id -> the partitions watermark alignment held back in it (read nothing)."""
    return _alignment(checkpoint_location, "held")


def capped_partitions(checkpoint_location: str) -> dict[int, list[str]]:
    """Batch id -> the partitions watermark alignment let read less than their share in it."""
    return _alignment(checkpoint_location, "capped")


def _alignment(checkpoint_location: str, decision: str) -> dict[int, list[str]]:
    """Batch id -> the partitions whose journaled position has ``decision`` set."""
    batches: dict[int, list[str]] = {}
    for batch, _, offsets in offsets_log(checkpoint_location):
        names = [f"{topic}/{p}" for positions in _positions(offsets)
                 for (topic, p), pos in positions.items() if getattr(pos, decision)]
        if names:
            batches[batch] = sorted(names)
    return batches


def reading_batches(checkpoint_location: str) -> dict[int, int]:
    """Batch id -> how many records its flinkish sources planned to read, for the batches that
    read any (from the previous batch's end offsets, or where the partition entered)."""
    out: dict[int, int] = {}
    before: dict[tuple[str, int], int] = {}
    for batch, _, offsets in offsets_log(checkpoint_location):
        count = 0
        for positions in _positions(offsets):
            for key, pos in positions.items():
                count += max(0, pos.offset - before.get(key, pos.first))
                before[key] = pos.offset
        if count:
            out[batch] = count
    return out


def nothing_to_draw(rows: list[EpochRow], read: Mapping[int, int]) -> str | None:
    """Why the plot of ``rows`` would hold no point, in words (None when it holds some).
    ``read``: :func:`reading_batches`."""
    done = [r for r in rows if r.state == "completed"]
    if not done:
        return "Nothing to draw: no epoch is completed yet."
    series = plot_series(done)
    if any(series.partitions.values()) or series.combined or series.spark:
        return None
    ended = [r.epoch for r in done if r.watermark is not None and is_end_of_time(r.watermark)]
    if read:
        batches = sorted(read)
        what = (f"one batch ({batches[0]}) read the whole input, {read[batches[0]]} records"
                if len(batches) == 1 else
                f"batches {number_ranges(batches)} read {sum(read.values())} records")
    else:
        what = "no batch read a record"
    if ended:
        return (f"Nothing to draw: {what}, and the watermark went from none yet straight to "
                f"the end of time in epoch {ended[0]} (every partition reached its end, "
                "endingOffsets, which closes every window): no epoch recorded a watermark in "
                "between.")
    return (f"Nothing to draw: {what}, and no epoch recorded a watermark yet (a partition "
            "without records holds the combined watermark back until it goes idle).")


def number_ranges(numbers: list[int]) -> str:
    """Sorted numbers with runs as ranges: ``0-3, 5``; ``none`` for none."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "none"


def lags(checkpoint_location: str) -> dict[int, SourceLag]:
    """Batch id -> how far its flinkish sources were behind when Spark planned it
    (``flinkish.lag``), from Spark's offsets log."""
    out = {}
    for batch, metadata, offsets in offsets_log(checkpoint_location):
        planned = metadata.get("batchTimestampMs")
        if planned is None:
            continue
        progress = {"batchId": batch, "sources": [{"endOffset": o} for o in offsets]}
        lag = combined(source_lags(progress, now_ms=int(planned)))
        if lag is not None:
            out[batch] = lag
    return out


def journaled_watermarks(checkpoint_location: str) -> dict[int, EpochWatermark]:
    """Batch id -> the valve as the flinkish source journaled it in the batch's end offset
    (Spark's ``offsets/N``) when planning it: what the batch's carrier row brought to Spark."""
    out = {}
    for batch, _, offsets in offsets_log(checkpoint_location):
        for offset in offsets:
            if isinstance(offset, Mapping) and OFFSET_KEY in offset:
                before = PlanningValve.from_offset(offset).before
                valve = advance(before, batch, [])  # the restored valve, per partition
                out[batch] = replace(valve, partitions=_announced(valve.partitions, offset))
                break  # of several flinkish sources (a union, a join), the first
    return out


def _announced(partitions: dict[str, dict[str, Any]], offset: Mapping[str, Any]
               ) -> dict[str, dict[str, Any]]:
    """``partitions`` with the status (ACTIVE or IDLE) their journaled positions announced: the
    valve is journaled as it stood before the last batch that read anything."""
    out = dict(partitions)
    for (topic, p), pos in next(_positions([offset]), {}).items():
        name = f"{topic}/{p}"
        if name in out and pos.status in ("ACTIVE", "IDLE") and out[name].get("status") in (
                "ACTIVE", "IDLE"):
            out[name] = {**out[name], "status": pos.status}
    return out


def with_source_journal(rows: list[EpochRow], checkpoint_location: str) -> list[EpochRow]:
    """``rows`` where the sink recorded Spark's watermark (its rows carried no markers),
    completed with the valve the source journaled for the same batch."""
    journal = journaled_watermarks(checkpoint_location)
    # before the first carrier with a combined watermark, Spark's is a record's event time
    # minus the horizon, no watermark of the data: none yet
    first = min((b for b, v in journal.items() if _wm(v.watermark) is not None), default=None)
    out = []
    for row in rows:
        valve = journal.get(row.epoch)
        if row.watermark_source == WATERMARK_SPARK and first is not None and row.epoch <= first:
            row = replace(row, watermark=None)
        if row.watermark_source == WATERMARK_SPARK and not row.partitions and valve is not None:
            row = replace(row, partitions=valve.partitions,
                          idle_partitions=tuple(valve.idle_partitions),
                          journaled_watermark=_wm(valve.watermark))
        out.append(row)
    return out


def _positions(offsets: list[Any]) -> Iterator[Positions]:
    """Each flinkish source's journaled positions among a batch's ``offsets``, by (topic,
    partition); another source's offset is skipped."""
    for offset in offsets:
        try:
            yield offset_from_json(offset)
        except (ValueError, AttributeError):
            continue


def offsets_log(checkpoint_location: str) -> list[tuple[int, dict[str, Any], list[Any]]]:
    """(batch id, batch metadata, each source's offset) from ``<checkpointLocation>/offsets/N``
    in batch order; empty when the location is not a query's checkpoint."""
    import posixpath

    import pyarrow.fs as pafs

    from flinkish_core.locations import filesystem_of

    filesystem, base = filesystem_of(checkpoint_location, "checkpoint location")
    directory = posixpath.join(base, "offsets")
    found = filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    batches = []
    for info in found:
        if not info.base_name.isdigit():
            continue
        with filesystem.open_input_stream(info.path) as stream:
            lines = stream.read().decode("utf-8").splitlines()
        parsed = [json_value(line) for line in lines[1:]]  # None: an offset not in JSON
        if parsed and isinstance(parsed[0], dict):
            batches.append((int(info.base_name), parsed[0], parsed[1:]))
    return sorted(batches, key=lambda b: b[0])


#: Watermarks from here on are the end of the input, not a time: the carrier's event time, and
#: a target's epochs table, clamp Long.MAX to the last instant their timestamps hold.
_END_OF_TIME_MS = int(datetime(9999, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)


def is_end_of_time(value: int) -> bool:
    """Whether a watermark says the input ended rather than a time."""
    return value == MAX_WATERMARK or value >= _END_OF_TIME_MS


def _wm(value: Any) -> int | None:
    return None if value is None or int(value) == MIN_WATERMARK else int(value)


#: How every watermark past the last event time is shown
END_OF_TIME = "end of time"


def format_watermark(value: int | None, with_date: bool = True) -> str:
    """Epoch milliseconds as UTC time; none yet as "-", the end of the input as
    :data:`END_OF_TIME`."""
    if value is None or value == MIN_WATERMARK:
        return "-"
    if is_end_of_time(value):
        return END_OF_TIME
    shape = "%Y-%m-%d %H:%M:%S.%f" if with_date else "%H:%M:%S.%f"
    return datetime.fromtimestamp(value / 1000, timezone.utc).strftime(shape)[:-3]


def _short(names: tuple[str, ...], topics: set[str]) -> str:
    """Idle partitions as numbers when the query reads one topic."""
    return ", ".join(n.rsplit("/", 1)[1] if len(topics) == 1 else n for n in names) or "-"


def table(rows: list[EpochRow]) -> Any:
    from rich import box
    from rich.table import Table

    topics = {n.rsplit("/", 1)[0] for r in rows for n in r.partitions}
    # event time and processing time are seldom on the same day: a date is left out of a
    # column only where the caption states it for every value shown
    days = {format_watermark(r.committed_at)[:10] for r in rows if r.committed_at}
    marks = {format_watermark(r.watermark)[:10] for r in rows
             if r.watermark is not None and _on_chart(r.watermark)}
    one_day = len(days) == 1
    marks_that_day = one_day and bool(marks) and marks <= days
    title = "flinkish epochs" + (f" of topic {next(iter(topics))}" if len(topics) == 1 else "")
    spark = any(r.watermark_source == WATERMARK_SPARK for r in rows)
    day = next(iter(days)) if one_day else ""
    # no outer edge, one space between columns: the table stays whole at 80 columns
    out = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=0,
                caption="times in UTC" + (
        (f", all on {day}" if marks_that_day else f", committed on {day}") if one_day else ""
    ) + (
        "; *: Spark's event-time watermark of the batch (its rows carried no markers; "
        "through with_watermark it is the combined watermark)" if spark else ""))
    for header in ("epoch", "state", "committed\nat", "combined\nwatermark", "idle\npartitions",
                   "rows", "late\nrows"):
        out.add_column(header, no_wrap=True,
                       justify="right" if header in ("epoch", "rows", "late\nrows") else "left")
    for r in rows:
        out.add_row(
            str(r.epoch), r.state,
            format_watermark(r.committed_at, not one_day)[:-4] if r.committed_at else "-",
            format_watermark(r.watermark, not marks_that_day)
            + (" *" if r.watermark_source == WATERMARK_SPARK and r.watermark is not None
               else ""),
            _short(r.idle_partitions, topics),
            "-" if r.rows is None else str(r.rows),
            "-" if r.late_rows is None else str(r.late_rows))
    return out


def lag_table(lag: Mapping[int, SourceLag]) -> Any:
    """Per batch (= epoch), from :func:`lags`: offsets behind latest, watermark lag, idle times."""
    from rich import box
    from rich.table import Table

    out = Table(title="lag when each batch was planned", box=box.SIMPLE_HEAD, show_edge=False,
                padding=0, caption="offsets: records in Kafka not yet planned, per partition")
    for header in ("batch", "offsets behind\nmin / max / avg", "watermark\nlag"):
        out.add_column(header, no_wrap=True, justify="right" if header == "batch" else "left")
    out.add_column("idle for", ratio=1)  # the one column that wraps: a list of partitions
    topics = {name.rsplit("/", 1)[0] for figures in lag.values() for name in figures.idle_ms}
    for batch, figures in sorted(lag.items()):
        out.add_row(
            str(batch),
            f"{figures.min_offsets_behind_latest} / {figures.max_offsets_behind_latest} / "
            f"{figures.avg_offsets_behind_latest:.1f}",
            "-" if figures.watermark_lag_ms is None
            else format_duration(figures.watermark_lag_ms / 1000),
            ", ".join(f"{_short((tp,), topics)}: {format_duration(ms / 1000)}"
                      for tp, ms in sorted(figures.idle_ms.items())) or "-")
    return out


@dataclass(frozen=True)
class PlotSeries:
    """What :func:`plot` draws, as (epoch, watermark ms) points."""

    partitions: dict[str, list[tuple[int, int]]]
    idle: dict[str, list[tuple[int, int]]]
    combined: list[tuple[int, int]]
    spark: list[tuple[int, int]]


def _on_chart(value: int) -> bool:
    """Long.MIN/MAX and the end of the input are not times: they stay off the chart."""
    return value != MIN_WATERMARK and not is_end_of_time(value)


def _coinciding(series: PlotSeries) -> dict[tuple[str, ...], list[tuple[int, int]]]:
    """Partitions grouped by identical points and idleness: one line each, as a line drawn
    over another would hide it."""
    groups: dict[Any, list[str]] = {}
    for name, points in series.partitions.items():
        groups.setdefault((tuple(points), tuple(series.idle.get(name, []))), []).append(name)
    return {tuple(names): list(key[0]) for key, names in groups.items()}


def plot_series(rows: list[EpochRow]) -> PlotSeries:
    """The points :func:`plot` draws from the completed epochs of ``rows``."""
    done = [r for r in rows if r.state == "completed"]
    names = sorted({n for r in done for n in r.partitions})
    partitions: dict[str, list[tuple[int, int]]] = {}
    idle: dict[str, list[tuple[int, int]]] = {}
    for name in names:
        for r in done:
            state = r.partitions.get(name, {})
            watermark = _wm(state.get("watermark"))
            if watermark is not None and _on_chart(watermark):
                partitions.setdefault(name, []).append((r.epoch, watermark))
                if state.get("status") == "IDLE":
                    idle.setdefault(name, []).append((r.epoch, watermark))
    combined = []
    for r in done:
        value = r.watermark if r.watermark_source == WATERMARK_VALVE else r.journaled_watermark
        if value is not None and _on_chart(value):
            combined.append((r.epoch, value))
    # (Spark's watermark before the first carrier reached it is none yet: with_source_journal)
    spark = [(r.epoch, r.watermark) for r in done
             if r.watermark_source == WATERMARK_SPARK and r.watermark is not None
             and _on_chart(r.watermark)]
    return PlotSeries(partitions, idle, combined, spark)


def plot(rows: list[EpochRow], path: str, lag: Mapping[int, SourceLag] | None = None,
         read: Mapping[int, int] | None = None) -> None:
    """Per-partition watermarks (hollow where idle), the combined one and Spark's over epochs,
    coinciding lines drawn once; below, the records the partition furthest behind still had to
    read. With nothing to draw, the PNG says why (``read``: :func:`reading_batches`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    done = [r for r in rows if r.state == "completed"]
    if not done:
        raise ValueError("no completed epochs to plot yet")
    empty = nothing_to_draw(done, read or {})
    if empty is not None:  # words, not empty axes
        fig = plt.figure(figsize=(10, 3))
        fig.text(0.03, 0.9, "flinkish: per-partition and combined watermarks", fontsize=12,
                 va="top")
        fig.text(0.03, 0.7, textwrap.fill(empty, 100), fontsize=10, va="top")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return

    def when(value: int) -> float:
        return float(mdates.date2num(datetime.fromtimestamp(value / 1000, timezone.utc)))

    series = plot_series(done)
    epochs = {r.epoch for r in done}
    behind = sorted(e for e in (lag or {}) if e in epochs)
    if lag and any(lag[e].max_offsets_behind_latest for e in behind):
        fig, (ax, below) = plt.subplots(2, 1, figsize=(10, 7.5), sharex=True,
                                        gridspec_kw={"height_ratios": [3, 1]})
        below.bar(behind, [lag[e].max_offsets_behind_latest for e in behind], color="tab:red",
                  alpha=0.6)
        below.set_title("records in Kafka not yet read when the batch was planned "
                        "(the partition furthest behind)", fontsize=9, loc="left")
        below.set_ylabel("records")
        below.grid(alpha=0.3)
    else:  # nothing was ever behind: no panel of zeros
        fig, ax = plt.subplots(figsize=(10, 5.5))
        below = None

    def draw(points: list[tuple[int, int]], **style: Any) -> Any:
        return ax.plot([e for e, _ in points], [when(w) for _, w in points], **style)[0]

    lines = _coinciding(series)
    for i, (names, points) in enumerate(lines.items()):
        # each line a little wider than the next: where lines meet, those below still show
        under = min(len(lines) - 1 - i, 4)
        line = draw(points, marker="o", markersize=4 + 2 * under, linewidth=1.2 + 1.5 * under,
                    label=" = ".join(names))
        idle = series.idle.get(names[0], [])
        if idle:
            ax.scatter([e for e, _ in idle], [when(w) for _, w in idle], s=70,
                       facecolors="white", edgecolors=line.get_color(), zorder=3)
    draw(series.combined, color="black", linewidth=6, alpha=0.3, zorder=1,
         label="combined watermark (valve)")
    if series.spark:
        draw(series.spark, color="black", linewidth=1.5, linestyle="--", zorder=2,
             label="Spark's watermark (recorded by the sink)")
    (below if below is not None else ax).set_xlabel("epoch (micro-batch id = checkpoint id)")
    ax.set_ylabel("watermark (event time, UTC)")
    ax.set_title("flinkish: per-partition and combined watermarks (hollow = idle)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.yaxis_date(tz=timezone.utc)
    ax.yaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
