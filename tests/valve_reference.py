"""Linear-scan StatusWatermarkValve with the corrected (FLINK-40475) semantics.

The one reference implementation of those semantics: ``tests/test_valve.py`` checks the heap
valve against it step by step, and ``bench/valve.py`` uses it as the baseline. It stays a close
transliteration of Flink 1.11's Java (every decision scans all channels) so that the only
differences from Flink 1.11's ``StatusWatermarkValve.java`` (apache/flink, ``flink-streaming-java/
src/main/java/org/apache/flink/streaming/runtime/streamstatus/``) are the two corrections,
marked below.
"""

from __future__ import annotations

from dataclasses import dataclass

from flinkish_core.valve import MIN_WATERMARK, ChannelState, ValveOutput, WatermarkStatus


@dataclass
class InputChannelStatus:
    watermark: int = MIN_WATERMARK
    status: WatermarkStatus = WatermarkStatus.ACTIVE
    aligned: bool = True


class LinearScanValve:
    def __init__(self, num_channels: int, output: ValveOutput) -> None:
        self.channels = [InputChannelStatus() for _ in range(num_channels)]
        self.output = output
        self.last_output_watermark = MIN_WATERMARK
        self.last_output_status = WatermarkStatus.ACTIVE

    @property
    def num_channels(self) -> int:
        return len(self.channels)

    def channel(self, index: int) -> ChannelState:
        c = self.channels[index]
        return ChannelState(c.watermark, c.status, c.aligned)

    def input_watermark(self, watermark: int, channel: int) -> None:
        c = self.channels[channel]
        if self.last_output_status.is_active and c.status.is_active and watermark > c.watermark:
            c.watermark = watermark
            if not c.aligned and watermark >= self.last_output_watermark:
                c.aligned = True
            self.find_and_output_new_min_watermark_across_aligned_channels()

    def input_watermark_status(self, status: WatermarkStatus, channel: int) -> None:
        c = self.channels[channel]
        if status.is_idle and c.status.is_active:
            c.status = WatermarkStatus.IDLE
            c.aligned = False
            if not self.has_active_channels():
                # Correction 1: flush whatever the last channel's watermark was.
                self.find_and_output_max_watermark_across_all_channels()
                self.last_output_status = WatermarkStatus.IDLE
                self.output.emit_watermark_status(self.last_output_status)
            elif c.watermark == self.last_output_watermark:
                self.find_and_output_new_min_watermark_across_aligned_channels()
        elif status.is_active and c.status.is_idle:
            c.status = WatermarkStatus.ACTIVE
            if c.watermark >= self.last_output_watermark:
                c.aligned = True
            if self.last_output_status.is_idle:
                self.last_output_status = WatermarkStatus.ACTIVE
                self.output.emit_watermark_status(self.last_output_status)
            # Correction 2: a reactivated channel may unblock the minimum right away.
            self.find_and_output_new_min_watermark_across_aligned_channels()

    def add_channel(self) -> int:
        """A new channel is one that was idle at MIN and resumes (see the heap valve)."""
        self.channels.append(InputChannelStatus(status=WatermarkStatus.IDLE, aligned=False))
        self.input_watermark_status(WatermarkStatus.ACTIVE, len(self.channels) - 1)
        return len(self.channels) - 1

    def has_active_channels(self) -> bool:
        return any(c.status.is_active for c in self.channels)

    def find_and_output_new_min_watermark_across_aligned_channels(self) -> None:
        new_min = min((c.watermark for c in self.channels if c.aligned), default=None)
        if new_min is not None and new_min > self.last_output_watermark:
            self.last_output_watermark = new_min
            self.output.emit_watermark(self.last_output_watermark)

    def find_and_output_max_watermark_across_all_channels(self) -> None:
        max_watermark = max(c.watermark for c in self.channels)
        if max_watermark > self.last_output_watermark:
            self.last_output_watermark = max_watermark
            self.output.emit_watermark(self.last_output_watermark)
