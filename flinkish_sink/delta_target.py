"""Delta Lake tables as an epoch target, through delta-rs (the ``deltalake`` package: no JVM).

Write tasks write Parquet data files straight into the table's directory: a file the log does
not reference is invisible to every Delta reader, so nothing is staged or moved. A task
pre-commits by returning the add actions of its files (path, size, partition values,
statistics); the driver commits all of an epoch's add actions as **one** table version whose
``txn`` action is (``appId``, epoch) — what Spark's Delta sink does with (query id, batch id)
and Flink's Delta sink with the checkpoint id. So an epoch appears whole or not at all, and
readers see one version per epoch. A replay of an epoch the table already holds
(``txn`` version of the app id >= the epoch) commits nothing; the replay's own files are
deleted as any undecided transaction's are. The commit's ``userMetadata`` carries the epoch's
record (combined watermark, its source, status, idle partitions, rows, late rows), which
``DESCRIBE HISTORY`` and ``DeltaTable.history()`` show; an epoch without rows still commits a
version (with no files), so the watermark moves on in the table's history.

Layout under the table's directory::

    part-<prefix>-<query>-<epoch:09d>-<task:05d>-<attempt>-<run>-<n:03d>.parquet  data files
    part-direct-<uuid>-<n:03d>.parquet                      at-least-once data (committed at once)
    _delta_log/                                             the table's log
    _flinkish_staging/<gid with ':' as '~'>.json            a transaction's files, until decided

Data files sit flat in the table's directory, also in a partitioned table: Delta takes a file's
partition values from its add action, not from its path, and the partition columns are not
stored in the files (as Delta's own writers do). A transaction lists each file in its
manifest under ``_flinkish_staging`` before creating it, so rolling back a transaction —
also of a task killed mid-write — deletes exactly its files; the manifest goes once the
epoch's version is committed or the transaction rolled back. ``VACUUM`` leaves ``_``
directories alone.

With an upsert key (``upsertKey``) an epoch's rows replace the table's rows of the same key
(a window's later pane its earlier one): the driver reads the epoch's decided files and merges
them into the table (delta-rs ``MERGE``, NULL keys matching) as the epoch's one version, with
the same ``txn`` and record; the tasks' files, never referenced, are then deleted.

The commit of add actions checks no rows, so a write task checks its own against the table's
``NOT NULL`` columns and ``CHECK`` constraints before it pre-commits
(:mod:`flinkish_sink.table_constraints`): a decision never names a row the table refuses.

Two runs of one query (a zombie driver) cannot both commit an epoch: the checkpoint store
fences the older one, and delta-rs refuses a commit whose app id another commit set since
it read the table (``CommitFailedError``), after which the table's ``txn`` says whether the
epoch is in. Other writers' appends to the same table are retried by delta-rs (optimistic
concurrency).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from flinkish_core.config import Option, duration_ms, whole_number
from flinkish_core.errors import OptionError
from flinkish_core.locations import delete_file_if_present, filesystem_of
from flinkish_core.secrets import mask_uri
from flinkish_sink.data_files import (
    DataFile,
    StagedFiles,
    StagedFilesTarget,
    check_columns,
)
from flinkish_sink.delta_stats import FileStats
from flinkish_sink.options import (
    LATE_PATH,
    PARTITION_BY,
    PATH,
    UPSERT_KEY,
    TargetOptions,
    app_id,
    distinct,
)
from flinkish_sink.table_constraints import (
    Check,
    TableRules,
    UnsupportedCheck,
    compile_check,
)
from flinkish_sink.target import EpochRecord, PreCommit, TransactionId
from flinkish_sink.targets import TargetFactory
from flinkish_sink.window_columns import table_schema

logger = logging.getLogger(__name__)

_HOUR_MS = 3_600_000


def _retention_hours(key: str, value: str) -> int:
    retention_ms = duration_ms(key, value)
    if retention_ms < _HOUR_MS:
        raise OptionError(
            f"option {key}: {value!r} is under an hour; it must be longer than the query can "
            "ever be down (files of an epoch not yet committed would be deleted), e.g. "
            "'7 days'")
    return -(-retention_ms // _HOUR_MS)


APP_ID: Option[str | None] = Option(
    "delta.appId", app_id, None, shown_default="the query's id",
    doc="The app id of the table's `txn` actions; the query's id is kept in "
        "`checkpointLocation`, stable across restarts and different per query.")
#: Commits that add data (about epochs) between compactions of a Delta table: with a few
#: write tasks an epoch adds a few small files, so a partition holds at most a few hundred
#: before they are rewritten.
COMPACT_EVERY = Option(
    "delta.compactEvery", whole_number(0, "a whole number of epochs (0: never compact)"), 50,
    doc="Compact the table's small files once that many commits added data since its last "
        "compaction, about every that many epochs (`0`: never).")
VACUUM_RETENTION: Option[int | None] = Option(
    "delta.vacuumRetention", _retention_hours, None, shown_default="never",
    doc="After compacting, delete the files no version references (those never referenced "
        "too, e.g. of a killed compaction) older than this duration (at least an hour, e.g. "
        "`7 days`).")

#: The key of the epoch's record in a commit's ``userMetadata`` JSON.
RECORD_KEY = "flinkish"

#: The partition columns of the tables this process has checked, by table URI: Spark builds
#: the writer (and its target) anew every micro-batch, and a target that knows them spares
#: each write task a read of the table's log.
_PARTITIONS_SEEN: dict[str, tuple[str, ...]] = {}

#: The NOT NULL columns and CHECK constraints of the tables this process has checked, by URI
#: (as :data:`_PARTITIONS_SEEN`): the write tasks refuse the rows the table would.
_RULES_SEEN: dict[str, TableRules] = {}
#: What a NOT NULL column's error says to lift the rule.
_DROP_NOT_NULL = "ALTER TABLE … ALTER COLUMN … DROP NOT NULL"
_CONSTRAINT_KEY = "delta.constraints."
_INVARIANTS_KEY = "delta.invariants"

#: The tables this process has open, by URI and storage options. Spark builds the writer (and
#: its target) anew every micro-batch, in one long-lived process on the driver: a handle kept
#: across micro-batches catches up by reading only the log's commits since
#: (``update_incremental``), where a new one would replay the log from its last checkpoint
#: at every epoch (up to ``delta.checkpointInterval`` commits, 100 by default). A handle is
#: used under :data:`_TABLES_LOCK`, from the read it is brought up to date by to the commit
#: made against that read.
_TABLES: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
#: Per table (as :data:`_TABLES`): the version up to which this process counted the commits
#: since the table's last compaction, and their number.
_SINCE_COMPACTION: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, int]] = {}
_TABLES_LOCK = threading.RLock()

#: The Arrow types a partition column may have.
_PARTITION_TYPES = (
    pa.types.is_string, pa.types.is_large_string, pa.types.is_integer, pa.types.is_boolean,
    pa.types.is_date32, pa.types.is_timestamp,
)


def delta_location(location: str) -> tuple[str, dict[str, str]]:
    """The table URI and delta-rs storage options for ``location``: a local path, or a URI
    in the form the Parquet target takes (``s3://bucket/path?endpoint_override=host:port&
    scheme=http&region=…``), whose query becomes delta-rs' object store options. Credentials
    come from the environment (``AWS_ACCESS_KEY_ID`` …) or the URI's user info, as for
    pyarrow."""
    if "://" not in location:
        return location, {}
    parts = urllib.parse.urlsplit(location)
    query = dict(urllib.parse.parse_qsl(parts.query))
    options: dict[str, str] = {}
    if parts.scheme == "s3":
        scheme = query.get("scheme", "https")
        if "endpoint_override" in query:
            options["AWS_ENDPOINT_URL"] = f"{scheme}://{query['endpoint_override']}"
        if scheme == "http":
            options["AWS_ALLOW_HTTP"] = "true"
        if "region" in query:
            options["AWS_REGION"] = query["region"]
        # two writers creating the same log entry: only one may win (If-None-Match)
        options["AWS_CONDITIONAL_PUT"] = "etag"
        if parts.username and parts.password:  # s3://key:secret@bucket/…, as pyarrow takes
            options["AWS_ACCESS_KEY_ID"] = urllib.parse.unquote(parts.username)
            options["AWS_SECRET_ACCESS_KEY"] = urllib.parse.unquote(parts.password)
    netloc = parts.netloc.rsplit("@", 1)[-1]  # credentials never go into the table's URI
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")), options


def partition_value(value: Any) -> str | None:
    """A partition value in Delta's serialised form (strings as they are, timestamps as
    ISO 8601 in UTC)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.strftime("%Y-%m-%d %H:%M:%S.%f")
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return str(value)  # integers, dates (YYYY-MM-DD)


