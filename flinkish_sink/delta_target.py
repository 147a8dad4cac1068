"""Delta Lake tables as an epoch target, through delta-rs (the ``deltalake`` package: no JVM).

Tasks write Parquet files straight into the table's directory (unreferenced, so invisible);
the driver commits an epoch's add actions as one version with ``txn`` (app id, epoch), or
merges them on ``upsertKey``. Design, layout and fencing: docs/delta.md.
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
from flinkish_sink.data_files import DataFile, StagedFiles, StagedFilesTarget
from flinkish_sink.delta_stats import FileStats
from flinkish_sink.options import (
    LATE_PATH,
    PARTITION_BY,
    PATH,
    UPSERT_KEY,
    TargetOptions,
    app_id_option,
    distinct,
)
from flinkish_sink.table_constraints import Check, TableRules, UnsupportedCheck, compile_check
from flinkish_sink.target import EpochRecord, PreCommit, TransactionId
from flinkish_sink.targets import TargetFactory
from flinkish_sink.window_columns import check_columns, table_schema

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


APP_ID = app_id_option("delta.appId", "of the table's `txn` actions")
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

#: The partition columns of the tables this process has checked, by URI: Spark builds the
#: target anew every micro-batch, and one that knows them spares each task a read of the log.
_PARTITIONS_SEEN: dict[str, tuple[str, ...]] = {}

#: The NOT NULL columns and CHECK constraints of the tables checked, as :data:`_PARTITIONS_SEEN`.
_RULES_SEEN: dict[str, TableRules] = {}
#: What a NOT NULL column's error says to lift the rule.
_DROP_NOT_NULL = "ALTER TABLE … ALTER COLUMN … DROP NOT NULL"
_CONSTRAINT_KEY = "delta.constraints."
_INVARIANTS_KEY = "delta.invariants"

#: The tables this process has open: a kept handle catches up with ``update_incremental``
#: where a new one would replay the log. Used under the lock from its update to its commit.
_TABLES: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
#: Per table: (the version counted up to, the commits since its last compaction).
_SINCE_COMPACTION: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, int]] = {}
_TABLES_LOCK = threading.RLock()

_PARTITION_TYPES = (
    pa.types.is_string, pa.types.is_large_string, pa.types.is_integer, pa.types.is_boolean,
    pa.types.is_date32, pa.types.is_timestamp)


def delta_location(location: str) -> tuple[str, dict[str, str]]:
    """The table URI and delta-rs storage options of ``location``, a path or a URI as the
    Parquet target takes it (``s3://bucket/path?endpoint_override=…``)."""
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
    from deltalake import Schema

    fields: list[dict[str, Any]] = json.loads(Schema.from_arrow(schema).to_json())["fields"]
    return fields


def _delta_types(schema: pa.Schema) -> dict[str, Any]:
    """Column name -> Delta type, without nullability (Spark writes every column nullable)."""
    from deltalake import Schema

    fields = json.loads(Schema.from_arrow(schema).to_json(), object_hook=lambda node: {
        k: v for k, v in node.items()
        if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")})["fields"]
    return {f["name"]: f["type"] for f in fields}


def _nested_not_null(table: Any, stream: Any, path: str) -> list[str]:
    """The places inside ``table``'s Delta type that are NOT NULL where ``stream``'s may be
    null: a task checks top-level columns only."""
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
    """``table``'s NOT NULL columns and CHECK constraints for rows of ``columns``; ValueError
    for what a task cannot check."""
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
    """A Delta table written exactly once per epoch; pickles without its delta-rs handle."""

    cleanup = "a VACUUM"

    def __init__(self, path: str, *, partition_by: tuple[str, ...] = (),
                 app_id: str | None = None, upsert_key: tuple[str, ...] = (),
                 compact_every: int = 0, vacuum_retention_hours: int | None = None) -> None:
        try:
            import deltalake  # noqa: F401
        except ImportError:
            raise ValueError(
                "target delta needs the deltalake package (delta-rs) wherever the query runs, "
                "executors included: pip install 'flinkish[delta]'") from None
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
        """The table at its latest version, under :data:`_TABLES_LOCK`."""
        with _TABLES_LOCK:
            yield self._table()

    def _table(self) -> Any:
        """The kept handle brought up to date, or read anew when it cannot catch up (the
        table was replaced: its version's commit is gone). Call under :data:`_TABLES_LOCK`."""
        from deltalake import DeltaTable

        key = self._table_key()
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
        if self._partitions is None:
            with self._latest() as table:
                self._partitions = tuple(table.metadata().partition_columns)
        return self._partitions

    def rules(self, columns: pa.Schema) -> TableRules:
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
        """Create the table if missing, else check its columns, types and partitioning."""
        from deltalake import DeltaTable

        columns = table_schema(schema)
        self._check_partition_columns(columns)
        if not DeltaTable.is_deltatable(self._uri, storage_options=self._storage or None):
            nullable = pa.schema([f.with_nullable(True) for f in columns])
            # "ignore": a query creating it at the same moment wins; it is checked below
            DeltaTable.create(
                self._uri, nullable, mode="ignore", partition_by=list(self._wanted_partitions),
                storage_options=self._storage or None)
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
                    "be a string, integer, boolean, date or timestamp")

    def begin_transaction(self, txn: TransactionId | None, schema: pa.Schema
                          ) -> DeltaTransaction:
        return DeltaTransaction(self, txn, schema)

    def _commit_direct(self, files: list[dict[str, Any]]) -> None:
        with self._latest() as table:
            self._commit_adds(table, files, {})

    def committed_watermark(self, query: str) -> int | None:
        """The newest watermark the table's history records for ``query`` (they never go
        back), read from its end a growing stretch at a time; None before any."""
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
        """Nothing to release: the table's handle stays for the next micro-batch."""

    # -- EpochTarget ---------------------------------------------------------------------------

    def commit_epoch(self, pre_commits: list[PreCommit], record: EpochRecord) -> None:
        """Commit the epoch as one version unless the table holds it; drop the manifests."""
        from deltalake.exceptions import CommitFailedError

        app = self.app_id(record.query)
        adds = [add for decided in pre_commits for add in decided.listed("adds", "DeltaTarget")]
        # the commit is checked for conflicts against the version whose txn lacked the epoch
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
                    # another commit with our app id: if it held this epoch, the epoch is in
                    if not _holds(self._table(), app, record.epoch):
                        raise
        for decided in pre_commits:
            if self.upsert_key:  # the merge wrote the rows into files of its own
                for add in decided.listed("adds", "DeltaTarget"):
                    delete_file_if_present(self._fs, self._path(add["path"]))
            self.manifests.drop(decided.txn)

    def maintain(self, prefix: str, query: str, epoch: int,
                 fence: Callable[[], None] = lambda: None) -> None:
        """Compact (then vacuum) once ``compact_every`` commits added data since the last
        compaction, counted from the log so that a crash defers it rather than skipping it.
        A failure is logged: the epoch is in, and the next one tries again."""
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
        creation): counted on from the last count, or read back from the log the first time."""
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
        """Delete the unreferenced files older than ``hours``, except those a transaction's
        manifest lists (an epoch decided but not committed yet)."""
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
        from deltalake.transaction import AddAction

        table.create_write_transaction(
            [AddAction(a["path"], a["size"], a["partition_values"], a["modification_time"],
                       True, a["stats"]) for a in adds],
            "append", table.schema(), partition_by=list(self.partition_columns()),
            commit_properties=_commit_properties(record, txn))

    def _merge(self, table: Any, adds: list[dict[str, Any]], record: dict[str, Any],
               txn: tuple[str, int]) -> None:
        """Merge the epoch's rows on the upsert key as one version (NULL matching NULL); of
        the epoch's rows with one key the last one (in decision order) wins."""
        rows = _last_per_key(
            [pq.read_table(self._path(a["path"]), filesystem=self._fs) for a in adds],
            self.upsert_key)
        if rows is None:  # an epoch without rows still records itself
            self._commit_adds(table, [], record, txn)
            return
        predicate = " AND ".join(
            f'(t."{name}" IS NOT DISTINCT FROM s."{name}")' for name in self.upsert_key)
        table.merge(rows, predicate, source_alias="s", target_alias="t",
                    commit_properties=_commit_properties(record, txn),
                    ).when_matched_update_all().when_not_matched_insert_all().execute()

    def epoch_records(self, query: str | None = None, limit: int | None = None
                      ) -> list[dict[str, Any]]:
        """The epoch records (of ``query``) in the newest ``limit`` versions, newest first."""
        with self._latest() as table:
            return _records(table.history(limit), query)


def _commit_properties(record: dict[str, Any], txn: tuple[str, int] | None) -> Any:
    from deltalake import CommitProperties, Transaction

    return CommitProperties(
        custom_metadata={"userMetadata": json.dumps(record)} if record else None,
        app_transactions=[Transaction(*txn)] if txn else None)


def _records(commits: list[dict[str, Any]], query: str | None) -> list[dict[str, Any]]:
    """The epoch records (of ``query``) in history entries, with their versions."""
    records = []
    for commit in commits:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            record = json.loads(commit["userMetadata"])[RECORD_KEY]
            if query is None or record["query"] == query:
                records.append({**record, "version": commit.get("version")})
    return records


def _data_commits(commits: list[dict[str, Any]]) -> tuple[int, bool]:
    """How many of ``commits`` (newest first) changed data since the newest compaction or
    creation among them, and whether there was one."""
    count = 0
    for commit in commits:
        operation = str(commit.get("operation", ""))
        if operation == "OPTIMIZE" or operation.startswith("CREATE"):
            return count, True
        if not operation.startswith("VACUUM"):
            count += 1
    return count, False


def _holds(table: Any, app: str, epoch: int) -> bool:
    """Whether ``table``'s txn of ``app`` is at ``epoch`` or later."""
    done = table.transaction_version(app)
    return done is not None and done >= epoch


def _last_per_key(tables: list[pa.Table], key: tuple[str, ...]) -> pa.Table | None:
    """The rows of ``tables`` (in order), only the last of each ``key``; None if none."""
    if not tables or (rows := pa.concat_tables(tables)).num_rows == 0:
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
    """One task attempt's data files, pre-committed as add actions."""

    detail_key = "adds"

    def __init__(self, target: DeltaTarget, txn: TransactionId | None, schema: pa.Schema):
        # a file holds no partition column (its add action has the values), except those an
        # upsert merges from: the driver reads them whole
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
