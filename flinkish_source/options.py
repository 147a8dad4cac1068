"""Parse and validate the source's options once, at query start, so every mistake is reported
with the option's name and what it accepts. Names follow Spark's Kafka source (switching is a
change of format) and, for event time, Flink's ``WatermarkStrategy``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from flinkish_core.config import (
    Given,
    Option,
    boolean,
    choice,
    collected,
    did_you_mean,
    duration_ms,
    match,
    optional_text,
    positive_duration_ms,
    reference_table,
    text,
    whole_number,
)
from flinkish_core.durations import parse_duration_ms
from flinkish_core.errors import OptionError
from flinkish_core.locations import MASTER_ENV, local_location_problem
from flinkish_core.secrets import redact_config, secret_values
from flinkish_core.watermark import DEFAULT_HORIZON_MS
from flinkish_kafka.java_security import (
    NO_SECURITY,
    ClientSecurity,
    check_client_security,
    client_config,
    translate,
)

__all__ = ["OptionError", "SourceOptions", "parse_duration_ms", "parse_options"]

EARLIEST = -2
LATEST = -1


class WatermarkKind(Enum):
    BOUNDED_OUT_OF_ORDERNESS = "boundedOutOfOrderness"
    MONOTONOUS = "monotonous"
    PUNCTUATED = "punctuated"
    NONE = "none"


class OnError(Enum):
    FAIL = "fail"
    SKIP = "skip"


_EVENT_TIME_UNITS = {"milliseconds": 1, "seconds": 1000, "microseconds": 0.001}

#: Consumer settings the source owns; users setting them would break offset tracking.
_FORBIDDEN_KAFKA = {
    "enable.auto.commit": "offsets are tracked in Spark's checkpoint, not committed to Kafka",
    "auto.offset.reset": "use the startingOffsets option instead",
    "enable.partition.eof": "the source sets it itself",
}

#: Spark's Kafka source waits at most this long for minOffsetsPerTrigger (maxTriggerDelay).
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

# The owners of the options: the groups of what reads them.
CLIENT = "kafka client"
TOPICS = "topics and offsets"
ADMISSION = "admission"
EVENT_TIME = "event time and watermarks"
STATE = "state"

_positive = whole_number(1, "a positive whole number")


def _timestamp_strategy(key: str, value: str) -> bool:
    """Whether a partition without a record at or after its starting time starts at its end
    (``latest``) rather than failing the query (``error``)."""
    word = value.strip().lower()
    if word not in ("error", "latest"):
        raise OptionError(
            f"option {key}: {word!r} is not error (fail when a partition has no record at or "
            "after the time) or latest (start at its end)")
    return word == "latest"


def _event_time_unit(key: str, value: str) -> float:
    unit = value.strip().lower()
    if unit not in _EVENT_TIME_UNITS:
        raise OptionError(f"option {key}: {unit!r} is not one of " + ", ".join(_EVENT_TIME_UNITS))
    return _EVENT_TIME_UNITS[unit]


def _watermark_strategy(key: str, value: str) -> WatermarkKind:
    by_lower = {k.value.lower(): k for k in WatermarkKind}
    if value.strip().lower() not in by_lower:
        raise OptionError(f"option {key}: {value.strip()!r} is not one of "
                          + ", ".join(k.value for k in WatermarkKind))
    return by_lower[value.strip().lower()]


BOOTSTRAP_SERVERS = Option(
    "kafka.bootstrap.servers", optional_text, None, owner=CLIENT, shown_default="required",
    doc="Brokers, `host1:9092,host2:9092`.")
KAFKA: Option[dict[str, str]] = Option(
    "kafka.*", collected, {}, owner=CLIENT, shown_default="—",
    doc="Passed to the consumer (confluent-kafka/**librdkafka** names; the Java client's "
        "security settings are translated, see [Read a secured "
        "cluster](../secured-clusters.md)) with the prefix stripped, e.g. "
        "`kafka.security.protocol`, `kafka.sasl.mechanism`. Error messages show the settings "
        "with SASL/SSL/password values masked. `kafka.group.id` names the group completed "
        "epochs' offsets are committed to (`kafka.group.id` below), not the read consumers'. "
        "Rejected: `kafka.enable.auto.commit`, `kafka.auto.offset.reset` (use "
        "`startingOffsets`), `kafka.enable.partition.eof`.")
SUBSCRIBE = Option(
    "subscribe", text, "", owner=TOPICS, shown_default="one of the three",
    doc="Comma-separated topics. A subscribed topic that does not exist is logged as a "
        "warning at every batch until it appears (then read from its start); "
        "`Trigger.AvailableNow` with nothing to read says so in the log. New partitions are "
        "read from their earliest offset.")
SUBSCRIBE_PATTERN = Option(
    "subscribePattern", text, "", owner=TOPICS, shown_default="or `subscribe`, or `assign`",
    doc="A regex that must match the whole topic name. New partitions are read from their "
        "earliest offset.")
ASSIGN = Option(
    "assign", text, "", owner=TOPICS, shown_default="or `subscribe`, or `subscribePattern`",
    doc="JSON `{\"topicA\":[0,1]}`. Partitions that appear later are not picked up.")
STARTING_OFFSETS = Option(
    "startingOffsets", text, "latest", owner=TOPICS,
    doc="`earliest`, `latest`, or JSON `{\"topic\":{\"0\":23,\"1\":-2}}` (-2 = earliest, -1 = "
        "latest). The JSON must name **every** partition of the query exactly. It cannot be "
        "combined with `subscribePattern`. Applies only at the query's first start.")
ENDING_OFFSETS = Option(
    "endingOffsets", optional_text, None, owner=TOPICS, shown_default="unbounded",
    doc="`latest` (as of the query's first start) or JSON (-1 = latest; earliest not "
        "allowed). A partition that reaches its end emits `MAX_WATERMARK` once. The query "
        "keeps running (use `Trigger.AvailableNow` to stop).")
MAX_OFFSETS_PER_TRIGGER = Option(
    "maxOffsetsPerTrigger", _positive, None, owner=ADMISSION, shown_default="no limit",
    doc="Positive integer. Records per micro-batch, shared between partitions in proportion "
        "to their backlog.")
STARTING_TIMESTAMP = Option(
    "startingTimestamp", text, "", owner=TOPICS, shown_default="not set",
    doc="Epoch milliseconds, Spark Kafka's option: every partition starts at its first record "
        "whose timestamp is at or after it (Kafka's ListOffsets by timestamp; each answer is "
        "checked against the records around it, and a broker that answers wrongly, as the "
        "embedded ones do, is worked around by a scan, with a warning). Partitions discovered "
        "later start at their earliest offset, as in Spark. Not with `startingOffsets` or "
        "`startingOffsetsByTimestamp`.")
STARTING_OFFSETS_BY_TIMESTAMP = Option(
    "startingOffsetsByTimestamp", text, "", owner=TOPICS, shown_default="not set",
    doc="JSON, per partition: `{\"topic\":{\"0\":1700000000000}}`, naming every partition (not "
        "with `subscribePattern`).")
STARTING_TIMESTAMP_STRATEGY = Option(
    "startingOffsetsByTimestampStrategy", _timestamp_strategy, False, owner=TOPICS,
    shown_default="`error`",
    doc="When a partition has no record at or after its starting time: `error` fails the "
        "query at start; `latest` starts it at its end.")
ENDING_TIMESTAMP = Option(
    "endingTimestamp", text, "", owner=TOPICS, shown_default="not set",
    doc="Epoch milliseconds: a bounded read that stops, per partition, before its first "
        "record at or after the time (at its end where there is none). Not with "
        "`endingOffsets` or `endingOffsetsByTimestamp`.")
ENDING_OFFSETS_BY_TIMESTAMP = Option(
    "endingOffsetsByTimestamp", text, "", owner=TOPICS, shown_default="not set",
    doc="JSON, per partition, like `startingOffsetsByTimestamp`: a bounded read that stops, "
        "per partition, before its first record at or after the time (at its end where there "
        "is none). Not with `endingOffsets` or `endingTimestamp`.")
MIN_OFFSETS_PER_TRIGGER = Option(
    "minOffsetsPerTrigger", _positive, None, owner=ADMISSION, shown_default="not set",
    doc="Positive integer, Spark Kafka's option: no micro-batch until at least this many new "
        "records are admitted (status and carrier-only batches wait too), unless "
        "`maxTriggerDelay` has passed since the last batch. Not applied under "
        "`Trigger.AvailableNow`, which reads to its target. At most `maxOffsetsPerTrigger`.")
MAX_TRIGGER_DELAY = Option(
    "maxTriggerDelay", positive_duration_ms, DEFAULT_MAX_TRIGGER_DELAY_MS, owner=ADMISSION,
    shown_default="`15m`",
    doc="Duration, with `minOffsetsPerTrigger`: the longest a batch waits for the minimum.")
GROUP_ID = Option(
    "kafka.group.id", optional_text, None, owner=CLIENT, shown_default="not set",
    doc="A consumer group that receives each completed epoch's end offsets (Flink's "
        "`commit.offsets.on.checkpoint`), so Kafka's own lag tools see the query; monitoring "
        "only, never read back. The read consumers do not join it. See [Monitor "
        "lag](../guides/monitor-lag.md).")
GROUP_ID_PREFIX = Option(
    "groupIdPrefix", text, "", owner=CLIENT, shown_default="not set",
    doc="Instead of `kafka.group.id`: the group is this prefix plus a digest of "
        "`checkpointing.location`, one group per query, the same across restarts.")
COMMIT_OFFSETS_ON_CHECKPOINT = Option(
    "commitOffsetsOnCheckpoint", boolean, True, owner=CLIENT, shown_default="`true` with a group",
    doc="`false`: commit nothing to the group.")
FAIL_ON_DATA_LOSS = Option(
    "failOnDataLoss", boolean, True, owner=TOPICS,
    doc="`false`: offsets deleted by retention (or vanished partitions) are skipped with a "
        "warning instead of failing the query.")
INCLUDE_HEADERS = Option(
    "includeHeaders", boolean, False, owner=TOPICS,
    doc="Adds the `headers` column.")
INCLUDE_MARKERS = Option(
    "includeMarkers", boolean, True, owner=EVENT_TIME,
    doc="`false`: no marker rows and no watermarks. The sink's valve then sees nothing, so "
        "nothing is ever late.")
EVENT_TIME_FIELD = Option(
    "eventTime.field", optional_text, None, owner=EVENT_TIME, shown_default="— (Kafka timestamp)",
    doc="Dotted path into the JSON value. The value may be a number in `eventTime.unit` or an "
        "ISO-8601 string with a zone.")
EVENT_TIME_HEADER = Option(
    "eventTime.header", optional_text, None, owner=EVENT_TIME, shown_default="—",
    doc="Header to read the event time from (same parsing). Cannot be combined with "
        "`eventTime.field`.")
EVENT_TIME_UNIT: Option[float] = Option(
    "eventTime.unit", _event_time_unit, 1, owner=EVENT_TIME, shown_default="`milliseconds`",
    doc="`milliseconds`, `seconds`, `microseconds`. Only with "
        "`eventTime.field`/`eventTime.header`.")
EVENT_TIME_ON_ERROR = Option(
    "eventTime.onError", choice(OnError), OnError.FAIL, owner=EVENT_TIME,
    doc="`fail`: stop, naming partition and offset. `skip`: emit the record with a null "
        "`eventTime`. The record does not move the watermark and is never late.")
WATERMARK_STRATEGY = Option(
    "watermark.strategy", _watermark_strategy, WatermarkKind.BOUNDED_OUT_OF_ORDERNESS,
    owner=EVENT_TIME,
    shown_default="`boundedOutOfOrderness`",
    doc="`boundedOutOfOrderness`, `monotonous`, `punctuated`, `none` (no watermark markers, "
        "status markers only).")
MAX_OUT_OF_ORDERNESS = Option(
    "watermark.maxOutOfOrderness", duration_ms, 0, owner=EVENT_TIME,
    doc="Duration. Only with `boundedOutOfOrderness`. Watermark = max event time − bound − 1 "
        "ms.")
PUNCTUATION_FIELD = Option(
    "watermark.punctuation.field", optional_text, None, owner=EVENT_TIME,
    doc="With `punctuated` (exactly one of field/header): JSON path of a flag. A record whose "
        "flag is truthy emits its own event time as a watermark.")
PUNCTUATION_HEADER = Option(
    "watermark.punctuation.header", optional_text, None, owner=EVENT_TIME,
    doc="With `punctuated`: a header whose value is not `\"\"`, `0`, `false` or `no` marks the "
        "record.")
IDLE_TIMEOUT = Option(
    "idleTimeout", positive_duration_ms, None, owner=EVENT_TIME, shown_default="none (never idle)",
    doc="Positive duration. A partition whose offsets have not grown for this long "
        "(processing time, measured when micro-batches are planned) and has nothing left to "
        "read is marked IDLE.")
STATE_LOCATION = Option(
    "checkpointing.location", optional_text, None, owner=STATE, shown_default="required (*)",
    doc="Directory for the per-partition watermark-generator state, as a local path or a "
        "`pyarrow.fs` URI (`s3://…`, `hdfs://…`). The driver and the executors must both "
        "reach it. Use one directory per query, and not the sink's store directory. A local "
        "path fails at query start when the Spark master is not `local`/`local[...]` (see "
        "[Run on a cluster](../guides/cluster-and-s3.md#what-each-process-must-reach)). (*) "
        "Not needed with `includeMarkers=false` or `watermark.strategy=none`.")
HORIZON = Option(
    "watermark.horizon", positive_duration_ms, DEFAULT_HORIZON_MS, owner=EVENT_TIME,
    shown_default="`1 day`",
    doc="Positive duration. How far ahead of the combined watermark each batch's carrier row "
        "runs (see [output columns](#output-columns)); must equal `with_watermark`'s "
        "`horizon`. A record whose event time is further ahead than this of the combined "
        "watermark is logged as a warning: it would push Spark's watermark past the combined "
        "one.")
ALIGNMENT_MAX_DRIFT = Option(
    "watermark.alignment.maxDrift", duration_ms, None, owner=EVENT_TIME, shown_default="off",
    doc="Duration. Watermark alignment (Flink's FLIP-182/217): a partition whose watermark is "
        "more than this ahead of the partitions still catching up (active, with records left "
        "to read) gets no records in the next batch, so the batch's budget goes to the "
        "partitions that hold the combined watermark back; the others are read up to a common "
        "event-time level ([how](../semantics.md#watermark-alignment-flip-182-flip-217)). "
        "The decisions are journaled per partition (`\"held\": true`, `\"capped\": true` in "
        "Spark's `offsets/N`) and listed by `flinkish inspect`.")
POLL_TIMEOUT = Option(
    "kafkaConsumer.pollTimeoutMs", whole_number(1, "a positive number of ms"), 120_000,
    owner=CLIENT,
    doc="Positive ms. Upper bound on each metadata, offset or fetch wait, and on a read task "
        "making no progress, with a warning every sixth of it; a connection refused by every "
        "bootstrap server fails after 4 s ([when the brokers do not answer]"
        "(../guides/recover-after-crash.md#when-the-brokers-do-not-answer)).")
MAX_READ_TASKS = Option(
    "maxReadTasks", _positive, None, owner=ADMISSION, shown_default="the driver's cores",
    doc="Positive integer. At most this many Spark read tasks per micro-batch; each reads the "
        "slices of several partitions, one after the other, with one consumer that fetches "
        "ahead (Flink's model: a few readers, each owning many splits). The default is the "
        "number of cores of the machine the driver-side reader runs on: PySpark runs that "
        "reader in a Python process without a SparkContext, so Spark's default parallelism "
        "cannot be asked for; the two agree under `local[*]`. On a cluster, set it to the "
        "executors' total cores (`spark.sparkContext.defaultParallelism`).")
MIN_PARTITIONS = Option(
    "minPartitions", _positive, None, owner=ADMISSION, shown_default="not set",
    doc="Positive integer, Spark Kafka's option of that name: when fewer partitions than this "
        "have records in a batch, large slices are split (as Spark's "
        "`KafkaOffsetRangeCalculator` splits them) so that about this many tasks read the "
        "batch; it also raises `maxReadTasks` to at least this value (both set: "
        "`minPartitions` must not exceed `maxReadTasks`). A split slice emits exactly the "
        "records and markers it emits whole: its last piece re-reads the earlier pieces' "
        "event times to place the slice's watermark, so splitting pays off for large slices "
        "only. Slices are never split with `watermark.strategy=punctuated`.")

SOURCE_OPTIONS: tuple[Option[Any], ...] = (
    BOOTSTRAP_SERVERS, KAFKA, SUBSCRIBE, SUBSCRIBE_PATTERN, ASSIGN, STARTING_OFFSETS,
    ENDING_OFFSETS, MAX_OFFSETS_PER_TRIGGER, STARTING_TIMESTAMP, STARTING_OFFSETS_BY_TIMESTAMP,
    STARTING_TIMESTAMP_STRATEGY, ENDING_TIMESTAMP, ENDING_OFFSETS_BY_TIMESTAMP,
    MIN_OFFSETS_PER_TRIGGER, MAX_TRIGGER_DELAY, GROUP_ID, GROUP_ID_PREFIX,
    COMMIT_OFFSETS_ON_CHECKPOINT, FAIL_ON_DATA_LOSS, INCLUDE_HEADERS, INCLUDE_MARKERS,
    EVENT_TIME_FIELD, EVENT_TIME_HEADER, EVENT_TIME_UNIT, EVENT_TIME_ON_ERROR,
    WATERMARK_STRATEGY, MAX_OUT_OF_ORDERNESS, PUNCTUATION_FIELD, PUNCTUATION_HEADER,
    IDLE_TIMEOUT, STATE_LOCATION, HORIZON, ALIGNMENT_MAX_DRIFT, POLL_TIMEOUT,
    MAX_READ_TASKS, MIN_PARTITIONS,
)
_SPELLED = {s: o.key for o in SOURCE_OPTIONS for s in o.spellings()}


def display(key: str) -> str:
    """The option's name as the documentation spells it."""
    return _SPELLED.get(key.lower(), key)


