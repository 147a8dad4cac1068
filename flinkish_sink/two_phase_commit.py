"""Flink's two-phase commit, driver half, with Spark micro-batch ids as checkpoint ids.

Decide (record epoch N's pre-commits in the store: its outcome is fixed from here), commit
each decided one (idempotent), complete N with the combined watermark. Recovery commits what a
recorded decision names and rolls back the rest: Spark replays an epoch that did not complete.
The steps: docs/architecture.md, "Two-phase commit".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from checkpointing import CheckpointStore, CompletedCheckpoint
from checkpointing.checkpoint import now_ms
from checkpointing.epoch_watermarks import STATE_KEY, advance_epoch
from checkpointing.failpoints import failpoint
from flinkish_core.durations import format_duration
from flinkish_core.epoch_valve import EpochWatermark
from flinkish_core.markers import Marker
from flinkish_core.watermark import MIN_WATERMARK
from flinkish_sink.target import (
    WATERMARK_SPARK,
    WATERMARK_VALVE,
    AnyTarget,
    EpochRecord,
    EpochTarget,
    MaintainedTarget,
    PreCommit,
    TransactionId,
)

logger = logging.getLogger(__name__)

LATE_SUFFIX = "-late"

#: The key of Spark's event-time watermark of the epoch in its decision record (None: not given).
SPARK_WATERMARK_KEY = "spark_watermark"


def published_watermark(result: EpochWatermark, state: dict[str, Any]
                        ) -> tuple[int | None, str | None]:
    """The watermark an epoch publishes and its source: the valve's once it has one, else
    Spark's recorded in the epoch's ``state``, else none."""
    if result.watermark != MIN_WATERMARK:
        return result.watermark, WATERMARK_VALVE
    spark = state.get(SPARK_WATERMARK_KEY)
    return (None, None) if spark is None else (int(spark), WATERMARK_SPARK)


@dataclass(frozen=True)
class EpochOutcome:
    """What one epoch commit did (for logs, metrics and tests)."""

    checkpoint: CompletedCheckpoint
    watermark: EpochWatermark
    committed: tuple[str, ...]
    rolled_back: tuple[str, ...]
    replayed: bool


class TwoPhaseCommitCoordinator:
    """The driver side of the protocol for one query writing to ``target`` (and late rows to
    ``side_target``); a pre-commit older than ``transaction_timeout_s`` is warned about, as
    Flink's transaction-timeout warning."""

    def __init__(self, store: CheckpointStore, target: AnyTarget, prefix: str, query: str,
                 side_target: AnyTarget | None = None,
                 transaction_timeout_s: float | None = None) -> None:
        self._store = store
        self._target = target
        self._side = side_target
        self._prefix = prefix
        self._query = query
        self._timeout = transaction_timeout_s

    def _target_of(self, txn: TransactionId) -> AnyTarget:
        if txn.prefix == self._prefix + LATE_SUFFIX:
            if self._side is None:
                raise ValueError(f"{txn.gid} belongs to a late-data side output not configured")
            return self._side
        return self._target

    def commit_epoch(self, epoch: int, pre_commits: Iterable[PreCommit], markers: Iterable[Marker],
                     rows: int, late_rows: int, spark_watermark: int | None = None
                     ) -> EpochOutcome:
        """Decide, commit and complete epoch ``epoch``; idempotent under Spark's replays.
        ``spark_watermark`` (rows without markers) is recorded with the decision, so that a
        replay publishes the same value."""
        pre_commits = list(pre_commits)
        done = self._store.completed(epoch)
        if done is not None:
            # all it decided was committed before it completed: what else there is goes
            rolled = self._discard(pre_commits, set())
            recovered, recover_rolled = self.recover(epoch)
            self._maintain(epoch)
            return EpochOutcome(
                done, EpochWatermark.from_json(done.state[STATE_KEY]), tuple(recovered),
                tuple(rolled + recover_rolled), True)

        pending = self._store.pending(epoch)
        replayed = pending is not None
        if pending is None:
            failpoint("before_decision", query=self._query, epoch=epoch)
            pending = self._store.begin(epoch, {
                "decision": [pc.to_json() for pc in pre_commits],
                "markers": [m.to_json() for m in markers],
                "rows": rows, "late_rows": late_rows, SPARK_WATERMARK_KEY: spark_watermark})
            failpoint("after_decision", query=self._query, epoch=epoch,
                      transactions=len(pending.state["decision"]))
        decision = pending.state
        chosen = [PreCommit.from_json(d) for d in decision["decision"]]
        if replayed and chosen:
            # decided by an earlier attempt: its pre-commits are at least as old as the decision
            self._warn_if_old(
                self._target_of(chosen[0].txn),
                f"epoch {epoch}'s {len(chosen)} decided pre-commit(s) "
                f"({', '.join(pc.txn.gid for pc in chosen[:3])}{', …' if len(chosen) > 3 else ''})",
                (now_ms() - pending.created_ms) / 1000, "committing them now")
        result, record = self._epoch_record(epoch, decision)
        committed = self._commit_decided(chosen, record)
        rolled = self._discard(pre_commits, {pc.txn.gid for pc in chosen})
        recovered, recover_rolled = self.recover(epoch)
        committed += recovered
        rolled += recover_rolled

        if not isinstance(self._target, EpochTarget):  # an epoch target's commit carried it
            self._target.publish_epoch(self._query, epoch, record.watermark, record.rows,
                                       record.late_rows, record.watermark_source)
        failpoint("before_checkpoint", query=self._query, epoch=epoch)
        checkpoint = self._store.complete(epoch, {**decision, STATE_KEY: result.to_json()})
        failpoint("after_checkpoint", query=self._query, epoch=epoch)
        self._maintain(epoch)
        return EpochOutcome(checkpoint, result, tuple(committed), tuple(rolled), replayed)

    def _maintain(self, epoch: int) -> None:
        """The targets' housekeeping once ``epoch`` completed: a replay of it (or of any
        epoch before) commits nothing, so it never misses what housekeeping rewrote."""
        for target, prefix in ((self._target, self._prefix),
                               (self._side, self._prefix + LATE_SUFFIX)):
            if isinstance(target, MaintainedTarget):
                target.maintain(prefix, self._query, epoch, self._store.check_claim)

    def _epoch_record(self, epoch: int, decision: dict[str, Any]
                      ) -> tuple[EpochWatermark, EpochRecord]:
        """The combined watermark after decided epoch ``epoch`` (the same on every replay) and
        what the epoch publishes."""
        result = advance_epoch(self._store, epoch,
                               (Marker.from_json(m) for m in decision["markers"]))
        published, source = published_watermark(result, decision)
        return result, EpochRecord(
            self._query, epoch, published, source, result.status,
            tuple(result.idle_partitions), decision["rows"], decision["late_rows"])

    def _commit_decided(self, chosen: list[PreCommit], record: EpochRecord) -> list[str]:
        """Commit the decided pre-commits, one by one into a :class:`Target`, all at once into
        an :class:`EpochTarget` (the main one even without any: it publishes the epoch)."""
        whole: list[tuple[EpochTarget, list[PreCommit]]] = [
            (t, []) for t in (self._target, self._side) if isinstance(t, EpochTarget)]
        committed: list[str] = []
        for pc in chosen:
            target = self._target_of(pc.txn)
            if isinstance(target, EpochTarget):
                next(group for t, group in whole if t is target).append(pc)
                continue
            target.commit(pc)
            committed.append(pc.txn.gid)
            failpoint("mid_commit", query=self._query, epoch=record.epoch)
        for target, decided in whole:
            if decided or target is self._target:
                target.commit_epoch(decided, record)
                committed += [pc.txn.gid for pc in decided]
                failpoint("mid_commit", query=self._query, epoch=record.epoch)
        return committed

    def abort_epoch(self, epoch: int, pre_commits: Iterable[PreCommit | None]) -> list[str]:
        """Spark gave up on the epoch's tasks: roll back what they pre-committed, unless an
        earlier attempt of the epoch already decided on it."""
        recorded = self._store.completed(epoch) or self._store.pending(epoch)
        state = {} if recorded is None else recorded.state
        return self._discard([pc for pc in pre_commits if pc is not None],
                             {d["gid"] for d in state.get("decision", [])})

    def _discard(self, pre_commits: list[PreCommit], keep: set[str]) -> list[str]:
        rolled = []
        for pc in pre_commits:
            if pc.txn.gid not in keep:
                self._target_of(pc.txn).rollback(pc.txn)
                rolled.append(pc.txn.gid)
        return rolled

    def lingering(self) -> list[TransactionId]:
        """Every transaction of this query still pre-committed in the targets."""
        return sorted(self.lingering_ages())

    def lingering_ages(self) -> dict[TransactionId, float | None]:
        """:meth:`lingering` with each one's age in seconds (None: the target cannot tell)."""
        found = dict(self._target.pending_ages(self._prefix, self._query))
        if self._side is not None:
            found.update(self._side.pending_ages(self._prefix + LATE_SUFFIX, self._query))
        return found

    def _warn_if_old(self, target: AnyTarget, what: str, age: float | None,
                     action: str) -> None:
        if self._timeout is None or age is None or age <= self._timeout:
            return
        logger.warning(
            "%s of query %s prepared %s ago, longer than transactionTimeout (%s): %s (the "
            "query was down, or its commits fail); %s",
            what, self._query, format_duration(age), format_duration(self._timeout),
            target.pending_consequence, action)

    def recover_before_writes(self, writer: str) -> tuple[list[str], list[str]]:
        """Flink's ``initializeState``: resolve what other writers left pre-committed, sparing
        ``writer``'s (its :attr:`TransactionId.run`), once the claim is checked (so no other
        run can still decide on what this rolls back)."""
        self._store.check_claim()
        return self.recover(spare=writer)

    def recover(self, up_to_epoch: int | None = None, *, spare: str | None = None
                ) -> tuple[list[str], list[str]]:
        """Resolve lingering transactions of epochs <= ``up_to_epoch`` (all if None) but
        ``spare``'s: commit those a pending epoch's decision names, roll back the rest (a
        completed epoch committed all it decided). The gids (committed, rolled back)."""
        committed: list[str] = []
        rolled: list[str] = []
        states: dict[int, dict[str, Any]] = {}  # the pending epochs' decision records
        decisions: dict[int, dict[str, Any]] = {}
        whole: set[int] = set()  # epochs to commit whole into an epoch target
        ages = self.lingering_ages()
        for txn in sorted(ages):
            if (up_to_epoch is not None and txn.epoch > up_to_epoch) or (
                    spare is not None and txn.run == spare):
                continue
            if txn.epoch not in decisions:
                pending = (None if self._store.completed(txn.epoch) is not None
                           else self._store.pending(txn.epoch))
                states[txn.epoch] = {} if pending is None else pending.state
                decisions[txn.epoch] = {d["gid"]: d for d in states[txn.epoch].get("decision", [])}
            target = self._target_of(txn)
            found = decisions[txn.epoch].get(txn.gid)
            self._warn_if_old(
                target, f"pre-commit {txn.gid}", ages[txn],
                "committing it now (its epoch decided on it)" if found is not None
                else "rolling it back now (no decision names it)")
            if found is not None:
                logger.info("recovering %s: committing (its epoch decided on it)", txn.gid)
                if isinstance(target, EpochTarget):
                    whole.add(txn.epoch)
                else:
                    target.commit(PreCommit.from_json(found))
                committed.append(txn.gid)
            else:
                logger.info("recovering %s: rolling back (no decision names it)", txn.gid)
                target.rollback(txn)
                rolled.append(txn.gid)
        for epoch in sorted(whole):
            # an epoch target takes the epoch whole, with the record its commit would publish
            decided = [PreCommit.from_json(d) for d in decisions[epoch].values()]
            _, record = self._epoch_record(epoch, states[epoch])
            self._commit_decided(decided, record)
        return committed, rolled