def _delta_fields(schema: pa.Schema) -> list[dict[str, Any]]:
    """The Delta schema's fields (JSON) of the Arrow ``schema``."""
    from deltalake import Schema

    fields: list[dict[str, Any]] = json.loads(Schema.from_arrow(schema).to_json())["fields"]
    return fields


def _delta_types(schema: pa.Schema) -> dict[str, Any]:
    """Column name -> Delta type (nullability left out: Spark writes every column nullable;
    :func:`_rules_of` takes the table's NOT NULL columns)."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items()
                    if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return {f["name"]: strip(f["type"]) for f in _delta_fields(schema)}


def _nested_not_null(table: Any, stream: Any, path: str) -> list[str]:
    """The fields, elements and values inside ``table``'s Delta type (JSON) that are NOT NULL
    where ``stream``'s (the same type) may be null: a task checks top-level columns only."""
    if not (isinstance(table, dict) and isinstance(stream, dict)):
        return []
    found = []
    if table.get("type") == "struct":
        streamed = {f["name"]: f for f in stream.get("fields", [])}
        for inner in table.get("fields", []):
            other = streamed.get(inner["name"], {})
            where = f"{path}.{inner['name']}"
            if not inner.get("nullable", True) and other.get("nullable", True):
                found.append(where)
            found += _nested_not_null(inner["type"], other.get("type"), where)
    for key, flag, part in (("elementType", "containsNull", "[]"),
                            ("keyType", None, "{key}"), ("valueType", "valueContainsNull", "{}")):
        if key in table:
            if flag and not table.get(flag, True) and stream.get(flag, True):
                found.append(f"{path}{part}")
            found += _nested_not_null(table[key], stream.get(key), f"{path}{part}")
    return found