def reference() -> str:
    """The docs' source option reference (Markdown): a table for each group of options."""
    groups = dict.fromkeys(o.owner for o in SOURCE_OPTIONS)
    return "\n".join(
        f"## {group[0].upper()}{group[1:]}\n\n"
        + reference_table(o for o in SOURCE_OPTIONS if o.owner == group)
        for group in groups)


#: librdkafka settings every client of a query starts from (its ``kafka.*`` options win).
#: Re-bootstrapping (librdkafka's default) resets the reconnect backoff: a client of a cluster
#: that is down would connect every ~50 ms for as long as it lives.
CLIENT_DEFAULTS: dict[str, Any] = {
    "metadata.recovery.strategy": "none",
    "reconnect.backoff.max.ms": 1000,
}


@dataclass(frozen=True)
class TopicSelection:
    """Exactly one of Spark's three ways to name the input."""

    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()

    def matches(self, topic: str) -> bool:
        if self.subscribe:
            return topic in self.subscribe
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assign)


@dataclass(frozen=True)
class KafkaClient:
    """How the query's clients reach Kafka (the options of the group "kafka client")."""

    config: dict[str, str] = field(repr=False)  # librdkafka's names; may hold secrets
    security: ClientSecurity = field(default=NO_SECURITY, repr=False)
    poll_timeout_ms: int = 120_000
    # never in config, so read consumers never join or commit to it
    commit_group: str | None = None

    @property
    def read_committed(self) -> bool:
        """librdkafka's ``isolation.level``: read_committed unless set otherwise."""
        return self.config.get("isolation.level") != "read_uncommitted"

    @property
    def safe_config(self) -> dict[str, Any]:
        """The settings safe to log or put in an error: secrets (SASL, SSL, passwords) masked."""
        return redact_config(self.config)

    @property
    def secrets(self) -> list[str]:
        """The secret values among the client settings, to scrub from a client's messages."""
        return secret_values(self.config) + self.security.secrets()

    def client_config(self) -> dict[str, Any]:
        """The settings of a librdkafka client of this query, key stores and MSK IAM callback
        included, over :data:`CLIENT_DEFAULTS`."""
        return {**CLIENT_DEFAULTS, **client_config(self.config, self.security)}


