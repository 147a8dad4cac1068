"""The shared masking rule (flinkish_core.secrets) and the sink's and source's options that use
it: no secret in a repr, an option error or a cache key."""

from __future__ import annotations

import pickle

import pytest

from flinkish_core.errors import OptionError
from flinkish_core.secrets import (
    MASK,
    dsn_secrets,
    fingerprint,
    mask_dsn,
    mask_uri,
    redact_config,
    scrub,
)
from flinkish_sink.options import parse_sink_options
from flinkish_sink.postgres_target import DSN
from flinkish_source.options import parse_options

SECRET = "Pa55-w0rd-n3ver-shown"


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        (f"host=db port=5432 user=app password={SECRET} dbname=d",
         f"host=db port=5432 user=app password={MASK} dbname=d"),
        (f"host=db password = '{SECRET} with \\' quote' dbname=d",
         f"host=db password = {MASK} dbname=d"),
        (f"host=db sslpassword={SECRET} sslmode=require",
         f"host=db sslpassword={MASK} sslmode=require"),
        (f"postgresql://app:{SECRET}@db:5432/d", f"postgresql://app:{MASK}@db:5432/d"),
        (f"postgres://app:{SECRET}@h1:5432,h2:5433/d?sslmode=require",
         f"postgres://app:{MASK}@h1:5432,h2:5433/d?sslmode=require"),
        (f"postgresql://app@db/d?sslmode=require&password={SECRET}",
         f"postgresql://app@db/d?sslmode=require&password={MASK}"),
        ("postgresql://db:5432/d", "postgresql://db:5432/d"),
        ("host=db dbname=d", "host=db dbname=d"),
    ],
)
def test_mask_dsn_hides_the_password_in_every_form(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked
    assert SECRET not in (mask_dsn(dsn) or "")


def test_dsn_secrets_gives_the_raw_and_decoded_password() -> None:
    assert dsn_secrets("postgresql://u:p%40ss-word@h/d") == ["p%40ss-word", "p@ss-word"]
    assert dsn_secrets("host=h password='a b\\'c' dbname=d") == ["'a b\\'c'", "a b'c"]
    assert dsn_secrets("host=h dbname=d") == []
    text = "missing \"=\" after \"a b'c\" in connection info string"
    assert scrub(text, dsn_secrets("host=h password='a b\\'c'")) == (
        f"missing \"=\" after \"{MASK}\" in connection info string"
    )


def test_scrub_masks_longest_first_and_leaves_tiny_values() -> None:
    assert scrub("abcdef and abc", ["abc", "abcdef"]) == f"{MASK} and {MASK}"
    assert scrub("a x", ["x"]) == "a x"


def test_uri_credentials_are_masked() -> None:
    assert mask_uri(f"s3://AKIA:{SECRET}@bucket/out") == f"s3://AKIA:{MASK}@bucket/out"
    assert mask_uri("/tmp/out") == "/tmp/out"
    assert mask_uri(None) is None


def test_redact_config_masks_sasl_ssl_and_password_like_keys() -> None:
    config = {
        "bootstrap.servers": "b:9092", "sasl.password": SECRET, "sasl.jaas.config": SECRET,
        "ssl.key.password": SECRET, "ssl.keystore.location": "/k",
        "schema.registry.api.key": SECRET,
        "security.protocol": "SASL_SSL",
    }
    redacted = redact_config(config)
    assert SECRET not in repr(redacted)
    assert redacted["bootstrap.servers"] == "b:9092"
    assert redacted["security.protocol"] == "SASL_SSL"
    assert redacted["ssl.keystore.location"] == MASK


def test_fingerprint_is_stable_and_does_not_hold_the_secret() -> None:
    assert fingerprint("a", SECRET) == fingerprint("a", SECRET)
    assert fingerprint("a", SECRET) != fingerprint("a", SECRET + "x")
    assert SECRET not in fingerprint(SECRET)


def _sink(**extra: str) -> dict[str, str]:
    return {"target": "postgres", "dsn": f"host=db password={SECRET} dbname=d", "table": "t",
            "checkpointLocation": "/tmp/ck", **extra}


def test_sink_options_repr_masks_the_dsn_and_the_cache_key_is_a_hash() -> None:
    options = parse_sink_options(_sink())
    uri = parse_sink_options(_sink(dsn=f"postgresql://app:{SECRET}@db/d"))
    for shown in (repr(options), str(options), repr(uri), f"{options}", repr([options, uri])):
        assert SECRET not in shown
    assert f"password={MASK}" in repr(options) and f"app:{MASK}@db" in repr(uri)
    assert options[DSN] is not None and SECRET in options[DSN]  # the target still gets it
    assert SECRET not in options.fingerprint
    assert options.fingerprint == parse_sink_options(_sink()).fingerprint
    other = parse_sink_options(_sink(dsn=f"host=db password={SECRET}x dbname=d"))
    assert other.fingerprint != options.fingerprint  # a changed password is another config
    assert options.secrets == [SECRET]
    assert SECRET in pickle.loads(pickle.dumps(options))[DSN]


@pytest.mark.parametrize(
    "bad",
    [{"deliveryGuarantee": "twice"}, {"table": ""}, {"path": "/x"}, {"lateData": "side"},
     {"checkpointing.retain": "0"}, {"transactionalIdPrefix": "a b"}, {"dsnn": SECRET},
     {"checkpointLocation": ""}],
)
def test_sink_option_errors_never_quote_the_dsn(bad: dict[str, str]) -> None:
    with pytest.raises(OptionError) as failure:
        parse_sink_options(_sink(**bad))
    assert SECRET not in str(failure.value)


def test_source_options_hide_kafka_secrets_in_repr_and_errors() -> None:
    jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            f"username=u password='{SECRET}';")
    raw = {"kafka.bootstrap.servers": "b:1", "kafka.ssl.key.password": SECRET,
           "kafka.sasl.jaas.config": jaas, "subscribe": "t", "includeMarkers": "false"}
    options = parse_options(raw)
    assert SECRET not in repr(options) and SECRET not in repr(options.kafka.safe_config)
    assert sorted(options.kafka.secrets) == sorted([SECRET, SECRET, "u", jaas])
    for bad in ({"startingOffsets": "soon"}, {"kafka.enable.auto.commit": "true"},
                {"subscribe": ""}, {"kafkaConsumer.pollTimeoutMs": "x"},
                {"idleTimeout": "1 fortnight"}):
        with pytest.raises(OptionError) as failure:
            parse_options({**raw, **bad})
        assert SECRET not in str(failure.value)
