"""Flink's transactionTimeout warning: the sink warns when one of its own pre-commits it meets at
commit or recovery has been prepared longer than ``transactionTimeout`` (default 15 min), and
``flinkish transactions`` shows each lingering pre-commit's age. (PostgreSQL's ages:
integration/test_transactions_cli.py.)"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

import flinkish_sink.two_phase_commit as two_phase_commit
from checkpointing import CheckpointStorage, CheckpointStore
from flinkish.cli import main
from flinkish_core.durations import format_duration, parse_duration_ms
from flinkish_core.errors import OptionError
from flinkish_sink.delta_target import DeltaTarget
from flinkish_sink.iceberg_target import IcebergTarget
from flinkish_sink.kafka_target import KafkaTarget
from flinkish_sink.options import DEFAULT_TRANSACTION_TIMEOUT_MS, parse_sink_options
from flinkish_sink.parquet_target import ParquetTarget
from flinkish_sink.postgres_target import PostgresTarget
from flinkish_sink.target import AnyTarget, PreCommit, TransactionId
from flinkish_sink.two_phase_commit import TwoPhaseCommitCoordinator

QUERY = "0f0e0d0c-1111-4222-8333-944455556666"
SCHEMA = pa.schema([("id", pa.int64())])
TIMEOUT_S = 15 * 60


def _pre_commit(target: ParquetTarget, epoch: int, task: int, age_s: float = 0.0) -> PreCommit:
    txn = target.begin_transaction(TransactionId("flinkish", QUERY, epoch, task, 0, "r1"), SCHEMA)
    txn.write(pa.record_batch([pa.array([epoch * 10 + task])], schema=SCHEMA))
    pc = txn.pre_commit()
    if age_s:
        then = time.time() - age_s
        os.utime(target.staged_dir(pc.txn), (then, then))
    return pc


def _coordinator(tmp_path: Path, target: ParquetTarget) -> TwoPhaseCommitCoordinator:
    store = CheckpointStore(CheckpointStorage.open(str(tmp_path / "ck")), owner=QUERY)
    return TwoPhaseCommitCoordinator(store, target, "flinkish", QUERY,
                                     transaction_timeout_s=TIMEOUT_S)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_recovery_warns_about_its_own_old_pre_commits_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = ParquetTarget(tmp_path / "out")
    old = _pre_commit(target, 0, 0, age_s=40 * 60)
    young = _pre_commit(target, 0, 1, age_s=60)
    coordinator = _coordinator(tmp_path, target)
    ages = coordinator.lingering_ages()
    assert 40 * 60 - 5 < (ages[old.txn] or 0) < 40 * 60 + 60 and (ages[young.txn] or 0) < 120
    caplog.set_level(logging.WARNING)
    assert coordinator.recover() == ([], sorted([old.txn.gid, young.txn.gid]))
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings
    assert old.txn.gid in warnings[0] and young.txn.gid not in warnings[0]
    assert "prepared 40 min" in warnings[0] and "transactionTimeout (15 min)" in warnings[0]
    assert "rolling it back now" in warnings[0] and "its staged files wait" in warnings[0]
    assert "VACUUM" not in warnings[0]


@pytest.mark.parametrize(("target_class", "consequence"), [
    (PostgresTarget, "holds its locks and keeps PostgreSQL's VACUUM from cleaning up"),
    (KafkaTarget, "the broker aborts an open transaction at transaction.timeout.ms, and until "
                  "then read_committed consumers of its partitions stop at it"),
    (ParquetTarget, "its staged files wait"),
    (DeltaTarget, "its staged files wait"),
    (IcebergTarget, "its staged files wait"),
])
def test_the_warning_names_the_targets_own_consequence(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, target_class: type[AnyTarget],
    consequence: str,
) -> None:
    coordinator = _coordinator(tmp_path, ParquetTarget(tmp_path / "out"))
    caplog.set_level(logging.WARNING)
    coordinator._warn_if_old(target_class, "pre-commit x", 40 * 60, "rolling it back now")
    [warning] = _warnings(caplog)
    assert consequence in warning and "transactionTimeout (15 min)" in warning


def test_commit_of_a_long_decided_epoch_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = ParquetTarget(tmp_path / "out")
    pcs = [_pre_commit(target, 3, task) for task in range(2)]
    coordinator = _coordinator(tmp_path, target)

    def crash(point: str, **where: object) -> None:
        if point == "after_decision":
            raise RuntimeError("crash")

    monkeypatch.setattr(two_phase_commit, "failpoint", crash)
    with pytest.raises(RuntimeError):
        coordinator.commit_epoch(3, pcs, [], 2, 0)
    monkeypatch.undo()
    # the query comes back an hour later and replays epoch 3
    later = two_phase_commit.now_ms() + 60 * 60_000
    monkeypatch.setattr(two_phase_commit, "now_ms", lambda: later)
    caplog.set_level(logging.WARNING)
    outcome = _coordinator(tmp_path, target).commit_epoch(3, [], [], 2, 0)
    assert outcome.replayed and sorted(outcome.committed) == sorted(p.txn.gid for p in pcs)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "epoch 3's 2 decided pre-commit(s)" in warnings[0]
    assert "prepared 1 h" in warnings[0] and "committing them now" in warnings[0]


def test_no_warning_without_a_timeout_or_for_fresh_pre_commits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = ParquetTarget(tmp_path / "out")
    _pre_commit(target, 0, 0, age_s=10 * 3600)
    store = CheckpointStore(CheckpointStorage.open(str(tmp_path / "ck")), owner=QUERY)
    caplog.set_level(logging.WARNING)
    TwoPhaseCommitCoordinator(store, target, "flinkish", QUERY).recover()
    fresh = [_pre_commit(target, 1, 0)]
    _coordinator(tmp_path, target).commit_epoch(1, fresh, [], 1, 0)
    assert _warnings(caplog) == []


def test_transaction_timeout_option() -> None:
    base = {"target": "parquet", "path": "/tmp/out", "checkpointLocation": "/tmp/ck"}
    assert parse_sink_options(base).transaction_timeout_ms == DEFAULT_TRANSACTION_TIMEOUT_MS
    assert DEFAULT_TRANSACTION_TIMEOUT_MS == 15 * 60_000
    assert parse_sink_options({**base, "transactionTimeout": "1 h"}).transaction_timeout_ms == (
        3_600_000)
    assert parse_sink_options({**base, "TRANSACTIONTIMEOUT": "90 s"}).transaction_timeout_ms == (
        90_000)
    for bad, says in (("soon", "is not a duration"), ("900", "is not a duration"),
                      ("0 min", "must be a positive duration")):
        with pytest.raises(OptionError) as failure:
            parse_sink_options({**base, "transactionTimeout": bad})
        assert str(failure.value).startswith(f"option transactionTimeout: {bad!r} {says}")
    with pytest.raises(OptionError, match="did you mean transactionTimeout[?]"):
        parse_sink_options({**base, "transactionTimout": "1 h"})


def test_durations_read_and_print() -> None:
    assert parse_duration_ms("x", "15 min") == 900_000
    assert [format_duration(s) for s in (0.25, 4.25, 45, 900, 912, 3600, 7380, 90000)] == [
        "250 ms", "4.2 s", "45 s", "15 min", "15 min 12 s", "1 h", "2 h 03 min", "1 d 1 h"]


def test_cli_shows_the_age_of_each_parquet_pre_commit_oldest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ParquetTarget(tmp_path / "out")
    young = _pre_commit(target, 2, 0, age_s=5 * 60)
    old = _pre_commit(target, 1, 0, age_s=2 * 3600 + 180)
    args = ["transactions", "--parquet", str(tmp_path / "out"), "--query", QUERY]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert old.txn.gid in lines[0] and "prepared 2 h 03 min ago" in lines[0]
    assert "older than 15 min" in lines[0]
    assert young.txn.gid in lines[1] and "prepared 5 min" in lines[1]
    assert "older than" not in lines[1]
    assert "--resolve" in lines[2]  # what to do about the old one
    assert main([*args, "--transaction-timeout", "1 min"]) == 0
    assert capsys.readouterr().out.count("older than 1 min") == 2
    with pytest.raises(SystemExit, match="--transaction-timeout"):
        main([*args, "--transaction-timeout", "soon"])
