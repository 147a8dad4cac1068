"""The main job end to end: ``flinkish demo`` survives its crash and verifies exactly-once
output, counts 10 s windows exactly with ``flinkish.with_watermark`` where Spark's own watermark
loses rows, and shows its silent partition IDLE; ``flinkish inspect`` reads the checkpoint it
left behind."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.dataset as ds
from rich.console import Console

from checkpointing import CheckpointStorage, CheckpointStore
from flinkish.cli import main
from flinkish.inspect import load_epochs, table


def test_demo_verdict_then_inspect_and_plot(kafka_bootstrap: str, tmp_path: Path,
                                            capsys: object) -> None:
    work = tmp_path / "demo"
    status = main(["demo", "--duration", "60", "--plain", "--bootstrap", kafka_bootstrap,
                   "--workdir", str(work)])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert status == 0, out[-3000:]
    assert "every produced event is in the output exactly once, through a crash" in out
    assert "crashes survived" in out and "duplicates / missing" in out
    assert "pre-commits left in the target" in out
    # the recovery shown as it goes, then how long it took
    assert re.search(r"RECOVERING for \d+ s: (starting Spark again|Spark up after)", out)
    assert re.search(r"recovery, crash to next commit\s+\S+ \d+\.\d s", out)

    # the windowed counts, measured from each query's output against the produced events
    assert "VERDICT: with flinkish.with_watermark every closed window counted exactly" in out
    flinkish = re.search(r"^flinkish\.with_watermark: (\d+) of (\d+) closed windows wrong, "
                         r"(\d+) rows dropped .*numRowsDroppedByWatermark (\d+)\)$", out, re.M)
    assert flinkish, out[-3000:]
    wrong, exact_windows, dropped, spark_counted = map(int, flinkish.groups())
    assert wrong == 0 and exact_windows > 0 and dropped == 0 and spark_counted == 0
    spark = re.search(r"^Spark's withWatermark: (\d+) of (\d+) closed windows wrong, "
                      r"(\d+) rows dropped \((\d+) of the lagging partition's", out, re.M)
    assert spark, out[-3000:]
    wrong, closed, dropped, lagging = map(int, spark.groups())
    assert wrong > 0 and closed > 0 and dropped > 0 and lagging > 0
    # each window in the flinkish count's output once (the sink's exactly-once, through the
    # crash)
    windows = ds.dataset(str(work / "windows" / "flinkish" / "output"), format="parquet"
                         ).to_table(columns=["window_start", "partition"]).to_pylist()
    keys = [(w["window_start"], w["partition"]) for w in windows]
    assert len(keys) == exact_windows and len(set(keys)) == len(keys)

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
    # the silent partition went IDLE while the others ran (the valve left it out), and at the
    # end every partition did (the valve released the maximum)
    topic = next(iter({n for r in rows for n in r.partitions})).rsplit("/", 1)[0]
    alone = [r.epoch for r in rows if f"{topic}/2" in r.idle_partitions
             and len(r.idle_partitions) < 4]
    assert alone, [(r.epoch, r.idle_partitions) for r in rows]
    assert re.search(r"^partition 2 \(silent\) IDLE in epochs \d", out, re.M)
    assert len([r for r in rows if r.state == "completed"][-1].idle_partitions) == 4

    console = Console(record=True, width=100)
    console.print(table(rows))
    text = console.export_text()
    for r in rows:
        assert f"{r.epoch:>5} {r.state:<9} " in text

    plot = tmp_path / "watermarks.png"
    assert main(["inspect", str(checkpoint), "--plot", str(plot)]) == 0
    data = plot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
