"""Flink's late-data rule over epochs, for the sink, ``ValveForEachBatch`` and
``with_watermark``: a record of epoch N is *late* when its event time is at or below the
combined watermark epoch N-1 committed (the one in force when the batch starts); a record
without an event time never is.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_core.epoch_valve import EpochWatermark
from flinkish_core.watermark import LAST_TIMESTAMP_MS, MIN_WATERMARK


def late_threshold(latest: EpochWatermark | None, epoch: int) -> int:
    """The threshold of epoch ``epoch`` given the latest completed epoch: the watermark that
    one reached, or for its replay the one it was judged against itself."""
    if latest is None:
        return MIN_WATERMARK
    if epoch < latest.epoch:
        raise ValueError(
            f"epoch {epoch} is older than the latest completed epoch {latest.epoch}: Spark "
            "replays only the last batch, so its threshold is the one recorded with it"
        )
    return latest.watermark if epoch > latest.epoch else latest.previous_watermark


def late_cutoff_us(threshold: int) -> int | None:
    """Event times (microseconds since the epoch) at or below this are late; None when nothing
    is (no watermark yet). ``MAX_WATERMARK`` (every partition ended) clamps to Spark's last
    timestamp, so then every record with an event time is late."""
    if threshold == MIN_WATERMARK:
        return None
    return min(threshold, LAST_TIMESTAMP_MS) * 1000


def late_mask(event_time: pa.Array, threshold: int) -> pa.BooleanArray | None:
    """Which rows of a microsecond timestamp column are late (None: none can be)."""
    cutoff = late_cutoff_us(threshold)
    if cutoff is None:
        return None
    return pc.fill_null(pc.less_equal(event_time.cast(pa.int64()), cutoff), False)
