"""Crash injection: SIGKILL the Spark driver of a source -> sink query at each named point of
the two-phase commit, restart it from the same checkpoint, and check that the target holds
every input row exactly once, that nothing of ours is left prepared or staged, and that the
published watermark never went backwards. Then a failed task attempt under Spark's task
retries: its transaction must not survive, whether the sink saw the failure or was killed.

The queries run in driver processes of their own (``integration/sink_query.py``). A driver
costs 20-40 s of start-up on 2 cores, so the crash cases share one: every case is a query
with its own checkpoint, table / directory and failpoint, armed only once Spark has logged
batch 0 as committed, so each crash lands mid-stream (in batch 1 of 4, batch 0 committed and
published). A query that reaches its point writes its marker file and blocks there; once
every query has, the driver's whole process tree is SIGKILLed (every process group in its
session: pyspark's worker daemon has a group of its own). One more driver restarts all cases
from their checkpoints: each replays batch 1, whose commit runs recovery, and goes on to
batches 2 and 3. The module fixture records what the crash left and what the restart made
of it; the tests judge it.

Findings about the sink fail as AssertionError; a harness that did not get where it meant to
(a crash that landed elsewhere, no result) raises HarnessError, so an xfail for a known sink
bug cannot hide it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds
import pytest
from psycopg import sql

from checkpointing import CheckpointStorage, CheckpointStore
from checkpointing.query import query_id
from flinkish.demo.embedded_kafka import create_topic
from flinkish.demo.processes import kill_tree
from flinkish_sink.target import TransactionId
from integration.kafka_helpers import produce

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent / "sink_query.py"
PARTITIONS = 4
PER_PARTITION = 100
MAX_OFFSETS = 100  # records per batch over all partitions: batches 0..3
CRASH_EPOCH = 1
LAST_EPOCH = PARTITIONS * PER_PARTITION // MAX_OFFSETS - 1
BASE_TS = 1_700_000_000_000
PREFIX = "flinkish"
TARGETS = ("postgres", "parquet")
POINTS = (
    "task_write",         # a write task has rows in its open transaction
    "before_decision",    # driver: every pre-commit in hand, no decision recorded
    "after_decision",     # decision recorded, nothing committed
    "mid_commit",         # the first decided transaction committed, the others not
    "before_checkpoint",  # all committed and the epoch published, checkpoint not completed
    "checkpoint_write",   # checkpoint record written, latest pointer not
    "after_checkpoint",   # checkpoint completed, Spark's commit log not written
)
CRASH_TIMEOUT = 300.0  # every query of the crash run reaching its failpoint
RESTART_TIMEOUT = 400.0  # all restarts together


class HarnessError(Exception):
    """The test setup did not get where it meant to (not a finding about the sink)."""


# -- processes -----------------------------------------------------------------------------

def _input_topic(bootstrap: str, kind: str) -> str:
    """A fresh topic holding the suite's known input: PER_PARTITION records per partition."""
    topic = f"sink-{kind}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, [
        (p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), BASE_TS + i * 1_000 + p)
        for i in range(PER_PARTITION) for p in range(PARTITIONS)
    ])
    return topic


def stop_after_exit(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """After the driver exited by itself: its Python workers outlive it by a few seconds
    (until the JVM's pipes close); kill whatever is left of its session."""
    kill_tree(proc.pid, timeout)
    proc.wait()


def launch(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=str(SCRIPT.parent.parent),
        )


def tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no log)"


