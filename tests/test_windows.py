"""``flinkish.windows.WindowProcessor`` without Spark: a stand-in for Spark's keyed state and
timers drives it as ``transformWithState`` would (per key: the key's rows or one expired
timer, with the batch's watermark), and checks the firings, the late rows, the state kept per
key and the timers mirrored to Spark."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from typing import Any, cast

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming.state import GroupState

from flinkish import windows
from flinkish_core.errors import OptionError

KEYS = ["key"]


class KeyedHandle:
    """Spark's per-key value state and event-time timers; ``key`` is the implicit key."""

    def __init__(self) -> None:
        self.key: Any = None
        self.values: dict[Any, tuple[Any, ...]] = {}
        self.timers: dict[Any, set[int]] = {}

    def getValueState(self, name: str, schema: str) -> Any:
        handle = self

        class State:
            def get(self) -> tuple[Any, ...] | None:
                return handle.values.get(handle.key)

            def update(self, value: tuple[Any, ...]) -> None:
                handle.values[handle.key] = value

            def clear(self) -> None:
                handle.values.pop(handle.key, None)

        return State()

    def registerTimer(self, timestamp: int) -> None:
        self.timers.setdefault(self.key, set()).add(timestamp)

    def deleteTimer(self, timestamp: int) -> None:
        self.timers.get(self.key, set()).discard(timestamp)


class Values:
    def __init__(self, watermark: int, processing_time: int = 0) -> None:
        self.watermark, self.processing_time = watermark, processing_time

    def getCurrentWatermarkInMs(self) -> int:
        return self.watermark

    def getCurrentProcessingTimeInMs(self) -> int:
        return self.processing_time


class Expired:
    def __init__(self, timestamp: int) -> None:
        self.timestamp = timestamp

    def getExpiryTimeInMs(self) -> int:
        return self.timestamp


class Runner:
    """Drives a processor batch by batch as Spark does: every key group's rows, then every
    group's expired timers (each once), with the batch's watermark. A timer has expired when
    the batch's watermark is at or past it, and Spark deletes it after its visit. ``group``
    maps a key to its key group (by default its own)."""

    def __init__(self, processor: windows.WindowProcessor,
                 group: Callable[[str], Any] = lambda key: key) -> None:
        self.handle = KeyedHandle()
        self.processor = processor
        self.group = group
        processor.init(self.handle)

    def batch(self, watermark: int, rows: list[tuple[str, int, Any]],
              processing_time: int = 0) -> list[dict[str, Any]]:
        values = Values(watermark, processing_time)
        out: list[Row] = []
        for group, mine in self._packed(rows).items():
            self.handle.key = (group,)
            out += self.processor.handleInputRows((group,), iter(mine), values)
        for key, timers in list(self.handle.timers.items()):
            for timestamp in sorted(t for t in timers if t <= watermark):
                self.handle.key = key
                out += self.processor.handleExpiredTimer(key, values, Expired(timestamp))
                self.handle.timers[key].discard(timestamp)
        # each Row holds a visit's output rows as columns, turned into rows after the operator
        return [dict(zip(row.__fields__, values, strict=True))
                for row in out for values in zip(*row, strict=True)]


    def _packed(self, rows: list[tuple[str, int, Any]]) -> dict[Any, list[Row]]:
        """The rows as window() hands them to the processor: through pack_key_groups, in
        batches of two records, then one Row per packed row (as PySpark converts them)."""
        per_group: dict[Any, list[Row]] = {}
        for i in range(0, len(rows), 2):
            batch = pa.record_batch({
                "g": [self.group(k) for k, _, _ in rows[i:i + 2]],
                "key": [k for k, _, _ in rows[i:i + 2]],
                "t": [t for _, t, _ in rows[i:i + 2]],
                **({"v": [v for _, _, v in rows[i:i + 2]]} if self.processor.codec.value else {})})
            for packed in windows.pack_key_groups(iter([batch])):
                for row in packed.to_pylist():
                    per_group.setdefault(row["g"], []).append(Row(*row.values()))
        return per_group


