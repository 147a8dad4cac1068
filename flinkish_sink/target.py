"""The contract every two-phase-commit target implements (Flink's ``TwoPhaseCommitSinkFunction``).

Write tasks run beginTransaction, write and preCommit; the driver commits, aborts and
recovers, so only the JSON-serialisable :class:`PreCommit` crosses from one to the other.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

GID_PART = re.compile(r"^[A-Za-z0-9_.-]+$")

#: Where an epoch's published watermark comes from: the valve over the marker rows, or, for
#: rows without markers, Spark's event-time watermark of the micro-batch.
WATERMARK_VALVE = "valve"
WATERMARK_SPARK = "spark"

#: The flinkish source's columns of where a record was read, never where to write it.
SOURCE_POSITION = frozenset({"topic", "partition", "offset"})

#: What to do when an epoch has more write tasks than prepared transactions can be held.
FIX_WRITE_TASKS = (
    "each write task of an epoch keeps one prepared transaction until the driver commits the "
    "epoch. Fix: fewer write tasks — set spark.sql.shuffle.partitions (its default 200 is "
    "the number of write tasks after an aggregation; the number of cores is plenty) or "
    "coalesce(n) the stream before writeStream — or raise the server's "
    "max_prepared_transactions above the write tasks of all queries writing to it "
    "(ALTER SYSTEM SET max_prepared_transactions = N, then restart PostgreSQL)")


#: Where transactions stage their files (Parquet) or list them (Delta, Iceberg) until decided.
STAGING_DIR = "_flinkish_staging"
#: Where a Parquet target keeps its committed epochs' records.
EPOCHS_DIR = "_flinkish_epochs"
_STAGED_SEPARATOR = "~"


@dataclass(frozen=True, order=True)
class TransactionId:
    """Id of one write attempt's transaction, found by prefix and query and decided by epoch.

    ``run`` is a token of the writer that planned the attempt: a replay numbers its attempts
    from 0 again, and must not re-prepare under the id of a transaction already committed.
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
            if (value or name != "run") and not GID_PART.match(value):
                raise ValueError(f"transaction id {name} {value!r} may only hold letters, "
                                 "digits, '_', '.' and '-'")

    @property
    def gid(self) -> str:
        """The global id, e.g. ``flinkish:q1:7:3:0:5f2a9c1e``."""
        base = f"{self.prefix}:{self.query}:{self.epoch}:{self.task}:{self.attempt}"
        return f"{base}:{self.run}" if self.run else base

    @property
    def staged_name(self) -> str:
        """The gid with ``:`` (not allowed on every filesystem) as ``~``."""
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
                len(parts) == 6 and not run):
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
        return {"gid": self.txn.gid, "rows": self.rows, "late_rows": self.late_rows,
                "detail": self.detail or {}}

    def listed(self, key: str, target: str) -> list[Any]:
        """The list under ``key`` in the detail; ValueError if it is another ``target``'s."""
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
        return cls(txn, int(data["rows"]), int(data.get("late_rows", 0)),
                   data.get("detail") or None)


class TaskTransaction(Protocol):
    """One open transaction on the task side (Flink: the TXN handle)."""

    def write(self, batch: pa.RecordBatch) -> None:
        """Add rows to the transaction (Flink: invoke)."""

    def pre_commit(self) -> PreCommit:
        """Make the rows durable but invisible; after this only the driver decides."""

    def abort(self) -> None:
        """Throw the transaction away (the task failed before pre-committing)."""


class TargetBase(Protocol):
    """What every target does, whichever way it commits."""

    #: Whether a transaction left pre-committed can hold up others' writes (a prepared
    #: transaction's row locks): then leftovers are resolved before a batch's tasks write.
    leftovers_block_writes: bool
    #: What a pre-commit left waiting costs, ending the ``transactionTimeout`` warning.
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
        """Every pre-committed or half-written transaction of ``prefix``/``query`` lingering."""

    def pending_ages(self, prefix: str, query: str) -> dict[TransactionId, float | None]:
        """:meth:`pending` with each one's age in seconds (None: the target cannot tell)."""

    def committed_watermark(self, query: str) -> int | None:
        """The highest combined watermark published for ``query``."""

    def max_pending(self) -> int | None:
        """How many pre-commits the target can hold at once over all queries; None: no limit."""

    def close(self) -> None:
        """Release connections."""


class Target(TargetBase, Protocol):
    """A target that commits each pre-commit on its own, then records the epoch beside the
    data (PostgreSQL, Parquet)."""

    def commit(self, pre_commit: PreCommit) -> None:
        """Make a pre-committed transaction visible. Idempotent: a transaction that is no
        longer pending was committed before (the protocol never rolls back a decided one)."""

    def publish_epoch(self, query: str, epoch: int, watermark: int | None, rows: int,
                      late_rows: int, source: str | None = None) -> None:
        """Record a committed epoch and its watermark beside the data, so a consumer can ask
        "is everything up to event time T in?". Idempotent per (query, epoch)."""


@dataclass(frozen=True)
class EpochRecord:
    """What a committed epoch publishes: its watermark (epoch ms) and its source, the
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
        return {**asdict(self), "idle_partitions": list(self.idle_partitions)}


@runtime_checkable
class EpochTarget(TargetBase, Protocol):
    """A target that commits an epoch's pre-commits and record as one atomic change (a Delta
    table version): an epoch appears whole or not at all."""

    def commit_epoch(self, pre_commits: list[PreCommit], record: EpochRecord) -> None:
        """Make the epoch's decided ``pre_commits`` (maybe none) visible at once, with
        ``record``. Idempotent: an epoch the target holds is not committed again."""


@runtime_checkable
class MaintainedTarget(Protocol):
    """A target with housekeeping after an epoch completed (compaction), run by the driver
    between epoch commits."""

    def maintain(self, prefix: str, query: str, epoch: int, fence: Callable[[], None]) -> None:
        """Housekeeping after ``epoch`` completed; ``fence`` raises if a newer run took over:
        call it right before deciding a change. Idempotent; failures are the target's to log."""


@runtime_checkable
class ReusedIdsTarget(Protocol):
    """A target whose transaction ids are the same on every replay (Kafka): opening a decided
    transaction's id again would abort it, so the tasks of a decided epoch write nothing."""

    reuses_transaction_ids: bool


AnyTarget = Target | EpochTarget
