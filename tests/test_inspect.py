"""flinkish inspect over a real checkpoint store (no Spark): epochs, watermarks, idle
partitions, and the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from checkpointing import CheckpointStorage, CheckpointStore
from flinkish.inspect import format_watermark, load_epochs, plot, table
from flinkish_core.epoch_valve import advance, initial
from flinkish_core.markers import Marker
from flinkish_core.watermark import MAX_WATERMARK, MIN_WATERMARK

T = 1_700_000_000_000


def _store(tmp_path: Path) -> Path:
    location = tmp_path / "ck" / "flinkish"
    store = CheckpointStore(CheckpointStorage.open(str(location)), owner="q")
    epochs = [
        [Marker("t", 0, 0, "status", status="ACTIVE"), Marker("t", 1, 0, "status", status="ACTIVE"),
         Marker("t", 0, 5, "watermark", watermark=T)],
        [Marker("t", 1, 0, "status", status="IDLE"),
         Marker("t", 0, 9, "watermark", watermark=T + 5)],
        [Marker("t", 0, 9, "watermark", watermark=MAX_WATERMARK)],
    ]
    result = initial()
    for epoch, markers in enumerate(epochs):
        result = advance(result, epoch, markers)
        store.complete(epoch, {"watermark": result.to_json(), "rows": 5 * epoch, "late_rows": 1})
    store.begin(3, {"decision": [], "markers": [], "rows": 7, "late_rows": 0})
    (tmp_path / "ck" / "metadata").write_text('{"id":"q"}\n')
    return tmp_path / "ck"


def test_epochs_table_from_the_query_checkpoint(tmp_path: Path) -> None:
    rows = load_epochs(str(_store(tmp_path)))
    assert [(r.epoch, r.state, r.watermark, r.idle_partitions, r.rows) for r in rows] == [
        (0, "completed", None, (), 0),  # partition 1 holds it at Long.MIN_VALUE
        (1, "completed", T + 5, ("t/1",), 5),
        (2, "completed", MAX_WATERMARK, ("t/1",), 10),  # ended, not idle
        (3, "pending", None, (), 7),
    ]
    console = Console(record=True, width=100)
    console.print(table(rows))
    text = console.export_text()
    assert "flinkish epochs of topic t" in text
    assert "end of time" in text and "22:13:20.005" in text
    assert "    1 completed " in text and "    3 pending   " in text


def test_format_watermark_extremes() -> None:
    assert format_watermark(None) == format_watermark(MIN_WATERMARK) == "-"
    # Long.MAX, Spark's watermark at the end (the carrier's clamped time minus the horizon) and
    # the end as an epochs table stores it: one way
    for end in (MAX_WATERMARK, 253_402_214_399_998, 253_402_214_399_999):
        assert format_watermark(end) == format_watermark(end, with_date=False) == "end of time"
    assert format_watermark(T) == "2023-11-14 22:13:20.000"
    assert format_watermark(T, with_date=False) == "22:13:20.000"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "wm.png"
    plot(load_epochs(str(_store(tmp_path))), str(out))
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_held_and_capped_partitions_from_sparks_offsets_log(tmp_path: Path) -> None:
    from flinkish.inspect import capped_partitions, held_partitions

    offsets = tmp_path / "offsets"
    offsets.mkdir()
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'
    pos = {"offset": 5, "first": 0, "progressAt": 0, "seen": 5}
    (offsets / "0").write_text("v1\n" + meta + "\n" + json.dumps(
        {"version": 1, "topics": {"t": {"0": pos, "1": pos}}}))
    (offsets / "1").write_text("v1\n" + meta + "\n" + json.dumps(
        {"version": 1, "topics": {"t": {"0": pos, "1": {**pos, "held": True}}}}))
    (offsets / "2").write_text("v1\n" + meta + "\n" + json.dumps(
        {"version": 1, "topics": {"t": {"0": {**pos, "capped": True}, "1": pos}}}))
    (offsets / ".1.crc").write_text("x")
    assert held_partitions(str(tmp_path)) == {1: ["t/1"]}
    assert capped_partitions(str(tmp_path)) == {2: ["t/0"]}
    assert held_partitions(str(tmp_path / "missing")) == {}


def test_epochs_without_markers_show_sparks_event_time_watermark(tmp_path: Path) -> None:
    """A windowed count's epochs (no markers, Spark's watermark recorded by the sink): the
    table shows it, marked as Spark's, and the plot draws it."""
    location = tmp_path / "ck" / "flinkish"
    store = CheckpointStore(CheckpointStorage.open(str(location)), owner="q")
    for epoch, spark in enumerate([None, T, T + 60_000]):
        store.complete(epoch, {"watermark": advance(initial(), epoch, []).to_json(), "rows": 2,
                               "late_rows": 0, "spark_watermark": spark})
    (tmp_path / "ck" / "metadata").write_text('{"id":"q"}\n')
    rows = load_epochs(str(tmp_path / "ck"))
    assert [(r.watermark, r.watermark_source) for r in rows] == [
        (None, None), (T, "spark"), (T + 60_000, "spark")]
    console = Console(record=True, width=160)
    console.print(table(rows))
    text = console.export_text()
    assert "22:13:20.000 *" in text and "22:14:20.000 *" in text
    assert "Spark's event-time watermark of the batch" in " ".join(text.split())
    out = tmp_path / "wm.png"
    plot(rows, str(out))
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_watermarks_show_their_date_unless_the_caption_gives_it() -> None:
    from flinkish.inspect import EpochRow

    def render(watermark: int, committed: int) -> str:
        row = EpochRow(0, "completed", committed, watermark, "ACTIVE", (), 1, 0)
        console = Console(record=True, width=120)
        console.print(table([row]))
        return console.export_text()

    # event time on another day than the commits: the watermark keeps its date
    text = render(T, T + 3 * 86_400_000)
    assert "2023-11-14 22:13:20.000" in text and "committed on 2023-11-17" in text
    # both on one day: the caption says it once
    text = render(T, T + 60_000)
    assert "all on 2023-11-14" in text and "2023-11-14 22:13" not in text
    assert "22:13:20.000" in text