def poll(condition: Callable[[], Any], timeout: float, what: str,
         proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> Any:
    """Poll ``condition()`` until truthy; HarnessError after ``timeout`` or if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if proc is not None and proc.poll() is not None:
            raise HarnessError(
                f"waiting for {what}: the driver exited with {proc.returncode}\n"
                + (tail(log) if log else "")
            )
        if time.monotonic() > deadline:
            raise HarnessError(f"timed out after {timeout:g} s waiting for {what}\n"
                               + (tail(log) if log else ""))
        time.sleep(0.2)


def run_to_end(args: list[str], log: Path, timeout: float) -> tuple[int, list[dict[str, Any]]]:
    """Run sink_query.py to its end: (exit code, its per-query JSON results)."""
    proc = launch(args, log)
    try:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"sink_query did not finish in {timeout:g} s\n{tail(log)}") from exc
    finally:
        stop_after_exit(proc)
    results = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith('{"name"'):
            results.append(json.loads(line))
    return proc.returncode, results


# -- what the target holds -----------------------------------------------------------------

def pg_rows(dsn: str, statement: sql.Composed | str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params or None).fetchall()


@dataclass
class TargetView:
    """One case's target as a reader sees it."""

    kind: str
    dsn: str  # PostgreSQL only
    table: str
    path: Path

    def rows(self) -> list[tuple[int, int]]:
        """(partition, offset) of every row, duplicates included."""
        if self.kind == "postgres":
            try:
                found = pg_rows(self.dsn, sql.SQL('SELECT "partition", "offset" FROM {}').format(
                    sql.Identifier(self.table)))
            except psycopg.errors.UndefinedTable:
                return []
            return [(int(p), int(o)) for p, o in found]
        if not self.path.exists():
            return []
        table = ds.dataset(str(self.path), format="parquet").to_table(
            columns=["partition", "offset"])
        return list(zip(table.column("partition").to_pylist(),
                        table.column("offset").to_pylist(), strict=True))

    def lingering(self, query: str) -> list[str]:
        """Our transactions still prepared (PostgreSQL) or staged (Parquet)."""
        if self.kind == "postgres":
            gids = [g for (g,) in pg_rows(self.dsn, "SELECT gid FROM pg_prepared_xacts")]
            return sorted(g for g in gids if (t := TransactionId.parse(g)) and t.query == query)
        staging = self.path / "_flinkish_staging"
        return sorted(p.name for p in staging.iterdir()) if staging.is_dir() else []

    def open_sessions(self, query: str) -> list[str]:
        """PostgreSQL sessions of write tasks with rows in an open transaction."""
        found = pg_rows(
            self.dsn,
            "SELECT application_name FROM pg_stat_activity "
            "WHERE application_name LIKE %s AND backend_xid IS NOT NULL",
            f"{PREFIX}:{query}:%",
        )
        return sorted(name for (name,) in found)

    def staged_files(self) -> list[str]:
        staging = self.path / "_flinkish_staging"
        return sorted(str(p.relative_to(staging)) for p in staging.glob("*/*.parquet"))

    def published(self, query: str) -> dict[int, int | None]:
        """epoch -> watermark as published beside the data."""
        if self.kind == "postgres":
            try:
                found = pg_rows(self.dsn, sql.SQL(
                    "SELECT epoch, watermark FROM {} WHERE query = %s ORDER BY epoch"
                ).format(sql.Identifier(f"{self.table}_flinkish_epochs")), query)
            except psycopg.errors.UndefinedTable:
                return {}
            return {int(e): w for e, w in found}
        records = {}
        for file in sorted((self.path / "_flinkish_epochs" / query).glob("*.json")):
            record = json.loads(file.read_text())
            records[int(record["epoch"])] = record["watermark"]
        return records


def epoch_of(gid: str) -> int:
    txn = TransactionId.parse(gid.replace("~", ":"))
    assert txn is not None, gid
    return txn.epoch


# -- the cases -----------------------------------------------------------------------------

@dataclass
class Case:
    point: str
    target: TargetView
    work: Path
    crash: dict[str, Any] = field(default_factory=dict)
    crash_error: str | None = None
    restart: dict[str, Any] | None = None
    after: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.point}-{self.target.kind}"

    @property
    def checkpoint(self) -> Path:
        return self.work / "checkpoint"

    def job(self, bootstrap: str, topic: str) -> dict[str, Any]:
        job: dict[str, Any] = {
            "name": self.name, "bootstrap": bootstrap, "topic": topic,
            "checkpoint": str(self.checkpoint), "target": self.target.kind,
            "max_offsets": MAX_OFFSETS,
        }
        if self.target.kind == "postgres":
            job.update(dsn=self.target.dsn, table=self.target.table)
        else:
            job.update(path=str(self.target.path))
        return job


