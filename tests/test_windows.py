"""``flinkish.windows``' ``applyInPandasWithState`` function without Spark: a stand-in for
Spark's group states and event-time timeouts drives it as ``applyInPandasWithState`` would
(per key group: the group's records, or its timeout), and checks the firings, the late rows,
the state kept per group and the timeouts set."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Sequence
from typing import Any, cast

import pytest
from pyspark.sql import Row
from pyspark.sql.streaming.state import GroupState

from flinkish import windows
from flinkish_core.errors import OptionError

KEYS = ["key"]


def fired(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["key"], r["window_start"], r["result"], r["pane_index"],
             r["pane_timing"], r["pane_is_last"]) for r in rows if r["kind"] == "result"]


def window_function(assigner: Any, function: Any, value: str | None = "v",
                    nullable: Sequence[str] = (), **kw: Any) -> windows.GroupStateWindow:
    return windows.GroupStateWindow(assigner, function, kw.get("trigger"),
                                    kw.get("allowed_lateness", 0), kw.get("evictor"), KEYS,
                                    "eventTime", value, kw.get("key_groups", 32), nullable)


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
        return [dict(zip(list(self.function.row), values, strict=True))
                for frame in out for values in zip(*frame.iloc[0], strict=True)]


def group_state_window(**kw: Any) -> windows.GroupStateWindow:
    return window_function(windows.tumbling("10 s"), windows.Count(), **kw)


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
    # Flink's order: W = 75 s, then 74,999, 76 and 77 s in window [70 s, 80 s), whose
    # ContinuousEventTimeTrigger interval timer (75 s) is at W; the next watermark fires it
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


class Runner(GroupStates):
    """:class:`GroupStates` fed records (key, event time, value): each key group's records as
    one frame. ``group`` maps a key to its key group (by default its own)."""

    def __init__(self, assigner: Any, function: Any,
                 group: Callable[[str], Any] = lambda key: key, **kw: Any) -> None:
        super().__init__(window_function(assigner, function, **kw))
        self.group = group

    def records(self, watermark: int, rows: list[tuple[str, int, Any]],
                processing_time: int = 0) -> list[dict[str, Any]]:
        per_group: dict[Any, list[tuple[str, int, Any]]] = {}
        for row in rows:
            per_group.setdefault(self.group(row[0]), []).append(row)
        return self.batch(watermark, {g: [frame(r)] for g, r in per_group.items()},
                          processing_time)

    @property
    def timeouts(self) -> dict[Any, int]:
        return {group: timeout for group, (_, timeout) in self.states.items()}


def test_windows_fire_by_timeout_when_the_key_has_nothing_new_and_state_is_dropped() -> None:
    run = Runner(windows.tumbling("10 s"), windows.Sum())
    assert run.records(-1, [("a", 1_000, 2), ("a", 12_000, 5), ("b", 3_000, 7)]) == []
    # Spark knows each group's earliest timer only: a visit fires every window due
    assert run.timeouts == {"a": 9_998, "b": 9_998}
    out = run.records(9_999, [("a", 15_000, 1)])
    assert fired(out) == [("a", 0, 2, 0, "ON_TIME", True), ("b", 0, 7, 0, "ON_TIME", True)]
    # window [0, 10 s) is gone from both keys' state; b has nothing left at all
    assert run.timeouts == {"a": 19_998}
    assert fired(run.records(20_000, [])) == [("a", 10_000, 6, 0, "ON_TIME", True)]
    assert run.states == {}


def test_one_visit_fires_all_windows_due_and_leaves_the_timeout_at_the_next() -> None:
    run = Runner(windows.tumbling("10 s"), windows.Sum())
    run.records(-1, [("a", 1_000, 2), ("a", 12_000, 5), ("a", 25_000, 1)])
    out = run.records(19_999, [])
    assert fired(out) == [("a", 0, 2, 0, "ON_TIME", True), ("a", 10_000, 5, 0, "ON_TIME", True)]
    assert run.timeouts == {"a": 29_998}


def test_a_state_stored_with_other_key_groups_is_refused_with_the_fix() -> None:
    """A key's group is its hash modulo the number of groups: restarted with another number, a
    query would look for its keys' windows in other groups."""
    run = Runner(windows.tumbling("10 s"), windows.Sum(), key_groups=32)
    run.records(-1, [("a", 1_000, 2)])
    (text,), _ = run.states["a"]
    assert json.loads(text)["key_groups"] == 32
    with pytest.raises(OptionError, match=r"written with key_groups=32.*pass key_groups=32"):
        window_function(windows.tumbling("10 s"), windows.Sum(), key_groups=128).restore(text)


