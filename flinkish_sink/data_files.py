"""The data files a task writes for a table target (Delta, Iceberg) and what file targets share.

A table's files are invisible until its log references them, so a task writes them where they
stay, each listed first in its transaction's manifest (``_flinkish_staging/<gid>.json``): a
rollback, also of a killed task, deletes exactly its files.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from flinkish_core.locations import delete_file_if_present, sync_path
from flinkish_sink.target import STAGING_DIR, PreCommit, TransactionId
from flinkish_sink.window_columns import table_batch


def data_file_name(txn: TransactionId | None, token: str, n: int) -> str:
    """The ``n``-th data file of ``txn`` (or direct write ``token``), sorted by epoch."""
    if txn is None:
        return f"part-direct-{token}-{n:03d}.parquet"
    return (f"part-{txn.prefix}-{txn.query}-{txn.epoch:09d}-{txn.task:05d}-"
            f"{txn.attempt}-{txn.run or 'x'}-{n:03d}.parquet")


def publish_file(filesystem: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` at ``path`` whole or not at all, durably (fsynced temp file, rename)."""
    directory, name = path.rsplit("/", 1)
    temp = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        with filesystem.open_output_stream(temp) as out:
            out.write(data)
        sync_path(filesystem, temp)
        filesystem.move(temp, path)
    except BaseException:
        delete_file_if_present(filesystem, temp)
        raise
    sync_path(filesystem, directory)


def split_by_partition(batch: pa.RecordBatch, columns: tuple[str, ...]
                       ) -> Iterator[tuple[dict[str, Any], pa.RecordBatch]]:
    """The batch's rows by their values of ``columns`` (NULL a value of its own)."""
    if not columns:
        yield {}, batch
        return
    keys = pa.Table.from_batches([batch]).select(list(columns))
    for key in keys.group_by(list(columns)).aggregate([]).to_pylist():
        mask = None
        for name in columns:
            column = batch.column(name)
            test = (pc.is_null(column) if key[name] is None
                    else pc.fill_null(pc.equal(column, pa.scalar(key[name], column.type)), False))
            mask = test if mask is None else pc.and_(mask, test)
        yield key, batch.filter(mask)


def type_differences(existing: Mapping[str, Any], new: Mapping[str, Any], where: str,
                     shown: Callable[[Any], str] = str) -> list[str]:
    """How the column types ``new`` (name -> type) differ from those ``existing`` in ``where``."""
    differences = []
    missing = [name for name in existing if name not in new]
    if missing:
        differences.append(f"columns only in {where}: {missing}")
    added = [name for name in new if name not in existing]
    if added:
        differences.append(f"columns only in the new schema: {added}")
    differences.extend(
        f"column {name!r} is {shown(existing[name])} in {where} but {shown(new[name])} now"
        for name in existing if name in new and existing[name] != new[name])
    return differences


class Manifests:
    """The staging manifests of the transactions writing data files under ``base``."""

    def __init__(self, filesystem: pafs.FileSystem, base: str) -> None:
        self._fs = filesystem
        self._base = base.rstrip("/")

    def path(self, txn: TransactionId) -> str:
        return f"{self._base}/{STAGING_DIR}/{txn.staged_name}.json"

    def write(self, txn: TransactionId, files: list[str]) -> None:
        """List ``files`` as ``txn``'s, before creating one, so a crash leaves it findable."""
        self._fs.create_dir(f"{self._base}/{STAGING_DIR}", recursive=True)
        publish_file(self._fs, self.path(txn), json.dumps({"files": files}).encode())

    def rollback(self, txn: TransactionId) -> None:
        """Delete ``txn``'s files and its manifest (idempotent)."""
        manifest = self.path(txn)
        try:
            with self._fs.open_input_stream(manifest) as stream:
                files = json.loads(stream.read())["files"]
        except FileNotFoundError:
            return
        for name in files:
            delete_file_if_present(self._fs, f"{self._base}/{name}")
        delete_file_if_present(self._fs, manifest)

    def named(self) -> set[str]:
        """The files every manifest (of any query) lists: not to be vacuumed."""
        selector = pafs.FileSelector(f"{self._base}/{STAGING_DIR}", allow_not_found=True)
        names: set[str] = set()
        for info in self._fs.get_file_info(selector):
            if info.is_file and info.base_name.endswith(".json"):
                with contextlib.suppress(FileNotFoundError, ValueError, KeyError), \
                        self._fs.open_input_stream(info.path) as stream:
                    names.update(json.loads(stream.read())["files"])
        return names

    def drop(self, txn: TransactionId) -> None:
        """Forget ``txn`` (its files are the table's now)."""
        delete_file_if_present(self._fs, self.path(txn))