def fired(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["key"], r["window_start"], r["result"], r["pane_index"],
             r["pane_timing"], r["pane_is_last"]) for r in rows if r["kind"] == "result"]


def codec(assigner: Any, function: Any, value: str | None = "v",
          **kw: Any) -> windows.KeyGroupCodec:
    return windows.KeyGroupCodec(assigner, function, kw.get("trigger"),
                                 kw.get("allowed_lateness", 0), kw.get("evictor"), KEYS,
                                 "eventTime", value, kw.get("key_groups", 32))


def processor(assigner: Any, function: Any, value: str | None = "v",
              **kw: Any) -> windows.WindowProcessor:
    return windows.WindowProcessor(codec(assigner, function, value, **kw))


def test_windows_fire_by_timer_when_the_key_has_nothing_new_and_state_is_dropped() -> None:
    run = Runner(processor(windows.tumbling("10 s"), windows.Sum()))
    assert run.batch(-1, [("a", 1_000, 2), ("a", 12_000, 5), ("b", 3_000, 7)]) == []
    # Spark knows each group's earliest timer only: a visit fires every window due
    assert run.handle.timers == {("a",): {9_999}, ("b",): {9_999}}
    out = run.batch(9_999, [("a", 15_000, 1)])
    assert fired(out) == [("a", 0, 2, 0, "ON_TIME", True), ("b", 0, 7, 0, "ON_TIME", True)]
    # window [0, 10 s) is gone from both keys' state and timers; b has nothing left at all
    assert run.handle.timers == {("a",): {19_999}, ("b",): set()}
    assert ("b",) not in run.handle.values
    assert fired(run.batch(20_000, [])) == [("a", 10_000, 6, 0, "ON_TIME", True)]
    assert run.handle.values == {}


def test_one_visit_fires_all_windows_due_and_leaves_the_spark_timer_at_the_next() -> None:
    run = Runner(processor(windows.tumbling("10 s"), windows.Sum()))
    run.batch(-1, [("a", 1_000, 2), ("a", 12_000, 5), ("a", 25_000, 1)])
    # a state stored with a Spark timer per window end (as earlier versions kept it)
    state, _ = run.handle.values[("a",)]
    run.handle.values[("a",)] = (state, [9_999, 19_999, 29_999])
    run.handle.timers[("a",)] = {9_999, 19_999, 29_999}
    # the first expired timer's visit fires both windows and deletes the second, which Spark
    # had listed already: its visit returns at once
    out = run.batch(19_999, [])
    assert fired(out) == [("a", 0, 2, 0, "ON_TIME", True), ("a", 10_000, 5, 0, "ON_TIME", True)]
    assert run.handle.timers == {("a",): {29_999}}
    assert run.handle.values[("a",)][1] == [29_999]


def test_a_state_stored_per_key_before_the_columnar_layout_restores() -> None:
    """A checkpoint written by an earlier version (the operator's per-key snapshot as JSON)
    continues exactly as the state stored in columns does; the next store writes columns."""
    batches = [(-1, [("a", 1_000, 2), ("b", 12_000, 5), ("a", 14_000, 1)]),
               (9_999, [("b", 15_000, 3), ("a", 21_000, 4)]), (30_000, [])]
    runs = [Runner(processor(windows.sliding("10 s", "5 s"), windows.Sum(),
                             allowed_lateness=2_000), group=lambda key: 0) for _ in range(2)]
    for run in runs:
        run.batch(*batches[0])
    text, timers = runs[1].handle.values[(0,)]
    assert json.loads(text)["format"] == windows.COLUMNAR_FORMAT

    def state(run: Runner) -> tuple[dict[str, Any], list[int]]:
        """The group's state per key (the layout earlier versions stored) and its timers."""
        text, registered = run.handle.values[(0,)]
        return run.processor.codec.restore(text).snapshot(), sorted(registered)

    old, _ = state(runs[1])
    runs[1].handle.values[(0,)] = (json.dumps(old), timers)
    for batch in batches[1:]:
        assert runs[1].batch(*batch) == runs[0].batch(*batch) != []
        assert state(runs[1]) == state(runs[0])
        assert json.loads(runs[1].handle.values[(0,)][0])["format"] == windows.COLUMNAR_FORMAT


