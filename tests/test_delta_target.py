"""DeltaTarget on a real Delta table (delta-rs) and a real CheckpointStore, without Spark: write
tasks are ``begin_transaction(...).write(batch)`` / ``.pre_commit()``, the driver is
:class:`TwoPhaseCommitCoordinator`, and what readers see is read back with ``deltalake``."""

from __future__ import annotations

import json
import pickle
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from staged_tables import PREFIX, QUERY, SCHEMA, batch, coordinator, marker, pre_commit, txn

from checkpointing import CheckpointStorage, CheckpointStore
from flinkish_core.markers import KIND_STATUS, Marker
from flinkish_sink import delta_target
from flinkish_sink.data_files import STAGING_DIR
from flinkish_sink.delta_stats import FileStats
from flinkish_sink.delta_target import (
    DeltaTarget,
    delta_location,
    partition_value,
)
from flinkish_sink.two_phase_commit import LATE_SUFFIX, TwoPhaseCommitCoordinator

UTC = timezone.utc


def table(path: Path) -> Any:
    return deltalake.DeltaTable(str(path))


def read_ids(path: Path) -> list[int]:
    """What a Delta reader sees (the table's latest version)."""
    return sorted(table(path).to_pyarrow_dataset().to_table().column("id").to_pylist())


def data_files(path: Path) -> set[str]:
    return {p.name for p in path.glob("part-*.parquet")}


def referenced(path: Path) -> set[str]:
    return set(pa.table(table(path).get_add_actions(flatten=True)).column("path").to_pylist())


class Env:
    def __init__(self, root: Path, *, side: bool = False, schema: pa.Schema = SCHEMA,
                 **options: Any) -> None:
        self.root = root
        self.path = root / "table"
        self.late_path = root / "late"
        self.target = DeltaTarget(str(self.path), **options)
        self.target.check(schema)
        self.side = None
        if side:
            self.side = DeltaTarget(str(self.late_path))
            self.side.check(SCHEMA)

    def coordinator(self) -> TwoPhaseCommitCoordinator:
        return coordinator(self.root, self.target, self.side)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


# -- one version per epoch -------------------------------------------------------------------


def test_an_epoch_is_invisible_until_committed_then_one_version(env: Env) -> None:
    pcs = [pre_commit(env.target, 0, 0, [1, 2, 3]), pre_commit(env.target, 0, 1, [4, 5])]
    created = table(env.path).version()
    assert len(data_files(env.path)) == 2
    assert read_ids(env.path) == []  # written, not referenced
    assert env.target.pending(PREFIX, QUERY) == [txn(0, 0), txn(0, 1)]

    outcome = env.coordinator().commit_epoch(0, pcs, marker(0, 4_000), rows=5, late_rows=0)

    assert read_ids(env.path) == [1, 2, 3, 4, 5]
    assert table(env.path).version() == created + 1  # both tasks' files in one version
    assert table(env.path).transaction_version(QUERY) == 0
    assert referenced(env.path) == data_files(env.path)
    assert env.target.pending(PREFIX, QUERY) == []
    assert not list((env.path / STAGING_DIR).iterdir())
    assert outcome.committed == (txn(0, 0).gid, txn(0, 1).gid)


def test_the_commit_carries_the_epochs_record(env: Env) -> None:
    coordinator = env.coordinator()
    coordinator.commit_epoch(0, [pre_commit(env.target, 0, 0, [1, 2])],
                             marker(0, 4_000) + marker(1, 6_000), rows=2, late_rows=0)
    idle = [Marker("t", 1, 7, KIND_STATUS, None, "IDLE"), *marker(0, 9_000)[1:]]
    env.coordinator().commit_epoch(1, [pre_commit(env.target, 1, 0, [3])], idle,
                                   rows=3, late_rows=1)

    history = table(env.path).history(2)
    records = [json.loads(h["userMetadata"])["flinkish"] for h in history]
    assert [(r["epoch"], r["watermark"], r["watermark_source"], r["rows"], r["late_rows"])
            for r in records] == [(1, 9_000, "valve", 3, 1), (0, 4_000, "valve", 2, 0)]
    assert records[0]["idle_partitions"] == ["t/1"] and records[1]["idle_partitions"] == []
    assert records[0]["query"] == QUERY and records[0]["app_id"] == QUERY
    assert env.target.epoch_records(QUERY)[0]["epoch"] == 1
    assert env.target.committed_watermark(QUERY) == 9_000
    assert env.target.committed_watermark("other") is None


