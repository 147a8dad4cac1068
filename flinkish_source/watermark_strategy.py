"""Flink's ``WatermarkStrategy`` and per-partition ``WatermarkGenerator``s; a generator's state is
carried from slice to slice (:class:`GeneratorState`), so watermarks never go back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flinkish_core.watermark import MAX_WATERMARK, MIN_WATERMARK
from flinkish_source.options import EventTime, WatermarkKind


@dataclass(frozen=True)
class GeneratorState:
    """What a partition's generator knows after reading up to offset ``at``
    (``event_time_errors``: records emitted without an event time, ``eventTime.onError=skip``)."""

    at: int
    max_timestamp: int = MIN_WATERMARK
    watermark: int = MIN_WATERMARK
    event_time_errors: int = 0

    def to_json(self) -> dict[str, int]:
        return {"at": self.at, "maxTs": self.max_timestamp, "wm": self.watermark,
                "errors": self.event_time_errors}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GeneratorState:
        try:
            return cls(int(data["at"]), int(data["maxTs"]), int(data["wm"]),
                       int(data.get("errors", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a watermark generator state: {data!r}") from exc


@dataclass(frozen=True)
class WatermarkStrategy:
    """How per-partition watermarks are made; mirrors Flink's builder methods."""

    kind: WatermarkKind
    max_out_of_orderness_ms: int = 0

    @classmethod
    def for_bounded_out_of_orderness(cls, max_out_of_orderness_ms: int) -> WatermarkStrategy:
        if max_out_of_orderness_ms < 0:
            raise ValueError("max out-of-orderness must not be negative")
        return cls(WatermarkKind.BOUNDED_OUT_OF_ORDERNESS, max_out_of_orderness_ms)

    @classmethod
    def for_monotonous_timestamps(cls) -> WatermarkStrategy:
        return cls(WatermarkKind.MONOTONOUS)

    @classmethod
    def punctuated(cls) -> WatermarkStrategy:
        return cls(WatermarkKind.PUNCTUATED)

    @classmethod
    def no_watermarks(cls) -> WatermarkStrategy:
        return cls(WatermarkKind.NONE)

    @classmethod
    def from_options(cls, options: EventTime) -> WatermarkStrategy:
        """The strategy ``watermark.strategy`` names, with its bound (idleness is judged where
        batches are planned)."""
        return {
            WatermarkKind.BOUNDED_OUT_OF_ORDERNESS:
                cls.for_bounded_out_of_orderness(options.max_out_of_orderness_ms),
            WatermarkKind.MONOTONOUS: cls.for_monotonous_timestamps(),
            WatermarkKind.PUNCTUATED: cls.punctuated(),
            WatermarkKind.NONE: cls.no_watermarks(),
        }[options.watermark]

    def create_generator(self, state: GeneratorState) -> WatermarkGenerator:
        return WatermarkGenerator(self, state)


class WatermarkGenerator:
    """One partition's generator (Flink's ``onEvent`` / ``onPeriodicEmit``): bounded
    out-of-orderness emits ``max event time - bound - 1`` (no more events at or below it),
    monotonous the same with no bound, punctuated a flagged record's own event time; only ever
    advancing."""

    def __init__(self, strategy: WatermarkStrategy, state: GeneratorState) -> None:
        self._strategy = strategy
        self._max_ts = state.max_timestamp
        self._emitted = state.watermark
        self._errors = state.event_time_errors

    @property
    def periodic(self) -> bool:
        return self._strategy.kind in (WatermarkKind.BOUNDED_OUT_OF_ORDERNESS,
                                       WatermarkKind.MONOTONOUS)

    def on_max_event_time(self, max_ts: int | None) -> None:
        """Fold in a chunk's maximum event time (periodic strategies read whole chunks)."""
        if max_ts is not None and max_ts > self._max_ts:
            self._max_ts = max_ts

    def on_punctuation(self, event_time: int) -> int | None:
        """A flagged record: the watermark to emit right after it, if it advances."""
        if event_time > self._emitted:
            self._emitted = event_time
            return event_time
        return None

    def on_event_time_error(self) -> None:
        self._errors += 1

    def on_periodic_emit(self) -> int | None:
        """The watermark to emit now (end of a slice), or None if it did not advance."""
        if not self.periodic or self._max_ts == MIN_WATERMARK:
            return None
        candidate = self._max_ts - self._strategy.max_out_of_orderness_ms - 1
        if candidate > self._emitted:
            self._emitted = candidate
            return candidate
        return None

    def on_end_of_input(self) -> int | None:
        """A bounded partition reached its ending offset: Flink's MAX_WATERMARK, once."""
        if self._emitted == MAX_WATERMARK or self._strategy.kind is WatermarkKind.NONE:
            return None
        self._emitted = MAX_WATERMARK
        return MAX_WATERMARK

    def state(self, at: int) -> GeneratorState:
        return GeneratorState(at, self._max_ts, self._emitted, self._errors)