def sink_state(checkpoint: Path) -> dict[str, Any]:
    """The sink's checkpoint store about the crash epoch, read without claiming it."""
    storage = CheckpointStorage.open(str(checkpoint / "flinkish"))
    store = CheckpointStore.reader(storage)
    try:
        pointer = storage.read_json("_latest")["id"]
    except FileNotFoundError:
        pointer = None
    completed = store.completed(CRASH_EPOCH)
    recorded = completed or store.pending(CRASH_EPOCH)
    return {
        "decided": None if recorded is None else sorted(
            d["gid"] for d in recorded.state["decision"]),
        "completed_record": completed is not None,
        "pointer": pointer,
    }


def _batches(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if (
        directory.is_dir()) else []


def record_crash(case: Case) -> None:
    """What the killed run left behind for ``case``."""
    query = query_id(str(case.checkpoint))
    case.crash.update(
        failpoint=(case.work / "failpoint").read_text().split()[0],
        query=query,
        spark_offsets=_batches(case.checkpoint / "offsets"),
        spark_commits=_batches(case.checkpoint / "commits"),
        sink=sink_state(case.checkpoint),
        lingering=case.target.lingering(query),
        staged_files=case.target.staged_files() if case.target.kind == "parquet" else [],
        published=case.target.published(query),
        rows=len(case.target.rows()),
    )


def crash_all(cases: list[Case], bootstrap: str, topic: str, root: Path) -> float:
    """Run every case's query in one driver, each stopping at its own failpoint in batch
    CRASH_EPOCH; once all have stopped (or time is up), SIGKILL the driver's whole process
    tree. Returns the seconds it took."""
    jobs = []
    for case in cases:
        case.work.mkdir(parents=True)
        jobs.append({**case.job(bootstrap, topic), "failpoint": {
            "point": case.point, "marker": str(case.work / "failpoint"),
            "from_epoch": CRASH_EPOCH}})
    jobs_file = root / "crash-jobs.json"
    jobs_file.write_text(json.dumps(jobs, indent=1))
    log = root / "crash.log"
    started = time.monotonic()
    # Every task that reaches task_write blocks, holding its slot: room for all of them.
    # The sink gets 5 rows per Arrow batch, so task_write stops a task with rows still unread.
    proc = launch(["--jobs", str(jobs_file), "--master", f"local[{4 * len(cases)}]",
                   "--start-window", "2", "--timeout", str(CRASH_TIMEOUT),
                   "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=5"], log)
    try:
        def all_stopped() -> bool:  # marker written (not only created) by every query
            return all((c.work / "failpoint").exists()
                       and (c.work / "failpoint").read_text().strip() for c in cases)

        try:
            poll(all_stopped, CRASH_TIMEOUT, "every query to reach its failpoint", proc, log)
        except HarnessError as exc:
            for case in cases:
                if not (case.work / "failpoint").exists():
                    case.crash_error = str(exc)
        for case in cases:  # open transactions are visible only while their tasks live
            if case.point == "task_write" and case.target.kind == "postgres" and (
                    case.crash_error is None):
                case.crash["open_sessions"] = case.target.open_sessions(
                    query_id(str(case.checkpoint)))
    finally:
        kill_tree(proc.pid)
        proc.wait()
    for case in cases:
        if case.crash_error is None:
            try:
                record_crash(case)
            except Exception:
                case.crash_error = traceback.format_exc()
    return time.monotonic() - started


@dataclass
class CrashSuite:
    cases: dict[str, Case]
    produced: set[tuple[int, int]]
    restart_log: Path
    restart_code: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def suite(
    kafka_bootstrap: str, postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
) -> Iterator[CrashSuite]:
    topic = _input_topic(kafka_bootstrap, "crash")
    token = topic.rsplit("-", 1)[1]
    root = tmp_path_factory.mktemp("sink-crash")
    cases = {}
    for point in POINTS:
        for kind in TARGETS:
            work = root / f"{point}-{kind}"
            view = TargetView(kind, postgres_dsn, f"crash_{point}_{token}", work / "out")
            case = Case(point, view, work)
            cases[case.name] = case
    result = CrashSuite(cases, {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)},
                        root / "restart.log")
    result.seconds["crash"] = crash_all(list(cases.values()), kafka_bootstrap, topic, root)

    # restart every case that crashed, all in one driver; beside them, a query named with
    # queryName (Spark hands the name to the sink's options)
    jobs = [c.job(kafka_bootstrap, topic) for c in cases.values() if c.crash_error is None]
    jobs.append({"name": "named-query", "bootstrap": kafka_bootstrap, "topic": topic,
                 "checkpoint": str(root / "named" / "checkpoint"), "target": "parquet",
                 "path": str(root / "named" / "out"), "query_name": f"named_{token}",
                 "max_offsets": MAX_OFFSETS})
    jobs_file = root / "restart-jobs.json"
    jobs_file.write_text(json.dumps(jobs, indent=1))
    started = time.monotonic()
    code, results = run_to_end(
        ["--jobs", str(jobs_file), "--master", "local[4]", "--start-window", "2",
         "--timeout", str(RESTART_TIMEOUT)],
        result.restart_log, RESTART_TIMEOUT + 120)
    result.seconds["restart"] = time.monotonic() - started
    result.restart_code = code
    by_name = {r["name"]: r for r in results}
    result.extra["named"] = by_name.get("named-query")
    for case in cases.values():
        if case.crash_error is not None:
            continue
        case.restart = by_name.get(case.name)
        query = case.crash["query"]
        case.after = {
            "rows": case.target.rows(),
            "lingering": case.target.lingering(query),
            "published": case.target.published(query),
            "sink": sink_state(case.checkpoint),
        }
    print(f"\ncrash run {result.seconds['crash']:.0f} s, restart run "
          f"{result.seconds['restart']:.0f} s", file=sys.stderr)
    yield result


