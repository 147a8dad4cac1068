"""Durable pending and completed checkpoints with subsumption and retention (Flink: the
bookkeeping of CheckpointCoordinator plus CompletedCheckpointStore): ``completed/<id>.json``
is the commit point, ``_latest`` points at it, and recovery takes the highest id of both,
never an older one (the steps and the crash cases: docs/architecture.md, section 5). One
instance writes a location at a time (see fencing); an instance is not thread-safe.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, TypeVar

from checkpointing.checkpoint import (
    CompletedCheckpoint,
    PendingCheckpoint,
    check_checkpoint_id,
    now_ms,
)
from checkpointing.failpoints import failpoint
from checkpointing.fencing import FENCING_RECORDS, OwnerFence
from checkpointing.storage import CheckpointStorage, CorruptRecordError

logger = logging.getLogger(__name__)

PENDING_DIR = "pending"
COMPLETED_DIR = "completed"
LATEST_POINTER = "_latest"
_RECORD_NAME = re.compile(r"^(\d{20})\.json$")
_Checkpoint = TypeVar("_Checkpoint", PendingCheckpoint, CompletedCheckpoint)


class SubsumedError(ValueError):
    """The checkpoint is below the latest completed one and has no completed record."""


class AlreadyCompletedError(ValueError):
    """The checkpoint is completed, so it can no longer be begun or aborted."""


def record_path(directory: str, checkpoint_id: int) -> str:
    """Zero-padded: names sort as numbers."""
    return f"{directory}/{checkpoint_id:020d}.json"


def _json_state(state: Any) -> dict[str, Any]:
    """``state`` as it will read back, so a write returns what a later read returns."""
    if not isinstance(state, dict):
        raise TypeError(f"checkpoint state must be a JSON object (dict), got {type(state)}")
    try:
        copy: dict[str, Any] = json.loads(json.dumps(state, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint state is not JSON-serialisable: {e}") from e
    return copy


class CheckpointStore:
    """Pending and completed checkpoints of one query at one storage location, keeping
    ``retain`` completed ones. Opening claims the location for ``owner`` and ``run`` (see
    :mod:`checkpointing.fencing`; FencedError) and removes temp files of crashed writes."""

    def __init__(
        self, storage: CheckpointStorage, *, owner: str, retain: int = 10, run: str | None = None
    ) -> None:
        if isinstance(retain, bool) or not isinstance(retain, int) or retain < 1:
            raise ValueError(f"retain must be an int >= 1, got {retain!r}")
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"owner must be a non-empty string, got {owner!r}")
        self._storage = storage
        self.owner = owner
        self.retain = retain
        self._fence: OwnerFence | None = OwnerFence.acquire(storage, owner, run)
        # safe now: other writers are fenced, and runs opening the store at this moment
        # write only the fencing records, which are kept
        removed = storage.cleanup_temp(keep=FENCING_RECORDS)
        if removed:
            logger.info("removed %d temp files of crashed writes in %s", removed, storage.location)

    @classmethod
    def reader(cls, storage: CheckpointStorage) -> CheckpointStore:
        """A read-only view that claims nothing: for reporting and for readers beside the
        owning query (``flinkish inspect``, the sink's planning of late-data thresholds)."""
        store = cls.__new__(cls)
        store._storage = storage
        store.owner = ""
        store.retain = 1
        store._fence = None
        return store

    def _writable(self) -> OwnerFence:
        if self._fence is None:
            raise PermissionError(f"{self.location} was opened read-only (CheckpointStore.reader)")
        self._fence.check()
        return self._fence

    def check_claim(self) -> None:
        """Raise FencedError if a newer run (or another query) has claimed the location: for
        a caller about to act on what the records say (roll back what no decision names)."""
        self._writable()

    @property
    def location(self) -> str:
        return self._storage.location

    @property
    def generation(self) -> int:
        """How many claims the location has seen, this one's included."""
        return 0 if self._fence is None else self._fence.claim.generation

    @property
    def run(self) -> str | None:
        """The run this instance's claim names (None: opened without one, or read-only)."""
        return None if self._fence is None else self._fence.claim.run

    def begin(self, checkpoint_id: int, state: dict[str, Any] | None = None) -> PendingCheckpoint:
        """Durably record checkpoint ``checkpoint_id`` as pending, with ``state``. Idempotent:
        if it is already pending, the first recorded state (the sink's decision) is returned;
        abort first to replace it. Raises AlreadyCompletedError / SubsumedError at or below the
        latest completed checkpoint."""
        check_checkpoint_id(checkpoint_id)
        state = _json_state({} if state is None else state)
        self._writable()
        latest = self._latest_id()
        if latest is not None and checkpoint_id <= latest:
            if self._read_completed(checkpoint_id) is not None:
                raise self._already_completed(checkpoint_id, "begin")
            raise self._subsumed(checkpoint_id, latest, "begin")
        recorded = self._read_pending(checkpoint_id)
        if recorded is not None:
            return recorded
        pending = PendingCheckpoint(checkpoint_id, now_ms(), state)
        self._storage.write_json(record_path(PENDING_DIR, checkpoint_id), pending.to_record())
        return pending

    def complete(self, checkpoint_id: int, state: dict[str, Any]) -> CompletedCheckpoint:
        """Complete ``checkpoint_id`` with its final ``state`` (pending or not), subsuming the
        pending checkpoints below it and applying retention. Re-completing (Spark replays a
        batch) returns the *recorded* checkpoint, ignoring ``state``, and finishes what a
        crashed completion left undone. Raises SubsumedError below the latest completed one."""
        check_checkpoint_id(checkpoint_id)
        state = _json_state(state)
        self._writable()
        pointer, ids = self._scan()
        latest = _latest(pointer, ids)
        recorded = self._read_completed(checkpoint_id)
        if recorded is not None:
            self._settle(
                checkpoint_id if latest is None else max(latest, checkpoint_id), pointer, ids
            )
            return recorded
        if latest is not None and checkpoint_id < latest:
            raise self._subsumed(checkpoint_id, latest, "complete")
        pending = self._read_pending(checkpoint_id)
        completed_ms = now_ms()
        created_ms = completed_ms if pending is None else pending.created_ms
        completed = CompletedCheckpoint(checkpoint_id, created_ms, completed_ms, state)
        self._storage.write_json(record_path(COMPLETED_DIR, checkpoint_id), completed.to_record())
        failpoint("checkpoint_write", query=self.owner, epoch=checkpoint_id)
        self._settle(checkpoint_id, pointer, ids)
        return completed

    def abort(self, checkpoint_id: int) -> None:
        """Drop pending checkpoint ``checkpoint_id`` if there is one; AlreadyCompletedError if
        it is completed: that decision is final."""
        check_checkpoint_id(checkpoint_id)
        self._writable()
        if self._read_completed(checkpoint_id) is not None:
            raise self._already_completed(checkpoint_id, "abort")
        self._storage.delete(record_path(PENDING_DIR, checkpoint_id))

    def _settle(self, latest: int, pointer: int | None, ids: list[int]) -> None:
        """Steps 2-4 of a completion whose record (``latest``) is written."""
        if pointer != latest:
            self._storage.write_json(LATEST_POINTER, {"id": latest})
        for pending_id in self._ids(PENDING_DIR):
            if pending_id <= latest:
                self._storage.delete(record_path(PENDING_DIR, pending_id))
        oldest_kept = sorted({*ids, latest})[-self.retain :][0]
        for completed_id in ids:
            if completed_id < oldest_kept:
                self._storage.delete(record_path(COMPLETED_DIR, completed_id))

    def pending(self, checkpoint_id: int) -> PendingCheckpoint | None:
        """Pending checkpoint ``checkpoint_id``, or None."""
        check_checkpoint_id(checkpoint_id)
        latest = self._latest_id()
        if latest is not None and checkpoint_id <= latest:
            return None
        return self._read_pending(checkpoint_id)

    def pending_ids(self) -> list[int]:
        """Ids of the pending checkpoints, ascending (all above the latest completed one)."""
        latest = self._latest_id()
        return [i for i in self._ids(PENDING_DIR) if latest is None or i > latest]

    def completed(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        return self._read_completed(check_checkpoint_id(checkpoint_id))

    def completed_ids(self) -> list[int]:
        return self._ids(COMPLETED_DIR)

    def latest_completed(self) -> CompletedCheckpoint | None:
        """The checkpoint to recover from, or None before the first completion;
        CorruptRecordError rather than an older one."""
        latest = self._latest_id()
        if latest is None:
            return None
        found = self._read_completed(latest)
        if found is None:
            path = self._storage.full_path(record_path(COMPLETED_DIR, latest))
            raise CorruptRecordError(
                path,
                f"missing, yet {self._storage.full_path(LATEST_POINTER)} names it as the latest "
                "completed checkpoint; refusing to fall back to an older one",
            )
        return found

    def _ids(self, directory: str) -> list[int]:
        names = (_RECORD_NAME.match(n) for n in self._storage.list(directory))
        return sorted(int(m.group(1)) for m in names if m)

    def _scan(self) -> tuple[int | None, list[int]]:
        """The pointer (None if absent, or damaged while records exist) and the listed ids."""
        ids = self._ids(COMPLETED_DIR)
        try:
            return self._read_pointer(), ids
        except CorruptRecordError as e:
            if not ids:
                raise
            logger.warning("%s; using the completed records instead", e)
            return None, ids

    def _read_pointer(self) -> int | None:
        try:
            record = self._storage.read_json(LATEST_POINTER)
        except FileNotFoundError:
            return None
        pointer = record.get("id") if isinstance(record, dict) else None
        if isinstance(pointer, bool) or not isinstance(pointer, int):
            path = self._storage.full_path(LATEST_POINTER)
            raise CorruptRecordError(path, "not a latest-completed pointer")
        return pointer

    def _latest_id(self) -> int | None:
        return _latest(*self._scan())

    def _read_pending(self, checkpoint_id: int) -> PendingCheckpoint | None:
        return self._read(PENDING_DIR, PendingCheckpoint, checkpoint_id)

    def _read_completed(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        return self._read(COMPLETED_DIR, CompletedCheckpoint, checkpoint_id)

    def _read(self, directory: str, kind: type[_Checkpoint], checkpoint_id: int
              ) -> _Checkpoint | None:
        """CorruptRecordError also for a record of another checkpoint (copied or renamed)."""
        relpath = record_path(directory, checkpoint_id)
        try:
            record = self._storage.read_json(relpath)
        except FileNotFoundError:
            return None
        path = self._storage.full_path(relpath)
        checkpoint = kind.from_record(record, path)
        if checkpoint.checkpoint_id != checkpoint_id:
            raise CorruptRecordError(
                path, f"holds checkpoint {checkpoint.checkpoint_id}, expected {checkpoint_id}")
        return checkpoint

    def _already_completed(self, checkpoint_id: int, action: str) -> AlreadyCompletedError:
        return AlreadyCompletedError(
            f"cannot {action} checkpoint {checkpoint_id} at {self.location!r}: it is already "
            "completed (a replayed epoch should look it up with completed())"
        )

    def _subsumed(self, checkpoint_id: int, latest: int, action: str) -> SubsumedError:
        return SubsumedError(
            f"cannot {action} checkpoint {checkpoint_id} at {self.location!r}: it is below the "
            f"latest completed checkpoint {latest} and has no completed record, so it was "
            f"subsumed (or it completed and retention, retain={self.retain}, has dropped it)"
        )

    def __repr__(self) -> str:
        return (
            f"CheckpointStore({self.location!r}, owner={self.owner!r}, "
            f"generation={self.generation}, retain={self.retain})"
        )


def _latest(pointer: int | None, ids: list[int]) -> int | None:
    return max(ids if pointer is None else [*ids, pointer], default=None)
