"""Flink's window operator on Spark: ``flinkish.windows.window(df, key=..., assigner=...)``.

The core's :class:`~flinkish_core.windowing.WindowOperator` runs in one
``applyInPandasWithState`` operator on the combined watermark of :func:`flinkish.with_watermark`,
one state entry per key group; every late record comes out as a ``'late'`` row or re-fires its
window. docs/windows.md, "How it runs", says how and why.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from operator import itemgetter
from typing import Any

from flinkish_core.durations import parse_duration_ms
from flinkish_core.errors import OptionError
from flinkish_core.watermark import SPARK_DELAY_KEY
from flinkish_core.window_output import KIND, LATE, LATE_COLUMN, PANE_COLUMNS, RESULT
from flinkish_core.windowing import (
    AggregateFunction,
    Avg,
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    Count,
    CountEvictor,
    CountTrigger,
    DeltaEvictor,
    EventTimeSessionWindows,
    EventTimeTrigger,
    Evictor,
    GlobalWindow,
    GlobalWindows,
    Max,
    Min,
    ProcessingTimeTrigger,
    ProcessWindowFunction,
    PurgingTrigger,
    ReduceFunction,
    SlidingEventTimeWindows,
    Sum,
    TimeEvictor,
    TimeWindow,
    Trigger,
    TriggerResult,
    TumblingEventTimeWindows,
    WindowAssigner,
    WindowContext,
    WindowOperator,
    WindowOutput,
)

__all__ = [
    "AggregateFunction", "Avg", "ContinuousEventTimeTrigger", "ContinuousProcessingTimeTrigger",
    "Count", "CountEvictor", "CountTrigger", "DeltaEvictor", "EventTimeTrigger", "Evictor",
    "Max", "Min", "ProcessWindowFunction", "ProcessingTimeTrigger", "PurgingTrigger",
    "ReduceFunction", "Sum", "TimeEvictor", "Trigger", "TriggerResult", "WindowAssigner",
    "WindowContext", "global_windows", "ms", "session", "sliding", "split", "tumbling", "window",
]

#: The event time (ms) handed to the operator: a plain column, so Spark's late filter skips it.
_TIME = "__flinkish_event_ms"
_VALUE = "__flinkish_value"
_GROUP = "__flinkish_key_group"
_JSON_TYPES = frozenset(
    {"tinyint", "smallint", "int", "bigint", "float", "double", "string", "boolean"})
APPLY_IN_PANDAS_WITH_STATE = "applyInPandasWithState"
#: flinkish 0.1's operator, whose checkpoints this version cannot continue
TRANSFORM_WITH_STATE = "transformWithState"
#: Key groups when window() is not given them. A visit of a group has a fixed cost (PySpark's
#: pandas work) plus the Python of all its keys' state, and the number caps the operator's
#: parallelism (docs/windows.md has the measurements behind 32).
DEFAULT_KEY_GROUPS = 32
#: what a query on a checkpoint of flinkish 0.1's window operator is told
UNSUPPORTED_0_1 = (
    "flinkish 0.1's window operator (transformWithState) wrote this query's windows; flinkish "
    "after 0.2 runs only applyInPandasWithState and cannot continue that state. Finish or "
    "drain the query on flinkish 0.2 (window(..., operator='transformWithState')), or start it "
    "on a new checkpointLocation (its windows then start empty).")
#: the watermarked column event-time timeouts need; null, so Spark's late filter drops no row
_MARK = "__flinkish_watermark_mark"
#: bit i set when the i-th nullable numeric column is null (pandas would make it a float or NaN)
_NULLS = "__flinkish_nulls"
_NUMBERS = frozenset({"tinyint", "smallint", "int", "bigint", "float", "double"})
#: the key-group count in a group's stored state
_KEY_GROUPS = "key_groups"


def ms(duration: str | int) -> int:
    """A duration as milliseconds.

    Args:
        duration: ``"10 seconds"``, ``"500 ms"``, ``"5m"``, or an int (milliseconds).

    Returns:
        The duration in milliseconds.

    Raises:
        OptionError: the text is not a duration.
    """
    if isinstance(duration, int):
        return duration
    return parse_duration_ms("duration", duration)


def tumbling(size: str | int, offset: str | int = 0) -> TumblingEventTimeWindows:
    """Flink's ``TumblingEventTimeWindows.of(size, offset)``.

    Args:
        size: each window's length (a duration, see :func:`ms`).
        offset: shifts the windows' starts from the epoch (e.g. for time zones).

    Returns:
        The assigner, for :func:`window`.
    """
    return TumblingEventTimeWindows(ms(size), ms(offset))


def sliding(size: str | int, slide: str | int, offset: str | int = 0) -> SlidingEventTimeWindows:
    """Flink's ``SlidingEventTimeWindows.of(size, slide, offset)``.

    Args:
        size: each window's length (a duration, see :func:`ms`).
        slide: how far apart the windows start.
        offset: shifts the windows' starts from the epoch.

    Returns:
        The assigner, for :func:`window`.
    """
    return SlidingEventTimeWindows(ms(size), ms(slide), ms(offset))


def session(gap: str | int) -> EventTimeSessionWindows:
    """Flink's ``EventTimeSessionWindows.withGap(gap)``: merging session windows.

    Args:
        gap: the inactivity that ends a key's session (a duration, see :func:`ms`).

    Returns:
        The assigner, for :func:`window`.
    """
    return EventTimeSessionWindows(ms(gap))


def global_windows() -> GlobalWindows:
    """Flink's ``GlobalWindows.create()``: one window per key, fired only by a trigger.

    Returns:
        The assigner, for :func:`window` (with a ``trigger``).
    """
    return GlobalWindows()


def _result_type(function: Any, value_type: str | None, result_type: str | None) -> str:
    """The result column's Spark type: given, or what a built-in aggregate yields."""
    if result_type is not None:
        return result_type
    if isinstance(function, Count):
        return "long"
    if isinstance(function, Avg):
        return "double"
    if isinstance(function, Sum | Min | Max) and value_type is not None:
        if value_type in ("tinyint", "smallint", "int", "bigint"):
            return "long"
        if value_type in ("float", "double"):
            return "double"
        if not isinstance(function, Sum):
            return value_type
    raise OptionError(
        f"window: give result_type (a Spark type such as 'long' or 'struct<...>') for "
        f"{type(function).__name__}; it is inferred only for Count, Avg, and Sum, Min, Max "
        "of a numeric value column (Min and Max of any value column)")


