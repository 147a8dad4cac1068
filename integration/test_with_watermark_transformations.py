"""``flinkish.with_watermark`` under the code users write after it: filters on any column (the
DataFrame API, SQL strings, a temp view), projections, ``dropna``/``fillna``, joins with static
DataFrames, unions and stream-stream joins of two flinkish streams,
``dropDuplicatesWithinWatermark`` and ``transformWithStateInPandas`` after a filter.

Spark's optimizer pushes such predicates towards the source; below the ``EventTimeWatermark``
node they would remove the carrier row and leave Spark's watermark a whole horizon behind, so
windows would never close. Every case runs a real query on a real broker, micro-batch by
micro-batch (``maxOffsetsPerTrigger``), and checks, batch by batch:

* Spark's watermark in each batch equals the combined watermark the previous batch's carrier
  brought (``observedMetrics``; the minimum of both streams' for a union or a join);
* each window is emitted exactly once, in the first batch whose watermark reaches its end, while
  the query is still running, with every row of the lagging partition counted and none dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import flinkish
from flinkish.watermark_monitor import METRICS_PREFIX
from integration.kafka_helpers import Collector, produce, source
from integration.test_stateful_operators import GAP_MS, timers

pytestmark = pytest.mark.integration

BASE = 1_700_000_000_000  # a multiple of the 10 s window
WINDOW_MS = 10_000
LAG_MS = {0: 0, 1: 60_000}  # partition 1 lags a minute behind partition 0
RECORDS = 90  # per partition, one a second
NULL_KEY_EVERY = 7  # every 7th record has no key (for dropna / fillna)
OPTIONS = {"watermark.maxOutOfOrderness": "1 second", "maxOffsetsPerTrigger": "40"}
DEADLINE = 240  # s for one AvailableNow run

Record = tuple[int, bytes | None, bytes, int]


def records(lag: dict[int, int] = LAG_MS) -> list[Record]:
    """Keys alternate a/b; every NULL_KEY_EVERY-th record has none."""
    return [
        (p, None if i % NULL_KEY_EVERY == 3 else (b"a" if i % 2 == 0 else b"b"), b"{}",
         BASE - lag[p] + i * 1_000)
        for i in range(RECORDS) for p in lag
    ]


@pytest.fixture(scope="module")
def topics(kafka_bootstrap: str) -> Iterator[tuple[str, str]]:
    """Two topics with the same shape of data: the second for unions and stream-stream joins
    (its partition 0 lags 30 s, its partition 1 is on time)."""
    from flinkish.demo.embedded_kafka import create_topic

    names = ("wm-transform-a", "wm-transform-b")
    for name in names:
        create_topic(kafka_bootstrap, name, 2)
    produce(kafka_bootstrap, names[0], records())
    produce(kafka_bootstrap, names[1], records({0: 30_000, 1: 0}))
    yield names


def ms(timestamp: Any) -> int:
    return round(timestamp.timestamp() * 1000)


def key_of(key: bytes | None) -> str | None:
    return None if key is None else key.decode()


class Case:
    """One query: the streams (``with_watermark`` applied), ``build`` turns them into the
    query's DataFrame."""

    def __init__(self, spark: Any, bootstrap: str, topics: tuple[str, str],
                 tmp_path: Path) -> None:
        self.spark, self.bootstrap, self.topics, self.tmp = spark, bootstrap, topics, tmp_path
        flinkish.register(spark)

    def stream(self, index: int = 0) -> Any:
        """A flinkish stream of topic ``index`` with ``with_watermark`` and a string key ``k``."""
        from pyspark.sql import functions as F

        events = source(self.spark, self.bootstrap, self.topics[index],
                        str(self.tmp / f"state-{index}"), **OPTIONS)
        return flinkish.with_watermark(events).withColumn("k", F.col("key").cast("string"))

    def run(self, df: Any, mode: str = "append") -> tuple[Any, list[tuple[int, Any]]]:
        collector = Collector()
        query = (df.writeStream.foreachBatch(collector).outputMode(mode)
                 .option("checkpointLocation", str(self.tmp / "ck"))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(DEADLINE)
            assert not query.isActive, f"the query did not finish in {DEADLINE} s"
        finally:
            query.stop()
        assert query.exception() is None, query.exception()
        with collector.lock:
            return query, list(collector.rows)


def spark_watermarks(query: Any) -> dict[int, int]:
    """Batch id -> Spark's event-time watermark in force in it (ms)."""
    return {
        p["batchId"]: ms(datetime.fromisoformat(p["eventTime"]["watermark"].replace("Z", "+00:00")))
        for p in query.recentProgress if "watermark" in p["eventTime"]
    }


def carried(query: Any) -> dict[int, int]:
    """Batch id -> the combined watermark the batch's carrier rows brought (the minimum over
    the query's with_watermark streams), for the batches where every stream had one."""
    out = {}
    for p in query.recentProgress:
        values = [m["watermark"] for name, m in p["observedMetrics"].items()
                  if name.startswith(METRICS_PREFIX)]
        if values and None not in values:
            out[p["batchId"]] = min(values)
    return out


def dropped(query: Any) -> int:
    return sum(op.get("numRowsDroppedByWatermark", 0)
               for p in query.recentProgress for op in p.get("stateOperators", []))


def assert_tracks_combined_watermark(query: Any, streams: int = 1) -> dict[int, int]:
    """Spark's watermark in every batch is the combined watermark the batch before carried;
    returns Spark's watermark per batch."""
    spark_wm, brought = spark_watermarks(query), carried(query)
    names = {n for p in query.recentProgress for n in p["observedMetrics"]
             if n.startswith(METRICS_PREFIX)}
    assert len(names) == streams, names
    compared = [(b, spark_wm[b], brought[b - 1]) for b in spark_wm if b - 1 in brought]
    assert len(compared) >= 3, ("too few batches to compare", spark_wm, brought)
    behind = [c for c in compared if c[1] != c[2]]
    assert not behind, "(batch, Spark's watermark, combined watermark carried the batch before)"
    return spark_wm


def window_truth(rows: list[Record], keep: Callable[[Record], bool]) -> Counter[tuple[int, int]]:
    """(window start ms, partition) -> rows kept."""
    return Counter((ts - ts % WINDOW_MS, p) for p, k, v, ts in rows if keep((p, k, v, ts)))


def windowed(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.groupBy(F.window("eventTime", "10 seconds"), "partition").count()


def assert_windows_close_at_the_watermark(query: Any, out: list[tuple[int, Any]],
                                          truth: Counter[tuple[int, int]],
                                          streams: int = 1) -> None:
    spark_wm = assert_tracks_combined_watermark(query, streams)
    emitted = [(b, ms(r.window.start), r.partition, r["count"]) for b, r in out]
    assert len({e[1:3] for e in emitted}) == len(emitted), "a window was emitted twice"
    wrong = [(e, truth[e[1:3]]) for e in emitted if e[3] != truth[e[1:3]]]
    assert not wrong, "(batch, window, partition, counted; produced)"
    final = max(spark_wm.values())
    closable = {w for w in truth if w[0] + WINDOW_MS <= final}
    assert {1} < {p for _, p in closable} | {1} and {p for _, p in closable} == {0, 1}
    assert closable <= {e[1:3] for e in emitted}, sorted(closable - {e[1:3] for e in emitted})
    # each in the first batch whose watermark reached the window's end: while the query runs
    first = {w: min(b for b, wm in spark_wm.items() if wm >= w[0] + WINDOW_MS) for w in closable}
    late = [(e, first[e[1:3]]) for e in emitted if e[0] != first[e[1:3]]]
    assert not late, "(emitted in batch, window, partition, count; first batch it could)"
    assert len({e[0] for e in emitted}) >= 3, "windows closed only at the end"
    assert dropped(query) == 0


# --- filters and projections on one stream ---------------------------------------------------


def has_a(r: Record) -> bool:
    return r[1] == b"a"


TRANSFORMATIONS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Record], bool]]] = {
    "where on a column": (lambda s, df: df.where(df.k == "a"), has_a),
    "where on the raw key": (lambda s, df: df.where(df.key == b"a"), has_a),
    "where, a SQL string": (lambda s, df: df.where("k = 'a' AND partition IN (0, 1)"), has_a),
    "where with or": (lambda s, df: df.where("k = 'a' OR k IS NULL"),
                      lambda r: r[1] in (b"a", None)),
    "select, withColumn, drop": (
        lambda s, df: df.select("k", "partition", "eventTime").withColumn("n", df.k.isNull())
        .drop("n").where("k LIKE 'b%'"),
        lambda r: r[1] == b"b"),
    "dropna": (lambda s, df: df.dropna(subset=["k"]), lambda r: r[1] is not None),
    "fillna": (lambda s, df: df.fillna({"k": "none"}).where("k = 'none'"),
               lambda r: r[1] is None),
    "SQL on a temp view": (
        lambda s, df: (df.createOrReplaceTempView("flinkish_events"),
                       s.sql("SELECT * FROM flinkish_events WHERE k = 'a'"))[1],
        has_a),
}