def test_a_state_stored_with_other_key_groups_is_refused_with_the_fix() -> None:
    """A key's group is its hash modulo the number of groups: restarted with another number, a
    query would look for its keys' windows in other groups. A state stored before the number
    was kept in it restores."""
    run = Runner(processor(windows.tumbling("10 s"), windows.Sum(), key_groups=32))
    run.batch(-1, [("a", 1_000, 2)])
    text, _ = run.handle.values[("a",)]
    assert json.loads(text)["key_groups"] == 32
    with pytest.raises(OptionError, match=r"written with key_groups=32.*pass key_groups=32"):
        codec(windows.tumbling("10 s"), windows.Sum(), key_groups=128).restore(text)
    old = json.loads(text)
    del old["key_groups"]
    restored = codec(windows.tumbling("10 s"), windows.Sum(), key_groups=128).restore(
        json.dumps(old))
    assert restored.earliest_event_time_timer() == 9_999


def test_a_timer_a_record_sets_at_the_watermark_fires_when_the_watermark_next_rises() -> None:
    # Flink's order: W = 75 s, then 74,999, 76, 77 and 78 s in window [70 s, 80 s), whose
    # ContinuousEventTimeTrigger interval timer (75 s) is at W; the next watermark fires it
    # with all four. Here the records come over three batches of the same watermark.
    run = Runner(processor(windows.tumbling("10 s"), windows.Count(),
                           trigger=windows.ContinuousEventTimeTrigger(3_000)))
    assert run.batch(75_000, [("a", 74_999, 0)]) == []
    # Spark would hand over a timer at 75 s in this batch already: the group's is past it
    assert run.handle.timers == {("a",): {75_001}}
    assert run.batch(75_000, [("a", 76_000, 0), ("a", 77_000, 0)]) == []
    assert run.batch(75_000, [("a", 78_000, 0)]) == []
    assert fired(run.batch(76_000, [])) == [("a", 70_000, 4, 0, "EARLY", False)]
    assert run.handle.timers == {("a",): {78_000}}  # the next interval


def test_a_late_element_refires_within_the_lateness_and_is_a_late_row_beyond_it() -> None:
    run = Runner(processor(windows.tumbling("10 s"), windows.Count(), allowed_lateness=5_000))
    run.batch(-1, [("a", 1_000, 0)])
    assert fired(run.batch(9_999, [])) == [("a", 0, 1, 0, "ON_TIME", False)]
    # the batch's watermark is applied before its rows: 2 s is late, within the lateness
    assert fired(run.batch(9_999, [("a", 2_000, 0)])) == [("a", 0, 2, 1, "LATE", False)]
    assert run.batch(14_999, []) == []  # cleanup: no firing, the window's state goes
    out = run.batch(14_999, [("a", 3_000, 42)])
    assert [(r["kind"], r["eventTime"], r["v"]) for r in out] == [("late", 3_000, 42)]
    assert out[0]["window_start"] is None and out[0]["result"] is None


def test_rows_of_a_batch_are_fed_in_event_time_order() -> None:
    run = Runner(processor(windows.tumbling("10 s"), windows.Max(),
                           trigger=windows.CountTrigger(2)))
    # CountTrigger(2) fires at the second element by event time, whatever the order in the
    # batch: the max of the first two is 30, not 50
    out = run.batch(-1, [("a", 5_000, 50), ("a", 1_000, 10), ("a", 3_000, 30)])
    assert fired(out) == [("a", 0, 30, 0, "EARLY", False)]


