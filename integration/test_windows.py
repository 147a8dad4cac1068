"""``flinkish.windows`` through Spark on a real broker: Flink's window operator as one
``applyInPandasWithState`` on the combined watermark
(``flinkish.with_watermark``).

* a tumbling count over a lagging partition: exact counts, one ON_TIME pane per window;
* allowed lateness, one record per micro-batch under a punctuated watermark so that W is known
  in every batch: a late record re-fires its window (a LATE pane), one beyond the lateness comes
  out as a late row, although Spark's own late-row filter would have dropped it;
* early firings (``ContinuousEventTimeTrigger``): EARLY panes, then the ON_TIME one;
* session windows merged by a record that arrives in a later batch between two sessions;
* a checkpoint of flinkish 0.1's ``transformWithState`` operator: refused, with what to do;
* an idle partition: one falls silent and ``idleTimeout`` releases the combined watermark, so
  windows fire while the query runs, each in the batch whose watermark passed its end.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming import StatefulProcessor

import flinkish
from flinkish import windows
from integration.kafka_helpers import Collector, produce, source, wait_for

pytestmark = pytest.mark.integration

BASE = 1_700_000_000_000  # a multiple of the 10 s window
WINDOW_MS = 10_000
END = BASE + WINDOW_MS  # the end of window [BASE, END)
LAG_MS = {0: 0, 1: 60_000}  # partition 1 lags a minute behind partition 0
RECORDS = 40  # per partition, one a second
DEADLINE = 240  # s for one AvailableNow run
FLAG, PLAIN = b'{"p": true}', b"{}"


def lagging(partitions: tuple[int, ...] = (0, 1)) -> list[tuple[int, bytes, bytes, int]]:
    """RECORDS records a second apart per partition, keyed by partition, partition 1 a minute
    behind partition 0."""
    return [(p, f"k{p}".encode(), PLAIN, BASE - LAG_MS[p] + i * 1_000)
            for i in range(RECORDS) for p in partitions]


def ms(timestamp: Any) -> int:
    return round(timestamp.timestamp() * 1000)


def run(df: Any, checkpoint: Path) -> tuple[Any, list[tuple[int, Any]]]:
    """Runs ``df`` AvailableNow into a collector: the stopped query, (batch id, row)s."""
    collector = Collector()
    query = (df.writeStream.foreachBatch(collector).outputMode("append")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(DEADLINE)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    return query, collector.rows


def dropped(query: Any) -> int:
    return sum(op.get("numRowsDroppedByWatermark", 0)
               for p in query.recentProgress for op in p.get("stateOperators", []))


def panes(rows: list[tuple[int, Any]]) -> list[tuple[str, int, int, int, int, str, bool]]:
    """(key, window start, window end, result, pane index, timing, last) of the result rows,
    in emission order."""
    return [(r.key, ms(r.window_start), ms(r.window_end), r.result, r.pane_index,
             r.pane_timing, r.pane_is_last) for _, r in rows if r.kind == "result"]


def keyed(events: Any) -> Any:
    return flinkish.with_watermark(events).selectExpr("CAST(key AS STRING) AS key", "eventTime")


def test_a_tumbling_count_over_a_lagging_partition_fires_every_window_on_time(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None
) -> None:
    name = topic(2)
    records = lagging()
    produce(kafka_bootstrap, name, records)
    flinkish.register(spark)
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"), **{
        "watermark.maxOutOfOrderness": "1 second", "maxOffsetsPerTrigger": "20",
        "endingOffsets": "latest"})  # bounded: at the end W is MAX and every window closes
    counts = windows.window(keyed(events), key="key", assigner=windows.tumbling("10 seconds"),
                            aggregate=windows.Count())
    query, rows = run(counts, tmp_path / "ck")
    truth = Counter((k.decode(), ts - ts % WINDOW_MS) for _, k, _, ts in records)
    fired = panes(rows)
    assert sorted(fired) == sorted(
        (k, start, start + WINDOW_MS, n, 0, "ON_TIME", True) for (k, start), n in truth.items())
    assert [r for _, r in rows if r.kind != "result"] == []
    assert dropped(query) == 0
    # the lagging partition's windows closed batch by batch as the combined watermark passed
    # them, while partition 0's (a minute ahead) waited for the end
    assert len({b for b, r in rows if r.key == "k1"}) > 1


def punctuated(spark: Any, bootstrap: str, name: str, state: Path,
               rows: list[tuple[int, bytes]]) -> Any:
    """One record of key k per micro-batch, in ``rows`` order (offset o in batch o); a record
    whose value is FLAG sets the watermark to its own event time: read in batch n, its
    watermark is in batch n's carrier, and Spark's watermark from batch n + 2 on."""
    produce(bootstrap, name, [(0, b"k", value, ts) for ts, value in rows])
    flinkish.register(spark)
    return source(spark, bootstrap, name, str(state), **{
        "watermark.strategy": "punctuated", "watermark.punctuation.field": "p",
        "maxOffsetsPerTrigger": "1"})


LATENESS_MS = 5_000
CLEANUP = END - 1 + LATENESS_MS  # [BASE, END) is cleared when W reaches this
LATE_ROWS = [(BASE + 1_000, PLAIN),
             (END - 1, FLAG),  # batch n's carrier brings it; W = END - 1 from batch n + 2 on
             (END + 5_000, PLAIN),
             (BASE + 2_000, PLAIN),  # W = END - 1: [BASE, END) fires ON_TIME, then LATE with it
             (CLEANUP, FLAG),  # W = CLEANUP from batch 6 on: [BASE, END) is gone
             (END + 6_000, PLAIN),
             (BASE + 3_000, PLAIN),  # beyond the lateness, and <= the previous batch's W
             (END + 2_000, PLAIN),
             (END + 20_000, FLAG),  # closes [END, END + 10 s) in batch 10
             (END + 20_001, PLAIN),
             (END + 20_002, PLAIN)]


def late_counts(events: Any) -> Any:
    return windows.window(keyed(events), key="key", assigner=windows.tumbling("10 seconds"),
                          aggregate=windows.Count(), allowed_lateness="5 seconds")


def test_allowed_lateness_refires_a_late_window_and_sends_what_is_too_late_to_the_late_rows(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None
) -> None:
    events = punctuated(spark, kafka_bootstrap, topic(1), tmp_path / "state", LATE_ROWS)
    fired = late_counts(events)
    query, out = run(fired, tmp_path / "ck")
    assert panes(out) == [("k", BASE, END, 2, 0, "ON_TIME", False),
                          ("k", BASE, END, 3, 1, "LATE", False),
                          ("k", END, END + WINDOW_MS, 4, 0, "ON_TIME", False)]
    results, late = windows.split(fired)
    assert results.columns == ["key", *windows.PANE_COLUMNS]
    assert late.columns == ["key", "eventTime"]
    late_rows = [r for _, r in out if r.kind == "late"]
    assert [(r.key, ms(r.eventTime), r.result) for r in late_rows] == [("k", BASE + 3_000, None)]
    # offset o is read in batch o: the record at BASE + 3 s came in batch 6, whose previous
    # batch ran with W = END - 1 >= BASE + 3 s; Spark's late-row filter would have dropped it
    # silently, but it reached the operator: nothing was dropped
    assert [b for b, r in out if r.kind == "late"] == [6]
    assert dropped(query) == 0


class StandIn01(StatefulProcessor):
    """Stands in for flinkish 0.1's window operator: a ``transformWithState`` processor (the
    same Spark operator) keeping a value state per key group as it did."""

    def init(self, handle: Any) -> None:
        self.state = handle.getValueState("window", "state string, timers array<long>")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        self.state.update(("{}", []))
        yield from ()

    def close(self) -> None:
        pass


def test_a_query_restarted_on_a_checkpoint_of_flinkish_0_1s_operator_is_told_what_to_do(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A checkpoint written by flinkish 0.1's ``transformWithState`` operator: restarted with
    ``window()``, Spark refuses it in the first batch, naming both operators, before anything
    is read or written, and flinkish's listener logs which version wrote it and what to do."""
    from pyspark.errors import StreamingQueryException

    name = topic(1)
    events = punctuated(spark, kafka_bootstrap, name, tmp_path / "state",
                        [(BASE + 1_000, PLAIN), (BASE + 2_000, PLAIN)])
    run(keyed(events).groupBy("key").transformWithState(
        statefulProcessor=StandIn01(), outputStructType="key string", outputMode="Append",
        timeMode="EventTime"), tmp_path / "ck")
    produce(kafka_bootstrap, name, [(0, b"k", PLAIN, END + 5_000)])
    collector = Collector()
    counts = windows.window(keyed(events), key="key", assigner=windows.tumbling("10 seconds"),
                            aggregate=windows.Count())
    query = (counts.writeStream.foreachBatch(collector)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
    with pytest.raises(StreamingQueryException) as refused:
        query.awaitTermination(DEADLINE)
    query.stop()
    message = str(refused.value)
    assert "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA" in message
    assert "transformWithStateInPySparkExec" in message and "applyInPandasWithState" in message
    assert collector.rows == []
    # the listener hears of the termination on Spark's listener thread
    wait_for(lambda: any(windows.UNSUPPORTED_0_1 in r.getMessage() for r in caplog.records),
             DEADLINE, "the listener's explanation")


def test_the_sinks_upsert_mode_keeps_each_windows_latest_pane_exactly_once(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None,
    postgres_dsn: str,
) -> None:
    """The operator's whole output in one query: the flinkish sink upserts the panes and, with
    ``lateData=side``, appends the late rows to their own table in the same epochs (one
    query, so one judgement of lateness: two queries over ``split()``'s parts would each run
    the operator at their own batch boundaries and could disagree on a record)."""
    import psycopg

    events = punctuated(spark, kafka_bootstrap, topic(1), tmp_path / "state", LATE_ROWS)
    table = f"panes_{uuid.uuid4().hex[:8]}"
    query = (late_counts(events).writeStream.format("flinkish").option("target", "postgres")
             .option("dsn", postgres_dsn).option("table", table)
             .option("upsertKey", "key,window_start,window_end")
             .option("lateData", "side").option("lateData.table", f"{table}_late")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
    try:
        query.awaitTermination(DEADLINE)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT kind, key, (extract(epoch FROM window_start) * 1000)::bigint, result, "
            f"pane_index, pane_timing FROM {table} ORDER BY 3").fetchall()
        late = conn.execute(f'SELECT kind, key, "eventTime" FROM {table}_late').fetchall()
        columns = {name: [c for (c,) in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "ORDER BY ordinal_position", [name])] for name in (table, f"{table}_late")}
        epochs = conn.execute(
            f"SELECT sum(rows), sum(late_rows) FROM {table}_flinkish_epochs").fetchone()
    # [BASE, END)'s ON_TIME and LATE panes came in one batch: the LATE one is the row
    assert rows == [("result", "k", BASE, 3, 1, "LATE"), ("result", "k", END, 4, 0, "ON_TIME")]
    assert [(kind, key, ms(t)) for kind, key, t in late] == [("late", "k", BASE + 3_000)]
    # no column null in every row: the results' table has no event time, the late one no pane
    assert columns == {table: ["key", "kind", "window_start", "window_end", "result",
                               "pane_index", "pane_timing", "pane_is_last"],
                       f"{table}_late": ["key", "kind", "eventTime"]}
    assert epochs == (4, 1)  # three panes and one late row written, each once


