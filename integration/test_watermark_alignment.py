"""Watermark alignment against a real broker and real Spark: a partition far ahead in event time
is not read while the partition holding the watermark back still has a backlog, everything is
read in the end, and without alignment both advance together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from integration.kafka_helpers import produce, source

pytestmark = pytest.mark.integration

BASE = 1_700_000_000_000
RECORDS = 300
AHEAD_MS = 600_000  # partition 1 runs ten minutes ahead of partition 0
DRIFT = "30 seconds"


def offsets_log(checkpoint: Path) -> list[dict[str, Any]]:
    """The source's journaled end offsets, batch by batch."""
    out = []
    files = [p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
    for path in sorted(files, key=lambda p: int(p.name)):
        out.append(json.loads(path.read_text().splitlines()[-1]))
    return out


def run(spark: Any, bootstrap: str, topic: str, tmp_path: Path, name: str,
        **options: str) -> list[dict[str, Any]]:
    events = source(spark, bootstrap, topic, str(tmp_path / f"{name}-state"),
                    **{"maxOffsetsPerTrigger": "40", "watermark.maxOutOfOrderness": "1 second",
                       **options})
    checkpoint = tmp_path / f"{name}-ck"
    query = (events.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert not query.isActive and query.exception() is None, query.exception()
    return offsets_log(checkpoint)


def test_the_partition_ahead_waits_for_the_one_with_a_backlog(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    name = topic(2)
    produce(kafka_bootstrap, name, [
        (p, f"k{p}-{i}".encode(), b"{}", BASE + p * AHEAD_MS + i * 1_000)
        for i in range(RECORDS) for p in (0, 1)
    ])
    aligned = run(spark, kafka_bootstrap, name, tmp_path, "aligned",
                  **{"watermark.alignment.maxDrift": DRIFT})
    positions = [(o["topics"][name]["0"], o["topics"][name]["1"]) for o in aligned]
    assert positions[-1][0]["offset"] == RECORDS and positions[-1][1]["offset"] == RECORDS
    held = [i for i, (_, p1) in enumerate(positions) if p1.get("held")]
    assert held, "partition 1 was never held back"
    for i in held:
        p0, p1 = positions[i]
        before = positions[i - 1][1]["offset"]
        assert p1["offset"] == before, f"batch {i}: held partition 1 read records"
        assert p0["offset"] > positions[i - 1][0]["offset"], f"batch {i}: partition 0 idle"
    from flinkish.inspect import held_partitions

    assert list(held_partitions(str(tmp_path / "aligned-ck"))) == held
    assert held_partitions(str(tmp_path / "aligned-ck"))[held[0]] == [f"{name}/1"]
    # while partition 0 had most of its backlog left, partition 1 did not move
    assert positions[len(positions) // 2][1]["offset"] < RECORDS

    free = run(spark, kafka_bootstrap, name, tmp_path, "free")
    both = [(o["topics"][name]["0"]["offset"], o["topics"][name]["1"]["offset"]) for o in free]
    assert both[-1] == (RECORDS, RECORDS)
    assert all(abs(a - b) <= 1 for a, b in both), both  # they advance together
    assert not any(o["topics"][name][p].get("held") for o in free for p in ("0", "1"))
