"""``flinkish.windows`` through Spark against the pure core on the same input, batch by batch.

Spark decides how the records split into micro-batches and which watermark each batch runs
with; both are journaled in the query's offsets log (``batchWatermarkMs`` and the source's end
offsets). The reference replays exactly that through :class:`WindowOperator` in Flink's order
(each batch's watermark, then its records) and must give the same firings, panes and late
rows, in the same batches. A Spark layer that fires a timer at a repeated watermark, misses a
group's timer or judges lateness at another watermark fails here.

``FLINKISH_WINDOW_SEEDS=N`` runs N generated inputs per case (CI runs one).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import flinkish
from flinkish import windows
from flinkish_core.windowing import TimeWindow, WindowOutput
from integration.kafka_helpers import produce, source
from integration.test_windows import run
from integration.window_cases import BASE, CASES, Record, WindowCase, generate

pytestmark = pytest.mark.integration

SEEDS = int(os.environ.get("FLINKISH_WINDOW_SEEDS", "1"))

Row = tuple[Any, ...]
"""(batch, kind, key, window start, window end, result, pane index, timing, last, event
time, value): a firing or a late row, and the batch it came out in."""


def run_case(spark: Any, bootstrap: str, name: str, tmp: Path, case: WindowCase,
             records: list[Record], max_offsets: int) -> tuple[list[Row], Path]:
    """``records`` through the flinkish source (punctuated watermarks), ``with_watermark`` and
    ``case``'s window operator, AvailableNow; the output rows and the checkpoint."""
    produce(bootstrap, name, [
        (r.partition, r.key.encode(),
         json.dumps({"v": r.value, **({"p": True} if r.punctuation else {})}).encode(),
         r.timestamp) for r in records])
    flinkish.register(spark)
    events = source(spark, bootstrap, name, str(tmp / "state"), **{
        "watermark.strategy": "punctuated", "watermark.punctuation.field": "p",
        "maxOffsetsPerTrigger": str(max_offsets)})
    df = flinkish.with_watermark(events).selectExpr(
        "CAST(key AS STRING) AS key", "eventTime",
        "CAST(get_json_object(CAST(value AS STRING), '$.v') AS INT) AS v")
    fired = windows.window(df, key="key", assigner=case.assigner, aggregate=case.aggregate,
                           value="v", trigger=case.trigger,
                           allowed_lateness=case.allowed_lateness, evictor=case.evictor)
    checkpoint = tmp / "ck"
    _, rows = run(fired, checkpoint)
    return [spark_row(batch, r) for batch, r in rows], checkpoint


def ms(timestamp: Any) -> int | None:
    return None if timestamp is None else round(timestamp.timestamp() * 1000)


def spark_row(batch: int, r: Any) -> Row:
    return (batch, r.kind, r.key, ms(r.window_start), ms(r.window_end), r.result,
            r.pane_index, r.pane_timing, r.pane_is_last, ms(r.eventTime), r.v)


def journal(checkpoint: Path) -> list[tuple[int, int, dict[int, int]]]:
    """(batch, Spark's watermark for it, the source's end offset per partition) from the
    offsets log."""
    out = []
    for path in (checkpoint / "offsets").iterdir():
        if path.name.isdigit():
            _, metadata, offsets = path.read_text().splitlines()[:3]
            (parts,) = json.loads(offsets)["topics"].values()
            out.append((int(path.name), json.loads(metadata)["batchWatermarkMs"],
                        {int(p): entry["offset"] for p, entry in parts.items()}))
    return sorted(out)


def replay(case: WindowCase, records: list[Record],
           batches: list[tuple[int, int, dict[int, int]]]) -> list[Row]:
    """The pure core over the same batches: each batch's watermark, then its records in
    event-time order (as the Spark operator feeds a key group's records)."""
    operator = case.operator()
    by_partition: dict[int, list[Record]] = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(r)
    read = dict.fromkeys(by_partition, 0)
    rows: list[Row] = []
    for batch, watermark, ends in batches:
        batch_records = [r for p, end in ends.items() for r in by_partition[p][read[p]:end]]
        read.update(ends)
        outputs = [operator.process_watermark(watermark)]
        outputs += [operator.process_element((r.key,), r.value, r.timestamp)
                    for r in sorted(batch_records, key=lambda r: r.timestamp)]
        rows += core_rows(batch, outputs)
    assert read == {p: len(rs) for p, rs in by_partition.items()}, "records left unread"
    return rows


