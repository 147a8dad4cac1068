"""Tests for flinkish_source.options: every option is validated at query start, and every
mistake names the option and what it accepts (without leaking Kafka secrets)."""

from __future__ import annotations

import operator
from typing import Any

import pytest

from flinkish_core.locations import MASTER_ENV
from flinkish_source.options import (
    EARLIEST,
    LATEST,
    KafkaClient,
    OnError,
    OptionError,
    SourceOptions,
    TopicSelection,
    WatermarkKind,
    parse_duration_ms,
    parse_options,
)

BASE = {
    "kafka.bootstrap.servers": "broker1:9092,broker2:9092",
    "subscribe": "events",
    "checkpointing.location": "/tmp/flinkish-state",
}


def parse(**changes: Any) -> SourceOptions:
    """BASE with ``changes`` applied (a value of None removes the key)."""
    raw = dict(BASE)
    for key, value in changes.items():
        raw.pop(key, None)
        if value is not None:
            raw[key] = value
    return parse_options(raw)


def parse_raw(raw: dict[str, str]) -> SourceOptions:
    return parse_options(raw)


def error(raw: dict[str, str]) -> str:
    with pytest.raises(OptionError) as info:
        parse_options(raw)
    return str(info.value)


def error_with(**changes: Any) -> str:
    raw = dict(BASE)
    for key, value in changes.items():
        raw.pop(key, None)
        if value is not None:
            raw[key] = value
    return error(raw)


# ---------------------------------------------------------------- defaults


def test_defaults() -> None:
    o = parse()
    assert o.kafka.config == {"bootstrap.servers": "broker1:9092,broker2:9092"}
    assert o.topics == TopicSelection(subscribe=("events",))
    assert o.offsets.starting == "latest"
    assert o.offsets.ending is None
    assert o.admission.max_offsets_per_trigger is None
    assert o.offsets.fail_on_data_loss is True
    assert o.include_headers is False
    assert o.event_time.include_markers is True
    assert o.event_time.field is None
    assert o.event_time.header is None
    assert o.event_time.unit_ms == 1
    assert o.event_time.on_error is OnError.FAIL
    assert o.event_time.watermark is WatermarkKind.BOUNDED_OUT_OF_ORDERNESS
    assert o.event_time.max_out_of_orderness_ms == 0
    assert o.event_time.punctuation_field is None
    assert o.event_time.punctuation_header is None
    assert o.event_time.idle_timeout_ms is None
    assert o.state_location == "/tmp/flinkish-state"
    assert o.kafka.poll_timeout_ms == 120_000
    assert o.event_time.needs_state is True


def test_bootstrap_servers_required() -> None:
    message = error_with(**{"kafka.bootstrap.servers": None})
    assert "kafka.bootstrap.servers" in message
    assert "required" in message


# ---------------------------------------------------------------- keys are case-insensitive


def test_keys_are_case_insensitive() -> None:
    o = parse_raw(
        {
            "Kafka.Bootstrap.Servers": "b:1",
            "SubscribePattern": "ev.*",
            "STARTINGOFFSETS": "earliest",
            "maxOffsetsPerTrigger": "7",
            "FailOnDataLoss": "false",
            "includeHeaders": "true",
            "eventTime.Field": "a.b",
            "eventTime.onError": "skip",
            "Watermark.Strategy": "boundedOutOfOrderness",
            "watermark.maxOutOfOrderness": "2 seconds",
            "IdleTimeout": "1 minute",
            "Checkpointing.Location": "/x",
        }
    )
    assert o.kafka.config == {"bootstrap.servers": "b:1"}
    assert o.topics == TopicSelection(pattern="ev.*")
    assert o.offsets.starting == "earliest"
    assert o.admission.max_offsets_per_trigger == 7
    assert o.offsets.fail_on_data_loss is False
    assert o.include_headers is True
    assert o.event_time.field == "a.b"
    assert o.event_time.on_error is OnError.SKIP
    assert o.event_time.max_out_of_orderness_ms == 2000
    assert o.event_time.idle_timeout_ms == 60_000
    assert o.state_location == "/x"


