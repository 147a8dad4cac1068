"""Pending and completed checkpoints (Flink: PendingCheckpoint, CompletedCheckpoint), by Spark
epoch. A checkpoint is *pending* once begun (the sink records its decision there, so recovery
can finish it) and *completed* once its final state is durable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class PendingCheckpoint:
    """A begun checkpoint and the state recorded when it began."""

    checkpoint_id: int
    created_ms: int
    state: dict[str, Any]

    def to_record(self) -> dict[str, Any]:
        return {"id": self.checkpoint_id, "created_ms": self.created_ms, "state": self.state}

    @classmethod
    def from_record(cls, record: Any, path: str) -> PendingCheckpoint:
        """CorruptRecordError if ``record`` (read from ``path``) is malformed."""
        return cls(
            _field(record, "id", int, path),
            _field(record, "created_ms", int, path),
            _field(record, "state", dict, path),
        )


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A completed checkpoint: the state recorded when it completed, which recovery restores."""

    checkpoint_id: int
    created_ms: int
    completed_ms: int
    state: dict[str, Any]

    def to_record(self) -> dict[str, Any]:
        return {
            "id": self.checkpoint_id,
            "created_ms": self.created_ms,
            "completed_ms": self.completed_ms,
            "state": self.state,
        }

    @classmethod
    def from_record(cls, record: Any, path: str) -> CompletedCheckpoint:
        return cls(
            _field(record, "id", int, path),
            _field(record, "created_ms", int, path),
            _field(record, "completed_ms", int, path),
            _field(record, "state", dict, path),
        )
