"""A write task's rows on local disk until its pre-commit.

After a transient outage the task's transaction is begun again and every row written so far is
written again (:class:`flinkish_sink.outages.RetriedTransaction`). Keeping those rows in memory
would hold a whole micro-batch's share per task; they go instead to an Arrow stream file in
the executor's local directory (Spark gives its Python workers ``SPARK_LOCAL_DIRS``), read back
memory-mapped when needed and deleted at the pre-commit or the abort."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pyarrow as pa

from flinkish_core.process_files import process_directory

_PREFIX = "flinkish-spill-"


def local_directory() -> str:
    """The first of Spark's local directories in a task, else the temp directory."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    return dirs[0] if dirs else tempfile.gettempdir()


class RowSpill:
    """Batches appended to a file, read back in order. The file is created at the first
    batch: a task that writes nothing touches no disk."""

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema
        self._path: str | None = None
        self._file: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self.rows = 0

    def append(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            fd, self._path = tempfile.mkstemp(
                suffix=".arrows", dir=process_directory(_PREFIX, local_directory()))
            os.close(fd)
            self._file = pa.OSFile(self._path, "wb")
            self._writer = pa.ipc.new_stream(self._file, self._schema)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every batch appended so far. Each is backed by the mapped file: use it before the
        iteration ends."""
        if self._path is None:
            return
        with pa.memory_map(self._path) as mapped:
            yield from pa.ipc.open_stream(mapped)

    def close(self) -> None:
        """Deletes the file; appending starts a new one."""
        if self._writer is not None:
            self._writer.close()
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            os.unlink(self._path)
        self._path, self._file, self._writer, self.rows = None, None, None, 0