@dataclass(frozen=True)
class OffsetBounds:
    """Where each partition starts and ends (the group "topics and offsets")."""

    starting: str | dict[str, dict[int, int]] = "latest"
    ending: str | dict[str, dict[int, int]] | None = None
    # startingTimestamp (one for all) or startingOffsetsByTimestamp (epoch ms), and the ending
    # pair: resolved to offsets when the query starts
    starting_times: int | dict[str, dict[int, int]] | None = None
    starting_times_latest: bool = False  # startingOffsetsByTimestampStrategy=latest
    ending_times: int | dict[str, dict[int, int]] | None = None
    fail_on_data_loss: bool = True

    @property
    def bounded(self) -> bool:
        """Whether every partition stops somewhere (endingOffsets or an ending time)."""
        return self.ending is not None or self.ending_times is not None


@dataclass(frozen=True)
class Admission:
    """How much a micro-batch reads and in how many tasks (the group "admission")."""

    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    max_read_tasks: int | None = None  # None: the driver's cores (read_plan.default_read_tasks)
    min_partitions: int | None = None  # Spark's Kafka minPartitions: split large slices


@dataclass(frozen=True)
class EventTime:
    """Where event time comes from and how watermarks follow it."""

    include_markers: bool = True
    field: str | None = None  # a dotted path into the JSON value
    header: str | None = None
    unit_ms: float = 1
    on_error: OnError = OnError.FAIL
    watermark: WatermarkKind = WatermarkKind.BOUNDED_OUT_OF_ORDERNESS
    max_out_of_orderness_ms: int = 0
    punctuation_field: str | None = None
    punctuation_header: str | None = None
    idle_timeout_ms: int | None = None
    horizon_ms: int = DEFAULT_HORIZON_MS
    alignment_max_drift_ms: int | None = None  # watermark alignment (off: None)

    @property
    def needs_state(self) -> bool:
        """Watermark generators carry state across batches; only then is a location needed."""
        return self.include_markers and self.watermark is not WatermarkKind.NONE


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed (:func:`parse_options`), in the groups their readers read."""

    kafka: KafkaClient
    topics: TopicSelection
    offsets: OffsetBounds = OffsetBounds()
    admission: Admission = Admission()
    event_time: EventTime = EventTime()
    include_headers: bool = False  # the schema's headers column
    state_location: str | None = None  # the generators' state directory


def _json_object(raw: str) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _offsets_json(key: str, raw: str, allow_earliest: bool) -> dict[str, dict[int, int]]:
    what = "earliest, latest" if allow_earliest else "latest"
    data = _json_object(raw)
    if data is None:
        raise OptionError(
            f"option {display(key)}: {raw!r} is not {what} or a JSON object like "
            '{"topic":{"0":23,"1":-2}} (-2 = earliest, -1 = latest)'
        )
    out: dict[str, dict[int, int]] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OptionError(
                f"option {display(key)}: topic {topic!r} must map partition numbers to offsets"
            )
        out[topic] = {}
        for part, offset in parts.items():
            ok_offset = isinstance(offset, int) and not isinstance(offset, bool)
            if not str(part).isdigit() or not ok_offset:
                raise OptionError(
                    f"option {display(key)}: {topic}/{part} -> {offset!r}: partitions are "
                    "numbers and offsets are integers (-2 = earliest, -1 = latest)"
                )
            if offset < EARLIEST or (offset == EARLIEST and not allow_earliest):
                raise OptionError(
                    f"option {display(key)}: offset {offset} for {topic}/{part} is not "
                    f"allowed; use an offset >= 0 or -1 (latest)"
                    + (" or -2 (earliest)" if allow_earliest else "")
                )
            out[topic][int(part)] = offset
    return out


def _times(given: Given, one: Option[str], each: Option[str],
           offsets: Option[Any]) -> int | dict[str, dict[int, int]] | None:
    """``one`` time for every partition or ``each`` per partition; at most one of them and of
    the ``offsets`` option."""
    named = [o.key for o in (one, each, offsets) if o in given]
    if len(named) > 1:
        raise OptionError(
            f"options {' and '.join(named)} conflict: give one (Spark's Kafka source would "
            f"silently prefer {named[0]})"
        )
    if one in given:
        text = given.value(one).strip()
        if not text.isdigit():
            raise OptionError(
                f"option {one.key}: {text!r} is not a timestamp in epoch milliseconds "
                "(e.g. 1700000000000)"
            )
        return int(text)
    if each in given:
        raw = given.value(each)
        data = _json_object(raw)
        ok = data is not None and all(
            isinstance(parts, dict) and all(
                str(p).isdigit() and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for p, v in parts.items())
            for parts in data.values())
        if data is None or not ok:
            raise OptionError(
                f"option {each.key}: {raw!r} is not a JSON object of epoch-millisecond "
                'timestamps >= 0 per partition, like {"topic":{"0":1700000000000}}'
            )
        return {t: {int(p): v for p, v in parts.items()} for t, parts in data.items()}
    return None


def _commit_group(given: Given, kafka: dict[str, str]) -> str | None:
    """The consumer group completed epochs' offsets are committed to (None: none), taken out of
    ``kafka``: the read consumers must not carry it. ``groupIdPrefix`` names one group per query,
    the same across restarts, as Spark's Kafka source names its groups."""
    group = kafka.pop("group.id", None)
    prefix = given.value(GROUP_ID_PREFIX) if GROUP_ID_PREFIX in given else None
    if group is not None and prefix is not None:
        raise OptionError(
            "options kafka.group.id and groupIdPrefix conflict: name the group, or let the "
            "source derive one from the prefix"
        )
    if prefix is not None:
        location = given.value(STATE_LOCATION)
        if not location:
            raise OptionError(
                "option groupIdPrefix needs checkpointing.location (the group is named after "
                "it, so that a restarted query commits to the same group); or give "
                "kafka.group.id"
            )
        digest = hashlib.sha256(location.encode()).hexdigest()[:12]
        group = f"{prefix.strip()}-{digest}"
    if not given.value(COMMIT_OFFSETS_ON_CHECKPOINT):
        return None
    if COMMIT_OFFSETS_ON_CHECKPOINT in given and group is None:
        raise OptionError(
            "option commitOffsetsOnCheckpoint needs a consumer group: give kafka.group.id or "
            "groupIdPrefix"
        )
    return group