def test_keys_of_one_key_group_share_its_state_and_timers() -> None:
    run = Runner(processor(windows.tumbling("10 s"), windows.Sum()), group=lambda key: 0)
    run.batch(-1, [("a", 1_000, 2), ("b", 3_000, 7), ("a", 12_000, 5)])
    assert run.handle.timers == {(0,): {9_999}}  # one timer for both keys' windows
    out = run.batch(9_999, [])
    assert fired(out) == [("a", 0, 2, 0, "ON_TIME", True), ("b", 0, 7, 0, "ON_TIME", True)]
    assert run.handle.timers == {(0,): {19_999}} and (0,) in run.handle.values
    assert fired(run.batch(19_999, [("b", 25_000, 1)])) == [("a", 10_000, 5, 0, "ON_TIME", True)]
    assert fired(run.batch(29_999, [])) == [("b", 20_000, 1, 0, "ON_TIME", True)]
    assert run.handle.values == {}


def test_processing_time_timers_fire_only_when_their_key_group_is_visited() -> None:
    run = Runner(processor(windows.tumbling("10 s"), windows.Count(),
                           trigger=windows.ContinuousProcessingTimeTrigger(1_000)))
    run.batch(-1, [("a", 1_000, 0)], processing_time=500)  # a processing timer at 1 s
    # event time mode: Spark knows no processing-time timer, and a's group is not visited
    assert run.batch(-1, [("b", 2_000, 0)], processing_time=5_000) == []
    out = fired(run.batch(-1, [("a", 3_000, 0)], processing_time=6_000))
    assert out and out[0] == ("a", 0, 1, 0, "EARLY", False)  # before the visit's record


def test_sessions_merge_across_batches() -> None:
    run = Runner(processor(windows.session("5 s"), windows.Count()))
    run.batch(-1, [("a", 0, 0), ("a", 8_000, 0)])
    assert run.handle.timers == {("a",): {4_999}}
    run.batch(-1, [("a", 4_000, 0)])
    assert run.handle.timers == {("a",): {12_999}}
    assert fired(run.batch(13_000, [])) == [("a", 0, 3, 0, "ON_TIME", True)]


def test_result_types_and_durations() -> None:
    result_type = windows._result_type
    assert result_type(windows.Count(), None, None) == "long"
    assert result_type(windows.Sum(), "int", None) == "long"
    assert result_type(windows.Avg(), "int", None) == "double"
    assert result_type(windows.Max(), "string", None) == "string"
    assert result_type(windows.ReduceFunction(max), "int", "int") == "int"
    with pytest.raises(OptionError, match="give result_type"):
        result_type(windows.Sum(), "string", None)
    assert windows.ms("1 minute") == 60_000 and windows.ms(250) == 250
    assert windows.sliding("1 min", "10 s").slide == 10_000


def test_pack_key_groups_makes_one_row_per_group_in_record_order() -> None:
    batch = pa.record_batch({"g": [2, 1, 2, 1, 2], "key": ["a", "b", None, "d", "e"],
                             "t": [5, 4, 3, 2, 1]})
    empty = batch.slice(0, 0)
    packed = list(windows.pack_key_groups(iter([empty, batch])))
    assert [p.to_pylist() for p in packed] == [[
        {"g": 1, "key": ["b", "d"], "t": [4, 2]},
        {"g": 2, "key": ["a", None, "e"], "t": [5, 3, 1]},
    ]]


def test_a_visit_pauses_the_cyclic_collector_and_leaves_it_as_it_found_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    run = Runner(processor(windows.tumbling("10 s"), windows.Count()))
    process_elements = windows.WindowOperator.process_elements

    def spy(self: Any, *args: Any) -> Any:
        seen.append(gc.isenabled())
        return process_elements(self, *args)

    monkeypatch.setattr(windows.WindowOperator, "process_elements", spy)
    assert gc.isenabled()
    run.batch(-1, [("a", 1_000, 0)])
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        run.batch(-1, [("a", 2_000, 0)])
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


