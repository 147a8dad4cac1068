"""Delta's per-file statistics: the ``stats`` JSON of an add action (``numRecords`` and, per
column, ``minValues``, ``maxValues`` and ``nullCount``), gathered from the Arrow batches as a
write task writes them, so readers can skip files by column ranges.

A wrong bound makes a reader skip a file that holds matching rows, so every bound here is
safe rather than tight: timestamps are kept to the millisecond (Delta's format) with the
minimum rounded down and the maximum up; a string's minimum is cut to its first
:data:`STRING_PREFIX` characters (a prefix sorts first) and a longer maximum is left out, as
are the bounds of a float column holding NaN or an infinity (JSON has no such number). Types
without a total order readers agree on (binary, boolean, decimal, timestamps without a time
zone) get a null count only; lists and maps get nothing, as in Delta's own writer.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Characters kept of a string's bounds (Delta's ``dataSkippingStringPrefixLength``).
STRING_PREFIX = 32

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def _ranged(dtype: pa.DataType) -> bool:
    """Whether a column of ``dtype`` gets min/max bounds."""
    return (
        pa.types.is_signed_integer(dtype)
        or pa.types.is_floating(dtype)
        or pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_date32(dtype)
        or (pa.types.is_timestamp(dtype) and dtype.tz is not None)
    )


class _Column:
    """The running bounds and null count of one leaf column."""

    def __init__(self, dtype: pa.DataType) -> None:
        self.dtype = dtype
        self.nulls = 0
        self.ranged = _ranged(dtype)
        self.low: Any = None
        self.high: Any = None

    def add(self, values: pa.Array) -> None:
        self.nulls += values.null_count
        if not self.ranged or values.null_count == len(values):
            return
        if pa.types.is_floating(self.dtype) and not pc.all(pc.is_finite(values)).as_py():
            self.ranged = False  # NaN or an infinity: no bounds for this file
            return
        if pa.types.is_timestamp(self.dtype) or pa.types.is_date32(self.dtype):
            values = values.cast(pa.int64() if pa.types.is_timestamp(self.dtype) else pa.int32())
        bounds = pc.min_max(values)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def bounds(self) -> tuple[Any, Any]:
        """(min, max) in Delta's JSON form; either None when left out."""
        if not self.ranged or self.low is None:
            return None, None
        if pa.types.is_timestamp(self.dtype):
            scale = _NS_PER_UNIT[self.dtype.unit]
            low_ms = self.low * scale // 1_000_000
            high_ms = -(-self.high * scale // 1_000_000)
            return _timestamp(low_ms), _timestamp(high_ms)
        if pa.types.is_date32(self.dtype):
            return _date(self.low), _date(self.high)
        if isinstance(self.low, str):
            return self.low[:STRING_PREFIX], (
                self.high if len(self.high) <= STRING_PREFIX else None)
        return self.low, self.high


def _timestamp(ms: int) -> str:
    moment = _EPOCH + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _date(days: int) -> str:
    return (date(1970, 1, 1) + timedelta(days=days)).isoformat()


class FileStats:
    """Statistics of one data file, fed every batch written to it."""

    def __init__(self, schema: pa.Schema) -> None:
        self._rows = 0
        self._columns = {f.name: _tree(f.type) for f in schema if _tree(f.type) is not None}

    def add(self, batch: pa.RecordBatch) -> None:
        self._rows += batch.num_rows
        for name, column in self._columns.items():
            _feed(column, batch.column(name))

    def to_json(self) -> str:
        low: dict[str, Any] = {}
        high: dict[str, Any] = {}
        nulls: dict[str, Any] = {}
        for name, column in self._columns.items():
            _collect(name, column, low, high, nulls)
        return json.dumps({"numRecords": self._rows, "minValues": low, "maxValues": high,
                           "nullCount": nulls}, separators=(",", ":"))


def _tree(dtype: pa.DataType) -> Any:
    """A :class:`_Column` for a leaf, a dict of them for a struct, None for lists and maps."""
    if pa.types.is_struct(dtype):
        children = {dtype.field(i).name: _tree(dtype.field(i).type)
                    for i in range(dtype.num_fields)}
        return {k: v for k, v in children.items() if v is not None} or None
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_map(dtype) or (
            pa.types.is_fixed_size_list(dtype)):
        return None
    return _Column(dtype)


def _feed(node: Any, values: pa.Array | pa.ChunkedArray) -> None:
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    for chunk in chunks:
        if isinstance(node, _Column):
            node.add(chunk)
            continue
        # flatten() gives each child the struct's own nulls too
        fields = dict(zip((chunk.type.field(i).name for i in range(chunk.type.num_fields)),
                          chunk.flatten(), strict=True))
        for name, child in node.items():
            _feed(child, fields[name])


def _collect(name: str, node: Any, low: dict[str, Any], high: dict[str, Any],
             nulls: dict[str, Any]) -> None:
    if isinstance(node, _Column):
        nulls[name] = node.nulls
        lo, hi = node.bounds()
        if lo is not None:
            low[name] = lo
        if hi is not None:
            high[name] = hi
        return
    sub_low: dict[str, Any] = {}
    sub_high: dict[str, Any] = {}
    sub_nulls: dict[str, Any] = {}
    for child_name, child in node.items():
        _collect(child_name, child, sub_low, sub_high, sub_nulls)
    for target, sub in ((low, sub_low), (high, sub_high), (nulls, sub_nulls)):
        if sub:
            target[name] = sub