def staged_ages(filesystem: pafs.FileSystem, directory: str, kind: pafs.FileType, suffix: str,
                prefix: str, query: str) -> dict[TransactionId, float | None]:
    """The transactions of ``prefix``/``query`` staged in ``directory`` as entries of ``kind``,
    oldest first, with their ages in seconds (None where the store keeps no time)."""
    now = time.time()
    found: list[tuple[float, TransactionId, float | None]] = []
    for info in filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
        if info.type != kind or not info.base_name.endswith(suffix):
            continue
        txn = TransactionId.from_staged_name(info.base_name[:len(info.base_name) - len(suffix)])
        if txn is not None and txn.prefix == prefix and txn.query == query:
            age = None if info.mtime_ns is None else max(0.0, now - info.mtime_ns / 1e9)
            found.append((-1.0 if age is None else -age, txn, age))
    return {txn: age for _, txn, age in sorted(found)}


class DataFile:
    """One data file being written, with its rows' partition values."""

    def __init__(self, name: str, partition: dict[str, Any], writer: pq.ParquetWriter) -> None:
        self.name, self.partition, self.writer, self.rows = name, partition, writer, 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)
        self.rows += batch.num_rows


class StagedFiles:
    """One task attempt's data files (``txn`` None: a direct write's), one per partition
    value; a table target's subclass says which rows its table refuses, how it opens a file
    and how the commit names one."""

    #: the key of the files' descriptions in the pre-commit's detail
    detail_key = "files"

    def __init__(self, target: StagedFilesTarget, txn: TransactionId | None,
                 schema: pa.Schema) -> None:
        self._target = target
        self._txn = txn
        self._schema = schema
        self._partitions = target.partition_columns()
        self._open: dict[tuple[Any, ...], DataFile] = {}
        self._files: list[str] = []
        self._rows = 0
        self._finished = False
        self._token = uuid.uuid4().hex if txn is None else ""
        if txn is not None:
            # a re-run of the same task attempt supersedes what an earlier run wrote
            target.rollback(txn)

    def _refuse(self, batch: pa.RecordBatch) -> None:
        """Raise for rows the table refuses (a NULL in a NOT NULL column)."""

    def _new_file(self, name: str, partition: dict[str, Any]) -> DataFile:
        """Open data file ``name`` for rows of ``partition`` (column -> value)."""
        raise NotImplementedError

    def _described(self, data: DataFile, size: int) -> dict[str, Any]:
        """What the table's commit needs to know of closed file ``data`` of ``size`` bytes."""
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._finished:
            gid = "direct" if self._txn is None else self._txn.gid
            raise RuntimeError(f"transaction {gid} is already pre-committed or aborted")

    def write(self, batch: pa.RecordBatch) -> None:
        self._check_open()
        batch = table_batch(batch)
        self._refuse(batch)
        for key, rows in split_by_partition(batch, self._partitions):
            self._file(key).write(pa.RecordBatch.from_arrays(
                [rows.column(f.name) for f in self._schema], schema=self._schema))
            self._rows += rows.num_rows

    def _file(self, key: dict[str, Any]) -> DataFile:
        values = tuple(key[n] for n in self._partitions)
        if values not in self._open:
            name = data_file_name(self._txn, self._token, len(self._files))
            self._files.append(name)
            if self._txn is not None:
                self._target.manifests.write(self._txn, self._files)
            self._open[values] = self._new_file(name, key)
        return self._open[values]

    def pre_commit(self) -> PreCommit:
        assert self._txn is not None, "a direct write has no transaction to pre-commit"
        return PreCommit(self._txn, self._rows, detail={self.detail_key: self.close_files()})

    def close_files(self) -> list[dict[str, Any]]:
        """Close and fsync the files: what the table's commit needs to know of each."""
        self._check_open()
        self._finished = True
        filesystem, base = self._target.files()
        for data in self._open.values():
            data.writer.close()
            sync_path(filesystem, f"{base}/{data.name}")
        sizes = filesystem.get_file_info([f"{base}/{d.name}" for d in self._open.values()])
        files = [self._described(data, info.size)
                 for data, info in zip(self._open.values(), sizes, strict=True)]
        self._open.clear()
        sync_path(filesystem, base)
        return files

    def abort(self) -> None:
        self._finished = True
        try:
            for data in self._open.values():
                data.writer.close()
            self._open.clear()
        finally:
            if self._txn is not None:
                self._target.rollback(self._txn)


