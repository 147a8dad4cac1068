"""Parquet compaction: fewer files, never a row lost or doubled, a crash at any step finishes
or leaves no trace, and a reader of :meth:`ParquetTarget.readable_files` sees every row once."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

import flinkish_sink.parquet_compaction as compaction_module
from checkpointing import CheckpointStorage, CheckpointStore, FencedError
from flinkish_core.errors import OptionError
from flinkish_sink.options import parse_sink_options
from flinkish_sink.parquet_compaction import (
    COMPACTIONS_DIR,
    Compactor,
    plan_groups,
    readable_files,
)
from flinkish_sink.parquet_target import (
    COMPACT_EVERY,
    DEFAULT_TARGET_FILE_SIZE,
    TARGET_FILE_SIZE,
    ParquetTarget,
)
from flinkish_sink.target import PreCommit, TransactionId
from flinkish_sink.two_phase_commit import TwoPhaseCommitCoordinator

SCHEMA = pa.schema([("id", pa.int64())])
PREFIX = "flinkish"
QUERY = "q1"
TASKS = 3
ROWS = 10  # per task and epoch


def commit_epoch(target: ParquetTarget, epoch: int, *, query: str = QUERY) -> None:
    """Epoch ``epoch``: TASKS tasks of ROWS rows each, committed and published."""
    for task in range(TASKS):
        transaction = target.begin_transaction(
            TransactionId(PREFIX, query, epoch, task, 0), SCHEMA)
        start = (epoch * TASKS + task) * ROWS
        transaction.write(pa.record_batch([pa.array(range(start, start + ROWS), pa.int64())],
                                          schema=SCHEMA))
        target.commit(transaction.pre_commit())
    target.publish_epoch(query, epoch, None, TASKS * ROWS, 0)


def expected(epochs: int) -> list[int]:
    return list(range(epochs * TASKS * ROWS))


def listed_ids(out: Path) -> list[int]:
    """What a reader listing the directory sees (pyarrow skips '_' and '.' names)."""
    return sorted(ds.dataset(str(out), format="parquet").to_table().column("id").to_pylist())


def consistent_ids(target: ParquetTarget) -> list[int]:
    files = target.readable_files()
    table = ds.dataset(files, format="parquet").to_table() if files else None
    return [] if table is None else sorted(table.column("id").to_pylist())


def data_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("*.parquet"))


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


def make_target(out: Path, every: int = 5, size: int = DEFAULT_TARGET_FILE_SIZE) -> ParquetTarget:
    target = ParquetTarget(out, compact_every=every, target_file_size=size)
    target.check(SCHEMA)
    return target


def test_plan_groups_fills_runs_up_to_the_target_size() -> None:
    files = [("a", 40), ("b", 40), ("c", 40), ("big", 100), ("d", 10), ("e", 95), ("f", 1)]
    assert plan_groups(files, 100) == [["a", "b"], ["e", "f"]]
    assert plan_groups([("a", 10)], 100) == []  # one file: nothing to merge


def test_every_n_epochs_the_small_files_become_one(out: Path) -> None:
    target = make_target(out, every=5)
    for epoch in range(12):
        commit_epoch(target, epoch)
        target.maintain(PREFIX, QUERY, epoch)
        assert listed_ids(out) == expected(epoch + 1)
        assert consistent_ids(target) == expected(epoch + 1)
    # compacted after epochs 4 and 9 (one file), then epochs 10 and 11 stay small
    assert len(data_files(out)) == 1 + 2 * TASKS
    assert not list((out / COMPACTIONS_DIR / "_staging").glob("*"))


def file_size(where: Path) -> int:
    """The bytes of one task's file of one epoch."""
    probe = make_target(where / "probe")
    commit_epoch(probe, 0)
    return max(p.stat().st_size for p in (where / "probe").glob("*.parquet"))


