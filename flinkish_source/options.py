"""Parse and validate the source's options once, at query start, so every mistake is reported
with the option's name and what it accepts instead of surfacing later inside a Spark task.

Option names follow Spark's own Kafka source (``kafka.*``, ``subscribe``, ``startingOffsets``,
``maxOffsetsPerTrigger`` …) so that switching is a change of format; the Flink-specific ones
(``watermark.*``, ``idleTimeout``, ``eventTime.*``) are named after Flink's ``WatermarkStrategy``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

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


class FetchClient(Enum):
    """How read tasks fetch records (option ``kafkaConsumer.fetch``)."""

    LIBRDKAFKA = "librdkafka"  # confluent-kafka's consumer, one Message per record (default)
    # experimental: Fetch requests decoded into Arrow (flinkish_source.kafka.native), handing
    # whatever it cannot read to librdkafka
    NATIVE = "native"


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

_KNOWN = {
    "kafka.bootstrap.servers", "subscribe", "subscribepattern", "assign", "startingoffsets",
    "endingoffsets", "maxoffsetspertrigger", "failondataloss", "includeheaders",
    "includemarkers", "eventtime.field", "eventtime.header", "eventtime.unit",
    "eventtime.onerror", "watermark.strategy", "watermark.maxoutoforderness",
    "watermark.punctuation.field", "watermark.punctuation.header", "idletimeout",
    "checkpointing.location", "kafkaconsumer.polltimeoutms", "watermark.horizon",
    "watermark.alignment.maxdrift",
    "maxreadtasks", "minpartitions", "kafkaconsumer.fetch",
    "minoffsetspertrigger", "maxtriggerdelay", "groupidprefix", "commitoffsetsoncheckpoint",
    "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy",
    "endingtimestamp", "endingoffsetsbytimestamp",
}
_DISPLAY = {
    "subscribepattern": "subscribePattern", "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets", "maxoffsetspertrigger": "maxOffsetsPerTrigger",
    "failondataloss": "failOnDataLoss", "includeheaders": "includeHeaders",
    "includemarkers": "includeMarkers", "eventtime.field": "eventTime.field",
    "eventtime.header": "eventTime.header", "eventtime.unit": "eventTime.unit",
    "eventtime.onerror": "eventTime.onError", "watermark.strategy": "watermark.strategy",
    "watermark.maxoutoforderness": "watermark.maxOutOfOrderness",
    "watermark.punctuation.field": "watermark.punctuation.field",
    "watermark.punctuation.header": "watermark.punctuation.header",
    "idletimeout": "idleTimeout", "checkpointing.location": "checkpointing.location",
    "kafkaconsumer.polltimeoutms": "kafkaConsumer.pollTimeoutMs",
    "watermark.horizon": "watermark.horizon",
    "watermark.alignment.maxdrift": "watermark.alignment.maxDrift",
    "maxreadtasks": "maxReadTasks", "minpartitions": "minPartitions",
    "kafkaconsumer.fetch": "kafkaConsumer.fetch",
    "minoffsetspertrigger": "minOffsetsPerTrigger", "maxtriggerdelay": "maxTriggerDelay",
    "groupidprefix": "groupIdPrefix", "commitoffsetsoncheckpoint": "commitOffsetsOnCheckpoint",
    "startingtimestamp": "startingTimestamp",
    "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
    "startingoffsetsbytimestampstrategy": "startingOffsetsByTimestampStrategy",
    "endingtimestamp": "endingTimestamp", "endingoffsetsbytimestamp": "endingOffsetsByTimestamp",
}

#: Spark's Kafka source waits at most this long for minOffsetsPerTrigger (maxTriggerDelay).
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000


def display(key: str) -> str:
    """The option's name as the documentation spells it."""
    return _DISPLAY.get(key, key)


#: librdkafka settings every client of a query starts from (its ``kafka.*`` options win). When
#: no broker answers, librdkafka 2.16 starts again from ``bootstrap.servers`` (its default
#: ``metadata.recovery.strategy``, ``rebootstrap``) and so resets its reconnect backoff: a client
#: of a cluster that is down, idle in the consumer pool included, connects every ~50 ms for as
#: long as it lives (~16 connections a second, measured), and a process that later listens on
#: one of those ports gets them. Without re-bootstrapping the backoff grows as in Kafka's Java
#: client, whose reconnect backoff is capped at 1 s (``reconnect.backoff.max.ms``).
CLIENT_DEFAULTS: dict[str, Any] = {
    "metadata.recovery.strategy": "none",
    "reconnect.backoff.max.ms": 1000,
}


