"""Per-partition watermark-generator state and markers, handed from one micro-batch's read task
to the next batch's planning, through storage both sides reach (``checkpointing.location``):
Spark gives a read task no way to report back to the driver.

A read task writes one record for all its slices, ``source/~tasks/<name>`` (``~`` cannot appear
in a topic name); the driver indexes the records it has read, and falls back to the
per-partition records ``source/<topic>/<partition>/<offset>`` of a slice it re-read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from checkpointing.storage import CheckpointStorage
from flinkish_core.markers import Marker
from flinkish_source.watermark_strategy import GeneratorState

TASKS_DIR = "source/~tasks"
#: What the last closing batch's carrying read task delivered (see
#: flinkish_source.combined_watermark).
CLOSING_RECORD = "source/~closing"


@dataclass(frozen=True)
class SliceOutcome:
    """Which slice a record describes (a later slice ending at the same offset, e.g. a status
    change, replaces it) and the markers it emitted, in emission order."""

    start: int
    start_status: str | None
    end_status: str
    markers: tuple[Marker, ...]
    # the earliest event time (ms) among the slice's records (None: none had one); with the
    # generator's max timestamp it gives the partition's pace (watermark alignment)
    min_event_time: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "start": self.start, "startStatus": self.start_status, "endStatus": self.end_status,
            "markers": [m.to_json() for m in self.markers],
        }
        if self.min_event_time is not None:
            out["minTs"] = self.min_event_time
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SliceOutcome:
        low = data.get("minTs")
        return cls(int(data["start"]), data["startStatus"], str(data["endStatus"]),
                   tuple(Marker.from_json(m) for m in data["markers"]),
                   None if low is None else int(low))


#: One slice in a task record: topic, partition, generator state at the slice's end, outcome.
TaskSlice = tuple[str, int, GeneratorState, SliceOutcome]


@dataclass
class _Index:
    """The driver's view of the task records: what each holds, by (topic, partition, end)."""

    records: dict[str, list[TaskSlice]] = field(default_factory=dict)
    by_end: dict[tuple[str, int, int], list[TaskSlice]] = field(default_factory=dict)
    fresh: bool = False  # listed since the last new_round()
    reads: int = 0  # records read (for tests and logs)
    listings: int = 0

    def add(self, name: str, slices: list[TaskSlice]) -> None:
        self.records[name] = slices
        for entry in slices:
            self.by_end.setdefault((entry[0], entry[1], entry[2].at), []).append(entry)

    def drop(self, name: str) -> None:
        for entry in self.records.pop(name, []):
            key = (entry[0], entry[1], entry[2].at)
            left = [e for e in self.by_end.get(key, []) if e is not entry]
            if left:
                self.by_end[key] = left
            else:
                self.by_end.pop(key, None)