def test_outputs_stay_within_the_target_size(out: Path) -> None:
    one = file_size(out)
    target = make_target(out / "t", every=1, size=4 * one)
    for epoch in range(8):
        commit_epoch(target, epoch)
        target.maintain(PREFIX, QUERY, epoch)
    files = list((out / "t").glob("*.parquet"))
    assert all(p.stat().st_size <= 5 * one for p in files)
    assert len(files) <= 24 * one // (4 * one) * 2
    assert listed_ids(out / "t") == expected(8)


def test_other_queries_files_are_left_alone(out: Path) -> None:
    target = make_target(out, every=1)
    commit_epoch(target, 0, query="other")
    commit_epoch(target, 1, query="other")
    commit_epoch(target, 0)
    commit_epoch(target, 1)
    target.maintain(PREFIX, QUERY, 1)
    assert sum("-other-" in n for n in data_files(out)) == 2 * TASKS
    assert sum("-q1-" in n for n in data_files(out)) == 1


class Crash(Exception):
    pass


def crash_at(monkeypatch: Any, step: str) -> None:
    """Make the compaction's failpoint ``step`` raise, as a crash there would stop it."""

    def fail(name: str, **_: Any) -> None:
        if name == step:
            raise Crash(name)

    monkeypatch.setattr(compaction_module, "failpoint", fail)


STEPS = ["compaction_staged", "compaction_decided", "compaction_mid_move", "compaction_moved"]


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_loses_and_doubles_nothing(
    out: Path, step: str, monkeypatch: Any
) -> None:
    one = file_size(out.parent)
    target = make_target(out, every=1, size=int(3.5 * one))  # several outputs: a mid-move
    for epoch in range(3):
        commit_epoch(target, epoch)
    before = data_files(out)

    crash_at(monkeypatch, step)
    compactor = Compactor(target._fs, target._base, PREFIX, QUERY, int(3.5 * one))
    with pytest.raises(Crash):
        compactor.compact(2)
    # the consistent reader never sees a row twice or miss one, whatever step it stopped at
    assert consistent_ids(target) == expected(3)
    if step in ("compaction_staged", "compaction_decided"):
        assert data_files(out) == before  # nothing visible moved yet
    monkeypatch.setattr(compaction_module, "failpoint", lambda name, **_: None)

    # the restarted query's next epoch finishes (or drops) it, and may compact again
    commit_epoch(target, 3)
    target.maintain(PREFIX, QUERY, 3)
    assert listed_ids(out) == expected(4)
    assert consistent_ids(target) == expected(4)
    assert len(data_files(out)) <= 5
    assert not list((out / COMPACTIONS_DIR / "_staging").glob("*"))


def test_a_decided_compaction_is_finished_by_the_next_epoch_without_compacting(
    out: Path, monkeypatch: Any
) -> None:
    target = make_target(out, every=10)
    for epoch in range(3):
        commit_epoch(target, epoch)

    crash_at(monkeypatch, "compaction_mid_move")
    with pytest.raises(Crash):
        Compactor(target._fs, target._base, PREFIX, QUERY, DEFAULT_TARGET_FILE_SIZE).compact(2)
    monkeypatch.undo()
    target.maintain(PREFIX, QUERY, 3)  # not a compaction epoch
    assert len(data_files(out)) == 1
    assert listed_ids(out) == expected(3)


def test_a_reader_skips_an_epoch_without_its_record(out: Path) -> None:
    target = make_target(out)
    commit_epoch(target, 0)
    transaction = target.begin_transaction(TransactionId(PREFIX, QUERY, 1, 0, 0), SCHEMA)
    transaction.write(pa.record_batch([pa.array([999], pa.int64())], schema=SCHEMA))
    target.commit(transaction.pre_commit())  # epoch 1 is mid-commit: no record yet
    assert 999 in listed_ids(out)
    assert consistent_ids(target) == expected(1)


def test_a_lost_output_keeps_the_inputs(out: Path, monkeypatch: Any) -> None:
    target = make_target(out, every=1)
    for epoch in range(2):
        commit_epoch(target, epoch)

    crash_at(monkeypatch, "compaction_decided")
    compactor = Compactor(target._fs, target._base, PREFIX, QUERY, DEFAULT_TARGET_FILE_SIZE)
    with pytest.raises(Crash):
        compactor.compact(1)
    monkeypatch.undo()
    for staged in (out / COMPACTIONS_DIR / "_staging").glob("*/*.parquet"):
        staged.unlink()  # removed behind flinkish's back
    with pytest.raises(RuntimeError, match="removed outside flinkish"):
        compactor.finish_pending(1)
    assert listed_ids(out) == expected(2)