def test_lower_cased_keys_as_spark_passes_them() -> None:
    o = parse_raw(
        {
            "kafka.bootstrap.servers": "b:1",
            "assign": '{"t":[1,0]}',
            "maxoffsetspertrigger": "3",
            "watermark.strategy": "monotonous",
            "includemarkers": "false",
        }
    )
    assert o.topics == TopicSelection(assign=(("t", 0), ("t", 1)))
    assert o.admission.max_offsets_per_trigger == 3
    assert o.event_time.watermark is WatermarkKind.MONOTONOUS
    assert o.event_time.include_markers is False
    assert o.event_time.needs_state is False
    assert o.state_location is None


# ---------------------------------------------------------------- unknown / forbidden


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("subscibe", "subscribe"),
        ("startingOffset", "startingOffsets"),
        ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
        ("watermark.maxOutOfOrdernes", "watermark.maxOutOfOrderness"),
        ("idleTimout", "idleTimeout"),
        ("eventTime.fields", "eventTime.field"),
    ],
)
def test_unknown_option_is_rejected_with_a_suggestion(key: str, suggestion: str) -> None:
    message = error({**BASE, key: "x"})
    assert f"unknown option {key.lower()!r}" in message
    assert f"did you mean {suggestion}?" in message


def test_unknown_option_without_close_match_has_no_suggestion() -> None:
    message = error({**BASE, "zzzzqqq": "1"})
    assert "unknown option 'zzzzqqq'" in message
    assert "did you mean" not in message


def test_the_removed_fetch_option_says_it_was_removed_and_what_reads_instead() -> None:
    message = error({**BASE, "kafkaConsumer.Fetch": "native"})
    assert "kafkaConsumer.fetch was removed in 0.3" in message
    assert "librdkafka, which reads every codec and every security setting" in message
    assert "drop the option" in message


def test_the_fetch_option_naming_librdkafka_is_accepted_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="flinkish_source.options"):
        options = parse_options({**BASE, "kafkaConsumer.fetch": " LibRdKafka"})
    assert options == parse_options(BASE)
    assert "kafkaConsumer.fetch=librdkafka is what every read does" in caplog.text


@pytest.mark.parametrize(
    "key", ["enable.auto.commit", "auto.offset.reset", "enable.partition.eof"]
)
def test_forbidden_kafka_options(key: str) -> None:
    message = error({**BASE, f"kafka.{key}": "x"})
    assert message.startswith(f"option kafka.{key} is not supported: ")


def test_forbidden_kafka_option_reasons() -> None:
    assert "startingOffsets" in error({**BASE, "kafka.auto.offset.reset": "earliest"})
    assert "checkpoint" in error({**BASE, "kafka.enable.auto.commit": "true"})


def test_other_kafka_options_pass_through_without_prefix() -> None:
    o = parse(**{"kafka.security.protocol": "SASL_SSL", "kafka.fetch.min.bytes": "1"})
    assert o.kafka.config == {
        "bootstrap.servers": "broker1:9092,broker2:9092",
        "security.protocol": "SASL_SSL",
        "fetch.min.bytes": "1",
    }


# ---------------------------------------------------------------- topic selection


def test_subscribe_list() -> None:
    o = parse(subscribe=" a, b ,,c ")
    assert o.topics == TopicSelection(subscribe=("a", "b", "c"))
    assert o.topics.matches("b")
    assert not o.topics.matches("d")


def test_subscribe_pattern_matches_whole_names() -> None:
    o = parse(subscribe=None, subscribePattern="ev.*s")
    assert o.topics.pattern == "ev.*s"
    assert o.topics.matches("events")
    assert not o.topics.matches("events2")
    assert not o.topics.matches("xevents")


