"""The main job end to end: ``flinkish demo`` survives its crash and verifies exactly-once
output; ``flinkish inspect`` reads the checkpoint it left behind."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from checkpointing import CheckpointStorage, CheckpointStore
from flinkish.cli import main
from flinkish.inspect import load_epochs, table


def test_demo_verdict_then_inspect_and_plot(kafka_bootstrap: str, tmp_path: Path,
                                            capsys: object) -> None:
    work = tmp_path / "demo"
    status = main(["demo", "--duration", "12", "--plain", "--bootstrap", kafka_bootstrap,
                   "--workdir", str(work)])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert status == 0, out[-3000:]
    assert "every produced event is in the output exactly once, through a crash" in out
    assert "crashes survived" in out and "duplicates / missing" in out
    assert "pre-commits left in the target" in out

    checkpoint = work / "checkpoint"
    store = CheckpointStore.reader(CheckpointStorage.open(str(checkpoint / "flinkish")))
    ids = store.completed_ids()
    rows = load_epochs(str(checkpoint))
    assert [r.epoch for r in rows if r.state == "completed"] == ids
    assert sum(r.rows or 0 for r in rows) == sum(
        store.completed(i).state["rows"] for i in ids  # type: ignore[union-attr]
    )
    watermarks = [r.watermark for r in rows if r.watermark is not None]
    assert watermarks == sorted(watermarks) and len(watermarks) >= 3

    console = Console(record=True, width=100)
    console.print(table(rows))
    text = console.export_text()
    for r in rows:
        assert f"│ {r.epoch:>5} │ {r.state:<9} │" in text

    plot = tmp_path / "watermarks.png"
    assert main(["inspect", str(checkpoint), "--plot", str(plot)]) == 0
    data = plot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
