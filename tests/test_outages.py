"""Riding out an unreachable target: which errors are transient, the retry policy (backoff
with jitter, the deadline, the log, the error past it), a task's transaction begun again
after a lost connection, and the driver's commit retried part-way through."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import sqlalchemy.exc

from checkpointing import CheckpointStorage, CheckpointStore
from checkpointing.fencing import FencedError
from flinkish_core.errors import OptionError
from flinkish_sink import row_spill
from flinkish_sink.options import DEFAULT_OUTAGE_TIMEOUT_MS, parse_sink_options
from flinkish_sink.outages import (
    RetriedTransaction,
    RetryPolicy,
    TargetUnavailableError,
    is_transient,
)
from flinkish_sink.parquet_target import ParquetTarget
from flinkish_sink.postgres_target import PostgresConnectError
from flinkish_sink.row_spill import RowSpill
from flinkish_sink.target import PreCommit, TransactionId
from flinkish_sink.two_phase_commit import TwoPhaseCommitCoordinator

SCHEMA = pa.schema([("id", pa.int64())])
TXN = TransactionId("flinkish", "q1", 3, 0, 0, "r1")

REFUSED = ('connection failed: connection to server at "127.0.0.1", port 5432 failed: '
           "Connection refused\n\tIs the server running on that host and accepting TCP/IP "
           "connections?")
S3_DOWN = ("When initiating multiple part upload for key 't/x' in bucket 'b': AWS Error "
           "NETWORK_CONNECTION during CreateMultipartUpload operation: curlCode: 7, Could not "
           "connect to server")
DELTA_DOWN = ("Generic S3 error: Error performing GET http://127.0.0.1:9000/b/t/_delta_log/ in "
              "3.7s, after 10 retries - HTTP error - error sending request - client error "
              "(Connect) - tcp connect error: Connection refused (os error 111)")


def _raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as chained:  # noqa: BLE001  (the raised one, with its cause)
        return chained


@pytest.mark.parametrize("error", [
    psycopg.OperationalError(REFUSED),
    psycopg.OperationalError("consuming input failed: server closed the connection "
                             "unexpectedly"),
    psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    psycopg.errors.CannotConnectNow("the database system is starting up"),
    psycopg.errors.ConnectionFailure("connection failure"),
    PostgresConnectError("cannot connect to PostgreSQL with dsn '…': Connection refused",
                         transient=True),
    OSError(S3_DOWN),
    OSError(DELTA_DOWN),
    OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate"),
    OSError("HTTP status 503 Service Unavailable"),
    ConnectionRefusedError(111, "Connection refused"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError("timed out"),
    sqlalchemy.exc.OperationalError("SELECT 1", {}, psycopg.OperationalError(REFUSED)),
    _raised_from(RuntimeError("commit failed"), psycopg.OperationalError(REFUSED)),
], ids=lambda e: type(e).__name__)
def test_errors_of_an_unreachable_target_are_transient(error: BaseException) -> None:
    assert is_transient(error)


@pytest.mark.parametrize("error", [
    psycopg.OperationalError('connection to server at "127.0.0.1", port 5432 failed: FATAL: '
                             'password authentication failed for user "app"'),
    psycopg.OperationalError('FATAL: database "nope" does not exist'),
    psycopg.OperationalError("FATAL: no pg_hba.conf entry for host \"10.0.0.9\""),
    PostgresConnectError("cannot connect to PostgreSQL: password authentication failed"),
    psycopg.errors.InvalidPassword("password authentication failed"),
    psycopg.errors.UniqueViolation("duplicate key value violates unique constraint"),
    psycopg.errors.SerializationFailure("could not serialize access"),
    psycopg.errors.DuplicateObject('transaction identifier "x" is already in use'),
    psycopg.errors.UndefinedTable('relation "t" does not exist'),
    OSError("When reading 't/x': AWS Error ACCESS_DENIED during GetObject operation: "
            "Access Denied"),
    OSError("Generic S3 error: Client error with status 403 Forbidden: InvalidAccessKeyId"),
    OSError("AWS Error NETWORK_CONNECTION ... SignatureDoesNotMatch"),
    FileNotFoundError(2, "No such file or directory"),
    PermissionError(13, "Permission denied"),
    FencedError("a newer run of the query claimed the location"),
    _raised_from(FencedError("fenced"), ConnectionResetError()),
    TargetUnavailableError("away for 30 s"),
    ValueError("table t does not fit the stream's schema"),
    RuntimeError("cannot commit: files were removed outside flinkish"),
    OSError("some other I/O failure"),
], ids=lambda e: f"{type(e).__name__}:{str(e)[:30]}")
def test_errors_that_a_retry_does_not_mend_are_not(error: BaseException) -> None:
    assert not is_transient(error)


class Named:
    """Stands for a target in messages: its repr."""

    def __init__(self, text: str) -> None:
        self._text = text

    def __repr__(self) -> str:
        return self._text


class Clock:
    """A fake monotonic clock that only sleeping advances."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _policy(timeout_s: float, clock: Clock, **kwargs: Any) -> RetryPolicy:
    return RetryPolicy(timeout_s, clock=clock, sleep=clock.sleep, **kwargs)


