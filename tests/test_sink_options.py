"""The sink's option errors name options as the docs spell them, although Spark hands the
sink its option keys in lower case; a target is a plug-in, its options declared in its module."""

from __future__ import annotations

import re
from typing import Any

import pytest

from flinkish_core.config import Option, whole_number
from flinkish_core.errors import OptionError
from flinkish_sink import delta_target, targets
from flinkish_sink.options import (
    PARTITION_BY,
    PATH,
    UPSERT_KEY,
    TargetOptions,
    parse_sink_options,
    reference,
)
from flinkish_sink.targets import TargetFactory

BASE = {"target": "parquet", "path": "/tmp/out", "checkpointLocation": "/tmp/ck"}


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("deliveryguarantees", "deliveryGuarantee"),
        ("latedata.tabel", "lateData.table"),
        ("eventtimecolum", "eventTimeColumn"),
        ("transactionalidprefx", "transactionalIdPrefix"),
        ("checkpointlocaton", "checkpointLocation"),
        ("epochtable", "epochsTable"),
    ],
)
def test_did_you_mean_names_the_documented_spelling(key: str, suggestion: str) -> None:
    with pytest.raises(OptionError) as failure:
        parse_sink_options({**BASE, key: "x"})  # as Spark passes it: lower case
    assert str(failure.value) == (
        f"unknown option {key!r} for the flinkish sink; did you mean {suggestion}?")


def test_camel_case_keys_are_read_in_any_case() -> None:
    options = parse_sink_options({**BASE, "DELIVERYGUARANTEE": "at-least-once",
                                  "eventtimecolumn": "ts"})
    assert options.guarantee.value == "at-least-once" and options.event_time_column == "ts"


def test_upsert_key_is_a_comma_separated_list_for_postgres_only() -> None:
    postgres = {"target": "postgres", "dsn": "host=x", "table": "t",
                "checkpointLocation": "/tmp/ck"}
    options = parse_sink_options({**postgres, "upsertkey": " k, window_start "})
    assert options[UPSERT_KEY] == ("k", "window_start")
    assert parse_sink_options(postgres)[UPSERT_KEY] == ()
    for bad in ({**postgres, "upsertKey": " , "}, {**BASE, "upsertKey": "k"}):
        with pytest.raises(OptionError, match="option upsertKey: the key columns"):
            parse_sink_options(bad)


def test_delta_options() -> None:
    delta = {"target": "delta", "path": "/tmp/t", "checkpointLocation": "/tmp/ck"}
    options = parse_sink_options({**delta, "partitionby": "k, day", "delta.appid": "app"})
    assert options.target == "delta"
    assert options[PARTITION_BY] == ("k", "day") and options[delta_target.APP_ID] == "app"
    assert parse_sink_options(delta)[delta_target.APP_ID] is None  # the query's id
    assert parse_sink_options({**delta, "upsertKey": "k,w_start"})[UPSERT_KEY] == ("k", "w_start")
    assert parse_sink_options(delta)[delta_target.COMPACT_EVERY] == 50
    assert parse_sink_options(delta)[delta_target.VACUUM_RETENTION] is None
    tuned = parse_sink_options({**delta, "delta.compactevery": "0",
                                "delta.vacuumretention": "90 min"})
    assert (tuned[delta_target.COMPACT_EVERY], tuned[delta_target.VACUUM_RETENTION]) == (0, 2)
    for bad, message in (
        ({**delta, "path": ""}, "option path is required with target delta"),
        ({**BASE, "partitionBy": "k"}, "option partitionBy applies to targets delta and iceberg"),
        ({**delta, "delta.appId": " "}, "option delta.appId is empty"),
        ({**delta, "lateData": "side"}, "lateData=side with target delta needs option "
                                        "lateData.path"),
        ({**delta, "lateData": "side", "lateData.path": "/tmp/t"}, "another place than path"),
        ({**delta, "upsertKey": " "}, "with target postgres or delta"),
        ({**delta, "delta.compactEvery": "often"}, "not a whole number of epochs"),
        ({**delta, "delta.vacuumRetention": "10 min"}, "is under an hour"),
        ({**BASE, "delta.compactEvery": "5"}, "applies to target delta only"),
    ):
        with pytest.raises(OptionError, match=message):
            parse_sink_options(bad)


# ---------------------------------------------------------------- targets as plug-ins

SIZE = Option("toy.size", whole_number(1, "a whole number >= 1"), 3, doc="Rows per toy file.")


def _toy(options: TargetOptions, late: bool) -> Any:
    return ("toy", options[PATH], options[SIZE], late)


FACTORY = TargetFactory(name="toy", title="Toy", doc="A target of this test.",
                        options=(PATH, SIZE), required={PATH: "where it goes"},
                        create=_toy, cli_option="path")


def test_a_target_is_its_module_and_a_line_in_the_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """This module declares a target; registering it is all the sink, the docs and the CLI
    need to take it."""
    from flinkish_sink.stream_writer import make_target

    monkeypatch.setitem(targets.TARGETS, "toy", __name__)
    toy = {"target": "toy", "path": "/tmp/toy", "checkpointLocation": "/tmp/ck"}
    options = parse_sink_options({**toy, "toy.size": "5"})
    assert make_target(options) == ("toy", "/tmp/toy", 5, False)
    assert parse_sink_options(toy)[SIZE] == 3
    for bad, message in (({"toy.size": "0"}, "option toy.size: '0' is not a whole number"),
                         ({"path": ""}, "option path is required with target toy (where it"),
                         ({"toy.sise": "1"}, "did you mean toy.size?"),
                         ({"lateData": "side"}, "target toy has no side output"),
                         ({"delta.compactEvery": "1"}, "applies to target delta only")):
        with pytest.raises(OptionError, match=re.escape(message)):
            parse_sink_options({**toy, **bad})
    with pytest.raises(OptionError, match=re.escape("option toy.size applies to target toy "
                                                    "only (not parquet)")):
        parse_sink_options({**BASE, "toy.size": "1"})
    assert "- `toy`: A target of this test." in reference()
    assert "| `toy.size` | `3` | `toy` | Rows per toy file. |" in reference()
    from flinkish.cli import build_parser

    args = build_parser().parse_args(["transactions", "--toy", "/tmp/toy", "--query", "q"])
    assert args.target_toy == "/tmp/toy"  # flinkish transactions --toy PATH


def test_a_target_whose_packages_are_missing_names_its_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(targets.TARGETS, "absent", "flinkish_sink.no_such_target")
    with pytest.raises(OptionError, match=re.escape("target absent needs packages that are "
                                                    "not installed")) as failure:
        parse_sink_options({"target": "absent", "checkpointLocation": "/tmp/ck"})
    assert "flinkish[absent]" in str(failure.value)
    # the other targets still parse, and still name their options
    assert parse_sink_options(BASE).target == "parquet"
