"""IcebergTarget on a real Iceberg table (pyiceberg's SQL catalog on SQLite) and a real
CheckpointStore, without Spark: write tasks are ``begin_transaction(...).write(batch)`` /
``.pre_commit()``, the driver is :class:`TwoPhaseCommitCoordinator`, and what readers see is
read back with pyiceberg."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from staged_tables import PREFIX, QUERY, SCHEMA, batch, coordinator, marker, pre_commit, txn

from checkpointing import CheckpointStorage, CheckpointStore
from flinkish_core.markers import KIND_STATUS, Marker
from flinkish_sink.data_files import STAGING_DIR
from flinkish_sink.iceberg_target import APP_ID, APP_ID_KEY, CATALOG, EPOCH_KEY, IcebergTarget
from flinkish_sink.options import PARTITION_BY, parse_sink_options
from flinkish_sink.two_phase_commit import LATE_SUFFIX, TwoPhaseCommitCoordinator

UTC = timezone.utc
TABLE = "events.t"


def catalog_of(root: Path) -> dict[str, str]:
    return {"uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}


class Env:
    def __init__(self, root: Path, *, side: bool = False, schema: pa.Schema = SCHEMA,
                 **options: Any) -> None:
        self.root = root
        self.catalog = load_catalog("flinkish", **catalog_of(root))
        self.target = IcebergTarget(catalog_of(root), TABLE, **options)
        self.target.check(schema)
        self.data = Path(self.table().location().removeprefix("file://")) / "data"
        self.side = None
        if side:
            self.side = IcebergTarget(catalog_of(root), "events.late")
            self.side.check(SCHEMA)

    def table(self, name: str = TABLE) -> Any:
        return self.catalog.load_table(name)

    def snapshots(self, name: str = TABLE) -> int:
        return len(self.table(name).snapshots())

    def read_ids(self, name: str = TABLE) -> list[int]:
        return sorted(self.table(name).scan().to_arrow().column("id").to_pylist())

    def data_files(self, name: str = TABLE) -> set[str]:
        data = Path(self.table(name).location().removeprefix("file://")) / "data"
        return {p.name for p in data.glob("*.parquet")}

    def referenced(self, name: str = TABLE) -> set[str]:
        table = self.table(name)
        if table.current_snapshot() is None:
            return set()
        return {p.rsplit("/", 1)[-1]
                for p in table.inspect.files().column("file_path").to_pylist()}

    def coordinator(self) -> TwoPhaseCommitCoordinator:
        return coordinator(self.root, self.target, self.side)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_an_epoch_is_invisible_until_committed_then_one_snapshot(env: Env) -> None:
    pcs = [pre_commit(env.target, 0, 0, [1, 2, 3]), pre_commit(env.target, 0, 1, [4, 5])]
    assert len(env.data_files()) == 2
    assert env.read_ids() == []  # written, not referenced
    assert env.target.pending(PREFIX, QUERY) == [txn(0, 0), txn(0, 1)]

    outcome = env.coordinator().commit_epoch(0, pcs, marker(0, 4_000), rows=5, late_rows=0)

    assert env.read_ids() == [1, 2, 3, 4, 5]
    assert env.snapshots() == 1  # both tasks' files in one snapshot
    summary = env.table().current_snapshot().summary
    assert (summary[APP_ID_KEY], summary[EPOCH_KEY]) == (QUERY, "0")
    assert env.referenced() == env.data_files()
    assert env.target.pending(PREFIX, QUERY) == []
    assert not list((env.data / STAGING_DIR).iterdir())
    assert outcome.committed == (txn(0, 0).gid, txn(0, 1).gid)


def test_a_created_tables_manifests_are_merged_not_one_more_per_epoch(env: Env) -> None:
    """Each epoch's commit writes a manifest; the table the sink created merges them once
    there are commit.manifest.min-count-to-merge of them (100 by default, 3 here)."""
    with env.table().transaction() as change:
        change.set_properties({"commit.manifest.min-count-to-merge": "3"})
    for epoch in range(6):
        env.coordinator().commit_epoch(epoch, [pre_commit(env.target, epoch, 0, [epoch])], [],
                                       rows=1, late_rows=0)

    table = env.table()
    assert len(table.current_snapshot().manifests(table.io)) < 3
    assert env.read_ids() == list(range(6))


def test_the_snapshot_summary_carries_the_epochs_record(env: Env) -> None:
    env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1, 2])],
                                   marker(0, 4_000) + marker(1, 6_000), rows=2, late_rows=0)
    idle = [Marker("t", 1, 7, KIND_STATUS, None, "IDLE"), *marker(0, 9_000)[1:]]
    env.coordinator().commit_epoch(1, [pre_commit(env.target, 1, 0, [3])], idle,
                                   rows=3, late_rows=1)
    env.coordinator().commit_epoch(2, [], [], rows=0, late_rows=0)  # no rows: still a snapshot

    records = env.target.epoch_records(QUERY)
    assert [(r["epoch"], r["watermark"], r["watermark_source"], r["rows"], r["late_rows"])
            for r in records] == [(2, 9_000, "valve", 0, 0), (1, 9_000, "valve", 3, 1),
                                  (0, 4_000, "valve", 2, 0)]
    assert records[1]["idle_partitions"] == ["t/1"] and records[2]["idle_partitions"] == []
    assert records[0]["app_id"] == QUERY and env.snapshots() == 3
    summary = env.table().current_snapshot().summary
    assert summary["flinkish.watermark"] == "9000"
    assert env.target.committed_watermark(QUERY) == 9_000
    assert env.target.committed_watermark("other") is None
    assert env.read_ids() == [1, 2, 3]


def test_a_replayed_epoch_commits_nothing_and_removes_its_files(env: Env) -> None:
    env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1, 2])], [], 2, 0)
    # the driver crashed before Spark logged the batch: a new run replays it, its tasks
    # writing the rows again under their own transactions
    replay = [pre_commit(env.target, 0, 0, [1, 2], run="r2")]
    assert env.data_files() - env.referenced()

    outcome = env.coordinator().commit_epoch(0, replay, [], 2, 0)

    assert outcome.replayed and outcome.rolled_back == (txn(0, 0, run="r2").gid,)
    assert env.snapshots() == 1
    assert env.read_ids() == [1, 2]
    assert env.data_files() == env.referenced()  # the replay's files are gone


def test_commit_epoch_is_idempotent_on_the_snapshot_summary(env: Env) -> None:
    """A decided epoch committed, then the driver died before completing its checkpoint: the
    replay commits the recorded decision again, and the summary says the epoch is in."""
    pcs = [pre_commit(env.target, 0, 0, [1, 2])]
    record = env.coordinator()._epoch_record(0, {"markers": [], "rows": 2, "late_rows": 0})[1]
    env.target.commit_epoch(pcs, record)
    # another writer's append on top: the epoch is found behind it
    env.table().append(pa.Table.from_batches([batch([9])]).cast(
        env.table().schema().as_arrow()))

    env.target.commit_epoch(pcs, record)
    IcebergTarget(catalog_of(env.root), TABLE).commit_epoch(pcs, record)  # another process

    assert env.snapshots() == 2
    assert env.read_ids() == [1, 2, 9]


def test_an_aborted_epoch_leaves_no_file(env: Env) -> None:
    pcs = [pre_commit(env.target, 0, 0, [1, 2]), pre_commit(env.target, 0, 1, [3])]
    rolled = env.coordinator().abort_epoch(0, [*pcs, None])
    assert sorted(rolled) == [txn(0, 0).gid, txn(0, 1).gid]
    assert env.data_files() == set()
    assert env.target.pending(PREFIX, QUERY) == []
    assert env.read_ids() == []


def test_a_task_killed_mid_write_is_cleaned_up_by_the_next_commit(env: Env) -> None:
    dead = env.target.begin_transaction(txn(0, 1, run="r0"), SCHEMA)
    dead.write(batch([7, 8]))  # never closed nor pre-committed: the process died
    assert txn(0, 1, run="r0") in env.target.pending(PREFIX, QUERY)

    outcome = env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1])], [], 1, 0)

    assert txn(0, 1, run="r0").gid in outcome.rolled_back
    assert env.data_files() == env.referenced()
    assert env.read_ids() == [1]


def test_a_decided_epoch_is_committed_whole_by_recovery(env: Env) -> None:
    pcs = [pre_commit(env.target, 0, 0, [1, 2]), pre_commit(env.target, 0, 1, [3])]
    store = CheckpointStore(CheckpointStorage.open(str(env.root / "store")), owner=QUERY)
    store.begin(0, {"decision": [p.to_json() for p in pcs],
                    "markers": [m.to_json() for m in marker(0, 2_000)],
                    "rows": 3, "late_rows": 0, "spark_watermark": None})

    committed, rolled = env.coordinator().recover()

    assert sorted(committed) == [txn(0, 0).gid, txn(0, 1).gid] and rolled == []
    assert env.snapshots() == 1 and env.read_ids() == [1, 2, 3]
    assert env.target.committed_watermark(QUERY) == 2_000
    env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1, 2], run="r2")],
                                   [], 3, 0)
    assert env.snapshots() == 1
    assert env.data_files() == env.referenced()


def test_a_decided_file_removed_outside_fails_the_commit_clearly(env: Env) -> None:
    pcs = [pre_commit(env.target, 0, 0, [1, 2])]
    for name in env.data_files():
        (env.data / name).unlink()
    with pytest.raises(RuntimeError, match="removed outside flinkish"):
        env.coordinator().commit_epoch(0, pcs, [], 2, 0)
    assert env.read_ids() == []


def test_a_commit_that_loses_the_race_is_tried_again(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer commits between this commit's read of the table and its swap: the
    swap fails, and the commit is made again on top of the other writer's snapshot."""
    pcs = [pre_commit(env.target, 0, 0, [1, 2])]
    record = env.coordinator()._epoch_record(0, {"markers": [], "rows": 2, "late_rows": 0})[1]

    def other_writer_first(paths: list[str], epoch: Any) -> None:
        env.table().append(pa.Table.from_batches([batch([9])]).cast(
            env.table().schema().as_arrow()))

    monkeypatch.setattr(env.target, "_check_present", other_writer_first)
    env.target.commit_epoch(pcs, record)

    assert env.read_ids() == [1, 2, 9]
    assert env.snapshots() == 2


