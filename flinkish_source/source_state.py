"""Per-partition watermark-generator state and markers, handed from one micro-batch's read task
to the next batch's planning.

Spark gives a read task no way to report back to the driver, and a partition's watermark needs
the max event time over everything read before. So each task records the generator state at its
slice's end offset in storage both sides reach (a ``checkpointing.location`` on a cluster is a
shared filesystem); the driver puts it into the next batch's offsets, where it is journaled by
Spark and replayed verbatim. With the state goes the slice's :class:`SliceOutcome`: the markers
the task emitted, which the driver feeds into the valve to know the combined watermark when it
plans the next batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checkpointing.storage import CheckpointStorage
from flinkish_core.markers import Marker
from flinkish_source.watermark_strategy import GeneratorState


@dataclass(frozen=True)
class SliceOutcome:
    """Which slice a record describes (a later slice ending at the same offset, e.g. a status
    change, replaces it) and the markers it emitted, in emission order."""

    start: int
    start_status: str | None
    end_status: str
    markers: tuple[Marker, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start, "startStatus": self.start_status, "endStatus": self.end_status,
            "markers": [m.to_json() for m in self.markers],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SliceOutcome:
        return cls(int(data["start"]), data["startStatus"], str(data["endStatus"]),
                   tuple(Marker.from_json(m) for m in data["markers"]))


class SourceStateStore:
    def __init__(self, location: str) -> None:
        self._location = location
        self._storage: CheckpointStorage | None = None

    def __getstate__(self) -> dict[str, object]:
        return {"_location": self._location, "_storage": None}

    @property
    def storage(self) -> CheckpointStorage:
        if self._storage is None:
            self._storage = CheckpointStorage.open(self._location)
        return self._storage

    @staticmethod
    def _dir(topic: str, partition: int) -> str:
        return f"source/{topic}/{partition}"

    def save(self, topic: str, partition: int, state: GeneratorState,
             outcome: SliceOutcome | None = None) -> None:
        record: dict[str, Any] = dict(state.to_json())
        if outcome is not None:
            record["slice"] = outcome.to_json()
        self.storage.write_json(f"{self._dir(topic, partition)}/{state.at:020d}", record)

    def _read(self, topic: str, partition: int, at: int) -> dict[str, Any] | None:
        try:
            data = self.storage.read_json(f"{self._dir(topic, partition)}/{at:020d}")
        except FileNotFoundError:
            return None
        return dict(data)

    def load_outcome(self, topic: str, partition: int, at: int) -> SliceOutcome | None:
        """The outcome of the slice that ended at ``at`` (None if no task recorded one)."""
        data = self._read(topic, partition, at)
        if data is None or "slice" not in data:
            return None
        return SliceOutcome.from_json(data["slice"])

    def load(self, topic: str, partition: int, at: int) -> GeneratorState | None:
        data = self._read(topic, partition, at)
        if data is None:
            return None
        state = GeneratorState.from_json(data)
        if state.at != at:
            raise ValueError(
                f"source state {self._dir(topic, partition)}/{at:020d} in {self._location} "
                f"claims offset {state.at}"
            )
        return state

    def prune(self, topic: str, partition: int, below: int) -> None:
        """Forget states before ``below``: Spark will never plan from those offsets again."""
        directory = self._dir(topic, partition)
        for name in self.storage.list(directory):
            if name.isdigit() and int(name) < below:
                self.storage.delete(f"{directory}/{name}")