@pytest.mark.parametrize("name", list(TRANSFORMATIONS))
def test_windows_close_at_the_combined_watermark_after(
    name: str, spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    transform, keep = TRANSFORMATIONS[name]
    case = Case(spark, kafka_bootstrap, topics, tmp_path)
    query, out = case.run(windowed(transform(spark, case.stream())))
    assert_windows_close_at_the_watermark(query, out, window_truth(records(), keep))


# --- joins with static DataFrames ------------------------------------------------------------


def test_inner_and_left_joins_with_a_static_dataframe(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    labels = spark.createDataFrame([("a", "first")], "k string, label string")
    case = Case(spark, kafka_bootstrap, topics, tmp_path / "inner")
    query, out = case.run(windowed(case.stream().join(labels, "k")))
    assert_windows_close_at_the_watermark(query, out, window_truth(records(), has_a))

    case = Case(spark, kafka_bootstrap, topics, tmp_path / "left")
    joined = case.stream().join(labels, "k", "left").where("label IS NULL")
    query, out = case.run(windowed(joined))
    assert_windows_close_at_the_watermark(query, out, window_truth(records(),
                                                                   lambda r: not has_a(r)))


# --- two flinkish streams --------------------------------------------------------------------


def test_a_union_of_two_flinkish_streams(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    case = Case(spark, kafka_bootstrap, topics, tmp_path)
    union = case.stream(0).unionByName(case.stream(1)).where("k = 'a'")
    query, out = case.run(windowed(union))
    truth = window_truth(records(), has_a) + window_truth(records({0: 30_000, 1: 0}), has_a)
    assert_windows_close_at_the_watermark(query, out, truth, streams=2)


def test_a_stream_stream_join_of_two_flinkish_streams(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    case = Case(spark, kafka_bootstrap, topics, tmp_path)
    left = case.stream(0).where("k = 'a'").select(
        F.col("k").alias("lk"), F.col("partition").alias("lp"), F.col("offset").alias("lo"),
        F.col("eventTime").alias("lt"))
    right = case.stream(1).select(
        F.col("k").alias("rk"), F.col("partition").alias("rp"), F.col("offset").alias("ro"),
        F.col("eventTime").alias("rt"))
    joined = left.join(right, F.expr(
        "lk = rk AND lp = rp AND lo = ro AND rt BETWEEN lt - INTERVAL 1 MINUTE AND lt"))
    query, out = case.run(joined)
    # the i-th record of a partition has offset i in both topics, and the same key; a pair
    # joins when the other topic's record is up to a minute older (topic a's partition 1 lags
    # a minute, topic b's partition 0 half a minute)
    expected = set()
    for p in (0, 1):
        mine = [r for r in records() if r[0] == p]
        theirs = [r for r in records({0: 30_000, 1: 0}) if r[0] == p]
        for offset, (mr, tr) in enumerate(zip(mine, theirs, strict=True)):
            if mr[1] == b"a" and mr[3] - 60_000 <= tr[3] <= mr[3]:
                expected.add((p, offset))
    got = Counter((r.lp, r.lo) for _, r in out)
    assert [k for k, n in got.items() if n != 1] == [], "pairs emitted more than once"
    assert set(got) == expected and expected
    assert_tracks_combined_watermark(query, streams=2)
    assert dropped(query) == 0


# --- other stateful operators after a filter -------------------------------------------------


def test_drop_duplicates_within_watermark_after_a_filter(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    case = Case(spark, kafka_bootstrap, topics, tmp_path)
    # the same second-of-run appears in both partitions, a minute apart in event time
    deduped = (case.stream().where("k IS NOT NULL")
               .withColumn("second", F.col("offset")).dropDuplicatesWithinWatermark(["second"]))
    query, out = case.run(deduped)
    got = Counter(r.second for _, r in out)
    expected = {i for i in range(RECORDS) if i % NULL_KEY_EVERY != 3}
    assert set(got) == expected and all(n == 1 for n in got.values())
    assert_tracks_combined_watermark(query)
    assert dropped(query) == 0


def test_transform_with_state_timers_after_a_filter(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path, rocksdb: None
) -> None:
    from pyspark.sql import functions as F

    case = Case(spark, kafka_bootstrap, topics, tmp_path)
    # one timer key per 10 s of each partition's key-a records
    keyed = case.stream().where("k = 'a'").withColumn(
        "key", F.concat_ws("-", F.col("partition").cast("string"),
                           F.floor(F.unix_millis("eventTime") / WINDOW_MS).cast("string")))
    query, out = case.run(timers(keyed), mode="update")
    spark_wm = assert_tracks_combined_watermark(query)
    truth: dict[str, tuple[int, int]] = {}  # key -> records, newest
    for p, k, _, ts in records():
        if k == b"a":
            name = f"{p}-{ts // WINDOW_MS}"
            n, newest = truth.get(name, (0, ts))
            truth[name] = (n + 1, max(newest, ts))
    final = max(spark_wm.values())
    must_fire = {k for k, (_, newest) in truth.items() if newest + GAP_MS <= final}
    assert {k.split("-")[0] for k in must_fire} == {"0", "1"}
    fired = {r.key: (r.records, r.newest) for _, r in out}
    assert len(fired) == len(out), "a timer fired twice"
    assert must_fire <= set(fired)
    assert {k: truth[k] for k in fired} == fired
    # a timer fires in the first batch whose watermark has reached it
    late = [(b, r.key) for b, r in out
            if b != min(x for x, wm in spark_wm.items() if wm >= r.expiry)]
    assert not late
    assert dropped(query) == 0