def _failing(times: int, error: BaseException, calls: list[int]) -> Any:
    def step() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "done"
    return step


def test_transient_failures_are_retried_with_growing_jittered_pauses_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, calls, dropped = Clock(), [], []
    policy = _policy(30, clock, initial_backoff_s=0.2, max_backoff_s=1.0)
    with caplog.at_level(logging.WARNING, logger="flinkish_sink.outages"):
        result = policy.call(Named("PostgresTarget('host=db', 'events')"), "commit of epoch 7",
                             _failing(5, psycopg.OperationalError(REFUSED), calls),
                             on_retry=dropped.append)
    assert result == "done" and len(calls) == 6 and len(dropped) == 5
    backoffs = [0.2, 0.4, 0.8, 1.0, 1.0]  # doubled, capped at max_backoff_s
    assert all(b / 2 <= s <= b for s, b in zip(clock.slept, backoffs, strict=True))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 5
    assert "PostgresTarget('host=db', 'events')" in warnings[0]
    assert "commit of epoch 7 failed (attempt 1, 30 s of outageTimeout left)" in warnings[0]
    assert "Connection refused" in warnings[0] and "attempt 5" in warnings[4]


def test_the_jitter_spreads_clients_apart() -> None:
    pauses = {next(RetryPolicy(30).delays()) for _ in range(50)}
    assert len(pauses) > 40 and all(0.1 <= p <= 0.2 for p in pauses)


def test_an_error_that_is_not_transient_is_raised_at_once() -> None:
    clock, calls = Clock(), []
    with pytest.raises(psycopg.errors.UniqueViolation):
        _policy(60, clock).call("t", "write", _failing(
            1, psycopg.errors.UniqueViolation("duplicate key"), calls))
    assert len(calls) == 1 and clock.slept == []


def test_outage_timeout_0_fails_at_the_first_error_unchanged() -> None:
    clock, calls = Clock(), []
    error = psycopg.OperationalError(REFUSED)
    with pytest.raises(psycopg.OperationalError) as raised:
        _policy(0, clock).call("t", "write", _failing(1, error, calls))
    assert raised.value is error and len(calls) == 1 and clock.slept == []


def test_past_the_bound_the_error_names_the_target_and_how_long_it_tried() -> None:
    clock, calls = Clock(), []
    error = OSError(S3_DOWN)
    with pytest.raises(TargetUnavailableError) as raised:
        _policy(5, clock).call(Named("DeltaTarget('s3://b/t')"), "pre-commit of flinkish:q1:3:0:0",
                               _failing(1000, error, calls))
    message = str(raised.value)
    assert message.startswith("DeltaTarget('s3://b/t'): pre-commit of flinkish:q1:3:0:0 "
                              "failed: the target stayed unreachable for 5.0 s")
    assert "longer than the sink's outageTimeout (5.0 s)" in message
    assert "OSError: When initiating multiple part upload" in message
    assert raised.value.__cause__ is error
    assert sum(clock.slept) == pytest.approx(5.0)  # the last pause ends at the deadline