def test_an_epoch_without_rows_still_commits_its_record(env: Env) -> None:
    before = table(env.path).version()
    env.coordinator().commit_epoch(0, [], marker(0, 1_000), rows=0, late_rows=0)
    assert table(env.path).version() == before + 1
    assert table(env.path).transaction_version(QUERY) == 0
    assert read_ids(env.path) == []
    assert env.target.committed_watermark(QUERY) == 1_000


# -- replays, aborts, crashes ----------------------------------------------------------------


def test_a_replayed_epoch_commits_nothing_and_removes_its_files(env: Env) -> None:
    env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1, 2])], [], 2, 0)
    version = table(env.path).version()
    # the driver crashed before Spark logged the batch: a new run replays it, its tasks
    # writing the rows again under their own transactions
    replay = [pre_commit(env.target, 0, 0, [1, 2], run="r2")]
    replay_files = data_files(env.path) - referenced(env.path)
    assert replay_files

    outcome = env.coordinator().commit_epoch(0, replay, [], 2, 0)

    assert outcome.replayed and outcome.rolled_back == (txn(0, 0, run="r2").gid,)
    assert table(env.path).version() == version
    assert read_ids(env.path) == [1, 2]
    assert data_files(env.path) == referenced(env.path)  # the replay's files are gone
    assert env.target.pending(PREFIX, QUERY) == []


def test_commit_epoch_is_idempotent_on_the_tables_txn(env: Env) -> None:
    """A decided epoch committed, then the driver died before completing its checkpoint: the
    replay commits the recorded decision again, and the table's txn says it is in."""
    pcs = [pre_commit(env.target, 0, 0, [1, 2])]
    record = env.coordinator()._epoch_record(0, {"markers": [], "rows": 2, "late_rows": 0})[1]
    env.target.commit_epoch(pcs, record)
    version = table(env.path).version()

    env.target.commit_epoch(pcs, record)
    DeltaTarget(str(env.path)).commit_epoch(pcs, record)  # another process, same decision

    assert table(env.path).version() == version
    assert read_ids(env.path) == [1, 2]


