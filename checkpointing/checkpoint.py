"""Pending and completed checkpoints (Flink: PendingCheckpoint, CompletedCheckpoint), by Spark
epoch. A checkpoint is *pending* once begun (the sink records its decision there, so recovery
can finish it) and *completed* once its final state is durable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from checkpointing.storage import CorruptRecordError


def check_checkpoint_id(checkpoint_id: int) -> int:
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 0:
        raise ValueError(f"checkpoint id must be an int >= 0, got {checkpoint_id!r}")
    return checkpoint_id


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _field(record: Any, name: str, kind: type, path: str) -> Any:
    value = record.get(name) if isinstance(record, dict) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptRecordError(path, f"not a checkpoint record: bad or missing {name!r}")
    return value


_R = TypeVar("_R", bound="_Record")


def _record_key(name: str) -> str:
    return "id" if name == "checkpoint_id" else name


@dataclass(frozen=True)
class _Record:
    """A checkpoint as a record: its fields by name (the id as ``id``), all ints but the state."""

    def to_record(self) -> dict[str, Any]:
        return {_record_key(f.name): getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_record(cls: type[_R], record: Any, path: str) -> _R:
        """CorruptRecordError if ``record`` (read from ``path``) is malformed."""
        return cls(*(_field(record, _record_key(f.name), dict if f.name == "state" else int, path)
                     for f in fields(cls)))


@dataclass(frozen=True)
class PendingCheckpoint(_Record):
    """A begun checkpoint and the state recorded when it began."""

    checkpoint_id: int
    created_ms: int
    state: dict[str, Any]


@dataclass(frozen=True)
class CompletedCheckpoint(_Record):
    """A completed checkpoint: the state recorded when it completed, which recovery restores."""

    checkpoint_id: int
    created_ms: int
    completed_ms: int
    state: dict[str, Any]