def test_outage_timeout_option() -> None:
    base = {"target": "parquet", "path": "s3://b/out", "checkpointLocation": "s3://b/ck"}
    assert parse_sink_options(base).outage_timeout_ms == DEFAULT_OUTAGE_TIMEOUT_MS == 30_000
    assert parse_sink_options({**base, "outageTimeout": "2 min"}).outage_timeout_ms == 120_000
    assert parse_sink_options({**base, "outagetimeout": "0"}).outage_timeout_ms == 0
    with pytest.raises(OptionError, match="option outageTimeout: '30' is not a duration"):
        parse_sink_options({**base, "outageTimeout": "30"})


class PreparingTarget:
    """PostgreSQL's prepared transactions in memory: PREPARE under a gid in use fails, and
    the first PREPARE happens on the server but its answer is lost (the connection died)."""

    def __init__(self) -> None:
        self.prepared: dict[str, list[int]] = {}
        self.answers_lost = 1
        self.rolled_back: list[str] = []

    def __repr__(self) -> str:
        return "PreparingTarget()"

    def begin_transaction(self, txn: TransactionId, schema: pa.Schema) -> Any:
        target = self

        class Transaction:
            rows: list[int] = []

            def write(self, batch: pa.RecordBatch) -> None:
                self.rows = [*self.rows, *batch.column(0).to_pylist()]

            def pre_commit(self) -> PreCommit:
                if txn.gid in target.prepared:
                    raise psycopg.errors.DuplicateObject(
                        f'transaction identifier "{txn.gid}" is already in use')
                target.prepared[txn.gid] = self.rows
                if target.answers_lost:
                    target.answers_lost -= 1
                    raise psycopg.OperationalError("consuming input failed: server closed "
                                                   "the connection unexpectedly")
                return PreCommit(txn, len(self.rows))

            def abort(self) -> None:
                """The connection is gone: nothing to roll back on it."""

        return Transaction()

    def rollback(self, txn: TransactionId) -> None:
        self.rolled_back.append(txn.gid)
        self.prepared.pop(txn.gid, None)


def test_a_prepare_whose_answer_was_lost_is_rolled_back_and_done_again_with_every_row(
) -> None:
    target, clock = PreparingTarget(), Clock()
    transaction = RetriedTransaction(target, TXN, SCHEMA, _policy(30, clock))  # type: ignore[arg-type]
    for ids in ([1, 2], [3]):
        transaction.write(pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA))
    pre_commit = transaction.pre_commit()
    assert pre_commit.rows == 3 and target.prepared == {TXN.gid: [1, 2, 3]}
    assert target.rolled_back == [TXN.gid] and len(clock.slept) == 1


def test_rows_kept_for_a_retry_stay_in_memory_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    target, clock = PreparingTarget(), Clock()
    target.answers_lost = 0
    transaction = RetriedTransaction(target, TXN, SCHEMA, _policy(30, clock))  # type: ignore[arg-type]
    transaction.write(pa.record_batch([pa.array(range(200_000), pa.int64())], schema=SCHEMA))
    assert not list(tmp_path.glob("flinkish-spill-*/*"))  # the common task touches no disk
    assert transaction.pre_commit().rows == 200_000


def test_rows_past_the_memory_budget_go_to_local_disk_until_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path},/elsewhere")
    small = pa.record_batch([pa.array([-1, -2], pa.int64())], schema=SCHEMA)
    big = pa.record_batch([pa.array(range(200_000), pa.int64())], schema=SCHEMA)
    spill = RowSpill(SCHEMA, memory_budget=big.nbytes)
    spill.append(small)
    assert not list(tmp_path.glob("flinkish-spill-*/*"))  # within the budget: in memory
    assert [b.column(0).to_pylist() for b in spill.batches()] == [[-1, -2]]
    spill.append(big)  # past it: everything so far goes to the file, in order
    [spilled] = tmp_path.glob(f"flinkish-spill-{os.getpid()}-*/*.arrows")
    assert spilled.stat().st_size >= big.nbytes
    spill.append(small)
    assert spill.rows == 200_004
    assert [v for b in spill.batches() for v in b.column(0).to_pylist()] == [
        -1, -2, *range(200_000), -1, -2]
    spill.close()
    assert not spilled.exists() and spill.rows == 0 and list(spill.batches()) == []
    spill.append(small)  # after a close it starts again in memory
    assert not list(tmp_path.glob("flinkish-spill-*/*.arrows"))
    spill.append(big)
    assert len(list(tmp_path.glob("flinkish-spill-*/*.arrows"))) == 1
    spill.close()
    assert not list(tmp_path.glob("flinkish-spill-*/*.arrows"))