def _topics(given: Given) -> TopicSelection:
    named = [o for o in (SUBSCRIBE, SUBSCRIBE_PATTERN, ASSIGN) if given.value(o)]
    if len(named) != 1:
        raise OptionError(
            "exactly one of the options subscribe, subscribePattern, assign must be set "
            f"(given: {', '.join(o.key for o in named) or 'none'})"
        )
    key = named[0]
    raw = given.value(key)
    if key is SUBSCRIBE:
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError("option subscribe: give a comma-separated list of topic names")
        return TopicSelection(subscribe=topics)
    if key is SUBSCRIBE_PATTERN:
        try:
            re.compile(raw)
        except re.error as exc:
            raise OptionError(f"option subscribePattern: {raw!r} is not a regex: {exc}") from exc
        return TopicSelection(pattern=raw)
    data = _json_object(raw)
    if data is None or not all(
        isinstance(v, list) and all(isinstance(p, int) and p >= 0 for p in v)
        for v in data.values()
    ):
        raise OptionError(
            f'option assign: {raw!r} is not a JSON object like {{"topicA":[0,1],"topicB":[2]}}'
        )
    return TopicSelection(assign=tuple(sorted((t, p) for t, ps in data.items() for p in ps)))


_LOG = logging.getLogger(__name__)

