"""Where a record's event time comes from: the Kafka timestamp, a JSON field or a header. A value
that is not a time is never guessed at: ``eventTime.onError`` fails or skips it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from flinkish_source.options import EventTime, OnError

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# event times must fit Spark's timestamp (microseconds in a signed 64-bit integer)
_MAX_MS = (2**63 - 1) // 1000
_MIN_MS = -_MAX_MS


def _iso_ms(text: str) -> int | None:
    """An ISO-8601 time with an explicit zone, in exact epoch milliseconds."""
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None  # a time without a zone would be a guess
    return (parsed - _EPOCH) // timedelta(milliseconds=1)


class EventTimeError(ValueError):
    """A record's event time could not be read (``eventTime.onError=fail``)."""


def _field(document: Any, path: Sequence[str]) -> Any:
    for part in path:
        if not isinstance(document, dict) or part not in document:
            return None
        document = document[part]
    return document


class EventTimeExtractor:
    """Turns records into epoch-millisecond event times, following the configured policy."""

    def __init__(self, options: EventTime) -> None:
        self._path = options.field.split(".") if options.field else None
        self._header = options.header
        self._unit = options.unit_ms
        self._fail = options.on_error is OnError.FAIL

    @property
    def from_kafka_timestamp(self) -> bool:
        return self._path is None and self._header is None

    def _where(self) -> str:
        if self._path is not None:
            return f"JSON field {'.'.join(self._path)!r} of the value"
        if self._header is not None:
            return f"header {self._header!r}"
        return "Kafka record timestamp"

    def _parse(self, raw: Any) -> int | None:
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if isinstance(raw, bool) or raw is None:
            return None
        if isinstance(raw, str):
            text = raw.strip()
            try:
                raw = Decimal(text)
            except InvalidOperation:
                return _iso_ms(text)
        if isinstance(raw, (int, float, Decimal)):
            try:
                # Decimal arithmetic: 1.001 s is 1001 ms, not float's 1000.9999
                millis = int((Decimal(raw) * Decimal(str(self._unit))).to_integral_value(
                    ROUND_HALF_EVEN))
            except (InvalidOperation, ValueError, OverflowError):
                return None  # NaN, infinity
            return millis if _MIN_MS <= millis <= _MAX_MS else None
        return None

    def _raw(self, value: bytes | None, headers: Any) -> Any:
        if self._path is not None:
            if value is None:
                return None
            try:
                document = json.loads(value)
            except ValueError:
                return None
            return _field(document, self._path)
        for name, header_value in headers or ():
            if name == self._header:
                return header_value
        return None

    def failed(self, topic: str, partition: int, offset: int, raw: Any) -> None:
        """Apply the policy to one unreadable event time: raise, or return (skip)."""
        if self._fail:
            shown = raw if not isinstance(raw, bytes) else raw[:80]
            raise EventTimeError(
                f"{topic}/{partition} offset {offset}: cannot read an event time from the "
                f"{self._where()} (found {shown!r}); fix the producer, point eventTime.field / "
                "eventTime.header elsewhere, or set eventTime.onError=skip to emit such records "
                "without an event time and count them"
            )

    def extract(self, value: bytes | None, headers: Any) -> tuple[int | None, Any]:
        """(event time in ms or None, the raw value it was read from)."""
        raw = self._raw(value, headers)
        return self._parse(raw), raw