def test_the_driver_reads_the_table_once_not_every_micro_batch(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark builds the target anew every micro-batch: the process's handle of the table
    carries over and catches up on the log's new commits, so the log is not replayed from
    its last checkpoint at every epoch."""
    opened: list[str] = []

    class Counted(deltalake.DeltaTable):
        def __init__(self, uri: str, *args: Any, **kwargs: Any) -> None:
            opened.append(uri)
            super().__init__(uri, *args, **kwargs)

    monkeypatch.setattr(deltalake, "DeltaTable", Counted)
    for epoch in range(3):
        env.target = DeltaTarget(str(env.path))  # a micro-batch's writer
        pcs = [pre_commit(env.target, epoch, 0, [epoch])]
        env.coordinator().commit_epoch(epoch, pcs, [], rows=1, late_rows=0)
    assert opened == []  # the handle Env's check opened served every micro-batch
    assert read_ids(env.path) == [0, 1, 2]


def test_a_table_replaced_under_a_running_query_is_read_anew(env: Env) -> None:
    """The table's directory deleted and a new table made there: the handle the process kept
    cannot see that through the log's new commits, and is not trusted (its txn would say the
    new table holds epochs it does not)."""
    for epoch in range(2):
        pcs = [pre_commit(env.target, epoch, 0, [epoch])]
        env.coordinator().commit_epoch(epoch, pcs, [], rows=1, late_rows=0)
    shutil.rmtree(env.path)
    target = DeltaTarget(str(env.path))
    target.check(SCHEMA)
    record = env.coordinator()._epoch_record(0, {"markers": [], "rows": 1, "late_rows": 0})[1]

    target.commit_epoch([pre_commit(target, 0, 0, [7])], record)

    assert read_ids(env.path) == [7]
    assert table(env.path).transaction_version(QUERY) == 0


def test_an_aborted_epoch_leaves_no_file(env: Env) -> None:
    pcs = [pre_commit(env.target, 0, 0, [1, 2]), pre_commit(env.target, 0, 1, [3])]
    rolled = env.coordinator().abort_epoch(0, [*pcs, None])
    assert sorted(rolled) == [txn(0, 0).gid, txn(0, 1).gid]
    assert data_files(env.path) == set()
    assert env.target.pending(PREFIX, QUERY) == []
    assert read_ids(env.path) == []


def test_a_task_killed_mid_write_is_cleaned_up_by_the_next_commit(env: Env) -> None:
    dead = env.target.begin_transaction(txn(0, 1, run="r0"), SCHEMA)
    dead.write(batch([7, 8]))  # never closed nor pre-committed: the process died
    assert txn(0, 1, run="r0") in env.target.pending(PREFIX, QUERY)

    outcome = env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1])], [], 1, 0)

    assert txn(0, 1, run="r0").gid in outcome.rolled_back
    assert data_files(env.path) == referenced(env.path)
    assert read_ids(env.path) == [1]


def test_a_decided_epoch_is_committed_whole_by_recovery(env: Env) -> None:
    """The driver died after recording the decision: ``recover`` (the CLI's --resolve, or
    the replay) commits every decided pre-commit as one version with the epoch's record."""
    pcs = [pre_commit(env.target, 0, 0, [1, 2]), pre_commit(env.target, 0, 1, [3])]
    store = CheckpointStore(CheckpointStorage.open(str(env.root / "store")), owner=QUERY)
    store.begin(0, {"decision": [p.to_json() for p in pcs],
                    "markers": [m.to_json() for m in marker(0, 2_000)],
                    "rows": 3, "late_rows": 0, "spark_watermark": None})
    before = table(env.path).version()

    committed, rolled = env.coordinator().recover()

    assert sorted(committed) == [txn(0, 0).gid, txn(0, 1).gid] and rolled == []
    assert table(env.path).version() == before + 1
    assert read_ids(env.path) == [1, 2, 3]
    assert env.target.committed_watermark(QUERY) == 2_000
    # the replay then finds the epoch in the table and completes it without a second version
    env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1, 2], run="r2")],
                                   [], 3, 0)
    assert table(env.path).version() == before + 1
    assert data_files(env.path) == referenced(env.path)


def test_a_decided_file_removed_outside_fails_the_commit_clearly(env: Env) -> None:
    pcs = [pre_commit(env.target, 0, 0, [1, 2])]
    for name in data_files(env.path):
        (env.path / name).unlink()
    with pytest.raises(RuntimeError, match="removed outside flinkish"):
        env.coordinator().commit_epoch(0, pcs, [], 2, 0)
    assert read_ids(env.path) == []


# -- late rows -------------------------------------------------------------------------------


def test_late_rows_go_to_the_side_table_each_under_its_own_txn(tmp_path: Path) -> None:
    env = Env(tmp_path, side=True)
    assert env.side is not None
    late_prefix = PREFIX + LATE_SUFFIX
    pcs = [pre_commit(env.target, 0, 0, [1, 2]),
           pre_commit(env.side, 0, 0, [-1], prefix=late_prefix)]
    env.coordinator().commit_epoch(0, pcs, [], 3, 1)
    env.coordinator().commit_epoch(1, [pre_commit(env.target, 1, 0, [3])], [], 1, 0)

    assert read_ids(env.path) == [1, 2, 3]
    assert read_ids(env.late_path) == [-1]
    assert table(env.path).transaction_version(QUERY) == 1
    # the side table gets a version only in epochs with late rows
    assert table(env.late_path).transaction_version(QUERY) == 0
    assert env.side.pending(late_prefix, QUERY) == []
    assert data_files(env.late_path) == referenced(env.late_path)


