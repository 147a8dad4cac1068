"""Window operator configurations and generated inputs shared by the pure core's tests and the
differential test through Spark (``integration/test_window_differential.py``).

Plain Python, no Spark: Spark's Python workers import this module (its trigger travels to them
by reference), and the core's tests use it without a session.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from flinkish_core.windowing import (
    ContinuousEventTimeTrigger,
    Count,
    CountEvictor,
    CountTrigger,
    EventTimeSessionWindows,
    Evictor,
    GlobalWindows,
    SlidingEventTimeWindows,
    Sum,
    TimeEvictor,
    Trigger,
    TriggerContext,
    TriggerResult,
    TumblingEventTimeWindows,
    Window,
    WindowAssigner,
    WindowOperator,
)

#: a multiple of every window size below, so windows start on round numbers
BASE = 1_700_000_000_000


class TimerAtElementTrigger(Trigger):
    """A user's trigger: every element asks for a firing when the watermark reaches the
    element's own time, which for an element at or below the watermark is the next advance."""

    def on_element(self, element: Any, timestamp: int | None, window: Window,
                   ctx: TriggerContext) -> TriggerResult:
        assert timestamp is not None
        ctx.register_event_time_timer(timestamp)
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Window, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE

    def clear(self, window: Window, ctx: TriggerContext) -> None:
        pass


@dataclass(frozen=True)
class WindowCase:
    """One configuration of the window operator: what ``flinkish.windows.window`` takes."""

    name: str
    assigner: WindowAssigner
    aggregate: Any
    trigger: Trigger | None = None
    allowed_lateness: int = 0
    evictor: Evictor | None = None

    def operator(self) -> WindowOperator:
        """A fresh pure-core operator of this configuration."""
        return WindowOperator(self.assigner, self.aggregate, self.trigger,
                              self.allowed_lateness, self.evictor)


#: Flink's continuous, count and custom triggers, late elements inside the allowed lateness,
#: evictors, every event-time assigner
CASES = [
    WindowCase("tumbling-continuous-lateness", TumblingEventTimeWindows(10_000), Count(),
               ContinuousEventTimeTrigger(3_000), 5_000),
    WindowCase("tumbling-custom-lateness", TumblingEventTimeWindows(10_000), Count(),
               TimerAtElementTrigger(), 6_000),
    WindowCase("tumbling-time-evictor-lateness", TumblingEventTimeWindows(5_000), Sum(),
               None, 4_000, TimeEvictor(2_000)),
    WindowCase("sliding-count-lateness", SlidingEventTimeWindows(10_000, 5_000), Sum(),
               CountTrigger(3), 4_000),
    WindowCase("session-continuous-lateness", EventTimeSessionWindows(3_000), Count(),
               ContinuousEventTimeTrigger(2_000), 3_000),
    WindowCase("global-count-evictor", GlobalWindows(), Sum(), CountTrigger(3), 0,
               CountEvictor(2)),
]


@dataclass(frozen=True)
class Record:
    partition: int
    key: str
    value: int
    timestamp: int
    punctuation: bool  # sets its partition's watermark to its own event time


def generate(seed: int, partitions: int = 2, rounds: int = 3) -> list[Record]:
    """Records per partition in offset order, in rounds: each round every partition's first
    record punctuates (raises its watermark to the round's frontier), then come 3 to 6
    records around the frontier, a little out of order or late by up to 15 s, read in
    several batches under the same watermark; a last punctuation 30 s ahead closes most
    windows. Event times are unique per key, so records of one key have one order in any
    batch."""
    rng = random.Random(seed)
    taken: set[tuple[str, int]] = set()
    per_partition: list[list[Record]] = [[] for _ in range(partitions)]
    frontier = BASE + rng.randrange(0, 3_000)

    def add(p: int, timestamp: int, flag: bool) -> None:
        key = rng.choice("abc")
        while (key, timestamp) in taken:
            timestamp += 1
        taken.add((key, timestamp))
        per_partition[p].append(Record(p, key, rng.randrange(1, 10), timestamp, flag))

    for _ in range(rounds):
        frontier += rng.choice((1_100, 2_500, 4_000))
        for p in range(partitions):
            add(p, frontier, True)
            for _ in range(rng.randint(3, 6)):
                add(p, frontier + rng.choice((-900, -200, 0, 300, 1_500)) if rng.random() < 0.75
                    else frontier - rng.randrange(3_000, 15_000), False)
    for p in range(partitions):  # the closing punctuation, then records to apply it with
        for i in range(3):
            add(p, frontier + 30_000 + 10 * p + i, i == 0)
    return [r for records in per_partition for r in records]