def test_lag_per_epoch_from_sparks_offsets_log(tmp_path: Path) -> None:
    from flinkish.inspect import EpochRow, lag_table, lags

    offsets = tmp_path / "offsets"
    offsets.mkdir()
    for batch, (done, seen, wm) in enumerate([(10, 50, T - 90_000), (30, 60, T - 30_000)]):
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": T, "conf": {}})
        pos = {"offset": done, "first": 0, "progressAt": T - 5_000, "seen": seen}
        idle = {**pos, "offset": 7, "seen": 7, "status": "IDLE"}
        (offsets / str(batch)).write_text("v1\n" + meta + "\n" + json.dumps(
            {"version": 1, "topics": {"t": {"0": pos, "1": idle}},
             "valve": {"watermark": wm, "status": "ACTIVE"}}) + "\n" + "17")
    found = lags(str(tmp_path))
    assert [(b, lag.offsets_behind_latest, lag.watermark_lag_ms, lag.idle_ms)
            for b, lag in found.items()] == [
        (0, {"t/0": 40, "t/1": 0}, 90_000, {"t/1": 5_000}),
        (1, {"t/0": 30, "t/1": 0}, 30_000, {"t/1": 5_000}),
    ]
    assert lags(str(tmp_path / "missing")) == {}
    console = Console(record=True, width=80)
    console.print(lag_table(found))
    text = console.export_text()
    assert "    0 0 / 40 / 20.0" in text and "1 min 30 s" in text and "1: 5.0 s" in text
    rows = [EpochRow(b, "completed", T, T - 1, "ACTIVE", (), 1, 0) for b in (0, 1, 2)]
    plot(rows, str(tmp_path / "lag.png"), found)
    assert (tmp_path / "lag.png").stat().st_size > 10_000


def test_the_epochs_table_stays_whole_at_80_columns() -> None:
    """A terminal's default width: no header or value is cut short."""
    from rich.console import Console

    from flinkish.inspect import EpochRow, table

    rows = [EpochRow(12345, "completed", T, 253402214399998, None, ("t/2", "t/3"), 1234567, 12,
                     {"t/2": {}, "t/3": {}}, watermark_source="spark")]
    console = Console(record=True, width=80)
    console.print(table(rows))
    text = console.export_text()
    assert "…" not in text, text
    assert "committed" in text and "partitions" in text and "end of time *" in text