def window(df: Any, key: str | Sequence[str], assigner: WindowAssigner, *,
           aggregate: AggregateFunction[Any, Any, Any] | None = None,
           process: ProcessWindowFunction[Any, Any] | None = None, value: str | None = None,
           result_type: str | None = None, trigger: Trigger | None = None,
           allowed_lateness: str | int = 0, evictor: Evictor | None = None,
           event_time: str = "eventTime", key_groups: int | None = None,
           operator: str = APPLY_IN_PANDAS_WITH_STATE) -> Any:
    """Windows of ``df`` per ``key``, as Flink's ``keyBy(key).window(assigner)``
    ``.trigger(trigger).allowedLateness(...).evictor(evictor).aggregate(...)`` (or
    ``.process(...)``) with ``sideOutputLateData``.

    Args:
        df: the output of :func:`flinkish.with_watermark` (or a row-wise transformation of it),
            its ``event_time`` column carrying the watermark.
        key: the key column, or several.
        assigner: which windows an element belongs to (:func:`tumbling`, :func:`sliding`,
            :func:`session`, :func:`global_windows`).
        aggregate: an incremental window function (one accumulator per window); exactly one
            of ``aggregate`` and ``process``.
        process: a full-window function (the window keeps every element).
        value: the column whose values are the window function's elements (None: the
            elements are None, as for a count).
        result_type: the Spark type of ``result`` (a DDL string); inferred for ``Count``,
            ``Avg``, and ``Sum``, ``Min``, ``Max`` of a numeric ``value``.
        trigger: when a window fires (default: the assigner's, at the watermark).
        allowed_lateness: how long after its end a window still takes late elements (a
            duration such as ``'5m'``, or milliseconds).
        evictor: removes elements before or after the window function runs.
        event_time: the column that carries Spark's watermark.
        key_groups: how many state entries the keys are hashed into (Flink's key groups); one
            entry holds the windows of all its keys, so a batch costs one visit per group with
            records or timers, not one per key. It caps the operator's parallelism and is part
            of the stored state: a query keeps it (None: :data:`DEFAULT_KEY_GROUPS`).
        operator: the Spark operator the core runs in: ``'applyInPandasWithState'``, the only
            one (``'transformWithState'``, flinkish 0.1's, is refused with what to do).

    Returns:
        The windows' results and late elements as one streaming DataFrame (output mode
        append): the key columns, ``kind`` (``'result'`` or ``'late'``), the firing's
        ``window_start``, ``window_end`` (null for global windows), ``result``, ``pane_index``,
        ``pane_timing`` (``EARLY``/``ON_TIME``/``LATE``), ``pane_is_last``, and for late rows
        the element's ``event_time`` and ``value`` columns. See :func:`split`.

    Raises:
        OptionError: not exactly one of ``aggregate`` and ``process``, a processing-time
            assigner, a missing column, an ``event_time`` without a watermark, an unknown
            ``operator``, ``key_groups`` below 1, or a ``result_type`` that cannot be
            inferred.
    """
    from pyspark.sql import functions as F

    if operator == TRANSFORM_WITH_STATE:
        raise OptionError(f"window: {UNSUPPORTED_0_1}")
    if operator != APPLY_IN_PANDAS_WITH_STATE:
        raise OptionError(
            f"window: operator must be {APPLY_IN_PANDAS_WITH_STATE!r}, got {operator!r}")
    keys = [key] if isinstance(key, str) else list(key)
    if (aggregate is None) == (process is None):
        raise OptionError("window: give exactly one of aggregate= or process=")
    function: Any = aggregate if aggregate is not None else process
    if not assigner.is_event_time and not isinstance(assigner, GlobalWindows):
        raise OptionError(
            f"window: {assigner!r} is a processing-time assigner; flinkish.windows runs in "
            "event time (use tumbling, sliding, session or global_windows)")
    for name in [*keys, event_time, *([value] if value is not None else [])]:
        if name not in df.columns:
            raise OptionError(f"window: no column {name!r} in {df.columns}")
    if SPARK_DELAY_KEY not in (df.schema[event_time].metadata or {}):
        raise OptionError(
            f"window: column {event_time!r} carries no watermark; apply "
            "flinkish.with_watermark to the source's DataFrame first (its event_time is this "
            "column)")
    # keys (and values) are kept in state as JSON
    for name in [*keys, *([value] if value is not None else [])]:
        type_name = df.schema[name].dataType.simpleString()
        if type_name not in _JSON_TYPES:
            raise OptionError(
                f"window: column {name!r} is {type_name}; key and value columns must be "
                f"numbers, strings or booleans ({', '.join(sorted(_JSON_TYPES))}): cast it")
    key_groups = DEFAULT_KEY_GROUPS if key_groups is None else key_groups
    if key_groups < 1:
        raise OptionError(f"window: key_groups must be >= 1, got {key_groups}")
    lateness = ms(allowed_lateness)
    # built now so a wrong combination (a trigger that cannot merge, a negative lateness)
    # fails here, not in the first batch
    WindowOperator(assigner, function, trigger, lateness, evictor)
    value_type = df.schema[value].dataType.simpleString() if value is not None else None
    # epoch ms and one row of arrays per visit, made timestamps and rows in the JVM (cheaper)
    output = ([(k, df.schema[k].dataType.simpleString()) for k in keys]
              + [(KIND, "string"), ("window_start", "long"), ("window_end", "long"),
                 ("result", _result_type(function, value_type, result_type)),
                 ("pane_index", "int"), ("pane_timing", "string"), ("pane_is_last", "boolean"),
                 (event_time, "long")]
              + ([(value, str(value_type))] if value is not None else []))
    schema = ", ".join(f"`{name}` array<{type_name}>" for name, type_name in output)
    window_function = partial(GroupStateWindow, assigner, function, trigger, lateness, evictor,
                              keys, event_time, value, key_groups)
    group = F.pmod(F.xxhash64(*keys), F.lit(key_groups)).alias(_GROUP)
    columns = [group, *(F.col(k) for k in keys),
               F.unix_millis(F.col(event_time)).alias(_TIME)]
    if value is not None:
        columns.append(F.col(value).alias(_VALUE))
    fired = _apply_in_pandas_with_state(df, columns, window_function, schema, event_time)
    rows = fired.select(F.inline(F.arrays_zip(*(F.col(name) for name, _ in output))))
    times = {"window_start", "window_end", event_time}
    late_only = {event_time, *([value] if value is not None else [])}

    def column(name: str) -> Any:
        out = F.timestamp_millis(F.col(name)) if name in times else F.col(name)
        # null in every result row: a sink splitting results from late rows leaves it out
        return out.alias(name, metadata={LATE_COLUMN: True} if name in late_only else None)

    return rows.select(*(column(c) for c in rows.columns))


