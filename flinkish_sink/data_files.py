"""The data files a write task stages for a table target (Delta, Iceberg), and the manifests
that find them again.

A table's data files are invisible until the table's log or snapshot references them, so a
task writes them straight to where they will stay. Before it creates each one it lists it in
its transaction's manifest (``_flinkish_staging/<gid>.json`` beside the data), so rolling
back a transaction — also of a task killed mid-write — deletes exactly its files, and
listing the manifests finds every transaction not yet decided without listing the data.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from flinkish_core.locations import delete_file_if_present, sync_path
from flinkish_sink.target import STAGING_DIR, TaskTransaction, TransactionId


def data_file_name(txn: TransactionId | None, token: str, n: int) -> str:
    """The name of the ``n``-th data file of ``txn`` (or, without one, of the direct write
    ``token``): unique per task attempt and run, and sorted by epoch."""
    if txn is None:
        return f"part-direct-{token}-{n:03d}.parquet"
    return (f"part-{txn.prefix}-{txn.query}-{txn.epoch:09d}-{txn.task:05d}-"
            f"{txn.attempt}-{txn.run or 'x'}-{n:03d}.parquet")


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


class Manifests:
    """The staging manifests of the transactions writing data files under ``base``."""

    def __init__(self, filesystem: pafs.FileSystem, base: str) -> None:
        self._fs = filesystem
        self._base = base.rstrip("/")

    def path(self, txn: TransactionId) -> str:
        return f"{self._base}/{STAGING_DIR}/{txn.staged_name}.json"

    def write(self, txn: TransactionId, files: list[str]) -> None:
        """List ``files`` (names under ``base``) as ``txn``'s, atomically and durably: call
        before creating a file, so a crash leaves it findable."""
        manifest = self.path(txn)
        directory = f"{self._base}/{STAGING_DIR}"
        self._fs.create_dir(directory, recursive=True)
        temp = f"{manifest}.{uuid.uuid4().hex}.tmp"
        try:
            with self._fs.open_output_stream(temp) as out:
                out.write(json.dumps({"files": files}).encode())
            sync_path(self._fs, temp)
            self._fs.move(temp, manifest)
        except BaseException:
            delete_file_if_present(self._fs, temp)
            raise
        sync_path(self._fs, directory)

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
        """The files every manifest (of any query) lists: files no table references yet that
        a transaction may still commit or roll back."""
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

    def ages(self, prefix: str, query: str) -> dict[TransactionId, float | None]:
        """The transactions of ``prefix``/``query`` with a manifest, oldest first, with their
        ages in seconds: since the manifest last changed (its last file was begun); None
        where the store keeps no time."""
        selector = pafs.FileSelector(f"{self._base}/{STAGING_DIR}", allow_not_found=True)
        now = time.time()
        found: list[tuple[float, TransactionId, float | None]] = []
        for info in self._fs.get_file_info(selector):
            if not (info.is_file and info.base_name.endswith(".json")):
                continue
            txn = TransactionId.from_staged_name(info.base_name[:-5])
            if txn is not None and txn.prefix == prefix and txn.query == query:
                age = None if info.mtime_ns is None else max(0.0, now - info.mtime_ns / 1e9)
                found.append((-1.0 if age is None else -age, txn, age))
        return {txn: age for _, txn, age in sorted(found)}


class StagedFiles(TaskTransaction, Protocol):
    """A transaction writing data files (see :class:`StagedFilesTarget`)."""

    def close_files(self) -> list[dict[str, Any]]:
        """Close and fsync the files: what the table's commit needs to know of each."""


class StagedFilesTarget:
    """What a table target whose tasks stage data files does alike, through its
    :attr:`manifests`: unreferenced files are invisible and lock nothing, any number may
    wait for the driver, and a transaction is found and rolled back by its manifest."""

    #: unreferenced data files are invisible and lock nothing
    leftovers_block_writes = False
    pending_consequence = "its staged files wait, taking space"
    #: the app id option (``delta.appId``, ``iceberg.appId``); None: the query's id
    _app_id: str | None = None

    def app_id(self, query: str) -> str:
        """The app id the epochs of ``query`` commit under (Delta's ``txn``, Iceberg's snapshot
        summary): the option, or the query's id, stable across restarts and one per query."""
        return self._app_id or query

    @property
    def manifests(self) -> Manifests:
        raise NotImplementedError

    def begin_transaction(self, txn: TransactionId | None, schema: pa.Schema) -> StagedFiles:
        """The data files of task attempt ``txn`` or, with None, of a direct write."""
        raise NotImplementedError

    def _commit_direct(self, files: list[dict[str, Any]]) -> None:
        """Commit a direct write's ``files`` (from :meth:`StagedFiles.close_files`) at once,
        as a table version of their own."""
        raise NotImplementedError

    def write_direct(self, batch: pa.RecordBatch) -> None:
        """Write the rows to new files and commit them at once, as a table version of their
        own (at-least-once: a replayed epoch writes them again)."""
        if batch.num_rows == 0:
            return
        transaction = self.begin_transaction(None, batch.schema)
        transaction.write(batch)
        self._commit_direct(transaction.close_files())

    def rollback(self, txn: TransactionId) -> None:
        """Delete the transaction's files (which the table does not reference: the protocol
        never rolls back a decided transaction) and its manifest."""
        self.manifests.rollback(txn)

    def pending(self, prefix: str, query: str) -> list[TransactionId]:
        """Transactions of ``prefix``/``query`` that still have a manifest."""
        return sorted(self.pending_ages(prefix, query))

    def pending_ages(self, prefix: str, query: str) -> dict[TransactionId, float | None]:
        """:meth:`pending` with each one's age in seconds: since its manifest last changed
        (its last file was begun), oldest first; None where the store keeps no time."""
        return self.manifests.ages(prefix, query)

    def max_pending(self) -> None:
        """Unreferenced files: no limit on how many wait for the driver."""
        return None