class StagedFilesTarget:
    """What table targets whose tasks write unreferenced data files share."""

    #: unreferenced data files are invisible and lock nothing
    leftovers_block_writes = False
    pending_consequence = "its staged files wait, taking space"
    #: the app id option (``delta.appId``, ``iceberg.appId``); None: the query's id
    _app_id: str | None = None

    def app_id(self, query: str) -> str:
        """The app id the epochs of ``query`` commit under: the option, or the query's id."""
        return self._app_id or query

    #: the table in messages (``Delta table 'path'``)
    title = ""
    #: the table's own cleanup that could delete files a decided epoch names
    cleanup = ""

    def files(self) -> tuple[pafs.FileSystem, str]:
        """The filesystem of the table's data files and their directory in it."""
        raise NotImplementedError

    def partition_columns(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def manifests(self) -> Manifests:
        return Manifests(*self.files())

    def begin_transaction(self, txn: TransactionId | None, schema: pa.Schema) -> StagedFiles:
        """The data files of task attempt ``txn`` or, with None, of a direct write."""
        raise NotImplementedError

    def _check_fit(self, table: Mapping[str, Any], stream: Mapping[str, Any],
                   shown: Callable[[Any], str] = str) -> None:
        """Raise unless the table's column types (name -> type) are the stream's."""
        problems = type_differences(table, stream, "the table", shown)
        if problems:
            raise ValueError(
                f"{self.title} does not fit the stream's schema: " + "; ".join(problems)
                + " (a window column w is stored as w_start and w_end). Write to a new "
                "table, or change the query to produce the table's columns")

    def _check_partitioning(self, table: tuple[str, ...], wanted: tuple[str, ...]) -> None:
        """Raise unless the table is partitioned by ``partitionBy``'s columns (if given)."""
        if wanted and table != wanted:
            raise ValueError(
                f"option partitionBy: {self.title} is partitioned by {list(table)}, not "
                f"{list(wanted)}; give its partition columns (or leave the option out to take "
                "the table's)")

    def _check_present(self, names: list[str], epoch: int | None) -> None:
        """Raise unless every data file an epoch's commit adds is there."""
        filesystem, base = self.files()
        infos = filesystem.get_file_info([f"{base}/{name}" for name in names])
        lost = [name for name, info in zip(names, infos, strict=True)
                if info.type == pafs.FileType.NotFound]
        if lost:
            raise RuntimeError(
                f"cannot commit epoch {'-' if epoch is None else epoch} to {self.title}: its "
                f"files {lost} are gone; they were removed outside flinkish ({self.cleanup} "
                "with a retention shorter than the time the query was down?)")

    def _commit_direct(self, files: list[dict[str, Any]]) -> None:
        """Commit a direct write's ``files`` at once, as a table version of their own."""
        raise NotImplementedError

    def write_direct(self, batch: pa.RecordBatch) -> None:
        """Write the rows to new files and commit them at once (at-least-once)."""
        if batch.num_rows == 0:
            return
        transaction = self.begin_transaction(None, batch.schema)
        transaction.write(batch)
        self._commit_direct(transaction.close_files())

    def rollback(self, txn: TransactionId) -> None:
        """Delete the transaction's files and manifest (never decided, so unreferenced)."""
        self.manifests.rollback(txn)

    def pending(self, prefix: str, query: str) -> list[TransactionId]:
        return sorted(self.pending_ages(prefix, query))

    def pending_ages(self, prefix: str, query: str) -> dict[TransactionId, float | None]:
        filesystem, base = self.files()
        return staged_ages(filesystem, f"{base.rstrip('/')}/{STAGING_DIR}", pafs.FileType.File,
                           ".json", prefix, query)

    def max_pending(self) -> None:
        """Unreferenced files: no limit on how many wait for the driver."""
        return None
