"""The flinkish source against real brokers and real Spark: exact records, exact markers.

Every test that takes ``kafka_bootstrap`` runs against two Kafka implementations: the embedded
broker (Tansu) and librdkafka's mock cluster (integration/mock_cluster.py). The mock cluster
creates every topic with 4 partitions, so tests that need another count run on Tansu only."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest

from flinkish_core.valve import MAX_WATERMARK
from integration.kafka_helpers import (
    Collector,
    markers,
    produce,
    run_available_now,
    source,
    start,
    wait_for,
)
from integration.mock_cluster import MOCK_PARTITIONS, mock_topic

BROKERS = ("tansu", "mock-cluster")


@pytest.fixture(params=BROKERS)
def kafka_bootstrap(request: pytest.FixtureRequest, kafka_bootstrap: str) -> str:
    """The session's embedded broker, or the mock cluster (started once for this module)."""
    if request.param == "tansu":
        return kafka_bootstrap
    return str(request.getfixturevalue("mock_bootstrap"))


@pytest.fixture
def topic(request: pytest.FixtureRequest, kafka_bootstrap: str, topic: Any) -> Any:
    """conftest's topic factory; on the mock cluster, topics of its 4 partitions only."""
    if request.node.callspec.params.get("kafka_bootstrap") != "mock-cluster":
        return topic

    def make(partitions: int) -> str:
        if partitions != MOCK_PARTITIONS:
            pytest.skip(f"the mock cluster creates topics of {MOCK_PARTITIONS} partitions only")
        name = f"{request.node.name[:40].replace('[', '-').replace(']', '')}"
        mock_topic(kafka_bootstrap, name)
        return name

    return make


def tansu_only(request: pytest.FixtureRequest, why: str) -> None:
    if request.node.callspec.params.get("kafka_bootstrap") == "mock-cluster":
        pytest.skip(why)


BASE = 1_700_000_000_000
BOUND_MS = 2_000
JITTER = [0, -1_500, 700, -300, 1_200, -2_500, 400]


def skewed(partitions: int, count: int, first: int = 0) -> list[tuple[int, bytes, bytes, int]]:
    """Out-of-order timestamps; partition p lags p * 100 s behind partition 0."""
    records = []
    for i in range(first, first + count):
        for p in range(partitions):
            ts = BASE - p * 100_000 + i * 1_000 + JITTER[i % len(JITTER)]
            records.append((p, f"k{p}-{i}".encode(), json.dumps({"p": p, "i": i}).encode(), ts))
    return records


def test_exact_records_and_markers_then_resume_from_checkpoint(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    name = topic(4)
    first = skewed(4, 25)
    produce(kafka_bootstrap, name, first)
    df = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                **{"watermark.maxOutOfOrderness": "2 seconds"})
    rows = run_available_now(df, str(tmp_path / "ck"))

    for p in range(4):
        produced = [r for r in first if r[0] == p]
        got = [r for r in rows if r.partition == p and r.kind == "record"]
        assert [(r.offset, r.key, r.value) for r in got] == [
            (i, key, value) for i, (_, key, value, _) in enumerate(produced)
        ]
        assert [int(r.timestamp.timestamp() * 1000) for r in got] == [ts for *_, ts in produced]
        assert [r.eventTime for r in got] == [r.timestamp for r in got]
        assert {r.topic for r in got} == {name} and {r.timestampType for r in got} == {0}
        max_ts = max(ts for *_, ts in produced)
        assert markers(rows, p) == [
            ("status", 0, "ACTIVE"),
            ("watermark", 25, max_ts - BOUND_MS - 1),
        ]

    # more data, then a restart from the same checkpoint: only the new records, no duplicates,
    # and each partition's watermark carries on from where it was (never back)
    second = skewed(4, 10, first=25)
    late = [(0, b"late", b"{}", BASE - 50_000)]  # far behind partition 0's max: no new watermark
    produce(kafka_bootstrap, name, late + [r for r in second if r[0] != 0])
    rows2 = run_available_now(df, str(tmp_path / "ck"))
    records2 = [(r.partition, r.offset, r.key) for r in rows2 if r.kind == "record"]
    expected2 = [(0, 25, b"late")] + [
        (p, 25 + i, f"k{p}-{25 + i}".encode()) for p in range(1, 4) for i in range(10)
    ]
    assert records2 == expected2
    assert markers(rows2, 0) == []
    for p in range(1, 4):
        max_ts = max(ts for q, *_, ts in first + second if q == p)
        assert markers(rows2, p) == [("watermark", 35, max_ts - BOUND_MS - 1)]


