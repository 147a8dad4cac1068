"""Durable checkpoint state for flinkish: checksummed records on any filesystem and a
Flink-style store of pending and completed checkpoints keyed by Spark epoch."""

from checkpointing.checkpoint import CompletedCheckpoint, PendingCheckpoint
from checkpointing.checkpoint_store import AlreadyCompletedError, CheckpointStore, SubsumedError
from checkpointing.fencing import FencedError
from checkpointing.storage import CheckpointStorage, CorruptRecordError

__all__ = [
    "AlreadyCompletedError",
    "CheckpointStorage",
    "CheckpointStore",
    "CompletedCheckpoint",
    "CorruptRecordError",
    "FencedError",
    "PendingCheckpoint",
    "SubsumedError",
]