def test_replaying_a_completed_epoch_after_its_compaction_commits_nothing(out: Path) -> None:
    target = make_target(out, every=2)
    location = str(out.parent / "checkpoint")

    def coordinator() -> TwoPhaseCommitCoordinator:
        store = CheckpointStore(CheckpointStorage.open(location), owner=QUERY)
        return TwoPhaseCommitCoordinator(store, target, PREFIX, QUERY)

    def pre_commits(epoch: int, run: str) -> list[PreCommit]:
        result = []
        for task in range(TASKS):
            transaction = target.begin_transaction(
                TransactionId(PREFIX, QUERY, epoch, task, 0, run), SCHEMA)
            start = (epoch * TASKS + task) * ROWS
            transaction.write(pa.record_batch(
                [pa.array(range(start, start + ROWS), pa.int64())], schema=SCHEMA))
            result.append(transaction.pre_commit())
        return result

    for epoch in range(2):
        coordinator().commit_epoch(epoch, pre_commits(epoch, "a"), [], TASKS * ROWS, 0)
    assert len(data_files(out)) == 1  # compacted after epoch 1 by the coordinator
    outcome = coordinator().commit_epoch(1, pre_commits(1, "b"), [], TASKS * ROWS, 0)
    assert outcome.replayed and not outcome.committed
    assert listed_ids(out) == expected(2)
    assert consistent_ids(target) == expected(2)


def test_options() -> None:
    base = {"target": "parquet", "path": "/tmp/x", "checkpointLocation": "/tmp/c"}
    parsed = parse_sink_options(base)
    assert (parsed[COMPACT_EVERY], parsed[TARGET_FILE_SIZE]) == (0, 128 * 1024 ** 2)
    parsed = parse_sink_options(
        {**base, "parquet.compactEvery": "10", "parquet.targetFileSize": "64 MB"})
    assert (parsed[COMPACT_EVERY], parsed[TARGET_FILE_SIZE]) == (10, 64 * 1024 ** 2)
    assert parse_sink_options({**base, "parquet.targetFileSize": "1048576"})[TARGET_FILE_SIZE] \
        == 1024 ** 2
    with pytest.raises(OptionError, match="parquet.targetFileSize.*'128 MB'"):
        parse_sink_options({**base, "parquet.targetFileSize": "big"})
    with pytest.raises(OptionError, match="parquet.compactEvery.*whole number"):
        parse_sink_options({**base, "parquet.compactEvery": "-1"})
    with pytest.raises(OptionError, match="applies to target parquet only"):
        parse_sink_options({**base, "target": "delta", "parquet.compactEvery": "5"})


def test_compaction_records_are_hidden_from_readers(out: Path) -> None:
    target = make_target(out, every=1)
    commit_epoch(target, 0)
    commit_epoch(target, 1)
    target.maintain(PREFIX, QUERY, 1)
    assert list((out / COMPACTIONS_DIR).glob("*.json"))  # kept until the next compaction
    assert listed_ids(out) == expected(2)


def test_public_parquet_files_gives_the_consistent_view(out: Path) -> None:
    import flinkish

    target = make_target(out)
    commit_epoch(target, 0)
    assert flinkish.parquet_files(str(out)) == target.readable_files()
    assert flinkish.parquet_files(f"file://{out}") == [
        f"file://{name}" for name in target.readable_files()]
    ids = ds.dataset(flinkish.parquet_files(str(out)), format="parquet").to_table()
    assert sorted(ids.column("id").to_pylist()) == expected(1)