def test_assign_sorted_pairs() -> None:
    o = parse(subscribe=None, assign='{"b":[2,0],"a":[1]}')
    assert o.topics.assign == (("a", 1), ("b", 0), ("b", 2))
    assert o.topics.matches("a")
    assert not o.topics.matches("c")


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({}, "none"),
        ({"subscribe": "a", "assign": '{"a":[0]}'}, "subscribe, assign"),
        ({"subscribe": "a", "subscribePattern": "a.*"}, "subscribe, subscribePattern"),
        (
            {"subscribe": "a", "subscribePattern": "a", "assign": '{"a":[0]}'},
            "subscribe, subscribePattern, assign",
        ),
    ],
)
def test_exactly_one_topic_selection(given: dict[str, str], named: str) -> None:
    raw = {k: v for k, v in BASE.items() if k != "subscribe"} | given
    message = error(raw)
    assert "exactly one of the options subscribe, subscribePattern, assign" in message
    assert f"(given: {named})" in message


def test_empty_subscribe_list() -> None:
    message = error_with(subscribe=" , ")
    assert "option subscribe" in message
    assert "comma-separated" in message


def test_bad_pattern() -> None:
    message = error_with(subscribe=None, subscribePattern="ev(")
    assert message.startswith("option subscribePattern: 'ev(' is not a regex")


@pytest.mark.parametrize("raw", ["[0]", '{"a":0}', '{"a":[-1]}', '{"a":["0"]}', "nope"])
def test_bad_assign(raw: str) -> None:
    message = error_with(subscribe=None, assign=raw)
    assert message.startswith(f"option assign: {raw!r} is not a JSON object like")
    assert '{"topicA":[0,1],"topicB":[2]}' in message


# ---------------------------------------------------------------- starting / ending offsets


def test_starting_earliest_latest() -> None:
    assert parse(startingOffsets="earliest").offsets.starting == "earliest"
    assert parse(startingOffsets=" latest ").offsets.starting == "latest"


@pytest.mark.parametrize(("raw", "keyword"), [("Earliest", "earliest"), ("LATEST", "latest"),
                                              (" eArLiEsT ", "earliest")])
def test_offset_keywords_in_any_case(raw: str, keyword: str) -> None:
    assert parse(startingOffsets=raw).offsets.starting == keyword
    if keyword == "latest":
        assert parse(endingOffsets=raw).offsets.ending == "latest"
    else:
        message = error_with(endingOffsets=raw)
        assert message == "option endingOffsets: earliest is not allowed; use latest or JSON"


def test_starting_json_offsets() -> None:
    o = parse(startingOffsets='{"events":{"0":23,"1":-1,"2":0}}')
    assert o.offsets.starting == {"events": {0: 23, 1: LATEST, 2: 0}}


def test_starting_json_accepts_minus_two_for_earliest() -> None:
    o = parse(startingOffsets='{"events":{"0":-2,"1":5}}')
    assert o.offsets.starting == {"events": {0: EARLIEST, 1: 5}}


@pytest.mark.parametrize(
    "raw",
    [
        '{"events":{"0":-3}}',
        '{"events":{"0":-100}}',
    ],
)
def test_starting_json_offsets_below_minus_two(raw: str) -> None:
    message = error_with(startingOffsets=raw)
    assert message.startswith("option startingOffsets: offset ")
    assert "use an offset >= 0 or -1 (latest) or -2 (earliest)" in message


@pytest.mark.parametrize(
    "raw",
    ["{not json", "[1,2]", "earlyest", "42", '"latest"'],
)
def test_starting_not_json_object(raw: str) -> None:
    message = error_with(startingOffsets=raw)
    assert message.startswith(f"option startingOffsets: {raw!r} is not earliest, latest or a JSON")
    assert "(-2 = earliest, -1 = latest)" in message


@pytest.mark.parametrize(
    "raw",
    ['{"events":{"x":1}}', '{"events":{"0":"1"}}', '{"events":{"0":1.5}}', '{"events":{"0":true}}'],
)
def test_starting_json_bad_entries(raw: str) -> None:
    message = error_with(startingOffsets=raw)
    assert message.startswith("option startingOffsets: events/")
    assert "partitions are numbers and offsets are integers" in message


