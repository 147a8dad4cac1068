"""``flinkish inspect``: where a query stands, read from its checkpoint store.

Reads only (``CheckpointStore.reader``), so it is safe beside a running query.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from checkpointing import CheckpointStorage, CheckpointStore
from flinkish_source.valve import MAX_WATERMARK, MIN_WATERMARK


@dataclass(frozen=True)
class EpochRow:
    epoch: int
    state: str  # "completed" or "pending" (decided, not yet completed)
    committed_at: int | None  # epoch ms
    watermark: int | None
    status: str | None
    idle_partitions: tuple[str, ...]
    rows: int | None
    late_rows: int | None
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)


def store_location(location: str) -> str:
    """Accept the store itself or the query's checkpointLocation (store under ``flinkish/``)."""
    nested = os.path.join(location, "flinkish")
    if os.path.isfile(os.path.join(location, "metadata")) and os.path.isdir(nested):
        return nested
    return location


def load_epochs(location: str) -> list[EpochRow]:
    store = CheckpointStore.reader(CheckpointStorage.open(store_location(location)))
    rows = []
    for epoch in store.completed_ids():
        done = store.completed(epoch)
        if done is None:
            continue
        result = done.state.get("watermark", {})
        partitions = result.get("partitions", {})
        rows.append(EpochRow(
            epoch, "completed", done.completed_ms, _wm(result.get("watermark")),
            result.get("status"),
            tuple(n for n, p in partitions.items() if p.get("status") == "IDLE"),
            done.state.get("rows"), done.state.get("late_rows"), partitions,
        ))
    for epoch in store.pending_ids():
        pending = store.pending(epoch)
        if pending is not None:
            rows.append(EpochRow(epoch, "pending", None, None, None, (),
                                 pending.state.get("rows"), pending.state.get("late_rows")))
    return rows


def _wm(value: Any) -> int | None:
    return None if value is None or int(value) == MIN_WATERMARK else int(value)


def format_watermark(value: int | None) -> str:
    if value is None:
        return "-"
    if value == MAX_WATERMARK:
        return "MAX (ended)"
    return datetime.fromtimestamp(value / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def table(rows: list[EpochRow]) -> Any:
    from rich.table import Table

    out = Table(title="flinkish epochs")
    for column in ("epoch", "state", "committed at", "combined watermark", "idle partitions",
                   "rows", "late rows"):
        out.add_column(column, justify="right" if column in ("epoch", "rows", "late rows")
                       else "left")
    for r in rows:
        out.add_row(
            str(r.epoch), r.state,
            format_watermark(r.committed_at) if r.committed_at else "-",
            format_watermark(r.watermark), ", ".join(r.idle_partitions) or "-",
            "-" if r.rows is None else str(r.rows),
            "-" if r.late_rows is None else str(r.late_rows),
        )
    return out


def plot(rows: list[EpochRow], path: str) -> None:
    """Per-partition watermarks (hollow where the partition was idle) and the combined
    watermark over epochs: a lagging or idle partition shows at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r.state == "completed"]
    if not done:
        raise ValueError("no completed epochs to plot yet")

    def when(value: int | None) -> datetime | None:
        if value is None or value in (MIN_WATERMARK, MAX_WATERMARK):
            return None
        return datetime.fromtimestamp(value / 1000, timezone.utc)

    names = sorted({n for r in done for n in r.partitions})
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for name in names:
        points = [(r.epoch, r.partitions.get(name, {})) for r in done]
        xs = [e for e, p in points if when(p.get("watermark")) is not None]
        ys = [when(p["watermark"]) for e, p in points if when(p.get("watermark")) is not None]
        line = ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.2, label=name)[0]
        idle = [(e, when(p["watermark"])) for e, p in points
                if p.get("status") == "IDLE" and when(p.get("watermark")) is not None]
        if idle:
            ax.scatter([e for e, _ in idle], [w for _, w in idle], s=70, facecolors="white",
                       edgecolors=line.get_color(), zorder=3)
    combined = [(r.epoch, when(r.watermark)) for r in done if when(r.watermark) is not None]
    ax.plot([e for e, _ in combined], [w for _, w in combined], color="black", linewidth=3,
            label="combined (valve)")
    ax.set_xlabel("epoch (micro-batch id = checkpoint id)")
    ax.set_ylabel("watermark (event time, UTC)")
    ax.set_title("flinkish: per-partition and combined watermarks (hollow = idle)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