def test_a_fenced_run_decides_no_compaction(out: Path) -> None:
    target = make_target(out, every=1)
    commit_epoch(target, 0)
    commit_epoch(target, 1)

    def fenced() -> None:
        raise FencedError("a newer run claimed the location")

    target.maintain(PREFIX, QUERY, 1, fenced)  # logged, not raised
    assert len(data_files(out)) == 2 * TASKS
    assert not list((out / COMPACTIONS_DIR).glob("*.json"))
    target.maintain(PREFIX, QUERY, 1)
    assert len(data_files(out)) == 1
    assert not list((out / COMPACTIONS_DIR / "_staging").glob("*"))
    assert listed_ids(out) == expected(2)


class Interleaved(pafs.FileSystemHandler):
    """The local disk, on which ``step`` runs (a writer's steps, all at once) right before the
    reader's ``at``-th call: every point of a reader's listing a writer can slip in at."""

    def __init__(self, at: int, step: Callable[[], None]) -> None:
        self._fs = pafs.LocalFileSystem()
        self._at = at
        self._step = step
        self.calls = 0

    def _tick(self) -> None:
        if self.calls == self._at:
            self._step()
        self.calls += 1

    def get_type_name(self) -> str:
        return "interleaved"

    def equals(self, other: Any) -> bool:
        return self is other

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        self._tick()
        return self._fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self._tick()
        return self._fs.get_file_info(selector)

    def open_input_stream(self, path: str) -> Any:
        self._tick()
        return self._fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self._fs.open_input_file(path)

    def _read_only(self, *_: Any, **__: Any) -> None:
        raise NotImplementedError("a reader only lists and reads")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _read_only
    delete_file = move = copy_file = open_output_stream = open_append_stream = _read_only


def compactor(target: ParquetTarget) -> Compactor:
    return Compactor(target._fs, target._base, PREFIX, QUERY, target._target_file_size)


def interleavings() -> Iterator[tuple[str, Callable[[ParquetTarget], None]]]:
    """What a query's driver may do while a reader lists (epochs 0-2 committed, 0-1
    compacted): a compaction stopped at each of its steps, one done whole, one done and the
    next one started (the first's record deleted), and epoch 3 committed and compacted."""
    def compact_to(step: str | None) -> Callable[[ParquetTarget], None]:
        def run(target: ParquetTarget) -> None:
            def stop(name: str, **_: Any) -> None:
                if name == step:
                    raise Crash(name)

            original = compaction_module.failpoint
            compaction_module.failpoint = stop
            try:
                with contextlib.suppress(Crash):
                    compactor(target).compact(2)
            finally:
                compaction_module.failpoint = original
        return run

    def twice(target: ParquetTarget) -> None:
        compactor(target).compact(2)
        compactor(target).compact(2)  # nothing left to merge: deletes the first's record

    def next_epoch(target: ParquetTarget) -> None:
        commit_epoch(target, 3)
        compactor(target).compact(3)

    for step in STEPS:
        yield f"compaction stopped at {step}", compact_to(step)
    yield "compaction", compact_to(None)
    yield "compaction, then the next", twice
    yield "epoch committed and compacted", next_epoch


def test_the_consistent_view_holds_under_any_interleaving(out: Path) -> None:
    """A reader listing while the query compacts sees each row once, in whole epochs,
    wherever in its listing the query's steps fall."""
    one = file_size(out.parent)
    scenarios = 0
    for name, action in interleavings():
        at = 0
        while True:
            base = out / f"{scenarios}"
            target = make_target(base, every=1, size=int(2.5 * one))  # merges pairs
            for epoch in range(2):
                commit_epoch(target, epoch)
            target.maintain(PREFIX, QUERY, 1)  # a compaction whose record is there
            commit_epoch(target, 2)
            reader = Interleaved(at, lambda target=target, action=action: action(target))
            files = readable_files(pafs.PyFileSystem(reader), str(base))
            ids = sorted(ds.dataset(files, format="parquet").to_table()
                         .column("id").to_pylist())
            assert ids in (expected(3), expected(4)), (name, at, len(ids))
            scenarios += 1
            if at >= reader.calls:  # the driver's steps came after the reader's last call
                break
            at += 1
    assert scenarios > 20
