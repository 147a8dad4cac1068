"""The valve over Spark epochs: each micro-batch's marker rows go through a
:class:`StatusWatermarkValve` restored from the previous epoch's completed checkpoint, in a
fixed order (round-robin across partitions, which mirrors that their slices ran concurrently),
so a replayed epoch gives the same combined watermark (docs/semantics.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from flinkish_core.markers import KIND_STATUS, KIND_WATERMARK, Marker
from flinkish_core.valve import StatusWatermarkValve, ValveOutput
from flinkish_core.watermark import MIN_WATERMARK, WatermarkStatus


def feed_order(markers: Iterable[Marker]) -> list[Marker]:
    """Each partition's markers in emission order, interleaved round-robin across partitions."""
    by_partition: dict[tuple[str, int], list[Marker]] = {}
    for m in sorted(markers, key=Marker.sort_key):
        by_partition.setdefault((m.topic, m.partition), []).append(m)
    queues = [by_partition[key] for key in sorted(by_partition)]
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def channel_name(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


class _Discard:
    """An epoch's result is the valve's state after all its inputs: the outputs are dropped."""

    def emit_watermark(self, watermark: int) -> None:
        pass

    def emit_watermark_status(self, status: WatermarkStatus) -> None:
        pass


@dataclass(frozen=True)
class EpochWatermark:
    """The valve's result for one epoch, stored with the epoch's checkpoint."""

    epoch: int
    watermark: int  # combined watermark after the epoch
    status: str  # combined status after the epoch
    previous_watermark: int  # combined watermark after epoch N-1: the late-data threshold
    channels: tuple[str, ...] = ()  # valve channel index -> "topic/partition"
    valve: dict[str, Any] | None = None  # valve snapshot (None until a partition is known)
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def idle_partitions(self) -> list[str]:
        return [name for name, p in self.partitions.items() if p["status"] == "IDLE"]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "channels": list(self.channels)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EpochWatermark:
        return cls(
            int(data["epoch"]), int(data["watermark"]), str(data["status"]),
            int(data["previous_watermark"]), tuple(data["channels"]), data["valve"],
            dict(data["partitions"]))


def initial(epoch: int = -1) -> EpochWatermark:
    """Before the first epoch: no partitions known, the combined watermark at Long.MIN_VALUE."""
    return EpochWatermark(epoch, MIN_WATERMARK, "ACTIVE", MIN_WATERMARK)


def advance(previous: EpochWatermark, epoch: int, markers: Iterable[Marker]) -> EpochWatermark:
    """Feed epoch ``epoch``'s markers into the valve restored from ``previous``. Every
    partition announced becomes a channel (an empty one holds the watermark back until idle,
    as in Flink); new ones join in sorted order."""
    ordered = feed_order(markers)
    channels = list(previous.channels)
    index = {name: i for i, name in enumerate(channels)}
    new = sorted({channel_name(m.topic, m.partition) for m in ordered} - set(index))
    output: ValveOutput = _Discard()
    if previous.valve is None:
        if not new:
            return EpochWatermark(epoch, previous.watermark, previous.status, previous.watermark)
        valve = StatusWatermarkValve(len(new), output)
        for name in new:
            index[name] = len(channels)
            channels.append(name)
    else:
        valve = StatusWatermarkValve.restore(previous.valve, output)
        for name in new:
            index[name] = valve.add_channel()
            channels.append(name)
    for m in ordered:
        channel = index[channel_name(m.topic, m.partition)]
        if m.kind == KIND_WATERMARK and m.watermark is not None:
            valve.input_watermark(m.watermark, channel)
        elif m.kind == KIND_STATUS and m.status is not None:
            valve.input_watermark_status(WatermarkStatus(m.status), channel)
    partitions = {}
    for i, name in enumerate(channels):
        state = valve.channel(i)
        partitions[name] = {
            "watermark": state.watermark, "status": state.status.value, "aligned": state.aligned,
        }
    return EpochWatermark(
        epoch, valve.last_output_watermark, valve.last_output_status.value, previous.watermark,
        tuple(channels), valve.snapshot(), partitions)