def test_starting_json_topic_not_an_object() -> None:
    message = error_with(startingOffsets='{"events":[1]}')
    assert message == (
        "option startingOffsets: topic 'events' must map partition numbers to offsets"
    )


def test_ending_offsets() -> None:
    assert parse(endingOffsets="latest").offsets.ending == "latest"
    assert parse(endingOffsets='{"events":{"0":10,"1":-1}}').offsets.ending == {
        "events": {0: 10, 1: LATEST}
    }


def test_ending_earliest_rejected() -> None:
    message = error_with(endingOffsets="earliest")
    assert message == "option endingOffsets: earliest is not allowed; use latest or JSON"


def test_ending_json_minus_two_rejected() -> None:
    message = error_with(endingOffsets='{"events":{"0":-2}}')
    assert message == (
        "option endingOffsets: offset -2 for events/0 is not allowed; "
        "use an offset >= 0 or -1 (latest)"
    )


def test_ending_not_json() -> None:
    message = error_with(endingOffsets="soon")
    assert message.startswith("option endingOffsets: 'soon' is not latest or a JSON object")


@pytest.mark.parametrize("key", ["startingOffsets", "endingOffsets"])
def test_per_partition_offsets_not_with_pattern(key: str) -> None:
    message = error_with(subscribe=None, subscribePattern="ev.*", **{key: '{"events":{"0":1}}'})
    assert message.startswith(f"option {key}: per-partition offsets cannot be combined with ")
    assert "subscribePattern" in message


# ---------------------------------------------------------------- maxOffsetsPerTrigger


def test_max_offsets_per_trigger() -> None:
    assert parse(maxOffsetsPerTrigger=" 1000 ").admission.max_offsets_per_trigger == 1000


@pytest.mark.parametrize("raw", ["0", "-5", "1.5", "ten", "", "1e3"])
def test_max_offsets_per_trigger_positive_int(raw: str) -> None:
    message = error_with(maxOffsetsPerTrigger=raw)
    assert message == (
        f"option maxOffsetsPerTrigger: {raw.strip()!r} is not a positive whole number"
    )


# ---------------------------------------------------------------- booleans


@pytest.mark.parametrize(
    ("key", "attr"),
    [
        ("failOnDataLoss", "offsets.fail_on_data_loss"),
        ("includeHeaders", "include_headers"),
        ("includeMarkers", "event_time.include_markers"),
    ],
)
def test_booleans(key: str, attr: str) -> None:
    assert operator.attrgetter(attr)(parse(**{key: "TRUE"})) is True
    assert operator.attrgetter(attr)(parse(**{key: " false "})) is False
    message = error_with(**{key: "yes"})
    assert message == f"option {key}: 'yes' is not a boolean; use true or false"


# ---------------------------------------------------------------- event time


def test_event_time_field_and_header_conflict() -> None:
    message = error_with(**{"eventTime.field": "ts", "eventTime.header": "ts"})
    assert message.startswith("options eventTime.field and eventTime.header conflict")


def test_event_time_unit() -> None:
    assert parse(**{"eventTime.field": "ts", "eventTime.unit": "seconds"}).event_time.unit_ms == (
        1000
    )
    assert (
        parse(**{"eventTime.header": "ts", "eventTime.unit": "Microseconds"}).event_time.unit_ms
        == 0.001
    )
    assert parse(**{"eventTime.field": "ts"}).event_time.unit_ms == 1


def test_event_time_unit_bad() -> None:
    message = error_with(**{"eventTime.field": "ts", "eventTime.unit": "hours"})
    assert message == (
        "option eventTime.unit: 'hours' is not one of milliseconds, seconds, microseconds"
    )