# -- tables: creation, schema, partitions ----------------------------------------------------


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

    dt = table(env.path)
    assert dt.metadata().partition_columns == ["k"]
    assert pa.schema(dt.schema().to_arrow()).names == ["window_start", "window_end", "k", "count"]
    got = dt.to_pyarrow_dataset().to_table().sort_by("count").to_pylist()
    assert [(r["k"], r["count"], r["window_start"]) for r in got] == [
        ("a", 3, datetime(1970, 1, 1, tzinfo=UTC)),
        ("b", 4, datetime(1970, 1, 1, 0, 0, 10, tzinfo=UTC)),
        (None, 5, None)]
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    assert sorted(a["partition.k"] or "" for a in adds) == ["", "a", "b"]  # one file each
    assert all(a["num_records"] == 1 for a in adds)


def test_an_existing_table_of_another_schema_is_refused(tmp_path: Path) -> None:
    DeltaTarget(str(tmp_path / "t")).check(SCHEMA)
    other = pa.schema([("id", pa.string()), ("name", pa.string()), ("extra", pa.int32()),
                       ("eventTime", pa.timestamp("us", tz="UTC"))])
    with pytest.raises(ValueError, match="does not fit") as caught:
        DeltaTarget(str(tmp_path / "t")).check(other)
    message = str(caught.value)
    assert "column 'id' is long in the table but string now" in message
    assert "columns only in the new schema: ['extra']" in message
    with pytest.raises(ValueError, match=r"partitioned by \[\], not \['name'\]"):
        DeltaTarget(str(tmp_path / "t"), partition_by=("name",)).check(SCHEMA)
    with pytest.raises(ValueError, match="'nope' is not a column"):
        DeltaTarget(str(tmp_path / "u"), partition_by=("nope",)).check(SCHEMA)


def constrained_table(path: Path, **constraints: str) -> None:
    """A table whose ``id`` is NOT NULL, with ``constraints`` (name -> SQL)."""
    fields = [f.with_nullable(f.name != "id") for f in SCHEMA]
    deltalake.DeltaTable.create(str(path), pa.schema(fields))
    if constraints:
        table(path).alter.add_constraint(constraints)


def test_rows_the_tables_constraints_refuse_fail_the_task_before_any_decision(
    tmp_path: Path
) -> None:
    constrained_table(tmp_path / "table", positive="id > 0", named="name IN ('n0', 'n1')")
    env = Env(tmp_path)  # the stream's id is nullable: fine while no row has it NULL
    env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1, 2])], [], 2, 0)
    assert read_ids(env.path) == [1, 2]

    shipped = pickle.loads(pickle.dumps(env.target))  # as Spark ships it to a task
    transaction = shipped.begin_transaction(txn(1, 0), SCHEMA)
    with pytest.raises(ValueError, match=r"column 'id' is NOT NULL there, but 1 row"):
        transaction.write(batch([3]).set_column(
            0, "id", pa.array([None], pa.int64())))
    transaction = shipped.begin_transaction(txn(1, 0, 1), SCHEMA)
    with pytest.raises(ValueError, match=r"1 row\(s\) of the stream break its CHECK "
                                         r"constraint 'positive' \(id > 0\)"):
        transaction.write(batch([3, -4]))
    transaction = shipped.begin_transaction(txn(1, 0, 2), SCHEMA)
    with pytest.raises(ValueError, match="constraint 'named'"):
        transaction.write(batch([3], name="x"))
    transaction.abort()
    assert read_ids(env.path) == [1, 2]