def test_idle_partition_is_marked_and_reactivated(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    name = topic(2)
    produce(kafka_bootstrap, name, [(0, b"a", b"{}", BASE), (1, b"b", b"{}", BASE + 5)])
    stop = threading.Event()

    def keep_partition_0_busy() -> None:
        i = 0
        while not stop.is_set() and i < 600:
            produce(kafka_bootstrap, name, [(0, b"busy", b"{}", BASE + 1_000 * (i + 1))])
            i += 1
            stop.wait(0.25)

    busy = threading.Thread(target=keep_partition_0_busy, daemon=True)
    df = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                idleTimeout="2 seconds", **{"watermark.strategy": "monotonous"})
    collector = Collector()
    query = start(df, str(tmp_path / "ck"), collector)
    try:
        busy.start()
        wait_for(lambda: ("status", 1, "IDLE") in markers(collector.snapshot(), 1), 60,
                 "partition 1 to be marked IDLE")
        produce(kafka_bootstrap, name, [(1, b"back", b"{}", BASE + 10)])
        wait_for(lambda: markers(collector.snapshot(), 1)[-1:] == [("watermark", 2, BASE + 9)],
                 60, "partition 1's watermark after it resumed")
    finally:
        stop.set()
        busy.join(10)
        query.stop()
    rows = collector.snapshot()
    assert markers(rows, 1) == [
        ("status", 0, "ACTIVE"),
        ("watermark", 1, BASE + 4),
        ("status", 1, "IDLE"),
        ("status", 1, "ACTIVE"),
        ("watermark", 2, BASE + 9),
    ]
    assert all(m[2] != "IDLE" for m in markers(rows, 0)), "the busy partition went idle"
    watermarks0 = [m[2] for m in markers(rows, 0) if m[0] == "watermark"]
    assert watermarks0 == sorted(set(watermarks0)) and len(watermarks0) >= 2


def test_bounded_stream_emits_max_watermark_once_and_respects_the_limit(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    name = topic(3)
    produce(kafka_bootstrap, name, skewed(2, 30))  # partition 2 stays empty
    df = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                endingOffsets="latest", maxOffsetsPerTrigger="20")
    rows = run_available_now(df, str(tmp_path / "ck"))
    assert [r.offset for r in rows if r.kind == "record" and r.partition == 0] == list(range(30))
    for p in range(3):
        finals = [m for m in markers(rows, p) if m[2] == MAX_WATERMARK]
        assert finals == [("watermark", 30 if p < 2 else 0, MAX_WATERMARK)]
    batches = sorted((b for b in os.listdir(tmp_path / "ck" / "offsets") if b.isdigit()), key=int)
    assert len(batches) >= 3, "60 records under maxOffsetsPerTrigger=20 need 3 batches"
    ends = []
    for batch in batches:
        text = (tmp_path / "ck" / "offsets" / batch).read_text().splitlines()[-1]
        positions = json.loads(text)["topics"][name]
        ends.append(sum(positions[str(p)]["offset"] for p in range(3)))
    assert all(b - a <= 20 for a, b in zip([0] + ends, ends, strict=False))