CASES = [pytest.param(point, kind, id=f"{point}-{kind}") for point in POINTS for kind in TARGETS]


def _check_crash_landed(case: Case) -> None:
    """The kill hit the point it was meant to, mid-stream (HarnessError otherwise)."""
    if case.crash_error is not None:
        raise HarnessError(f"crash run of {case.name} failed:\n{case.crash_error}")
    c = case.crash
    problems = []
    if c["failpoint"] != case.point:
        problems.append(f"failpoint file names {c['failpoint']}")
    if c["spark_commits"] != list(range(CRASH_EPOCH)) or CRASH_EPOCH not in c["spark_offsets"]:
        problems.append(f"Spark's logs: offsets {c['spark_offsets']}, commits "
                        f"{c['spark_commits']} (expected a crash in batch {CRASH_EPOCH})")
    sink, lingering = c["sink"], [g for g in c["lingering"] if epoch_of(g) == CRASH_EPOCH]
    point = case.point
    if point in ("task_write", "before_decision") and (
            sink["decided"] is not None or sink["completed_record"]):
        problems.append(f"a decision is recorded: {sink}")
    if point in ("after_decision", "mid_commit", "before_checkpoint") and (
            not sink["decided"] or sink["completed_record"]):
        problems.append(f"expected a decision and no completed checkpoint: {sink}")
    if point in ("checkpoint_write", "after_checkpoint") and not sink["decided"]:
        problems.append(f"expected a decision: {sink}")
    if point == "checkpoint_write" and not (sink["completed_record"] and sink["pointer"] == 0):
        problems.append(f"expected the record of {CRASH_EPOCH} without the pointer: {sink}")
    if point == "after_checkpoint" and sink["pointer"] != CRASH_EPOCH:
        problems.append(f"expected checkpoint {CRASH_EPOCH} completed: {sink}")
    if point == "task_write":
        holding = (c.get("open_sessions") if case.target.kind == "postgres"
                   else c["staged_files"])
        if not holding:
            problems.append("no write task had rows in an open transaction")
    if point == "before_decision" and len(lingering) < 2:
        problems.append(f"expected the tasks' pre-commits to linger, found {lingering}")
    if point == "after_decision" and sorted(
            g.replace(":", "~") if case.target.kind == "parquet" else g
            for g in sink["decided"] or []) != lingering:
        problems.append(f"expected the decided {sink['decided']} to linger, found {lingering}")
    if point == "mid_commit" and len(lingering) != len(sink["decided"] or []) - 1:
        problems.append(f"expected all but one of {sink['decided']} to linger: {lingering}")
    if point in ("before_checkpoint", "checkpoint_write", "after_checkpoint") and lingering:
        problems.append(f"expected everything committed, found {lingering}")
    published_crash = CRASH_EPOCH in c["published"]
    if published_crash != (point in ("before_checkpoint", "checkpoint_write",
                                     "after_checkpoint")):
        problems.append(f"published epochs at the crash: {c['published']}")
    if 0 not in c["published"]:
        problems.append("batch 0 was not published before the crash")
    if problems:
        raise HarnessError(f"{case.name}: the crash did not land as intended: "
                           + "; ".join(problems) + f"\n{json.dumps(c, indent=1, default=str)}")


