"""What a window computes when it fires: an incremental :class:`AggregateFunction` (the window
keeps one accumulator) or a full-window :class:`ProcessWindowFunction` (the window keeps every
element), and the built-ins, whose accumulators are plain values so window state is data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from flinkish_core.windowing.window import Window

__all__ = [
    "AggregateFunction", "Avg", "Count", "Max", "Min", "ProcessWindowFunction", "ReduceFunction",
    "Sum", "WindowContext",
]

IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")


class AggregateFunction(Generic[IN, ACC, OUT]):
    """Flink's ``AggregateFunction``: folds elements into an accumulator as they arrive."""

    def create_accumulator(self) -> ACC:
        raise NotImplementedError

    def add(self, value: IN, accumulator: ACC) -> ACC:
        raise NotImplementedError

    def merge(self, a: ACC, b: ACC) -> ACC:
        """Combines two accumulators (when session windows merge)."""
        raise NotImplementedError

    def get_result(self, accumulator: ACC) -> OUT:
        raise NotImplementedError


@dataclass(frozen=True)
class WindowContext:
    """What a :class:`ProcessWindowFunction` sees besides the elements."""

    key: Any
    window: Window
    current_watermark: int
    current_processing_time: int


class ProcessWindowFunction(Generic[IN, OUT]):
    """Flink's ``ProcessWindowFunction``: all elements of the window at once; returns the
    results of this firing (zero or more)."""

    def process(self, key: Any, context: WindowContext, elements: list[IN]) -> Iterable[OUT]:
        raise NotImplementedError

    def clear(self, key: Any, context: WindowContext) -> None:
        """Called when the window's state is cleared at its cleanup time, for whatever the
        function keeps of its own about the window."""


def _identity(value: Any) -> Any:
    return value


class ReduceFunction(AggregateFunction[Any, list[Any], Any]):
    """Flink's ``ReduceFunction`` as an aggregate: ``reduce(a, b)`` of two elements. The
    accumulator is ``[]`` or ``[reduced]``."""

    def __init__(self, reduce: Callable[[Any, Any], Any]) -> None:
        self.reduce = reduce

    def create_accumulator(self) -> list[Any]:
        return []

    def add(self, value: Any, accumulator: list[Any]) -> list[Any]:
        return [self.reduce(accumulator[0], value)] if accumulator else [value]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        if not a or not b:
            return a or b
        return [self.reduce(a[0], b[0])]

    def get_result(self, accumulator: list[Any]) -> Any:
        return accumulator[0] if accumulator else None


class Count(AggregateFunction[Any, int, int]):
    """The number of elements."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def get_result(self, accumulator: int) -> int:
        return accumulator


class _OfValue(AggregateFunction[Any, Any, Any]):
    """Aggregates ``value(element)`` (the element itself by default)."""

    def __init__(self, value: Callable[[Any], Any] = _identity) -> None:
        self.value = value

    def get_result(self, accumulator: Any) -> Any:
        return accumulator


class Sum(_OfValue):
    """The sum of ``value(element)``."""

    def create_accumulator(self) -> Any:
        return 0

    def add(self, value: Any, accumulator: Any) -> Any:
        return accumulator + self.value(value)

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class _Extreme(_OfValue):
    _pick: Callable[[Any, Any], Any]  # min or max

    def create_accumulator(self) -> Any:
        return None

    def add(self, value: Any, accumulator: Any) -> Any:
        v = self.value(value)
        return v if accumulator is None else self._pick(accumulator, v)

    def merge(self, a: Any, b: Any) -> Any:
        if a is None or b is None:
            return b if a is None else a
        return self._pick(a, b)


class Min(_Extreme):
    """The smallest ``value(element)``."""

    _pick = staticmethod(min)


class Max(_Extreme):
    """The largest ``value(element)``."""

    _pick = staticmethod(max)


class Avg(_OfValue):
    """The mean of ``value(element)``; the accumulator is ``[sum, count]``."""

    def create_accumulator(self) -> list[Any]:
        return [0, 0]

    def add(self, value: Any, accumulator: list[Any]) -> list[Any]:
        return [accumulator[0] + self.value(value), accumulator[1] + 1]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [a[0] + b[0], a[1] + b[1]]

    def get_result(self, accumulator: list[Any]) -> float:
        return accumulator[0] / accumulator[1]