def test_upserting_late_rows_is_refused_with_the_fix(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None,
    postgres_dsn: str,
) -> None:
    """A late row has no window: upserting the whole output on the window's columns would
    fail in PostgreSQL mid-stream; the sink says so at the start, with the fix."""
    events = punctuated(spark, kafka_bootstrap, topic(1), tmp_path / "state", LATE_ROWS)
    query = (late_counts(events).writeStream.format("flinkish").option("target", "postgres")
             .option("dsn", postgres_dsn).option("table", f"p_{uuid.uuid4().hex[:8]}")
             .option("upsertKey", "key,window_start,window_end")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
    try:
        with pytest.raises(Exception, match="lateData=side"):
            query.awaitTermination(DEADLINE)
    finally:
        query.stop()


def test_early_firings_then_the_on_time_pane(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None
) -> None:
    name = topic(2)
    records = lagging()
    produce(kafka_bootstrap, name, records)
    flinkish.register(spark)
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"), **{
        "watermark.maxOutOfOrderness": "1 second", "maxOffsetsPerTrigger": "10",
        "endingOffsets": "latest"})
    counts = windows.window(keyed(events), key="key", assigner=windows.tumbling("10 seconds"),
                            aggregate=windows.Count(),
                            trigger=windows.ContinuousEventTimeTrigger(windows.ms("3 seconds")))
    query, rows = run(counts, tmp_path / "ck")
    truth = Counter((k.decode(), ts - ts % WINDOW_MS) for _, k, _, ts in records)
    by_window: dict[tuple[str, int], list[tuple[int, int, str, bool]]] = {}
    for key, start, _, n, index, timing, last in panes(rows):
        by_window.setdefault((key, start), []).append((index, n, timing, last))
    assert set(by_window) == set(truth)
    for window, fired in by_window.items():
        # panes 0, 1, ... in order; EARLY ones with growing counts, the last ON_TIME and exact
        assert [index for index, _, _, _ in fired] == list(range(len(fired)))
        assert [t for _, _, t, _ in fired] == ["EARLY"] * (len(fired) - 1) + ["ON_TIME"]
        counts_seen = [n for _, n, _, _ in fired]
        assert counts_seen == sorted(counts_seen) and counts_seen[-1] == truth[window]
        assert [last for _, _, _, last in fired] == [False] * (len(fired) - 1) + [True]
    assert any(len(fired) > 1 for fired in by_window.values())
    assert dropped(query) == 0


