"""Crash injection for ``target=kafka``: SIGKILL the Spark driver of a Kafka -> Kafka query at
each step of the two-phase commit, restart it from its checkpoint, and read every output
topic back through the committed view (:mod:`integration.kafka_committed`): every input
record exactly once, and no transaction left open (no record without its marker, last stable
offset = high watermark).

As in :mod:`integration.test_sink_crash` (whose harness this uses), the cases share drivers:
one run in which every case's query stops at its own failpoint in batch CRASH_EPOCH (batch 0
committed) and the driver's process tree is SIGKILLed, then one run that restarts them all
from their checkpoints to the end of their input. A case stopped at ``task_write`` leaves its
write tasks' transactions open (the replay's producers fence them); ``after_decision`` and
``mid_commit`` leave decided transactions open (the replay writes nothing for the epoch and
commits them); ``before_checkpoint`` and ``after_checkpoint`` leave them committed (the
replay's EndTxn COMMIT repeats and succeeds).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from flinkish.demo.embedded_kafka import create_topic
from flinkish.demo.processes import kill_tree
from integration.kafka_committed import ABORTED, OPEN, Record, partition_view, settled_values
from integration.kafka_helpers import produce
from integration.test_sink_crash import (
    RETRY_TRANSIENT,
    HarnessError,
    launch,
    marker_written,
    poll,
    run_to_end,
)

pytestmark = pytest.mark.integration

PARTITIONS = 2
PER_PARTITION = 60
MAX_OFFSETS = 40  # records per batch over all partitions: batches 0..2
CRASH_EPOCH = 1
OUT_PARTITIONS = 3
POINTS = ("task_write", "before_decision", "after_decision", "mid_commit",
          "before_checkpoint", "after_checkpoint")
BASE_TS = 1_700_000_000_000


def _input_topic(bootstrap: str) -> tuple[str, list[bytes]]:
    topic = f"ksink-in-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    records = [(p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), BASE_TS + i * 1_000 + p)
               for i in range(PER_PARTITION) for p in range(PARTITIONS)]
    produce(bootstrap, topic, records)
    return topic, [r[2] for r in records]


def _job(bootstrap: str, topic: str, root: Path, point: str) -> dict[str, Any]:
    out = f"ksink-out-{point}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, out, OUT_PARTITIONS)
    return {"name": point, "bootstrap": bootstrap, "topic": topic, "target": "kafka",
            "out_topic": out, "checkpoint": str(root / point / "cp"),
            "max_offsets": MAX_OFFSETS}


def _log(bootstrap: str, topic: str) -> list[Record]:
    """Every record of the output topic with its fate."""
    return [r for p in range(OUT_PARTITIONS) for r in partition_view(bootstrap, topic, p)]


@pytest.fixture(scope="module")
def crashed(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, Any]:
    """Every case crashed at its point, then restarted to the end: what each left."""
    root = tmp_path_factory.mktemp("kafka-crash")
    topic, values = _input_topic(kafka_bootstrap)
    jobs = [_job(kafka_bootstrap, topic, root, point) for point in POINTS]
    for job in jobs:
        Path(job["checkpoint"]).parent.mkdir(parents=True)
    markers = {job["name"]: Path(job["checkpoint"]).parent / "failpoint" for job in jobs}
    crash_jobs = [{**job, "failpoint": {"point": job["name"], "marker": str(markers[job["name"]]),
                                        "from_epoch": CRASH_EPOCH}} for job in jobs]
    (root / "crash-jobs.json").write_text(json.dumps(crash_jobs))
    log = root / "crash.log"
    timeout = 40.0 * len(jobs)
    proc = launch(["--jobs", str(root / "crash-jobs.json"), "--master",
                   f"local[{2 * PARTITIONS * len(jobs)}]", "--start-window", "2",
                   "--timeout", str(timeout), *RETRY_TRANSIENT,
                   "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=5"], log)
    try:
        poll(lambda: all(marker_written(m) for m in markers.values()), timeout,
             "every query to reach its failpoint", proc, log)
    finally:
        kill_tree(proc.pid)
        proc.wait()
    after_crash = {job["name"]: _log(kafka_bootstrap, job["out_topic"]) for job in jobs}
    (root / "restart-jobs.json").write_text(json.dumps(jobs))
    _, results = run_to_end(["--jobs", str(root / "restart-jobs.json"), "--master",
                                f"local[{PARTITIONS * 2}]", "--start-window", "2",
                                "--timeout", str(60.0 * len(jobs)), *RETRY_TRANSIENT],
                               root / "restart.log", 60.0 * len(jobs) + 60)
    if len(results) != len(jobs):
        raise HarnessError(f"restart gave {len(results)} results of {len(jobs)}\n"
                           + (root / "restart.log").read_text(errors="replace")[-3000:])
    return {
        "values": values, "jobs": {job["name"]: job for job in jobs},
        "markers": {name: m.read_text().split()[0] for name, m in markers.items()},
        "after_crash": after_crash, "results": {r["name"]: r for r in results},
    }


@pytest.mark.parametrize("point", POINTS)
def test_every_record_exactly_once_after_a_crash(crashed: dict[str, Any], kafka_bootstrap: str,
                                                 point: str) -> None:
    assert crashed["markers"][point] == point
    result = crashed["results"][point]
    assert result["ok"], result["error"]
    out = crashed["jobs"][point]["out_topic"]
    assert sorted(settled_values(kafka_bootstrap, out, OUT_PARTITIONS)) == sorted(
        crashed["values"])
    crashed_open = sum(1 for r in crashed["after_crash"][point] if r.fate == OPEN)
    if point in ("task_write", "before_decision", "after_decision", "mid_commit"):
        # the crash left epoch 1's rows in open transactions: aborted (undecided) or
        # committed (decided) by the restart, never written twice
        assert crashed_open > 0, f"{point}: the crash left no open transaction"
    if point in ("task_write", "before_decision"):
        aborted = sum(1 for r in _log(kafka_bootstrap, out) if r.fate == ABORTED)
        assert aborted >= crashed_open
