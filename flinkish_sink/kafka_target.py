"""Kafka as a two-phase-commit target: Flink's ``KafkaSink`` with
``DeliveryGuarantee.EXACTLY_ONCE`` on Spark's epochs.

Each task attempt produces into a transaction of its own, left open, and pre-commits its
:class:`KafkaCommittable` (transactional id, producer id and epoch); the driver commits it with
EndTxn. The ids are deterministic, so a replay fences the crashed run's producers; the tasks
abort their siblings' leftovers (docs/guides/exactly-once-kafka.md, "Transactional ids").
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from flinkish_core.config import Option, collected, optional_text, whole_number
from flinkish_core.durations import format_duration
from flinkish_core.errors import OptionError
from flinkish_core.secrets import fingerprint, redact_config, secret_values
from flinkish_kafka.java_security import ClientSecurity, client_config, translate
from flinkish_kafka.transactions import KafkaCommittable, TransactionClient, TransactionFencedError
from flinkish_sink.options import DEFAULT_TRANSACTION_TIMEOUT_MS, TargetOptions
from flinkish_sink.target import SOURCE_POSITION, PreCommit, TransactionId
from flinkish_sink.targets import TargetFactory

logger = logging.getLogger(__name__)

#: The columns a Kafka record is made of, as Spark's Kafka sink names them.
VALUE, KEY, TOPIC, PARTITION, HEADERS = "value", "key", "topic", "partition", "headers"
#: How often librdkafka reports its statistics (the producer id and epoch).
STATS_INTERVAL_MS = 10
#: How long a task waits for its producer (init, flush, statistics) before failing.
PRODUCER_TIMEOUT_S = 60.0
#: How long the driver's transaction client may take for one EndTxn, retries included.
COMMIT_TIMEOUT_S = 60.0


def _kafka_secrets(kafka: dict[str, str]) -> list[str]:
    """The secrets among the ``kafka.*`` options, also those inside a JAAS string."""
    found = secret_values(kafka)
    try:
        config, security = translate(kafka)
    except OptionError:  # refused at parsing; its values are masked as given
        return found
    return found + secret_values(config) + security.secrets()


KAFKA: Option[dict[str, str]] = Option(
    "kafka.*", collected, {}, shown_default="—", mask=redact_config, secrets=_kafka_secrets,
    doc="`kafka.bootstrap.servers` (required) and producer settings, as for the source: "
        "librdkafka's names, or the Java client's security settings (`kafka.sasl.jaas.config`, "
        "JKS / PKCS12 / PEM stores, AWS MSK IAM), translated the same way ([secured clusters]"
        "(../secured-clusters.md)); they also configure the client that commits the "
        "transactions. `kafka.transaction.timeout.ms` (default 15 min, the brokers' default "
        "`transaction.max.timeout.ms`): how long the broker keeps an epoch's transactions open "
        "before it aborts them ([the transaction timeout]"
        "(../guides/exactly-once-kafka.md#the-transaction-timeout)). "
        "`kafka.transactional.id`, `kafka.enable.idempotence` and the serializers are the "
        "sink's own.")
TOPIC_OPTION: Option[str | None] = Option(
    "topic", optional_text, None,
    doc="The topic every record goes to; overrides a `topic` column, as in Spark's Kafka sink. "
        "Required when the rows have no `topic` column, or carry the flinkish source's "
        "`topic`, `partition` and `offset` (where a record was read, never where it is "
        "written).")

_FORBIDDEN = {
    "transactional.id": "the sink derives each write task's transactional id from the option "
                        "transactionalIdPrefix, the query, the epoch and the task",
    "enable.idempotence": "the option deliveryGuarantee sets it (exactly-once and "
                          "at-least-once: on)",
    "key.serializer": "keys are written as the key column's bytes (string: UTF-8)",
    "value.serializer": "values are written as the value column's bytes (string: UTF-8)",
}


@dataclass(frozen=True, repr=False)
class KafkaSinkOptions:
    """What a Kafka target connects with; ``topic`` None: each row's ``topic`` column."""

    config: tuple[tuple[str, str], ...]
    security: ClientSecurity
    topic: str | None
    transaction_timeout_ms: int

    def __repr__(self) -> str:
        return (f"KafkaSinkOptions(config={redact_config(dict(self.config))!r}, "
                f"security={self.security!r}, topic={self.topic!r}, "
                f"transaction_timeout_ms={self.transaction_timeout_ms!r}, "
                f"fingerprint={self.fingerprint[:12]!r})")

    @property
    def fingerprint(self) -> str:
        """A hash of the settings, secrets included."""
        return fingerprint(self.config, self.security, self.security.secrets(), self.topic,
                           self.transaction_timeout_ms)

    def client_config(self) -> dict[str, Any]:
        return client_config(dict(self.config), self.security)