class GroupStates:
    """Drives a :class:`windows.GroupStateWindow` as Spark's ``applyInPandasWithState`` does:
    PySpark's own ``GroupState`` per call, the groups with records first, then every group
    whose timeout is below the batch's watermark (strictly), with no records; a call's
    timeout is reset unless it sets one."""

    def __init__(self, function: windows.GroupStateWindow) -> None:
        self.function = function
        self.states: dict[Any, tuple[tuple[Any, ...], int]] = {}  # group: (value, timeout)

    def batch(self, watermark: int, frames: dict[Any, list[Any]],
              processing_time: int = 0) -> list[dict[str, Any]]:
        from pyspark.sql.types import StringType, StructField, StructType

        out = []
        timed_out = [g for g, (_, timeout) in self.states.items()
                     if timeout != -1 and timeout < watermark and g not in frames]
        for group, mine, expired in [*((g, f, False) for g, f in frames.items()),
                                     *((g, [], True) for g in timed_out)]:
            value = self.states.get(group, (None, -1))[0]
            state = GroupState(
                optionalValue=cast(Row, value and Row(*value)),
                batchProcessingTimeMs=processing_time,
                eventTimeWatermarkMs=watermark, timeoutConf="EventTimeTimeout",
                hasTimedOut=expired, watermarkPresent=True, defined=value is not None,
                updated=False, removed=False, timeoutTimestamp=-1, keyAsUnsafe=b"",
                valueSchema=StructType([StructField("state", StringType())]))
            out += list(self.function.visit((group,), iter(mine), state))
            if state.exists:
                self.states[group] = (state.get, state._timeout_timestamp)
            else:
                self.states.pop(group, None)
        return [dict(zip(list(self.function.codec.row), values, strict=True))
                for frame in out for values in zip(*frame.iloc[0], strict=True)]


def group_state_window(nullable: list[str] = [], **kw: Any) -> windows.GroupStateWindow:  # noqa: B006
    return windows.GroupStateWindow(
        codec(windows.tumbling("10 s"), windows.Count(), **kw),
        ["key", windows._TIME, windows._VALUE], nullable)


def frame(rows: list[tuple[str, int, Any]], nullable: bool = False) -> Any:
    import pandas as pd

    values = [v for _, _, v in rows]
    return pd.DataFrame({
        windows._GROUP: [0] * len(rows), "key": [k for k, _, _ in rows],
        windows._TIME: [t for _, t, _ in rows],
        windows._VALUE: [0 if v is None else v for v in values] if nullable else values,
        **({windows._NULLS: [int(v is None) for v in values]} if nullable else {}),
    })


def test_group_state_window_times_out_a_group_when_the_core_fires_its_earliest_timer() -> None:
    run = GroupStates(group_state_window())
    assert run.batch(0, {0: [frame([("a", 1_000, 0), ("a", 12_000, 0)])]}) == []
    # the core's timer 9,999 fires at the first watermark at or past it: Spark calls a group
    # whose timeout is below the watermark
    assert run.states[0][1] == 9_998
    assert fired(run.batch(9_998, {})) == []
    assert fired(run.batch(9_999, {})) == [("a", 0, 1, 0, "ON_TIME", True)]
    assert run.states[0][1] == 19_998
    assert fired(run.batch(30_000, {})) == [("a", 10_000, 1, 0, "ON_TIME", True)]
    assert run.states == {}  # nothing left: the group's state is removed


def test_group_state_window_times_out_a_timer_at_the_watermark_when_it_next_rises() -> None:
    # as test_a_timer_a_record_sets_at_the_watermark_fires_when_the_watermark_next_rises
    run = GroupStates(group_state_window(trigger=windows.ContinuousEventTimeTrigger(3_000)))
    assert run.batch(75_000, {0: [frame([("a", 74_999, 0)])]}) == []
    # a timeout below the watermark is refused; at it, the group is called when it rises
    assert run.states[0][1] == 75_000
    assert run.batch(75_000, {0: [frame([("a", 76_000, 0), ("a", 77_000, 0)])]}) == []
    assert fired(run.batch(76_000, {})) == [("a", 70_000, 3, 0, "EARLY", False)]


def test_group_state_window_keeps_a_nullable_numbers_nulls_and_digits() -> None:
    # pandas would make the column floats: 2**53 + 1 would lose its last digit, None be NaN
    run = GroupStates(group_state_window(nullable=[windows._VALUE]))
    big = 2**53 + 1
    rows = run.batch(20_000, {0: [frame([("a", 1_000, big), ("a", 2_000, None)],
                                        nullable=True)]})
    assert [(r["key"], r["eventTime"], r["v"]) for r in rows if r["kind"] == "late"] == [
        ("a", 1_000, big), ("a", 2_000, None)]