def test_event_time_unit_needs_field_or_header() -> None:
    message = error_with(**{"eventTime.unit": "seconds"})
    assert message == (
        "option eventTime.unit only applies with eventTime.field or eventTime.header"
    )


def test_event_time_on_error() -> None:
    assert parse(**{"eventTime.onError": "SKIP"}).event_time.on_error is OnError.SKIP
    assert parse(**{"eventTime.onError": "fail"}).event_time.on_error is OnError.FAIL
    message = error_with(**{"eventTime.onError": "ignore"})
    assert message == "option eventTime.onError: 'ignore' is not one of fail, skip"


# ---------------------------------------------------------------- watermark strategy


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("boundedOutOfOrderness", WatermarkKind.BOUNDED_OUT_OF_ORDERNESS),
        ("BOUNDEDOUTOFORDERNESS", WatermarkKind.BOUNDED_OUT_OF_ORDERNESS),
        ("monotonous", WatermarkKind.MONOTONOUS),
        ("none", WatermarkKind.NONE),
    ],
)
def test_watermark_strategy(raw: str, kind: WatermarkKind) -> None:
    assert parse(**{"watermark.strategy": raw}).event_time.watermark is kind


def test_watermark_strategy_punctuated() -> None:
    o = parse(**{"watermark.strategy": "punctuated", "watermark.punctuation.field": "meta.wm"})
    assert o.event_time.watermark is WatermarkKind.PUNCTUATED
    assert o.event_time.punctuation_field == "meta.wm"
    assert o.event_time.punctuation_header is None
    o = parse(**{"watermark.strategy": "punctuated", "watermark.punctuation.header": "wm"})
    assert o.event_time.punctuation_header == "wm"
    assert o.event_time.punctuation_field is None


def test_watermark_strategy_bad() -> None:
    message = error_with(**{"watermark.strategy": "periodic"})
    assert message == (
        "option watermark.strategy: 'periodic' is not one of "
        "boundedOutOfOrderness, monotonous, punctuated, none"
    )


@pytest.mark.parametrize(
    ("raw", "ms"),
    [
        ("2 seconds", 2000),
        ("500 ms", 500),
        ("1.5s", 1500),
        ("1 minute", 60_000),
        ("3 h", 10_800_000),
        ("1 day", 86_400_000),
        ("0 ms", 0),
        (" 10   MILLISECONDS ", 10),
    ],
)
def test_max_out_of_orderness_durations(raw: str, ms: int) -> None:
    assert parse(**{"watermark.maxOutOfOrderness": raw}).event_time.max_out_of_orderness_ms == ms


@pytest.mark.parametrize("raw", ["2", "seconds", "two seconds", "2 fortnights", "-1 s", ""])
def test_max_out_of_orderness_not_a_duration(raw: str) -> None:
    message = error_with(**{"watermark.maxOutOfOrderness": raw})
    assert message.startswith(f"option watermark.maxOutOfOrderness: {raw!r} is not a duration")
    assert "(units: ms, s, m/min, h, d)" in message


@pytest.mark.parametrize("raw", ["0", " 0 ", "0.0", "00"])
def test_a_bare_zero_is_a_duration(raw: str) -> None:
    """The documented default of watermark.maxOutOfOrderness can be written as it is shown."""
    assert parse(**{"watermark.maxOutOfOrderness": raw}).event_time.max_out_of_orderness_ms == 0
    assert parse_duration_ms("x", raw) == 0


@pytest.mark.parametrize("raw", ["2", "1.5", "30"])
def test_a_bare_number_names_the_missing_unit(raw: str) -> None:
    message = error_with(**{"watermark.maxOutOfOrderness": raw})
    assert message == (
        f"option watermark.maxOutOfOrderness: {raw!r} is not a duration: the number has no "
        f"unit; write '{raw} ms', '{raw} s' or '{raw} min' (units: ms, s, m/min, h, d)"
    )


def test_m_is_minutes() -> None:
    assert parse_duration_ms("x", "2m") == parse_duration_ms("x", "2 min") == 120_000


