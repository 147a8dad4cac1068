"""Exactly once for windows (issue 9): Spark's own windowed count on the valve's combined
watermark (``flinkish.with_watermark``), in append mode into the flinkish sink (PostgreSQL),
SIGKILLed inside the sink's commit while windows are being emitted, then restarted from the
same checkpoint: every window is in the table once, with the count the produced data gives.

The input has three partitions: partition 0 on time, partition 1 a minute behind it, and
partition 2 a short burst further behind (90 s) that then falls silent. Only partition 2 going
IDLE (``idleTimeout``) lets the combined watermark past its last records, so the windows that
close mid-stream show that it did. Partitions 0 and 1 keep arriving while the first run
(processing-time trigger) reads them; the source is bounded (``endingOffsets``: their last
offsets; partition 2 an offset it never reaches, so it goes idle rather than finishes), so at
the end the combined watermark is MAX_WATERMARK and every window closes.

1. crash run (its own driver, ``integration/sink_query.py --windowed``): the sink's
   ``mid_commit`` failpoint fires in the first batch >= CRASH_FROM_EPOCH that emits windows,
   after the first of its decided transactions committed; the driver's whole process tree is
   SIGKILLed there;
2. restart run (a new driver, Trigger.AvailableNow) from the same checkpoint: Spark replays the
   crashed batch, whose commit finishes the recorded decision, and goes on to the end.

The aggregated stream has no marker rows, so the sink records Spark's event-time watermark for
each epoch and judges no row late; its exactly-once does not depend on either.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from checkpointing import CheckpointStorage, CheckpointStore
from checkpointing.query import query_id
from flinkish.demo.embedded_kafka import create_topic
from flinkish.demo.processes import kill_tree
from integration.kafka_helpers import produce
from integration.test_sink_crash import (
    HarnessError,
    TargetView,
    launch,
    pg_rows,
    poll,
    run_to_end,
    tail,
)

pytestmark = pytest.mark.integration

BASE = 1_700_000_000_000  # a multiple of the window
WINDOW_MS = 10_000
LAG_MS = {0: 0, 1: 60_000, 2: 90_000}  # partition 1 a minute behind; 2 further, then silent
PER_PARTITION = {0: 65, 1: 65, 2: 12}
FIRST = 4  # records of partitions 0 and 1 there before the query starts (with all of 2's)
CHUNK = 20  # then this many more of each as the crash run plans each batch
MAX_OFFSETS = 40  # batch 0 reads all there is at the start, later ones a whole chunk
IDLE_TIMEOUT = "3 seconds"  # partition 2 goes idle from batch 1 (batch 0 takes longer)
NEVER = 1_000_000  # partition 2's ending offset: never reached, so it goes idle
CRASH_POINT = "mid_commit"
CRASH_FROM_EPOCH = 2
CRASH_TIMEOUT = 300.0  # driver start-up and the batches up to the crash (~2 min on a busy host)
RESTART_TIMEOUT = 300.0


def record(partition: int, i: int) -> tuple[int, bytes, bytes, int]:
    return (partition, f"k{partition}-{i}".encode(), b"{}",
            BASE - LAG_MS[partition] + i * 1_000)


def chunk(k: int) -> list[tuple[int, bytes, bytes, int]]:
    """Chunk 0: what is there when the query starts; chunk k: the k-th batch's new records
    (of partitions 0 and 1 only)."""
    if k == 0:
        return [record(p, i) for p in (0, 1) for i in range(FIRST)] + [
            record(2, i) for i in range(PER_PARTITION[2])]
    first = FIRST + (k - 1) * CHUNK
    return [record(p, i) for i in range(first, first + CHUNK) for p in (0, 1)
            if i < PER_PARTITION[p]]


CHUNKS = 1 + -(-(max(PER_PARTITION[0], PER_PARTITION[1]) - FIRST) // CHUNK)


def truth() -> Counter[tuple[int, int]]:
    """(window start ms, partition) -> records produced."""
    return Counter((ts - ts % WINDOW_MS, p) for p, n in PER_PARTITION.items()
                   for _, _, _, ts in (record(p, i) for i in range(n)))


def table_windows(view: TargetView) -> list[tuple[int, int, int, int]]:
    """(window start ms, window end ms, partition, count) of every row of the table."""
    try:
        found = pg_rows(view.dsn, sql.SQL(
            'SELECT window_start, window_end, "partition", "count" FROM {}').format(
            sql.Identifier(view.table)))
    except Exception as exc:  # the table is created by the sink's first batch
        if "does not exist" in str(exc):
            return []
        raise
    return sorted((int(s.timestamp() * 1000), int(e.timestamp() * 1000), int(p), int(c))
                  for s, e, p, c in found)


def reports(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The progress reports a run wrote, by (run id, batch id)."""
    if not path.exists():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        if line.strip():
            report = json.loads(line)
            found[(report["runId"], int(report["batchId"]))] = report
    return found