def kafka_options(options: TargetOptions) -> KafkaSinkOptions:
    """Target kafka's connection settings from its options, checked and translated.

    Raises:
        OptionError: a missing bootstrap, a setting the sink sets itself, a bad timeout, or a
            Java security setting that cannot be translated.
    """
    given: dict[str, str] = options[KAFKA]
    kafka = dict(given)
    if not kafka.get("bootstrap.servers", "").strip():
        raise OptionError(
            "option kafka.bootstrap.servers is required with target kafka, e.g. "
            "'host1:9092,host2:9092'")
    for key, why in _FORBIDDEN.items():
        if key in kafka:
            raise OptionError(f"option kafka.{key} is not supported: {why}")
    timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS
    if "transaction.timeout.ms" in kafka:
        timeout_ms = whole_number(1, "a whole number of milliseconds >= 1")(
            "kafka.transaction.timeout.ms", kafka.pop("transaction.timeout.ms"))
    config, security = translate(kafka)
    topic = options[TOPIC_OPTION]
    if topic is not None and not topic.strip():
        raise OptionError("option topic is empty: name the topic to write to, or leave it "
                          "out to write each row to its topic column")
    return KafkaSinkOptions(tuple(sorted(config.items())), security,
                            topic.strip() if topic else None, timeout_ms)


#: Per process, by the options' fingerprint, as Spark's Kafka sink caches its producers.
_CLIENTS: dict[str, TransactionClient] = {}
_DIRECT: dict[str, _Producer] = {}


class KafkaTransactionLostError(RuntimeError):
    """A decided epoch's transaction was aborted before its commit: its records are lost."""

    transient = False  # retrying cannot bring them back


def transactional_id(txn: TransactionId) -> str:
    """The ``transactional.id`` of a task attempt: the same on every replay of the epoch."""
    return replace(txn, run="").gid


def _is_text_or_binary(dtype: pa.DataType) -> bool:
    return (pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
            or pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype))


def record_columns(schema: pa.Schema, topic_option: str | None) -> set[str]:
    """Which of ``schema``'s columns make the records, checked as Spark's Kafka sink does."""
    names = set(schema.names)
    if VALUE not in names:
        raise OptionError(
            f"target kafka needs a value column (string or binary); the rows have "
            f"{', '.join(schema.names) or 'no columns'}: select or compute one, e.g. "
            "to_json(struct(*)) AS value")
    from_source = names >= SOURCE_POSITION
    if from_source and topic_option is None:
        raise OptionError(
            "the rows carry the flinkish source's topic, partition and offset (where each "
            "input record was read): target kafka never writes to the input's topic or "
            "partition from them. Set option topic (the output topic; records are "
            "partitioned by key), or select the columns to write without offset (key, "
            "value, and a topic column of your own)")
    wanted = {KEY, HEADERS} if from_source else {KEY, PARTITION, HEADERS}
    if topic_option is None:  # else the option overrides the column, as in Spark
        wanted.add(TOPIC)
    used = {VALUE} | (names & wanted)
    for name in (VALUE, KEY, TOPIC):
        if name in used and not _is_text_or_binary(schema.field(name).type):
            raise OptionError(f"target kafka: column {name} is {schema.field(name).type}; "
                              "it must be a string or binary (cast it)")
    if PARTITION in used and not pa.types.is_integer(schema.field(PARTITION).type):
        raise OptionError(f"target kafka: column partition is {schema.field(PARTITION).type}; "
                          "it must be an int")
    if HEADERS in used and not _headers_type(schema.field(HEADERS).type):
        raise OptionError(
            f"target kafka: column headers is {schema.field(HEADERS).type}; it must be "
            "array<struct<key: string, value: binary>>")
    if TOPIC not in used and topic_option is None:
        raise OptionError(
            "target kafka needs the topic to write to: set option topic, or give the rows a "
            "topic column (string)")
    return used


