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


def test_a_released_partition_reads_only_as_far_as_the_drift_allows(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    """Partition 1 covers five seconds of event time per record, partition 0 one: a batch's
    share (20 records) would carry partition 1 100 s ahead, far past the 30 s drift."""
    name = topic(2)
    spacing = {0: 1_000, 1: 5_000}
    produce(kafka_bootstrap, name, [
        (p, f"k{p}-{i}".encode(), b"{}", BASE + i * spacing[p])
        for i in range(RECORDS) for p in (0, 1)
    ])
    aligned = run(spark, kafka_bootstrap, name, tmp_path, "aligned",
                  **{"watermark.alignment.maxDrift": DRIFT})
    ends = [(o["topics"][name]["0"]["offset"], o["topics"][name]["1"]["offset"])
            for o in aligned]
    assert ends[-1] == (RECORDS, RECORDS)

    def ahead_ms(i: int) -> int:  # partition 1's last record read vs partition 0's
        return (ends[i][1] - 1) * spacing[1] - (ends[i][0] - 1) * spacing[0]

    # the batches after the first (no watermark known yet) in which partition 1 read while
    # partition 0 still had a backlog
    released = [i for i in range(1, len(ends))
                if ends[i][0] < RECORDS and ends[i][1] > ends[i - 1][1]]
    assert released, "partition 1 never read while partition 0 had a backlog"
    for i in released:
        assert ahead_ms(i) <= 30_000 + spacing[1], f"batch {i}: {ends[i]}, {ahead_ms(i)} ms"
    assert any(o["topics"][name]["1"].get("capped") for o in aligned)
    from flinkish.inspect import capped_partitions

    assert f"{name}/1" in sum(capped_partitions(str(tmp_path / "aligned-ck")).values(), [])


def _held_while_behind(positions: list[dict[str, Any]], name: str, slow_end: int) -> list[int]:
    """Batches in which partition 1 was held while partition 0 had not reached ``slow_end``."""
    return [i for i, o in enumerate(positions)
            if o["topics"][name]["1"].get("held")
            and positions[i - 1]["topics"][name]["0"]["offset"] < slow_end]


def test_an_idle_partition_far_behind_holds_nothing_back(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    """Partition 2 gets three records an hour behind everything else and then nothing: once it
    has read them it turns IDLE and, with nothing left to read, holds nothing back. Partition 1
    (ten minutes ahead of partition 0, seventy ahead of partition 2) is held only while one of
    them has a backlog; Trigger.AvailableNow ends with everything read (were partition 2 still
    the reference, partition 1 could never be read and the query would not end)."""
    name = topic(3)
    produce(kafka_bootstrap, name, [
        (2, f"k2-{i}".encode(), b"{}", BASE - 3_600_000 + i) for i in range(3)
    ] + [
        (p, f"k{p}-{i}".encode(), b"{}", BASE + p * AHEAD_MS + i * 1_000)
        for i in range(RECORDS) for p in (0, 1)
    ])
    positions = run(spark, kafka_bootstrap, name, tmp_path, "idle",
                    **{"watermark.alignment.maxDrift": DRIFT, "idleTimeout": "200 ms"})
    final = positions[-1]["topics"][name]
    assert [final[p]["offset"] for p in ("0", "1", "2")] == [RECORDS, RECORDS, 3]
    assert any(o["topics"][name]["2"].get("status") == "IDLE" for o in positions), \
        "partition 2 never turned idle"
    assert _held_while_behind(positions, name, RECORDS), "partition 1 was never held"
    for i, o in enumerate(positions):
        if o["topics"][name]["1"].get("held"):
            assert positions[i - 1]["topics"][name]["0"]["offset"] < RECORDS, \
                f"batch {i}: partition 1 held after partition 0 had read everything"
        if o["topics"][name]["0"].get("held"):  # partition 2 held it while it had a backlog
            assert positions[i - 1]["topics"][name]["2"]["offset"] < 3, \
                f"batch {i}: partition 0 held by partition 2 with nothing left to read"


def test_a_finished_bounded_partition_holds_nothing_back(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    """With endingOffsets, partition 0 stops at offset 100, ten minutes behind partition 1 in
    event time: once it has finished, partition 1 reads to its end (its own ending offset)
    although partition 0's last watermark stays far behind it."""
    name = topic(2)
    produce(kafka_bootstrap, name, [
        (p, f"k{p}-{i}".encode(), b"{}", BASE + p * AHEAD_MS + i * 1_000)
        for i in range(RECORDS) for p in (0, 1)
    ])
    stop = 100
    positions = run(spark, kafka_bootstrap, name, tmp_path, "bounded",
                    **{"watermark.alignment.maxDrift": DRIFT,
                       "endingOffsets": json.dumps({name: {"0": stop, "1": RECORDS}})})
    final = positions[-1]["topics"][name]
    assert (final["0"]["offset"], final["1"]["offset"]) == (stop, RECORDS)
    assert _held_while_behind(positions, name, stop), "partition 1 was never held"
    finished = next(i for i, o in enumerate(positions) if o["topics"][name]["0"]["offset"] == stop)
    assert not any(o["topics"][name]["1"].get("held") for o in positions[finished + 1:])
    assert positions[finished]["topics"][name]["1"]["offset"] < RECORDS, \
        "partition 1 was read to its end before partition 0 finished: nothing was tested"