#: options of earlier versions, by lower-case key: why each is gone and what to do
_REMOVED = {
    "kafkaconsumer.fetch": (
        "option kafkaConsumer.fetch was removed in 0.3 with the experimental native fetch "
        "path: read tasks always read with librdkafka, which reads every codec and every "
        "security setting; drop the option"),
}


def _without_default_fetch(raw: Mapping[str, str]) -> Mapping[str, str]:
    """0.2's ``kafkaConsumer.fetch=librdkafka`` asks for what every read does: accepted, with
    a warning to drop it; any other value is refused as a removed option."""
    keys = [k for k in raw if k.lower() == "kafkaconsumer.fetch"
            and str(raw[k]).strip().lower() == "librdkafka"]
    if not keys:
        return raw
    _LOG.warning("%s=librdkafka is what every read does since flinkish 0.3 (the native fetch "
                 "path was removed); drop the option", keys[0])
    return {k: v for k, v in raw.items() if k not in keys}


def _unknown(key: str, declared: dict[str, Option[Any]]) -> OptionError:
    return OptionError(_REMOVED.get(key) or
                       f"unknown option {key!r} for format flinkish{did_you_mean(key, declared)}")


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    """Validate everything the source will ever read from its options.

    Args:
        raw: the options as the query gave them (keys in any case).

    Returns:
        The options, in the groups their readers read.

    Raises:
        OptionError: naming the first option that is unknown, malformed or in conflict with
            another, and what to write instead.
    """
    given = match(_without_default_fetch(raw), SOURCE_OPTIONS, _unknown)
    kafka = _kafka_client(given)
    topics = _topics(given)
    parsed = SourceOptions(
        kafka=kafka,
        topics=topics,
        offsets=_offset_bounds(given, topics),
        admission=_admission(given),
        event_time=_event_time(given),
        include_headers=given.value(INCLUDE_HEADERS),
        state_location=given.value(STATE_LOCATION),
    )
    check_client_security(kafka.security)
    if parsed.event_time.needs_state and not parsed.state_location:
        raise OptionError(
            "option checkpointing.location is required: per-partition watermarks carry the "
            "max event time across micro-batches, kept in a directory (local path or a "
            "pyarrow.fs URI such as s3://bucket/path) that the driver and the executors both "
            "reach — e.g. a sub-directory of the query's checkpointLocation. (Not needed with "
            "includeMarkers=false or watermark.strategy=none.)"
        )
    if parsed.state_location:
        problem = local_location_problem(
            "checkpointing.location", parsed.state_location, os.environ.get(MASTER_ENV),
            "read tasks on the executors write the watermark state there and the driver reads "
            "it back")
        if problem:
            raise OptionError(problem)
    return parsed