def test_an_epoch_committed_by_another_run_since_the_table_was_read_is_not_doubled(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs of one query (a zombie): the other commits the epoch between this one's read
    of the table and its swap. The swap fails; the table read again holds the epoch, so
    nothing is committed twice (pyiceberg's own retry would have appended it again)."""
    pcs = [pre_commit(env.target, 0, 0, [1, 2])]
    record = env.coordinator()._epoch_record(0, {"markers": [], "rows": 2, "late_rows": 0})[1]
    other = IcebergTarget(catalog_of(env.root), TABLE)
    monkeypatch.setattr(env.target, "_check_present",
                        lambda paths, epoch: other.commit_epoch(pcs, record))

    env.target.commit_epoch(pcs, record)

    assert env.snapshots() == 1
    assert env.read_ids() == [1, 2]


def test_late_rows_go_to_the_side_table(tmp_path: Path) -> None:
    env = Env(tmp_path, side=True)
    assert env.side is not None
    late_prefix = PREFIX + LATE_SUFFIX
    pcs = [pre_commit(env.target, 0, 0, [1, 2]),
           pre_commit(env.side, 0, 0, [-1], prefix=late_prefix)]
    env.coordinator().commit_epoch(0, pcs, [], 3, 1)
    env.coordinator().commit_epoch(1, [pre_commit(env.target, 1, 0, [3])], [], 1, 0)

    assert env.read_ids() == [1, 2, 3]
    assert env.read_ids("events.late") == [-1]
    assert env.snapshots() == 2
    assert env.snapshots("events.late") == 1  # a snapshot only in epochs with late rows
    assert env.side.pending(late_prefix, QUERY) == []
    assert env.data_files("events.late") == env.referenced("events.late")


def test_windows_become_start_and_end_columns_and_partitions_are_written(tmp_path: Path
                                                                          ) -> None:
    window = pa.struct([("start", pa.timestamp("us", tz="UTC")),
                        ("end", pa.timestamp("us", tz="UTC"))])
    schema = pa.schema([("window", window), ("k", pa.string()), ("count", pa.int64())])
    env = Env(tmp_path, schema=schema, partition_by=("k",))
    rows = pa.record_batch([
        pa.array([{"start": 0, "end": 10_000_000}, {"start": 10_000_000, "end": 20_000_000},
                  None], window),
        pa.array(["a", "b", None]), pa.array([3, 4, 5], pa.int64())], schema=schema)
    transaction = env.target.begin_transaction(txn(0, 0), schema)
    transaction.write(rows)
    env.coordinator().commit_epoch(0, [transaction.pre_commit()], [], 3, 0)

    table = env.table()
    assert [f.name for f in table.schema().fields] == ["window_start", "window_end", "k", "count"]
    assert str(table.spec().fields[0].transform) == "identity"
    got = table.scan().to_arrow().sort_by("count").to_pylist()
    assert [(r["k"], r["count"], r["window_start"]) for r in got] == [
        ("a", 3, datetime(1970, 1, 1, tzinfo=UTC)),
        ("b", 4, datetime(1970, 1, 1, 0, 0, 10, tzinfo=UTC)),
        (None, 5, None)]
    files = table.inspect.files().to_pylist()
    assert sorted(f["partition"]["k"] or "" for f in files) == ["", "a", "b"]  # one file each
    assert table.scan(row_filter="k == 'b'").to_arrow().column("count").to_pylist() == [4]


def test_an_existing_table_of_another_schema_is_refused(tmp_path: Path) -> None:
    IcebergTarget(catalog_of(tmp_path), TABLE).check(SCHEMA)
    other = pa.schema([("id", pa.string()), ("name", pa.string()), ("extra", pa.int32()),
                       ("eventTime", pa.timestamp("us", tz="UTC"))])
    with pytest.raises(ValueError, match="does not fit") as caught:
        IcebergTarget(catalog_of(tmp_path), TABLE).check(other)
    message = str(caught.value)
    assert "column 'id' is long in the table but string now" in message
    assert "columns only in the new schema: ['extra']" in message
    with pytest.raises(ValueError, match=r"partitioned by \[\], not \['name'\]"):
        IcebergTarget(catalog_of(tmp_path), TABLE, partition_by=("name",)).check(SCHEMA)
    with pytest.raises(ValueError, match="'nope' is not a column"):
        IcebergTarget(catalog_of(tmp_path), "events.u", partition_by=("nope",)).check(SCHEMA)
    catalog = load_catalog("flinkish", **catalog_of(tmp_path))
    with (catalog.create_table_transaction("events.by_day", SCHEMA) as create,
          create.update_spec() as spec):
        spec.add_field("eventTime", "day", "day")
    with pytest.raises(ValueError, match="identity of columns only"):
        IcebergTarget(catalog_of(tmp_path), "events.by_day").check(SCHEMA)


def test_a_tables_required_columns_are_written_and_nulls_refused_before_any_decision(
    tmp_path: Path
) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    catalog = load_catalog("flinkish", **catalog_of(tmp_path))
    catalog.create_namespace("events")
    catalog.create_table(TABLE, Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "eventTime", TimestamptzType(), required=False)))
    env = Env(tmp_path)  # the stream's id is nullable: fine while no row has it NULL
    env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1, 2, 3])],
                                   marker(0, 4_000), rows=3, late_rows=0)
    assert env.read_ids() == [1, 2, 3]

    transaction = env.target.begin_transaction(txn(1, 0), SCHEMA)
    with pytest.raises(ValueError, match=r"Iceberg table 'events.t': column 'id' is NOT "
                                         r"NULL there, but 1 row"):
        transaction.write(batch([4]).set_column(0, "id", pa.array([None], pa.int64())))
    transaction.abort()
    env.coordinator().commit_epoch(1, [pre_commit(env.target, 1, 0, [4])], [], 1, 0)
    assert env.read_ids() == [1, 2, 3, 4]