def test_event_time_from_json_field_and_headers_column(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    name = topic(1)
    values = [{"ts": BASE + 10}, {"ts": "2023-11-14T22:13:20.050Z"}, {"ts": "garbage"}]
    produce(kafka_bootstrap, name,
            [(0, None, json.dumps(v).encode(), BASE) for v in values],  # type: ignore[misc]
            headers=[("h", b"v")])
    df = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                includeHeaders="true", **{"eventTime.field": "ts", "eventTime.onError": "skip"})
    rows = run_available_now(df, str(tmp_path / "ck"))
    got = [r for r in rows if r.kind == "record"]
    assert [None if r.eventTime is None else int(r.eventTime.timestamp() * 1000) for r in got] == [
        BASE + 10, 1_700_000_000_050, None,
    ]
    assert [[(h.key, h.value) for h in r.headers] for r in got] == [[("h", b"v")]] * 3
    assert markers(rows, 0) == [("status", 0, "ACTIVE"), ("watermark", 3, BASE + 49)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": None}, "exactly one of the options subscribe, subscribePattern, assign"),
        ({"maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger"),
        ({"idleTimeout": "5"}, "option idleTimeout"),
        ({"watermark.strategy": "monotonous", "watermark.maxOutOfOrderness": "1 s"},
         "only applies to watermark.strategy boundedOutOfOrderness"),
        ({"checkpointing.location": None}, "option checkpointing.location is required"),
        ({"startingOffset": "earliest"}, "did you mean startingOffsets"),
    ],
)
def test_bad_options_fail_at_load_naming_the_option(
    spark: Any, kafka_bootstrap: str, options: dict[str, Any], message: str
) -> None:
    reader = spark.readStream.format("flinkish").option("kafka.bootstrap.servers", kafka_bootstrap)
    settings = {"subscribe": "t", "checkpointing.location": "/tmp/x", **options}
    for key, value in settings.items():
        if value is not None:
            reader = reader.option(key, value)
    with pytest.raises(Exception, match="flinkish|Python") as info:
        reader.load()
    assert message in str(info.value)


def test_unreachable_broker_fails_clearly_and_hides_secrets(spark: Any, tmp_path: Any) -> None:
    from flinkish.demo.ports import free_port

    secret = "s3cr3t-value-never-logged"
    df = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", f"127.0.0.1:{free_port()}")
        .option("kafka.sasl.password", secret)
        .option("subscribe", "nothing")
        .option("kafkaConsumer.pollTimeoutMs", "3000")
        .option("checkpointing.location", str(tmp_path / "state"))
        .load()
    )
    started = time.monotonic()
    query = start(df, str(tmp_path / "ck"), Collector())
    with pytest.raises(Exception) as info:
        query.awaitTermination(120)
    assert time.monotonic() - started < 90
    text = str(info.value)
    assert "could not list Kafka topics" in text and "kafka.bootstrap.servers" in text
    assert secret not in text and "'sasl.password': '***'" in text
    for root, _, files in os.walk(tmp_path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                assert secret.encode() not in fh.read(), f"secret written to {f}"


def test_subscribe_pattern_discovers_new_topics_and_partitions_start_emitting(
    spark: Any, kafka_bootstrap: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    from flinkish.demo.embedded_kafka import create_topic

    tansu_only(request, "topics of 2 and 1 partitions")

    stem = f"pattern-{os.getpid()}-{int(time.time())}"
    create_topic(kafka_bootstrap, f"{stem}-a", 2)
    produce(kafka_bootstrap, f"{stem}-a", [(p, b"a", b"{}", BASE + p) for p in range(2)])
    df = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribePattern", f"{stem}-.*")
        .option("startingOffsets", "earliest")
        .option("checkpointing.location", str(tmp_path / "state"))
        .load()
    )
    first = run_available_now(df, str(tmp_path / "ck"))
    assert sorted((r.topic, r.partition) for r in first if r.kind == "record") == [
        (f"{stem}-a", 0), (f"{stem}-a", 1)
    ]

    create_topic(kafka_bootstrap, f"{stem}-b", 1)  # appears while the query is stopped
    produce(kafka_bootstrap, f"{stem}-b", [(0, b"b", b"{}", BASE + 50)])
    second = run_available_now(df, str(tmp_path / "ck"))
    new = [r for r in second if r.topic == f"{stem}-b"]
    assert [(r.kind, r.offset, r.status or r.watermark) for r in new] == [
        ("status", 0, "ACTIVE"), ("record", 0, None), ("watermark", 1, BASE + 49)
    ]
    assert all(r.topic == f"{stem}-b" for r in second if r.kind == "record")


def test_explicit_registration_matches_automatic_discovery(spark: Any, kafka_bootstrap: str
                                                           ) -> None:
    import flinkish

    flinkish.register(spark)  # idempotent beside the automatic pyspark_flinkish discovery
    df = (spark.readStream.format("flinkish").option("kafka.bootstrap.servers", kafka_bootstrap)
          .option("subscribe", "t").option("includeHeaders", "true")
          .option("watermark.strategy", "none").load())
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                          "timestampType", "headers", "eventTime", "kind", "watermark", "status"]


