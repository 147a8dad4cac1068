"""The files of a flinkish Parquet target to read for a consistent view: whole epochs, and a
compaction's inputs or outputs, never both, as a directory listing would not promise."""

from __future__ import annotations

from flinkish_core.locations import filesystem_of
from flinkish_sink.parquet_compaction import readable_files


def parquet_files(path: str) -> list[str]:
    """The data files of the Parquet target at ``path`` (a directory or a ``pyarrow.fs`` URI)
    that hold each committed row once: whole epochs only, and each compaction's inputs or its
    outputs, never both. URIs come back as URIs of the same scheme, so
    ``spark.read.parquet(*parquet_files(path))`` and ``pyarrow.dataset.dataset(...)`` take
    them.

    Args:
        path: the target's ``path`` option: a local directory or a ``pyarrow.fs`` URI.

    Returns:
        The files' paths (URIs for a URI ``path``); empty when nothing is committed yet.
    """
    filesystem, base = filesystem_of(path, "the Parquet target's path")
    files = readable_files(filesystem, base)
    if "://" not in path:
        return files
    scheme = path.split("://", 1)[0]
    return [f"{scheme}://{name}" for name in files]