def _headers_type(dtype: pa.DataType) -> bool:
    if not (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)):
        return False
    item = dtype.value_type
    return (pa.types.is_struct(item) and item.num_fields == 2
            and item.field(0).name == "key" and _is_text_or_binary(item.field(0).type)
            and item.field(1).name == "value" and _is_text_or_binary(item.field(1).type))


class _Reports:
    """A producer's delivery failures and latest statistics; apart from :class:`_Producer`
    so that its callbacks hold no reference cycle and it goes with its last reference."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.stats_seen = 0
        self.stats = ""

    def on_stats(self, raw: str) -> None:
        self.stats = raw
        self.stats_seen += 1

    def on_delivery(self, error: Any, message: Any) -> None:
        if error is not None and len(self.failed) < 5:
            self.failed.append(f"{message.topic()}[{message.partition()}]: {error}")


class _Producer:
    def __init__(self, config: dict[str, Any]) -> None:
        from confluent_kafka import Producer

        self.reports = _Reports()
        self.producer = Producer({**config, "statistics.interval.ms": STATS_INTERVAL_MS,
                                  "stats_cb": self.reports.on_stats,
                                  "on_delivery": self.reports.on_delivery})

    def flush(self, what: str) -> None:
        """Wait until every record is delivered; raise, naming ``what``, for those not."""
        left = self.producer.flush(PRODUCER_TIMEOUT_S)
        failed, self.reports.failed = self.reports.failed, []
        if left or failed:
            raise RuntimeError(f"{what}: {left} record(s) not delivered within "
                               f"{format_duration(PRODUCER_TIMEOUT_S)}"
                               + (f"; failures: {'; '.join(failed)}" if failed else ""))

    def fresh_eos(self, timeout_s: float) -> dict[str, Any]:
        """The ``eos`` statistics of the first report after this call that shows the producer
        id assigned (a report from ``init_transactions`` may come late, without one)."""
        reports = self.reports
        seen = reports.stats_seen
        deadline = time.monotonic() + timeout_s
        while True:
            if reports.stats_seen > seen:
                eos: dict[str, Any] = json.loads(reports.stats).get("eos", {})
                if eos.get("idemp_state") == "Assigned":
                    return eos
                seen = reports.stats_seen
            if time.monotonic() > deadline:
                raise TimeoutError("librdkafka reported no producer id within "
                                   f"{format_duration(timeout_s)}")
            self.producer.poll(STATS_INTERVAL_MS / 1000)


def _init_transactions(producer: Any, transactional: str, timeout_ms: int) -> None:
    from confluent_kafka import KafkaError, KafkaException

    try:
        producer.init_transactions(PRODUCER_TIMEOUT_S)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if getattr(error, "code", lambda: None)() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            raise OptionError(
                f"the Kafka broker refused transaction.timeout.ms={timeout_ms} for "
                f"{transactional}: it is above the broker's transaction.max.timeout.ms. Lower "
                "the sink's option kafka.transaction.timeout.ms, or raise the brokers' "
                "transaction.max.timeout.ms") from exc
        raise


class KafkaTransaction:
    """One write task attempt's open Kafka transaction."""

    def __init__(self, target: KafkaTarget, txn: TransactionId, schema: pa.Schema) -> None:
        self._target = target
        self._txn = replace(txn, run="")
        self._id = transactional_id(txn)
        self._columns = record_columns(schema, target.options.topic)
        self._rows = 0
        target.abort_siblings(self._txn, before=True)
        self._client = _Producer(target.producer_config(self._id))
        producer = self._client.producer
        _init_transactions(producer, self._id, target.options.transaction_timeout_ms)
        if self._client.fresh_eos(PRODUCER_TIMEOUT_S).get("producer_epoch", 0) > 0:
            # a replay: the crashed run may have run later attempts of this task
            target.abort_siblings(self._txn, before=False)
        producer.begin_transaction()

    def write(self, batch: pa.RecordBatch) -> None:
        self._rows += produce_rows(self._client.producer, batch, self._columns,
                                   self._target.options.topic)

    def pre_commit(self) -> PreCommit:
        self._client.flush(f"Kafka transaction {self._id}")
        eos = self._client.fresh_eos(PRODUCER_TIMEOUT_S)
        if eos.get("txn_state") != "InTransaction":
            raise RuntimeError(f"Kafka transaction {self._id} is {eos.get('txn_state')} after "
                               "its flush, not InTransaction: it cannot be committed")
        committable = KafkaCommittable(self._id, int(eos["producer_id"]),
                                       int(eos["producer_epoch"]))
        return PreCommit(self._txn, self._rows, detail=committable.to_json())

    def abort(self) -> None:
        self._client.producer.abort_transaction(PRODUCER_TIMEOUT_S)


