"""Delta's per-file statistics (an add action's ``stats`` JSON), gathered as a task writes.

A wrong bound makes a reader skip a file that holds matching rows, so every bound is safe
rather than tight, in delta-rs' form (docs/delta.md). A bounded column gets both bounds or,
all null, neither: delta-rs skips a file whose statistics lack one. Where no bound is safe
(NaN, a decimal a JSON number cannot hold), the file gets ``numRecords`` alone.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Characters kept of a string's bounds (Delta's ``dataSkippingStringPrefixLength``).
STRING_PREFIX = 32
#: Digits of a decimal a JSON number (a double, to most readers) holds exactly.
_EXACT_DIGITS = 15
_HIGHEST = "\U0010ffff"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def _without_statistics(dtype: pa.DataType) -> bool:
    return (pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype)
            or pa.types.is_list(dtype) or pa.types.is_large_list(dtype)
            or pa.types.is_fixed_size_list(dtype) or pa.types.is_map(dtype))


def _bounded(dtype: pa.DataType) -> bool:
    """Whether a column of ``dtype`` gets bounds (else the file gets numRecords alone)."""
    return (pa.types.is_signed_integer(dtype) or pa.types.is_floating(dtype)
            or pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
            or pa.types.is_boolean(dtype) or pa.types.is_date32(dtype)
            or pa.types.is_timestamp(dtype)
            or (pa.types.is_decimal(dtype) and dtype.precision <= _EXACT_DIGITS))


class _Column:
    """The running bounds and null count of one leaf column."""

    def __init__(self, dtype: pa.DataType) -> None:
        self.dtype = dtype
        self.nulls = 0
        self.low: Any = None
        self.high: Any = None

    def add(self, values: pa.Array) -> bool:
        """Take ``values`` in; False when they leave the column without a safe bound."""
        self.nulls += values.null_count
        if values.null_count == len(values):
            return True
        if pa.types.is_floating(self.dtype) and not pc.all(pc.is_finite(values)).as_py():
            return False
        if pa.types.is_timestamp(self.dtype) or pa.types.is_date32(self.dtype):
            values = values.cast(pa.int64() if pa.types.is_timestamp(self.dtype) else pa.int32())
        bounds = pc.min_max(values)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)
        return True

    def bounds(self) -> tuple[Any, Any]:
        """(min, max) in Delta's JSON form; (None, None) when every value was null."""
        if self.low is None:
            return None, None
        if pa.types.is_timestamp(self.dtype):
            scale = _NS_PER_UNIT[self.dtype.unit]
            low_ms = self.low * scale // 1_000_000
            high_ms = -(-self.high * scale // 1_000_000)
            zone = self.dtype.tz is not None
            return _timestamp(low_ms, zone), _timestamp(high_ms, zone)
        if pa.types.is_date32(self.dtype):
            return _date(self.low), _date(self.high)
        if isinstance(self.low, Decimal):
            return float(self.low), float(self.high)
        if isinstance(self.low, str):
            return self.low[:STRING_PREFIX], _string_upper_bound(self.high)
        return self.low, self.high


def _string_upper_bound(value: str) -> str:
    """``value`` cut to :data:`STRING_PREFIX` and the highest code point, which sorts after
    it (unless that is its next character: then whole)."""
    if len(value) <= STRING_PREFIX or value[STRING_PREFIX] == _HIGHEST:
        return value
    return value[:STRING_PREFIX] + _HIGHEST


def _timestamp(ms: int, zone: bool) -> str:
    moment = _EPOCH + timedelta(milliseconds=ms)
    if zone:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def _date(days: int) -> str:
    return (date(1970, 1, 1) + timedelta(days=days)).isoformat()


class FileStats:
    """Statistics of one data file, fed every batch written to it."""

    def __init__(self, schema: pa.Schema) -> None:
        self._rows = 0
        self._columns = {f.name: tree for f in schema if (tree := _tree(f.type)) is not None}
        self._safe = all(tree is not False for tree in _leaves(self._columns))

    def add(self, batch: pa.RecordBatch) -> None:
        self._rows += batch.num_rows
        if self._safe:
            for name, column in self._columns.items():
                self._safe = _feed(column, batch.column(name)) and self._safe

    def to_json(self) -> str:
        if not self._safe:
            return json.dumps({"numRecords": self._rows}, separators=(",", ":"))
        low: dict[str, Any] = {}
        high: dict[str, Any] = {}
        nulls: dict[str, Any] = {}
        for name, column in self._columns.items():
            _collect(name, column, low, high, nulls)
        return json.dumps({"numRecords": self._rows, "minValues": low, "maxValues": high,
                           "nullCount": nulls}, separators=(",", ":"))


def _tree(dtype: pa.DataType) -> Any:
    """A :class:`_Column` for a bounded leaf, a dict of them for a struct, None for a column
    without statistics, False for one without a safe bound."""
    if pa.types.is_struct(dtype):
        children = {dtype.field(i).name: _tree(dtype.field(i).type)
                    for i in range(dtype.num_fields)}
        return {k: v for k, v in children.items() if v is not None} or None
    if _without_statistics(dtype):
        return None
    return _Column(dtype) if _bounded(dtype) else False


def _leaves(node: Any) -> list[Any]:
    return ([leaf for child in node.values() for leaf in _leaves(child)]
            if isinstance(node, dict) else [node])


def _feed(node: Any, values: pa.Array | pa.ChunkedArray) -> bool:
    """Feed ``values`` to the column(s) of ``node``; False if a bound became unsafe."""
    safe = True
    for chunk in values.chunks if isinstance(values, pa.ChunkedArray) else [values]:
        if isinstance(node, _Column):
            safe = node.add(chunk) and safe
            continue
        # flatten() gives each child the struct's own nulls too
        fields = dict(zip((chunk.type.field(i).name for i in range(chunk.type.num_fields)),
                          chunk.flatten(), strict=True))
        for name, child in node.items():
            safe = _feed(child, fields[name]) and safe
    return safe


def _collect(name: str, node: Any, low: dict[str, Any], high: dict[str, Any],
             nulls: dict[str, Any]) -> None:
    if isinstance(node, _Column):
        nulls[name] = node.nulls
        lo, hi = node.bounds()
        if lo is not None:
            low[name], high[name] = lo, hi
        return
    subs: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] = ({}, {}, {})
    for child_name, child in node.items():
        _collect(child_name, child, *subs)
    for target, sub in zip((low, high, nulls), subs, strict=True):
        if sub:
            target[name] = sub