def test_a_windowed_querys_epochs_show_what_the_source_journaled(tmp_path: Path) -> None:
    """A stateful query's sink sees no markers and records Spark's watermark; the source's
    per-partition watermarks, idleness and combined watermark come from Spark's offsets log.
    The plot leaves out Spark's watermark before the first carrier reached it (a record's
    event time minus the horizon, a day below the rest) and the end of the input."""
    from flinkish.inspect import plot_series, with_source_journal
    from flinkish_source.combined_watermark import PlanningValve

    location = tmp_path / "ck" / "flinkish"
    store = CheckpointStore(CheckpointStorage.open(str(location)), owner="q")
    day = 86_400_000
    sparks = [None, T - day, T, T + 1_000, 253_402_214_399_999]  # ... the end of the input
    for epoch, spark in enumerate(sparks):
        store.complete(epoch, {"watermark": advance(initial(), epoch, []).to_json(), "rows": 2,
                               "late_rows": 0, "spark_watermark": spark})
    (tmp_path / "ck" / "metadata").write_text('{"id":"q"}\n')
    offsets = tmp_path / "ck" / "offsets"
    offsets.mkdir()
    valve = initial()
    markers: list[list[Marker]] = [
        [Marker("t", 0, 0, "status", status="ACTIVE"),
         Marker("t", 1, 0, "status", status="ACTIVE")],
        [Marker("t", 0, 5, "watermark", watermark=T), Marker("t", 1, 5, "watermark", watermark=T)],
        [Marker("t", 0, 9, "watermark", watermark=T + 5_000),
         Marker("t", 1, 5, "status", status="IDLE")],
        [], [],
    ]
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": T, "conf": {}})
    for batch, batch_markers in enumerate(markers):
        # offsets/N journals the valve as the batch was planned: after the batch before
        offset = {"version": 1, "topics": {}, "valve": PlanningValve(valve).to_json()}
        (offsets / str(batch)).write_text(f"v1\n{meta}\n{json.dumps(offset)}\n")
        valve = advance(valve, batch, batch_markers)
    rows = with_source_journal(load_epochs(str(tmp_path / "ck")), str(tmp_path / "ck"))
    assert [(r.epoch, r.journaled_watermark, r.idle_partitions) for r in rows] == [
        (0, None, ()), (1, None, ()), (2, T, ()), (3, T + 5_000, ("t/1",)),
        (4, T + 5_000, ("t/1",))]
    # Spark's watermark up to the first epoch with a combined one (epoch 1's a record's time
    # minus the horizon) is none yet
    assert [r.watermark for r in rows] == [None, None, None, T + 1_000, 253_402_214_399_999]
    console = Console(record=True, width=100)
    console.print(table(rows))
    assert "2023-11-13" not in console.export_text()
    assert rows[3].partitions["t/1"] == {"watermark": T, "status": "IDLE", "aligned": False}
    series = plot_series(rows)
    assert series.partitions == {"t/0": [(2, T), (3, T + 5_000), (4, T + 5_000)],
                                 "t/1": [(2, T), (3, T), (4, T)]}
    assert series.idle == {"t/1": [(3, T), (4, T)]}
    assert series.combined == [(2, T), (3, T + 5_000), (4, T + 5_000)]
    # not epoch 1's (a day below, before any carrier), nor epoch 2's (the carrier's batch),
    # nor the end of the input
    assert series.spark == [(3, T + 1_000)]
    plot(rows, str(tmp_path / "journal.png"))
    assert (tmp_path / "journal.png").stat().st_size > 10_000


def _one_batch_read_it_all(tmp_path: Path) -> Path:
    """The getting-started query's checkpoint: batch 0 reads the whole bounded topic and
    closes no window yet; epoch 1 reads nothing and writes every window, its (Spark's)
    watermark at the end of time."""
    location = tmp_path / "ck" / "flinkish"
    store = CheckpointStore(CheckpointStorage.open(str(location)), owner="q")
    for epoch, (spark, rows) in enumerate([(None, 0), (253_402_214_399_999, 40)]):
        store.complete(epoch, {"watermark": advance(initial(), epoch, []).to_json(),
                               "rows": rows, "late_rows": 0, "spark_watermark": spark})
    (tmp_path / "ck" / "metadata").write_text('{"id":"q"}\n')
    offsets = tmp_path / "ck" / "offsets"
    offsets.mkdir()
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": T, "conf": {}})
    end = {"offset": 1200, "first": 0, "progressAt": T, "seen": 1200, "stop": 1200}
    for batch in (0, 1):
        (offsets / str(batch)).write_text("v1\n" + meta + "\n" + json.dumps(
            {"version": 1, "topics": {"t": {str(p): end for p in range(4)}}}))
    return tmp_path / "ck"


