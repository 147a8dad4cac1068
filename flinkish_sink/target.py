"""The contract every two-phase-commit target implements.

Flink's ``TwoPhaseCommitSinkFunction`` splits a transactional sink into beginTransaction,
invoke (write), preCommit, commit and abort, plus recoverAndCommit / recoverAndAbort after a
failure. Here the task side (Spark write tasks) runs the first three and the driver side
(``commit(messages, batchId)``) runs the rest, so the only thing that crosses from one to the
other is the JSON-serialisable :class:`PreCommit` each task returns.

Two kinds of target commit differently: a :class:`Target` commits each pre-commit on its own
and then records the epoch beside the data (PostgreSQL's prepared transactions, Parquet's
staged files); an :class:`EpochTarget` commits all of an epoch's pre-commits as one atomic
change that records the epoch too (a Delta table version).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

_GID_PART = re.compile(r"^[A-Za-z0-9_.-]+$")

#: Where an epoch's published watermark comes from: the valve over the source's marker rows
#: (the combined watermark after the epoch), or, when the rows carry no markers (a stateful
#: operator's output), Spark's event-time watermark of the micro-batch.
WATERMARK_VALVE = "valve"
WATERMARK_SPARK = "spark"

#: The flinkish source's position of an input record: rows with all three columns carry where
#: they were read from (marker rows need them), never where to write; a stream with them but
#: without the marker columns is the source's output with its markers dropped.
SOURCE_POSITION = frozenset({"topic", "partition", "offset"})

#: What to do when an epoch has more write tasks than prepared transactions can be held.
FIX_WRITE_TASKS = (
    "each write task of an epoch keeps one prepared transaction until the driver commits the "
    "epoch. Fix: fewer write tasks — set spark.sql.shuffle.partitions (its default 200 is "
    "the number of write tasks after an aggregation; the number of cores is plenty) or "
    "coalesce(n) the stream before writeStream — or raise the server's "
    "max_prepared_transactions above the write tasks of all queries writing to it "
    "(ALTER SYSTEM SET max_prepared_transactions = N, then restart PostgreSQL)"
)


#: The directory under a file target's location where transactions stage their files (Parquet)
#: or list them (Delta, Iceberg) until the driver decides them.
STAGING_DIR = "_flinkish_staging"
#: The directory under a Parquet target's location of its committed epochs' records.
EPOCHS_DIR = "_flinkish_epochs"
_STAGED_SEPARATOR = "~"

@dataclass(frozen=True, order=True)
class TransactionId:
    """Id of one write attempt's transaction: prefix, query, epoch, task, attempt and run.

    Recovery finds every transaction a query opened by its prefix and query, and decides each
    one from the epoch it names. ``run`` is a token of the driver-side writer that planned the
    attempt: after a crash Spark replays the epoch with task attempts numbered from 0 again,
    and without it a replayed task could re-prepare under the id of a transaction that was
    already committed, which the recorded decision would then commit a second time.
    """

    prefix: str
    query: str
    epoch: int
    task: int
    attempt: int
    run: str = ""

    def __post_init__(self) -> None:
        for name in ("prefix", "query", "run"):
            value = getattr(self, name)
            if (value or name != "run") and not _GID_PART.match(value):
                raise ValueError(
                    f"transaction id {name} {value!r} may only hold letters, digits, '_', '.' "
                    "and '-'"
                )

    @property
    def gid(self) -> str:
        """The global id, e.g. ``flinkish:q1:7:3:0:5f2a9c1e`` (PostgreSQL's PREPARE TRANSACTION
        id)."""
        base = f"{self.prefix}:{self.query}:{self.epoch}:{self.task}:{self.attempt}"
        return f"{base}:{self.run}" if self.run else base

    @property
    def staged_name(self) -> str:
        """The name of its staged files' directory or manifest under :data:`STAGING_DIR`:
        the gid with ``:`` (not allowed on every filesystem) as ``~``."""
        return self.gid.replace(":", _STAGED_SEPARATOR)

    @classmethod
    def from_staged_name(cls, name: str) -> TransactionId | None:
        """The id behind a :attr:`staged_name`, or None when ``name`` is not one of ours."""
        return cls.parse(name.replace(_STAGED_SEPARATOR, ":"))

    @classmethod
    def parse(cls, gid: str) -> TransactionId | None:
        """The id behind ``gid``, or None when ``gid`` is not one of ours."""
        parts = gid.split(":")
        if len(parts) not in (5, 6):
            return None
        prefix, query, epoch, task, attempt = parts[:5]
        run = parts[5] if len(parts) == 6 else ""
        if not (epoch.isdigit() and task.isdigit() and attempt.isdigit()) or (
            len(parts) == 6 and not run
        ):
            return None
        try:
            return cls(prefix, query, int(epoch), int(task), int(attempt), run)
        except ValueError:
            return None


@dataclass(frozen=True)
class PreCommit:
    """What a task hands the driver: which transaction it pre-committed and what it holds."""

    txn: TransactionId
    rows: int
    late_rows: int = 0
    detail: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "gid": self.txn.gid,
            "rows": self.rows,
            "late_rows": self.late_rows,
            "detail": self.detail or {},
        }

    def listed(self, key: str, target: str) -> list[Any]:
        """The list under ``key`` in the detail (a table target's files).

        Raises:
            ValueError: there is none: the pre-commit comes from another kind of ``target``.
        """
        found = (self.detail or {}).get(key)
        if not isinstance(found, list):
            raise ValueError(f"pre-commit of {self.txn.gid} lists no {key}; it does not come "
                             f"from a {target}")
        return found

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreCommit:
        txn = TransactionId.parse(data["gid"])
        if txn is None:
            raise ValueError(f"not a flinkish transaction id: {data['gid']!r}")
        return cls(
            txn, int(data["rows"]), int(data.get("late_rows", 0)), data.get("detail") or None
        )


class TaskTransaction(Protocol):
    """One open transaction on the task side (Flink: the TXN handle)."""

    def write(self, batch: pa.RecordBatch) -> None:
        """Add rows to the transaction (Flink: invoke)."""

    def pre_commit(self) -> PreCommit:
        """Make the rows durable but invisible; after this only the driver decides."""

    def abort(self) -> None:
        """Throw the transaction away (the task failed before pre-committing)."""


class TargetBase(Protocol):
    """What every target does, whichever way it commits (see :class:`Target` and
    :class:`EpochTarget`)."""

    #: Whether a transaction left pre-committed can hold up another's writes (PostgreSQL: a
    #: prepared transaction keeps its row locks), so that leftovers must be resolved before
    #: a batch's tasks write, not only at its commit.
    leftovers_block_writes: bool
    #: What a pre-commit left waiting for its commit costs meanwhile, in words ending the
    #: coordinator's warning about one older than ``transactionTimeout``.
    pending_consequence: str

    def check(self, schema: pa.Schema) -> None:
        """Fail at query start with a clear message if the target cannot take ``schema``
        (creating what is missing, e.g. the table)."""

    def begin_transaction(self, txn: TransactionId, schema: pa.Schema) -> TaskTransaction:
        """Open a transaction for one task attempt (Flink: beginTransaction)."""

    def write_direct(self, batch: pa.RecordBatch) -> None:
        """Write and make visible at once (at-least-once / none delivery)."""

    def rollback(self, txn: TransactionId) -> None:
        """Discard a pre-committed (or half-written) transaction. Idempotent."""

    def pending(self, prefix: str, query: str) -> list[TransactionId]:
        """Every pre-committed or half-written transaction of ``prefix``/``query`` still
        lingering in the target (prepared transactions, staged files)."""

    def pending_ages(self, prefix: str, query: str) -> dict[TransactionId, float | None]:
        """:meth:`pending` with each transaction's age in seconds: since it was prepared
        (PostgreSQL's ``pg_prepared_xacts.prepared``) or staged (the staging directory's
        modification time); None where the target cannot tell."""

    def committed_watermark(self, query: str) -> int | None:
        """The highest combined watermark published for ``query``."""

    def max_pending(self) -> int | None:
        """How many pre-commits the target can hold at once, over all queries (PostgreSQL's
        ``max_prepared_transactions``); None when it sets no limit."""

    def close(self) -> None:
        """Release connections."""


class Target(TargetBase, Protocol):
    """A place rows go to that commits each pre-commit on its own (PostgreSQL, Parquet
    files), then records the epoch beside the data."""

    def commit(self, pre_commit: PreCommit) -> None:
        """Make a pre-committed transaction visible. Idempotent: a transaction that is no
        longer pending was committed before (the protocol never rolls back a decided one)."""

    def publish_epoch(
        self, query: str, epoch: int, watermark: int | None, rows: int, late_rows: int,
        source: str | None = None,
    ) -> None:
        """Record a committed epoch and its watermark beside the data, so a consumer can ask
        "is everything up to event time T in?"; ``source`` says which watermark it is
        (:data:`WATERMARK_VALVE` or :data:`WATERMARK_SPARK`). Idempotent per (query, epoch)."""


@dataclass(frozen=True)
class EpochRecord:
    """What a committed epoch publishes: its combined watermark (epoch ms; None before there
    is one), where that comes from (:data:`WATERMARK_VALVE` or :data:`WATERMARK_SPARK`), the
    combined status and idle partitions after it, and its rows (late ones included)."""

    query: str
    epoch: int
    watermark: int | None
    watermark_source: str | None
    status: str | None
    idle_partitions: tuple[str, ...]
    rows: int
    late_rows: int

    def to_json(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "epoch": self.epoch,
            "watermark": self.watermark,
            "watermark_source": self.watermark_source,
            "status": self.status,
            "idle_partitions": list(self.idle_partitions),
            "rows": self.rows,
            "late_rows": self.late_rows,
        }


@runtime_checkable
class EpochTarget(TargetBase, Protocol):
    """A target that commits all of an epoch's pre-commits as one atomic change that also
    carries the epoch's record (a Delta table version), so an epoch appears whole or not at
    all."""

    def commit_epoch(self, pre_commits: list[PreCommit], record: EpochRecord) -> None:
        """Make ``pre_commits`` (every one of the epoch's decided pre-commits for this
        target; none for an epoch without rows) visible at once, with ``record``. Idempotent:
        an epoch the target holds already is not committed again."""


@runtime_checkable
class MaintainedTarget(Protocol):
    """A target with housekeeping to do after an epoch completed (Parquet's compaction):
    run by the driver between epoch commits, so never beside one of the query's commits."""

    def maintain(
        self, prefix: str, query: str, epoch: int, fence: Callable[[], None]
    ) -> None:
        """Housekeeping for ``prefix``/``query`` after its epoch ``epoch`` (and every one
        before) completed. ``fence`` raises if a newer run of the query took over (a zombie
        driver must not rewrite files beside it): call it right before deciding a change.
        Idempotent; failures are the target's to log."""


@runtime_checkable
class ReusedIdsTarget(Protocol):
    """A target whose transaction ids are the same on every replay of an epoch (Kafka's
    transactional ids: the replay's producer fences the crashed run's and aborts its open
    transaction). Opening a decided transaction's id again would abort it, so the write tasks
    of an epoch that has a recorded decision write nothing: its rows are in the decided
    transactions, which the epoch's commit commits."""

    reuses_transaction_ids: bool


#: Either kind of target.
AnyTarget = Target | EpochTarget
