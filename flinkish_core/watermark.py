"""Flink's watermark vocabulary: the bounds of event time and the ACTIVE/IDLE status."""

from __future__ import annotations

import enum

MIN_WATERMARK = -9223372036854775808
"""Flink's ``Long.MIN_VALUE``: the watermark of a channel that has seen none yet."""

MAX_WATERMARK = 9223372036854775807
"""Flink's ``Watermark.MAX_WATERMARK``: end of event time (a source that finished for good)."""

LAST_TIMESTAMP_MS = (2**63 - 1) // 1000
"""The last millisecond a Spark (microsecond) timestamp can hold: MAX_WATERMARK clamps to it."""

LAST_CARRIER_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, where the carrier row of MAX_WATERMARK clamps: the last instant
Python's ``datetime`` represents, so ``collect()`` and ``toPandas()`` of the source's rows still
work, while every window of real data still closes."""

SPARK_DELAY_KEY = "spark.watermarkDelayMs"
"""The column metadata key where Spark keeps a column's watermark delay
(``EventTimeWatermark.delayKey``): a column that has it carries an event-time watermark."""

DEFAULT_HORIZON_MS = 86_400_000
"""How far (one day) the source's carrier row runs ahead of the combined watermark, and the
delay ``with_watermark`` declares to Spark: it must exceed the largest skew between partitions
(see ``flinkish_source.combined_watermark``)."""


class WatermarkStatus(enum.Enum):
    """Whether a channel (or the whole valve) currently takes part in watermark progress."""

    ACTIVE = "ACTIVE"
    IDLE = "IDLE"

    @property
    def is_active(self) -> bool:
        return self is WatermarkStatus.ACTIVE

    @property
    def is_idle(self) -> bool:
        return self is WatermarkStatus.IDLE
