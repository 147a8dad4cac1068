"""Spark's other stateful operators on the valve's combined watermark (``flinkish.with_watermark``):
session windows, ``dropDuplicatesWithinWatermark`` and ``transformWithStateInPandas`` event-time
timers, against a real broker and real Spark, each beside Spark's own ``withWatermark`` on the
same data.

Every test has partition 1 lagging a minute behind partition 0, and partition 2 writing a little
at first and then going idle (``idleTimeout``) while partitions 0 and 1 keep receiving records
(a feeder thread produces them while the query runs): partition 2's idleness releases the
combined watermark it held back. When the feeder stops, all partitions go idle and the valve
flushes the largest partition watermark (Flink's ``StatusWatermarkValve``), which closes what
the lagging partition still held open.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming import StatefulProcessor

import flinkish
from integration.kafka_helpers import Collector, produce, source, wait_for

pytestmark = pytest.mark.integration

Record = tuple[int, bytes, bytes, int]  # partition, key, value, timestamp ms

BASE = 1_700_000_000_000
LAG_MS = {0: 0, 1: 60_000, 2: 10_000}  # partition 1 lags a minute behind partition 0
CYCLE_MS = 10_000  # per partition, a burst of BURST records 1 s apart every 10 s
BURST = 5
GAP_MS = 5_000  # the session gap, and how long after a key's newest record its timer fires
OPTIONS = {"watermark.maxOutOfOrderness": "1 second", "idleTimeout": "5 seconds",
           "maxOffsetsPerTrigger": "30"}
OWN_DELAY = "10 seconds"  # Spark's own watermark delay in the comparisons
OWN_OPTIONS = {**OPTIONS, "maxOffsetsPerTrigger": "20"}
DEADLINE = 150  # s, per wait: on a loaded machine a first micro-batch took 50 s


# --- data ------------------------------------------------------------------------------------


def burst(j: int, p: int) -> list[Record]:
    """Partition ``p``'s burst ``j``: BURST records 1 s apart, all with key ``p<p>-b<j>``."""
    start = BASE - LAG_MS[p] + j * CYCLE_MS
    return [(p, f"p{p}-b{j}".encode(), b"{}", start + k * 1_000) for k in range(BURST)]


class Feeder(threading.Thread):
    """Produces ``steps`` (records of partitions 0 and 1) while the query runs, keeping at
    least ``ahead`` records of partition 0 beyond the last batch the query planned (read from
    its offsets log), and so beyond what the next batch can admit (maxOffsetsPerTrigger): the
    partitions it writes are never read to their end, so never idle, however long a batch
    takes; partition 2, which it does not write, goes idle."""

    def __init__(self, bootstrap: str, topic: str, steps: list[list[Record]], checkpoint: Path,
                 ahead: int = 20) -> None:
        super().__init__(name=f"feeder-{topic}", daemon=True)
        self.bootstrap, self.topic, self.steps = bootstrap, topic, steps
        self.checkpoint, self.ahead = checkpoint, ahead
        self.error: BaseException | None = None
        self.cancelled = threading.Event()

    def planned(self) -> int:
        """Partition 0's end offset in the latest batch the query planned."""
        offsets = self.checkpoint / "offsets"
        batches = [int(f.name) for f in offsets.iterdir() if f.name.isdigit()] if (
            offsets.is_dir()) else []
        if not batches:
            return 0
        offset = json.loads((offsets / str(max(batches))).read_text().splitlines()[2])
        return int(offset["topics"][self.topic]["0"]["offset"])

    def run(self) -> None:
        try:
            produced = 0
            for step in self.steps:
                while produced - self.planned() >= self.ahead:
                    if self.cancelled.wait(0.1):
                        return
                produce(self.bootstrap, self.topic, step)
                produced += sum(1 for p, _, _, _ in step if p == 0)
        except BaseException as e:  # surfaced by finish()
            self.error = e

    def finish(self) -> None:
        wait_for(lambda: not self.is_alive(), DEADLINE, "the feeder to produce everything")
        if self.error is not None:
            raise self.error


def everything(upfront: list[Record], steps: list[list[Record]]) -> list[Record]:
    return upfront + [r for step in steps for r in step]


def watermark_of(records: list[Record], partition: int) -> int:
    """The partition's watermark once read: newest - 1 s - 1 ms (bounded out-of-orderness)."""
    return max(ts for p, _, _, ts in records if p == partition) - 1_000 - 1


# --- queries ---------------------------------------------------------------------------------


def output(collector: Collector) -> list[tuple[int, Any]]:
    """(batch id, row) of every row the query emitted."""
    with collector.lock:
        return list(collector.rows)


def ms(timestamp: Any) -> int:
    return round(timestamp.timestamp() * 1000)


