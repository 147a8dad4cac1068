"""Benchmark: the heap-based StatusWatermarkValve against the linear-scan reference.

Run from the repository root: ``python bench/valve.py [--inputs N] [--channels C]``.

Both valves get the same seeded random inputs: mostly per-channel watermarks that tend to
increase (with some going back, which the valve ignores) and ~2% status changes (a channel goes
idle, and resumes the next time it is picked). The linear-scan baseline costs O(channels) per
input, so it only runs on a prefix of the inputs; rates are per input, and both valves must emit
exactly the same outputs and reach the same state on that prefix. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The project is used from the work tree, and the baseline lives with the tests (the one copy of
# the linear-scan semantics), so both directories go on the path.
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from valve_reference import LinearScanValve  # noqa: E402

from flinkish_core.valve import (  # noqa: E402
    ChannelState,
    StatusWatermarkValve,
    WatermarkStatus,
)

Input = tuple[int, int | WatermarkStatus]  # (channel, watermark or status)
Valve = StatusWatermarkValve | LinearScanValve


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def emit_watermark(self, watermark: int) -> None:
        self.events.append(("wm", watermark))

    def emit_watermark_status(self, status: WatermarkStatus) -> None:
        self.events.append(("status", status))


def generate(num_inputs: int, num_channels: int, seed: int) -> list[Input]:
    """Seeded inputs like a consumer polling its partitions round-robin, plus one extra input in
    ten for a random channel. A watermark is the input's position minus a random lag, so a
    channel's watermarks tend to increase but sometimes go back, and the minimum (the stalest
    channel) keeps moving. Channels only go idle after the first round, else a channel that is
    idle before its first watermark resumes at MIN and pins the output there for rounds."""
    rng = random.Random(seed)
    idle = [False] * num_channels
    inputs: list[Input] = []
    next_in_turn = 0
    for position in range(num_inputs):
        if rng.random() < 0.1:
            channel = rng.randrange(num_channels)
        else:
            channel, next_in_turn = next_in_turn, (next_in_turn + 1) % num_channels
        if idle[channel]:
            idle[channel] = False
            inputs.append((channel, WatermarkStatus.ACTIVE))
        elif position >= num_channels and rng.random() < 0.01:
            idle[channel] = True
            inputs.append((channel, WatermarkStatus.IDLE))
        else:
            inputs.append((channel, position - rng.randrange(100)))
    return inputs


def feed(valve: Valve, inputs: Sequence[Input]) -> float:
    """Feed inputs and return the seconds it took."""
    input_watermark, input_status = valve.input_watermark, valve.input_watermark_status
    start = time.perf_counter()
    for channel, value in inputs:
        if isinstance(value, int):
            input_watermark(value, channel)
        else:
            input_status(value, channel)
    return time.perf_counter() - start


def channel_states(valve: Valve) -> list[ChannelState]:
    return [valve.channel(i) for i in range(valve.num_channels)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--channels", type=int, default=10_000)
    parser.add_argument(
        "--baseline-inputs", type=int, default=50_000, help="prefix the linear scan runs on"
    )
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)

    inputs = generate(args.inputs, args.channels, args.seed)
    prefix_len = min(args.baseline_inputs, len(inputs))
    prefix, rest = inputs[:prefix_len], inputs[prefix_len:]
    status_share = sum(not isinstance(v, int) for _, v in inputs) / max(len(inputs), 1)
    print(
        f"{len(inputs):,} inputs over {args.channels:,} channels, {status_share:.2%} status inputs"
    )

    valve_out = Recorder()
    valve = StatusWatermarkValve(args.channels, valve_out)
    valve_seconds = feed(valve, prefix)
    valve_prefix_events = list(valve_out.events)
    valve_prefix_states = channel_states(valve)
    valve_seconds += feed(valve, rest)
    print(f"heap valve: {valve_seconds:.2f} s, {len(valve_out.events):,} outputs")

    baseline_out = Recorder()
    baseline = LinearScanValve(args.channels, baseline_out)
    baseline_seconds = feed(baseline, prefix)
    print(
        f"linear-scan baseline: {baseline_seconds:.2f} s on the first {prefix_len:,} inputs "
        f"(rates below are per input)"
    )

    if baseline_out.events != valve_prefix_events:
        print("MISMATCH: the valves' outputs differ on the common prefix", file=sys.stderr)
        return 1
    if channel_states(baseline) != valve_prefix_states:
        print("MISMATCH: the valves' channel states differ after the prefix", file=sys.stderr)
        return 1
    print(f"outputs agree on the prefix ({len(valve_prefix_events):,} outputs)")

    valve_ips = len(inputs) / valve_seconds
    baseline_ips = prefix_len / baseline_seconds
    result = {
        "inputs": len(inputs),
        "channels": args.channels,
        "baseline_inputs": prefix_len,
        "status_input_share": round(status_share, 4),
        "prefix_outputs_agree": True,
        "valve_ips": round(valve_ips),
        "baseline_ips": round(baseline_ips),
        "speedup": round(valve_ips / baseline_ips, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
