"""The ``flinkish`` package's public names, and what the driver-side reader process imports.

Spark starts a fresh Python process for every streaming query's source and imports the data
source there; whatever that import pulls in is paid at every query's start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import flinkish


def _fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    return done.stdout


def test_every_public_name_resolves_to_its_definition() -> None:
    from flinkish_core.errors import OptionError
    from flinkish_source.kafka import DataLossError

    assert sorted(flinkish.__all__) == sorted(flinkish._PUBLIC)
    for name in flinkish.__all__:
        assert getattr(flinkish, name) is not None
        assert name in dir(flinkish)
    assert flinkish.OptionError is OptionError and flinkish.DataLossError is DataLossError
    assert flinkish.windows.__name__ == "flinkish.windows"
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = flinkish.nothing_here  # type: ignore[attr-defined]
    names = json.loads(_fresh(
        "import json; from flinkish import *; import flinkish; "
        "print(json.dumps(sorted(n for n in flinkish.__all__ if n in globals())))"))
    assert names == sorted(flinkish.__all__)


def test_the_driver_side_reader_process_imports_only_what_planning_needs() -> None:
    loaded = json.loads(_fresh(
        "import json, sys\n"
        "import pyspark.sql.streaming.python_streaming_source_runner\n"
        "from flinkish.data_source import FlinkishDataSource\n"
        "FlinkishDataSource({'kafka.bootstrap.servers': 'b:1', 'subscribe': 't',\n"
        "                    'checkpointing.location': '/tmp/x'}).streamReader(None)\n"
        "print(json.dumps(sorted(sys.modules)))"))
    assert "flinkish_source.stream_reader" in loaded
    heavy = {"pandas", "pyarrow.compute", "flinkish.windows", "flinkish_sink", "difflib",
             "checkpointing.checkpoint_store"}
    assert heavy.isdisjoint(loaded), heavy & set(loaded)