def operator_metric(query: Any, name: str) -> int:
    return sum(op.get(name, 0) for p in query.recentProgress for op in p.get("stateOperators", []))


def dropped(query: Any) -> int:
    return operator_metric(query, "numRowsDroppedByWatermark")


def spark_watermark_ms(query: Any) -> int:
    """Spark's event-time watermark after the query's last batch."""
    from datetime import datetime

    text = query.lastProgress["eventTime"]["watermark"]
    return ms(datetime.fromisoformat(text.replace("Z", "+00:00")))


def journaled(checkpoint: Path) -> dict[int, dict[str, Any]]:
    """Batch id -> the planning valve journaled in the source's offset (top-level key "valve"):
    its ``watermark`` is the combined watermark the batch's carrier row holds."""
    out = {}
    for path in (checkpoint / "offsets").iterdir():
        if path.name.isdigit():
            offset = json.loads(path.read_text().splitlines()[2])
            out[int(path.name)] = offset["valve"]
    return out


def first_all_idle_batch(checkpoint: Path) -> int:
    """The first batch whose carrier holds the all-idle flush (every partition idle): Spark's
    watermark is the flush from the batch after it on."""
    return min(b for b, valve in journaled(checkpoint).items() if valve["status"] == "IDLE")


def running(df: Any, checkpoint: Path, collector: Collector, mode: str = "append") -> Any:
    return (df.writeStream.foreachBatch(collector).outputMode(mode)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="500 milliseconds").start())


