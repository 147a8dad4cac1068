"""Flink's ``StatusWatermarkValve`` in pure Python.

It combines the watermarks and statuses of many channels (Kafka partitions) into one, as Flink
1.11's valve does, with the two corrections of Flink's own fix FLINK-40475 (apache/flink PR
#29024): (1) when the last active channel goes idle, the maximum across all channels is flushed
whatever that channel's watermark was; (2) a channel turning active recomputes the aligned
minimum at once. The minimum lives in a heap with lazy deletion, O(log n) per input instead of
Flink's scan. docs/semantics.md has the rules.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Protocol

from flinkish_core.watermark import MAX_WATERMARK, MIN_WATERMARK, WatermarkStatus

__all__ = [
    "MAX_WATERMARK", "MIN_WATERMARK", "ChannelState", "StatusWatermarkValve", "ValveOutput",
    "WatermarkStatus",
]

#: Version of the :meth:`StatusWatermarkValve.snapshot` layout.
SNAPSHOT_FORMAT = 1

_SNAPSHOT_KEYS = frozenset({"format", "last_output_watermark", "last_output_status", "channels"})


class ValveOutput(Protocol):
    """Receives what the valve forwards downstream."""

    def emit_watermark(self, watermark: int) -> None: ...

    def emit_watermark_status(self, status: WatermarkStatus) -> None: ...


@dataclass(frozen=True)
class ChannelState:
    """A copy of one channel's state. ``aligned`` is false while the channel is idle, and
    after it resumed (or was added) below the valve's last output watermark, until it catches
    up."""

    watermark: int
    status: WatermarkStatus
    aligned: bool


class StatusWatermarkValve:
    """Combines per-channel watermarks and statuses: the output is the minimum over the
    *aligned* channels and never goes back; when every channel is idle it is the maximum over
    all, then status IDLE, and watermarks are ignored until a channel turns active."""

    def __init__(self, num_channels: int, output: ValveOutput) -> None:
        if num_channels < 1:
            raise ValueError(f"a valve needs at least one channel, got num_channels={num_channels}")
        self._output = output
        self._watermarks = [MIN_WATERMARK] * num_channels
        self._active = [True] * num_channels
        self._aligned = [True] * num_channels
        # a heap entry (watermark, channel, version) is live while the version is the channel's
        self._versions = [0] * num_channels
        self._heap: list[tuple[int, int, int]] = [
            (MIN_WATERMARK, c, 0) for c in range(num_channels)
        ]
        self._num_active = num_channels
        self._num_aligned = num_channels
        self._last_output_watermark = MIN_WATERMARK
        self._last_output_status = WatermarkStatus.ACTIVE

    def input_watermark(self, watermark: int, channel: int) -> None:
        """Feed a watermark of ``channel``; ignored while the channel or the valve is idle, or
        when it is not above the channel's previous one."""
        self._check_channel(channel)
        if not MIN_WATERMARK <= watermark <= MAX_WATERMARK:
            raise ValueError(f"watermark {watermark} is outside the 64-bit range of Flink's long")
        if self._last_output_status is WatermarkStatus.IDLE or not self._active[channel]:
            return
        if watermark <= self._watermarks[channel]:
            return
        self._watermarks[channel] = watermark
        if self._aligned[channel]:
            self._push(channel)
        elif watermark >= self._last_output_watermark:
            self._align(channel)
        self._output_new_aligned_minimum()

    def input_watermark_status(self, status: WatermarkStatus, channel: int) -> None:
        """Feed a status of ``channel``; only a change counts."""
        self._check_channel(channel)
        if status is WatermarkStatus.IDLE and self._active[channel]:
            self._active[channel] = False
            self._num_active -= 1
            if self._aligned[channel]:
                self._aligned[channel] = False
                self._num_aligned -= 1
                self._versions[channel] += 1  # its heap entries go stale
            if self._num_active == 0:
                maximum = max(self._watermarks)  # correction 1
                if maximum > self._last_output_watermark:
                    self._last_output_watermark = maximum
                    self._output.emit_watermark(maximum)
                self._last_output_status = WatermarkStatus.IDLE
                self._output.emit_watermark_status(WatermarkStatus.IDLE)
            elif self._watermarks[channel] == self._last_output_watermark:
                self._output_new_aligned_minimum()
        elif status is WatermarkStatus.ACTIVE and not self._active[channel]:
            self._active[channel] = True
            self._num_active += 1
            if self._watermarks[channel] >= self._last_output_watermark:
                self._align(channel)
            if self._last_output_status is WatermarkStatus.IDLE:
                self._last_output_status = WatermarkStatus.ACTIVE
                self._output.emit_watermark_status(WatermarkStatus.ACTIVE)
            self._output_new_aligned_minimum()  # correction 2

    def add_channel(self) -> int:
        """Grow the valve by one channel (a new Kafka partition) and return its index. It joins
        as a channel idle at :data:`MIN_WATERMARK` resuming: aligned while nothing was emitted,
        else unaligned until it catches up (the output never goes back)."""
        channel = len(self._watermarks)
        self._watermarks.append(MIN_WATERMARK)
        self._active.append(False)
        self._aligned.append(False)
        self._versions.append(0)
        self.input_watermark_status(WatermarkStatus.ACTIVE, channel)
        return channel

    @property
    def num_channels(self) -> int:
        return len(self._watermarks)

    @property
    def last_output_watermark(self) -> int:
        return self._last_output_watermark

    @property
    def last_output_status(self) -> WatermarkStatus:
        return self._last_output_status

    def channel(self, index: int) -> ChannelState:
        self._check_channel(index)
        status = WatermarkStatus.ACTIVE if self._active[index] else WatermarkStatus.IDLE
        return ChannelState(self._watermarks[index], status, self._aligned[index])

    def snapshot(self) -> dict[str, Any]:
        """The valve's state as JSON-serialisable data (the heap is rebuilt on restore)."""
        return {
            "format": SNAPSHOT_FORMAT,
            "last_output_watermark": self._last_output_watermark,
            "last_output_status": self._last_output_status.value,
            "channels": [
                [wm, "ACTIVE" if active else "IDLE", aligned]
                for wm, active, aligned in zip(
                    self._watermarks, self._active, self._aligned, strict=True
                )
            ],
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any], output: ValveOutput) -> StatusWatermarkValve:
        """Rebuild a valve from :meth:`snapshot`, emitting nothing. Raises ValueError naming
        the problem if the snapshot is malformed or a state the valve cannot reach."""
        last_wm, last_status, channels = _parse_snapshot(snapshot)
        valve = cls(len(channels), output)
        valve._watermarks = [wm for wm, _, _ in channels]
        valve._active = [active for _, active, _ in channels]
        valve._aligned = [aligned for _, _, aligned in channels]
        valve._heap = [(wm, c, 0) for c, (wm, _, aligned) in enumerate(channels) if aligned]
        heapq.heapify(valve._heap)
        valve._num_active = sum(valve._active)
        valve._num_aligned = len(valve._heap)
        valve._last_output_watermark = last_wm
        valve._last_output_status = last_status
        return valve

    def _check_channel(self, channel: int) -> None:
        if not 0 <= channel < len(self._watermarks):
            raise IndexError(
                f"channel index {channel} out of range: the valve has "
                f"{len(self._watermarks)} channels (0..{len(self._watermarks) - 1})"
            )

    def _push(self, channel: int) -> None:
        version = self._versions[channel] + 1
        self._versions[channel] = version
        heapq.heappush(self._heap, (self._watermarks[channel], channel, version))
        # stale entries dropped in bulk once they outnumber the live ones: memory O(channels)
        if len(self._heap) > 2 * self._num_aligned + 64:
            versions = self._versions
            self._heap = [e for e in self._heap if versions[e[1]] == e[2]]
            heapq.heapify(self._heap)

    def _align(self, channel: int) -> None:
        self._aligned[channel] = True
        self._num_aligned += 1
        self._push(channel)

    def _output_new_aligned_minimum(self) -> None:
        heap, versions = self._heap, self._versions
        while heap:
            watermark, channel, version = heap[0]
            if versions[channel] == version:
                if watermark > self._last_output_watermark:
                    self._last_output_watermark = watermark
                    self._output.emit_watermark(watermark)
                return
            heapq.heappop(heap)