def test_session_windows_merge_when_a_later_record_bridges_them(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None
) -> None:
    rows = [(BASE, PLAIN),  # session [BASE, BASE + 5 s)
            (BASE + 8_000, PLAIN),  # a second one, [BASE + 8 s, BASE + 13 s)
            (BASE + 4_000, PLAIN),  # [BASE + 4 s, BASE + 9 s) overlaps both: one session
            (BASE + 30_000, PLAIN),  # a session of its own
            (BASE + 20_000, FLAG),  # W = BASE + 20 s from batch 6: the merged session closes
            (BASE + 20_001, PLAIN),
            (BASE + 20_002, PLAIN)]
    events = punctuated(spark, kafka_bootstrap, topic(1), tmp_path / "state", rows)
    sessions = windows.window(keyed(events), key="key", assigner=windows.session("5 seconds"),
                              aggregate=windows.Count())
    query, out = run(sessions, tmp_path / "ck")
    assert panes(out) == [("k", BASE, BASE + 13_000, 3, 0, "ON_TIME", True)]
    assert [b for b, _ in out] == [6]
    assert dropped(query) == 0


def test_plan_time_guards(spark: Any, kafka_bootstrap: str, tmp_path: Path) -> None:
    from flinkish_core.errors import OptionError

    events = source(spark, kafka_bootstrap, "guards", str(tmp_path / "state"))
    records = events.filter("kind = 'record'").select("key", "eventTime")
    with pytest.raises(OptionError, match="carries no watermark"):
        windows.window(records, key="key", assigner=windows.tumbling("1 minute"),
                       aggregate=windows.Count())
    watermarked = flinkish.with_watermark(events)
    with pytest.raises(OptionError, match="exactly one of aggregate= or process="):
        windows.window(watermarked, key="key", assigner=windows.tumbling("1 minute"))
    with pytest.raises(OptionError, match="key and value columns must be numbers"):
        windows.window(watermarked, key="key", assigner=windows.tumbling("1 minute"),
                       aggregate=windows.Count())  # key is binary
    watermarked = watermarked.selectExpr("CAST(key AS STRING) AS key", "offset", "eventTime")
    with pytest.raises(OptionError, match="give result_type"):
        windows.window(watermarked, key="key", assigner=windows.tumbling("1 minute"),
                       aggregate=windows.ReduceFunction(max), value="offset")
    with pytest.raises(ValueError, match="cannot be used with merging windows"):
        windows.window(watermarked, key="key", assigner=windows.session("1 minute"),
                       aggregate=windows.Count(), trigger=windows.Trigger())


