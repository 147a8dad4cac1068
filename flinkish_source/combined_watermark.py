"""The combined watermark at planning time, and the carrier row that hands it to Spark.

The valve before the last batch that read anything and that batch's slices are journaled in the
end offset, so a replay carries the identical watermark; the batch that reaches the end of the
input for now is *closing*, and its last read task carries the watermark after it
(:func:`closing_carrier`). How and why: docs/semantics.md, "Spark's own operators on the combined
watermark".
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flinkish_core.epoch_valve import EpochWatermark, advance, initial
from flinkish_core.markers import KIND_CARRIER, MARKER_FIELDS, MARKER_KINDS, Marker
from flinkish_core.watermark import LAST_CARRIER_MS, MIN_WATERMARK
from flinkish_source.offset_planner import Positions, from_json
from flinkish_source.options import SourceOptions
from flinkish_source.partition_reader import SlicePlan, read_slice
from flinkish_source.schema import arrow_schema
from flinkish_source.source_state import SourceStateStore

logger = logging.getLogger(__name__)

#: The journaled offset's key for the planning-time valve.
OFFSET_KEY = "valve"


@dataclass(frozen=True)
class PlanningValve:
    """What an end offset journals for the next planning: the combined watermark state before
    the last batch that read anything, and that batch's slices."""

    before: EpochWatermark
    slices: tuple[tuple[str, int, int, int, str | None, str], ...] = ()
    # the batch reaches the end of the input for now: its last read task carries W after it
    closing: bool = False

    def to_json(self) -> dict[str, Any]:
        out = {
            "watermark": self.before.watermark,
            "status": self.before.status,
            "channels": list(self.before.channels),
            "snapshot": self.before.valve,
            "slices": [list(s) for s in self.slices],
        }
        if self.closing:
            out["closing"] = True
        return out

    @classmethod
    def from_offset(cls, offset: Mapping[str, Any]) -> PlanningValve:
        data = offset.get(OFFSET_KEY)
        if data is None:  # the initial offset: no partition known yet
            return cls(initial())
        watermark = int(data["watermark"])
        before = EpochWatermark(0, watermark, str(data["status"]), watermark,
                                tuple(data["channels"]), data["snapshot"])
        slices = tuple(
            (str(t), int(p), int(start), int(end), start_status, str(end_status))
            for t, p, start, end, start_status, end_status in data["slices"]
        )
        return cls(before, slices, bool(data.get("closing", False)))

    def key(self) -> str:
        """Names the batch in the closing carrier's record (see :func:`closing_carrier`)."""
        return hashlib.sha1(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


def combined_after(options: SourceOptions, offset: Mapping[str, Any],
                   positions: Positions, store: SourceStateStore | None = None
                   ) -> EpochWatermark:
    """The combined watermark after the batch that ``offset`` ends (with ``positions``, the
    offset's partition positions); ``store`` is the driver's view of the recorded markers."""
    combined = _combined_after(options, offset, positions, store, reread=True)
    assert combined is not None
    return combined


def _combined_after(options: SourceOptions, offset: Mapping[str, Any], positions: Positions,
                    store: SourceStateStore | None, *, reread: bool) -> EpochWatermark | None:
    """:func:`combined_after`; without ``reread``, None while a slice's markers are not
    recorded."""
    journaled = PlanningValve.from_offset(offset)
    plans = []
    for topic, partition, start, end, start_status, end_status in journaled.slices:
        pos = positions[(topic, partition)]
        plans.append(SlicePlan(topic, partition, start, end, start_status, end_status,
                               pos.base, pos.stop))
    markers = _markers(options, plans, store, reread=reread)
    return None if markers is None else advance(journaled.before, 0, markers)


def journal(before: EpochWatermark, slices: Iterable[SlicePlan], *,
            closing: bool = False) -> dict[str, Any]:
    """The offset entry for a batch with these slices, planned with ``before`` in force;
    ``closing``: the batch reaches the end of the input for now (see the module docstring)."""
    return PlanningValve(before, tuple(
        (s.topic, s.partition, s.start, s.end, s.start_status, s.end_status) for s in slices
    ), closing).to_json()


def closing_carrier(options: SourceOptions, end: Mapping[str, Any], store: SourceStateStore
                    ) -> Iterator[pa.RecordBatch]:
    """Called by each read task of the closing batch ``end`` ends, after it recorded its
    markers: the carrier of the combined watermark after the batch if every read task has
    recorded its markers by now (recorded as delivered); nothing otherwise."""
    store.new_round()
    combined = _combined_after(options, end, from_json(end), store, reread=False)
    if combined is None or combined.watermark == MIN_WATERMARK:
        return
    store.save_closing(PlanningValve.from_offset(end).key(), combined.watermark)
    yield carrier(options.include_headers, combined.watermark, options.event_time.horizon_ms)


def delivered(offset: Mapping[str, Any], combined: EpochWatermark,
              store: SourceStateStore) -> bool:
    """Whether Spark already has ``combined``, the combined watermark after the batch that
    ``offset`` ends: that batch was closing and its carrier task yielded it."""
    journaled = PlanningValve.from_offset(offset)
    return journaled.closing and store.closing_watermark(journaled.key()) == combined.watermark


def _markers(options: SourceOptions, plans: list[SlicePlan],
             store: SourceStateStore | None = None, *, reread: bool = True
             ) -> list[Marker] | None:
    if store is None:
        assert options.state_location is not None  # parse_options requires it with markers
        store = SourceStateStore(options.state_location)
    markers: list[Marker] = []
    for plan in plans:
        outcomes = store.find_outcomes(plan.topic, plan.partition, plan.end) if (
            plan.end > plan.start) else []
        identity = (plan.start, plan.start_status, plan.end_status)
        outcome = next((o for o in outcomes
                        if (o.start, o.start_status, o.end_status) == identity), None)
        if outcome is not None:
            markers.extend(outcome.markers)
            continue
        if plan.end > plan.start:
            if not reread:
                return None
            logger.warning(
                "no recorded markers for %s/%s offsets %s..%s in %s: its read task did not "
                "finish the slice; re-reading it on the driver", plan.topic, plan.partition,
                plan.start, plan.end - 1, options.state_location,
            )
        for batch in read_slice(options, plan):
            markers.extend(_marker_rows(batch))
        if plan.end > plan.start:
            store.partition_file_written(plan.topic, plan.partition)
    return markers


def _marker_rows(batch: pa.RecordBatch) -> list[Marker]:
    import pyarrow.compute as pc  # here: the driver needs it only when it re-reads a slice

    rows = batch.filter(pc.is_in(batch.column("kind"), pa.array(MARKER_KINDS)))
    if rows.num_rows == 0:
        return []
    columns = [rows.column(name).to_pylist() for name in MARKER_FIELDS]
    return [Marker.from_json(list(values)) for values in zip(*columns, strict=True)]


def horizon_limit(watermark: int, horizon_ms: int) -> int | None:
    """Event times (ms) above this would move Spark's watermark past ``watermark``."""
    if watermark == MIN_WATERMARK:
        return None
    return min(watermark, LAST_CARRIER_MS - horizon_ms) + horizon_ms


def carrier(include_headers: bool, watermark: int, horizon_ms: int) -> pa.RecordBatch:
    """The batch's carrier row: event time W + H (clamped to 9999-12-31, so MAX_WATERMARK
    closes every window), ``watermark`` W; every other column null."""
    schema = arrow_schema(include_headers)
    row: dict[str, list[Any]] = {name: [None] for name in schema.names}
    row["kind"] = [KIND_CARRIER]
    row["watermark"] = [watermark]
    limit = horizon_limit(watermark, horizon_ms)
    assert limit is not None
    row["eventTime"] = [limit * 1000]
    return pa.RecordBatch.from_pydict(row, schema=schema)