@pytest.mark.parametrize(("point", "kind"), CASES)
def test_restart_after_crash_is_exactly_once(suite: CrashSuite, point: str, kind: str) -> None:
    case = suite.cases[f"{point}-{kind}"]
    _check_crash_landed(case)
    restart = case.restart
    if restart is None:
        raise HarnessError(f"no result for {case.name} from the restart run "
                           f"(exit {suite.restart_code}):\n{tail(suite.restart_log)}")
    assert restart["ok"], f"the restarted query failed:\n{restart['error']}"
    rows = case.after["rows"]
    duplicates = sorted({r for r in rows if rows.count(r) > 1})
    assert not duplicates, f"{len(rows) - len(set(rows))} duplicate rows, e.g. {duplicates[:8]}"
    assert set(rows) == suite.produced, (
        f"missing {sorted(suite.produced - set(rows))[:8]}, "
        f"unexpected {sorted(set(rows) - suite.produced)[:8]}"
    )
    assert case.after["lingering"] == [], "left prepared / staged after the restart"
    # a recorded decision is final, whatever crashes; without one, what the crashed run
    # pre-committed must not be what the epoch commits
    decided = case.after["sink"]["decided"]
    assert decided, f"batch {CRASH_EPOCH} has no completed checkpoint after the restart"
    if case.crash["sink"]["decided"] is not None:
        assert decided == case.crash["sink"]["decided"], "the epoch's decision changed"
    else:
        left = {g.replace("~", ":") for g in case.crash["lingering"]}
        assert not left & set(decided), "the crashed run's undecided pre-commits were committed"
    published = case.after["published"]
    assert sorted(published) == list(range(LAST_EPOCH + 1)), f"published epochs: {published}"
    for epoch, watermark in case.crash["published"].items():
        assert published[epoch] == watermark, f"epoch {epoch} republished differently"
    marks = [published[e] for e in sorted(published) if published[e] is not None]
    assert marks and marks == sorted(marks), f"watermark went backwards: {published}"


def test_named_query_runs(suite: CrashSuite) -> None:
    named = suite.extra["named"]
    if named is None:
        raise HarnessError(f"no result for the named query:\n{tail(suite.restart_log)}")
    if not named["ok"] and "queryname" not in named["error"]:
        raise HarnessError(f"the named query failed otherwise:\n{named['error']}")
    assert named["ok"], named["error"]


# -- a failed task attempt, retried ----------------------------------------------------------

FAILURE_MODES = ("raise", "kill")


@dataclass
class RetrySuite:
    views: dict[str, TargetView]
    checkpoints: dict[str, Path]
    evidence: dict[str, Path]
    results: dict[str, dict[str, Any]]
    produced: set[tuple[int, int]]
    log: Path