def _rules_of(table: Any, columns: pa.Schema, where: str) -> TableRules:
    """``table``'s NOT NULL columns and CHECK constraints, as the stream's rows (``columns``)
    are checked against them; ValueError for what a task cannot check: a NOT NULL inside a
    column, a constraint outside the SQL :mod:`flinkish_sink.table_constraints` evaluates."""
    fields = json.loads(table.schema().to_json())["fields"]
    streamed = {f["name"]: f for f in _delta_fields(columns)}
    nested = [p for f in fields if f["name"] in streamed
              for p in _nested_not_null(f["type"], streamed[f["name"]]["type"], f["name"])]
    if nested:
        raise ValueError(
            f"Delta table {where!r} has NOT NULL fields inside its columns ({nested}) where "
            "the stream's rows may hold NULL; flinkish checks NOT NULL on whole columns only. "
            "Make the stream's fields non-nullable, or write a table without them")
    constraints = [(key[len(_CONSTRAINT_KEY):], sql) for key, sql
                   in sorted(table.metadata().configuration.items())
                   if key.startswith(_CONSTRAINT_KEY) and sql]
    for f in fields:  # column invariants, the older form of a CHECK constraint
        with contextlib.suppress(KeyError, TypeError, ValueError):
            invariant = json.loads(f["metadata"][_INVARIANTS_KEY])["expression"]["expression"]
            constraints.append((f"invariant of {f['name']}", str(invariant)))
    checks = []
    for name, sql in constraints:
        try:
            checks.append(Check(name, sql, compile_check(sql, columns)))
        except UnsupportedCheck as exc:
            raise ValueError(
                f"Delta table {where!r} has CHECK constraint {name!r} ({sql}), which "
                f"flinkish cannot evaluate on the stream's rows ({exc}): it checks "
                "comparisons, AND/OR/NOT, IS [NOT] NULL, IS [NOT] DISTINCT FROM, [NOT] IN, "
                "BETWEEN and arithmetic over columns and literals. Rewrite the constraint in "
                "those terms, or drop it (ALTER TABLE … DROP CONSTRAINT)") from None
    not_null = tuple(f["name"] for f in fields if not f.get("nullable", True)
                     and f["name"] in streamed)
    return TableRules(f"Delta table {where!r}", not_null, tuple(checks))