def dropped(found: dict[tuple[str, int], dict[str, Any]]) -> int:
    return sum(int(op.get("numRowsDroppedByWatermark", 0))
               for report in found.values() for op in report.get("stateOperators", []))


def partition_statuses(checkpoint: Path, topic: str, partition: int) -> dict[int, str | None]:
    """batch -> the partition's status in the end offset Spark logged for it."""
    statuses = {}
    offsets = checkpoint / "offsets"
    for entry in sorted(offsets.iterdir()) if offsets.is_dir() else []:
        if entry.name.isdigit():
            offset = json.loads(entry.read_text().splitlines()[-1])
            statuses[int(entry.name)] = offset["topics"][topic][str(partition)].get("status")
    return statuses


def decided(checkpoint: Path, epoch: int) -> list[str] | None:
    """The gids the sink's checkpoint store records as epoch ``epoch``'s decision (None: no
    decision), read without claiming the store."""
    store = CheckpointStore.reader(CheckpointStorage.open(str(checkpoint / "flinkish")))
    recorded = store.completed(epoch) or store.pending(epoch)
    return None if recorded is None else sorted(d["gid"] for d in recorded.state["decision"])


def batches(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if (
        directory.is_dir()) else []


def test_windows_exactly_once_after_a_crash_inside_the_commit(
    kafka_bootstrap: str, postgres_dsn: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    topic = f"window-crash-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, len(PER_PARTITION))
    view = TargetView("postgres", postgres_dsn, f"windows_{topic.rsplit('-', 1)[1]}",
                      tmp_path / "unused")
    checkpoint = tmp_path / "checkpoint"
    marker = tmp_path / "failpoint"
    produce(kafka_bootstrap, topic, chunk(0))
    ending = {topic: {"0": PER_PARTITION[0], "1": PER_PARTITION[1], "2": NEVER}}
    job: dict[str, Any] = {
        "name": "windows", "bootstrap": kafka_bootstrap, "topic": topic,
        "checkpoint": str(checkpoint), "target": "postgres", "dsn": postgres_dsn,
        "table": view.table, "max_offsets": MAX_OFFSETS, "windowed": True,
        "ending_offsets": ending, "idle_timeout": IDLE_TIMEOUT,
        "progress": str(tmp_path / "progress-crash.jsonl"),
    }

    # -- 1. the crash run: processing-time trigger while partitions 0 and 1 keep arriving,
    # a chunk as each batch is planned (so they never go idle, as they would if nothing
    # arrived for IDLE_TIMEOUT, and the input is not all there before partition 2 goes idle)
    crash_job = {
        **job, "trigger": "processing",
        "until_offsets": {topic: {"0": PER_PARTITION[0], "1": PER_PARTITION[1]}},
        "failpoint": {"point": CRASH_POINT, "marker": str(marker),
                      "from_epoch": CRASH_FROM_EPOCH},
    }
    (tmp_path / "crash-jobs.json").write_text(json.dumps([crash_job], indent=1))
    crash_log = tmp_path / "crash.log"
    produced = [1]  # the next chunk
    producer_error: list[BaseException] = []
    stop = threading.Event()

    def keep_producing() -> None:
        try:
            while not stop.wait(0.1) and produced[0] < CHUNKS:
                planned = batches(checkpoint / "offsets")
                if planned and produced[0] <= max(planned) + 1:
                    produce(kafka_bootstrap, topic, chunk(produced[0]))
                    produced[0] += 1
        except BaseException as exc:
            producer_error.append(exc)

    producer = threading.Thread(target=keep_producing, daemon=True)
    proc = launch(["--jobs", str(tmp_path / "crash-jobs.json"), "--master", "local[2]",
                   "--timeout", str(CRASH_TIMEOUT)], crash_log)
    producer.start()
    try:
        poll(lambda: marker.exists() and marker.read_text().strip(), CRASH_TIMEOUT,
             f"the crash run to reach {CRASH_POINT}", proc, crash_log)
    finally:
        stop.set()
        kill_tree(proc.pid)
        proc.wait()
        producer.join(60)
    if producer.is_alive() or producer_error:
        raise HarnessError(f"producing the input failed: {producer_error}")
    for k in range(produced[0], CHUNKS):  # the rest of the input, for the restart
        produce(kafka_bootstrap, topic, chunk(k))
    crash_seconds = time.monotonic() - started

    query = query_id(str(checkpoint))
    crash_epoch = max(batches(checkpoint / "offsets"))
    at_crash: dict[str, Any] = {
        "failpoint": marker.read_text().split()[0],
        "epoch": crash_epoch,
        "spark_commits": batches(checkpoint / "commits"),
        "decided": decided(checkpoint, crash_epoch),
        "lingering": view.lingering(query),
        "windows": table_windows(view),
        "partition_2": partition_statuses(checkpoint, topic, 2),
        "chunks_before_kill": produced[0] - 1,
    }
    expected = truth()
    # the crash landed where it was meant to: inside the commit of a batch emitting windows,
    # with the first decided transaction committed and the others, if any, still prepared
    # (how many write tasks have closed windows in the batch depends on which windows close
    # in it: the partly committed epoch with several is test_sink_crash.py's mid_commit case)
    problems = []
    if at_crash["failpoint"] != CRASH_POINT or crash_epoch < CRASH_FROM_EPOCH:
        problems.append("not the failpoint / batch meant")
    if crash_epoch in at_crash["spark_commits"]:
        problems.append("Spark committed the crashed batch")
    decision = at_crash["decided"] or []
    if not decision or len(at_crash["lingering"]) != len(decision) - 1:
        problems.append("expected decided transactions, all but the first still prepared")
    if not at_crash["windows"] or len(at_crash["windows"]) >= len(expected):
        problems.append("expected some windows committed and some left for the restart")
    if problems:
        raise HarnessError(f"the crash did not land as intended: {problems}\n"
                           f"{json.dumps(at_crash, indent=1, default=str)}\n{tail(crash_log)}")

    # -- 2. the restart: the same checkpoint, to the end of the bounded input
    restart_log = tmp_path / "restart.log"
    restart_job = {**job, "trigger": "available-now",
                   "progress": str(tmp_path / "progress-restart.jsonl")}
    (tmp_path / "restart-jobs.json").write_text(json.dumps([restart_job], indent=1))
    code, results = run_to_end(["--jobs", str(tmp_path / "restart-jobs.json"), "--master",
                                "local[2]", "--timeout", str(RESTART_TIMEOUT)],
                               restart_log, RESTART_TIMEOUT + 60)
    seconds = time.monotonic() - started
    for p in (0, 1):  # else the combined watermark ran ahead of them: a harness problem
        statuses = partition_statuses(checkpoint, topic, p)
        if "IDLE" in statuses.values():
            raise HarnessError(f"partition {p} went idle (it did not get its chunk within "
                               f"{IDLE_TIMEOUT}): {statuses}")
    print(f"\ncrash in batch {crash_epoch} after {crash_seconds:.0f} s with "
          f"{len(at_crash['windows'])} of {len(expected)} windows committed; total "
          f"{seconds:.0f} s", file=sys.stderr)
    if not results:
        raise HarnessError(f"no result from the restart run (exit {code}):\n{tail(restart_log)}")
    assert results[0]["ok"], f"the restarted query failed:\n{results[0]['error']}"

    # every window once, with the count the produced data gives
    rows = table_windows(view)
    keys = [(start, p) for start, _, p, _ in rows]
    twice = sorted(k for k, n in Counter(keys).items() if n > 1)
    assert not twice, f"windows in the table more than once: {twice}"
    assert all(end - start == WINDOW_MS for start, end, _, _ in rows), rows
    counted = {(start, p): count for start, _, p, count in rows}
    wrong = sorted((key, counted[key], n) for key, n in expected.items()
                   if key in counted and counted[key] != n)
    assert counted == dict(expected), (
        f"missing {sorted(set(expected) - set(counted))}, "
        f"unexpected {sorted(set(counted) - set(expected))}, "
        f"wrong counts (window, counted, produced) {wrong}"
    )
    # the windows committed before the crash are still there, unchanged
    assert set(at_crash["windows"]) <= set(rows)
    # the crashed batch's decision was committed, not the replay's pre-commits
    assert decided(checkpoint, crash_epoch) == decision
    assert view.lingering(query) == [], "prepared transactions of the query linger"
    # nothing dropped as late, in either run; partition 2 went idle and released the
    # watermark (without that, no window after its last record could have closed before the
    # end of the input, and the crash run had committed some)
    found = reports(tmp_path / "progress-crash.jsonl") | reports(
        tmp_path / "progress-restart.jsonl")
    assert found, "no progress reports"
    assert dropped(found) == 0, "rows dropped by the watermark"
    assert "IDLE" in at_crash["partition_2"].values(), at_crash["partition_2"]
    published = pg_rows(view.dsn, sql.SQL(
        "SELECT epoch FROM {} WHERE query = %s ORDER BY epoch").format(
        sql.Identifier(f"{view.table}_flinkish_epochs")), query)
    assert [e for (e,) in published] == batches(checkpoint / "commits"), "published epochs"
