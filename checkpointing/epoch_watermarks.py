"""The combined watermark of each epoch, kept with the epoch's completed checkpoint: restore
the valve from the latest completed epoch and advance it over the new epoch's markers: one copy
of the rule for every driver-side user of the valve (the sink's commit, ``ValveForEachBatch``).
"""

from __future__ import annotations

from collections.abc import Iterable

from checkpointing.checkpoint_store import CheckpointStore
from flinkish_core.epoch_valve import EpochWatermark, advance, initial
from flinkish_core.markers import Marker

#: The key of the epoch's :class:`EpochWatermark` in its checkpoint state.
STATE_KEY = "watermark"


def completed_watermark(store: CheckpointStore, epoch: int) -> EpochWatermark | None:
    """The combined watermark recorded with completed epoch ``epoch`` (None if not completed)."""
    done = store.completed(epoch)
    return None if done is None else EpochWatermark.from_json(done.state[STATE_KEY])


def latest_watermark(store: CheckpointStore) -> EpochWatermark | None:
    """The combined watermark of the latest completed epoch (None before the first)."""
    latest = store.latest_completed()
    return None if latest is None else EpochWatermark.from_json(latest.state[STATE_KEY])


def advance_epoch(store: CheckpointStore, epoch: int, markers: Iterable[Marker]) -> EpochWatermark:
    """Feed epoch ``epoch``'s markers into the valve restored from the latest completed epoch."""
    previous = latest_watermark(store)
    return advance(initial() if previous is None else previous, epoch, markers)
