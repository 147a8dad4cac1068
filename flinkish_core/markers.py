"""The marker rows the flinkish source interleaves with its records, and their emission order,
restored after Spark shuffled them (a marker's ``offset`` is the partition position it applies
at).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KIND_RECORD = "record"
KIND_WATERMARK = "watermark"
KIND_STATUS = "status"
#: A row per micro-batch carrying the combined watermark into Spark's (``with_watermark``).
KIND_CARRIER = "carrier"

#: The kinds the valve reads.
MARKER_KINDS = (KIND_WATERMARK, KIND_STATUS)

#: Columns that only describe markers; a sink does not write them as data.
MARKER_COLUMNS = ("kind", "watermark", "status")

#: The columns of a marker row that the valve reads, in :meth:`Marker.to_json` order.
MARKER_FIELDS = ("topic", "partition", "offset", "kind", "watermark", "status")

_RANK = {(KIND_STATUS, "ACTIVE"): 0, (KIND_WATERMARK, None): 1, (KIND_STATUS, "IDLE"): 2}


@dataclass(frozen=True)
class Marker:
    """A watermark or status marker row of the flinkish source."""

    topic: str
    partition: int
    offset: int
    kind: str
    watermark: int | None = None
    status: str | None = None

    def sort_key(self) -> tuple[Any, ...]:
        """Emission order within an epoch: partition, position, then ACTIVE before watermarks
        (ascending: a partition's watermarks never go back) before IDLE."""
        return (
            self.topic, self.partition, self.offset,
            _RANK[(self.kind, self.status if self.kind == KIND_STATUS else None)],
            self.watermark if self.watermark is not None else 0,
        )

    def to_json(self) -> list[Any]:
        return [self.topic, self.partition, self.offset, self.kind, self.watermark, self.status]

    @classmethod
    def from_json(cls, data: list[Any]) -> Marker:
        topic, partition, offset, kind, watermark, status = data
        return cls(str(topic), int(partition), int(offset), str(kind),
                   None if watermark is None else int(watermark), status)