@pytest.fixture(scope="module")
def retried(
    kafka_bootstrap: str, postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
) -> RetrySuite:
    """Both targets in one driver with task retries (local[2,2]). The first attempt of task 0
    of batch 1 fails once the sink's transaction of that attempt has rows: an identity UDF
    upstream of the sink raises (mode ``raise``: the sink's ``write`` sees the failure and can
    clean up) or SIGKILLs the sink's write process (mode ``kill``: nothing on the task side
    cleans up). The second attempt succeeds."""
    topic = _input_topic(kafka_bootstrap, "retry")
    token = topic.rsplit("-", 1)[1]
    root = tmp_path_factory.mktemp("sink-retry")
    suite = RetrySuite({}, {}, {}, {}, {(p, o) for p in range(PARTITIONS)
                                         for o in range(PER_PARTITION)}, root / "run.log")
    jobs = []
    for kind in TARGETS:
        for mode in FAILURE_MODES:
            name = f"{kind}-{mode}"
            view = TargetView(kind, postgres_dsn, f"retry_{mode}_{token}", root / name / "out")
            suite.views[name] = view
            suite.checkpoints[name] = root / name / "checkpoint"
            suite.evidence[name] = root / name / "evidence.json"
            job: dict[str, Any] = {
                "name": name, "bootstrap": kafka_bootstrap, "topic": topic, "target": kind,
                "checkpoint": str(suite.checkpoints[name]), "max_offsets": MAX_OFFSETS,
                "fail_first_attempt": f"{CRASH_EPOCH}:0" + (":kill" if mode == "kill" else ""),
                "evidence": str(suite.evidence[name]),
            }
            if kind == "postgres":
                job.update(dsn=postgres_dsn, table=view.table)
            else:
                job.update(path=str(view.path))
            jobs.append(job)
    (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
    # UDF batches of 10 rows (the sink's of 5): the sink has rows while the task still runs
    _, results = run_to_end(
        ["--jobs", str(root / "jobs.json"), "--master", "local[2,2]", "--batch-rows", "10",
         "--start-window", "2", "--timeout", "300"], suite.log, 420)
    suite.results = {r["name"]: r for r in results}
    return suite


@pytest.mark.parametrize("mode", FAILURE_MODES)
@pytest.mark.parametrize("kind", TARGETS)
def test_failed_task_attempt_is_rolled_back(retried: RetrySuite, kind: str, mode: str) -> None:
    name = f"{kind}-{mode}"
    result = retried.results.get(name)
    if result is None:
        raise HarnessError(f"no result for {name}:\n{tail(retried.log)}")
    if not retried.evidence[name].exists():
        raise HarnessError(f"the injected failure never ran:\n{tail(retried.log)}")
    evidence = json.loads(retried.evidence[name].read_text())
    if evidence["seen"] is None:
        raise HarnessError(f"the failed attempt had no rows in the sink yet: {evidence}")
    if mode == "kill" and "killed" not in evidence:
        raise HarnessError(f"found no write process to kill: {evidence}")
    assert result["ok"], f"the query failed:\n{result['error']}"
    failed = TransactionId.parse(evidence["attempt"])
    assert failed is not None and failed.attempt == 0
    # the retry's transaction is the one the epoch decided on
    store = CheckpointStore.reader(CheckpointStorage.open(
        str(retried.checkpoints[name] / "flinkish")))
    done = store.completed(CRASH_EPOCH)
    assert done is not None, f"batch {CRASH_EPOCH} has no completed checkpoint"
    decided = [TransactionId.parse(d["gid"]) for d in done.state["decision"]]
    task0 = [t for t in decided if t is not None and t.task == failed.task]
    assert [t.attempt for t in task0] == [1], f"decision of batch {CRASH_EPOCH}: {decided}"

    view = retried.views[name]
    rows = view.rows()
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} duplicate rows"
    assert set(rows) == retried.produced
    query = query_id(str(retried.checkpoints[name]))
    assert view.lingering(query) == [], "the failed attempt's transaction was left behind"
    if kind == "postgres":
        assert view.open_sessions(query) == [], "a write task's session is still open"
