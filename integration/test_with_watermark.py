"""``flinkish.with_watermark``: Spark's own windowed aggregation on the combined watermark, against
a real broker and real Spark, beside Spark's own ``withWatermark`` on the same data."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest

import flinkish
from flinkish import OptionError
from integration.kafka_helpers import Collector, produce, source, wait_for

pytestmark = pytest.mark.integration

BASE = 1_700_000_000_000  # a multiple of the 10 s window
WINDOW_MS = 10_000
LAG_MS = {0: 0, 1: 60_000, 2: 10_000}  # partition 1 lags a minute behind partition 0


def wave(first: int, last: int, partitions: tuple[int, ...]) -> list[tuple[int, bytes, bytes, int]]:
    return [
        (p, f"k{p}-{i}".encode(), b"{}", BASE - LAG_MS[p] + i * 1_000)
        for i in range(first, last) for p in partitions
    ]


def truth(records: list[tuple[int, bytes, bytes, int]]) -> Counter[tuple[int, int]]:
    """(window start ms, partition) -> records."""
    return Counter((ts - ts % WINDOW_MS, p) for p, _, _, ts in records)


def windows(collector: Collector) -> list[tuple[int, int, int]]:
    """(window start ms, partition, count) of every emitted window row, in emission order."""
    with collector.lock:
        rows = [row for _, row in collector.rows]
    return [(int(r.window.start.timestamp() * 1000), r.partition, r["count"]) for r in rows]


def dropped(query: Any) -> int:
    return sum(op.get("numRowsDroppedByWatermark", 0)
               for p in query.recentProgress for op in p.get("stateOperators", []))


def counting(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.groupBy(F.window("eventTime", "10 seconds"), "partition").count()


class Feeder:
    """Keeps producing to partitions 0 and 1 (partition 1 a minute behind), ten records a
    second each, so neither ever turns idle while the query runs, however slow a batch is."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.produced: list[tuple[int, bytes, bytes, int]] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stopped.is_set():
            for record in wave(i, i + 1, (0, 1)):
                p, key, value, ts = record
                self.producer.produce(self.topic, key=key, value=value, partition=p,
                                      timestamp=ts)
                self.produced.append(record)
            self.producer.flush(30)
            i += 1
            self.stopped.wait(0.1)

    def __enter__(self) -> Feeder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(60)