def _parse_snapshot(snapshot: Any) -> tuple[int, WatermarkStatus, list[tuple[int, bool, bool]]]:
    """(last watermark, last status, [(wm, active, aligned)]) of a valid snapshot."""
    if not isinstance(snapshot, dict):
        raise ValueError(f"valve snapshot must be a dict, got {type(snapshot).__name__}")
    keys = set(snapshot)
    if keys != _SNAPSHOT_KEYS:
        missing, unknown = sorted(_SNAPSHOT_KEYS - keys), sorted(keys - _SNAPSHOT_KEYS, key=str)
        raise ValueError(f"valve snapshot keys wrong: missing {missing}, unknown {unknown}")
    if type(snapshot["format"]) is not int or snapshot["format"] != SNAPSHOT_FORMAT:
        raise ValueError(
            f"unsupported valve snapshot format {snapshot['format']!r} "
            f"(this version reads {SNAPSHOT_FORMAT})"
        )
    last_wm = _parse_watermark(snapshot["last_output_watermark"], "last_output_watermark")
    last_status = _parse_status(snapshot["last_output_status"], "last_output_status")
    raw_channels = snapshot["channels"]
    if not isinstance(raw_channels, list) or not raw_channels:
        raise ValueError("valve snapshot 'channels' must be a non-empty list")

    channels: list[tuple[int, bool, bool]] = []
    for c, raw in enumerate(raw_channels):
        where = f"valve snapshot channels[{c}]"
        if not isinstance(raw, list | tuple) or len(raw) != 3:
            raise ValueError(f"{where} must be [watermark, status, aligned], got {raw!r}")
        wm = _parse_watermark(raw[0], f"{where} watermark")
        active = _parse_status(raw[1], f"{where} status").is_active
        aligned = raw[2]
        if not isinstance(aligned, bool):
            raise ValueError(f"{where} aligned must be a bool, got {aligned!r}")
        if aligned and not active:
            raise ValueError(f"{where} is idle and aligned; idle channels are never aligned")
        if aligned and wm < last_wm:
            raise ValueError(
                f"{where} is aligned with watermark {wm} below last_output_watermark {last_wm}"
            )
        channels.append((wm, active, aligned))

    any_active = any(active for _, active, _ in channels)
    if any_active != last_status.is_active:
        raise ValueError(
            f"valve snapshot last_output_status {last_status.value} contradicts the channels: "
            "the valve is idle exactly when every channel is idle"
        )
    aligned_wms = [wm for wm, _, aligned in channels if aligned]
    if aligned_wms and min(aligned_wms) != last_wm:
        raise ValueError(
            f"valve snapshot aligned channels' minimum watermark {min(aligned_wms)} differs from "
            f"last_output_watermark {last_wm}"
        )
    return last_wm, last_status, channels


def _parse_watermark(value: Any, what: str) -> int:
    if type(value) is not int or not MIN_WATERMARK <= value <= MAX_WATERMARK:
        raise ValueError(f"{what} must be an int in the 64-bit range, got {value!r}")
    return value


def _parse_status(value: Any, what: str) -> WatermarkStatus:
    if value not in ("ACTIVE", "IDLE"):
        raise ValueError(f"{what} must be 'ACTIVE' or 'IDLE', got {value!r}")
    return WatermarkStatus(value)