def test_an_aborted_transaction_deletes_its_spilled_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    monkeypatch.setattr(row_spill, "MEMORY_BUDGET", 0)
    target, clock = PreparingTarget(), Clock()
    target.answers_lost = 0
    aborted = RetriedTransaction(target, TXN, SCHEMA, _policy(30, clock))  # type: ignore[arg-type]
    aborted.write(pa.record_batch([pa.array([1], pa.int64())], schema=SCHEMA))
    assert len(list(tmp_path.glob("flinkish-spill-*/*.arrows"))) == 1
    aborted.abort()
    assert not list(tmp_path.glob("flinkish-spill-*/*.arrows"))


def test_without_outage_timeout_no_row_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    target = PreparingTarget()
    target.answers_lost = 0
    transaction = RetriedTransaction(target, TXN, SCHEMA, RetryPolicy(0))  # type: ignore[arg-type]
    transaction.write(pa.record_batch([pa.array([1], pa.int64())], schema=SCHEMA))
    assert not list(tmp_path.glob("flinkish-spill-*/*"))
    assert transaction.pre_commit().rows == 1

def test_without_outage_timeout_a_lost_prepare_fails_the_task() -> None:
    target = PreparingTarget()
    transaction = RetriedTransaction(target, TXN, SCHEMA, RetryPolicy(0))  # type: ignore[arg-type]
    transaction.write(pa.record_batch([pa.array([1], pa.int64())], schema=SCHEMA))
    with pytest.raises(psycopg.OperationalError):
        transaction.pre_commit()


class ReplyLost:
    """A Parquet target whose commit and publish happen but whose answers are lost, once
    each, as when the store goes away right after taking a request."""

    def __init__(self, target: ParquetTarget) -> None:
        self._target = target
        self.lost = {"commit": 1, "publish_epoch": 1}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        if name not in self.lost:
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if self.lost[name]:
                self.lost[name] -= 1
                raise ConnectionResetError(104, "Connection reset by peer")
            return result
        return call


def test_a_driver_commit_retried_part_way_through_commits_every_row_once(
    tmp_path: Path,
) -> None:
    target = ParquetTarget(tmp_path / "out")
    target.check(SCHEMA)
    flaky = ReplyLost(target)
    store = CheckpointStore(CheckpointStorage.open(str(tmp_path / "store")), owner="q1")
    coordinator = TwoPhaseCommitCoordinator(store, flaky, "flinkish", "q1")  # type: ignore[arg-type]
    pre_commits = []
    for task in range(2):
        transaction = target.begin_transaction(TransactionId("flinkish", "q1", 0, task, 0),
                                               SCHEMA)
        transaction.write(pa.record_batch([pa.array([task * 10, task * 10 + 1], pa.int64())],
                                          schema=SCHEMA))
        pre_commits.append(transaction.pre_commit())
    clock = Clock()
    outcome = _policy(30, clock).call(
        flaky, "commit of epoch 0",
        lambda: coordinator.commit_epoch(0, pre_commits, [], 4, 0))
    assert len(clock.slept) == 2 and flaky.lost == {"commit": 0, "publish_epoch": 0}
    assert outcome.replayed and store.completed(0) is not None
    ids = ds.dataset(target.readable_files(), format="parquet").to_table().column("id")
    assert sorted(ids.to_pylist()) == [0, 1, 10, 11]
    assert target.pending("flinkish", "q1") == []