@pytest.mark.parametrize("strategy", ["monotonous", "none"])
def test_max_out_of_orderness_only_with_bounded(strategy: str) -> None:
    message = error_with(**{"watermark.strategy": strategy, "watermark.maxOutOfOrderness": "1 s"})
    assert message == (
        "option watermark.maxOutOfOrderness only applies to watermark.strategy "
        f"boundedOutOfOrderness (the strategy is {strategy})"
    )


@pytest.mark.parametrize(
    "extra",
    [{}, {"watermark.punctuation.field": "f", "watermark.punctuation.header": "h"}],
)
def test_punctuated_needs_exactly_one_flag(extra: dict[str, str]) -> None:
    message = error_with(**{"watermark.strategy": "punctuated", **extra})
    assert message.startswith(
        "watermark.strategy punctuated needs exactly one of the options "
        "watermark.punctuation.field or watermark.punctuation.header"
    )


@pytest.mark.parametrize("key", ["watermark.punctuation.field", "watermark.punctuation.header"])
def test_punctuation_only_with_punctuated(key: str) -> None:
    message = error_with(**{key: "wm"})
    assert message == "options watermark.punctuation.* only apply to watermark.strategy punctuated"


# ---------------------------------------------------------------- idleness


def test_idle_timeout() -> None:
    assert parse(idleTimeout="30 seconds").event_time.idle_timeout_ms == 30_000
    assert parse(idleTimeout="250ms").event_time.idle_timeout_ms == 250


def test_idle_timeout_not_a_duration() -> None:
    message = error_with(idleTimeout="30")
    assert message.startswith("option idleTimeout: '30' is not a duration")


@pytest.mark.parametrize("raw", ["0 s", "0"])
def test_idle_timeout_positive(raw: str) -> None:
    message = error_with(idleTimeout=raw)
    assert message == "option idleTimeout must be a positive duration"


# ---------------------------------------------------------------- poll timeout


def test_poll_timeout() -> None:
    assert parse(**{"kafkaConsumer.pollTimeoutMs": "5000"}).kafka.poll_timeout_ms == 5000
    message = error_with(**{"kafkaConsumer.pollTimeoutMs": "0"})
    assert message == "option kafkaConsumer.pollTimeoutMs: '0' is not a positive number of ms"


# ---------------------------------------------------------------- state location


def test_checkpointing_location_required_with_markers_and_watermarks() -> None:
    message = error_with(**{"checkpointing.location": None})
    assert message.startswith("option checkpointing.location is required")
    assert "includeMarkers=false or watermark.strategy=none" in message


@pytest.mark.parametrize("extra", [{"includeMarkers": "false"}, {"watermark.strategy": "none"}])
def test_checkpointing_location_not_needed(extra: dict[str, str]) -> None:
    o = parse(**{"checkpointing.location": None, **extra})
    assert o.event_time.needs_state is False
    assert o.state_location is None


def test_empty_checkpointing_location_counts_as_missing() -> None:
    message = error_with(**{"checkpointing.location": ""})
    assert message.startswith("option checkpointing.location is required")


# ---------------------------------------------------------------- durations helper


def test_parse_duration_ms_names_the_option() -> None:
    assert parse_duration_ms("x", "1.25 s") == 1250
    with pytest.raises(OptionError, match=r"^option my\.option: 'soon' is not a duration"):
        parse_duration_ms("my.option", "soon")


# ---------------------------------------------------------------- secrets

SECRETS = {
    "kafka.sasl.password": "hunter2-sasl",
    "kafka.ssl.key.password": "ssl-key-secret",
    "kafka.ssl.keystore.password": "keystore-secret",
    "kafka.sasl.oauthbearer.client.secret": "oauth-secret",
}
SECRET_VALUES = ["hunter2-sasl", "ssl-key-secret", "keystore-secret", "oauth-secret"]

