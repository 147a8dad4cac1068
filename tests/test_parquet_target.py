"""ParquetTarget: staged files stay invisible until commit, and commit/rollback are idempotent."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

from flinkish_sink.parquet_target import (
    EPOCHS_DIR,
    STAGING_DIR,
    ParquetTarget,
    schema_differences,
)
from flinkish_sink.target import PreCommit, TransactionId

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def batch(start: int, count: int) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    return pa.record_batch([pa.array(ids, pa.int64()), [f"n{i}" for i in ids]], schema=SCHEMA)


def txn(
    epoch: int = 1, task: int = 0, attempt: int = 0, *, prefix: str = "flinkish", query: str = "q1"
) -> TransactionId:
    return TransactionId(prefix, query, epoch, task, attempt)


def read_ids(path: str | Path, filesystem: pafs.FileSystem | None = None) -> list[int]:
    """What a reader of the directory sees (pyarrow.dataset skips '_'/'.' names like Spark)."""
    table = ds.dataset(str(path), filesystem=filesystem, format="parquet").to_table()
    return sorted(table.column("id").to_pylist()) if table.num_rows else []


def files_of(pre_commit: PreCommit) -> list[str]:
    assert pre_commit.detail is not None
    return list(pre_commit.detail["files"])


def staged(target: ParquetTarget, pre_commit: PreCommit) -> list[Path]:
    directory = Path(target.staged_dir(pre_commit.txn))
    return [directory / name for name in files_of(pre_commit)]


def write_txn(target: ParquetTarget, t: TransactionId, *batches: pa.RecordBatch) -> PreCommit:
    transaction = target.begin_transaction(t, SCHEMA)
    for b in batches:
        transaction.write(b)
    return transaction.pre_commit()


@pytest.fixture
def target(tmp_path: Path) -> ParquetTarget:
    result = ParquetTarget(str(tmp_path / "out"))
    result.check(SCHEMA)
    return result


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


# -- round trip ------------------------------------------------------------------------------


def test_staged_rows_are_invisible_until_commit(target: ParquetTarget, out: Path) -> None:
    pre_commit = write_txn(target, txn(), batch(0, 3), batch(3, 2))

    assert pre_commit.rows == 5
    assert all(p.is_file() for p in staged(target, pre_commit))
    assert read_ids(out) == []

    target.commit(PreCommit.from_json(json.loads(json.dumps(pre_commit.to_json()))))

    assert read_ids(out) == [0, 1, 2, 3, 4]
    committed = [p for p in out.iterdir() if p.is_file()]
    assert [p.name for p in committed] == files_of(pre_commit)
    assert not any(p.name.startswith(("_", ".")) for p in committed)
    assert not (out / STAGING_DIR / "flinkish~q1~1~0~0").exists()
    assert target.pending("flinkish", "q1") == []


def test_commit_twice_is_once(target: ParquetTarget, out: Path) -> None:
    pre_commit = write_txn(target, txn(), batch(0, 4))

    target.commit(pre_commit)
    target.commit(pre_commit)

    assert read_ids(out) == [0, 1, 2, 3]


def test_commit_completes_after_crash_between_moves(tmp_path: Path) -> None:
    target = ParquetTarget(str(tmp_path), max_rows_per_file=2)
    pre_commit = write_txn(target, txn(), batch(0, 5))
    files = staged(target, pre_commit)
    assert len(files) == 3
    files[0].rename(tmp_path / files[0].name)  # the first move happened, then the driver died

    target.commit(pre_commit)

    assert read_ids(tmp_path) == [0, 1, 2, 3, 4]
    assert target.pending("flinkish", "q1") == []


def test_commit_fails_whole_when_staged_files_were_lost(tmp_path: Path) -> None:
    target = ParquetTarget(str(tmp_path), max_rows_per_file=2)
    pre_commit = write_txn(target, txn(), batch(0, 4))
    kept, lost = staged(target, pre_commit)
    lost.unlink()

    with pytest.raises(RuntimeError, match=lost.name):
        target.commit(pre_commit)

    assert kept.is_file()
    assert read_ids(tmp_path) == []


def test_commit_rejects_a_pre_commit_without_files(target: ParquetTarget) -> None:
    with pytest.raises(ValueError, match="lists no files"):
        target.commit(PreCommit(txn(), 0, detail=None))


def test_zero_rows_commit_no_file(target: ParquetTarget, out: Path) -> None:
    transaction = target.begin_transaction(txn(), SCHEMA)
    transaction.write(batch(0, 0))
    pre_commit = transaction.pre_commit()

    assert pre_commit.rows == 0
    assert pre_commit.detail == {"files": []}
    assert target.pending("flinkish", "q1") == [txn()]
    target.commit(pre_commit)
    assert [p.name for p in out.iterdir() if not p.name.startswith("_")] == []
    assert target.pending("flinkish", "q1") == []


def test_max_rows_per_file_splits_batches_exactly(tmp_path: Path) -> None:
    target = ParquetTarget(str(tmp_path), max_rows_per_file=3)
    pre_commit = write_txn(target, txn(), batch(0, 4), batch(4, 3))
    target.commit(pre_commit)

    sizes = [ds.dataset(str(tmp_path / n)).count_rows() for n in files_of(pre_commit)]
    assert sizes == [3, 3, 1]
    assert read_ids(tmp_path) == list(range(7))


def test_write_after_pre_commit_fails(target: ParquetTarget) -> None:
    transaction = target.begin_transaction(txn(), SCHEMA)
    transaction.pre_commit()
    with pytest.raises(RuntimeError, match="already pre-committed"):
        transaction.write(batch(0, 1))


# -- rollback, abort, pending ----------------------------------------------------------------


def test_rollback_discards_and_is_idempotent(target: ParquetTarget, out: Path) -> None:
    pre_commit = write_txn(target, txn(), batch(0, 3))

    target.rollback(pre_commit.txn)
    target.rollback(pre_commit.txn)

    assert not any(p.exists() for p in staged(target, pre_commit))
    assert target.pending("flinkish", "q1") == []
    assert read_ids(out) == []


def test_abort_removes_the_half_written_file(target: ParquetTarget) -> None:
    transaction = target.begin_transaction(txn(), SCHEMA)
    transaction.write(batch(0, 3))
    directory = Path(target.staged_dir(txn()))
    assert any(directory.iterdir())

    transaction.abort()

    assert not directory.exists()
    assert target.pending("flinkish", "q1") == []


def test_pending_lists_staged_transactions_by_prefix_and_query(target: ParquetTarget) -> None:
    committed = write_txn(target, txn(epoch=1), batch(0, 1))
    target.commit(committed)
    prepared = write_txn(target, txn(epoch=2, task=3, attempt=1), batch(1, 1))
    half_written = target.begin_transaction(txn(epoch=2, task=4), SCHEMA)
    half_written.write(batch(2, 1))
    write_txn(target, txn(epoch=2, query="other"), batch(3, 1))
    write_txn(target, txn(epoch=2, prefix="someone.else"), batch(4, 1))
    target.write_direct(batch(5, 1))

    assert target.pending("flinkish", "q1") == [prepared.txn, txn(epoch=2, task=4)]
    assert target.pending("flinkish", "other") == [txn(epoch=2, query="other")]
    assert target.pending("someone.else", "q1") == [txn(epoch=2, prefix="someone.else")]
    assert target.pending("flinkish", "nothing") == []


def test_pending_on_a_fresh_directory_is_empty(tmp_path: Path) -> None:
    assert ParquetTarget(str(tmp_path / "never-written")).pending("flinkish", "q1") == []


def test_rerun_of_the_same_attempt_replaces_what_it_staged(tmp_path: Path) -> None:
    target = ParquetTarget(str(tmp_path), max_rows_per_file=2)
    write_txn(target, txn(), batch(0, 6))  # three files, never committed
    pre_commit = write_txn(target, txn(), batch(10, 1))  # the re-run stages one

    target.commit(pre_commit)

    assert read_ids(tmp_path) == [10]


# -- check -----------------------------------------------------------------------------------


def test_check_creates_the_directory(tmp_path: Path) -> None:
    ParquetTarget(str(tmp_path / "a" / "b")).check(SCHEMA)
    assert (tmp_path / "a" / "b").is_dir()


def test_check_accepts_the_same_columns_in_any_order_and_nullability(
    target: ParquetTarget,
) -> None:
    target.commit(write_txn(target, txn(), batch(0, 1)))
    target.check(pa.schema([pa.field("name", pa.string()), pa.field("id", pa.int64(), False)]))


def test_check_names_the_differing_columns(target: ParquetTarget) -> None:
    target.commit(write_txn(target, txn(), batch(0, 1)))
    incompatible = pa.schema([("id", pa.string()), ("extra", pa.float64())])

    with pytest.raises(ValueError) as error:
        target.check(incompatible)

    message = str(error.value)
    assert "['name']" in message  # only in the existing files
    assert "['extra']" in message  # only in the new schema
    assert "'id' is int64 in the existing files but string now" in message


def test_schema_differences_is_empty_for_equal_schemas() -> None:
    assert schema_differences(SCHEMA, SCHEMA) == []


def test_check_rejects_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        ParquetTarget(str(tmp_path / "f")).check(SCHEMA)


def test_bad_path_is_named() -> None:
    with pytest.raises(ValueError, match="'nosuchscheme://bucket/x'"):
        ParquetTarget("nosuchscheme://bucket/x")
    with pytest.raises(ValueError, match="empty"):
        ParquetTarget("")


def test_relative_and_file_uri_paths_are_local(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    relative = ParquetTarget("rel")
    relative.check(SCHEMA)
    uri = ParquetTarget((tmp_path / "uri").as_uri())
    uri.check(SCHEMA)
    assert (tmp_path / "rel").is_dir() and (tmp_path / "uri").is_dir()


# -- write_direct ----------------------------------------------------------------------------


def test_write_direct_is_visible_at_once_under_unique_names(
    target: ParquetTarget, out: Path
) -> None:
    target.write_direct(batch(0, 2))
    target.write_direct(batch(0, 2))  # at-least-once: a replay is a second file, not a clash
    target.write_direct(batch(9, 0))

    assert read_ids(out) == [0, 0, 1, 1]
    names = [p.name for p in out.iterdir() if p.is_file()]
    assert len(names) == 2 and all(n.startswith("part-direct-") for n in names)
    assert list((out / STAGING_DIR / "_direct").iterdir()) == []


# -- epoch records ---------------------------------------------------------------------------


def test_publish_epoch_is_idempotent_and_tracks_the_max_watermark(
    target: ParquetTarget, out: Path
) -> None:
    assert target.committed_watermark("q1") is None
    target.publish_epoch("q1", 0, None, rows=0, late_rows=0)
    assert target.committed_watermark("q1") is None

    target.publish_epoch("q1", 1, 100, rows=5, late_rows=1, source="spark")
    record = out / EPOCHS_DIR / "q1" / "000000001.json"
    before = record.read_bytes()
    target.publish_epoch("q1", 1, 500, rows=7, late_rows=0)  # a replay changes nothing
    assert record.read_bytes() == before
    assert json.loads(before) == {
        "query": "q1",
        "epoch": 1,
        "watermark": 100,
        "watermark_source": "spark",
        "max_watermark": 100,
        "rows": 5,
        "late_rows": 1,
    }

    target.publish_epoch("q1", 2, 90, rows=1, late_rows=0)
    target.publish_epoch("q1", 3, None, rows=1, late_rows=0)
    assert target.committed_watermark("q1") == 100
    target.publish_epoch("q1", 4, 150, rows=1, late_rows=0)
    assert target.committed_watermark("q1") == 150
    assert target.committed_watermark("q2") is None
    assert sorted(p.name for p in record.parent.iterdir()) == [f"{e:09d}.json" for e in range(5)]
    assert read_ids(out) == []  # records are not data


@pytest.mark.parametrize("query", ["..", "a/b", "a:b"])
def test_epoch_records_reject_unsafe_query_names(target: ParquetTarget, query: str) -> None:
    with pytest.raises(ValueError, match="query name"):
        target.publish_epoch(query, 0, None, 0, 0)


# -- other filesystems, pickling, memory -----------------------------------------------------


class CopyDeleteHandler(pafs.FileSystemHandler):
    """An object-store-like filesystem: paths are keys under a root, and a move is a copy
    plus a delete, as on S3. Nothing in it is a local OS path."""

    def __init__(self, root: str) -> None:
        self.inner = pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())
        self.moves = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CopyDeleteHandler) and other.inner.equals(self.inner)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "copydelete"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.inner.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.inner.delete_dir_contents("", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.moves += 1
        self.inner.copy_file(src, dest)
        self.inner.delete_file(src)

    def copy_file(self, src: str, dest: str) -> None:
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self.inner.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.inner.open_append_stream(path, metadata=metadata)


def exercise(target: ParquetTarget, filesystem: pafs.FileSystem, base: str) -> None:
    target.check(SCHEMA)
    pre_commit = write_txn(target, txn(), batch(0, 3))
    assert target.pending("flinkish", "q1") == [txn()]
    assert read_ids(base, filesystem) == []
    target.commit(pre_commit)
    target.commit(pre_commit)
    target.write_direct(batch(3, 1))
    target.rollback(write_txn(target, txn(epoch=2), batch(9, 1)).txn)
    target.publish_epoch("q1", 1, 42, rows=4, late_rows=0)
    assert target.pending("flinkish", "q1") == []
    assert read_ids(base, filesystem) == [0, 1, 2, 3]
    assert target.committed_watermark("q1") == 42


def test_object_store_like_filesystem(tmp_path: Path) -> None:
    handler = CopyDeleteHandler(str(tmp_path))
    filesystem = pafs.PyFileSystem(handler)
    target = ParquetTarget("bucket/table", filesystem=filesystem)

    exercise(target, filesystem, "bucket/table")

    assert handler.moves >= 3  # commit, write_direct and publish_epoch all went through move
    revived = pickle.loads(pickle.dumps(target))
    assert revived.pending("flinkish", "q1") == []
    assert read_ids(tmp_path / "bucket" / "table") == [0, 1, 2, 3]


def test_subtree_filesystem(tmp_path: Path) -> None:
    filesystem = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    exercise(ParquetTarget("data", filesystem=filesystem), filesystem, "data")
    assert read_ids(tmp_path / "data") == [0, 1, 2, 3]


def test_target_pickles_to_tasks(target: ParquetTarget, out: Path) -> None:
    revived = pickle.loads(pickle.dumps(target))
    pre_commit = write_txn(revived, txn(), batch(0, 2))  # task side
    target.commit(pre_commit)  # driver side
    assert read_ids(out) == [0, 1]


def test_memory_does_not_grow_with_rows(target: ParquetTarget) -> None:
    schema = pa.schema([("id", pa.int64())])
    transaction = target.begin_transaction(txn(), schema)
    base = pa.array(np.arange(100_000, dtype=np.int64))
    batch_bytes = base.nbytes
    start = pa.total_allocated_bytes()
    growth, sizes = [], []
    for i in range(80):
        # pc.add allocates each batch in Arrow's pool, so keeping any of them would show.
        transaction.write(pa.record_batch([pc.add(base, i)], schema=schema))
        growth.append(pa.total_allocated_bytes() - start)
        (staged_file,) = Path(target.staged_dir(txn())).iterdir()
        sizes.append(staged_file.stat().st_size)

    # The writer's buffers cost a fixed few MB; 80 batches would be 64 MB.
    assert max(growth) < 16 * batch_bytes
    assert growth[-1] <= growth[0] + batch_bytes
    assert sizes[-1] > sizes[9] > sizes[0]  # the rows are on disk, not in the writer
    assert transaction.pre_commit().rows == 80 * 100_000


def test_check_compares_with_the_schema_a_reader_of_the_directory_sees(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    (out / "_staging").mkdir(parents=True)
    (out / ".hidden").mkdir()
    other = pa.table({"other": pa.array([1], pa.int64())})
    # staged and hidden files are no reader's data: they decide nothing
    pq.write_table(other, out / "_staging" / "a.parquet")
    pq.write_table(other, out / ".hidden" / "b.parquet")
    pq.write_table(other, out / "_c.parquet")
    ParquetTarget(str(out)).check(other.schema.append(pa.field("x", pa.int64())))
    (out / "part=1").mkdir()
    pq.write_table(other, out / "part=1" / "d.parquet")
    assert ds.dataset(str(out), format="parquet").schema == other.schema  # what readers see
    with pytest.raises(ValueError, match="already holds files with another schema"):
        ParquetTarget(str(out)).check(pa.schema([("x", pa.int64())]))
    ParquetTarget(str(out)).check(other.schema)