def test_a_late_element_refires_within_the_lateness_and_is_a_late_row_beyond_it() -> None:
    run = Runner(windows.tumbling("10 s"), windows.Count(), allowed_lateness=5_000)
    run.records(-1, [("a", 1_000, 0)])
    assert fired(run.records(9_999, [])) == [("a", 0, 1, 0, "ON_TIME", False)]
    # the batch's watermark is applied before its rows: 2 s is late, within the lateness
    assert fired(run.records(9_999, [("a", 2_000, 0)])) == [("a", 0, 2, 1, "LATE", False)]
    assert run.records(14_999, []) == []  # cleanup: no firing, the window's state goes
    out = run.records(14_999, [("a", 3_000, 42)])
    assert [(r["kind"], r["eventTime"], r["v"]) for r in out] == [("late", 3_000, 42)]
    assert out[0]["window_start"] is None and out[0]["result"] is None


def test_rows_of_a_batch_are_fed_in_event_time_order() -> None:
    run = Runner(windows.tumbling("10 s"), windows.Max(), trigger=windows.CountTrigger(2))
    # CountTrigger(2) fires at the second element by event time, whatever the order in the
    # batch: the max of the first two is 30, not 50
    out = run.records(-1, [("a", 5_000, 50), ("a", 1_000, 10), ("a", 3_000, 30)])
    assert fired(out) == [("a", 0, 30, 0, "EARLY", False)]


def test_keys_of_one_key_group_share_its_state_and_timeout() -> None:
    run = Runner(windows.tumbling("10 s"), windows.Sum(), group=lambda key: 0)
    run.records(-1, [("a", 1_000, 2), ("b", 3_000, 7), ("a", 12_000, 5)])
    assert run.timeouts == {0: 9_998}  # one timeout for both keys' windows
    out = run.records(9_999, [])
    assert fired(out) == [("a", 0, 2, 0, "ON_TIME", True), ("b", 0, 7, 0, "ON_TIME", True)]
    assert run.timeouts == {0: 19_998}
    assert fired(run.records(19_999, [("b", 25_000, 1)])) == [
        ("a", 10_000, 5, 0, "ON_TIME", True)]
    assert fired(run.records(29_999, [])) == [("b", 20_000, 1, 0, "ON_TIME", True)]
    assert run.states == {}


def test_processing_time_timers_fire_only_when_their_key_group_is_visited() -> None:
    run = Runner(windows.tumbling("10 s"), windows.Count(),
                 trigger=windows.ContinuousProcessingTimeTrigger(1_000))
    run.records(-1, [("a", 1_000, 0)], processing_time=500)  # a processing timer at 1 s
    # event time mode: Spark knows no processing-time timer, and a's group is not visited
    assert run.records(-1, [("b", 2_000, 0)], processing_time=5_000) == []
    out = fired(run.records(-1, [("a", 3_000, 0)], processing_time=6_000))
    assert out and out[0] == ("a", 0, 1, 0, "EARLY", False)  # before the visit's record


def test_sessions_merge_across_batches() -> None:
    run = Runner(windows.session("5 s"), windows.Count())
    run.records(-1, [("a", 0, 0), ("a", 8_000, 0)])
    assert run.timeouts == {"a": 4_998}
    run.records(-1, [("a", 4_000, 0)])
    assert run.timeouts == {"a": 12_998}
    assert fired(run.records(13_000, [])) == [("a", 0, 3, 0, "ON_TIME", True)]


def test_window_refuses_flinkish_0_1s_operator_with_what_to_do() -> None:
    with pytest.raises(OptionError, match=r"flinkish 0\.1.*flinkish 0\.2.*new checkpointLocation"):
        windows.window(None, "key", windows.tumbling("10 s"), aggregate=windows.Count(),
                       operator=windows.TRANSFORM_WITH_STATE)


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


def test_a_visit_pauses_the_cyclic_collector_and_leaves_it_as_it_found_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    run = Runner(windows.tumbling("10 s"), windows.Count())
    process_elements = windows.WindowOperator.process_elements

    def spy(self: Any, *args: Any) -> Any:
        seen.append(gc.isenabled())
        return process_elements(self, *args)

    monkeypatch.setattr(windows.WindowOperator, "process_elements", spy)
    assert gc.isenabled()
    run.records(-1, [("a", 1_000, 0)])
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        run.records(-1, [("a", 2_000, 0)])
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_a_restart_on_a_checkpoint_of_flinkish_0_1s_operator_is_explained(
        caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from flinkish.epoch_listener import CompletedEpochListener

    refusal = ("[STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA] Streaming stateful "
               "operator name does not match with the operator in state metadata. Stateful "
               "operators in the metadata: [(OperatorId: 0 -> OperatorName: "
               "transformWithStateInPySparkExec)]; Stateful operators in current batch: "
               "[(OperatorId: 0 -> OperatorName: applyInPandasWithState)].")
    listener = CompletedEpochListener()
    listener.onQueryTerminated(SimpleNamespace(id="q1", exception=refusal))
    listener.onQueryTerminated(SimpleNamespace(id="q2", exception="some other failure"))
    listener.onQueryTerminated(SimpleNamespace(id="q3", exception=None))
    (record,) = caplog.records
    assert record.levelname == "ERROR"
    assert "q1" in record.getMessage() and windows.UNSUPPORTED_0_1 in record.getMessage()