def test_a_columns_invariant_is_checked_like_a_constraint(tmp_path: Path) -> None:
    invariant = json.dumps({"expression": {"expression": "id < 100"}})
    fields = [f.with_metadata({"delta.invariants": invariant}) if f.name == "id" else f
              for f in SCHEMA]
    deltalake.DeltaTable.create(str(tmp_path / "table"), pa.schema(fields))
    env = Env(tmp_path)
    transaction = env.target.begin_transaction(txn(0, 0), SCHEMA)
    with pytest.raises(ValueError, match=r"constraint 'invariant of id' \(id < 100\)"):
        transaction.write(batch([5, 100]))


def test_a_constraint_a_task_cannot_evaluate_is_refused_at_start(tmp_path: Path) -> None:
    constrained_table(tmp_path / "t", short="upper(name) = name")
    with pytest.raises(ValueError, match=r"CHECK constraint 'short' \(.*\), which flinkish "
                                         r"cannot evaluate.*function upper\(\)"):
        DeltaTarget(str(tmp_path / "t")).check(SCHEMA)
    nested = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.field("tag", pa.string(),
                                                                        nullable=False)))])
    deltalake.DeltaTable.create(str(tmp_path / "n"), nested)
    streamed = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string()))])
    with pytest.raises(ValueError, match=r"NOT NULL fields inside its columns \(\['tags\[\]'\]\)"):
        DeltaTarget(str(tmp_path / "n")).check(streamed)


def test_an_existing_partitioned_table_is_written_by_its_partitions(tmp_path: Path) -> None:
    DeltaTarget(str(tmp_path / "t"), partition_by=("name",)).check(SCHEMA)
    target = DeltaTarget(str(tmp_path / "t"))  # no partitionBy: the table's
    shipped = pickle.loads(pickle.dumps(target))  # as Spark ships it to a task
    transaction = shipped.begin_transaction(txn(0, 0), SCHEMA)
    transaction.write(batch([1, 2, 3]))
    adds = transaction.pre_commit().detail["adds"]  # type: ignore[index]
    assert sorted(a["partition_values"]["name"] for a in adds) == ["n0", "n1"]


def test_a_direct_write_is_visible_at_once(env: Env) -> None:
    env.target.write_direct(batch([1, 2]))
    env.target.write_direct(batch([]))
    assert read_ids(env.path) == [1, 2]
    assert env.target.pending(PREFIX, QUERY) == []


# -- pieces ----------------------------------------------------------------------------------


def test_file_statistics_bound_every_value() -> None:
    schema = pa.schema([("i", pa.int32()), ("f", pa.float64()), ("s", pa.string()),
                        ("t", pa.timestamp("us", tz="UTC")), ("n", pa.timestamp("ms")),
                        ("b", pa.binary()), ("ok", pa.bool_()),
                        ("st", pa.struct([("x", pa.int64())])), ("l", pa.list_(pa.int64())),
                        ("e", pa.string())])
    stats = FileStats(schema)
    stats.add(pa.record_batch([
        pa.array([3, None], pa.int32()), pa.array([1.5, -2.0]),
        pa.array(["b" * 40, "a"]), pa.array([1_500, 2_000_001], pa.timestamp("us", tz="UTC")),
        pa.array([1_000, None], pa.timestamp("ms")), pa.array([b"x", None]),
        pa.array([True, None]), pa.array([{"x": 1}, None], schema.field("st").type),
        pa.array([[1], None], pa.list_(pa.int64())), pa.array([None, None], pa.string())],
        schema=schema))
    stats.add(pa.record_batch([
        pa.array([-7], pa.int32()), pa.array([2.0]), pa.array(["c" * 33 + "d"]),
        pa.array([None], pa.timestamp("us", tz="UTC")), pa.array([2_000], pa.timestamp("ms")),
        pa.array([b"y"]), pa.array([True]), pa.array([{"x": 9}], schema.field("st").type),
        pa.array([[2]], pa.list_(pa.int64())), pa.array([None], pa.string())],
        schema=schema))
    got = json.loads(stats.to_json())
    assert got["numRecords"] == 3
    # timestamps to the millisecond, the minimum down and the maximum up; a long string's
    # maximum cut and followed by the highest code point; binary and lists get nothing; an
    # all-null column a null count alone
    assert got["minValues"] == {"i": -7, "f": -2.0, "s": "a", "t": "1970-01-01T00:00:00.001Z",
                                "n": "1970-01-01 00:00:01.000", "ok": True, "st": {"x": 1}}
    assert got["maxValues"] == {"i": 3, "f": 2.0, "s": "c" * 32 + "\U0010ffff",
                                "t": "1970-01-01T00:00:02.001Z",
                                "n": "1970-01-01 00:00:02.000", "ok": True, "st": {"x": 9}}
    assert got["nullCount"] == {"i": 1, "f": 0, "s": 0, "t": 1, "n": 1, "ok": 1,
                                "st": {"x": 1}, "e": 3}


