"""Flink's ``WindowOperator`` (and ``EvictingWindowOperator``) as a pure, deterministic state
machine: elements, watermarks and processing time in; window results with panes and late
elements out; its state as plain data (:meth:`WindowOperator.snapshot`), so it can live in
Spark's state. Lateness is Flink's (``isWindowLate``, ``isElementLate``, ``cleanupTime``), except
that an element whose windows were all late goes to the late output, never dropped
(docs/windows.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

from flinkish_core.windowing.evictor import Evictor, TimestampedValue
from flinkish_core.windowing.merging_window_set import MergingWindowSet
from flinkish_core.windowing.pane import PaneInfo, Timing
from flinkish_core.windowing.partitioned_state import PartitionedStateStore
from flinkish_core.windowing.timer_service import InternalTimer, InternalTimerService, TimerQueue
from flinkish_core.windowing.trigger import Trigger, TriggerContext
from flinkish_core.windowing.triggers import EventTimeTrigger
from flinkish_core.windowing.window import (
    LONG_MAX,
    GlobalWindow,
    TimeWindow,
    Window,
    window_from_data,
    window_to_data,
)
from flinkish_core.windowing.window_assigner import (
    MergingWindowAssigner,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
)
from flinkish_core.windowing.window_function import (
    AggregateFunction,
    ProcessWindowFunction,
    WindowContext,
)

__all__ = [
    "COLUMNAR_FORMAT", "LateElement", "WindowFunction", "WindowOperator", "WindowOutput",
    "WindowResult",
]

SNAPSHOT_FORMAT = 1
"""Version of the :meth:`WindowOperator.snapshot` layout: one entry per key."""

COLUMNAR_FORMAT = 2
"""Version of the :meth:`WindowOperator.columnar_snapshot` layout: one column per field."""

WindowFunction = AggregateFunction[Any, Any, Any] | ProcessWindowFunction[Any, Any]


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class WindowResult:
    """One output of a firing: the key, the window, one result and the firing's pane.
    ``timestamp`` is the window's ``max_timestamp()``, the timestamp Flink gives the record."""

    key: Any
    window: Window
    result: Any
    pane: PaneInfo

    @property
    def timestamp(self) -> int:
        return self.window.max_timestamp()


@dataclass(frozen=True)
class LateElement:
    """An element that arrived too late for all its windows (Flink's late side output)."""

    key: Any
    value: Any
    timestamp: int | None


@dataclass(slots=True)
class WindowOutput:
    """What one input to the operator produced."""

    results: list[WindowResult] = field(default_factory=list)
    late: list[LateElement] = field(default_factory=list)


