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


def generate(seed: int, partitions: int = 2, per_partition: int = 10) -> list[Record]:
    """Records per partition in offset order: event times around a rising frontier, some a
    little out of order, some late by up to 15 s; some records punctuate (raise their
    partition's watermark to their own time, which the same watermark then covers for several
    records); a last punctuation 30 s ahead closes most windows. Event times are unique per
    key, so records of one key have one order in any batch."""
    rng = random.Random(seed)
    taken: set[tuple[str, int]] = set()
    out: list[Record] = []
    for p in range(partitions):
        frontier, mark = BASE + rng.randrange(0, 3_000), 0
        for i in range(per_partition + 3):
            key = rng.choice("abc")
            if i < per_partition:
                frontier += rng.choice((0, 0, 400, 1_100, 2_500))
                behind = rng.choice((0, 200, 900, 1_500)) if rng.random() < 0.75 \
                    else rng.randrange(3_000, 15_000)
                timestamp = frontier - behind
                flag = timestamp > mark and rng.random() < 0.25
            else:  # the closing punctuation, then records for Spark to apply it with
                timestamp = frontier + 30_000 + (i - per_partition)
                flag = i == per_partition
            while (key, timestamp) in taken:
                timestamp += 1
            taken.add((key, timestamp))
            if flag:
                mark = timestamp
            out.append(Record(p, key, rng.randrange(1, 10), timestamp, flag))
    return out
