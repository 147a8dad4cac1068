"""Apache Iceberg tables as an epoch target, through pyiceberg (no JVM, no catalog server).

Tasks write Parquet files under the table's data location (unreferenced, so invisible); the
driver commits an epoch's files as one snapshot whose summary carries the app id and epoch, as
Flink's Iceberg sink does. Design, catalogs and concurrent writers: docs/iceberg.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from flinkish_core.config import Option, collected
from flinkish_core.errors import OptionError
from flinkish_core.locations import filesystem_of
from flinkish_core.secrets import dsn_secrets, fingerprint, mask_uri, redact_config, secret_values
from flinkish_sink.data_files import DataFile, StagedFiles, StagedFilesTarget
from flinkish_sink.options import (
    LATE_TABLE,
    PARTITION_BY,
    TABLE,
    TargetOptions,
    app_id_option,
    distinct,
)
from flinkish_sink.table_constraints import refuse_nulls
from flinkish_sink.target import EpochRecord, PreCommit, TransactionId
from flinkish_sink.targets import TargetFactory
from flinkish_sink.window_columns import check_columns, table_schema

logger = logging.getLogger(__name__)


def _shown_catalog(catalog: dict[str, str]) -> dict[str, object]:
    return {k: mask_uri(v) if k == "uri" else v for k, v in redact_config(catalog).items()}


def _catalog_secrets(catalog: dict[str, str]) -> list[str]:
    return dsn_secrets(catalog.get("uri")) + secret_values(catalog)


CATALOG: Option[dict[str, str]] = Option(
    "catalog.*", collected, {}, shown_default="—", mask=_shown_catalog, secrets=_catalog_secrets,
    doc="The catalog, each `catalog.<property>` passed to pyiceberg's `load_catalog` as "
        "`<property>`. `catalog.uri` (required): a SQLAlchemy URI for its SQL catalog "
        "(`sqlite:////path/catalog.db`, `postgresql+psycopg://user:password@host/db`), which "
        "needs no server of its own, or a REST catalog's `https://…`. `catalog.warehouse`: "
        "where the catalog puts new tables (`file:///path`, `s3://bucket/path`). "
        "`catalog.name` (default `flinkish`): the catalog's name; the SQL catalog keeps tables "
        "per name, so readers must use the same one. Any other (`catalog.type`, "
        "`catalog.credential`, `catalog.s3.endpoint` …) too; secret-looking values are masked "
        "in logs.")
APP_ID = app_id_option("iceberg.appId", "in the snapshot summaries (`flinkish.app-id`, next "
                       "to `flinkish.max-committed-epoch`)")

#: Snapshot summary keys (Flink's sink: ``flink.job-id``, ``flink.max-committed-checkpoint-id``).
APP_ID_KEY = "flinkish.app-id"
EPOCH_KEY = "flinkish.max-committed-epoch"
_RECORD_KEYS = {
    "query": "flinkish.query", "watermark": "flinkish.watermark",
    "watermark_source": "flinkish.watermark-source", "status": "flinkish.status",
    "idle_partitions": "flinkish.idle-partitions", "rows": "flinkish.rows",
    "late_rows": "flinkish.late-rows",
}
_NUMBERS = ("watermark", "rows", "late_rows")
DEFAULT_CATALOG_NAME = "flinkish"
#: Each epoch's commit writes a manifest of its own: merging them (Java Iceberg's default, not
#: pyiceberg's) bounds how many a query plans over.
CREATED_TABLE_PROPERTIES = {"commit.manifest-merge.enabled": "true"}
#: How often a commit that lost the race to another writer's is tried again.
COMMIT_ATTEMPTS = 20

#: The layouts of the tables this process has seen: Spark builds the target every micro-batch.
_LAYOUTS: dict[tuple[str, str], _Layout] = {}


@dataclass(frozen=True)
class _Layout:
    data_location: str
    partitions: tuple[str, ...]
    #: the table's NOT NULL columns: written as required, a null refused
    required: tuple[str, ...] = ()


class IcebergTarget(StagedFilesTarget):
    """An Iceberg table written exactly once per epoch; pickles without its catalog."""

    cleanup = "an orphan-file cleanup"

    def __init__(self, catalog: dict[str, str], table: str, *,
                 partition_by: tuple[str, ...] = (), app_id: str | None = None) -> None:
        try:
            import pyiceberg  # noqa: F401
        except ImportError:
            raise ValueError(
                "target iceberg needs the pyiceberg package wherever the query runs, "
                "executors included: pip install 'flinkish[iceberg]'") from None
        if "." not in table.strip(".") or not table.strip():
            raise ValueError(
                f"option table: {table!r} is not namespace.table (e.g. 'events.clicks')")
        properties = dict(catalog)
        self._name = properties.pop("name", DEFAULT_CATALOG_NAME)
        self._properties = properties
        self._table_name = table
        self.title = f"Iceberg table {table!r}"
        self._wanted_partitions = tuple(partition_by)
        self._app_id = app_id
        self._key = (fingerprint(self._name, sorted(properties.items())), table)
        self._layout_seen: _Layout | None = _LAYOUTS.get(self._key)
        self._catalog_handle: Any = None
        self._fs_handle: tuple[pafs.FileSystem, str] | None = None

    def __repr__(self) -> str:
        return f"IcebergTarget({self._table_name!r}, catalog {self._name!r})"

    def __getstate__(self) -> dict[str, Any]:
        # resolved where the catalog is (the driver): tasks never ask it, nor import pyiceberg
        self.files()
        state = self.__dict__.copy()
        state["_catalog_handle"] = None
        return state

    # -- the table -----------------------------------------------------------------------------

    def _catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        if self._catalog_handle is None:
            try:
                self._catalog_handle = load_catalog(self._name, **self._properties)
            except Exception as exc:
                raise ValueError(
                    f"cannot load Iceberg catalog {self._name!r} "
                    f"({redact_config(self._properties)}): {exc}. Check the catalog.* options "
                    "(catalog.uri: sqlite:///path, postgresql+psycopg://… or http(s):// for "
                    "REST; catalog.warehouse: where new tables go)") from None
        return self._catalog_handle

    def load(self) -> Any:
        return self._catalog().load_table(self._table_name)

    def _layout(self) -> _Layout:
        if self._layout_seen is None:
            self._layout_seen = _LAYOUTS[self._key] = _layout_of(self.load())
        return self._layout_seen

    def partition_columns(self) -> tuple[str, ...]:
        return self._layout().partitions

    def files(self) -> tuple[pafs.FileSystem, str]:
        """The filesystem of the data location (pyiceberg's file IO) and its path in it."""
        if self._fs_handle is None:
            location = self._layout().data_location
            if location.startswith("file:") or "://" not in location:
                # local disk needs no configuration (nor pyiceberg's file IO, slow to import)
                self._fs_handle = filesystem_of(location, "the Iceberg table's data location")
            else:
                from pyiceberg.io.pyarrow import PyArrowFileIO

                scheme, netloc, path = PyArrowFileIO.parse_location(location, self._properties)
                filesystem = PyArrowFileIO(self._properties).fs_by_scheme(scheme, netloc)
                self._fs_handle = filesystem, path.rstrip("/")
        return self._fs_handle

    # -- TargetBase ----------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> None:
        """Create the table if missing, else check its columns, types and partitioning."""
        from pyiceberg.catalog import Catalog
        from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

        columns = pa.schema([f.with_nullable(True) for f in table_schema(schema)])
        check_columns("partitionBy", self._wanted_partitions, columns)
        wanted = Catalog._convert_schema_if_needed(columns)
        catalog = self._catalog()
        try:
            table = catalog.load_table(self._table_name)
        except NoSuchTableError:
            catalog.create_namespace_if_not_exists(self._table_name.rsplit(".", 1)[0])
            try:
                with catalog.create_table_transaction(
                        self._table_name, columns,
                        properties=CREATED_TABLE_PROPERTIES) as create:
                    if self._wanted_partitions:
                        with create.update_spec() as spec:
                            for name in self._wanted_partitions:
                                spec.add_identity(name)
            except TableAlreadyExistsError:  # another query created it meanwhile
                pass
            table = catalog.load_table(self._table_name)
        layout = _layout_of(table)
        self._check_partitioning(layout.partitions, self._wanted_partitions)
        self._check_fit({f.name: str(f.field_type) for f in table.schema().fields},
                        {f.name: str(f.field_type) for f in wanted.fields})
        self._layout_seen = _LAYOUTS[self._key] = layout

    def begin_transaction(self, txn: TransactionId | None, schema: pa.Schema
                          ) -> IcebergTransaction:
        return IcebergTransaction(self, txn, schema)

    def _commit_direct(self, files: list[dict[str, Any]]) -> None:
        self._commit([f["path"] for f in files], {}, None)

    def committed_watermark(self, query: str) -> int | None:
        """The newest watermark the table's snapshots record for ``query`` (they never go
        back); None before any."""
        return next((int(r["watermark"]) for r in self.epoch_records(query)
                     if r.get("watermark") is not None), None)

    def close(self) -> None:
        self._catalog_handle = None

    # -- EpochTarget ---------------------------------------------------------------------------

    def commit_epoch(self, pre_commits: list[PreCommit], record: EpochRecord) -> None:
        """Commit the epoch as one snapshot unless the table holds it; drop the manifests."""
        app = self.app_id(record.query)
        paths = [f["path"] for decided in pre_commits
                 for f in decided.listed("files", "IcebergTarget")]
        summary = {APP_ID_KEY: app, EPOCH_KEY: str(record.epoch), **_summary_of(record)}
        self._commit(paths, summary, (app, record.epoch))
        for decided in pre_commits:
            self.manifests.drop(decided.txn)

    def _commit(self, paths: list[str], summary: dict[str, str],
                epoch: tuple[str, int] | None) -> None:
        """One snapshot adding ``paths`` unless the table holds ``epoch`` (app id, epoch),
        tried again while other writers' commits win the race."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in itertools.count(1):
            table = self.load()
            if epoch is not None and _holds(table, *epoch):
                return
            if attempt == 1:
                self._check_present([p.rsplit("/", 1)[-1] for p in paths],
                                    None if epoch is None else epoch[1])
            _without_own_retries(table)
            transaction = table.transaction()
            try:
                if paths:
                    transaction.add_files(paths, snapshot_properties=summary,
                                          check_duplicate_files=False)
                else:  # an epoch without rows still records itself
                    with transaction.update_snapshot(snapshot_properties=summary).fast_append():
                        pass
                transaction.commit_transaction()
                return
            except CommitFailedException as exc:
                if attempt >= COMMIT_ATTEMPTS:
                    raise RuntimeError(
                        f"cannot commit to Iceberg table {self._table_name!r}: other writers' "
                        f"commits won {attempt} times in a row ({exc})") from exc
                logger.info("commit to Iceberg table %s lost to another writer's (%s); trying "
                            "again on the table as it is now", self._table_name, exc)
                time.sleep(random.uniform(0, min(2.0, 0.05 * 2 ** attempt)))

    def epoch_records(self, query: str | None = None, limit: int | None = None
                      ) -> list[dict[str, Any]]:
        """The epoch records (of ``query``) in the newest ``limit`` snapshots, newest first."""
        from pyiceberg.table.snapshots import ancestors_of

        table = self.load()
        records = []
        for snapshot in itertools.islice(
                ancestors_of(table.current_snapshot(), table.metadata), limit):
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            record = _record_of(summary)
            if record is not None and (query is None or record["query"] == query):
                records.append({**record, "snapshot_id": snapshot.snapshot_id})
        return records


def _layout_of(table: Any) -> _Layout:
    """``table``'s data location and columns; ValueError for a non-identity partitioning."""
    from pyiceberg.transforms import IdentityTransform

    schema = table.schema()
    partitions = []
    for field in table.spec().fields:
        if not isinstance(field.transform, IdentityTransform):
            raise ValueError(
                f"Iceberg table {table.name()} is partitioned by {field.transform}("
                f"{schema.find_column_name(field.source_id)}); the flinkish sink writes "
                "tables partitioned by identity of columns only. Add the derived column "
                "(e.g. a day) to the stream and partition by it, or write another table")
        partitions.append(schema.find_column_name(field.source_id))
    location = table.properties.get("write.data.path") or f"{table.location().rstrip('/')}/data"
    required = tuple(f.name for f in schema.fields if f.required)
    return _Layout(location, tuple(partitions), required)


def _without_own_retries(table: Any) -> None:
    """Turn off pyiceberg's retry of a lost commit (in memory): it would rebase the append
    without checking whether the new snapshot holds the epoch."""
    properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    table.metadata = table.metadata.model_copy(update={"properties": properties})


def _holds(table: Any, app: str, epoch: int) -> bool:
    """Whether the newest snapshot of ``app`` has ``epoch`` or a later one (Flink's
    ``getMaxCommittedCheckpointId``)."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        if summary.get(APP_ID_KEY) == app and summary.get(EPOCH_KEY, "").isdigit():
            return int(summary[EPOCH_KEY]) >= epoch
    return False


def _summary_of(record: EpochRecord) -> dict[str, str]:
    fields = record.to_json()
    return {key: json.dumps(fields[name]) if isinstance(fields[name], list) else str(fields[name])
            for name, key in _RECORD_KEYS.items() if fields[name] is not None}


def _record_of(summary: dict[str, str]) -> dict[str, Any] | None:
    """The epoch record in a snapshot's summary; None for a snapshot of another writer."""
    if APP_ID_KEY not in summary or EPOCH_KEY not in summary:
        return None
    record: dict[str, Any] = {"app_id": summary[APP_ID_KEY], "epoch": int(summary[EPOCH_KEY])}
    for name, key in _RECORD_KEYS.items():
        value = summary.get(key)
        if name in _NUMBERS and value is not None:
            record[name] = int(value)
        elif name == "idle_partitions":
            record[name] = json.loads(value) if value else []
        else:
            record[name] = value
    return record


def _json_value(value: Any) -> Any:
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


class IcebergTransaction(StagedFiles):
    """One task attempt's data files, pre-committed as their paths, sizes and partitions."""

    def __init__(self, target: IcebergTarget, txn: TransactionId | None, schema: pa.Schema):
        # pyiceberg adds no file whose schema (nullability too) differs from the table's
        self._required = target._layout().required
        super().__init__(target, txn, pa.schema([f.with_nullable(f.name not in self._required)
                                                 for f in table_schema(schema)]))
        self._iceberg = target

    def _refuse(self, batch: pa.RecordBatch) -> None:
        refuse_nulls(batch, self._required, self._iceberg.title,
                     "ALTER TABLE … ALTER COLUMN … DROP NOT NULL")

    def _new_file(self, name: str, partition: dict[str, Any]) -> DataFile:
        filesystem, base = self._iceberg.files()
        if self._txn is None:
            filesystem.create_dir(base, recursive=True)
        return DataFile(name, partition, pq.ParquetWriter(
            f"{base}/{name}", self._schema, filesystem=filesystem))

    def _described(self, data: DataFile, size: int) -> dict[str, Any]:
        location = self._iceberg._layout().data_location.rstrip("/")
        return {"path": f"{location}/{data.name}", "size": size, "records": data.rows,
                "partition": {k: _json_value(v) for k, v in data.partition.items()}}


def _check(options: TargetOptions) -> None:
    if not options[CATALOG].get("uri"):
        raise OptionError(
            "option catalog.uri is required with target iceberg: the catalog's database "
            "(sqlite:///path/catalog.db, postgresql+psycopg://user@host/db) or a REST "
            "catalog's http(s):// URI")
    distinct(options, TABLE, "table")


def _create(options: TargetOptions, late: bool) -> IcebergTarget:
    table = options[LATE_TABLE] if late else options[TABLE]
    assert table is not None
    return IcebergTarget(options[CATALOG], table, partition_by=options[PARTITION_BY],
                         app_id=options[APP_ID])


FACTORY = TargetFactory(
    name="iceberg",
    doc="An Apache Iceberg table ([the Apache Iceberg target](../iceberg.md)) in a catalog, "
        "written by pyiceberg.",
    options=(TABLE, CATALOG, PARTITION_BY, APP_ID, LATE_TABLE),
    required={TABLE: "namespace.table, e.g. 'events.clicks'"},
    side_output=LATE_TABLE,
    check=_check,
    create=_create,
    cli_option="catalog.uri",
    title="Iceberg",
)