def _kafka_client(given: Given) -> KafkaClient:
    collected: dict[str, str] = given.value(KAFKA)
    kafka = dict(collected)
    for option in (BOOTSTRAP_SERVERS, GROUP_ID):  # declared apart for the docs and the errors
        if option in given:
            kafka[option.key[len("kafka."):]] = given.texts[option.key]
    if not kafka.get("bootstrap.servers"):
        raise OptionError(
            "option kafka.bootstrap.servers is required, e.g. 'host1:9092,host2:9092'"
        )
    for key, why in _FORBIDDEN_KAFKA.items():
        if key in kafka:
            raise OptionError(f"option kafka.{key} is not supported: {why}")
    kafka, security = translate(kafka)
    commit_group = _commit_group(given, kafka)
    return KafkaClient(kafka, security, given.value(POLL_TIMEOUT), commit_group)


def _offset_bounds(given: Given, topics: TopicSelection) -> OffsetBounds:
    starting_text = given.value(STARTING_OFFSETS).strip()
    starting: str | dict[str, dict[int, int]] = starting_text.lower()
    if starting not in ("earliest", "latest"):
        starting = _offsets_json("startingoffsets", starting_text, allow_earliest=True)
    ending: str | dict[str, dict[int, int]] | None = None
    if ENDING_OFFSETS in given:
        ending_text = given.texts[ENDING_OFFSETS.key].strip()
        if ending_text.lower() == "earliest":
            raise OptionError("option endingOffsets: earliest is not allowed; use latest or JSON")
        ending = "latest" if ending_text.lower() == "latest" else _offsets_json(
            "endingoffsets", ending_text, allow_earliest=False
        )
    starting_times = _times(given, STARTING_TIMESTAMP, STARTING_OFFSETS_BY_TIMESTAMP,
                            STARTING_OFFSETS)
    ending_times = _times(given, ENDING_TIMESTAMP, ENDING_OFFSETS_BY_TIMESTAMP, ENDING_OFFSETS)
    if topics.pattern is not None:
        checked: tuple[tuple[Option[Any], object], ...] = (
            (STARTING_OFFSETS, starting), (ENDING_OFFSETS, ending),
            (STARTING_OFFSETS_BY_TIMESTAMP, starting_times),
            (ENDING_OFFSETS_BY_TIMESTAMP, ending_times))
        for option, value in checked:
            if isinstance(value, dict):
                raise OptionError(
                    f"option {option.key}: per-partition offsets cannot be combined with "
                    "subscribePattern (the partitions are not known in advance); use "
                    "subscribe or assign"
                )
    return OffsetBounds(starting, ending, starting_times,
                        given.value(STARTING_TIMESTAMP_STRATEGY), ending_times,
                        given.value(FAIL_ON_DATA_LOSS))