def split(df: Any, event_time: str = "eventTime", value: str | None = None) -> tuple[Any, Any]:
    """(results, late) of a :func:`window` DataFrame: the firings (key columns and
    :data:`PANE_COLUMNS`) and the late side output (key columns, ``event_time``, ``value``).
    Both are filters of the same stream: write each with its own query, or use the whole
    DataFrame in one query and route by ``kind``.

    Args:
        df: what :func:`window` returned.
        event_time: the ``event_time`` given to :func:`window`.
        value: the ``value`` given to :func:`window`.

    Returns:
        ``(results, late)``, two DataFrames.
    """
    extra = [event_time, *([value] if value is not None else [])]
    keys = [c for c in df.columns if c not in (KIND, *PANE_COLUMNS, *extra)]
    return (df.filter(df[KIND] == RESULT).select(*keys, *PANE_COLUMNS),
            df.filter(df[KIND] == LATE).select(*keys, *extra))


def _bound(window: Any, end: bool) -> int | None:
    """A window's start or end (ms); None for the global window."""
    if isinstance(window, GlobalWindow):
        return None
    assert isinstance(window, TimeWindow)
    return window.end if end else window.start


def _apply_in_pandas_with_state(df: Any, columns: list[Any],
                                window_function: Callable[..., GroupStateWindow], schema: str,
                                event_time: str) -> Any:
    """The records (key group, keys, event time, value) through ``applyInPandasWithState``;
    one row of arrays per visit."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    records = df.select(*columns)
    selected = [F.col(_GROUP)]
    nullable = []
    for field in records.schema.fields[1:]:
        column = F.col(f"`{field.name}`")
        if field.nullable and field.dataType.simpleString() in _NUMBERS:
            nullable.append(field.name)
            column = F.coalesce(column, F.lit(0)).alias(field.name)
        selected.append(column)
    if nullable:
        selected.append(sum((F.col(f"`{name}`").isNull().cast("long") * (1 << i)
                             for i, name in enumerate(nullable)), F.lit(0)).alias(_NULLS))
    delay = df.schema[event_time].metadata[SPARK_DELAY_KEY]
    selected.append(F.lit(None).cast("timestamp").alias(_MARK, metadata={SPARK_DELAY_KEY: delay}))
    function = window_function(nullable=nullable)
    return (records.select(*selected).groupBy(_GROUP)
            .applyInPandasWithState(function.visit, schema, "state string", "append",
                                    GroupStateTimeout.EventTimeTimeout))


class GroupStateWindow:
    """The ``applyInPandasWithState`` function: a :class:`WindowOperator` per key group, its
    columnar snapshot as the group's JSON state, one event-time timeout per group."""

    def __init__(self, assigner: WindowAssigner, function: Any, trigger: Trigger | None,
                 allowed_lateness: int, evictor: Evictor | None, keys: list[str],
                 event_time: str, value: str | None, key_groups: int,
                 nullable: Sequence[str] = ()) -> None:
        from pyspark.sql import Row

        self.config = (assigner, function, trigger, allowed_lateness, evictor)
        self.keys, self.value, self.key_groups = keys, value, key_groups
        # the late rows' columns: the element's event time, and its value when there is one
        extra = [event_time, *([value] if value is not None else [])]
        self.row = Row(*keys, KIND, *PANE_COLUMNS, *extra)
        # the record columns after the key group, as window() selects them
        self.names = [*keys, _TIME, *([_VALUE] if value is not None else [])]
        self.bits = {name: 1 << i for i, name in enumerate(nullable)}

    def visit(self, key: Any, frames: Iterator[Any], state: Any) -> Iterator[Any]:
        import pandas as pd

        # the cyclic collector off: a visit's many survivors would set off full collections of
        # the worker's heap; reference counting frees them
        enabled = gc.isenabled()
        gc.disable()
        try:
            row = self._visit(frames, state)
        finally:
            if enabled:
                gc.enable()
        if row is not None:
            # one row; each cell one of the visit's output columns, a sequence
            yield pd.DataFrame({name: [cell] for name, cell in zip(self.row, row, strict=True)})

    def _visit(self, frames: Iterator[Any], state: Any) -> Any:
        """One visit: records in event-time order (a replayed batch fires the same panes); Spark
        calls a group whose timeout is strictly below the watermark, hence ``firing - 1``."""
        stored = state.getOption
        operator = self.restore(None if stored is None else stored[0])
        outputs = [operator.process_watermark(state.getCurrentWatermarkMs()),
                   operator.process_processing_time(state.getCurrentProcessingTimeMs())]
        if not state.hasTimedOut:
            outputs.append(operator.process_elements(self._elements(frames)))
        text = self.encode(operator)
        if text is not None:
            state.update((text,))
            firing = self.firing_watermark(operator)
            if firing is not None:
                state.setTimeoutTimestamp(firing - 1)
        else:
            state.remove()
        return self.output(outputs)

    def restore(self, text: str | None) -> WindowOperator:
        """The group's operator from its stored JSON (None: a group without state)."""
        operator = WindowOperator(*self.config)
        if text is None:
            return operator
        snapshot = json.loads(text)
        # another number of groups would send this group's keys elsewhere
        stored = snapshot.pop(_KEY_GROUPS)
        if stored != self.key_groups:
            raise OptionError(
                f"window: this query's state was written with key_groups={stored}, and it "
                f"now runs with key_groups={self.key_groups}: pass key_groups={stored} (the "
                "number of key groups is part of a query's state)")
        # JSON made the key tuples lists
        snapshot["keys"] = [tuple(key) for key in snapshot["keys"]]
        operator.restore(snapshot, copy=False)
        return operator

    def _elements(self, frames: Iterator[Any]) -> list[tuple[tuple[Any, ...], Any, int]]:
        """The core's ``(key, value, timestamp)`` elements, nulls restored, stably by time."""
        n = len(self.keys)
        elements: list[tuple[tuple[Any, ...], Any, int]] = []
        for frame in frames:
            # the column of nulls read only when a record has one
            nulls = frame[_NULLS].tolist() if self.bits and frame[_NULLS].any() else None
            run = [self._column(frame, name, nulls) for name in self.names]
            times = run[n]
            values = run[n + 1] if self.value is not None else [None] * len(times)
            elements.extend(zip(zip(*run[:n], strict=True), values, times, strict=True))
        elements.sort(key=itemgetter(2))
        return elements

    def _column(self, frame: Any, name: str, nulls: list[int] | None) -> list[Any]:
        values = frame[name].tolist()
        bit = self.bits.get(name)
        if bit is None or nulls is None:
            return values
        return [None if null & bit else v for v, null in zip(values, nulls, strict=True)]

    @staticmethod
    def firing_watermark(operator: WindowOperator) -> int | None:
        """The lowest watermark firing the core's earliest timer (None: none): a repeated
        watermark fires nothing, so a timer at or below the watermark needs one more ms."""
        earliest = operator.earliest_event_time_timer()
        return None if earliest is None else max(earliest, operator.current_watermark + 1)

    def encode(self, operator: WindowOperator) -> str | None:
        """The group's state to store; None when no key has anything left."""
        snapshot = operator.columnar_snapshot(copy=False)
        if not snapshot["keys"]:
            return None
        snapshot[_KEY_GROUPS] = self.key_groups
        # plain data built fresh, no cycles: the encoder's check for them is wasted work
        return json.dumps(snapshot, check_circular=False)

    def output(self, outputs: list[WindowOutput]) -> Any:
        """One Row of column sequences, results then late elements (None: nothing). Results are
        a list: PySpark converts a struct result's Row to a dict only inside a list."""
        results = [r for out in outputs for r in out.results]
        late = [e for out in outputs for e in out.late]
        if not results and not late:
            return None
        windows = [r.window for r in results]
        panes = [r.pane for r in results]
        none = (None,) * len(late)
        no_late = (None,) * len(results)
        columns: list[Any] = [
            *(tuple(r.key[i] for r in results) + tuple(e.key[i] for e in late)
              for i in range(len(self.keys))),
            (RESULT,) * len(results) + (LATE,) * len(late),
            tuple(_bound(w, False) for w in windows) + none,
            tuple(_bound(w, True) for w in windows) + none,
            [r.result for r in results] + [None] * len(late),
            tuple(p.index for p in panes) + none,
            tuple(p.timing.value for p in panes) + none,
            tuple(p.is_last for p in panes) + none,
            no_late + tuple(e.timestamp for e in late),
            *([no_late + tuple(e.value for e in late)] if self.value is not None else []),
        ]
        return self.row(*columns)
