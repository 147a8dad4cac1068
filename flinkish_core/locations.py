"""Locations the driver and the executors share. On a cluster they run on different hosts, so
a local path written on one is not there on another; only Spark's ``local``/``local[...]``
masters run everything in one process on one machine (``local-cluster`` simulates a cluster
and counts as one).

The Python data source is never told the master: ``flinkish.register`` puts it into the data
source's environment as ``MASTER_ENV``, which the option checks read.
"""

from __future__ import annotations

import re

MASTER_ENV = "FLINKISH_SPARK_MASTER"


def local_location_problem(option: str, location: str, master: str | None,
                           why: str) -> str | None:
    """Why ``location`` (option ``option``) cannot be a local path under Spark ``master``, or
    None when it is fine: a URI of another filesystem, a local master, or an unknown master
    (``flinkish.register`` not called). ``why`` says who writes and reads it."""
    if master is None or re.fullmatch(r"local(\[.*\])?", master.strip()):
        return None
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", location)
    if scheme is not None and scheme[1].lower() != "file":
        return None
    return (
        f"option {option}: {location!r} is on the local filesystem, but the Spark master is "
        f"{master!r}: {why}, so executors on other hosts would not see it. Put it on storage "
        "every host reaches, e.g. s3://bucket/path, hdfs://namenode/path or gs://bucket/path "
        "(local paths work only with master local or local[...])."
    )