@pytest.mark.parametrize("column", [
    pa.array([1.0, float("nan")]), pa.array([float("-inf"), 1.0]),
    pa.array([1, 2], pa.decimal128(20, 2)), pa.array([1, 2], pa.uint8())])
def test_a_file_without_a_safe_bound_gets_its_row_count_alone(column: pa.Array) -> None:
    schema = pa.schema([("id", pa.int64()), ("v", column.type)])
    stats = FileStats(schema)
    stats.add(pa.record_batch([pa.array([1, 2], pa.int64()), column], schema=schema))
    assert json.loads(stats.to_json()) == {"numRecords": 2}


def test_partition_values_and_locations() -> None:
    assert partition_value(datetime(2024, 5, 1, 12, tzinfo=UTC)) == "2024-05-01T12:00:00.000000Z"
    assert partition_value(True) == "true" and partition_value(7) == "7"
    assert partition_value(None) is None
    uri, options = delta_location(
        "s3://key:secret@bucket/t?endpoint_override=127.0.0.1:9000&scheme=http&region=r1")
    assert uri == "s3://bucket/t"
    assert options == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
                       "AWS_REGION": "r1", "AWS_CONDITIONAL_PUT": "etag",
                       "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret"}
    assert "secret" not in repr(DeltaTarget(
        "s3://key:secret@bucket/t?endpoint_override=127.0.0.1:9000&scheme=http"))
    assert delta_location("/data/t") == ("/data/t", {})


def test_the_transactions_command_lists_and_resolves_a_delta_tables_leftovers(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    from flinkish.cli import main

    env.target.begin_transaction(txn(0, 0), SCHEMA).write(batch([1]))  # died mid-write
    assert main(["transactions", "--delta", str(env.path), "--query", QUERY]) == 0
    assert f"lingering pre-commit {txn(0, 0).gid}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--resolve needs --checkpoint"):
        main(["transactions", "--delta", str(env.path), "--query", QUERY, "--resolve"])


def test_upsert_replaces_rows_by_key_in_one_version_per_epoch(tmp_path: Path) -> None:
    """With an upsert key an epoch's rows replace the table's rows of their keys (a NULL key
    matching a NULL key), the last of an epoch's rows per key winning, in one version."""
    window = pa.struct([("start", pa.timestamp("us", tz="UTC")),
                        ("end", pa.timestamp("us", tz="UTC"))])
    schema = pa.schema([("k", pa.string()), ("window", window), ("pane", pa.int64())])
    env = Env(tmp_path, schema=schema, upsert_key=("k", "window_start"),
              partition_by=("k",))

    def panes(*rows: tuple[str | None, int, int]) -> pa.RecordBatch:
        return pa.record_batch([
            pa.array([k for k, _, _ in rows]),
            pa.array([{"start": s * 1_000_000, "end": (s + 10) * 1_000_000}
                      for _, s, _ in rows], window),
            pa.array([p for _, _, p in rows], pa.int64())], schema=schema)

    def epoch(n: int, *tasks: pa.RecordBatch) -> None:
        pcs = []
        for task, rows in enumerate(tasks):
            transaction = env.target.begin_transaction(txn(n, task), schema)
            transaction.write(rows)
            pcs.append(transaction.pre_commit())
        env.coordinator().commit_epoch(n, pcs, [], sum(t.num_rows for t in tasks), 0)

    epoch(0, panes(("a", 0, 0), ("b", 0, 0)), panes((None, 0, 0)))
    version = table(env.path).version()
    epoch(1, panes(("a", 0, 1), ("a", 0, 2), ("a", 10, 0)), panes((None, 0, 1)))
    epoch(1, panes(("a", 0, 9)))  # a replay: the table holds epoch 1 already

    got = table(env.path).to_pyarrow_dataset().to_table().to_pylist()
    assert sorted((r["k"] or "", r["window_start"].second, r["pane"]) for r in got) == [
        ("", 0, 1), ("a", 0, 2), ("a", 10, 0), ("b", 0, 0)]
    assert table(env.path).version() == version + 1
    assert data_files(env.path) == set()  # the tasks' files went: the merge wrote its own
    assert env.target.pending(PREFIX, QUERY) == []
    assert env.target.committed_watermark(QUERY) is None
    assert [r["epoch"] for r in env.target.epoch_records(QUERY)] == [1, 0]