def test_a_plot_with_nothing_to_draw_says_why_in_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flinkish.cli import main
    from flinkish.inspect import nothing_to_draw, reading_batches

    location = str(_one_batch_read_it_all(tmp_path))
    assert reading_batches(location) == {0: 4800}
    why = nothing_to_draw(load_epochs(location), reading_batches(location))
    assert why is not None
    assert "one batch (0) read the whole input, 4800 records" in why
    assert "straight to the end of time in epoch 1" in why
    out = tmp_path / "wm.png"
    assert main(["inspect", location, "--plot", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    printed = " ".join(capsys.readouterr().out.split())
    assert "one batch (0) read the whole input" in printed and "end of time *" in printed
    assert "counts the row that carries the combined watermark into Spark" in printed
    # a plot with points says nothing of the kind
    assert nothing_to_draw(load_epochs(str(_store(tmp_path / "other"))), {}) is None


def test_partitions_whose_lines_coincide_are_drawn_once_labelled_together() -> None:
    from flinkish.inspect import EpochRow, _coinciding, plot_series

    def row(epoch: int, marks: dict[str, int], idle: str = "") -> EpochRow:
        return EpochRow(epoch, "completed", T, min(marks.values()), None, (), 1, 0,
                        {n: {"watermark": w, "status": "IDLE" if n == idle else "ACTIVE"}
                         for n, w in marks.items()}, watermark_source="valve")

    rows = [row(0, {"t/0": T, "t/1": T, "t/2": T - 9}),
            row(1, {"t/0": T + 5, "t/1": T + 5, "t/2": T + 5, "t/3": T}, idle="t/2")]
    lines = _coinciding(plot_series(rows))
    assert sorted(lines) == [("t/0", "t/1"), ("t/2",), ("t/3",)]


def test_idleness_agrees_in_the_epochs_table_the_lag_table_and_the_plot(tmp_path: Path) -> None:
    """Every partition goes idle after the last batch that read anything: the journaled valve
    predates it, the journaled positions say it; all three views show it."""
    from flinkish.inspect import lags, plot_series, with_source_journal
    from flinkish_source.combined_watermark import PlanningValve

    location = tmp_path / "ck" / "flinkish"
    store = CheckpointStore(CheckpointStorage.open(str(location)), owner="q")
    for epoch in range(3):
        store.complete(epoch, {"watermark": advance(initial(), epoch, []).to_json(), "rows": 2,
                               "late_rows": 0, "spark_watermark": T})
    (tmp_path / "ck" / "metadata").write_text('{"id":"q"}\n')
    offsets = tmp_path / "ck" / "offsets"
    offsets.mkdir()
    valve = advance(initial(), 0, [
        Marker("t", 0, 0, "status", status="ACTIVE"), Marker("t", 1, 0, "status", status="ACTIVE"),
        Marker("t", 0, 5, "watermark", watermark=T), Marker("t", 1, 5, "watermark", watermark=T)])
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": T + 33_000, "conf": {}})
    for batch, status in enumerate(["ACTIVE", "IDLE", "IDLE"]):
        pos = {"offset": 5, "first": 0, "progressAt": T, "seen": 5, "status": status}
        (offsets / str(batch)).write_text("v1\n" + meta + "\n" + json.dumps(
            {"version": 1, "topics": {"t": {"0": pos, "1": pos}},
             "valve": PlanningValve(valve).to_json()}))
    rows = with_source_journal(load_epochs(str(tmp_path / "ck")), str(tmp_path / "ck"))
    assert [r.idle_partitions for r in rows] == [(), ("t/0", "t/1"), ("t/0", "t/1")]
    assert [sorted(lag.idle_ms) for lag in lags(str(tmp_path / "ck")).values()] == [
        [], ["t/0", "t/1"], ["t/0", "t/1"]]
    assert plot_series(rows).idle == {"t/0": [(1, T), (2, T)], "t/1": [(1, T), (2, T)]}