def test_replaying_a_planned_batch_yields_identical_records_and_markers(
    kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    """The same journaled (start, end) read twice from the real broker, as Spark's replay
    after a crash does: the same rows and the same markers, byte for byte."""
    import pyarrow as pa

    from flinkish_source.kafka import KafkaMetadata
    from flinkish_source.offset_planner import OffsetPlanner
    from flinkish_source.options import parse_options
    from flinkish_source.partition_reader import read_slice

    name = topic(4)
    produce(kafka_bootstrap, name, skewed(4, 30))
    options = parse_options({
        "kafka.bootstrap.servers": kafka_bootstrap, "subscribe": name,
        "startingOffsets": "earliest", "watermark.maxOutOfOrderness": "2 seconds",
        "idleTimeout": "1 minute", "checkpointing.location": str(tmp_path / "state"),
        "kafkaConsumer.pollTimeoutMs": "20000",
    })
    metadata = KafkaMetadata(options)
    try:
        partitions = metadata.partitions()
        ranges = metadata.offset_ranges(partitions)
    finally:
        metadata.close()
    planner = OffsetPlanner(options)
    start = planner.initial(partitions, ranges, 0)
    end = planner.latest(start, partitions, ranges, 1, limit=50)
    plans = OffsetPlanner.slices(start, end)
    assert sum(p.end - p.start for p in plans) == 50

    def read_all() -> pa.Table:
        return pa.Table.from_batches(
            [b for plan in plans for b in read_slice(options, plan)]
        )

    first, replay = read_all(), read_all()
    assert first.num_rows == 50 + 2 * len(plans)  # records, an ACTIVE and a watermark each
    assert first.equals(replay)


def test_starting_at_latest_under_a_steady_producer_reads_every_record_after_the_start(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Any
) -> None:
    """Spark asks ``initialOffset`` again when it runs the first batch; with records arriving
    all the time that answer lies past the start the batch was planned from. Every record from
    where the query started (batch 0's journaled ``first`` offsets) on is read, none twice."""
    from confluent_kafka import Producer

    name = topic(4)
    stop = threading.Event()

    def steady() -> None:
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
        i = 0
        while not stop.is_set():
            producer.produce(name, key=b"k", value=b"{}", partition=i % 4)
            producer.poll(0)
            i += 1
            time.sleep(0.001)
        producer.flush(30)

    producing = threading.Thread(target=steady)
    producing.start()
    checkpoint = tmp_path / "checkpoint"
    collector = Collector()
    query = None
    try:
        time.sleep(0.5)  # the topic has records before the query starts
        df = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                    startingOffsets="latest")
        query = start(df, str(checkpoint), collector)
        wait_for(lambda: query.lastProgress and query.lastProgress["batchId"] >= 3, 120,
                 "four batches")
    finally:
        if query is not None:
            query.stop()
        stop.set()
        producing.join()
    first_offset = json.loads((checkpoint / "offsets" / "0").read_text().splitlines()[2])
    read: dict[int, list[int]] = {}
    for row in collector.snapshot():
        if row.kind == "record":
            read.setdefault(row.partition, []).append(row.offset)
    assert sorted(read) == [0, 1, 2, 3]
    for partition, offsets in read.items():
        first = first_offset["topics"][name][str(partition)]["first"]
        assert sorted(offsets) == list(range(first, first + len(offsets))), partition
