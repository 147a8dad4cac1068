"""Panes: which firing of a window an output is, after Beam's ``PaneInfo``.

Every firing of a window (key + window) is one pane; all outputs of that firing share it.

- ``index``: 0 for the window's first firing that produces output (a firing of an empty window
  emits nothing and takes no index), then 1, 2, ... Counted per key and *state window*, so
  the count survives a purge (a purge drops contents, not the window) and, when session
  windows merge, the merged window goes on from the highest index of its parts.
- ``timing``, from the window's clock (the watermark for event-time assigners, the processing
  time for processing-time ones and for global windows) and ``max_timestamp()``:

  - ``ON_TIME``: the firing comes from a timer of the window's clock whose timestamp is
    ``max_timestamp()``: the clock passing the window's end (Flink's ``EventTimeTrigger``
    firing). With the built-in triggers a window has at most one.
  - ``EARLY``: the time the firing stands for is before ``max_timestamp()``: a timer's
    timestamp, or for a firing on an element or on a timer of the other clock, the current
    clock. Count triggers, continuous triggers and processing-time triggers on event-time
    windows fire early.
  - ``LATE``: any other firing: the clock is at or past ``max_timestamp()`` and it is not the
    end-of-window timer (a late element within the allowed lateness re-firing the window).
- ``is_last``: the firing is made by the window's cleanup timer (``max_timestamp() +
  allowed_lateness``), whose step clears all the window's state: no firing of that window can
  follow. With zero allowed lateness the ON_TIME pane is the last; with a lateness, the last
  pane is flagged only if the trigger fires at the cleanup time. A purge alone is not last: the
  window stays open for late elements until its cleanup time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["PaneInfo", "Timing"]


class Timing(enum.Enum):
    EARLY = "EARLY"
    ON_TIME = "ON_TIME"
    LATE = "LATE"


@dataclass(frozen=True)
class PaneInfo:
    """The pane of one firing (see the module docstring for the rule)."""

    index: int
    timing: Timing
    is_last: bool

    @property
    def is_first(self) -> bool:
        return self.index == 0