def redact_kafka_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy safe to log or put in an error: secrets (SASL, SSL, passwords) masked (the
    rule is :func:`flinkish_core.secrets.redact_config`, shared with the sink)."""
    return redact_config(config)


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
class SourceOptions:
    kafka_config: dict[str, str] = field(repr=False)  # librdkafka's names; may hold secrets
    topics: TopicSelection
    starting: str | dict[str, dict[int, int]] = "latest"
    ending: str | dict[str, dict[int, int]] | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    include_markers: bool = True
    event_time_field: str | None = None
    event_time_header: str | None = None
    event_time_unit_ms: float = 1
    event_time_on_error: OnError = OnError.FAIL
    watermark: WatermarkKind = WatermarkKind.BOUNDED_OUT_OF_ORDERNESS
    max_out_of_orderness_ms: int = 0
    punctuation_field: str | None = None
    punctuation_header: str | None = None
    idle_timeout_ms: int | None = None
    state_location: str | None = None
    poll_timeout_ms: int = 120_000
    horizon_ms: int = DEFAULT_HORIZON_MS
    alignment_max_drift_ms: int | None = None  # watermark alignment (off: None)
    # read tasks per batch at most; None: the driver's cores (see read_plan.default_read_tasks)
    max_read_tasks: int | None = None
    min_partitions: int | None = None  # Spark's Kafka minPartitions: split large slices
    fetch_client: FetchClient = FetchClient.LIBRDKAFKA
    # Spark's trigger pacing: no batch before this many new records, unless the delay passed
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    # the consumer group each completed epoch's end offsets are committed to (monitoring only;
    # None: no commits); never in kafka_config, so read consumers never join or commit to it
    commit_group: str | None = None
    # Spark's startingTimestamp / startingOffsetsByTimestamp (one time for every partition, or
    # per partition; epoch ms), and the ending pair: resolved to offsets when the query starts
    starting_times: int | dict[str, dict[int, int]] | None = None
    # startingOffsetsByTimestampStrategy: no record at or after the time fails ("error") or
    # starts at the partition's end ("latest")
    starting_times_latest: bool = False
    ending_times: int | dict[str, dict[int, int]] | None = None
    # key stores and the MSK IAM callback, added where each client is built (client_config)
    client_security: ClientSecurity = field(default=NO_SECURITY, repr=False)

    @property
    def bounded(self) -> bool:
        """Whether every partition stops somewhere (endingOffsets or an ending time)."""
        return self.ending is not None or self.ending_times is not None

    @property
    def read_committed(self) -> bool:
        """Reads stop at the last stable offset and skip aborted transactions (librdkafka's
        ``isolation.level``, read_committed unless set to read_uncommitted)."""
        return self.kafka_config.get("isolation.level") != "read_uncommitted"

    @property
    def needs_state(self) -> bool:
        """Watermark generators carry state across batches; only then is a location needed."""
        return self.include_markers and self.watermark is not WatermarkKind.NONE

    @property
    def safe_kafka_config(self) -> dict[str, Any]:
        return redact_kafka_config(self.kafka_config)

    @property
    def kafka_secrets(self) -> list[str]:
        """The secret values among the client settings, to scrub from a client's messages."""
        return secret_values(self.kafka_config) + self.client_security.secrets()

    def client_config(self) -> dict[str, Any]:
        """The settings of a librdkafka client of this query: ``kafka_config`` with the key
        stores' PEM files and the MSK IAM token callback (see
        :func:`flinkish_kafka.java_security.client_config`), over :data:`CLIENT_DEFAULTS`."""
        return {**CLIENT_DEFAULTS, **client_config(self.kafka_config, self.client_security)}


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {display(key)}: {raw!r} is not a boolean; use true or false")
    return value == "true"


def _offsets_json(key: str, raw: str, allow_earliest: bool) -> dict[str, dict[int, int]]:
    what = "earliest, latest" if allow_earliest else "latest"
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
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


