"""Panes: which firing of a window an output is, after Beam's ``PaneInfo``. Every firing of a
window (key + window) that has output is one pane: ``index`` counts them per key and state
window, ``timing`` is ON_TIME for the window's end timer, EARLY before ``max_timestamp()`` and
LATE after, ``is_last`` marks the cleanup timer's firing (the rule: docs/windows.md, "Panes").
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
    """The pane of one firing."""

    index: int
    timing: Timing
    is_last: bool

    @property
    def is_first(self) -> bool:
        return self.index == 0
