"""Parquet files as a two-phase-commit target.

Flink's ``FileSink`` pre-commits by closing "in-progress" part files under a hidden name and
commits by renaming them into place; this is the same idea on any ``pyarrow.fs`` filesystem.

Layout under the target directory ``path``::

    part-<prefix>-<query>-<epoch:09d>-<task:05d>-<attempt>-<n:03d>.parquet   committed data
    part-direct-<uuid>.parquet                                              at-least-once data
    _flinkish_staging/<prefix>~<query>~<epoch>~<task>~<attempt>/<part file> staged (pre-committed)
    _flinkish_staging/_direct/<part file>                                   write_direct temp
    _flinkish_epochs/<query>/<epoch:09d>.json                               epoch commit records
    part-<prefix>-<query>-<epoch:09d>-c<token>-<n:03d>.parquet               compacted data
    _flinkish_compactions/<id>.json, _flinkish_compactions/_staging/<id>/   compaction state

Committed files sit flat under ``path`` (no ``epoch=N`` directories) so that Spark's partition
discovery does not add a column the query never produced. Everything else lives under names
starting with ``_``, which ``spark.read.parquet`` and ``pyarrow.dataset`` (``ignore_prefixes``
``['.', '_']``) both skip, so readers never see staged (undecided) files, temp files or epoch
records, and the files of a rolled-back transaction never appear.

What a reader listing ``path`` can observe: every file appears whole (written and fsynced
before it is renamed), but an epoch does *not* appear atomically. The driver commits the
epoch's transactions one after another and renames each transaction's files one by one, so a
reader listing the directory while an epoch commits -- or after the driver crashed mid-commit,
until the restarted query's replay finishes that commit -- sees part of the epoch: the
transactions committed so far and a prefix of the files of the one being committed. The
epoch's record ``_flinkish_epochs/<query>/<epoch:09d>.json`` is written only after every file
the epoch decided is in place. A reader that must never see a partial epoch should therefore
read only the files whose ``<query>`` and ``<epoch:09d>`` (both in the file name) have an epoch
record. A late-data side output (``lateData=side``) gets no epoch records of its own: its
files of epoch N are all in place once the main target holds the record of epoch N, which is
published after the side output's commits too. ``part-direct-*`` files
(``deliveryGuarantee=at-least-once``) belong to no transaction: each appears as soon as its
task writes it, before the epoch is decided, and a replayed epoch may write its rows again.

Committed names follow from the transaction id (and a file number), so committing is a rename
that can be repeated: a staged file that is gone while its committed name exists was moved
before. A
staging directory name is ``txn.gid`` with ``:`` (not allowed on every filesystem) replaced by
``~``, which no id part can contain, so :meth:`ParquetTarget.pending` reverses it exactly.

Every ``parquet.compactEvery`` epochs the driver merges a query's small committed files into
files of up to ``parquet.targetFileSize`` (:mod:`flinkish_sink.parquet_compaction`, which
also says how a reader gets a consistent view: :meth:`ParquetTarget.readable_files`).

A transaction that wrote no rows stages and commits no file at all: an empty epoch leaves the
data unchanged, and its epoch record still says it is in. (So until the first rows are
committed, ``spark.read.parquet(path)`` has no file to infer a schema from and needs one given.)
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
from flinkish_sink.target import EPOCHS_DIR, STAGING_DIR, PreCommit, TransactionId
from flinkish_sink.targets import TargetFactory

logger = logging.getLogger(__name__)

#: The size Parquet compaction merges files up to (Spark's Delta ``OPTIMIZE`` aims at 1 GB,
#: Iceberg at 512 MB; a stream's files are read as they come, so smaller).
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
_QUERY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_EPOCH_RECORD = re.compile(r"^(\d+)\.json$")


class ParquetTarget:
    """Directory of Parquet files with staged-then-renamed commits.

    Holds only a pyarrow filesystem (picklable) and paths, so it ships to Spark tasks as is.
    """

    #: a staged file is invisible and locks nothing
    leftovers_block_writes = False
    pending_consequence = "its staged files wait, taking space"

    def __init__(self, path: str | os.PathLike[str], *, max_rows_per_file: int | None = None,
                 compact_every: int = 0, target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
                 filesystem: pafs.FileSystem | None = None):
        """``path`` is a local directory or a URI ``pyarrow.fs.FileSystem.from_uri`` knows
        (``file://``, ``s3://``, ``gs://``, ``hdfs://``), or, with ``filesystem``, a path in
        it. ``max_rows_per_file`` rolls a transaction over to a new file after that many rows
        (None: one file per transaction). ``compact_every``: merge a query's small committed
        files into files of up to ``target_file_size`` bytes after every that many epochs (0:
        never; see :mod:`flinkish_sink.parquet_compaction`)."""
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

    @classmethod
    def from_filesystem(cls, filesystem: pafs.FileSystem, base_path: str, **options: Any
                        ) -> ParquetTarget:
        """A target on an already-built filesystem (tests, custom credentials)."""
        return cls(base_path, filesystem=filesystem, **options)

    def __repr__(self) -> str:
        return f"ParquetTarget({self._where!r})"

    # -- paths ---------------------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return "/".join((self._base, *parts))

    def staged_dir(self, txn: TransactionId) -> str:
        """Where the files of ``txn`` wait for the commit."""
        return self._path(STAGING_DIR, txn.staged_name)

    def _epochs_dir(self, query: str) -> str:
        if not _QUERY_NAME.match(query) or query in (".", ".."):
            raise ValueError(
                f"query name {query!r} must be letters, digits, '_', '.' and '-', "
                "and not '.' or '..'"
            )
        return self._path(EPOCHS_DIR, query)

    # -- Target --------------------------------------------------------------------------------

    def _first_data_file(self) -> str | None:
        """The file whose schema a reader of the directory takes (``pyarrow.dataset``'s
        discovery: the first in path order, leaving out names starting with ``_`` or ``.`` at
        any level). Found without ``pyarrow.dataset``, whose import (it pulls in pandas) costs
        the driver's writer start, on the restart path, most of a second."""
        selector = pafs.FileSelector(self._base, recursive=True)
        prefix = len(self._base.rstrip("/")) + 1
        files = sorted(
            info.path for info in self._fs.get_file_info(selector)
            if info.type == pafs.FileType.File and not any(
                part.startswith(("_", ".")) for part in info.path[prefix:].split("/"))
        )
        return files[0] if files else None

    def check(self, schema: pa.Schema) -> None:
        """Create the directory, or make sure the files already in it hold ``schema``.

        Compares against the schema a reader of the directory sees, so a mismatch is caught at
        query start rather than as an unreadable mix of files later.
        """
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
                + "; ".join(differences)
            )

    def begin_transaction(self, txn: TransactionId, schema: pa.Schema) -> ParquetTransaction:
        return ParquetTransaction(self, txn, schema)

    def write_direct(self, batch: pa.RecordBatch) -> None:
        """Write one visible file, under a unique name, appearing whole (temp file + rename)."""
        if batch.num_rows == 0:
            return
        name = f"part-direct-{uuid.uuid4().hex}.parquet"
        temp = self._path(STAGING_DIR, _DIRECT_DIR, name)
        self._fs.create_dir(self._path(STAGING_DIR, _DIRECT_DIR), recursive=True)
        try:
            with pq.ParquetWriter(temp, batch.schema, filesystem=self._fs) as writer:
                writer.write_batch(batch)
            self._sync(temp)
            self._fs.move(temp, self._path(name))
        except BaseException:
            delete_file_if_present(self._fs, temp)
            raise
        self._sync(self._base)

    def commit(self, pre_commit: PreCommit) -> None:
        """Rename the staged files into place, then drop the staging directory.

        Every file is checked before any is moved, so a transaction whose files were deleted
        behind our back fails whole instead of half-appearing. On S3/GCS a move is a copy and a
        delete, but the committed object still appears whole, never partially written.
        """
        txn = pre_commit.txn
        names = [str(name) for name in pre_commit.listed("files", "ParquetTarget")]
        directory = self.staged_dir(txn)
        staged = [f"{directory}/{name}" for name in names]
        final = [self._path(name) for name in names]
        infos = self._fs.get_file_info(staged + final)
        staged_present = [i.type != pafs.FileType.NotFound for i in infos[: len(names)]]
        final_present = [i.type != pafs.FileType.NotFound for i in infos[len(names) :]]
        lost = [
            name
            for name, s, f in zip(names, staged_present, final_present, strict=True)
            if not (s or f)
        ]
        if lost:
            raise RuntimeError(
                f"cannot commit {txn.gid} to {self._where!r}: files {lost} are neither staged in "
                f"{directory!r} nor committed; they were removed outside flinkish"
            )
        for source, dest, present in zip(staged, final, staged_present, strict=True):
            if present:
                self._fs.move(source, dest)
        self._sync(self._base)
        self._delete_dir_if_present(directory)

    def rollback(self, txn: TransactionId) -> None:
        self._delete_dir_if_present(self.staged_dir(txn))

    def pending(self, prefix: str, query: str) -> list[TransactionId]:
        """Transactions of ``prefix``/``query`` that still have a staging directory."""
        return sorted(self.pending_ages(prefix, query))

    def pending_ages(self, prefix: str, query: str) -> dict[TransactionId, float | None]:
        """:meth:`pending` with each one's age in seconds: since its staging directory last
        changed (the last staged file was written there, i.e. the pre-commit), oldest first;
        None on object stores, whose directories have no modification time."""
        return staged_ages(self._fs, self._path(STAGING_DIR), pafs.FileType.Directory, "",
                           prefix, query)

    def close(self) -> None:
        """Nothing to release: every file is opened and closed within one call."""

    def maintain(
        self, prefix: str, query: str, epoch: int, fence: Callable[[], None] = lambda: None
    ) -> None:
        """After epoch ``epoch`` of ``prefix``/``query`` completed: finish a compaction a
        crash interrupted, and compact every ``compact_every`` epochs (``fence`` raises if a
        newer run took over: called before a compaction is decided). A failure is logged,
        not raised: the epoch is committed, and the next epoch tries again."""
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
        """The committed data files to read for a consistent view: whole epochs, and each
        compaction's inputs or outputs, never both (see
        :func:`flinkish_sink.parquet_compaction.readable_files`)."""
        from flinkish_sink.parquet_compaction import readable_files

        return readable_files(self._fs, self._base)

    # -- epoch records -------------------------------------------------------------------------

    def publish_epoch(
        self, query: str, epoch: int, watermark: int | None, rows: int, late_rows: int,
        source: str | None = None,
    ) -> None:
        """Record that ``epoch`` of ``query`` is committed, so consumers can ask how far the
        data is complete. Republishing an epoch changes nothing.

        Each record also carries ``max_watermark`` (the largest watermark so far, carried over from
        the newest record before it), so :meth:`committed_watermark` reads one record, not
        all of them. That relies on epochs being published in order, as the driver commits
        them.
        """
        directory = self._epochs_dir(query)
        path = f"{directory}/{epoch:09d}.json"
        if self._fs.get_file_info(path).type != pafs.FileType.NotFound:
            return
        self._fs.create_dir(directory, recursive=True)
        previous = self._latest_epoch_record(query)
        earlier = None if previous is None else previous["max_watermark"]
        candidates = [w for w in (watermark, earlier) if w is not None]
        record = {
            "query": query,
            "epoch": epoch,
            "watermark": watermark,
            "watermark_source": source,
            "max_watermark": max(candidates) if candidates else None,
            "rows": rows,
            "late_rows": late_rows,
        }
        publish_file(self._fs, path, json.dumps(record, sort_keys=True).encode())

    def committed_watermark(self, query: str) -> int | None:
        """The largest watermark of any published epoch of ``query`` (None: none yet)."""
        record = self._latest_epoch_record(query)
        return None if record is None else record["max_watermark"]

    def max_pending(self) -> None:
        """Staged files: no limit on how many wait for the driver."""
        return None

    def _latest_epoch_record(self, query: str) -> dict[str, Any] | None:
        selector = pafs.FileSelector(self._epochs_dir(query), allow_not_found=True)
        latest: tuple[int, str] | None = None
        for info in self._fs.get_file_info(selector):
            match = _EPOCH_RECORD.match(info.base_name)
            if match and info.is_file and (latest is None or int(match[1]) > latest[0]):
                latest = (int(match[1]), info.path)
        if latest is None:
            return None
        with self._fs.open_input_stream(latest[1]) as stream:
            record: dict[str, Any] = json.loads(stream.read())
        return record

    # -- helpers -------------------------------------------------------------------------------

    def _delete_dir_if_present(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_dir(path)

    def _sync(self, path: str) -> None:
        sync_path(self._fs, path)


class ParquetTransaction:
    """One task attempt's staged files, written as the batches arrive.

    Each batch goes straight to a ``ParquetWriter`` (one row group per batch), so memory holds
    at most one batch however many rows the task writes.
    """

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
        # A re-run of the same task attempt id supersedes whatever an earlier run staged.
        target._fs.create_dir(self._dir, recursive=True)
        target._fs.delete_dir_contents(self._dir, missing_dir_ok=True)

    def write(self, batch: pa.RecordBatch) -> None:
        if self._finished:
            raise RuntimeError(f"transaction {self._txn.gid} is already pre-committed or aborted")
        limit = self._target._max_rows_per_file
        offset = 0
        while offset < batch.num_rows:
            if self._writer is None:
                self._open_file()
            assert self._writer is not None
            take = batch.num_rows - offset
            if limit is not None:
                take = min(take, limit - self._file_rows)
            self._writer.write_batch(batch.slice(offset, take))
            offset += take
            self._file_rows += take
            self._rows += take
            if limit is not None and self._file_rows >= limit:
                self._close_file()

    def pre_commit(self) -> PreCommit:
        """Close and fsync the staged files; the driver now decides their fate."""
        if self._finished:
            raise RuntimeError(f"transaction {self._txn.gid} is already pre-committed or aborted")
        self._finished = True
        self._close_file()
        self._target._sync(self._dir)
        return PreCommit(self._txn, self._rows, detail={"files": list(self._files)})

    def abort(self) -> None:
        self._finished = True
        try:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        finally:
            self._target.rollback(self._txn)

    def _open_file(self) -> None:
        txn = self._txn
        name = (
            f"part-{txn.prefix}-{txn.query}-{txn.epoch:09d}-{txn.task:05d}-{txn.attempt}"
            f"-{len(self._files):03d}.parquet"
        )
        self._writer = pq.ParquetWriter(
            f"{self._dir}/{name}", self._schema, filesystem=self._target._fs
        )
        self._files.append(name)
        self._file_rows = 0

    def _close_file(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        self._target._sync(f"{self._dir}/{self._files[-1]}")


def schema_differences(existing: pa.Schema, new: pa.Schema) -> list[str]:
    """How ``new`` differs from ``existing`` by column name and type.

    Order, nullability and metadata are ignored: Parquet readers match columns by name and
    Spark reads every column as nullable.
    """
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