def test_an_existing_partitioned_table_is_written_by_its_partitions(tmp_path: Path) -> None:
    IcebergTarget(catalog_of(tmp_path), TABLE, partition_by=("name",)).check(SCHEMA)
    target = IcebergTarget(catalog_of(tmp_path), TABLE)  # no partitionBy: the table's
    files = pre_commit(target, 0, 0, [1, 2, 3]).detail["files"]  # type: ignore[index]
    assert sorted(f["partition"]["name"] for f in files) == ["n0", "n1"]
    assert sorted(f["records"] for f in files) == [1, 2]


def test_a_direct_write_is_visible_at_once(env: Env) -> None:
    env.target.write_direct(batch([1, 2]))
    env.target.write_direct(batch([]))
    assert env.read_ids() == [1, 2]
    assert env.target.pending(PREFIX, QUERY) == []


def test_the_options_name_the_catalog_and_mask_its_secrets(tmp_path: Path) -> None:
    options = parse_sink_options({
        "target": "iceberg", "table": "events.t", "checkpointLocation": str(tmp_path),
        "catalog.uri": "postgresql+psycopg://app:s3cret@db/lake", "catalog.warehouse": "s3://w",
        "catalog.s3.secret-access-key": "hidden-key", "iceberg.appId": "job-1",
        "partitionBy": "name", "lateData": "side", "lateData.table": "events.late"})
    assert options[CATALOG] == {"uri": "postgresql+psycopg://app:s3cret@db/lake",
                                     "warehouse": "s3://w", "s3.secret-access-key": "hidden-key"}
    assert options[APP_ID] == "job-1" and options[PARTITION_BY] == ("name",)
    assert "s3cret" not in repr(options) and "hidden-key" not in repr(options)
    assert {"s3cret", "hidden-key"} <= set(options.secrets)
    for bad, problem in [({"catalog.uri": "sqlite:///c.db"}, "option table is required"),
                         ({"table": "events.t"}, "option catalog.uri is required"),
                         ({"table": "a.b", "catalog.uri": "x", "path": "/p"},
                          "option path applies to targets parquet and delta only"),
                         ({"table": "a.b", "catalog.uri": "x", "delta.appId": "a"},
                          "delta.appId applies to target delta only"),
                         ({"table": "a.b", "catalog.uri": "x", "upsertKey": "k"}, "upsertKey"),
                         ({"table": "a.b", "catalog.uri": "x", "lateData": "side"},
                          "needs option lateData.table")]:
        with pytest.raises(ValueError, match=problem):
            parse_sink_options({"target": "iceberg", "checkpointLocation": str(tmp_path),
                                **bad})
    with pytest.raises(ValueError, match="catalog.* apply to target iceberg only"):
        parse_sink_options({"target": "delta", "path": str(tmp_path / "d"),
                            "checkpointLocation": str(tmp_path), "catalog.uri": "x"})


def test_the_transactions_command_lists_an_iceberg_tables_leftovers(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    from flinkish.cli import main

    env.target.begin_transaction(txn(0, 0), SCHEMA).write(batch([1]))  # died mid-write
    catalog = catalog_of(env.root)
    assert main(["transactions", "--iceberg", catalog["uri"], "--table", TABLE,
                 "--catalog", f"warehouse={catalog['warehouse']}", "--query", QUERY]) == 0
    assert f"lingering pre-commit {txn(0, 0).gid}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--iceberg needs --table"):
        main(["transactions", "--iceberg", catalog["uri"], "--query", QUERY])
