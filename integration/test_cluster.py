"""Source and sink on a Spark cluster with separate executor processes: master
``local-cluster[2,1,1024]`` (two executor JVMs, each with its own Python workers, none in the
driver's process), with every flinkish location on S3 (the loopback server of
``integration/s3_server.py``): the source's ``checkpointing.location`` (the read tasks' hand-over
records), the sink's store (``checkpointing.location``) and the Parquet target's ``path``.
Spark's own ``checkpointLocation`` stays local: pip's PySpark has no Hadoop S3 filesystem, and
on one host local-cluster's executors see it anyway.

A cluster driver takes ~30 s to start on 2 cores and the CI budget is tight, so ONE driver runs
every query of the module, one starting after the other:

1. a source whose ``checkpointing.location`` is a local path: the guard rail must refuse it at
   query start;
2. source -> sink into Parquet, losing an executor mid-batch: the first write task of batch 1
   stops at the ``task_write`` failpoint (armed ``once``), the test SIGKILLs the executor JVM
   running it together with its Python workers, and Spark reruns the lost tasks on the executor
   left (the rerun passes the failpoint);
3. source -> sink into PostgreSQL (started once the Parquet query stopped there);
4. source -> ``flinkish.with_watermark`` -> windowed count -> sink: exact counts per window.

For 2 and 3: every row there once, nothing prepared or staged left, every read task's hand-over
record on S3, the published watermark never went back. Only one executor is killed: a second
kill would leave no executor until the worker's replacement JVM is up (~20 s of CI time). A
write process killed with a PostgreSQL transaction open is ``test_sink_crash``'s retry case.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from checkpointing.query import query_id
from flinkish.demo.processes import kill_tree, tree
from integration.s3_server import SECRET_KEY, S3Server
from integration.test_sink_crash import (
    BASE_TS,
    CRASH_EPOCH,
    PARTITIONS,
    PER_PARTITION,
    RETRY_TRANSIENT,
    TARGETS,
    Case,
    HarnessError,
    TargetView,
    _input_topic,
    _listing,
    check_delivered_once,
    launch,
    marker_written,
    poll,
    read_results,
    record_crash,
    tail,
)
from integration.test_window_crash import table_windows

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

MASTER = "local-cluster[2,1,1024]"
MAX_OFFSETS = PARTITIONS * PER_PARTITION // 2  # batches 0 and 1 (the executor dies in 1)
LAST_EPOCH = 1
WINDOW_MS = 10_000
RUN_TIMEOUT = 300.0  # the driver's start-up and all its queries
PRODUCED = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
#: the driver-side reader's warning when a read task's hand-over record is missing
RE_READ = "no watermark state for"
GUARD = "is on the local filesystem"


@dataclass
class Kill:
    """A source -> sink query that loses the executor under a write task stopped at its
    failpoint."""

    case: Case
    stopped_pid: int = 0  # the Python worker that reached the failpoint
    executor: int = 0  # its executor JVM
    killed: list[int] = field(default_factory=list)  # the JVM and its Python processes
    error: str | None = None


KILLED = "parquet"  # the query that loses an executor


@dataclass
class ClusterRun:
    cases: dict[str, Case]
    kill: Kill
    windows: TargetView
    windows_checkpoint: Path
    results: dict[str, dict[str, Any]]
    log: Path
    seconds: float
    bucket: str


def executor_of(pid: int, driver: int) -> int | None:
    """The executor JVM (``CoarseGrainedExecutorBackend``) of the driver's process tree that
    ``pid`` (a Python worker) runs under, or None."""
    processes = tree(driver)
    while pid in processes:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        if b"CoarseGrainedExecutorBackend" in command:
            return pid
        pid = processes[pid][0]
    return None


def _kill_executor(kill: Kill, proc: Any, log: Path) -> None:
    """Once the query stopped at its failpoint: SIGKILL that task's executor JVM and its
    Python daemon and workers (not the driver, whose process group the JVM shares)."""
    marker = kill.case.work / "failpoint"
    poll(lambda: marker_written(marker), RUN_TIMEOUT, f"{kill.case.name} to reach task_write",
         proc, log)
    kill.stopped_pid = int(marker.read_text().split()[1])
    executor = executor_of(kill.stopped_pid, proc.pid)
    if executor is None:
        raise HarnessError(f"process {kill.stopped_pid} at the failpoint runs under no "
                           f"executor JVM of the driver (gone already?)")
    kill.executor = executor
    kill.killed = sorted(tree(executor))
    kill.case.crash.update(record_crash(kill.case))
    kill_tree(executor, led_groups_only=True)


@pytest.fixture(scope="module")
def cluster_run(kafka_bootstrap: str, postgres_dsn: str, s3: S3Server,
                tmp_path_factory: pytest.TempPathFactory) -> ClusterRun:
    topic = _input_topic(kafka_bootstrap, "cluster")
    token = topic.rsplit("-", 1)[1]
    bucket = f"cluster-{token}"
    s3.create_bucket(bucket)
    root = tmp_path_factory.mktemp("cluster")
    cases = {}
    for kind in sorted(TARGETS, key=lambda k: k != KILLED):
        out: Path | str = s3.uri(bucket, f"{kind}/out")
        view = TargetView(kind, postgres_dsn, f"cluster_{token}", out)
        cases[kind] = Case("cluster", view, root / kind, topic,
                           source_state=s3.uri(bucket, f"{kind}/source-state"),
                           store=s3.uri(bucket, f"{kind}/sink-store"))
    kill = Kill(cases[KILLED])
    windows = TargetView("postgres", postgres_dsn, f"cluster_windows_{token}", root / "unused")
    jobs: list[dict[str, Any]] = [
        # first, as it fails at once: a local source location on a cluster master
        {"name": "guard", "bootstrap": kafka_bootstrap, "topic": topic, "target": "parquet",
         "checkpoint": str(root / "guard" / "checkpoint"),
         "source_state": str(root / "guard" / "source-state"),
         "path": s3.uri(bucket, "guard/out")},
    ]
    for kind, case in cases.items():
        case.work.mkdir(parents=True)
        jobs.append({**case.job(kafka_bootstrap), "max_offsets": MAX_OFFSETS})
        if kind == KILLED:
            jobs[-1]["failpoint"] = {"point": "task_write", "marker": str(case.work / "failpoint"),
                                     "from_epoch": CRASH_EPOCH, "once": True}
    # bounded (endingOffsets): at the end the combined watermark is MAX, every window closes
    jobs.append({
        "name": "windowed", "bootstrap": kafka_bootstrap, "topic": topic, "target": "postgres",
        "dsn": postgres_dsn, "table": windows.table, "windowed": True,
        "checkpoint": str(root / "windowed" / "checkpoint"), "ending_offsets": "latest",
        "source_state": s3.uri(bucket, "windowed/source-state"),
        "sink_options": {"checkpointing.location": s3.uri(bucket, "windowed/sink-store")}})
    (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
    log = root / "run.log"
    started = time.monotonic()
    # the sink gets 5 rows per Arrow batch: task_write stops a task with rows still unread
    proc = launch(["--jobs", str(root / "jobs.json"), "--master", MASTER,
                   "--timeout", str(RUN_TIMEOUT), *RETRY_TRANSIENT,
                   "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=5"], log)
    try:
        try:
            _kill_executor(kill, proc, log)
        except HarnessError as exc:
            kill.error = str(exc)
        try:
            proc.wait(RUN_TIMEOUT + 60)
        except Exception as exc:
            raise HarnessError(f"the driver did not finish:\n{tail(log)}") from exc
    finally:
        kill_tree(proc.pid)
        proc.wait()
    seconds = time.monotonic() - started
    results = {r["name"]: r for r in read_results(log)}
    for case in cases.values():
        case.restart = results.get(case.name)
        if case.restart is not None and case.restart["ok"]:
            case.crash.setdefault("query", query_id(str(case.checkpoint)))
            case.record_after()
    print(f"\ncluster run ({len(jobs)} queries on {MASTER}, an executor killed): "
          f"{seconds:.0f} s", file=sys.stderr)
    return ClusterRun(cases, kill, windows, root / "windowed" / "checkpoint", results, log,
                      seconds, bucket)


def _result(run: ClusterRun, name: str) -> dict[str, Any]:
    result = run.results.get(name)
    if result is None:
        raise HarnessError(f"no result for {name}:\n{tail(run.log)}")
    return result


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("kind", TARGETS)
def test_source_to_sink_is_exactly_once_on_a_cluster(cluster_run: ClusterRun,
                                                     kind: str) -> None:
    """Every row once, nothing prepared or staged left, every batch published, the published
    watermark never back (nor changed since the executor's loss, for the query that lost one);
    the read tasks handed their watermark state to the driver through S3 (no slice had to be
    re-read for a missing record), and nothing fell back to local disk."""
    case = cluster_run.cases[kind]
    result = _result(cluster_run, case.name)
    assert result["ok"], f"the query failed:\n{result['error']}"
    earlier = [case.crash["published"]] if "published" in case.crash else []
    check_delivered_once(case.after, PRODUCED, set(), earlier, LAST_EPOCH)
    assert case.after["sink"]["decided"], f"batch {CRASH_EPOCH}: no decision on S3"
    assert case.source_state is not None
    records = [i for i in _listing(case.source_state, "source", "~tasks", recursive=True)
               if i.type == pafs.FileType.File]
    assert records, "no read-task record on S3"
    assert RE_READ not in cluster_run.log.read_text(errors="replace"), (
        "the driver had to re-read a slice: a read task's record did not reach it")
    assert not (case.work / "checkpoint-source").exists()
    assert not (case.checkpoint / "flinkish").exists()


def test_executor_loss_mid_batch(cluster_run: ClusterRun) -> None:
    """The executor under a write task of batch 1 was killed with its Python workers, and the
    query went on (its data is judged by the test above)."""
    kill = cluster_run.kill
    if kill.error is not None:
        raise HarnessError(kill.error)
    crash = kill.case.crash
    if crash["failpoint"] != "task_write" or crash["spark_commits"] != list(range(CRASH_EPOCH)):
        raise HarnessError(f"the kill did not land in a write task of batch {CRASH_EPOCH}: "
                           f"{crash}")
    assert len(kill.killed) >= 3, f"expected the JVM, its daemon and a worker: {kill.killed}"
    assert not [pid for pid in kill.killed if _alive(pid)], "killed processes still alive"
    assert "Lost executor" in cluster_run.log.read_text(errors="replace")
    result = _result(cluster_run, kill.case.name)
    assert result["ok"], f"the query did not survive the executor's loss:\n{result['error']}"
    print(f"\nat the kill: staged {crash['staged_files']}, lingering {crash['lingering']}",
          file=sys.stderr)


def test_windowed_counts_are_exact_on_a_cluster(cluster_run: ClusterRun) -> None:
    result = _result(cluster_run, "windowed")
    assert result["ok"], f"the query failed:\n{result['error']}"
    truth = Counter((ts - ts % WINDOW_MS, p) for p in range(PARTITIONS)
                    for ts in (BASE_TS + i * 1_000 + p for i in range(PER_PARTITION)))
    expected = sorted((start, start + WINDOW_MS, p, n) for (start, p), n in truth.items())
    assert table_windows(cluster_run.windows) == expected
    query = query_id(str(cluster_run.windows_checkpoint))
    assert cluster_run.windows.lingering(query) == [], "left prepared"


def test_local_source_location_is_refused_on_a_cluster(cluster_run: ClusterRun) -> None:
    result = _result(cluster_run, "guard")
    assert not result["ok"], "a local checkpointing.location was accepted on local-cluster"
    error = result["error"]
    assert GUARD in error and MASTER in error, error
    assert "s3://" in error and "hdfs://" in error, error


def test_s3_credentials_never_leave(cluster_run: ClusterRun, s3: S3Server) -> None:
    """The S3 credentials reach pyarrow, boto3 and the executors as ``AWS_*`` variables only:
    the secret is in no log line, no file Spark or flinkish wrote locally, no object on S3."""
    secret = SECRET_KEY.encode()
    local = [p for p in cluster_run.log.parent.rglob("*") if p.is_file()]
    assert cluster_run.log in local
    assert [p for p in local if secret in p.read_bytes()] == []
    fs, base = pafs.FileSystem.from_uri(s3.uri(cluster_run.bucket))
    objects = [i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
               if i.type == pafs.FileType.File]
    assert len(objects) > 10, objects
    leaked = []
    for path in objects:
        with fs.open_input_stream(path) as f:
            if secret in f.read():
                leaked.append(path)
    assert leaked == []
