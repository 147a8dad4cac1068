"""target=kafka without Spark or a broker: its options, the transactional ids, the committable
a task hands the driver, the records' columns, and the recovery decisions of the coordinator
over a KafkaTarget whose two Kafka calls (EndTxn through the transaction client, and fencing
an id with ``init_transactions``) are recorded instead of sent (the real calls are tested
against the broker in integration/test_kafka_sink.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import flinkish_sink.two_phase_commit
from checkpointing import CheckpointStorage, CheckpointStore
from flinkish_core.errors import OptionError
from flinkish_kafka.transactions import KafkaCommittable, TransactionFencedError
from flinkish_sink import row_spill
from flinkish_sink.kafka_target import (
    KafkaSinkOptions,
    KafkaTarget,
    KafkaTransactionLostError,
    kafka_options,
    record_columns,
    transactional_id,
)
from flinkish_sink.options import DEFAULT_TRANSACTION_TIMEOUT_MS, parse_sink_options
from flinkish_sink.outages import RetriedTransaction, RetryPolicy, is_transient
from flinkish_sink.parquet_target import ParquetTarget
from flinkish_sink.target import PreCommit, ReusedIdsTarget, TransactionId
from flinkish_sink.two_phase_commit import TwoPhaseCommitCoordinator

BASE = {"target": "kafka", "kafka.bootstrap.servers": "b1:9092", "topic": "out",
        "checkpointLocation": "/tmp/cp"}


def parsed(**extra: str) -> KafkaSinkOptions:
    return kafka_options(parse_sink_options({**BASE, **extra}).target_options)


# -- options -------------------------------------------------------------------------------

def test_kafka_options_are_parsed() -> None:
    options = parsed(**{"kafka.linger.ms": "5"})
    assert dict(options.config) == {"bootstrap.servers": "b1:9092", "linger.ms": "5"}
    assert options.topic == "out"
    assert options.transaction_timeout_ms == DEFAULT_TRANSACTION_TIMEOUT_MS


def test_the_producers_transaction_timeout_is_a_producer_setting() -> None:
    given = parsed(**{"kafka.transaction.timeout.ms": "60000"})
    assert given.transaction_timeout_ms == 60_000
    assert "transaction.timeout.ms" not in dict(given.config)


@pytest.mark.parametrize(("extra", "drop", "message"), [
    ({}, "kafka.bootstrap.servers", "kafka.bootstrap.servers is required"),
    ({"kafka.transactional.id": "x"}, None, "kafka.transactional.id is not supported"),
    ({"kafka.enable.idempotence": "false"}, None, "deliveryGuarantee sets it"),
    ({"kafka.transaction.timeout.ms": "soon"}, None, "not a whole number"),
    ({"path": "/tmp/x"}, None, r"option path applies to .* only \(not kafka\)"),
    ({"upsertKey": "k"}, None, "upsertKey: the key columns, .* with target postgres or delta"),
    ({"lateData": "side"}, None, "target kafka has no side output"),
    ({"topic": " "}, None, "option topic is empty"),
    ({"kafka.sasl.jaas.config": "nonsense"}, None, "kafka.sasl.jaas.config"),
])
def test_bad_kafka_options_name_the_fix(extra: dict[str, str], drop: str | None,
                                        message: str) -> None:
    raw = {**BASE, **extra}
    if drop:
        del raw[drop]
    with pytest.raises(OptionError, match=message):
        parse_sink_options(raw)


def test_kafka_options_apply_to_target_kafka_only() -> None:
    with pytest.raises(OptionError, match=r"options kafka\.\* apply to target kafka only"):
        parse_sink_options({"target": "parquet", "path": "/tmp/p", "checkpointLocation": "/c",
                            "kafka.bootstrap.servers": "b:1"})
    with pytest.raises(OptionError, match="option topic applies to target kafka only"):
        parse_sink_options({"target": "parquet", "path": "/tmp/p", "checkpointLocation": "/c",
                            "topic": "t"})


def test_secured_cluster_settings_are_translated_and_masked() -> None:
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="u" password="s3cret";')
    options = parse_sink_options({
        **BASE, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": jaas})
    config = kafka_options(options.target_options).client_config()
    assert config["sasl.username"] == "u" and config["sasl.password"] == "s3cret"
    assert "s3cret" not in repr(options)
    assert "s3cret" in options.secrets
    other = parse_sink_options({**BASE, "kafka.security.protocol": "SASL_SSL",
                                "kafka.sasl.mechanism": "PLAIN",
                                "kafka.sasl.jaas.config": jaas.replace("s3cret", "other")})
    assert other.fingerprint != options.fingerprint


# -- ids and committables ------------------------------------------------------------------

def test_transactional_id_is_the_same_on_every_run_of_an_epoch() -> None:
    first = TransactionId("flinkish", "q1", 7, 3, 0, "aaaa1111")
    replay = TransactionId("flinkish", "q1", 7, 3, 0, "bbbb2222")
    assert transactional_id(first) == transactional_id(replay) == "flinkish:q1:7:3:0"
    assert TransactionId.parse(transactional_id(first)) == TransactionId(
        "flinkish", "q1", 7, 3, 0)
    assert transactional_id(TransactionId("flinkish", "q1", 7, 3, 1, "x")) != \
        transactional_id(first)


def test_a_committable_travels_in_the_pre_commit() -> None:
    committable = KafkaCommittable("flinkish:q1:7:3:0", 4711, 2)
    pre_commit = PreCommit(TransactionId("flinkish", "q1", 7, 3, 0), 25,
                           detail=committable.to_json())
    back = PreCommit.from_json(pre_commit.to_json())
    assert back == pre_commit
    assert KafkaCommittable.from_json(back.detail or {}) == committable


# -- the records' columns ------------------------------------------------------------------

SOURCE_ROWS = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                         ("partition", pa.int32()), ("offset", pa.int64()),
                         ("timestamp", pa.timestamp("us", "UTC"))])


def test_the_sources_position_never_routes_a_record() -> None:
    assert record_columns(SOURCE_ROWS, "out") == {"value", "key"}
    with pytest.raises(OptionError, match="never writes to the input's topic or partition"):
        record_columns(SOURCE_ROWS, None)


def test_rows_of_their_own_route_by_their_columns() -> None:
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    schema = pa.schema([("value", pa.string()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("headers", headers), ("extra", pa.int64())])
    assert record_columns(schema, None) == {"value", "topic", "partition", "headers"}
    # the option overrides the column, as in Spark's Kafka sink
    assert "topic" not in record_columns(schema, "out")


@pytest.mark.parametrize(("schema", "message"), [
    (pa.schema([("key", pa.string()), ("n", pa.int64())]),
     "needs a value column .* the rows have key, n"),
    (pa.schema([("value", pa.int64())]), "column value is int64"),
    (pa.schema([("value", pa.string()), ("partition", pa.string())]), "must be an int"),
    (pa.schema([("value", pa.string()), ("headers", pa.string())]),
     "array<struct<key: string, value: binary>>"),
])
def test_rows_kafka_cannot_take_fail_clearly(schema: pa.Schema, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        record_columns(schema, "out")


def test_without_a_topic_the_rows_need_a_topic_column() -> None:
    with pytest.raises(OptionError, match="set option topic, or give the rows a topic column"):
        record_columns(pa.schema([("value", pa.string())]), None)


# -- the coordinator over a Kafka target ---------------------------------------------------

class RecordedKafka(KafkaTarget):
    """A KafkaTarget whose EndTxn and fencing calls are recorded, not sent."""

    def __init__(self) -> None:
        super().__init__(parsed())
        self.committed: list[KafkaCommittable] = []
        self.fenced: list[str] = []
        self.aborted_by_broker: set[str] = set()  # transactions the broker timed out

    def _transactions(self) -> Any:
        target = self

        class Client:
            def commit(self, committable: KafkaCommittable) -> None:
                if committable.transactional_id in target.aborted_by_broker:
                    raise TransactionFencedError("fenced", 90, "PRODUCER_FENCED")
                target.committed.append(committable)

        return Client()

    def fence(self, transactional: str) -> int:
        self.fenced.append(transactional)
        return 1


def kafka_pre_commit(epoch: int, task: int, attempt: int = 0, rows: int = 5) -> PreCommit:
    txn = TransactionId("flinkish", "q1", epoch, task, attempt)
    return PreCommit(txn, rows, detail=KafkaCommittable(txn.gid, 100 + task, attempt).to_json())


def coordinator(root: Path, target: KafkaTarget) -> TwoPhaseCommitCoordinator:
    store = CheckpointStore(CheckpointStorage.open(str(root / "store")), owner="q1")
    return TwoPhaseCommitCoordinator(store, target, "flinkish", "q1",
                                     transaction_timeout_s=900)


def test_a_kafka_target_reuses_its_ids() -> None:
    assert isinstance(RecordedKafka(), ReusedIdsTarget)


def test_an_epoch_commits_each_decided_transaction(tmp_path: Path) -> None:
    target = RecordedKafka()
    decided = [kafka_pre_commit(0, 0), kafka_pre_commit(0, 1, attempt=1)]
    outcome = coordinator(tmp_path, target).commit_epoch(0, decided, [], 10, 0)
    assert target.committed == [KafkaCommittable.from_json(pc.detail or {}) for pc in decided]
    assert target.fenced == []
    assert outcome.committed == tuple(pc.txn.gid for pc in decided)


@pytest.mark.parametrize("crash", ["after_decision", "mid_commit", "before_checkpoint"])
def test_a_replay_commits_the_recorded_committables_again(tmp_path: Path, crash: str) -> None:
    target = RecordedKafka()
    decided = [kafka_pre_commit(3, 0), kafka_pre_commit(3, 1)]

    def fail_at(point: str, **_: Any) -> None:
        if point == crash:
            raise RuntimeError(point)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flinkish_sink.two_phase_commit, "failpoint", fail_at)
        with pytest.raises(RuntimeError, match=crash):
            coordinator(tmp_path, target).commit_epoch(3, decided, [], 10, 0)
    before = len(target.committed)
    # the replay's tasks wrote nothing (the epoch was decided): no pre-commits
    outcome = coordinator(tmp_path, target).commit_epoch(3, [], [], 0, 0)
    assert outcome.replayed
    recommitted = target.committed[before:]
    assert recommitted == [KafkaCommittable.from_json(pc.detail or {}) for pc in decided]
    assert target.fenced == []
    assert outcome.checkpoint.state["rows"] == 10


def test_an_abandoned_epoch_fences_what_its_tasks_left(tmp_path: Path) -> None:
    target = RecordedKafka()
    left = [kafka_pre_commit(4, 0), kafka_pre_commit(4, 1, attempt=2)]
    rolled = coordinator(tmp_path, target).abort_epoch(4, left)
    assert target.fenced == ["flinkish:q1:4:0:0", "flinkish:q1:4:1:2"] == rolled
    assert target.committed == []


def test_a_decided_transaction_the_broker_aborted_fails_the_query_loudly(
        tmp_path: Path) -> None:
    target = RecordedKafka()
    lost = kafka_pre_commit(6, 1, rows=42)
    target.aborted_by_broker.add(lost.txn.gid)
    with pytest.raises(KafkaTransactionLostError) as error:
        coordinator(tmp_path, target).commit_epoch(6, [kafka_pre_commit(6, 0), lost], [], 47, 0)
    message = str(error.value)
    assert "epoch 6" in message and "42 record(s)" in message
    assert "transaction.timeout.ms (15 min)" in message
    assert not is_transient(error.value)


def test_kafka_lists_no_lingering_transactions() -> None:
    target = RecordedKafka()
    assert target.pending_ages("flinkish", "q1") == {}
    assert target.max_pending() is None


# -- outages: librdkafka rides them out, the sink keeps no copy of the rows -----------------

class FlakyKafka(KafkaTarget):
    """A KafkaTarget whose transactions fail, transiently, as many times as asked."""

    def __init__(self, begins_failing: int = 0, pre_commits_failing: int = 0) -> None:
        super().__init__(parsed())
        self.begins_failing = begins_failing
        self.pre_commits_failing = pre_commits_failing
        self.begun = 0
        self.written: list[int] = []

    def begin_transaction(self, txn: TransactionId, schema: pa.Schema) -> Any:
        if self.begins_failing:
            self.begins_failing -= 1
            raise TimeoutError("librdkafka reported no producer id within 1 min")
        self.begun += 1
        target = self

        class Open:
            def write(self, batch: pa.RecordBatch) -> None:
                target.written += batch.column(0).to_pylist()

            def pre_commit(self) -> PreCommit:
                if target.pre_commits_failing:
                    target.pre_commits_failing -= 1
                    raise TimeoutError("librdkafka reported no producer id within 1 min")
                return PreCommit(txn, len(target.written))

            def abort(self) -> None:
                target.written = []

        return Open()

    def rollback(self, txn: TransactionId) -> None:
        pass


def _no_sleep_policy() -> RetryPolicy:
    return RetryPolicy(30, sleep=lambda _: None)


def test_a_kafka_transaction_keeps_no_copy_of_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    monkeypatch.setattr(row_spill, "MEMORY_BUDGET", 0)  # a kept row would go to disk at once
    txn = TransactionId("flinkish", "q1", 3, 0, 0, "r1")
    schema = pa.schema([("value", pa.int64())])
    transaction = RetriedTransaction(FlakyKafka(), txn, schema, _no_sleep_policy())
    transaction.write(pa.record_batch([pa.array([1, 2], pa.int64())], schema=schema))
    assert not list(tmp_path.glob("flinkish-spill-*/*"))
    assert transaction.pre_commit().rows == 2
    # another target, the same policy: its rows are kept for a retry
    parquet = RetriedTransaction(ParquetTarget(tmp_path / "out"), txn, schema,
                                 _no_sleep_policy())
    parquet.write(pa.record_batch([pa.array([1, 2], pa.int64())], schema=schema))
    assert len(list(tmp_path.glob("flinkish-spill-*/*.arrows"))) == 1
    parquet.abort()


def test_a_kafka_begin_is_retried_but_never_a_pre_commit_that_would_need_the_rows_again(
) -> None:
    txn = TransactionId("flinkish", "q1", 3, 0, 0, "r1")
    schema = pa.schema([("value", pa.int64())])
    target = FlakyKafka(begins_failing=2, pre_commits_failing=1)
    transaction = RetriedTransaction(target, txn, schema, _no_sleep_policy())
    assert target.begun == 1  # begun on the third try: nothing was written yet
    transaction.write(pa.record_batch([pa.array([1, 2], pa.int64())], schema=schema))
    with pytest.raises(TimeoutError):  # a new transaction would hold none of the rows
        transaction.pre_commit()
    assert target.begun == 1