def test_windows_count_every_row_of_a_lagging_partition_and_close_while_running(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    name = topic(3)
    silent = wave(0, 10, (2,))  # partition 2 writes a little, then falls silent: IDLE
    produce(kafka_bootstrap, name, silent)
    flinkish.register(spark)
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    **{"watermark.maxOutOfOrderness": "1 second", "idleTimeout": "3 seconds",
                       "maxOffsetsPerTrigger": "30"})
    collector = Collector()
    # a filter after with_watermark, as users write them: Spark must not push it below its
    # watermark node, where it would remove the carrier row
    records = flinkish.with_watermark(events).where("key IS NOT NULL")
    query = (counting(records).writeStream.foreachBatch(collector)
             .outputMode("append").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="500 milliseconds").start())
    try:
        with Feeder(kafka_bootstrap, name) as feeder:
            # partition 1 holds the combined watermark back: its own early windows close
            wait_for(lambda: (BASE - 60_000, 1) in {(w, p) for w, p, _ in windows(collector)},
                     240, "the lagging partition's first window to close while the query runs")
            # partition 2 went idle and released the watermark: windows after its last record
            # close too, for every partition, while data keeps arriving
            must_close = {(w, p) for w in range(BASE - 60_000, BASE + 10_000, WINDOW_MS)
                          for p in (0, 1) if w >= BASE - LAG_MS[p]}
            must_close |= set(truth(silent))
            wait_for(lambda: must_close <= {(w, p) for w, p, _ in windows(collector)}, 240,
                     f"windows {sorted(must_close)} to close")
        expected = truth(silent + feeder.produced)
        assert query.isActive and query.exception() is None
        plan = query._jsq.streamingQuery().lastExecution().optimizedPlan().toString()
    finally:
        query.stop()
    emitted = windows(collector)
    assert len({(w, p) for w, p, _ in emitted}) == len(emitted), "a window was emitted twice"
    wrong = [(w, p, c, expected[(w, p)]) for w, p, c in emitted if c != expected[(w, p)]]
    assert not wrong, "(window, partition, counted, produced)"
    assert dropped(query) == 0
    # the filter that removes the carrier and the markers stays above the watermark node
    filters = [i for i, line in enumerate(plan.splitlines()) if "Filter" in line]
    node = [i for i, line in enumerate(plan.splitlines()) if "EventTimeWatermark" in line]
    assert node and filters and min(filters) < node[0] and max(filters) < node[0], plan

    # the same data through Spark's own watermark: the lagging partition's rows are dropped
    spark_collector = Collector()
    own = (events.filter("kind = 'record'").withWatermark("eventTime", "10 seconds"))
    query = (counting(own).writeStream.foreachBatch(spark_collector).outputMode("append")
             .option("checkpointLocation", str(tmp_path / "ck-spark"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None
    own_windows = windows(spark_collector)
    lost = sum(expected[(w, p)] - c for w, p, c in own_windows)
    closed_up_to = max(w for w, p, _ in own_windows if p == 0)
    seen = {(w, p) for w, p, _ in own_windows}
    missing = [k for k in expected if k[1] == 1 and k not in seen and k[0] < closed_up_to]
    assert dropped(query) > 0 and (lost > 0 or missing)


def test_horizon_mismatch_fails_the_query_with_a_clear_error(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    name = topic(1)
    produce(kafka_bootstrap, name, wave(0, 20, (0,)))
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    **{"watermark.horizon": "1 hour", "maxOffsetsPerTrigger": "5"})
    query = (counting(flinkish.with_watermark(events)).writeStream.format("noop")
             .outputMode("append").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    deadline = time.monotonic() + 240
    while query.isActive and time.monotonic() < deadline:
        time.sleep(0.2)
    assert query.exception() is not None
    assert "watermark.horizon" in str(query.exception())


def test_plan_time_guards(spark: Any, kafka_bootstrap: str, tmp_path: Any) -> None:
    events = source(spark, kafka_bootstrap, "guards", str(tmp_path / "state"))
    with pytest.raises(OptionError, match="needs the flinkish source's columns"):
        flinkish.with_watermark(events.select("key", "eventTime"))
    with pytest.raises(OptionError, match="already has a watermark"):
        flinkish.with_watermark(events.withWatermark("eventTime", "1 minute"))
    with pytest.raises(OptionError, match="not a timestamp"):
        flinkish.with_watermark(events, event_time="offset")
    with pytest.raises(OptionError, match="not a duration"):
        flinkish.with_watermark(events, horizon="soon")


# --- the one-millisecond boundary (docs/semantics.md) ----------------------------------------

END = BASE + WINDOW_MS  # the end of window [BASE, END)


def punctuated(spark: Any, bootstrap: str, name: str, state: str) -> Any:
    """One record per micro-batch; a record whose value has ``"p": true`` sets the watermark to
    its own event time."""
    return source(spark, bootstrap, name, state, **{
        "watermark.strategy": "punctuated", "watermark.punctuation.field": "p",
        "maxOffsetsPerTrigger": "1"})


def spark_watermarks(query: Any) -> dict[int, int]:
    from datetime import datetime

    return {p["batchId"]: round(datetime.fromisoformat(
        p["eventTime"]["watermark"].replace("Z", "+00:00")).timestamp() * 1000)
        for p in query.recentProgress if "watermark" in p["eventTime"]}


def test_the_one_millisecond_boundary(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    """Spark sees the combined watermark W itself, not W + 1 ms: rows at or below W are late
    (Flink's rule for elements and timers), and a window [s, e) is emitted once W >= e, while
    Flink fires it at W >= e - 1 and calls its rows late from then on."""
    name = topic(1)
    flag, plain = b'{"p": true}', b"{}"
    rows = [(BASE + 1_000, plain), (END - 1, flag),  # W = e - 1: Flink fires [BASE, END) here
            (BASE + 15_000, plain),
            (BASE + 2_000, plain), (END - 1, plain),  # arrive with W = e - 1 in force
            (END, flag),  # ts = W + 1 while W = e - 1 is in force; then W = e
            (BASE + 15_000, plain), (BASE + 16_000, plain), (BASE + 17_000, plain)]
    produce(kafka_bootstrap, name, [(0, b"k", value, ts) for ts, value in rows])
    flinkish.register(spark)

    counts = Collector()
    query = (counting(flinkish.with_watermark(punctuated(spark, kafka_bootstrap, name,
                                                         str(tmp_path / "state-w"))))
             .writeStream.foreachBatch(counts).outputMode("append")
             .option("checkpointLocation", str(tmp_path / "ck-w"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None
    marks = spark_watermarks(query)
    at_e_minus_1 = [b for b, wm in marks.items() if wm == END - 1]
    assert at_e_minus_1, marks  # the case happened: batches ran with W = e - 1
    emitted = {(w, p): (c, b) for (w, p, c), (b, _) in zip(windows(counts), counts.rows,
                                                             strict=True)}
    count, batch = emitted[(BASE, 0)]
    assert count == 4  # with the two rows that arrived while W = e - 1: Flink's late data
    assert batch == min(b for b, wm in marks.items() if wm >= END) and batch > max(at_e_minus_1)
    assert dropped(query) == 0

    kept = Collector()
    query = (flinkish.with_watermark(punctuated(spark, kafka_bootstrap, name,
                                                str(tmp_path / "state-d")))
             .dropDuplicatesWithinWatermark(["offset"])
             .writeStream.foreachBatch(kept).option("checkpointLocation", str(tmp_path / "ck-d"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None
    marks = spark_watermarks(query)
    out = {r.offset: b for b, r in kept.rows}
    # one record per batch: offset o is read in batch o. Spark judges a row late against the
    # watermark of the batch before (EventTimeWatermark's "for late events", SPARK-40925): the
    # row at event time e - 1 = W (offset 4) is late, the one at e = W + 1 (offset 5) is not
    assert all(out[o] == o for o in out), out
    assert marks[3] == marks[4] == END - 1, marks
    late = {o for o, (ts, _) in enumerate(rows) if o > 0 and ts <= marks[o - 1]}
    assert 4 in late and 5 not in late
    assert sorted(out) == sorted(set(range(len(rows))) - late), (out, marks)
    assert dropped(query) == len(late)


def test_a_filter_before_with_watermark_is_reported(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any, caplog: Any
) -> None:
    """The one mistake no plan rewrite can undo: the carrier is filtered out before
    ``with_watermark`` sees it. The query runs on, a day behind; the monitor says so."""
    from pyspark.sql import functions as F

    name = topic(2)
    produce(kafka_bootstrap, name, wave(0, 40, (0, 1)))
    events = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    **{"maxOffsetsPerTrigger": "10"})
    caplog.set_level(logging.ERROR, logger="flinkish.watermark_monitor")
    query = (counting(flinkish.with_watermark(events.where(F.col("partition") == 1)))
             .writeStream.format("noop").outputMode("append")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
    query.awaitTermination(240)
    assert not query.isActive and query.exception() is None
    found = wait_for(lambda: [r for r in caplog.records if r.name == "flinkish.watermark_monitor"
                              and query.id in r.getMessage()], 60, "the monitor's ERROR")
    assert len(found) == 1 and found[0].levelno == logging.ERROR
    assert "before flinkish.with_watermark" in found[0].getMessage()
