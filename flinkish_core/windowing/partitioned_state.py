"""Per-window state of triggers (Flink's partitioned state: ``ValueState``/``ReducingState``
scoped to key + window), stored as plain values so a snapshot is data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from flinkish_core.windowing.window import Window

__all__ = [
    "PartitionedState", "PartitionedStateStore", "ReducingStateDescriptor", "StateDescriptor",
    "ValueStateDescriptor",
]

T = TypeVar("T")


@dataclass(frozen=True)
class StateDescriptor:
    """Names one piece of per-window state."""

    name: str


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    """A single value; ``update`` replaces it. Not mergeable."""


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """A value that ``add`` folds with ``reduce``; mergeable (merging windows fold theirs)."""

    reduce: Callable[[T, T], T]


StateKey = tuple[Any, Window, str]
"""(key, window, state name)."""


class PartitionedStateStore:
    """All trigger state of an operator: one value per key, window and state name."""

    def __init__(self) -> None:
        self._values: dict[StateKey, Any] = {}

    def get(self, key: Any, window: Window, name: str) -> Any:
        return self._values.get((key, window, name))

    def put(self, key: Any, window: Window, name: str, value: Any) -> None:
        self._values[(key, window, name)] = value

    def delete(self, key: Any, window: Window, name: str) -> None:
        self._values.pop((key, window, name), None)

    def merge(
        self, key: Any, target: Window, sources: Iterable[Window],
        descriptor: ReducingStateDescriptor[Any],
    ) -> None:
        """Folds the sources' values into the target's and drops the sources (Flink's
        ``mergeNamespaces``)."""
        merged = None
        for source in sources:
            value = self._values.pop((key, source, descriptor.name), None)
            if value is not None:
                merged = value if merged is None else descriptor.reduce(merged, value)
        if merged is None:
            return
        existing = self._values.get((key, target, descriptor.name))
        self._values[(key, target, descriptor.name)] = (
            merged if existing is None else descriptor.reduce(existing, merged))

    def count(self, window: Window | None = None) -> int:
        return sum(1 for (_, w, _) in self._values if window is None or w == window)

    def items(self) -> Iterator[tuple[Any, Window, str, Any]]:
        for (key, window, name), value in self._values.items():
            yield key, window, name, value


class PartitionedState:
    """One piece of trigger state bound to the current key and window."""

    def __init__(
        self, store: PartitionedStateStore, key: Any, window: Window, descriptor: StateDescriptor,
    ) -> None:
        self._store = store
        self._key = key
        self._window = window
        self._descriptor = descriptor

    def get(self) -> Any:
        return self._store.get(self._key, self._window, self._descriptor.name)

    def update(self, value: Any) -> None:
        self._store.put(self._key, self._window, self._descriptor.name, value)

    def add(self, value: Any) -> None:
        """Folds ``value`` into the state with the descriptor's reduce function."""
        if not isinstance(self._descriptor, ReducingStateDescriptor):
            raise TypeError(f"state {self._descriptor.name!r} is not a reducing state")
        current = self.get()
        self.update(value if current is None else self._descriptor.reduce(current, value))

    def clear(self) -> None:
        self._store.delete(self._key, self._window, self._descriptor.name)
