"""The rows ``flinkish.windows`` emits and the sink recognises: ``kind`` is ``result`` (a
firing: window bounds, result, pane) or ``late`` (an element after its window's allowed
lateness: event time and value). The operator judged lateness on the combined watermark, so the
sink takes a ``late`` row as late instead of judging its event time again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

KIND = "kind"
RESULT, LATE = "result", "late"
PANE_COLUMNS = ("window_start", "window_end", "result", "pane_index", "pane_timing",
                "pane_is_last")
#: The field metadata key marking the late rows' own columns (the element's event time and
#: value), null in every result row: a sink writing the results and the late rows to tables of
#: their own leaves them out of the results' table, and the pane columns out of the late one.
LATE_COLUMN = "flinkish.lateColumn"


def is_window_output(columns: Collection[str]) -> bool:
    """Whether a DataFrame with these columns is the window operator's output (``kind`` and
    the pane columns), not the source's rows, whose ``kind`` is a marker column."""
    return KIND in columns and set(PANE_COLUMNS) <= set(columns)


def late_columns(fields: Iterable[tuple[str, Mapping[str, object] | None]]) -> set[str]:
    """The late rows' own columns among (name, field metadata) pairs (see
    :data:`LATE_COLUMN`)."""
    return {name for name, metadata in fields if (metadata or {}).get(LATE_COLUMN)}
