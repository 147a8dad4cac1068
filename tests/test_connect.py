"""flinkish.connect without a server: the source class that carries the Spark master to a
Connect server, and the warm-up reader."""

from __future__ import annotations

import os
import pickle

import pytest
from pyspark import cloudpickle

from flinkish.connect import WARMUP_OPTION, _WarmupReader, connect_source, is_connect
from flinkish.data_source import FlinkishDataSource
from flinkish_core.errors import OptionError
from flinkish_core.locations import MASTER_ENV

OPTIONS = {"kafka.bootstrap.servers": "broker:9092", "subscribe": "events",
           "checkpointing.location": "/tmp/flinkish-state"}


def test_the_class_travels_by_value_with_its_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server unpickles the class the client registered: the master must come with it."""
    monkeypatch.setenv(MASTER_ENV, "local[2]")
    travelled = pickle.loads(cloudpickle.dumps(connect_source("spark://head:7077")))
    assert issubclass(travelled, FlinkishDataSource) and travelled.name() == "flinkish"
    with pytest.raises(OptionError, match="spark://head:7077"):
        travelled(dict(OPTIONS)).schema()  # a local checkpointing.location on a cluster
    assert os.environ[MASTER_ENV] == "spark://head:7077"


def test_a_local_master_accepts_a_local_location(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MASTER_ENV, "spark://elsewhere:7077")
    source = connect_source("local[2]")(dict(OPTIONS))
    assert "eventTime" in source.schema().fieldNames()


def test_the_warm_up_reader_reads_nothing() -> None:
    source = connect_source("local[2]")({WARMUP_OPTION: "true"})
    assert source.schema().simpleString() == "struct<value:binary>"
    reader = source.streamReader(None)  # type: ignore[arg-type]
    assert isinstance(reader, _WarmupReader)
    start = reader.initialOffset()
    assert reader.latestOffset(start, None) == start  # type: ignore[arg-type]
    assert reader.partitions(start, start) == []


def test_a_classic_process_never_counts_as_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    assert not is_connect(object())