def test_compaction_every_n_epochs_keeps_every_row_once(tmp_path: Path) -> None:
    env = Env(tmp_path, compact_every=2)
    for epoch in range(4):
        pcs = [pre_commit(env.target, epoch, task, [epoch * 10 + task * 3 + i for i in range(3)])
               for task in range(3)]
        env.coordinator().commit_epoch(epoch, pcs, marker(0, epoch * 1_000), 9, 0)
        if epoch == 1:  # a replay after the compaction changes nothing
            version = table(env.path).version()
            env.coordinator().commit_epoch(1, [], [], 9, 0)
            assert table(env.path).version() == version

    ids = [epoch * 10 + task * 3 + i for epoch in range(4) for task in range(3)
           for i in range(3)]
    assert read_ids(env.path) == sorted(ids)
    operations = [h["operation"] for h in reversed(table(env.path).history())]
    assert operations == ["CREATE TABLE", "WRITE", "WRITE", "OPTIMIZE", "WRITE", "WRITE",
                          "OPTIMIZE"]
    assert len(referenced(env.path)) == 1  # twelve small files, compacted into one
    assert env.target.committed_watermark(QUERY) == 3_000
    assert table(env.path).transaction_version(QUERY) == 3


class Crash(BaseException):
    """The driver's process dying (not an error the target could catch)."""


def test_a_crash_before_a_compaction_defers_it_rather_than_skipping_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = Env(tmp_path, compact_every=2)
    compact = deltalake.table.TableOptimizer.compact

    def killed(*_: Any, **__: Any) -> None:
        monkeypatch.setattr(deltalake.table.TableOptimizer, "compact", compact)
        raise Crash("the driver died right after the epoch's commit")

    monkeypatch.setattr(deltalake.table.TableOptimizer, "compact", killed)
    env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1])], [], 1, 0)
    with pytest.raises(Crash):
        env.coordinator().commit_epoch(1, [pre_commit(env.target, 1, 0, [2])], [], 1, 0)
    assert table(env.path).transaction_version(QUERY) == 1  # epoch 1 is in, not compacted
    # the restarted query replays epoch 1: it commits nothing and compacts
    env.coordinator().commit_epoch(1, [pre_commit(env.target, 1, 0, [2], run="r2")], [], 1, 0)
    operations = [h["operation"] for h in reversed(table(env.path).history())]
    assert operations == ["CREATE TABLE", "WRITE", "WRITE", "OPTIMIZE"]
    assert len(referenced(env.path)) == 1
    assert read_ids(env.path) == [1, 2]