class WindowOperator:
    """Windows per key: ``assigner`` places elements, ``trigger`` (the assigner's default when
    None) fires them, ``function`` computes each firing's results, ``evictor`` (optional) trims
    the elements around the function, ``allowed_lateness`` (ms) keeps windows open for late
    elements after their end."""

    def __init__(
        self, assigner: WindowAssigner, function: WindowFunction, trigger: Trigger | None = None,
        allowed_lateness: int = 0, evictor: Evictor | None = None,
    ) -> None:
        if allowed_lateness < 0:
            raise ValueError(f"allowed_lateness must be >= 0, got {allowed_lateness}")
        if not isinstance(function, AggregateFunction | ProcessWindowFunction):
            raise TypeError("function must be an AggregateFunction or a ProcessWindowFunction")
        self.assigner = assigner
        self.function = function
        self.trigger = trigger if trigger is not None else assigner.default_trigger()
        self.allowed_lateness = allowed_lateness if assigner.is_event_time else 0
        self.evictor = evictor
        if isinstance(assigner, MergingWindowAssigner) and not self.trigger.can_merge():
            raise ValueError(f"{self.trigger!r} cannot be used with merging windows")
        self._clear()
        self._out = WindowOutput()
        # process_elements' one loop: fixed windows, exactly Flink's default trigger (a
        # subclass may override it), an accumulator per window
        self._bulk = (
            isinstance(assigner, TumblingEventTimeWindows | SlidingEventTimeWindows)
            and assigner.is_event_time and type(self.trigger) is EventTimeTrigger
            and evictor is None and isinstance(function, AggregateFunction))

    def _clear(self, late_records: int = 0) -> None:
        self._timers = InternalTimerService()
        self._trigger_state = PartitionedStateStore()
        self._ctx = TriggerContext(self._timers, self._trigger_state)
        # window contents and the next pane index, per (key, state window)
        self._contents: dict[tuple[Any, Window], Any] = {}
        self._panes: dict[tuple[Any, Window], int] = {}
        self._merging: dict[Any, MergingWindowSet] = {}
        self.late_records = late_records
        """How many elements went to the late output (Flink's ``numLateRecordsDropped``)."""

    # ------------------------------------------------------------------ clocks

    @property
    def current_watermark(self) -> int:
        return self._timers.current_watermark

    @property
    def current_processing_time(self) -> int:
        return self._timers.current_processing_time

    def _clock(self) -> int:
        """The time the window's lateness and panes are judged by."""
        return self._timers.current_watermark if self.assigner.is_event_time else (
            self._timers.current_processing_time)

    # ------------------------------------------------------------------ inputs

    def process_element(self, key: Any, value: Any, timestamp: int | None = None) -> WindowOutput:
        """One element of ``key`` with its event time (ms; None for processing-time or global
        windows only)."""
        self._out = WindowOutput()
        windows = self.assigner.assign_windows(value, timestamp, self)
        skipped = True
        if isinstance(self.assigner, MergingWindowAssigner):
            merging = self._merging.get(key)
            if merging is None:
                merging = self._merging[key] = MergingWindowSet(self.assigner)
            for window in windows:
                assert isinstance(window, TimeWindow)
                actual = merging.add_window(window, self._merge_function(key))
                if self._is_window_late(actual):
                    merging.retire_window(actual)
                    continue
                skipped = False
                state_window = merging.get_state_window(actual)
                if state_window is None:
                    raise RuntimeError(f"Window {window} is not in in-flight window set.")
                self._on_element(key, value, timestamp, actual, state_window)
            if not merging.mapping:
                del self._merging[key]
        else:
            for window in windows:
                if self._is_window_late(window):
                    continue
                skipped = False
                self._on_element(key, value, timestamp, window, window)
        # Flink side-outputs an element late by its own timestamp; one whose windows were all
        # late goes there too (a point window [t, t) can be late while t is not)
        late = bool(windows) or (timestamp is not None  # Flink's isElementLate
                                 and timestamp + self.allowed_lateness <= self.current_watermark)
        if skipped and self.assigner.is_event_time and late:
            self.late_records += 1
            self._out.late.append(LateElement(key, value, timestamp))
        return self._out

    def process_elements(self, elements: Iterable[tuple[Any, Any, int | None]]) -> WindowOutput:
        """``(key, value, timestamp)`` elements, each as :meth:`process_element` takes it; one
        output: all their results, then all their late elements. The common case runs as one
        loop with the same effects (docs/windows.md)."""
        if self._bulk:
            return self._process_elements_bulk(elements)
        out = WindowOutput()
        for key, value, timestamp in elements:
            one = self.process_element(key, value, timestamp)
            out.results += one.results
            out.late += one.late
        return out

    def _process_elements_bulk(
        self, elements: Iterable[tuple[Any, Any, int | None]],
    ) -> WindowOutput:
        """``_on_element`` with ``EventTimeTrigger.on_element`` folded in."""
        assert isinstance(self.function, AggregateFunction)
        self._out = out = WindowOutput()
        watermark = self._timers.current_watermark
        lateness = self.allowed_lateness
        contents = self._contents
        create, add = self.function.create_accumulator, self.function.add
        register = self._timers.event_time_timers.register
        assign = self.assigner.assign_windows
        # Python's remainder takes the divisor's sign: Flink's branch for negative timestamps
        tumbling = self.assigner if type(self.assigner) is TumblingEventTimeWindows else None
        size, offset = (tumbling.size, tumbling.offset % tumbling.size) if tumbling else (1, 0)
        tumbling_windows: dict[int, TimeWindow] = {}
        windows: Sequence[Any]
        window: Any  # a TimeWindow: (start, end)
        for key, value, timestamp in elements:
            if tumbling is not None and timestamp is not None:
                start = timestamp - (timestamp - offset) % size
                tumbled = tumbling_windows.get(start)
                if tumbled is None:
                    tumbled = tumbling_windows[start] = TimeWindow(start, start + size)
                windows = (tumbled,)
            else:
                windows = assign(value, timestamp, self)
            skipped = True
            for window in windows:
                end = window[1] - 1  # max_timestamp()
                cleanup = end + lateness if end + lateness < LONG_MAX else LONG_MAX
                if cleanup <= watermark:
                    continue  # the window is late
                skipped = False
                slot = (key, window)
                accumulator = contents.get(slot)
                contents[slot] = add(value, create() if accumulator is None else accumulator)
                # EventTimeTrigger.on_element: a window the watermark has passed fires at
                # once, any other gets a timer at its end
                if end <= watermark:
                    self._emit(key, window, window, watermark, clock_timer=False, last=False)
                    if cleanup != LONG_MAX:
                        register(key, window, cleanup)
                else:
                    register(key, window, end)
                    # without lateness the cleanup timer is the end's, registered just now
                    if cleanup != end and cleanup != LONG_MAX:
                        register(key, window, cleanup)
            # process_element's rule (the assigner refused a timestamp of None)
            if skipped and (windows or timestamp + lateness <= watermark):  # type: ignore
                self.late_records += 1
                out.late.append(LateElement(key, value, timestamp))
        return out

    def process_watermark(self, watermark: int) -> WindowOutput:
        """Advances event time to ``watermark`` and fires every event-time timer at or before
        it, in timestamp order. Only a greater watermark advances anything, as in Flink
        (``InternalTimerServiceImpl.advanceWatermark`` runs only when the valve's watermark
        rises): a timer at or below the current watermark waits for the next advance."""
        self._out = WindowOutput()
        if watermark <= self._timers.current_watermark:
            return self._out
        self._timers.current_watermark = watermark
        queue = self._timers.event_time_timers
        if self._bulk:
            self._fire_event_time_bulk(watermark)
            return self._out
        while (timer := queue.poll(self._timers.current_watermark)) is not None:
            self._on_timer(timer, event_time=True)
        return self._out

    def _fire_event_time_bulk(self, watermark: int) -> None:
        """``_on_timer`` with ``EventTimeTrigger.on_event_time`` and ``_emit`` folded in: every
        timer is a window's end or cleanup, and the trigger's ``clear`` has nothing to do."""
        assert isinstance(self.function, AggregateFunction)
        queue = self._timers.event_time_timers
        contents, panes = self._contents, self._panes
        lateness = self.allowed_lateness
        get_result = self.function.get_result
        results = self._out.results
        # equal panes are one object (frozen): most firings are the first and last pane
        pane_infos: dict[tuple[int, bool], PaneInfo] = {}
        window: Any  # a TimeWindow: (start, end)
        while (due := queue.pop_due(watermark)) is not None:
            time, key, window = due
            end = window[1] - 1  # max_timestamp()
            cleanup = time == (end + lateness if end + lateness < LONG_MAX else LONG_MAX)
            slot = (key, window)
            if time == end and slot in contents:
                index = panes.get(slot, 0)
                panes[slot] = index + 1
                pane = pane_infos.get((index, cleanup))
                if pane is None:
                    pane = pane_infos[(index, cleanup)] = PaneInfo(index, Timing.ON_TIME, cleanup)
                results.append(WindowResult(key, window, get_result(contents[slot]), pane))
            if cleanup:
                contents.pop(slot, None)
                panes.pop(slot, None)

    def process_processing_time(self, time: int) -> WindowOutput:
        """Advances processing time to ``time`` and fires the processing-time timers due."""
        self._out = WindowOutput()
        self._timers.current_processing_time = max(self._timers.current_processing_time, time)
        queue = self._timers.processing_time_timers
        while (timer := queue.poll(self._timers.current_processing_time)) is not None:
            self._on_timer(timer, event_time=False)
        return self._out

    # ------------------------------------------------------------------ Flink's callbacks

    def _on_element(
        self, key: Any, value: Any, timestamp: int | None, window: Window, state_window: Window,
    ) -> None:
        self._add_to_contents(key, state_window, value, timestamp)
        self._point(key, window)
        result = self.trigger.on_element(value, timestamp, window, self._ctx)
        if result.is_fire:
            self._emit(key, window, state_window, self._clock(), clock_timer=False, last=False)
        if result.is_purge:
            self._contents.pop((key, state_window), None)
        if (cleanup := self._cleanup_time(window)) != LONG_MAX:
            self._cleanup_timers().register(key, window, cleanup)

    def _on_timer(self, timer: InternalTimer, *, event_time: bool) -> None:
        key, window = timer.key, timer.window
        merging = self._merging.get(key)
        state_window: Window | None = window
        if isinstance(self.assigner, MergingWindowAssigner):
            assert isinstance(window, TimeWindow)
            state_window = merging.get_state_window(window) if merging is not None else None
        if state_window is None:  # merged away or cleared: its state is gone
            return
        self._point(key, window)
        on_timer = self.trigger.on_event_time if event_time else self.trigger.on_processing_time
        result = on_timer(timer.timestamp, window, self._ctx)
        in_domain = event_time == self.assigner.is_event_time
        cleanup = in_domain and timer.timestamp == self._cleanup_time(window)
        if result.is_fire and (key, state_window) in self._contents:
            # a timer of the other time domain says nothing about the window's own clock
            time = timer.timestamp if in_domain else self._clock()
            self._emit(key, window, state_window, time, clock_timer=in_domain, last=cleanup)
        if result.is_purge:
            self._contents.pop((key, state_window), None)
        if cleanup:
            self._clear_all_state(key, window, state_window, merging)
        if merging is not None and not merging.mapping:
            del self._merging[key]

    def _merge_function(self, key: Any) -> Callable[..., None]:
        def merge(
            merge_result: TimeWindow, merged_windows: list[TimeWindow],
            state_window_result: TimeWindow, merged_state_windows: list[TimeWindow],
        ) -> None:
            # allowed_lateness is 0 in processing time
            if merge_result.max_timestamp() + self.allowed_lateness <= self._clock():
                kind, clock = (("an event-time", "watermark") if self.assigner.is_event_time
                                 else ("a processing-time", "processing time"))
                raise ValueError(
                    f"The end timestamp of {kind} window cannot become earlier than the "
                    f"current {clock} by merging. Current {clock}: {self._clock()} window: "
                    f"{merge_result}")
            self._point(key, merge_result)
            self._ctx.merged_windows = list(merged_windows)
            self.trigger.on_merge(merge_result, self._ctx)
            self._ctx.merged_windows = []
            for merged in merged_windows:
                self._point(key, merged)
                self.trigger.clear(merged, self._ctx)
                if (cleanup := self._cleanup_time(merged)) != LONG_MAX:
                    self._cleanup_timers().delete(key, merged, cleanup)
            self._merge_namespaces(key, state_window_result, merged_state_windows)
        return merge

    # ------------------------------------------------------------------ helpers

    def _point(self, key: Any, window: Window) -> None:
        self._ctx.key = key
        self._ctx.window = window

    def _cleanup_time(self, window: Window) -> int:
        """Flink's ``cleanupTime`` (``Long.MAX`` on overflow: no cleanup timer)."""
        if not self.assigner.is_event_time:
            return window.max_timestamp()
        cleanup = window.max_timestamp() + self.allowed_lateness
        return cleanup if cleanup < LONG_MAX else LONG_MAX

    def _is_window_late(self, window: Window) -> bool:
        return self.assigner.is_event_time and (
            self._cleanup_time(window) <= self._timers.current_watermark)

    def _cleanup_timers(self) -> TimerQueue:
        if self.assigner.is_event_time:
            return self._timers.event_time_timers
        return self._timers.processing_time_timers

    def _timer_queues(self) -> dict[str, TimerQueue]:
        """The timer queues by their names in snapshots."""
        return {"event_timers": self._timers.event_time_timers,
                "processing_timers": self._timers.processing_time_timers}

    def _clear_all_state(
        self, key: Any, window: Window, state_window: Window, merging: MergingWindowSet | None,
    ) -> None:
        self._contents.pop((key, state_window), None)
        self._panes.pop((key, state_window), None)
        self._point(key, window)
        self.trigger.clear(window, self._ctx)
        if isinstance(self.function, ProcessWindowFunction):
            self.function.clear(key, self._window_context(key, window))
        if merging is not None:
            assert isinstance(window, TimeWindow)
            merging.retire_window(window)

    # ------------------------------------------------------------------ contents

    def _add_to_contents(
        self, key: Any, state_window: Window, value: Any, timestamp: int | None,
    ) -> None:
        slot = (key, state_window)
        if self.evictor is not None:
            self._contents.setdefault(slot, []).append([value, timestamp])
        elif isinstance(self.function, ProcessWindowFunction):
            self._contents.setdefault(slot, []).append(value)
        else:
            accumulator = self._contents.get(slot)
            if accumulator is None:
                accumulator = self.function.create_accumulator()
            self._contents[slot] = self.function.add(value, accumulator)

    def _merge_namespaces(self, key: Any, target: Window, sources: list[TimeWindow]) -> None:
        """Flink's ``mergeNamespaces``, pane counters included."""
        merged: Any = None
        next_pane = self._panes.get((key, target))
        for source in sources:
            contents = self._contents.pop((key, source), None)
            if contents is not None:
                merged = contents if merged is None else self._merge_contents(merged, contents)
            pane = self._panes.pop((key, source), None)
            if pane is not None:
                next_pane = pane if next_pane is None else max(next_pane, pane)
        if merged is not None:
            existing = self._contents.get((key, target))
            self._contents[(key, target)] = (
                merged if existing is None else self._merge_contents(existing, merged))
        if next_pane is not None:
            self._panes[(key, target)] = next_pane

    def _merge_contents(self, a: Any, b: Any) -> Any:
        if isinstance(self.function, AggregateFunction) and self.evictor is None:
            return self.function.merge(a, b)
        return a + b  # lists of elements

    def _results(self, key: Any, window: Window, state_window: Window) -> list[Any]:
        contents = self._contents[(key, state_window)]
        if self.evictor is None:
            if isinstance(self.function, ProcessWindowFunction):
                return list(self.function.process(key, self._window_context(key, window),
                                                  list(contents)))
            return [self.function.get_result(contents)]
        elements = [TimestampedValue(value, ts) for value, ts in contents]
        self.evictor.evict_before(elements, len(elements), window)
        values = [e.value for e in elements]
        if isinstance(self.function, ProcessWindowFunction):
            results = list(self.function.process(key, self._window_context(key, window), values))
        else:
            accumulator = self.function.create_accumulator()
            for value in values:
                accumulator = self.function.add(value, accumulator)
            results = [self.function.get_result(accumulator)]
        self.evictor.evict_after(elements, len(elements), window)
        if elements:
            self._contents[(key, state_window)] = [[e.value, e.timestamp] for e in elements]
        else:
            del self._contents[(key, state_window)]
        return results

    def _window_context(self, key: Any, window: Window) -> WindowContext:
        return WindowContext(key, window, self.current_watermark, self.current_processing_time)

    def _emit(
        self, key: Any, window: Window, state_window: Window, time: int, *,
        clock_timer: bool, last: bool,
    ) -> None:
        """Fires ``window`` with the next pane (:mod:`flinkish_core.windowing.pane`) for
        ``time``."""
        results = self._results(key, window, state_window)
        if not results:
            return
        end = window.max_timestamp()
        if clock_timer and time == end:
            timing = Timing.ON_TIME
        elif time < end:
            timing = Timing.EARLY
        else:
            timing = Timing.LATE
        index = self._panes.get((key, state_window), 0)
        self._panes[(key, state_window)] = index + 1
        pane = PaneInfo(index, timing, last)
        self._out.results.extend(WindowResult(key, window, r, pane) for r in results)

    # ------------------------------------------------------------------ state as data

    def snapshot(self, *, copy: bool = True) -> dict[str, Any]:
        """The operator's whole state as plain data: the clocks, the late count and one
        :meth:`key_state` entry per key. It pickles, and goes through JSON when keys, elements
        and accumulators are JSON values. With ``copy`` the user's values in it are deep
        copies; ``copy=False`` shares them, for a caller that encodes the snapshot at once
        and drops the operator."""
        return {**self._header(SNAPSHOT_FORMAT),
                "keys": list(self._key_entries(None, copy).values())}

    def _header(self, layout: int) -> dict[str, Any]:
        return {
            "format": layout,
            "watermark": self._timers.current_watermark,
            "processing_time": self._timers.current_processing_time,
            "late_records": self.late_records,
            "timer_seq": [queue.next_seq for queue in self._timer_queues().values()],
        }

    def columnar_snapshot(self, *, copy: bool = True) -> dict[str, Any]:
        """The state of :meth:`snapshot` in columns (:data:`COLUMNAR_FORMAT`): each key and
        window once (``windows`` is ``[starts, ends]``, None for the global window), then per
        kind of state columns that name their key and window by position; mostly small
        numbers, which JSON encodes several times faster. ``copy`` as in :meth:`snapshot`."""
        value = deepcopy if copy else _same
        trigger_state = list(self._trigger_state.items())
        contents, panes = list(self._contents), list(self._panes)
        timers = {name: queue.columns() for name, queue in self._timer_queues().items()}
        slot_columns = {
            "contents": ([k for k, _ in contents], [w for _, w in contents]),
            "panes": ([k for k, _ in panes], [w for _, w in panes]),
            "trigger_state": ([k for k, _, _, _ in trigger_state],
                              [w for _, w, _, _ in trigger_state]),
            **{name: (timer_keys, windows) for name, (timer_keys, windows, _, _)
               in timers.items()},
        }
        keys = {key: i for i, key in enumerate(dict.fromkeys(itertools.chain(
            self._merging, *(slot_keys for slot_keys, _ in slot_columns.values()))))}
        windows = {window: i for i, window in enumerate(dict.fromkeys(itertools.chain(
            *(slot_windows for _, slot_windows in slot_columns.values()))))}
        slots = {name: [[keys[key] for key in slot_keys],
                        [windows[window] for window in slot_windows]]
                 for name, (slot_keys, slot_windows) in slot_columns.items()}
        columns: dict[str, Any] = {
            "contents": [*slots["contents"], [value(c) for c in self._contents.values()]],
            "panes": [*slots["panes"], list(self._panes.values())],
            "merging_windows": [[keys[key] for key in self._merging],
                                [merging.to_data() for merging in self._merging.values()]],
            "trigger_state": [*slots["trigger_state"],
                              [name for _, _, name, _ in trigger_state],
                              [value(state) for _, _, _, state in trigger_state]],
        }
        for name, (_, _, timestamps, seqs) in timers.items():
            columns[name] = [*slots[name], timestamps, seqs]
        return {
            **self._header(COLUMNAR_FORMAT),
            "keys": list(keys),
            "windows": [[w[0] if w.__class__ is TimeWindow else None for w in windows],
                        [w[1] if w.__class__ is TimeWindow else None for w in windows]],
            **columns,
        }

    def restore(self, snapshot: dict[str, Any], *, copy: bool = True) -> None:
        """Replaces this operator's state with a :meth:`snapshot` or a
        :meth:`columnar_snapshot` of an operator of the same configuration. ``copy=False``
        takes the snapshot's user values over, for a snapshot nobody else holds."""
        layout = snapshot.get("format")
        if layout not in (SNAPSHOT_FORMAT, COLUMNAR_FORMAT):
            raise ValueError(f"unknown window operator snapshot format {layout!r}")
        self._clear(snapshot["late_records"])
        self._timers.current_watermark = snapshot["watermark"]
        self._timers.current_processing_time = snapshot["processing_time"]
        if layout == SNAPSHOT_FORMAT:
            for entry in snapshot["keys"]:
                self._load_key(entry, copy)
        else:
            self._load_columns(snapshot, copy)
        for queue, seq in zip(self._timer_queues().values(), snapshot["timer_seq"], strict=True):
            queue.next_seq = max(queue.next_seq, seq)

    def key_state(self, key: Any) -> dict[str, Any] | None:
        """One key's state as plain data, a copy (None: the key has none): the unit a keyed
        state store keeps."""
        return self._key_entries({key}, True).get(key)

    def restore_key_state(self, key: Any, entry: dict[str, Any] | None) -> None:
        """Replaces one key's state with a copy of a :meth:`key_state` entry (None: drops it);
        the clocks stay this operator's."""
        self._drop_key(key)
        if entry is not None:
            if entry["key"] != key:
                raise ValueError(f"the state of key {entry['key']!r} cannot restore key {key!r}")
            self._load_key(entry, True)

    def _key_entries(self, keys: set[Any] | None, copy: bool) -> dict[Any, dict[str, Any]]:
        value = deepcopy if copy else _same
        per_key: dict[Any, dict[str, Any]] = {}

        def entry(key: Any) -> dict[str, Any] | None:
            e = per_key.get(key)
            if e is None and (keys is None or key in keys):
                e = per_key[key] = {
                    "key": key, "contents": [], "panes": [], "merging_windows": None,
                    "trigger_state": [], "event_timers": [], "processing_timers": [],
                }
            return e

        for (key, window), contents in self._contents.items():
            if (e := entry(key)) is not None:
                e["contents"].append([window_to_data(window), value(contents)])
        for (key, window), index in self._panes.items():
            if (e := entry(key)) is not None:
                e["panes"].append([window_to_data(window), index])
        for key, merging in self._merging.items():
            if (e := entry(key)) is not None:
                e["merging_windows"] = merging.to_data()
        for key, window, name, state in self._trigger_state.items():
            if (e := entry(key)) is not None:
                e["trigger_state"].append([window_to_data(window), name, value(state)])
        for name, queue in self._timer_queues().items():
            for key, window, timestamp, seq in queue.items():
                if (e := entry(key)) is not None:
                    e[name].append([window_to_data(window), timestamp, seq])
        return per_key

    def _load_key(self, entry: dict[str, Any], copy: bool) -> None:
        value = deepcopy if copy else _same
        key = entry["key"]
        for window, contents in entry["contents"]:
            self._contents[(key, window_from_data(window))] = value(contents)
        for window, index in entry["panes"]:
            self._panes[(key, window_from_data(window))] = index
        if entry["merging_windows"] is not None:
            assert isinstance(self.assigner, MergingWindowAssigner)
            self._merging[key] = MergingWindowSet.from_data(self.assigner, entry["merging_windows"])
        for window, name, state in entry["trigger_state"]:
            self._trigger_state.put(key, window_from_data(window), name, value(state))
        for name, queue in self._timer_queues().items():
            for window, timestamp, seq in entry[name]:
                queue.register(key, window_from_data(window), timestamp, seq)

    def _load_columns(self, snapshot: dict[str, Any], copy: bool) -> None:
        value = deepcopy if copy else _same
        keys = snapshot["keys"]
        windows: list[Window] = [GlobalWindow() if start is None else TimeWindow(start, end)
                                 for start, end in zip(*snapshot["windows"], strict=True)]

        def slots(key_positions: list[int], window_positions: list[int]) -> list[Any]:
            return [(keys[k], windows[w])
                    for k, w in zip(key_positions, window_positions, strict=True)]

        *where, contents = snapshot["contents"]
        self._contents = dict(zip(slots(*where), map(value, contents), strict=True))
        *where, indexes = snapshot["panes"]
        self._panes = dict(zip(slots(*where), indexes, strict=True))
        if snapshot["merging_windows"][0]:
            assert isinstance(self.assigner, MergingWindowAssigner)
            for position, data in zip(*snapshot["merging_windows"], strict=True):
                self._merging[keys[position]] = MergingWindowSet.from_data(self.assigner, data)
        *where, names, states = snapshot["trigger_state"]
        for (key, window), name, state in zip(slots(*where), names, states, strict=True):
            self._trigger_state.put(key, window, name, value(state))
        for name, queue in self._timer_queues().items():
            *where, timestamps, seqs = snapshot[name]
            pairs = slots(*where)
            queue.load([key for key, _ in pairs], [window for _, window in pairs], timestamps, seqs)

    def _drop_key(self, key: Any) -> None:
        for slots in (self._contents, self._panes):
            for slot in [s for s in slots if s[0] == key]:
                del slots[slot]
        self._merging.pop(key, None)
        for k, window, name, _ in list(self._trigger_state.items()):
            if k == key:
                self._trigger_state.delete(k, window, name)
        for queue in self._timer_queues().values():
            for k, window, timestamp, _ in list(queue.items()):
                if k == key:
                    queue.delete(k, window, timestamp)

    # ------------------------------------------------------------------ introspection

    def num_keys(self) -> int:
        """Keys with any state (windows, trigger state or timers)."""
        return len(self._key_entries(None, False))

    def num_state_entries(self) -> int:
        """Flink's ``numKeyedStateEntries`` (pane counters aside: Flink has none)."""
        return len(self._contents) + self._trigger_state.count() + len(self._merging)

    def earliest_event_time_timer(self) -> int | None:
        return self._timers.event_time_timers.earliest()

    def num_event_time_timers(self) -> int:
        return self._timers.event_time_timers.count()

    def num_processing_time_timers(self) -> int:
        return self._timers.processing_time_timers.count()
