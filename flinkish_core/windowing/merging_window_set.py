"""Flink's ``MergingWindowSet``: the in-flight windows of one key of a merging assigner.

Each window maps to a *state window*: the window whose namespace holds its contents. When
windows merge, the result takes over the state window of one of them, so contents need not be
moved; the other state windows are folded into it by the merge callback. A late element can
bridge two existing sessions: that merge goes through the same path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from flinkish_core.windowing.window import TimeWindow, window_from_data, window_to_data

__all__ = ["MergeFunction", "MergingWindowSet"]


class MergeFunction(Protocol):
    """Called once per merge: ``merge_result``, the windows merged into it (the new window
    excluded: it had no state), the state window the result keeps, and the other state windows
    to fold into that one."""

    def __call__(
        self, merge_result: TimeWindow, merged_windows: list[TimeWindow],
        state_window_result: TimeWindow, merged_state_windows: list[TimeWindow],
    ) -> None: ...


class _Assigner(Protocol):
    def merge_windows(
        self, windows: list[TimeWindow], callback: Callable[[list[TimeWindow], TimeWindow], None],
    ) -> None: ...


class MergingWindowSet:
    """Window -> state window mapping of one key, with Flink's ``addWindow`` algorithm."""

    def __init__(
        self, assigner: _Assigner, mapping: dict[TimeWindow, TimeWindow] | None = None,
    ) -> None:
        self._assigner = assigner
        self.mapping: dict[TimeWindow, TimeWindow] = dict(mapping or {})

    def get_state_window(self, window: TimeWindow) -> TimeWindow | None:
        return self.mapping.get(window)

    def retire_window(self, window: TimeWindow) -> None:
        """Forgets ``window`` (its state was cleared, or it was late on arrival)."""
        if self.mapping.pop(window, None) is None:
            raise KeyError(f"Window {window} is not in in-flight window set.")

    def add_window(self, new_window: TimeWindow, merge_function: MergeFunction) -> TimeWindow:
        """Adds ``new_window``, merging it (and whatever it bridges) with the in-flight windows;
        returns the window the new one ended up in."""
        merge_results: list[tuple[TimeWindow, list[TimeWindow]]] = []
        self._assigner.merge_windows(
            [*self.mapping, new_window],
            lambda to_merge, result: merge_results.append((result, list(to_merge))))

        result_window = new_window
        merged_new_window = False
        for merge_result, merged_windows in merge_results:
            # if our new window is in the merged windows make the merge result the result window
            if new_window in merged_windows:
                merged_windows.remove(new_window)
                merged_new_window = True
                result_window = merge_result
            # the result keeps the state window of (any) one of the windows it merges
            state_window = self.mapping[merged_windows[0]]
            merged_state_windows = [
                s for s in (self.mapping.pop(w, None) for w in merged_windows) if s is not None]
            self.mapping[merge_result] = state_window
            merged_state_windows.remove(state_window)
            # merging one pre-existing window into itself without extending it is no merge:
            # the new window never had state of its own
            if merged_windows != [merge_result]:
                merge_function(
                    merge_result, merged_windows, self.mapping[merge_result],
                    merged_state_windows)

        # the new window created a new, self-contained window without merging
        if not merge_results or (result_window == new_window and not merged_new_window):
            self.mapping[result_window] = result_window
        return result_window

    def to_data(self) -> list[Any]:
        """The mapping as plain data: ``[[window, state window], ...]``."""
        return [[window_to_data(w), window_to_data(s)] for w, s in self.mapping.items()]

    @classmethod
    def from_data(cls, assigner: _Assigner, data: list[Any]) -> MergingWindowSet:
        mapping: dict[TimeWindow, TimeWindow] = {}
        for window, state_window in data:
            w, s = window_from_data(window), window_from_data(state_window)
            if not isinstance(w, TimeWindow) or not isinstance(s, TimeWindow):
                raise ValueError(f"merging windows are time windows, got {window!r}")
            mapping[w] = s
        return cls(assigner, mapping)