def _times(options: Mapping[str, str], one: str, each: str,
           offsets: str) -> int | dict[str, dict[int, int]] | None:
    """``startingTimestamp`` (one time for every partition) or ``startingOffsetsByTimestamp``
    (per partition), or the ending pair; at most one of them and of the offsets option."""
    given = [k for k in (one, each, offsets) if k in options]
    if len(given) > 1:
        raise OptionError(
            f"options {' and '.join(display(k) for k in given)} conflict: give one (Spark's "
            f"Kafka source would silently prefer {display(given[0])})"
        )
    if one in options:
        text = options[one].strip()
        if not text.isdigit():
            raise OptionError(
                f"option {display(one)}: {text!r} is not a timestamp in epoch milliseconds "
                "(e.g. 1700000000000)"
            )
        return int(text)
    if each in options:
        raw = options[each]
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            data = None
        ok = isinstance(data, dict) and all(
            isinstance(parts, dict) and all(
                str(p).isdigit() and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for p, v in parts.items())
            for parts in data.values())
        if not ok:
            raise OptionError(
                f"option {display(each)}: {raw!r} is not a JSON object of epoch-millisecond "
                'timestamps >= 0 per partition, like {"topic":{"0":1700000000000}}'
            )
        return {t: {int(p): v for p, v in parts.items()} for t, parts in data.items()}
    return None


def _positive(options: Mapping[str, str], key: str) -> int | None:
    """A positive whole number option, or None when it is not given."""
    if key not in options:
        return None
    given = options[key].strip()
    if not given.isdigit() or int(given) <= 0:
        raise OptionError(f"option {display(key)}: {given!r} is not a positive whole number")
    return int(given)


def _commit_group(options: Mapping[str, str], kafka: dict[str, str]) -> str | None:
    """The consumer group completed epochs' offsets are committed to: ``kafka.group.id``, or
    ``groupIdPrefix`` plus a digest of ``checkpointing.location`` (one group per query, the same
    across restarts, as Spark's Kafka source names its groups from the query's checkpoint);
    None when the query names no group or sets ``commitOffsetsOnCheckpoint=false``. Takes
    ``group.id`` out of ``kafka``: the read consumers must not carry it."""
    group = kafka.pop("group.id", None)
    prefix = options.get("groupidprefix")
    if group is not None and prefix is not None:
        raise OptionError(
            "options kafka.group.id and groupIdPrefix conflict: name the group, or let the "
            "source derive one from the prefix"
        )
    if prefix is not None:
        location = options.get("checkpointing.location")
        if not location:
            raise OptionError(
                "option groupIdPrefix needs checkpointing.location (the group is named after "
                "it, so that a restarted query commits to the same group); or give "
                "kafka.group.id"
            )
        digest = hashlib.sha256(location.encode()).hexdigest()[:12]
        group = f"{prefix.strip()}-{digest}"
    if not _bool(options, "commitoffsetsoncheckpoint", True):
        return None
    if "commitoffsetsoncheckpoint" in options and group is None:
        raise OptionError(
            "option commitOffsetsOnCheckpoint needs a consumer group: give kafka.group.id or "
            "groupIdPrefix"
        )
    return group


