"""A write task's rows kept until its pre-commit, to write again after an outage: in memory up
to :data:`MEMORY_BUDGET` (most tasks never touch disk), past that all in an Arrow file in
Spark's local directory, rather than a micro-batch's share in memory per task."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pyarrow as pa

from flinkish_core.process_files import process_directory

_PREFIX = "flinkish-spill-"

MEMORY_BUDGET = 64 << 20
"""Bytes of Arrow buffers a task keeps in memory before it spills them all to disk."""


def local_directory() -> str:
    """The first of Spark's local directories in a task, else the temp directory."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    return dirs[0] if dirs else tempfile.gettempdir()


class RowSpill:
    """Batches appended, read back in order: in memory while they fit ``memory_budget``, then
    all of them in a file."""

    def __init__(self, schema: pa.Schema, memory_budget: int | None = None) -> None:
        self._schema = schema
        self._budget = MEMORY_BUDGET if memory_budget is None else memory_budget
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self._path: str | None = None
        self._file: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self.rows = 0

    def append(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        if self._writer is None and self._held_bytes + batch.nbytes <= self._budget:
            self._held.append(batch)
            self._held_bytes += batch.nbytes
            return
        if self._writer is None:
            fd, self._path = tempfile.mkstemp(
                suffix=".arrows", dir=process_directory(_PREFIX, local_directory()))
            os.close(fd)
            self._file = pa.OSFile(self._path, "wb")
            self._writer = pa.ipc.new_stream(self._file, self._schema)
            for held in self._held:
                self._writer.write_batch(held)
            self._held, self._held_bytes = [], 0
        self._writer.write_batch(batch)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every batch appended so far. A spilled one is backed by the mapped file: use it
        before the iteration ends."""
        if self._path is None:
            yield from self._held
            return
        with pa.memory_map(self._path) as mapped:
            yield from pa.ipc.open_stream(mapped)

    def close(self) -> None:
        """Drops the batches (deleting the file); appending starts again in memory."""
        if self._writer is not None:
            self._writer.close()
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            os.unlink(self._path)
        self._path, self._file, self._writer, self.rows = None, None, None, 0
        self._held, self._held_bytes = [], 0