def test_vacuum_deletes_what_a_killed_compaction_left_and_keeps_decided_files(
    tmp_path: Path
) -> None:
    import os

    import pyarrow.parquet as pq

    env = Env(tmp_path, compact_every=2, vacuum_retention_hours=1)
    env.coordinator().commit_epoch(0, [pre_commit(env.target, 0, 0, [1])], [], 1, 0)
    # an OPTIMIZE killed before its commit left its file; another query's epoch is decided,
    # its files waiting for that query's restart; both older than the retention
    orphan = env.path / "part-00001-0b7c3a5e-c000.zstd.parquet"
    pq.write_table(pa.table({"id": [1]}), orphan)
    other = pre_commit(env.target, 0, 0, [7], prefix="other")
    waiting = env.path / other.detail["adds"][0]["path"]  # type: ignore[index]
    hours_ago = datetime.now().timestamp() - 3 * 3600
    for path in (orphan, waiting):
        os.utime(path, (hours_ago, hours_ago))

    env.coordinator().commit_epoch(1, [pre_commit(env.target, 1, 0, [2])], [], 1, 0)
    assert not orphan.exists()
    assert waiting.exists()
    assert read_ids(env.path) == [1, 2]


def test_readers_skipping_files_by_statistics_find_every_row(tmp_path: Path) -> None:
    """Every bound is safe for delta-rs' reader, which prunes files by the add actions'
    statistics: a filtered read of each value of each column finds its row, whether the
    value is a file's minimum or maximum, between milliseconds or past the string prefix."""
    from decimal import Decimal

    import pyarrow.dataset as ds

    long = "x" * 40
    schema = pa.schema([
        ("id", pa.int64()), ("name", pa.string()), ("tz", pa.timestamp("us", tz="UTC")),
        ("ntz", pa.timestamp("us")), ("day", pa.date32()), ("ok", pa.bool_()),
        ("price", pa.decimal128(10, 2)), ("f", pa.float64()), ("key", pa.binary())])
    rows = [
        (1, long + "1", 500, 1_500, 1, True, Decimal("0.10"), 0.5, b"a"),
        (2, "a", 1_500, 999, 2, False, Decimal("7.25"), -1.0, b"b"),
        (3, long + "3", 2_999, 2_001, 3, False, Decimal("3.00"), 2.5, b"c"),
        (4, "b", 2_001, 3_999, 4, True, None, None, None),
        (5, "c", 9_000, 9_000, 5, True, Decimal("1.00"), float("nan"), b"e"),
    ]
    env = Env(tmp_path, schema=schema)
    pcs = []
    for task, part in enumerate([rows[:2], rows[2:4], rows[4:]]):
        transaction = env.target.begin_transaction(txn(0, task), schema)
        transaction.write(pa.record_batch(
            [pa.array([r[i] for r in part], f.type) for i, f in enumerate(schema)],
            schema=schema))
        pcs.append(transaction.pre_commit())
    env.coordinator().commit_epoch(0, pcs, [], len(rows), 0)

    dataset = table(env.path).to_pyarrow_dataset()
    for row in rows:
        for field, value in zip(schema, row, strict=True):
            if value is None or value != value:  # NaN
                continue
            found = dataset.to_table(filter=ds.field(field.name) == pa.scalar(value, field.type))
            assert row[0] in found.column("id").to_pylist(), (field.name, value)


def test_an_epoch_committed_by_another_run_since_the_table_was_read_is_not_doubled(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one query (a zombie): the other commits the epoch between this one's read
    of the table and its commit. delta-rs refuses the second commit with the same app id;
    the table's txn then says the epoch is in, so nothing fails and nothing is doubled."""
    pcs = [pre_commit(env.target, 0, 0, [1, 2])]
    record = env.coordinator()._epoch_record(0, {"markers": [], "rows": 2, "late_rows": 0})[1]
    other = DeltaTarget(str(env.path))

    def other_run_commits(adds: Any, epoch: int) -> None:
        # the other run is another process: a table handle of its own
        with monkeypatch.context() as elsewhere:
            elsewhere.setattr(delta_target, "_TABLES", {})
            other.commit_epoch(pcs, record)

    monkeypatch.setattr(env.target, "_check_present", other_run_commits)
    before = table(env.path).version()

    env.target.commit_epoch(pcs, record)

    assert table(env.path).version() == before + 1
    assert read_ids(env.path) == [1, 2]
