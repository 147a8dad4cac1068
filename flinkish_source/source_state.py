"""Per-partition watermark-generator state, handed from one micro-batch's read task to the
next batch's planning.

Spark gives a read task no way to report back to the driver, and a partition's watermark needs
the max event time over everything read before. So each task records the generator state at its
slice's end offset in storage both sides reach (a ``checkpointing.location`` on a cluster is a
shared filesystem); the driver puts it into the next batch's offsets, where it is journaled by
Spark and replayed verbatim.
"""

from __future__ import annotations

from checkpointing.storage import CheckpointStorage
from flinkish_source.watermark_strategy import GeneratorState


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

    def save(self, topic: str, partition: int, state: GeneratorState) -> None:
        self.storage.write_json(f"{self._dir(topic, partition)}/{state.at:020d}", state.to_json())

    def load(self, topic: str, partition: int, at: int) -> GeneratorState | None:
        try:
            data = self.storage.read_json(f"{self._dir(topic, partition)}/{at:020d}")
        except FileNotFoundError:
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