def _admission(given: Given) -> Admission:
    max_per_trigger = given.value(MAX_OFFSETS_PER_TRIGGER)
    min_per_trigger = given.value(MIN_OFFSETS_PER_TRIGGER)
    if max_per_trigger is not None and min_per_trigger is not None and (
            min_per_trigger > max_per_trigger):
        raise OptionError(
            f"options minOffsetsPerTrigger ({min_per_trigger}) and maxOffsetsPerTrigger "
            f"({max_per_trigger}) conflict: a batch cannot hold more than the maximum"
        )
    if MAX_TRIGGER_DELAY in given and min_per_trigger is None:
        raise OptionError(
            "option maxTriggerDelay only applies with minOffsetsPerTrigger (how long a "
            "batch may wait for that many records)"
        )
    max_tasks = given.value(MAX_READ_TASKS)
    min_partitions = given.value(MIN_PARTITIONS)
    if max_tasks is not None and min_partitions is not None and min_partitions > max_tasks:
        raise OptionError(
            f"options minPartitions ({min_partitions}) and maxReadTasks ({max_tasks}) "
            "conflict: minPartitions asks for more read tasks than maxReadTasks allows"
        )
    return Admission(max_per_trigger, min_per_trigger, given.value(MAX_TRIGGER_DELAY),
                     max_tasks, min_partitions)


