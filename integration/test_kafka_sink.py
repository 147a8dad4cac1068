"""``target=kafka`` through Spark against the session's broker: Kafka in, Kafka out, read back
through the committed view (:mod:`integration.kafka_committed`): every record once and no
transaction left open; at-least-once; the errors a wrong projection gets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flinkish.demo.embedded_kafka import create_topic
from integration.kafka_committed import settled_values
from integration.kafka_helpers import produce, run_sink, source

pytestmark = pytest.mark.integration

PARTITIONS = 2
PER_PARTITION = 30
MARKERS = ("topic", "partition", "offset", "kind", "watermark", "status")


def _input(kafka_bootstrap: str, topic: Any) -> tuple[str, list[bytes]]:
    name = topic(PARTITIONS)
    records = [(p, b"k%d" % i, b"v-%d-%d" % (p, i), 1_700_000_000_000 + i * 1000)
               for p in range(PARTITIONS) for i in range(PER_PARTITION)]
    produce(kafka_bootstrap, name, records)
    return name, [r[2] for r in records]


def _run(df: Any, checkpoint: Path, **options: str) -> None:
    run_sink(df, checkpoint, target="kafka", **options)


def test_kafka_to_kafka_exactly_once(spark: Any, kafka_bootstrap: str, topic: Any,
                                     tmp_path: Path) -> None:
    name, values = _input(kafka_bootstrap, topic)
    out = f"{name}-out"
    create_topic(kafka_bootstrap, out, 3)
    df = source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                maxOffsetsPerTrigger="20")
    # the source's position columns stay for the markers; the option topic routes
    _run(df.select("key", "value", *MARKERS), tmp_path / "cp", topic=out,
         **{"kafka.bootstrap.servers": kafka_bootstrap})
    assert sorted(settled_values(kafka_bootstrap, out, 3)) == sorted(values)
    # a second run of the same query (nothing new to read) adds nothing
    _run(df.select("key", "value", *MARKERS), tmp_path / "cp", topic=out,
         **{"kafka.bootstrap.servers": kafka_bootstrap})
    assert sorted(settled_values(kafka_bootstrap, out, 3)) == sorted(values)


def test_at_least_once_writes_every_record(spark: Any, kafka_bootstrap: str, topic: Any,
                                           tmp_path: Path) -> None:
    name, values = _input(kafka_bootstrap, topic)
    out = f"{name}-out"
    create_topic(kafka_bootstrap, out, 1)
    # without the marker columns, marker rows would be records of null key and value: no
    # markers at all (the docs' advice for a projection without them)
    df = source(spark, kafka_bootstrap, name, str(tmp_path / "state"), includeMarkers="false")
    # a topic column of the rows' own routes each record
    rows = df.selectExpr("key", "value", f"'{out}' AS topic")
    _run(rows, tmp_path / "cp", deliveryGuarantee="at-least-once",
         **{"kafka.bootstrap.servers": kafka_bootstrap})
    assert sorted(settled_values(kafka_bootstrap, out, 1)) == sorted(values)


@pytest.mark.parametrize(("columns", "options", "message"), [
    (("key", "offset"), {"topic": "x"}, "needs a value column"),
    (("key", "value", *MARKERS), {}, "never writes to the input's topic"),
])
def test_wrong_rows_fail_clearly(spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path,
                                 columns: tuple[str, ...], options: dict[str, str],
                                 message: str) -> None:
    name, _ = _input(kafka_bootstrap, topic)
    df = source(spark, kafka_bootstrap, name, str(tmp_path / "state"))
    with pytest.raises(Exception, match=message):
        _run(df.select(*columns), tmp_path / "cp",
             **{"kafka.bootstrap.servers": kafka_bootstrap, **options})


def _open(target: Any, txn: Any, values: list[str]) -> Any:
    """A task attempt that wrote ``values`` and pre-committed (its transaction left open)."""
    import pyarrow as pa

    batch = pa.RecordBatch.from_pydict({"value": values})
    transaction = target.begin_transaction(txn, batch.schema)
    transaction.write(batch)
    return transaction.pre_commit()


def test_task_attempts_fence_what_other_attempts_left_open(kafka_bootstrap: str,
                                                           topic: Any) -> None:
    """No Spark: the write tasks' side against the broker. A retried attempt aborts the
    earlier attempts' transactions; a replay of the epoch (its ids used before) also aborts
    those of later attempts the crashed run made; only the decided one is committed."""
    from flinkish_sink.kafka_target import KafkaTarget, kafka_options
    from flinkish_sink.options import parse_sink_options
    from flinkish_sink.target import TransactionId

    out = topic(1)
    options = parse_sink_options({"target": "kafka", "kafka.bootstrap.servers": kafka_bootstrap,
                                  "topic": out, "checkpointLocation": "/unused"})
    target = KafkaTarget(kafka_options(options.target_options))
    query = f"q{out[-6:].replace('-', '')}"

    def txn(attempt: int, run: str) -> TransactionId:
        return TransactionId("flinkish", query, 5, 0, attempt, run)

    # the crashed run: attempt 0 failed with its transaction open, attempt 1 pre-committed
    _open(target, txn(0, "run1"), ["a0"])
    _open(target, txn(1, "run1"), ["a1"])
    # the replay: attempt 0 again (the ids are the run's-token-free ones)
    decided = _open(target, txn(0, "run2"), ["replayed"])
    target.commit(decided)
    assert settled_values(kafka_bootstrap, out, 1) == [b"replayed"]
    target.close()
