"""Locations: a path or a URI to a ``pyarrow.fs`` filesystem and path, by one rule
(:func:`filesystem_of`), the file operations that make writes durable, and the cluster rule: a
local path is shared by driver and executors only under a ``local``/``local[...]`` master
(``local-cluster`` counts as a cluster).
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import TYPE_CHECKING

from flinkish_core.secrets import dsn_secrets, mask_uri, scrub

if TYPE_CHECKING:  # pyarrow is for the processes that touch files, not for the option checks
    import pyarrow.fs as pafs

#: The Python data source is never told the master: ``flinkish.register`` puts it here.
MASTER_ENV = "FLINKISH_SPARK_MASTER"


def local_location_problem(option: str, location: str, master: str | None, why: str) -> str | None:
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


def filesystem_of(location: str, what: str) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem of ``location`` (a local path, or a URI pyarrow knows) and
    its path there, without a trailing ``/``: every place flinkish reads or writes is opened
    here. ValueError names ``what`` it is; credentials are masked and the cause not chained
    (pyarrow's message may quote them)."""
    import pyarrow.fs as pafs

    if not location.strip():
        raise ValueError(f"{what} is empty")
    if "://" not in location:
        local = location[len("file:"):] if location.startswith("file:") else location
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(local))
    try:
        filesystem, path = pafs.FileSystem.from_uri(location)
    except (ValueError, OSError) as exc:  # ArrowInvalid is a ValueError
        reason = scrub(str(exc), dsn_secrets(location))
        raise ValueError(f"cannot open {what} {mask_uri(location)!r}: {reason}") from None
    return filesystem, str(path).rstrip("/") or "/"


def sync_local(path: str) -> None:
    """fsync a local file or directory (the latter makes a rename inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_path(filesystem: pafs.FileSystem, path: str) -> None:
    """fsync ``path`` on a POSIX local disk; remote stores make writes durable themselves."""
    local = _local_os_path(filesystem, path)
    if local is not None and os.name == "posix":
        sync_local(local)


def delete_file_if_present(filesystem: pafs.FileSystem, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        filesystem.delete_file(path)


def _local_os_path(filesystem: pafs.FileSystem, path: str) -> str | None:
    """The OS path behind ``path`` if ``filesystem`` is local disk (possibly a subtree of it)."""
    import pyarrow.fs as pafs

    if isinstance(filesystem, pafs.LocalFileSystem):
        return path
    if isinstance(filesystem, pafs.SubTreeFileSystem):
        return _local_os_path(filesystem.base_fs, filesystem.base_path.rstrip("/") + "/" + path)
    return None