def core_rows(batch: int, outputs: list[WindowOutput]) -> list[Row]:
    rows: list[Row] = []
    for out in outputs:
        for r in out.results:
            start, end = ((r.window.start, r.window.end) if isinstance(r.window, TimeWindow)
                          else (None, None))
            rows.append((batch, "result", r.key[0], start, end, r.result, r.pane.index,
                         r.pane.timing.value, r.pane.is_last, None, None))
        rows += [(batch, "late", e.key[0], None, None, None, None, None, None, e.timestamp,
                  e.value) for e in out.late]
    return rows


def assert_same(rows: list[Row], expected: list[Row],
                batches: list[tuple[int, int, dict[int, int]]]) -> None:
    spark, core = Counter(rows), Counter(expected)
    assert spark == core, (
        "Spark and the core differ;\nonly from Spark: "
        + "\n".join(map(str, sorted((spark - core).elements(), key=str)))
        + "\nonly from the core: "
        + "\n".join(map(str, sorted((core - spark).elements(), key=str)))
        + f"\nbatches (id, watermark, ends): {batches}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_spark_fires_what_the_core_fires_batch_by_batch(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None,
    case: WindowCase, seed: int,
) -> None:
    index = CASES.index(case)
    records = generate(1_000 * seed + index)
    rows, checkpoint = run_case(spark, kafka_bootstrap, topic(2), tmp_path, case, records,
                                max_offsets=2 + (seed + index) % 3)
    batches = journal(checkpoint)
    expected = replay(case, records, batches)
    assert_same(rows, expected, batches)
    # the input exercised what it is for: firings, a watermark repeated over batches
    assert any(kind == "result" for _, kind, *_ in expected)
    watermarks = [watermark for _, watermark, _ in batches]
    assert len(set(watermarks)) < len(watermarks)


def test_a_watermarks_records_over_several_batches_fire_flinks_panes(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path, rocksdb: None,
) -> None:
    """Issue case: 74,999 ms arrives after W = 75,000 in window [70 s, 80 s) of a 3 s
    ContinuousEventTimeTrigger; its interval timer (75,000) is at the watermark. The window's
    four records come one per batch, all under W = 75,000: Flink fires the timer at the next
    watermark, one pane with all four, never a pane per batch."""
    t = BASE
    def rec(offset: int, key: str, at: int, flag: bool = False) -> Record:
        return Record(0, key, offset, t + at, flag)
    records = [rec(0, "x", 75_000, True), rec(1, "x", 75_001),
               rec(2, "k", 74_999), rec(3, "k", 76_000), rec(4, "k", 77_000),
               rec(5, "k", 78_000),
               rec(6, "x", 76_500, True), rec(7, "x", 76_501),
               rec(8, "x", 100_000, True), rec(9, "x", 100_001), rec(10, "x", 100_002)]
    case = CASES[0]  # tumbling 10 s, ContinuousEventTimeTrigger(3 s), 5 s of lateness
    rows, checkpoint = run_case(spark, kafka_bootstrap, topic(1), tmp_path, case, records,
                                max_offsets=1)
    batches = journal(checkpoint)
    # the setting holds: k's four records were read one per batch, all at W = 75,000
    read_at = {ends[0] - 1: watermark for _, watermark, ends in batches}
    assert [read_at[offset] for offset in (2, 3, 4, 5)] == [t + 75_000] * 4
    assert_same(rows, replay(case, records, batches), batches)
    k_panes = [(result, index, timing, last)
               for _, kind, key, start, _, result, index, timing, last, _, _ in sorted(rows)
               if kind == "result" and key == "k" and start == t + 70_000]
    assert k_panes == [(4, 0, "EARLY", False), (4, 1, "EARLY", False),
                       (4, 2, "ON_TIME", False)]