class SourceStateStore:
    def __init__(self, location: str) -> None:
        self._location = location
        self._storage: CheckpointStorage | None = None
        self._index = _Index()
        self._partition_files: set[tuple[str, int]] | None = None  # None: not pruned yet

    def __getstate__(self) -> dict[str, object]:
        return {"_location": self._location, "_storage": None, "_index": _Index(),
                "_partition_files": None}

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
        """Forget states before ``below``: Spark will never plan from those offsets again.
        Not durably (see :meth:`prune_all`)."""
        directory = self._dir(topic, partition)
        for name in self.storage.list(directory):
            if name.isdigit() and int(name) < below:
                self.storage.delete(f"{directory}/{name}", durable=False)

    # -- task records ----------------------------------------------------------------------

    @staticmethod
    def task_record_name(slices: Sequence[TaskSlice]) -> str:
        """A name that is a function of the slices: a replayed task rewrites its own record."""
        keys = [[t, p, o.start, st.at, o.start_status, o.end_status] for t, p, st, o in slices]
        return hashlib.sha1(json.dumps(keys).encode()).hexdigest()[:24]

    def save_task(self, slices: Sequence[TaskSlice]) -> str:
        """One read task's slices in one record; its name."""
        name = self.task_record_name(slices)
        self.storage.write_json(f"{TASKS_DIR}/{name}", {"slices": [
            {"topic": t, "partition": p, "state": st.to_json(), "slice": o.to_json()}
            for t, p, st, o in slices
        ]})
        return name

    def _load_task(self, name: str) -> list[TaskSlice] | None:
        try:
            data = self.storage.read_json(f"{TASKS_DIR}/{name}")
        except FileNotFoundError:
            return None  # pruned meanwhile
        self._index.reads += 1
        return [(str(e["topic"]), int(e["partition"]), GeneratorState.from_json(e["state"]),
                 SliceOutcome.from_json(e["slice"])) for e in data["slices"]]

    def new_round(self) -> None:
        """A new planning: the next lookup that misses lists the task records again."""
        self._index.fresh = False

    def refresh(self) -> None:
        """List the task records; read the ones not read before, forget the vanished ones."""
        listed = set(self.storage.list(TASKS_DIR))
        self._index.listings += 1
        for name in [n for n in self._index.records if n not in listed]:
            self._index.drop(name)
        for name in sorted(listed - set(self._index.records)):
            slices = self._load_task(name)
            if slices is not None:
                self._index.add(name, slices)
        self._index.fresh = True

    def _entries(self, topic: str, partition: int, at: int) -> list[TaskSlice]:
        key = (topic, partition, at)
        if key not in self._index.by_end and not self._index.fresh:
            self.refresh()
        return self._index.by_end.get(key, [])

    def find_state(self, topic: str, partition: int, at: int) -> GeneratorState | None:
        """The generator state at ``at``: from a task record, else a per-partition record."""
        entries = self._entries(topic, partition, at)
        return entries[0][2] if entries else self.load(topic, partition, at)

    def find_outcomes(self, topic: str, partition: int, at: int) -> list[SliceOutcome]:
        """The recorded outcomes of slices that ended at ``at``: the task records', then the
        per-partition record's (a slice the driver re-read)."""
        found = [e[3] for e in self._entries(topic, partition, at)]
        reread = self.load_outcome(topic, partition, at)
        return found + ([reread] if reread is not None else [])

    def save_closing(self, batch: str, watermark: int) -> None:
        """A read task of the closing ``batch`` yielded the carrier of ``watermark``. One
        record: only the latest closing batch is ever asked about."""
        self.storage.write_json(CLOSING_RECORD, {"batch": batch, "watermark": watermark})

    def forget_closing(self) -> None:
        """The driver runs a closing batch (again): what an earlier run of it delivered is not
        what this run will."""
        self.storage.delete(CLOSING_RECORD)

    def closing_watermark(self, batch: str) -> int | None:
        """What a read task of the closing ``batch`` delivered (None: nothing, or not known)."""
        try:
            data = self.storage.read_json(CLOSING_RECORD)
        except FileNotFoundError:
            return None
        if data.get("batch") != batch or data.get("watermark") is None:
            return None
        return int(data["watermark"])

    def partition_file_written(self, topic: str, partition: int) -> None:
        """The driver wrote a per-partition record (a re-read): prune that partition too."""
        if self._partition_files is not None:
            self._partition_files.add((topic, partition))

    def prune_all(self, below: Mapping[tuple[str, int], int]) -> int:
        """Forget what Spark will never plan from again, given each partition's ``base.at``;
        returns how many task records were deleted. Not made durable: this runs in every batch's
        ``walCommit``, and a record a crash brings back is pruned at the next commit."""
        self.refresh()
        deleted = 0
        for name, slices in list(self._index.records.items()):
            if all(st.at < below.get((t, p), st.at + 1) for t, p, st, _ in slices):
                self.storage.delete(f"{TASKS_DIR}/{name}", durable=False)
                self._index.drop(name)
                deleted += 1
        todo = set(below) if self._partition_files is None else self._partition_files
        for tp in sorted(todo):
            if tp in below:
                self.prune(tp[0], tp[1], below[tp])
        self._partition_files = set()
        return deleted