def _shown(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else json.dumps(dtype, separators=(",", ":"))


class DeltaTarget(StagedFilesTarget):
    """A Delta table written exactly once per epoch (see the module docstring).

    Holds only a pyarrow filesystem (picklable), paths and options, so it ships to Spark tasks
    as is; the delta-rs table handle is made where it is needed and not pickled.
    """

    cleanup = "a VACUUM"

    def __init__(
        self, path: str, *, partition_by: tuple[str, ...] = (), app_id: str | None = None,
        upsert_key: tuple[str, ...] = (), compact_every: int = 0,
        vacuum_retention_hours: int | None = None,
    ) -> None:
        """``path``: the table's directory or URI; ``partition_by``: the partition columns of
        a table to create (an existing table's must match; empty: take the table's);
        ``app_id``: the ``txn`` app id of the epochs (default: the query's id, which Spark
        keeps in the checkpoint location across restarts); ``upsert_key``: the columns (of
        the table: a window ``w`` is ``w_start``, ``w_end``) on which an epoch's row replaces
        the table's row instead of adding one; ``compact_every``: compact the table's small
        files once that many commits added data since its last compaction (0: never);
        ``vacuum_retention_hours``: after compacting, delete the files no version references
        that are older than that (None: never; see :meth:`maintain`)."""
        try:
            import deltalake  # noqa: F401
        except ImportError:
            raise ValueError(
                "target delta needs the deltalake package (delta-rs) wherever the query runs, "
                "executors included: pip install 'flinkish[delta]'"
            ) from None
        self._fs, self._base = filesystem_of(path, "the Delta table's path")
        self._base = self._base.rstrip("/")
        self._uri, self._storage = delta_location(path)
        self._where = mask_uri(path) or path
        self.title = f"Delta table {self._where!r}"
        self._wanted_partitions = tuple(partition_by)
        self._partitions: tuple[str, ...] | None = (
            tuple(partition_by) or _PARTITIONS_SEEN.get(self._uri))
        self._app_id = app_id
        self.upsert_key = upsert_key
        self._compact_every = compact_every
        self._vacuum_hours = vacuum_retention_hours
        self._rules: TableRules | None = _RULES_SEEN.get(self._uri)

    def __repr__(self) -> str:
        return f"DeltaTarget({self._where!r})"

    # -- the table -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _latest(self) -> Iterator[Any]:
        """The table at its latest version, for this block alone (see :data:`_TABLES`)."""
        with _TABLES_LOCK:
            yield self._table()

    def _table(self) -> Any:
        """The table at its latest version (call under :data:`_TABLES_LOCK`): this process's
        handle of it brought up to date, or read anew when there is none or the handle cannot
        catch up (the table was deleted or replaced: its version's commit is gone)."""
        from deltalake import DeltaTable

        key = (self._uri, tuple(sorted(self._storage.items())))
        table = _TABLES.get(key)
        if table is not None:
            try:
                table.update_incremental()
                commit = self._path("_delta_log", f"{table.version():020d}.json")
                if self._fs.get_file_info(commit).type != pafs.FileType.NotFound:
                    return table
            except Exception as exc:  # a fresh read answers, or raises the real error
                logger.info("Delta table %s: reading it anew (%s)", self._where, exc)
        table = _TABLES[key] = DeltaTable(self._uri, storage_options=self._storage or None)
        return table

    def partition_columns(self) -> tuple[str, ...]:
        """The table's partition columns (asked of the table once per target)."""
        if self._partitions is None:
            with self._latest() as table:
                self._partitions = tuple(table.metadata().partition_columns)
        return self._partitions

    def rules(self, columns: pa.Schema) -> TableRules:
        """The table's NOT NULL columns and CHECK constraints, for rows of ``columns`` (as
        :meth:`check` found them, or asked of the table)."""
        if self._rules is None:
            with self._latest() as table:
                self._rules = _rules_of(table, columns, self._where)
        return self._rules

    def files(self) -> tuple[pafs.FileSystem, str]:
        return self._fs, self._base

    def _path(self, *parts: str) -> str:
        return "/".join((self._base, *parts))

    # -- TargetBase ----------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> None:
        """Create the table from ``schema`` (windows split into their bounds, every column
        nullable, partitioned by ``partition_by``) if missing; otherwise make sure it has
        the stream's columns with the same types and the same partition columns."""
        from deltalake import DeltaTable

        columns = table_schema(schema)
        self._check_partition_columns(columns)
        if not DeltaTable.is_deltatable(self._uri, storage_options=self._storage or None):
            nullable = pa.schema([f.with_nullable(True) for f in columns])
            # "ignore": another query creating the same table at the same moment wins quietly,
            # and its table is checked below like any existing one
            DeltaTable.create(
                self._uri, nullable, mode="ignore", partition_by=list(self._wanted_partitions),
                storage_options=self._storage or None,
            )
        with self._latest() as table:
            existing = tuple(table.metadata().partition_columns)
            current = pa.schema(table.schema().to_arrow())
            rules = _rules_of(table, columns, self._where)
        self._check_partitioning(existing, self._wanted_partitions)
        self._partitions = _PARTITIONS_SEEN[self._uri] = existing
        self._check_partition_columns(columns)
        check_columns("upsertKey", self.upsert_key, columns)
        self._check_fit(_delta_types(current), _delta_types(columns), _shown)
        self._rules = _RULES_SEEN[self._uri] = rules

    def _check_partition_columns(self, columns: pa.Schema) -> None:
        check_columns("partitionBy", self._partitions or (), columns)
        for name in self._partitions or ():
            dtype = columns.field(name).type
            if not any(accepts(dtype) for accepts in _PARTITION_TYPES):
                raise ValueError(
                    f"option partitionBy: column {name!r} is {dtype}; a partition column must "
                    "be a string, integer, boolean, date or timestamp"
                )

    def begin_transaction(self, txn: TransactionId | None, schema: pa.Schema
                          ) -> DeltaTransaction:
        return DeltaTransaction(self, txn, schema)

    def _commit_direct(self, files: list[dict[str, Any]]) -> None:
        with self._latest() as table:
            self._commit_adds(table, files, {})

    def committed_watermark(self, query: str) -> int | None:
        """The highest watermark the table's history (as far as its log keeps it) records
        for ``query``; None before any. Published watermarks never go back, so this is the
        newest one: the history is read from its end, a growing stretch at a time."""
        limit = 100
        while True:
            with self._latest() as table:
                commits = table.history(limit)
            marks = [r["watermark"] for r in _records(commits, query)
                     if r.get("watermark") is not None]
            if marks or len(commits) < limit:
                return max(marks) if marks else None
            limit *= 10

    def close(self) -> None:
        """Nothing to release: the table's handle stays for the next micro-batch's target
        (see :data:`_TABLES`)."""

    # -- EpochTarget ---------------------------------------------------------------------------

    def commit_epoch(self, pre_commits: list[PreCommit], record: EpochRecord) -> None:
        """Commit the epoch's files as one version with ``txn`` (app id, epoch) and the
        epoch's record, unless the table holds the epoch already; then drop the manifests
        (the files are the table's now)."""
        from deltalake.exceptions import CommitFailedError

        app = self.app_id(record.query)
        adds = [add for decided in pre_commits for add in decided.listed("adds", "DeltaTarget")]
        # one read of the table: the commit is made, and checked for conflicts, against the
        # version whose txn said the epoch is not in yet
        with self._latest() as table:
            if not _holds(table, app, record.epoch):
                self._check_present([a["path"] for a in adds], record.epoch)
                metadata = {RECORD_KEY: {**record.to_json(), "app_id": app}}
                try:
                    if self.upsert_key:
                        self._merge(table, adds, metadata, (app, record.epoch))
                    else:
                        self._commit_adds(table, adds, metadata, (app, record.epoch))
                except CommitFailedError:
                    # another commit with our app id since we read the table: if that was
                    # this epoch (an earlier run of the query), the epoch is in
                    if not _holds(self._table(), app, record.epoch):
                        raise
        for decided in pre_commits:
            if self.upsert_key:  # the merge wrote the rows into files of its own
                for add in decided.listed("adds", "DeltaTarget"):
                    delete_file_if_present(self._fs, self._path(add["path"]))
            self.manifests.drop(decided.txn)

    def maintain(self, prefix: str, query: str, epoch: int,
                 fence: Callable[[], None] = lambda: None) -> None:
        """After an epoch completed: compact the table once ``compact_every`` commits have
        added data since its last compaction (``OPTIMIZE``: small files of a partition
        rewritten into large ones, as one commit that removes and adds the same rows,
        ``dataChange`` false, not touching ``txn``), then vacuum if configured.

        Whether a compaction is due is read from the table's log, not from the epoch's
        number, so a crash between an epoch's commit and its compaction defers the
        compaction to the restarted query's next epoch (or its replay) rather than skipping
        it. A failure is logged, not raised: the epoch is committed, and the next epoch
        tries again."""
        if not self._compact_every:
            return
        try:
            with self._latest() as table:
                if self._commits_since_compaction(table) < self._compact_every:
                    return
                fence()
                metrics = table.optimize.compact()
                _SINCE_COMPACTION[self._table_key()] = (table.version(), 0)
                logger.info("Delta table %s compacted: %s files into %s", self._where,
                            metrics.get("numFilesRemoved"), metrics.get("numFilesAdded"))
                if self._vacuum_hours is not None:
                    self._vacuum(table, self._vacuum_hours)
        except Exception as exc:  # compaction is an optimisation: the epoch is in
            logger.warning("compacting Delta table %s failed (the next epoch tries "
                           "again): %s", self._where, exc)

    def _table_key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return self._uri, tuple(sorted(self._storage.items()))

    def _commits_since_compaction(self, table: Any) -> int:
        """How many commits added or changed data since ``table``'s newest compaction (or
        its creation), from its log: the commits since the version this process last
        counted up to, or, the first time, read back until that compaction (or enough)."""
        version = table.version()
        counted = _SINCE_COMPACTION.get(self._table_key())
        if counted is not None and counted[0] <= version:
            since, count = counted
            if version > since:
                newer, compacted = _data_commits(table.history(version - since))
                count = newer if compacted else count + newer
        else:
            limit = self._compact_every + 4
            while True:
                commits = table.history(limit)
                count, compacted = _data_commits(commits)
                if compacted or count >= self._compact_every or len(commits) < limit:
                    break
                limit *= 4
        _SINCE_COMPACTION[self._table_key()] = (version, count)
        return count

    def _vacuum(self, table: Any, hours: int) -> None:
        """Delete the files no version references that are older than ``hours``: files the
        table stopped referencing, and files it never did (a compaction or another writer
        killed before its commit), except those a flinkish transaction's manifest lists
        (an epoch decided but not yet committed, of any query on the table)."""
        unreferenced = table.vacuum(hours, dry_run=True, enforce_retention_duration=False,
                                    full=True)
        kept = self.manifests.named()
        deleted = [name for name in unreferenced if name not in kept]
        for name in deleted:
            delete_file_if_present(self._fs, self._path(name))
        logger.info("Delta table %s vacuumed: %d files deleted", self._where, len(deleted))

    def _commit_adds(self, table: Any, adds: list[dict[str, Any]], record: dict[str, Any],
                     txn: tuple[str, int] | None = None) -> None:
        """One version of ``table`` (as read) adding ``adds``, with ``record`` and ``txn``."""
        from deltalake import CommitProperties, Transaction
        from deltalake.transaction import AddAction

        table.create_write_transaction(
            [AddAction(a["path"], a["size"], a["partition_values"], a["modification_time"],
                       True, a["stats"]) for a in adds],
            "append", table.schema(), partition_by=list(self.partition_columns()),
            commit_properties=CommitProperties(
                custom_metadata={"userMetadata": json.dumps(record)} if record else None,
                app_transactions=[Transaction(*txn)] if txn else None,
            ),
        )

    def _merge(self, table: Any, adds: list[dict[str, Any]], record: dict[str, Any],
               txn: tuple[str, int]) -> None:
        """Merge the epoch's rows into the table on the upsert key, as one version: a row
        replaces the table's row of its key (NULL matching NULL), or is added; of the epoch's
        rows with one key the last one (in decision order) wins."""
        from deltalake import CommitProperties, Transaction

        rows = _last_per_key(
            [pq.read_table(self._path(a["path"]), filesystem=self._fs) for a in adds],
            self.upsert_key)
        if rows is None:  # an epoch without rows still records itself
            self._commit_adds(table, [], record, txn)
            return
        predicate = " AND ".join(
            f'(t."{name}" IS NOT DISTINCT FROM s."{name}")' for name in self.upsert_key)
        table.merge(
            rows, predicate, source_alias="s", target_alias="t",
            commit_properties=CommitProperties(
                custom_metadata={"userMetadata": json.dumps(record)},
                app_transactions=[Transaction(*txn)]),
        ).when_matched_update_all().when_not_matched_insert_all().execute()

    def epoch_records(self, query: str | None = None, limit: int | None = None
                      ) -> list[dict[str, Any]]:
        """The epoch records in the table's history (its newest ``limit`` versions, if
        given), newest first (of ``query`` only, if given): what each epoch's commit says in
        its ``userMetadata``."""
        with self._latest() as table:
            return _records(table.history(limit), query)


def _records(commits: list[dict[str, Any]], query: str | None) -> list[dict[str, Any]]:
    """The epoch records (of ``query``, if given) in ``commits`` (history entries), with
    their versions."""
    records = []
    for commit in commits:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            record = json.loads(commit["userMetadata"])[RECORD_KEY]
            if query is None or record["query"] == query:
                records.append({**record, "version": commit.get("version")})
    return records


def _data_commits(commits: list[dict[str, Any]]) -> tuple[int, bool]:
    """Of ``commits`` (history entries, newest first): how many added or changed data before
    the newest compaction or creation among them, and whether there was one."""
    count = 0
    for commit in commits:
        operation = str(commit.get("operation", ""))
        if operation == "OPTIMIZE" or operation.startswith("CREATE"):
            return count, True
        if not operation.startswith("VACUUM"):
            count += 1
    return count, False


def _holds(table: Any, app: str, epoch: int) -> bool:
    """Whether ``table`` (as read) holds ``epoch`` of ``app``: its txn is there or later."""
    done = table.transaction_version(app)
    return done is not None and done >= epoch



def _last_per_key(tables: list[pa.Table], key: tuple[str, ...]) -> pa.Table | None:
    """The rows of ``tables`` (in order), only the last of each ``key``; None if none."""
    rows = pa.concat_tables(tables) if tables else None
    if rows is None or rows.num_rows == 0:
        return None
    order = "__flinkish_row"
    numbered = rows.append_column(order, pa.array(range(rows.num_rows), pa.int64()))
    last = numbered.group_by(list(key)).aggregate([(order, "max")]).column(f"{order}_max")
    return rows.take(pc.take(last, pc.sort_indices(last)))


class _DataFile(DataFile):
    """A data file with the statistics its add action carries."""

    def __init__(self, name: str, partition: dict[str, Any], writer: pq.ParquetWriter,
                 schema: pa.Schema) -> None:
        super().__init__(name, partition, writer)
        self.stats = FileStats(schema)

    def write(self, batch: pa.RecordBatch) -> None:
        super().write(batch)
        self.stats.add(batch)


class DeltaTransaction(StagedFiles):
    """One task attempt's data files (see :class:`StagedFiles`); pre-committed as add
    actions."""

    detail_key = "adds"

    def __init__(self, target: DeltaTarget, txn: TransactionId | None, schema: pa.Schema):
        # a referenced file holds no partition column (its add action has the values); the
        # files an upsert merges from are only read by the driver, which needs them whole
        dropped = () if target.upsert_key else target.partition_columns()
        columns = table_schema(schema)
        super().__init__(target, txn, pa.schema([f for f in columns if f.name not in dropped]))
        self._delta = target
        self._rules = target.rules(columns)

    def _refuse(self, batch: pa.RecordBatch) -> None:
        self._rules.refuse(batch, _DROP_NOT_NULL)

    def _new_file(self, name: str, partition: dict[str, Any]) -> DataFile:
        values = {column: partition_value(value) for column, value in partition.items()}
        writer = pq.ParquetWriter(self._delta._path(name), self._schema,
                                  filesystem=self._delta._fs)
        return _DataFile(name, values, writer, self._schema)

    def _described(self, data: DataFile, size: int) -> dict[str, Any]:
        assert isinstance(data, _DataFile)
        return {"path": data.name, "size": size, "partition_values": data.partition,
                "modification_time": int(time.time() * 1000), "stats": data.stats.to_json()}


def _create(options: TargetOptions, late: bool) -> DeltaTarget:
    path = options[LATE_PATH] if late else options[PATH]
    assert path is not None
    return DeltaTarget(path, partition_by=options[PARTITION_BY], app_id=options[APP_ID],
                       upsert_key=() if late else options[UPSERT_KEY],  # late rows append
                       compact_every=options[COMPACT_EVERY],
                       vacuum_retention_hours=options[VACUUM_RETENTION])


FACTORY = TargetFactory(
    name="delta",
    doc="A Delta Lake table ([the Delta Lake target](../delta.md)), written by delta-rs.",
    options=(PATH, UPSERT_KEY, PARTITION_BY, APP_ID, COMPACT_EVERY, VACUUM_RETENTION, LATE_PATH),
    required={PATH: "a directory or URI"},
    side_output=LATE_PATH,
    check=lambda options: distinct(options, PATH, "place"),
    create=_create,
    cli_option="path",
    title="Delta",
)