#: (the window's arguments, the key group of a key, batches of (watermark, records, processing
#: time)): the cases above, run through both operators' functions
SCENARIOS: list[tuple[dict[str, Any], Callable[[str], Any], list[tuple[int, list[Any], int]]]] = [
    ({"assigner": windows.tumbling("10 s"), "function": windows.Sum()}, lambda key: key,
     [(-1, [("a", 1_000, 2), ("a", 12_000, 5), ("b", 3_000, 7)], 0),
      (9_999, [("a", 15_000, 1)], 0), (20_000, [], 0)]),
    ({"assigner": windows.tumbling("10 s"), "function": windows.Count(),
      "trigger": windows.ContinuousEventTimeTrigger(3_000)}, lambda key: key,
     [(75_000, [("a", 74_999, 0)], 0), (75_000, [("a", 76_000, 0), ("a", 77_000, 0)], 0),
      (75_000, [("a", 78_000, 0)], 0), (76_000, [], 0), (90_000, [], 0)]),
    ({"assigner": windows.tumbling("10 s"), "function": windows.Count(),
      "allowed_lateness": 5_000}, lambda key: key,
     [(-1, [("a", 1_000, 0)], 0), (9_999, [], 0), (9_999, [("a", 2_000, 0)], 0),
      (14_999, [], 0), (14_999, [("a", 3_000, 42)], 0)]),
    ({"assigner": windows.tumbling("10 s"), "function": windows.Max(),
      "trigger": windows.CountTrigger(2)}, lambda key: key,
     [(-1, [("a", 5_000, 50), ("a", 1_000, 10), ("a", 3_000, 30)], 0)]),
    ({"assigner": windows.tumbling("10 s"), "function": windows.Sum()}, lambda key: 0,
     [(-1, [("a", 1_000, 2), ("b", 3_000, 7), ("a", 12_000, 5)], 0), (9_999, [], 0),
      (19_999, [("b", 25_000, 1)], 0), (29_999, [], 0)]),
    ({"assigner": windows.tumbling("10 s"), "function": windows.Count(),
      "trigger": windows.ContinuousProcessingTimeTrigger(1_000)}, lambda key: key,
     [(-1, [("a", 1_000, 0)], 500), (-1, [("b", 2_000, 0)], 5_000),
      (-1, [("a", 3_000, 0)], 6_000)]),
    ({"assigner": windows.session("5 s"), "function": windows.Count()}, lambda key: key,
     [(-1, [("a", 0, 0), ("a", 8_000, 0)], 0), (-1, [("a", 4_000, 0)], 0), (13_000, [], 0)]),
]


@pytest.mark.parametrize("window, group, batches", SCENARIOS)
def test_both_operators_functions_fire_the_same_rows_in_the_same_batches(
        window: dict[str, Any], group: Callable[[str], Any],
        batches: list[tuple[int, list[Any], int]]) -> None:
    window = {**window}
    assigner, function = window.pop("assigner"), window.pop("function")
    tws = Runner(processor(assigner, function, **window), group=group)
    pandas = GroupStates(windows.GroupStateWindow(
        codec(assigner, function, **window), ["key", windows._TIME, windows._VALUE], []))
    seen = 0
    for watermark, rows, processing_time in batches:
        frames: dict[Any, list[Any]] = {}
        for key, time, value in rows:
            frames.setdefault(group(key), []).append((key, time, value))
        expected = tws.batch(watermark, rows, processing_time)
        got = pandas.batch(watermark, {g: [frame(r)] for g, r in frames.items()},
                           processing_time)
        assert sorted(map(repr, got)) == sorted(map(repr, expected))
        seen += len(got)
    assert seen  # every scenario fires something
    # the same groups hold state on both
    assert {group for group, in tws.handle.values} == set(pandas.states)