def _event_time(given: Given) -> EventTime:
    et_field = given.value(EVENT_TIME_FIELD)
    et_header = given.value(EVENT_TIME_HEADER)
    if et_field and et_header:
        raise OptionError(
            "options eventTime.field and eventTime.header conflict: name one place to take "
            "event time from (neither = the Kafka record timestamp)"
        )
    if EVENT_TIME_UNIT in given and not (et_field or et_header):
        raise OptionError(
            "option eventTime.unit only applies with eventTime.field or eventTime.header"
        )
    strategy = given.value(WATERMARK_STRATEGY)
    if MAX_OUT_OF_ORDERNESS in given and strategy is not WatermarkKind.BOUNDED_OUT_OF_ORDERNESS:
        raise OptionError(
            "option watermark.maxOutOfOrderness only applies to watermark.strategy "
            f"boundedOutOfOrderness (the strategy is {strategy.value})"
        )
    p_field = given.value(PUNCTUATION_FIELD)
    p_header = given.value(PUNCTUATION_HEADER)
    if strategy is WatermarkKind.PUNCTUATED:
        if bool(p_field) == bool(p_header):
            raise OptionError(
                "watermark.strategy punctuated needs exactly one of the options "
                "watermark.punctuation.field or watermark.punctuation.header (the flag that "
                "marks a record as carrying a watermark)"
            )
    elif p_field or p_header:
        raise OptionError(
            "options watermark.punctuation.* only apply to watermark.strategy punctuated"
        )
    include_markers = given.value(INCLUDE_MARKERS)
    drift = given.value(ALIGNMENT_MAX_DRIFT)
    if drift is not None and (strategy is WatermarkKind.NONE or not include_markers):
        raise OptionError(
            "option watermark.alignment.maxDrift needs per-partition watermarks: it does "
            "not apply with watermark.strategy=none or includeMarkers=false"
        )
    return EventTime(
        include_markers=include_markers, field=et_field, header=et_header,
        unit_ms=given.value(EVENT_TIME_UNIT), on_error=given.value(EVENT_TIME_ON_ERROR),
        watermark=strategy, max_out_of_orderness_ms=given.value(MAX_OUT_OF_ORDERNESS),
        punctuation_field=p_field, punctuation_header=p_header,
        idle_timeout_ms=given.value(IDLE_TIMEOUT), horizon_ms=given.value(HORIZON),
        alignment_max_drift_ms=drift)
