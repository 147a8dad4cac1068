"""Durable checkpoint state for flinkish: checksummed records on any filesystem and a
Flink-style store of pending and completed checkpoints keyed by Spark epoch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkpointing.checkpoint import CompletedCheckpoint, PendingCheckpoint
    from checkpointing.checkpoint_store import AlreadyCompletedError, CheckpointStore, SubsumedError
    from checkpointing.fencing import FencedError
    from checkpointing.storage import CheckpointStorage, CorruptRecordError

#: Where each public name lives, imported on first use (PEP 562): the source's driver-side
#: reader process, started afresh for every streaming query, needs the storage alone.
_PUBLIC = {
    "AlreadyCompletedError": "checkpointing.checkpoint_store",
    "CheckpointStorage": "checkpointing.storage",
    "CheckpointStore": "checkpointing.checkpoint_store",
    "CompletedCheckpoint": "checkpointing.checkpoint",
    "CorruptRecordError": "checkpointing.storage",
    "FencedError": "checkpointing.fencing",
    "PendingCheckpoint": "checkpointing.checkpoint",
    "SubsumedError": "checkpointing.checkpoint_store",
}

__all__ = [
    "AlreadyCompletedError", "CheckpointStorage", "CheckpointStore", "CompletedCheckpoint",
    "CorruptRecordError", "FencedError", "PendingCheckpoint", "SubsumedError",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
