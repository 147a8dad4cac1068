"""Flink's window operator as a pure, deterministic state machine (no Spark): assigners,
triggers, window functions, evictors and :class:`WindowOperator`. See ``docs/windows.md``.
"""

from flinkish_core.windowing.evictor import (
    CountEvictor,
    DeltaEvictor,
    Evictor,
    TimeEvictor,
    TimestampedValue,
)
from flinkish_core.windowing.merging_window_set import MergingWindowSet
from flinkish_core.windowing.pane import PaneInfo, Timing
from flinkish_core.windowing.partitioned_state import ReducingStateDescriptor, ValueStateDescriptor
from flinkish_core.windowing.timer_service import InternalTimer, InternalTimerService
from flinkish_core.windowing.trigger import Trigger, TriggerContext, TriggerResult
from flinkish_core.windowing.triggers import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    NeverTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
)
from flinkish_core.windowing.window import GlobalWindow, TimeWindow, Window
from flinkish_core.windowing.window_assigner import (
    EventTimeSessionWindows,
    GlobalWindows,
    MergingWindowAssigner,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)
from flinkish_core.windowing.window_function import (
    AggregateFunction,
    Avg,
    Count,
    Max,
    Min,
    ProcessWindowFunction,
    ReduceFunction,
    Sum,
    WindowContext,
)
from flinkish_core.windowing.window_operator import (
    COLUMNAR_FORMAT,
    LateElement,
    WindowOperator,
    WindowOutput,
    WindowResult,
)

__all__ = [
    "COLUMNAR_FORMAT", "AggregateFunction", "Avg", "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "Count", "CountEvictor", "CountTrigger", "DeltaEvictor", "EventTimeSessionWindows",
    "EventTimeTrigger", "Evictor", "GlobalWindow", "GlobalWindows", "InternalTimer",
    "InternalTimerService", "LateElement", "Max", "MergingWindowAssigner", "MergingWindowSet",
    "Min", "NeverTrigger", "PaneInfo", "ProcessWindowFunction", "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger", "PurgingTrigger", "ReduceFunction", "ReducingStateDescriptor",
    "SlidingEventTimeWindows", "SlidingProcessingTimeWindows", "Sum", "TimeEvictor",
    "TimeWindow", "TimestampedValue", "Timing", "Trigger", "TriggerContext", "TriggerResult",
    "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "ValueStateDescriptor",
    "Window", "WindowAssigner", "WindowContext", "WindowOperator", "WindowOutput",
    "WindowResult",
]