BROKEN = [
    {"kafka.group.id": "g", "groupIdPrefix": "p"},
    {"subscribe": None},
    {"subscibe": "x"},
    {"startingOffsets": "nope"},
    {"endingOffsets": "earliest"},
    {"maxOffsetsPerTrigger": "0"},
    {"failOnDataLoss": "maybe"},
    {"eventTime.field": "a", "eventTime.header": "b"},
    {"watermark.strategy": "bogus"},
    {"idleTimeout": "soon"},
    {"checkpointing.location": None},
    {"kafka.bootstrap.servers": None},
]


@pytest.mark.parametrize("broken", BROKEN)
def test_secrets_never_in_error_messages(broken: dict[str, Any]) -> None:
    message = error_with(**SECRETS, **broken)
    for secret in SECRET_VALUES:
        assert secret not in message


def test_safe_kafka_config_masks_secrets() -> None:
    o = parse(**SECRETS, **{"kafka.security.protocol": "SASL_SSL", "kafka.sasl.username": "me"})
    safe = o.kafka.safe_config
    assert safe == {
        "bootstrap.servers": "broker1:9092,broker2:9092",
        "security.protocol": "SASL_SSL",
        "sasl.username": "***",
        "sasl.password": "***",
        "ssl.key.password": "***",
        "ssl.keystore.password": "***",
        "sasl.oauthbearer.client.secret": "***",
    }
    assert not any(secret in str(safe) for secret in SECRET_VALUES)
    # the real config still carries them for the consumer
    assert o.kafka.config["sasl.password"] == "hunter2-sasl"


def test_safe_config_masks_secrets() -> None:
    config = {
        "bootstrap.servers": "b:1",
        "SSL.Key.Pem": "pem",
        "token.endpoint": "t",
        "my.credentials": "c",
        "api.password": "p",
        "client.id": "me",
    }
    assert KafkaClient(config).safe_config == {
        "bootstrap.servers": "b:1",
        "SSL.Key.Pem": "***",
        "token.endpoint": "***",
        "my.credentials": "***",
        "api.password": "***",
        "client.id": "me",
    }
    assert config["api.password"] == "p"  # a copy, the input is untouched


# ---------------------------------------------------------------- local location on a cluster

@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[2,3]", None])
@pytest.mark.parametrize("location", ["/tmp/state", "file:///tmp/state", "state"])
def test_local_location_is_fine_on_a_local_master(
    monkeypatch: pytest.MonkeyPatch, master: str | None, location: str
) -> None:
    if master is None:  # flinkish.register not called: the master is unknown
        monkeypatch.delenv(MASTER_ENV, raising=False)
    else:
        monkeypatch.setenv(MASTER_ENV, master)
    assert parse(**{"checkpointing.location": location}).state_location == location


@pytest.mark.parametrize(
    "master", ["local-cluster[2,1,1024]", "spark://head:7077", "yarn", "k8s://https://k:443"])
@pytest.mark.parametrize("location", ["/tmp/state", "file:///tmp/state", "relative/state"])
def test_local_location_is_refused_on_a_cluster(
    monkeypatch: pytest.MonkeyPatch, master: str, location: str
) -> None:
    monkeypatch.setenv(MASTER_ENV, master)
    message = error_with(**{"checkpointing.location": location})
    assert "checkpointing.location" in message and repr(location) in message
    assert repr(master) in message
    assert "s3://" in message and "hdfs://" in message and "gs://" in message


@pytest.mark.parametrize("location", [
    "s3://bucket/state?endpoint_override=127.0.0.1:9000&scheme=http", "hdfs://nn:8020/state",
    "gs://bucket/state", "abfs://container@account.dfs.core.windows.net/state"])
def test_shared_location_is_fine_on_a_cluster(
    monkeypatch: pytest.MonkeyPatch, location: str
) -> None:
    monkeypatch.setenv(MASTER_ENV, "spark://head:7077")
    assert parse(**{"checkpointing.location": location}).state_location == location