def produce_rows(producer: Any, batch: pa.RecordBatch, columns: set[str],
                 topic: str | None) -> int:
    """Produce ``batch``'s rows as records (of ``columns``); the number produced."""
    values = batch.column(VALUE).to_pylist()
    n = len(values)
    keys = batch.column(KEY).to_pylist() if KEY in columns else [None] * n
    topics = batch.column(TOPIC).to_pylist() if TOPIC in columns else [topic] * n
    partitions = batch.column(PARTITION).to_pylist() if PARTITION in columns else [None] * n
    headers = batch.column(HEADERS).to_pylist() if HEADERS in columns else None
    produce = producer.produce
    for i in range(n):
        to = topics[i]
        if to is None:
            raise ValueError("target kafka: a row has a null topic column and no option "
                             "topic is set")
        record_headers = None
        if headers is not None and headers[i]:
            record_headers = [(h["key"], h["value"]) for h in headers[i]]
        part = partitions[i]
        while True:
            try:
                produce(to, values[i], keys[i], -1 if part is None else part,
                        headers=record_headers)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        if i % 1000 == 999:
            producer.poll(0)
    return n


class KafkaTarget:
    """Records into Kafka topics."""

    #: an open transaction holds no lock another writer waits on
    leftovers_block_writes = False
    pending_consequence = ("the broker aborts an open transaction at transaction.timeout.ms, "
                           "and until then read_committed consumers of its partitions stop at it")
    #: initialising a decided transaction's id would abort it: a decided epoch is not rewritten
    reuses_transaction_ids = True
    #: librdkafka retries what the broker did not answer: no copy of the rows is kept
    client_rides_out_outages = True

    def __init__(self, options: KafkaSinkOptions) -> None:
        self.options = options

    def __repr__(self) -> str:
        servers = dict(self.options.config).get("bootstrap.servers", "?")
        return f"KafkaTarget({servers}, topic={self.options.topic!r})"

    def producer_config(self, transactional: str | None = None) -> dict[str, Any]:
        config = self.options.client_config()
        config["enable.idempotence"] = True
        if transactional is not None:
            config["transactional.id"] = transactional
            config["transaction.timeout.ms"] = self.options.transaction_timeout_ms
        return config

    def check(self, schema: pa.Schema) -> None:
        record_columns(schema, self.options.topic)

    def begin_transaction(self, txn: TransactionId, schema: pa.Schema) -> KafkaTransaction:
        return KafkaTransaction(self, txn, schema)

    def write_direct(self, batch: pa.RecordBatch) -> None:
        """At-least-once / none: an idempotent producer, flushed before this returns."""
        key = self.options.fingerprint
        if key not in _DIRECT:
            _DIRECT[key] = _Producer(self.producer_config())
        direct = _DIRECT[key]
        produce_rows(direct.producer, batch, record_columns(batch.schema, self.options.topic),
                     self.options.topic)
        direct.flush(repr(self))

    def fence(self, transactional: str) -> int:
        """Initialise a producer on ``transactional``, fencing and aborting its older ones;
        the producer epoch the id got (0: never used)."""
        client = _Producer(self.producer_config(transactional))
        try:
            _init_transactions(client.producer, transactional,
                               self.options.transaction_timeout_ms)
            return int(client.fresh_eos(PRODUCER_TIMEOUT_S).get("producer_epoch", 0))
        finally:
            client.producer.flush(0)

    def abort_siblings(self, txn: TransactionId, *, before: bool) -> None:
        """Abort the attempts before ``txn`` (``before``), or those after it up to the first
        id never used."""
        aborted = []
        attempts = range(txn.attempt) if before else itertools.count(txn.attempt + 1)
        for attempt in attempts:
            sibling = transactional_id(replace(txn, attempt=attempt))
            epoch = self.fence(sibling)
            if epoch == 0 and not before:
                break
            aborted.append(sibling)
        if aborted:
            logger.info("before writing %s: fenced and aborted %s", transactional_id(txn),
                        ", ".join(aborted))

    def _transactions(self) -> TransactionClient:
        key = self.options.fingerprint
        if key not in _CLIENTS:
            _CLIENTS[key] = TransactionClient(self.options.client_config(), COMMIT_TIMEOUT_S)
        return _CLIENTS[key]

    def commit(self, pre_commit: PreCommit) -> None:
        committable = KafkaCommittable.from_json(pre_commit.detail or {})
        try:
            self._transactions().commit(committable)
        except TransactionFencedError as exc:
            raise KafkaTransactionLostError(
                f"epoch {pre_commit.txn.epoch} was decided, but its Kafka transaction "
                f"{committable.transactional_id} (producer id {committable.producer_id}, "
                f"epoch {committable.producer_epoch}) holding {pre_commit.rows} record(s) "
                "can no longer be committed: the broker aborted it, most likely because the "
                "query was down longer than the producers' transaction.timeout.ms "
                f"({format_duration(self.options.transaction_timeout_ms / 1000)}) after "
                "deciding the epoch. Those records are lost from the output topic; the query "
                "stops rather than go on with the gap. Replay the epoch's input from its "
                "source into the topic if it must be complete, and raise the option "
                "kafka.transaction.timeout.ms (up to the brokers' transaction.max.timeout.ms) "
                "to ride out longer outages") from exc

    def rollback(self, txn: TransactionId) -> None:
        self.fence(transactional_id(txn))

    def pending(self, prefix: str, query: str) -> list[TransactionId]:
        return []

    def pending_ages(self, prefix: str, query: str) -> dict[TransactionId, float | None]:
        """None: Kafka cannot list them; the write tasks abort their siblings' instead."""
        return {}

    def publish_epoch(self, query: str, epoch: int, watermark: int | None, rows: int,
                      late_rows: int, source: str | None = None) -> None:
        """Nothing is written beside the records: the checkpoint store holds the epochs."""

    def committed_watermark(self, query: str) -> int | None:
        return None

    def max_pending(self) -> int | None:
        return None

    def close(self) -> None:
        client = _CLIENTS.pop(self.options.fingerprint, None)
        if client is not None:
            client.close()
        direct = _DIRECT.pop(self.options.fingerprint, None)
        if direct is not None:
            direct.producer.flush(PRODUCER_TIMEOUT_S)


def _create(options: TargetOptions, late: bool) -> KafkaTarget:
    assert not late, "target kafka has no side output"
    return KafkaTarget(kafka_options(options))


FACTORY = TargetFactory(
    name="kafka",
    doc="Kafka topics ([exactly once into Kafka](../guides/exactly-once-kafka.md)), as "
        "Flink's `KafkaSink` writes them: a transaction per write task, committed by the driver.",
    options=(KAFKA, TOPIC_OPTION),
    check=kafka_options,
    create=_create,
    cli_option="kafka.bootstrap.servers",
    title="Kafka",
)
