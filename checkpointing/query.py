"""Where a streaming query's flinkish state lives, and which query it belongs to."""

from __future__ import annotations

import json
import posixpath
from typing import Any

import pyarrow.fs as pafs

from flinkish_core.errors import OptionError
from flinkish_core.locations import filesystem_of

#: The flinkish checkpoint store's directory inside a query's ``checkpointLocation``.
STORE_DIR = "flinkish"


def store_location(checkpoint_location: str, state_location: str | None = None) -> str:
    """The query's checkpoint store: ``state_location`` when given (the ``checkpointing.location``
    option), else ``<checkpointLocation>/flinkish``, on whatever filesystem that is."""
    if state_location:
        return state_location
    return f"{checkpoint_location.rstrip('/')}/{STORE_DIR}"


def query_id(checkpoint_location: str) -> str:
    """The streaming query's id, which Spark writes to ``<checkpointLocation>/metadata`` before
    the first batch and keeps across restarts: the identity transactions and fencing use."""
    try:
        return str(_journaled(checkpoint_location, "metadata", 0)["id"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise OptionError(
            f"cannot read the query id from {checkpoint_location}/metadata ({exc}); the "
            "flinkish sink must run as a streaming query with a checkpointLocation"
        ) from exc


def _journaled(checkpoint_location: str, relpath: str, line: int) -> Any:
    """The JSON on line ``line`` of the file Spark journals at ``relpath``."""
    filesystem, base = filesystem_of(checkpoint_location, "checkpoint location")
    with filesystem.open_input_stream(posixpath.join(base, relpath)) as stream:
        return json.loads(stream.read().decode("utf-8").splitlines()[line])


def resolve_store(location: str) -> str:
    """Accept either a query's ``checkpointLocation`` (the store is then nested under
    ``flinkish/``) or the store itself, on any filesystem."""
    filesystem, base = filesystem_of(location, "checkpoint location")
    nested = store_location(location)
    infos: list[Any] = filesystem.get_file_info(
        [posixpath.join(base, "metadata"), posixpath.join(base, STORE_DIR)]
    )
    if infos[0].type == pafs.FileType.File and infos[1].type == pafs.FileType.Directory:
        return nested
    return location


def spark_batch_watermark(checkpoint_location: str, batch_id: int) -> int | None:
    """Spark's event-time watermark for micro-batch ``batch_id`` (``batchWatermarkMs`` of
    ``offsets/N``, journaled before the batch runs); None when there is none yet (Spark writes
    0) or the file cannot be read. Through ``flinkish.with_watermark`` it is the valve's
    combined watermark, one batch behind."""
    try:
        value = int(_journaled(checkpoint_location, f"offsets/{batch_id}", 1)["batchWatermarkMs"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return value if value > 0 else None