def run_available_now(df: Any, checkpoint: Path, collector: Collector,
                      mode: str = "append") -> Any:
    query = (df.writeStream.foreachBatch(collector).outputMode(mode)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(DEADLINE)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    return query


def spark_own(spark: Any, bootstrap: str, name: str, state: Path,
              delay: str = OWN_DELAY) -> Any:
    """The same topic's records through Spark's own watermark (``withWatermark``)."""
    events = source(spark, bootstrap, name, str(state), **OWN_OPTIONS)
    return events.filter("kind = 'record'").withWatermark("eventTime", delay)


def feed_and_run(spark: Any, bootstrap: str, name: str, tmp_path: Path,
                 upfront: list[Record], steps: list[list[Record]], build: Callable[[Any], Any],
                 collector: Collector, done: Callable[[Any], Any], what: str,
                 horizon: str | None = None, mode: str = "append") -> Any:
    """Produce ``upfront``, start ``build(with_watermark(source))`` with a processing-time
    trigger while a :class:`Feeder` produces ``steps``, wait until ``done(query)``; the
    stopped query."""
    produce(bootstrap, name, upfront)
    feeder = Feeder(bootstrap, name, steps, tmp_path / "ck")
    feeder.start()
    flinkish.register(spark)
    options = dict(OPTIONS)
    if horizon is not None:
        options["watermark.horizon"] = horizon
    events = source(spark, bootstrap, name, str(tmp_path / "state"), **options)
    query = running(build(flinkish.with_watermark(events, horizon=horizon)), tmp_path / "ck",
                    collector, mode)
    try:
        feeder.finish()
        wait_for(lambda: done(query), DEADLINE, what)
        assert query.isActive and query.exception() is None
    finally:
        feeder.cancelled.set()
        query.stop()
    return query


# --- session windows -------------------------------------------------------------------------


def sessions(records: list[Record]) -> Counter[tuple[int, int, int]]:
    """(start ms, end ms, partition) -> records, of ``session_window(eventTime, GAP_MS)`` per
    partition as Spark defines it: an event at t spans [t, t + gap), overlapping spans merge."""
    truth: Counter[tuple[int, int, int]] = Counter()
    for partition in {p for p, _, _, _ in records}:
        times = sorted(ts for p, _, _, ts in records if p == partition)
        start, end, count = times[0], times[0] + GAP_MS, 0
        for ts in times:
            if ts >= end:
                truth[(start, end, partition)] = count
                start, count = ts, 0
            end, count = max(end, ts + GAP_MS), count + 1
        truth[(start, end, partition)] = count
    return truth


def session_counts(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.groupBy(F.session_window("eventTime", f"{GAP_MS // 1000} seconds"),
                      "partition").count()


def emitted_sessions(collector: Collector) -> list[tuple[int, int, int, int, int]]:
    """(start ms, end ms, partition, count, batch id) of every emitted session."""
    return [(ms(r.session_window.start), ms(r.session_window.end), r.partition, r["count"], b)
            for b, r in output(collector)]


def test_session_windows_count_every_row_of_a_lagging_partition_and_close_while_running(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    name = topic(3)
    upfront = burst(0, 2) + burst(1, 2) + burst(2, 2)  # partition 2 then falls silent
    steps = [burst(j, 0) + burst(j, 1) for j in range(12)]
    expected = sessions(everything(upfront, steps))
    # once the feeder stops every partition goes idle and the valve flushes partition 0's
    # watermark: every session that ends at or below it closes
    flushed = watermark_of(everything(upfront, steps), 0)
    must_close = {key for key in expected if key[1] <= flushed}
    assert {p for _, _, p in must_close} == {0, 1, 2}
    collector = Collector()
    query = feed_and_run(
        spark, kafka_bootstrap, name, tmp_path, upfront, steps, session_counts, collector,
        lambda _: must_close <= {s[:3] for s in emitted_sessions(collector)},
        f"sessions {sorted(must_close)} to close",
    )
    emitted = emitted_sessions(collector)
    assert len({s[:3] for s in emitted}) == len(emitted), "a session was emitted twice"
    wrong = [(s, expected.get(s[:3])) for s in emitted if expected.get(s[:3]) != s[3]]
    assert not wrong, "(emitted session, produced count)"
    assert dropped(query) == 0
    # partition 2 went idle while the others kept going: before the all-idle flush, the
    # combined watermark passed partition 2's last one and closed lagging sessions beyond it
    held = watermark_of(upfront, 2)
    flush = first_all_idle_batch(tmp_path / "ck")
    assert [s for s in emitted if s[2] == 1 and s[1] > held and s[4] <= flush], (flush, emitted)

    # the same data through Spark's own watermark: the lagging partition's rows come late
    own = Collector()
    query = run_available_now(session_counts(spark_own(spark, kafka_bootstrap, name,
                                                       tmp_path / "state-own")),
                              tmp_path / "ck-own", own)
    closable = {key for key in expected if key[2] == 1 and key[1] <= spark_watermark_ms(query)}
    counted = {s[:3]: s[3] for s in emitted_sessions(own)}
    lost = {key for key in closable if counted.get(key) != expected[key]}
    assert dropped(query) > 0 and lost, (dropped(query), sorted(closable), counted)


# --- dropDuplicatesWithinWatermark -----------------------------------------------------------

HORIZON = "90 seconds"  # above the minute of lag; the delay Spark sees, so the dedup window


def dedup_record(p: int, i: int) -> Record:
    """Partition 0 writes k0, k1, ...; the lagging partition 1 the same even keys a minute
    earlier in event time (duplicates within the 90 s window) and odd keys only it has;
    partition 2 repeats k0.. k9 (10 s earlier) and goes idle."""
    key = f"k{i}" if p != 1 or i % 2 == 0 else f"lagging-{i}"
    return (p, key.encode(), b"{}", BASE - LAG_MS[p] + i * 1_000)


def distinct_keys(df: Any) -> Any:
    return df.selectExpr("CAST(key AS STRING) AS key", "partition", "eventTime") \
        .dropDuplicatesWithinWatermark(["key"])


def test_drop_duplicates_within_watermark_keeps_exactly_one_row_per_key(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    name = topic(3)
    upfront = [dedup_record(2, i) for i in range(10)]
    steps = [[dedup_record(p, i) for i in range(step * 5, step * 5 + 5) for p in (0, 1)]
             for step in range(12)]
    produced = everything(upfront, steps)
    keys = {k.decode() for _, k, _, _ in produced}
    assert len(produced) - len(keys) == 40  # 30 even keys twice, 10 keys of partition 2 again
    collector = Collector()

    def done(query: Any) -> bool:
        # every key out, and the all-idle flush (partition 0's watermark, BASE + 58 s) has
        # passed first-seen + 90 s of the early keys: Spark removed their dedup state
        return keys <= {r.key for _, r in output(collector)} and (
            operator_metric(query, "numRowsRemoved") > 0)

    query = feed_and_run(spark, kafka_bootstrap, name, tmp_path, upfront, steps,
                         distinct_keys, collector, done,
                         "every key, and the dedup state of the earliest keys to expire",
                         horizon=HORIZON)
    out = Counter(r.key for _, r in output(collector))
    assert set(out) == keys
    assert [k for k, n in out.items() if n != 1] == [], "keys emitted more than once"
    assert dropped(query) == 0

    # Spark's own watermark (10 s) drops the lagging partition's rows as late: keys only it
    # has never come out
    own = Collector()
    query = run_available_now(distinct_keys(spark_own(spark, kafka_bootstrap, name,
                                                      tmp_path / "state-own")),
                              tmp_path / "ck-own", own)
    missing = keys - {r.key for _, r in output(own)}
    assert dropped(query) > 0 and {k for k in missing if k.startswith("lagging-")}, (
        dropped(query), sorted(missing))


# --- transformWithStateInPandas event-time timers --------------------------------------------

FIRED = ("key string, partition int, records long, newest long, expiry long, "
         "watermark long")


class FireAfterQuiet(StatefulProcessor):
    """Counts a key's records; GAP_MS after its newest record (event time) a timer emits the
    count and forgets the key."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.seen = handle.getValueState("seen", "partition int, records long, newest long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        before = self.seen.get() if self.seen.exists() else None
        partition, records, latest = before if before is not None else (-1, 0, -1)
        for pdf in rows:
            records += len(pdf)
            partition = int(pdf["partition"].iloc[0])
            latest = max(latest, int(pdf["eventMs"].max()))
        if before is not None:
            self.handle.deleteTimer(before[2] + GAP_MS)
        self.handle.registerTimer(latest + GAP_MS)
        self.seen.update((partition, records, latest))
        yield from ()

    def handleExpiredTimer(self, key: Any, timerValues: Any,
                           expiredTimerInfo: Any) -> Iterator[Any]:
        import pandas as pd

        partition, records, newest = self.seen.get()
        self.seen.clear()
        yield pd.DataFrame({
            "key": [key[0]], "partition": [partition], "records": [records],
            "newest": [newest], "expiry": [expiredTimerInfo.getExpiryTimeInMs()],
            "watermark": [timerValues.getCurrentWatermarkInMs()],
        })

    def close(self) -> None:
        pass


def timers(df: Any) -> Any:
    from pyspark.sql import functions as F

    return (df.select(F.col("key").cast("string").alias("key"), "partition", "eventTime",
                      F.unix_millis("eventTime").alias("eventMs"))
            .groupBy("key")
            .transformWithStateInPandas(statefulProcessor=FireAfterQuiet(),
                                        outputStructType=FIRED, outputMode="Update",
                                        timeMode="EventTime"))


def test_transform_with_state_event_time_timers_fire_as_the_combined_watermark_passes(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None
) -> None:
    name = topic(3)
    upfront = burst(0, 2) + burst(1, 2) + burst(2, 2)  # partition 2 then falls silent
    steps = [burst(j, 0) + burst(j, 1) for j in range(12)]
    produced = everything(upfront, steps)
    truth: dict[str, tuple[int, int, int]] = {}  # key -> partition, records, newest
    for p, k, _, ts in produced:
        _, n, newest = truth.get(k.decode(), (p, 0, ts))
        truth[k.decode()] = (p, n + 1, max(newest, ts))
    flushed = watermark_of(produced, 0)  # the all-idle flush
    must_fire = {k for k, (_, _, newest) in truth.items() if newest + GAP_MS <= flushed}
    assert {truth[k][0] for k in must_fire} == {0, 1, 2}
    collector = Collector()
    query = feed_and_run(spark, kafka_bootstrap, name, tmp_path, upfront, steps, timers,
                         collector, lambda _: must_fire <= {r.key for _, r in output(collector)},
                         f"the timers of {sorted(must_fire)} to fire", mode="update")
    fired = output(collector)
    assert len({r.key for _, r in fired}) == len(fired), "a key's timer fired twice"
    wrong = [(r.key, r.partition, r.records, r.newest, truth[r.key]) for _, r in fired
             if (r.partition, r.records, r.newest) != truth[r.key]]
    assert not wrong, "(key, partition, records, newest counted; partition, records, newest)"
    assert all(r.expiry == r.newest + GAP_MS for _, r in fired)
    assert dropped(query) == 0
    # a timer fires in the first batch whose watermark - the combined watermark carried by the
    # batch before, as journaled in its offset - has reached it
    valves = journaled(tmp_path / "ck")
    late = [(b, r.key, r.expiry, r.watermark, valves[b - 1]["watermark"]) for b, r in fired
            if not valves[b - 1]["watermark"] == r.watermark >= r.expiry]
    assert not late, "(batch, key, expiry, Spark's watermark, combined watermark journaled)"
    early_enough = [(b, r.key) for b, r in fired
                    if b >= 3 and valves[b - 2]["watermark"] >= r.expiry]
    assert not early_enough, "timers that could have fired a batch earlier"
    # partition 2 went idle while the others kept going: before the all-idle flush, the
    # combined watermark passed partition 2's last one and fired lagging timers beyond it
    held = watermark_of(upfront, 2)
    flush = first_all_idle_batch(tmp_path / "ck")
    assert [r for b, r in fired if r.partition == 1 and r.expiry > held and b <= flush], flush

    # Spark's own watermark (10 s): the lagging partition's rows come late, its keys' timers
    # never fire with their records
    own = Collector()
    query = run_available_now(timers(spark_own(spark, kafka_bootstrap, name,
                                               tmp_path / "state-own")),
                              tmp_path / "ck-own", own, mode="update")
    closable = {k for k, (p, _, newest) in truth.items()
                if p == 1 and newest + GAP_MS <= spark_watermark_ms(query)}
    counted = {r.key: r.records for _, r in output(own)}
    lost = {k for k in closable if counted.get(k) != truth[k][1]}
    assert dropped(query) > 0 and lost, (dropped(query), sorted(closable), counted)