SILENT = [(1, b"k1", PLAIN, BASE + i * 1_000) for i in range(5)]  # then nothing more
SILENT_LAST = SILENT[-1][3]


class Ticker:
    """Produces key k0 to partition 0 while the query runs, a record every 0.1 s, each a
    second of event time after the last: ten seconds of event time (a window) a second, and
    never idle for long, however slow a batch is."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.produced: list[int] = []  # event times
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.is_set():
            ts = BASE + len(self.produced) * 1_000
            self.producer.produce(self.topic, key=b"k0", value=PLAIN, partition=0, timestamp=ts)
            self.producer.flush(30)
            self.produced.append(ts)
            self.stopped.wait(0.1)

    def __enter__(self) -> Ticker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(60)


def offsets_log(checkpoint: Path, topic: str) -> dict[int, tuple[int, str | None]]:
    """batch -> (Spark's watermark of the batch, partition 1's status in its end offset)."""
    found = {}
    for entry in (checkpoint / "offsets").iterdir():
        if entry.name.isdigit():
            lines = entry.read_text().splitlines()
            offset = json.loads(lines[-1])["topics"][topic]["1"]
            found[int(entry.name)] = (int(json.loads(lines[1])["batchWatermarkMs"]),
                                      offset.get("status"))
    return found


def test_an_idle_partition_lets_windows_fire_while_the_query_runs(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None
) -> None:
    """Partition 1 writes five records and falls silent; partition 0 keeps arriving. The
    combined watermark is the minimum over partitions, so without idleness it would stay
    below SILENT_LAST and no window [BASE + k * 10 s, ...) could fire while the query runs:
    each one below fires only because partition 1 went IDLE."""
    name = topic(2)
    produce(kafka_bootstrap, name, SILENT)
    flinkish.register(spark)
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"), **{
        "watermark.maxOutOfOrderness": "1 second", "idleTimeout": "3 seconds"})
    counts = windows.window(keyed(events), key="key", assigner=windows.tumbling("10 seconds"),
                            aggregate=windows.Count())
    collector = Collector()
    checkpoint = tmp_path / "ck"
    query = (counts.writeStream.foreachBatch(collector).outputMode("append")
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="0 seconds").start())
    must_fire = {("k0", BASE + k * WINDOW_MS) for k in range(4)} | {("k1", BASE)}

    def fired() -> dict[tuple[str, int], tuple[int, Any]]:
        with collector.lock:
            return {(r.key, ms(r.window_start)): (b, r) for b, r in collector.rows
                    if r.kind == "result"}

    try:
        with Ticker(kafka_bootstrap, name) as ticker:
            wait_for(lambda: must_fire <= set(fired()), DEADLINE,
                     f"windows {sorted(must_fire)} to fire while the query runs")
            assert query.isActive and query.exception() is None
        produced = list(ticker.produced)
    finally:
        query.stop()
    log = offsets_log(checkpoint, name)
    firings = fired()
    for window in sorted(must_fire):
        batch, row = firings[window]
        end = window[1] + WINDOW_MS
        counted = sum(1 for ts in (produced if window[0] == "k0" else
                                   [t for _, _, _, t in SILENT]) if window[1] <= ts < end)
        assert (row.result, row.pane_index, row.pane_timing, row.pane_is_last) == (
            counted, 0, "ON_TIME", True), (window, row)
        # fired in the first batch whose watermark passed the window's end, a watermark
        # partition 1 alone could never have given (it stays below its last record), after
        # partition 1 went IDLE
        passed = min(b for b, (w, _) in log.items() if w >= end - 1)
        assert batch == passed, (window, batch, passed, log)
        assert log[batch][0] >= end - 1 > SILENT_LAST, (window, log[batch])
        assert any(status == "IDLE" for b, (_, status) in log.items() if b < batch), log
    # partition 1 held the watermark back until it went idle
    first_idle = min(b for b, (_, status) in log.items() if status == "IDLE")
    assert all(w < SILENT_LAST for b, (w, _) in log.items() if b <= first_idle), log
    assert [r for _, r in collector.rows if r.kind == "late"] == []
    assert dropped(query) == 0