def _topics(options: Mapping[str, str]) -> TopicSelection:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if options.get(k)]
    if len(given) != 1:
        named = ", ".join(display(k) for k in given) or "none"
        raise OptionError(
            "exactly one of the options subscribe, subscribePattern, assign must be set "
            f"(given: {named})"
        )
    key = given[0]
    raw = options[key]
    if key == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError("option subscribe: give a comma-separated list of topic names")
        return TopicSelection(subscribe=topics)
    if key == "subscribepattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise OptionError(f"option subscribePattern: {raw!r} is not a regex: {exc}") from exc
        return TopicSelection(pattern=raw)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not all(
        isinstance(v, list) and all(isinstance(p, int) and p >= 0 for p in v)
        for v in data.values()
    ):
        raise OptionError(
            f'option assign: {raw!r} is not a JSON object like {{"topicA":[0,1],"topicB":[2]}}'
        )
    return TopicSelection(assign=tuple(sorted((t, p) for t, ps in data.items() for p in ps)))


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    """Validate everything the source will ever read from its options."""
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = [k for k in options if k not in _KNOWN and not k.startswith("kafka.")]
    if unknown:
        import difflib  # here: ~5 ms to import, for every query's reader process otherwise

        key = unknown[0]
        close = difflib.get_close_matches(key, list(_KNOWN), n=1)
        hint = f"; did you mean {display(close[0])}?" if close else ""
        raise OptionError(f"unknown option {key!r} for format flinkish{hint}")

    kafka = {k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}
    if not kafka.get("bootstrap.servers"):
        raise OptionError(
            "option kafka.bootstrap.servers is required, e.g. 'host1:9092,host2:9092'"
        )
    for key, why in _FORBIDDEN_KAFKA.items():
        if key in kafka:
            raise OptionError(f"option kafka.{key} is not supported: {why}")
    kafka, security = translate(kafka)

    topics = _topics(options)

    # the keywords, like every other keyword value, in any case (Earliest, LATEST)
    starting_text = options.get("startingoffsets", "latest").strip()
    starting: str | dict[str, dict[int, int]] = starting_text.lower()
    if starting not in ("earliest", "latest"):
        starting = _offsets_json("startingoffsets", starting_text, allow_earliest=True)
    ending: str | dict[str, dict[int, int]] | None = None
    ending_text = options.get("endingoffsets")
    if ending_text is not None:
        ending_text = ending_text.strip()
        if ending_text.lower() == "earliest":
            raise OptionError("option endingOffsets: earliest is not allowed; use latest or JSON")
        ending = "latest" if ending_text.lower() == "latest" else _offsets_json(
            "endingoffsets", ending_text, allow_earliest=False
        )
    starting_times = _times(options, "startingtimestamp", "startingoffsetsbytimestamp",
                            "startingoffsets")
    ending_times = _times(options, "endingtimestamp", "endingoffsetsbytimestamp",
                          "endingoffsets")
    strategy_text = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy_text not in ("error", "latest"):
        raise OptionError(
            f"option startingOffsetsByTimestampStrategy: {strategy_text!r} is not error (fail "
            "when a partition has no record at or after the time) or latest (start at its end)"
        )
    if topics.pattern is not None:
        for key, value in (("startingoffsets", starting), ("endingoffsets", ending),
                           ("startingoffsetsbytimestamp", starting_times),
                           ("endingoffsetsbytimestamp", ending_times)):
            if isinstance(value, dict):
                raise OptionError(
                    f"option {display(key)}: per-partition offsets cannot be combined with "
                    "subscribePattern (the partitions are not known in advance); use "
                    "subscribe or assign"
                )

    max_per_trigger, min_per_trigger = (
        _positive(options, key) for key in ("maxoffsetspertrigger", "minoffsetspertrigger"))
    if max_per_trigger is not None and min_per_trigger is not None and (
            min_per_trigger > max_per_trigger):
        raise OptionError(
            f"options minOffsetsPerTrigger ({min_per_trigger}) and maxOffsetsPerTrigger "
            f"({max_per_trigger}) conflict: a batch cannot hold more than the maximum"
        )
    max_delay = DEFAULT_MAX_TRIGGER_DELAY_MS
    if "maxtriggerdelay" in options:
        if min_per_trigger is None:
            raise OptionError(
                "option maxTriggerDelay only applies with minOffsetsPerTrigger (how long a "
                "batch may wait for that many records)"
            )
        max_delay = parse_duration_ms("maxTriggerDelay", options["maxtriggerdelay"])
        if max_delay <= 0:
            raise OptionError("option maxTriggerDelay must be a positive duration")

    commit_group = _commit_group(options, kafka)

    et_field = options.get("eventtime.field") or None
    et_header = options.get("eventtime.header") or None
    if et_field and et_header:
        raise OptionError(
            "options eventTime.field and eventTime.header conflict: name one place to take "
            "event time from (neither = the Kafka record timestamp)"
        )
    unit_name = options.get("eventtime.unit", "milliseconds").strip().lower()
    if unit_name not in _EVENT_TIME_UNITS:
        raise OptionError(
            f"option eventTime.unit: {unit_name!r} is not one of "
            + ", ".join(_EVENT_TIME_UNITS)
        )
    if "eventtime.unit" in options and not (et_field or et_header):
        raise OptionError(
            "option eventTime.unit only applies with eventTime.field or eventTime.header"
        )
    on_error_raw = options.get("eventtime.onerror", "fail").strip().lower()
    try:
        on_error = OnError(on_error_raw)
    except ValueError:
        raise OptionError(
            f"option eventTime.onError: {on_error_raw!r} is not fail or skip"
        ) from None

    strategy_raw = options.get("watermark.strategy", "boundedOutOfOrderness").strip()
    by_lower = {k.value.lower(): k for k in WatermarkKind}
    if strategy_raw.lower() not in by_lower:
        raise OptionError(
            f"option watermark.strategy: {strategy_raw!r} is not one of "
            + ", ".join(k.value for k in WatermarkKind)
        )
    strategy = by_lower[strategy_raw.lower()]
    bound = 0
    if "watermark.maxoutoforderness" in options:
        if strategy is not WatermarkKind.BOUNDED_OUT_OF_ORDERNESS:
            raise OptionError(
                "option watermark.maxOutOfOrderness only applies to watermark.strategy "
                f"boundedOutOfOrderness (the strategy is {strategy.value})"
            )
        bound = parse_duration_ms("watermark.maxOutOfOrderness",
                                  options["watermark.maxoutoforderness"])
    p_field = options.get("watermark.punctuation.field") or None
    p_header = options.get("watermark.punctuation.header") or None
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

    horizon = DEFAULT_HORIZON_MS
    if "watermark.horizon" in options:
        horizon = parse_duration_ms("watermark.horizon", options["watermark.horizon"])
        if horizon <= 0:
            raise OptionError("option watermark.horizon must be a positive duration")

    drift = None
    if "watermark.alignment.maxdrift" in options:
        drift = parse_duration_ms("watermark.alignment.maxDrift",
                                  options["watermark.alignment.maxdrift"])
        if drift < 0:
            raise OptionError("option watermark.alignment.maxDrift must not be negative")
        if strategy is WatermarkKind.NONE or not _bool(options, "includemarkers", True):
            raise OptionError(
                "option watermark.alignment.maxDrift needs per-partition watermarks: it does "
                "not apply with watermark.strategy=none or includeMarkers=false"
            )

    idle = None
    if "idletimeout" in options:
        idle = parse_duration_ms("idleTimeout", options["idletimeout"])
        if idle <= 0:
            raise OptionError("option idleTimeout must be a positive duration")

    poll_text = options.get("kafkaconsumer.polltimeoutms", "120000").strip()
    if not poll_text.isdigit() or int(poll_text) <= 0:
        raise OptionError(
            f"option kafkaConsumer.pollTimeoutMs: {poll_text!r} is not a positive number of ms"
        )

    fetch_text = options.get("kafkaconsumer.fetch", FetchClient.LIBRDKAFKA.value)
    fetch_text = fetch_text.strip().lower()
    if fetch_text not in {c.value for c in FetchClient}:
        raise OptionError(
            f"option kafkaConsumer.fetch: {fetch_text!r} is not one of librdkafka (the "
            "default: every record through confluent-kafka's consumer) or native "
            "(experimental: Fetch requests decoded into Arrow, librdkafka where that cannot "
            "read)"
        )

    max_tasks, min_partitions = (
        _positive(options, key) for key in ("maxreadtasks", "minpartitions"))
    if max_tasks is not None and min_partitions is not None and min_partitions > max_tasks:
        raise OptionError(
            f"options minPartitions ({min_partitions}) and maxReadTasks ({max_tasks}) "
            "conflict: minPartitions asks for more read tasks than maxReadTasks allows"
        )

    parsed = SourceOptions(
        kafka_config=kafka,
        topics=topics,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_per_trigger,
        fail_on_data_loss=_bool(options, "failondataloss", True),
        include_headers=_bool(options, "includeheaders", False),
        include_markers=_bool(options, "includemarkers", True),
        event_time_field=et_field,
        event_time_header=et_header,
        event_time_unit_ms=_EVENT_TIME_UNITS[unit_name],
        event_time_on_error=on_error,
        watermark=strategy,
        max_out_of_orderness_ms=bound,
        punctuation_field=p_field,
        punctuation_header=p_header,
        idle_timeout_ms=idle,
        state_location=options.get("checkpointing.location") or None,
        poll_timeout_ms=int(poll_text),
        horizon_ms=horizon,
        alignment_max_drift_ms=drift,
        max_read_tasks=max_tasks,
        min_partitions=min_partitions,
        fetch_client=FetchClient(fetch_text),
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=max_delay,
        commit_group=commit_group,
        starting_times=starting_times,
        starting_times_latest=strategy_text == "latest",
        ending_times=ending_times,
        client_security=security,
    )
    check_client_security(security)
    if parsed.needs_state and not parsed.state_location:
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
