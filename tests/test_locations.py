"""The cluster rule for locations that executors and the driver share: a local path is an
error unless the Spark master runs everything in one process (local, local[...]). The source's
checkpointing.location is covered in test_source_options; here the rule and the sink's Parquet
paths. And the one rule by which every part opens a location."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from flinkish_core.errors import OptionError
from flinkish_core.locations import MASTER_ENV, filesystem_of, local_location_problem
from flinkish_sink.options import PATH, parse_sink_options

CLUSTER = "local-cluster[2,1,1024]"


@pytest.mark.parametrize("master", ["local", "local[4]", "local[*]", "local[2,3]", None])
def test_a_local_master_or_an_unknown_one_takes_any_path(master: str | None) -> None:
    assert local_location_problem("path", "/data/out", master, "why") is None


@pytest.mark.parametrize("location", ["/data/out", "data/out", "file:///data/out",
                                      "FILE:///data/out"])
@pytest.mark.parametrize("master", [CLUSTER, "spark://head:7077", "yarn", "k8s://https://k"])
def test_a_cluster_master_refuses_local_paths(location: str, master: str) -> None:
    problem = local_location_problem("path", location, master, "tasks write it")
    assert problem is not None
    assert problem.startswith(f"option path: {location!r} is on the local filesystem")
    assert repr(master) in problem and "tasks write it" in problem
    assert all(scheme in problem for scheme in ("s3://", "hdfs://", "gs://"))


@pytest.mark.parametrize("location", ["s3://b/p?endpoint_override=h:9000&scheme=http",
                                      "hdfs://nn/p", "gs://b/p", "abfs://c@a.dfs.core.windows.net/p"])
def test_a_cluster_master_takes_shared_filesystems(location: str) -> None:
    assert local_location_problem("path", location, "yarn", "why") is None


def _parquet(**extra: str) -> dict[str, str]:
    return {"target": "parquet", "path": "s3://bucket/out", "checkpointLocation": "/ck", **extra}


def test_sink_refuses_a_local_parquet_path_on_a_cluster(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MASTER_ENV, CLUSTER)
    assert parse_sink_options(_parquet())[PATH] == "s3://bucket/out"
    with pytest.raises(OptionError, match="option path: '/out' is on the local filesystem"):
        parse_sink_options(_parquet(path="/out"))
    with pytest.raises(OptionError, match="option lateData.path: '/late' is on the local"):
        parse_sink_options(_parquet(lateData="side", **{"lateData.path": "/late"}))
    # the store is the driver's alone: a local one (here under checkpointLocation) is fine
    assert parse_sink_options(_parquet(**{"checkpointing.location": "/store"}))


def test_sink_takes_local_paths_on_a_local_master(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MASTER_ENV, "local[2]")
    assert parse_sink_options(_parquet(path="/out"))[PATH] == "/out"


# ---------------------------------------------------------------- one rule to open a location


def test_every_reader_and_writer_opens_a_location_by_one_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``~`` is the home directory and ``file:`` (as Spark writes a local checkpoint location)
    is local disk, for the checkpoint store, the query's checkpoint and every target alike."""
    from checkpointing import CheckpointStorage
    from checkpointing.query import query_id
    from flinkish_sink.parquet_target import ParquetTarget

    monkeypatch.setenv("HOME", str(tmp_path))
    for given, expected in (("~/a", tmp_path / "a"), (f"file:{tmp_path}/b", tmp_path / "b"),
                            (f"file://{tmp_path}/c/", tmp_path / "c"), (f"{tmp_path}/d/",
                                                                         tmp_path / "d")):
        filesystem, path = filesystem_of(given, "the location")
        assert isinstance(filesystem, pafs.LocalFileSystem) and path == str(expected), given
    assert CheckpointStorage.open(f"file:{tmp_path}/store").location == f"{tmp_path}/store"
    assert ParquetTarget("~/out")._base == f"{tmp_path}/out"
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "metadata").write_text('{"id":"q-1"}\n')
    assert query_id("~/ck") == query_id(f"file:{tmp_path}/ck") == "q-1"


def test_a_location_that_cannot_be_opened_is_named_without_its_credentials() -> None:
    with pytest.raises(ValueError) as failure:
        filesystem_of("nosuch://app:s3cret@host/x", "the Parquet target's path")
    assert str(failure.value).startswith("cannot open the Parquet target's path 'nosuch://app:")
    assert "s3cret" not in str(failure.value) and failure.value.__cause__ is None
    with pytest.raises(ValueError, match="^checkpoint location is empty$"):
        filesystem_of(" ", "checkpoint location")
