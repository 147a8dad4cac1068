"""Exactly once for ``flinkish.windows`` (issue 21): Flink's window operator (a keyed tumbling
count with allowed lateness and the late side output) on the combined watermark, into
PostgreSQL in the sink's upsert mode, SIGKILLed between the firing and its commit (the
epoch's decision recorded, nothing committed), then restarted from the same checkpoint: every
window's row is there once, with its final count and its last pane, and every late element
once as a late row.

The input has two partitions: partition 0 on time, partition 1 a minute behind it, so the
combined watermark W is partition 1's. Partition 1 also holds out-of-order records at several
depths behind its own progress: some come while their window is past its end but within the
allowed lateness (a LATE pane re-fires it), some beyond it (a late row). Which one a record
becomes depends on W in the batch that read it, so the expectation is computed from what was
produced and Spark's offsets log (each batch's offsets and ``batchWatermarkMs``, the W the
operator applies before the batch's records) with the window operator's rules; the scenario
checks that both kinds happened. The source is bounded (``endingOffsets``), so at the end W is
MAX_WATERMARK and every window fires.

1. crash run (its own driver, ``integration/sink_query.py --flink-windows``, AvailableNow): the
   sink's ``after_decision`` failpoint fires in the first batch >= CRASH_FROM_EPOCH whose
   decision names a transaction (``min_transactions``), before any of them is committed; the
   driver's process tree is SIGKILLed there;
2. restart run (a new driver, AvailableNow) from the same checkpoint: Spark replays the crashed
   batch (its state from the batch before), whose commit finishes the recorded decision, and
   goes on to the end.

The crashed run leaves decided transactions prepared, holding the row locks of the keys the
replay upserts again: the sink resolves them before the replay's tasks write (Flink's
recoverAndCommit at initializeState), or the replay would wait on them forever. Should that
regress, the test sees the wait in ``pg_locks`` and fails at once (ReplayBlocked).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

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
    read_results,
    stop_after_exit,
    tail,
)
from integration.test_window_crash import batches, decided, dropped, reports

pytestmark = pytest.mark.integration

BASE = 1_700_000_000_000  # a multiple of the window
WINDOW_MS = 10_000
LATENESS_MS = 20_000
LAG_MS = {0: 0, 1: 60_000}  # partition 1 a minute behind partition 0: it holds W
REGULAR = 40  # in-order records per partition, one a second
KEYS = 3  # keys per partition
# after partition 1's regular record i, an out-of-order one this far behind record i's time:
# within the lateness of W (a LATE pane, or on time if W lags), then beyond it (a late row)
OUT_OF_ORDER = dict(zip(range(8, REGULAR, 3), [4_000, 12_000, 20_000, 28_000, 45_000,
                                                90_000] * 2, strict=False))
MAX_OFFSETS = 16  # ~6 batches
CRASH_POINT = "after_decision"
CRASH_FROM_EPOCH = 3
CRASH_TIMEOUT = 240.0
RESTART_TIMEOUT = 240.0

Record = tuple[int, int, str, int]  # partition, offset, key, event time (ms)


def produced() -> list[Record]:
    """Every record, with the offset Kafka gives it (each partition in order from 0)."""
    records = []
    for p in LAG_MS:
        offset = 0
        for i in range(REGULAR):
            ts = BASE - LAG_MS[p] + i * 1_000
            records.append((p, offset, f"k{i % KEYS}", ts))
            offset += 1
            if p == 1 and i in OUT_OF_ORDER:
                records.append((p, offset, f"k{(i + 1) % KEYS}", ts - OUT_OF_ORDER[i]))
                offset += 1
    return records


def batch_log(checkpoint: Path, topic: str) -> dict[int, tuple[int, dict[int, int]]]:
    """batch -> (its watermark, each partition's end offset) from Spark's offsets log."""
    found = {}
    for b in batches(checkpoint / "offsets"):
        lines = (checkpoint / "offsets" / str(b)).read_text().splitlines()
        metadata, offset = json.loads(lines[1]), json.loads(lines[-1])
        found[b] = (int(metadata["batchWatermarkMs"]),
                    {int(p): int(v["offset"]) for p, v in offset["topics"][topic].items()})
    return found


def expected(records: list[Record], log: dict[int, tuple[int, dict[int, int]]],
             partial: bool = False) -> dict[str, Any]:
    """What the window operator must have made of ``records`` given the batches that read
    them (``partial``: of those read so far): per window (partition, key, start) its count, its
    last pane's index and timing (an ON_TIME firing if records came before W passed its end,
    then one LATE firing per record after), and the late elements (partition, offset, key,
    time); plus the batches that fired something."""
    read_in: dict[tuple[int, int], int] = {}
    start = dict.fromkeys(LAG_MS, 0)
    for b, (_, ends) in sorted(log.items()):
        for p, end in ends.items():
            for offset in range(start[p], end):
                read_in[(p, offset)] = b
            start[p] = max(start[p], end)
    counts: Counter[tuple[int, str, int]] = Counter()
    late_firings: Counter[tuple[int, str, int]] = Counter()
    on_time: set[tuple[int, str, int]] = set()
    late: list[Record] = []
    firing_batches: set[int] = set()
    late_batches: set[int] = set()
    for p, offset, key, ts in records:
        read = read_in.get((p, offset))
        if read is None and partial:
            continue
        if read is None:
            raise HarnessError(f"record {p}:{offset} was read by no batch: {log}")
        b, w = read, log[read][0]
        window = (p, key, ts - ts % WINDOW_MS)
        max_timestamp = window[2] + WINDOW_MS - 1
        if max_timestamp + LATENESS_MS <= w:  # isWindowLate
            late.append((p, offset, key, ts))
            late_batches.add(b)
            continue
        counts[window] += 1
        if max_timestamp <= w:  # the trigger fires on the element
            late_firings[window] += 1
            firing_batches.add(b)
        else:
            on_time.add(window)
    for window in on_time:  # the ON_TIME pane: in the first batch whose W passes its end
        max_timestamp = window[2] + WINDOW_MS - 1
        firing_batches.add(min([b for b, (w, _) in log.items() if w >= max_timestamp],
                               default=-1))
    panes = {window: (n, int(window in on_time) + late_firings[window] - 1,
                      "LATE" if late_firings[window] else "ON_TIME")
             for window, n in counts.items()}
    return {"panes": panes, "late": sorted(late), "firing_batches": firing_batches,
            "late_batches": late_batches,
            "late_firings": sum(late_firings.values())}


def table(view: TargetView) -> list[tuple[Any, ...]]:
    """Every row of the table: (kind, partition, key, window start ms, window end ms, count,
    pane index, timing, last, late time ms, offset)."""
    try:
        found = pg_rows(view.dsn, sql.SQL(
            'SELECT kind, "partition", key, window_start, window_end, "count", pane_index, '
            'pane_timing, pane_is_last, late_time, "offset" FROM {}').format(
            sql.Identifier(view.table)))
    except Exception as exc:  # the driver creates the table before its query starts
        if "does not exist" in str(exc):
            return []
        raise

    def millis(t: Any) -> int | None:
        return None if t is None else round(t.timestamp() * 1000)

    return sorted(((o, p, k, millis(s), millis(e), c, i, t, last, millis(lt), off)
                   for o, p, k, s, e, c, i, t, last, lt, off in found), key=repr)


class ReplayBlocked(AssertionError):
    """The restart cannot finish: a replayed write task waits on a lock that only the end of
    its own epoch would release."""


def blocked_by_prepared(dsn: str, query: str) -> list[tuple[str, str]]:
    """(write task's session, prepared transaction it waits on) for every session of the
    query's write tasks blocked by a lock of one of the query's prepared transactions (no
    process holds those: only a COMMIT or ROLLBACK PREPARED releases them)."""
    return [(task, gid) for task, gid in pg_rows(
        dsn,
        "SELECT a.application_name, x.gid FROM pg_stat_activity a "
        "JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted AND l.locktype = 'transactionid' "
        "JOIN pg_prepared_xacts x ON x.transaction = l.transactionid "
        "WHERE a.application_name LIKE %s AND x.gid LIKE %s",
        f"flinkish:{query}:%", f"flinkish:{query}:%")]


def test_flink_windows_exactly_once_after_a_crash_between_firing_and_commit(
    kafka_bootstrap: str, postgres_dsn: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    topic = f"windows-crash-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, len(LAG_MS))
    records = produced()
    produce(kafka_bootstrap, topic, [(p, key.encode(), b"{}", ts) for p, _, key, ts in records])
    ends = Counter(p for p, _, _, _ in records)
    view = TargetView("postgres", postgres_dsn, f"flink_windows_{topic.rsplit('-', 1)[1]}",
                      tmp_path / "unused")
    checkpoint = tmp_path / "checkpoint"
    marker = tmp_path / "failpoint"
    job: dict[str, Any] = {
        "name": "flink-windows", "bootstrap": kafka_bootstrap, "topic": topic,
        "checkpoint": str(checkpoint), "target": "postgres", "dsn": postgres_dsn,
        "table": view.table, "max_offsets": MAX_OFFSETS, "flink_windows": True,
        "allowed_lateness": f"{LATENESS_MS // 1000} seconds",
        "ending_offsets": {topic: {str(p): n for p, n in ends.items()}},
    }

    # -- 1. the crash run
    crash_job = {**job, "progress": str(tmp_path / "progress-crash.jsonl"),
                 "failpoint": {"point": CRASH_POINT, "marker": str(marker),
                               "from_epoch": CRASH_FROM_EPOCH, "min_transactions": 1}}
    (tmp_path / "crash-jobs.json").write_text(json.dumps([crash_job], indent=1))
    crash_log = tmp_path / "crash.log"
    proc = launch(["--jobs", str(tmp_path / "crash-jobs.json"), "--master", "local[2]",
                   "--timeout", str(CRASH_TIMEOUT)], crash_log)
    try:
        poll(lambda: marker.exists() and marker.read_text().strip(), CRASH_TIMEOUT,
             f"the crash run to reach {CRASH_POINT}", proc, crash_log)
    finally:
        kill_tree(proc.pid)
        proc.wait()
    crash_seconds = time.monotonic() - started

    query = query_id(str(checkpoint))
    crash_epoch = max(batches(checkpoint / "offsets"))
    at_crash: dict[str, Any] = {
        "failpoint": marker.read_text().split()[0],
        "epoch": crash_epoch,
        "spark_commits": batches(checkpoint / "commits"),
        "decided": decided(checkpoint, crash_epoch),
        "lingering": view.lingering(query),
        "rows": table(view),
    }
    # the crash landed where it was meant to: in a batch with output (firings, or late rows
    # alone when no window's end passed in it), its decision recorded and every transaction it
    # names still prepared (holding its rows' locks)
    truth_so_far = expected(records, batch_log(checkpoint, topic), partial=True)
    problems = []
    if at_crash["failpoint"] != CRASH_POINT or crash_epoch < CRASH_FROM_EPOCH:
        problems.append("not the failpoint / batch meant")
    if crash_epoch in at_crash["spark_commits"]:
        problems.append("Spark committed the crashed batch")
    if crash_epoch not in truth_so_far["firing_batches"] | truth_so_far["late_batches"]:
        problems.append("the crashed batch has no output")
    decision = at_crash["decided"] or []
    if not decision or sorted(str(t) for t in at_crash["lingering"]) != sorted(decision):
        problems.append("expected the decided transactions, all still prepared and no other")
    if problems:
        raise HarnessError(f"the crash did not land as intended: {problems}\n"
                           f"{json.dumps(at_crash, indent=1, default=str)}\n{tail(crash_log)}")

    # -- 2. the restart: the same checkpoint, to the end of the bounded input
    restart_log = tmp_path / "restart.log"
    restart_job = {**job, "progress": str(tmp_path / "progress-restart.jsonl")}
    (tmp_path / "restart-jobs.json").write_text(json.dumps([restart_job], indent=1))
    proc = launch(["--jobs", str(tmp_path / "restart-jobs.json"), "--master", "local[2]",
                   "--timeout", str(RESTART_TIMEOUT)], restart_log)
    try:
        blocked = poll(lambda: blocked_by_prepared(postgres_dsn, query) or (
            proc.poll() is not None), RESTART_TIMEOUT + 60, "the restart run to end", None,
            restart_log)
    finally:
        stop_after_exit(proc)
    if blocked is not True:
        raise ReplayBlocked(
            f"the replay of batch {crash_epoch} waits on the row locks of the crashed run's "
            f"still prepared transactions, which the sink should have resolved before the "
            f"replay's write tasks started (waiting task, prepared transaction): {blocked}")
    code, results = proc.returncode, read_results(restart_log)
    if not results:
        raise HarnessError(f"no result from the restart run (exit {code}):\n{tail(restart_log)}")
    assert results[0]["ok"], f"the restarted query failed:\n{results[0]['error']}"

    truth = expected(records, batch_log(checkpoint, topic))
    print(f"\ncrash in batch {crash_epoch} after {crash_seconds:.0f} s with "
          f"{len(at_crash['rows'])} rows committed; {len(truth['panes'])} windows, "
          f"{truth['late_firings']} LATE firings, {len(truth['late'])} late rows; total "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    # the scenario happened: late elements both re-fired windows and came out as late rows
    if not truth["late_firings"] or not truth["late"]:
        raise HarnessError(f"no LATE pane or no late row expected: {truth}")

    rows = table(view)
    panes = [r for r in rows if r[0] == "result"]
    late = [r for r in rows if r[0] == "late"]
    assert len(panes) + len(late) == len(rows), rows
    # every window once, with its final count and its last pane (index and timing)
    windows = Counter((p, k, s) for _, p, k, s, *_ in panes)
    assert [w for w, n in windows.items() if n > 1] == [], "windows more than once"
    assert all(e - s == WINDOW_MS for _, _, _, s, e, *_ in panes), panes
    found = {(p, k, s): (c, i, t) for _, p, k, s, _, c, i, t, *_ in panes}
    wrong = sorted((w, found.get(w), want) for w, want in truth["panes"].items()
                   if found.get(w) != want)
    assert found == truth["panes"], (
        f"(window, found (count, pane index, timing), expected): {wrong}; unexpected "
        f"{sorted(set(found) - set(truth['panes']))}")
    assert all(last is False for *_, last, _, _ in panes), "a last pane with lateness > 0"
    # every late element once, as a late row
    assert sorted((p, off, k, lt) for _, p, k, _, _, _, _, _, _, lt, off in late) == (
        truth["late"])
    # nothing dropped: every produced record is counted in a window or is a late row
    assert sum(c for c, _, _ in found.values()) + len(late) == len(records)
    progress = reports(tmp_path / "progress-crash.jsonl") | reports(
        tmp_path / "progress-restart.jsonl")
    assert progress, "no progress reports"
    assert dropped(progress) == 0, "rows dropped by the watermark"
    # the rows committed before the crash were final or later replaced, never duplicated;
    # the crashed batch's decision was committed, not the replay's pre-commits
    assert decided(checkpoint, crash_epoch) == decision
    assert view.lingering(query) == [], "prepared transactions of the query linger"
    assert pg_rows(postgres_dsn, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                   f"%:{query}:%") == []
    published = pg_rows(view.dsn, sql.SQL(
        "SELECT epoch FROM {} WHERE query = %s ORDER BY epoch").format(
        sql.Identifier(f"{view.table}_flinkish_epochs")), query)
    assert [e for (e,) in published] == batches(checkpoint / "commits"), "published epochs"