def test_no_location_needed_is_not_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MASTER_ENV, "yarn")
    assert parse(**{"checkpointing.location": None, "includeMarkers": "false"})


# --- trigger pacing and the consumer group of completed epochs ------------------------------


def test_min_offsets_per_trigger_and_max_trigger_delay() -> None:
    o = parse(minOffsetsPerTrigger="500", maxTriggerDelay="30 seconds")
    assert (o.admission.min_offsets_per_trigger, o.admission.max_trigger_delay_ms) == (500, 30_000)
    assert parse().admission.min_offsets_per_trigger is None
    # Spark's default
    assert parse(minOffsetsPerTrigger="5").admission.max_trigger_delay_ms == 15 * 60 * 1000
    assert "positive whole number" in error({**BASE, "minOffsetsPerTrigger": "0"})
    assert "only applies with minOffsetsPerTrigger" in error({**BASE, "maxTriggerDelay": "1s"})
    assert "cannot hold more than the maximum" in error(
        {**BASE, "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"})
    assert "not a duration" in error({**BASE, "minOffsetsPerTrigger": "1",
                                      "maxTriggerDelay": "soon"})


def test_the_commit_group_is_named_by_the_query_and_kept_from_read_consumers() -> None:
    o = parse(**{"kafka.group.id": "lag-watch"})
    assert o.kafka.commit_group == "lag-watch" and "group.id" not in o.kafka.config
    assert parse().kafka.commit_group is None
    a = parse(groupIdPrefix="etl", **{"checkpointing.location": "/ck/a/state"})
    b = parse(groupIdPrefix="etl", **{"checkpointing.location": "/ck/b/state"})
    assert a.kafka.commit_group is not None and a.kafka.commit_group.startswith("etl-")
    assert a.kafka.commit_group != b.kafka.commit_group  # one group per query
    again = parse(groupIdPrefix="etl", **{"checkpointing.location": "/ck/a/state"})
    assert again.kafka.commit_group == a.kafka.commit_group  # the same across restarts
    off = parse(commitOffsetsOnCheckpoint="false", **{"kafka.group.id": "g"})
    assert off.kafka.commit_group is None and "group.id" not in off.kafka.config
    assert "needs a consumer group" in error({**BASE, "commitOffsetsOnCheckpoint": "true"})
    assert "conflict" in error({**BASE, "kafka.group.id": "g", "groupIdPrefix": "p"})


def test_starting_and_ending_times() -> None:
    o = parse(startingTimestamp="1700000000000", endingOffsetsByTimestamp='{"events":{"0":5}}')
    assert o.offsets.starting_times == 1_700_000_000_000
    assert o.offsets.ending_times == {"events": {0: 5}}
    assert o.offsets.bounded and not o.offsets.starting_times_latest
    assert parse(startingOffsetsByTimestampStrategy="Latest").offsets.starting_times_latest
    assert parse(endingTimestamp="7").offsets.bounded and not parse().offsets.bounded
    assert "conflict" in error({**BASE, "startingTimestamp": "1", "startingOffsets": "earliest"})
    assert "conflict" in error({**BASE, "startingTimestamp": "1",
                                "startingOffsetsByTimestamp": '{"events":{"0":1}}'})
    assert "conflict" in error({**BASE, "endingTimestamp": "1", "endingOffsets": "latest"})
    assert "epoch milliseconds" in error({**BASE, "startingTimestamp": "yesterday"})
    assert "epoch-millisecond" in error({**BASE, "endingOffsetsByTimestamp": '{"e":{"0":-5}}'})
    assert "is not error" in error({**BASE, "startingOffsetsByTimestampStrategy": "skip"})
    pattern = {k: v for k, v in BASE.items() if k != "subscribe"}
    assert parse_raw({**pattern, "subscribePattern": "ev.*", "startingTimestamp": "1"})
    assert "subscribePattern" in error({**pattern, "subscribePattern": "ev.*",
                                        "startingOffsetsByTimestamp": '{"events":{"0":1}}'})
