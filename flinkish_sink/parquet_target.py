"""Parquet files as a two-phase-commit target: Flink's ``FileSink`` on any ``pyarrow.fs``.

Tasks pre-commit by closing files staged under ``_flinkish_staging`` (hidden from readers); the
driver commits by renaming them into place. The layout and what a reader sees while an epoch
commits: docs/architecture.md, "Storage layout of one query".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from flinkish_core.config import Option, size_bytes, whole_number
from flinkish_core.locations import delete_file_if_present, filesystem_of, sync_path
from flinkish_core.secrets import mask_uri
from flinkish_sink.data_files import publish_file, staged_ages, type_differences
from flinkish_sink.options import LATE_PATH, PATH, TargetOptions, distinct
from flinkish_sink.target import EPOCHS_DIR, GID_PART, STAGING_DIR, PreCommit, TransactionId
from flinkish_sink.targets import TargetFactory

logger = logging.getLogger(__name__)

#: Smaller than Delta's (1 GB) or Iceberg's (512 MB): a stream's files are read as they come.
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
COMPACT_EVERY = Option(
    "parquet.compactEvery", whole_number(0, "a whole number of epochs (0: never compact)"), 0,
    doc="After every that many epochs, merge the query's small committed files into files of "
        "up to `parquet.targetFileSize` (`0`: never, the default: a reader listing the "
        "directory sees a compaction's rows twice for a moment); see [compaction]"
        "(../guides/exactly-once.md#fewer-larger-parquet-files).")
TARGET_FILE_SIZE = Option(
    "parquet.targetFileSize", size_bytes, DEFAULT_TARGET_FILE_SIZE, shown_default="`128 MB`",
    doc="The size compaction merges files up to: bytes, or a number with `KB`, `MB`, `GB` "
        "(powers of 1024).")

_DIRECT_DIR = "_direct"
_EPOCH_RECORD = re.compile(r"^(\d+)\.json$")


class ParquetTarget:
    """Directory of Parquet files with staged-then-renamed commits."""

    #: a staged file is invisible and locks nothing
    leftovers_block_writes = False
    pending_consequence = "its staged files wait, taking space"

    def __init__(self, path: str | os.PathLike[str], *, max_rows_per_file: int | None = None,
                 compact_every: int = 0, target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
                 filesystem: pafs.FileSystem | None = None):
        """``path``: a directory or a URI pyarrow knows, or a path in ``filesystem``;
        ``max_rows_per_file`` (None: one file per transaction)."""
        text = os.fspath(path)
        if filesystem is None:
            self._fs, base = filesystem_of(text, "the Parquet target's path")
            self._where = mask_uri(text) or text
        else:
            self._fs, base, self._where = filesystem, text, f"{filesystem.type_name}:{text}"
        self._base = base.rstrip("/")
        if not self._base:
            raise ValueError(f"Parquet target {self._where!r} is a filesystem root; name a "
                             "directory")
        if max_rows_per_file is not None and max_rows_per_file < 1:
            raise ValueError(f"max_rows_per_file must be positive, got {max_rows_per_file}")
        if compact_every < 0 or target_file_size < 1:
            raise ValueError(
                f"compact_every must be >= 0 and target_file_size positive, got "
                f"{compact_every} and {target_file_size}")
        self._max_rows_per_file = max_rows_per_file
        self._compact_every = compact_every
        self._target_file_size = target_file_size

    def __repr__(self) -> str:
        return f"ParquetTarget({self._where!r})"

    # -- paths ---------------------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return "/".join((self._base, *parts))

    def staged_dir(self, txn: TransactionId) -> str:
        return self._path(STAGING_DIR, txn.staged_name)

    def _epochs_dir(self, query: str) -> str:
        if not GID_PART.match(query) or query in (".", ".."):
            raise ValueError(
                f"query name {query!r} must be letters, digits, '_', '.' and '-', "
                "and not '.' or '..'")
        return self._path(EPOCHS_DIR, query)

    # -- Target --------------------------------------------------------------------------------

    def _first_data_file(self) -> str | None:
        """The file whose schema a reader takes, as ``pyarrow.dataset`` finds it, without
        importing it (with pandas: most of a second of the driver's restart)."""
        selector = pafs.FileSelector(self._base, recursive=True)
        prefix = len(self._base.rstrip("/")) + 1
        files = sorted(
            info.path for info in self._fs.get_file_info(selector)
            if info.type == pafs.FileType.File and not any(
                part.startswith(("_", ".")) for part in info.path[prefix:].split("/")))
        return files[0] if files else None

    def check(self, schema: pa.Schema) -> None:
        """Create the directory, or check that a reader of it sees ``schema``: a mismatch
        fails at start, not as an unreadable mix of files later."""
        info = self._fs.get_file_info(self._base)
        if info.type == pafs.FileType.File:
            raise ValueError(f"Parquet target {self._where!r} is a file, not a directory")
        if info.type == pafs.FileType.NotFound:
            self._fs.create_dir(self._base, recursive=True)
            return
        existing = self._first_data_file()
        if existing is None:
            return
        differences = schema_differences(pq.read_schema(existing, filesystem=self._fs), schema)
        if differences:
            raise ValueError(
                f"Parquet target {self._where!r} already holds files with another schema: "
                + "; ".join(differences))

    def begin_transaction(self, txn: TransactionId, schema: pa.Schema) -> ParquetTransaction:
        return ParquetTransaction(self, txn, schema)

    def write_direct(self, batch: pa.RecordBatch) -> None:
        """Write one visible file under a unique name, appearing whole (temp file + rename)."""
        if batch.num_rows == 0:
            return
        name = f"part-direct-{uuid.uuid4().hex}.parquet"
        temp = self._path(STAGING_DIR, _DIRECT_DIR, name)
        self._fs.create_dir(self._path(STAGING_DIR, _DIRECT_DIR), recursive=True)
        try:
            with pq.ParquetWriter(temp, batch.schema, filesystem=self._fs) as writer:
                writer.write_batch(batch)
            sync_path(self._fs, temp)
            self._fs.move(temp, self._path(name))
        except BaseException:
            delete_file_if_present(self._fs, temp)
            raise
        sync_path(self._fs, self._base)

    def commit(self, pre_commit: PreCommit) -> None:
        """Rename the staged files into place, each checked first so that a transaction whose
        files were deleted behind our back fails whole instead of half-appearing."""
        txn = pre_commit.txn
        names = [str(name) for name in pre_commit.listed("files", "ParquetTarget")]
        directory = self.staged_dir(txn)
        staged = [f"{directory}/{name}" for name in names]
        final = [self._path(name) for name in names]
        found = [i.type != pafs.FileType.NotFound for i in self._fs.get_file_info(staged + final)]
        staged_present = found[:len(names)]
        lost = [name for name, s, f in zip(names, staged_present, found[len(names):], strict=True)
                if not (s or f)]
        if lost:
            raise RuntimeError(
                f"cannot commit {txn.gid} to {self._where!r}: files {lost} are neither staged in "
                f"{directory!r} nor committed; they were removed outside flinkish")
        for source, dest, present in zip(staged, final, staged_present, strict=True):
            if present:
                self._fs.move(source, dest)
        sync_path(self._fs, self._base)
        self._delete_dir_if_present(directory)

    def rollback(self, txn: TransactionId) -> None:
        self._delete_dir_if_present(self.staged_dir(txn))

    def pending(self, prefix: str, query: str) -> list[TransactionId]:
        return sorted(self.pending_ages(prefix, query))

    def pending_ages(self, prefix: str, query: str) -> dict[TransactionId, float | None]:
        """:meth:`pending` with the age (s) of each staging directory, oldest first; None on
        object stores, whose directories have no modification time."""
        return staged_ages(self._fs, self._path(STAGING_DIR), pafs.FileType.Directory, "",
                           prefix, query)

    def close(self) -> None:
        """Nothing to release: every file is opened and closed within one call."""

    def maintain(self, prefix: str, query: str, epoch: int,
                 fence: Callable[[], None] = lambda: None) -> None:
        """Finish an interrupted compaction, and compact every ``compact_every`` epochs
        (``fence`` raises if a newer run took over). A failure is logged: the epoch is in."""
        from flinkish_sink.parquet_compaction import Compactor

        compactor = Compactor(self._fs, self._base, prefix, query, self._target_file_size)
        try:
            if self._compact_every and (epoch + 1) % self._compact_every == 0:
                compactor.compact(epoch, fence)
            else:
                compactor.finish_pending(epoch)
        except Exception as exc:  # compaction is an optimisation: the epoch is in
            logger.warning("compacting Parquet target %s failed (the next epoch tries "
                           "again): %s", self._where, exc)

    def readable_files(self) -> list[str]:
        from flinkish_sink.parquet_compaction import readable_files

        return readable_files(self._fs, self._base)

    # -- epoch records -------------------------------------------------------------------------

    def publish_epoch(self, query: str, epoch: int, watermark: int | None, rows: int,
                      late_rows: int, source: str | None = None) -> None:
        """Record that ``epoch`` of ``query`` is committed (once); with ``max_watermark``, the
        largest so far, :meth:`committed_watermark` reads one record (epochs come in order)."""
        directory = self._epochs_dir(query)
        path = f"{directory}/{epoch:09d}.json"
        if self._fs.get_file_info(path).type != pafs.FileType.NotFound:
            return
        self._fs.create_dir(directory, recursive=True)
        previous = self._latest_epoch_record(query)
        earlier = None if previous is None else previous["max_watermark"]
        candidates = [w for w in (watermark, earlier) if w is not None]
        record = {"query": query, "epoch": epoch, "watermark": watermark,
                  "watermark_source": source, "max_watermark": max(candidates, default=None),
                  "rows": rows, "late_rows": late_rows}
        publish_file(self._fs, path, json.dumps(record, sort_keys=True).encode())

    def committed_watermark(self, query: str) -> int | None:
        record = self._latest_epoch_record(query)
        return None if record is None else record["max_watermark"]

    def max_pending(self) -> None:
        """Staged files: no limit on how many wait for the driver."""
        return None

    def _latest_epoch_record(self, query: str) -> dict[str, Any] | None:
        selector = pafs.FileSelector(self._epochs_dir(query), allow_not_found=True)
        latest = max(((int(match[1]), info.path) for info in self._fs.get_file_info(selector)
                      if info.is_file and (match := _EPOCH_RECORD.match(info.base_name))),
                     default=None)
        if latest is None:
            return None
        with self._fs.open_input_stream(latest[1]) as stream:
            record: dict[str, Any] = json.loads(stream.read())
        return record

    def _delete_dir_if_present(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_dir(path)


class ParquetTransaction:
    """One task attempt's staged files, a row group per batch as it arrives."""

    def __init__(self, target: ParquetTarget, txn: TransactionId, schema: pa.Schema):
        self._target = target
        self._txn = txn
        self._schema = schema
        self._dir = target.staged_dir(txn)
        self._files: list[str] = []
        self._writer: pq.ParquetWriter | None = None
        self._file_rows = 0
        self._rows = 0
        self._finished = False
        # a re-run of the same task attempt supersedes what an earlier run staged
        target._fs.create_dir(self._dir, recursive=True)
        target._fs.delete_dir_contents(self._dir, missing_dir_ok=True)

    def write(self, batch: pa.RecordBatch) -> None:
        if self._finished:
            raise RuntimeError(f"transaction {self._txn.gid} is already pre-committed or aborted")
        limit = self._target._max_rows_per_file
        offset = 0
        while offset < batch.num_rows:
            writer = self._writer or self._open_file()
            take = batch.num_rows - offset
            if limit is not None:
                take = min(take, limit - self._file_rows)
            writer.write_batch(batch.slice(offset, take))
            offset += take
            self._file_rows += take
            self._rows += take
            if limit is not None and self._file_rows >= limit:
                self._close_file()

    def pre_commit(self) -> PreCommit:
        if self._finished:
            raise RuntimeError(f"transaction {self._txn.gid} is already pre-committed or aborted")
        self._finished = True
        self._close_file()
        sync_path(self._target._fs, self._dir)
        return PreCommit(self._txn, self._rows, detail={"files": list(self._files)})

    def abort(self) -> None:
        self._finished = True
        try:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        finally:
            self._target.rollback(self._txn)

    def _open_file(self) -> pq.ParquetWriter:
        txn = self._txn
        name = (f"part-{txn.prefix}-{txn.query}-{txn.epoch:09d}-{txn.task:05d}-{txn.attempt}"
                f"-{len(self._files):03d}.parquet")
        writer = self._writer = pq.ParquetWriter(f"{self._dir}/{name}", self._schema,
                                                 filesystem=self._target._fs)
        self._files.append(name)
        self._file_rows = 0
        return writer

    def _close_file(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        sync_path(self._target._fs, f"{self._dir}/{self._files[-1]}")


def schema_differences(existing: pa.Schema, new: pa.Schema) -> list[str]:
    """How ``new`` differs from ``existing`` by column name and type (readers match columns
    by name, Spark reads every column as nullable)."""
    return type_differences({f.name: f.type for f in existing}, {f.name: f.type for f in new},
                            "the existing files")


def _create(options: TargetOptions, late: bool) -> ParquetTarget:
    path = options[LATE_PATH] if late else options[PATH]
    assert path is not None
    return ParquetTarget(path, compact_every=options[COMPACT_EVERY],
                         target_file_size=options[TARGET_FILE_SIZE])


FACTORY = TargetFactory(
    name="parquet",
    title="Parquet",
    doc="Parquet files in a directory, committed by renaming them into place.",
    options=(PATH, COMPACT_EVERY, TARGET_FILE_SIZE, LATE_PATH),
    required={PATH: "a directory or URI"},
    side_output=LATE_PATH,
    check=lambda options: distinct(options, PATH, "place"),
    create=_create,
    cli_option="path",
)
