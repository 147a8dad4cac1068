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
batches 2 and 3 (and a batch without records that carries the combined watermark on, which
the source plans when it moved). The module fixture records what the crash left and what
the restart made of it; the tests judge it.

Crashes during recovery, with late rows routed to a side output: a few more cases read a topic
whose records at a few offsets of every partition were produced far behind the combined
watermark (late in the crashed batch and after it; ``lateData=side``). They crash in the first
run like the others, and the restart run stops each again at a point of its replay of the
crashed batch (``mid_commit``, ``before_checkpoint`` or ``checkpoint_write``), so the restart
driver is SIGKILLed once the other cases have finished. A third run (the retry suite's driver
below, which this module starts anyway) finishes them: every row once, in the main target or
(late) in the side output, nothing of theirs left prepared or staged in either.

Epochs without rows: a few more cases write only some of the records (``keep``), so that
batch 1 has no rows at all, or follows a batch without rows and has rows in one write task
only; they crash and restart in the same runs as the others.

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

import deltalake
import psycopg
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
from psycopg import sql

from checkpointing import CheckpointStorage, CheckpointStore
from checkpointing.query import query_id
from flinkish.demo.embedded_kafka import create_topic
from flinkish.demo.processes import kill_tree
from flinkish_sink.iceberg_target import IcebergTarget
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
#: Where the Delta target's cases crash: a write task with its files open, a decision
#: recorded, the epoch's version committed but its checkpoint not completed (a completed
#: epoch replayed is integration/test_delta_target.py's, without a driver of its own).
DELTA_POINTS = ("task_write", "after_decision", "mid_commit")
#: The Iceberg target's: a decision recorded, the epoch's snapshot committed but its
#: checkpoint not completed (the rest is Delta's path through the same coordinator).
ICEBERG_POINTS = ("after_decision", "mid_commit")
#: The targets that commit an epoch as one table change (an EpochTarget).
TABLE_TARGETS = ("delta", "iceberg")
POINTS = (
    "task_write",         # a write task has rows in its open transaction
    "before_decision",    # driver: every pre-commit in hand, no decision recorded
    "after_decision",     # decision recorded, nothing committed
    "mid_commit",         # the first decided transaction committed, the others not
    "before_checkpoint",  # all committed and the epoch published, checkpoint not completed
    "checkpoint_write",   # checkpoint record written, latest pointer not
    "after_checkpoint",   # checkpoint completed, Spark's commit log not written
)
#: The crashes of the first run on the row targets: every point on both, but the last two
#: (after the publish the target holds the whole epoch, and what a restart must do is the
#: checkpoint store's, the same whatever the target) on one target each.
CRASHES = tuple((point, kind) for point in POINTS[:-2] for kind in TARGETS) + (
    ("checkpoint_write", "parquet"), ("after_checkpoint", "postgres"))
#: Crashes during recovery: (first crash point, where the restart's replay of the crashed
#: batch is killed again, target). Their restart is the restart run above; a third run
#: finishes them. The recovery paths are the coordinator's, whatever the target; each pair
#: runs on one target (the first crashes above cover every point on both).
SECOND_CRASHES = (
    # run 1's undecided pre-commits (prepared transactions) still linger beside run 2's
    # half-committed new decision
    ("before_decision", "mid_commit", "postgres"),
    # run 2 finished run 1's decision and published; not completed (recovery is idempotent)
    ("mid_commit", "before_checkpoint", "parquet"),
    # run 2 decided anew, committed and published; the checkpoint record is written, not the
    # pointer, so the third run replays a batch completed as far as the records go (beside
    # run 1's staged files)
    ("task_write", "checkpoint_write", "parquet"),
)
#: Epochs and write tasks without rows (cf. RisingWave #26492, an empty pre-commit acknowledged
#: but not saved, after which the sink deadlocked): the records a case writes (a Spark SQL
#: condition, and the same in Python; a partition gives offsets 25·b to 25·b+24 to batch b).
#: "alternate": batches 0 and 2 have rows, 1 and 3 none, so the crash lands on an empty
#: epoch; "some-tasks": batch 0 has none, batch 1 only partition 0's (its other write tasks
#: none), 2 none, 3 all, so it lands right after one, beside empty write tasks.
EMPTY_KEEP: dict[str, tuple[str, Callable[[int, int], bool]]] = {
    "alternate": ("(offset DIV 25) % 2 = 0", lambda p, o: o // 25 % 2 == 0),
    "some-tasks": ("(offset DIV 25) = 3 OR ((offset DIV 25) = 1 AND partition = 0)",
                   lambda p, o: o // 25 == 3 or (o // 25 == 1 and p == 0)),
}
#: Where those cases are killed in batch CRASH_EPOCH: every target, on and after an empty
#: epoch, in the same crash and restart runs as the others.
EMPTY_CRASHES = (
    ("before_decision", "postgres", "alternate"),
    ("after_decision", "parquet", "alternate"),
    ("before_checkpoint", "iceberg", "alternate"),
    ("after_checkpoint", "delta", "alternate"),
    ("mid_commit", "postgres", "some-tasks"),
    ("before_checkpoint", "parquet", "some-tasks"),
)
#: Offsets, in every partition of the late-data topic, produced LATE_BEHIND_MS behind the
#: others: late in batches 1, 1, 2 and 3 (each partition gives 25 records to a batch).
LATE_OFFSETS = (30, 40, 60, 85)
LATE_BEHIND_MS = 120_000
# Time budgets per query of a run (its queries start one after another, so a run takes about
# as many times longer as it has queries): the crash run's 14 queries had 300 s to reach their
# failpoints and the restart run's 15 had 400 s to finish
CRASH_TIMEOUT_PER_QUERY = 300.0 / 14
RESTART_TIMEOUT_PER_QUERY = 400.0 / 15
# Spark gives a new Python worker a fixed 10 s to connect back (createSimpleWorker); on 2 cores
# busy with other Spark runs a query's start can miss it: start it again from its checkpoint
RETRY_TRANSIENT = ["--retry-transient", "3"]


class HarnessError(Exception):
    """The test setup did not get where it meant to (not a finding about the sink)."""


# -- processes -----------------------------------------------------------------------------

def _input_topic(bootstrap: str, kind: str, late: tuple[int, ...] = ()) -> str:
    """A fresh topic holding the suite's known input: PER_PARTITION records per partition,
    those at the ``late`` offsets LATE_BEHIND_MS behind the others."""
    topic = f"sink-{kind}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, [
        (p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode(),
         BASE_TS + i * 1_000 + p - (LATE_BEHIND_MS if i in late else 0))
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
    return proc.returncode, read_results(log)


def restarts(log: Path) -> int:
    """How many times the run started a query again (``--retry-transient``)."""
    try:
        return log.read_text(errors="replace").count("did not connect back in time; starting")
    except FileNotFoundError:
        return 0


def read_results(log: Path) -> list[dict[str, Any]]:
    """The per-query JSON results sink_query.py printed so far."""
    return [json.loads(line) for line in log.read_text(errors="replace").splitlines()
            if line.startswith('{"name"')]


# -- what the target holds -----------------------------------------------------------------

def pg_rows(dsn: str, statement: sql.Composed | str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params or None).fetchall()


def parquet_location(path: Path | str) -> tuple[pafs.FileSystem, str]:
    """A Parquet target's directory as (filesystem, path in it): a local directory, or a
    ``pyarrow.fs`` URI such as ``s3://bucket/out?endpoint_override=…``."""
    if isinstance(path, Path):
        return pafs.LocalFileSystem(), str(path)
    return pafs.FileSystem.from_uri(path)


def _listing(path: Path | str, *parts: str, recursive: bool = False) -> list[pafs.FileInfo]:
    """What lies under ``path``/``parts`` (nothing if it does not exist)."""
    fs, base = parquet_location(path)
    return fs.get_file_info(pafs.FileSelector(
        "/".join((base.rstrip("/"), *parts)), allow_not_found=True, recursive=recursive))


@dataclass
class TargetView:
    """One case's target as a reader sees it (with ``late``, its late-data side output too:
    ``lateData=side`` into the table / directory ``late_table`` / ``late_path``). A Parquet
    ``path`` is a local directory or (without ``late``) a ``pyarrow.fs`` URI."""

    kind: str
    dsn: str  # PostgreSQL only
    table: str
    path: Path | str
    late: bool = False

    @property
    def late_table(self) -> str:
        return f"{self.table}_late"

    @property
    def late_path(self) -> Path:
        assert isinstance(self.path, Path), "a side output only beside a local directory"
        return self.path.with_name(self.path.name + "-late")

    @property
    def catalog(self) -> dict[str, str]:
        """An Iceberg case's catalog: SQLite under its ``path``."""
        return {"uri": f"sqlite:///{self.path}/catalog.db",
                "warehouse": f"file://{self.path}/warehouse"}

    def _iceberg(self) -> Any:
        """An Iceberg case's table, or None before the sink created it."""
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        if not (Path(self.path) / "catalog.db").exists():
            return None
        try:
            return load_catalog("flinkish", **self.catalog).load_table(self.table)
        except NoSuchTableError:
            return None

    def _iceberg_data(self) -> Path | None:
        table = self._iceberg()
        return None if table is None else Path(table.location().removeprefix("file://"), "data")

    def sink_options(self) -> dict[str, str]:
        if self.kind == "iceberg":
            return {f"catalog.{k}": v for k, v in self.catalog.items()}
        if not self.late:
            return {}
        where = ({"lateData.table": self.late_table} if self.kind == "postgres"
                 else {"lateData.path": str(self.late_path)})
        return {"lateData": "side", **where}

    def rows(self, side: bool = False) -> list[tuple[int, int]]:
        """(partition, offset) of every row, duplicates included (``side``: of the side
        output)."""
        if self.kind == "iceberg":
            table = self._iceberg()
            if table is None:
                return []
            rows = table.scan(selected_fields=("partition", "offset")).to_arrow()
            return list(zip(rows.column("partition").to_pylist(),
                            rows.column("offset").to_pylist(), strict=True))
        if self.kind == "delta":
            if not (Path(self.path) / "_delta_log").is_dir():
                return []
            table = deltalake.DeltaTable(str(self.path)).to_pyarrow_dataset().to_table(
                columns=["partition", "offset"])
            return list(zip(table.column("partition").to_pylist(),
                            table.column("offset").to_pylist(), strict=True))
        if self.kind == "postgres":
            try:
                found = pg_rows(self.dsn, sql.SQL('SELECT "partition", "offset" FROM {}').format(
                    sql.Identifier(self.late_table if side else self.table)))
            except psycopg.errors.UndefinedTable:
                return []
            return [(int(p), int(o)) for p, o in found]
        fs, base = parquet_location(self.late_path if side else self.path)
        if fs.get_file_info(base).type == pafs.FileType.NotFound:
            return []
        table = ds.dataset(base, filesystem=fs, format="parquet").to_table(
            columns=["partition", "offset"])
        return list(zip(table.column("partition").to_pylist(),
                        table.column("offset").to_pylist(), strict=True))

    def lingering(self, query: str) -> list[str]:
        """Our transactions still prepared (PostgreSQL) or staged (Parquet), side output's
        included."""
        if self.kind == "postgres":
            gids = [g for (g,) in pg_rows(self.dsn, "SELECT gid FROM pg_prepared_xacts")]
            return sorted(g for g in gids if (t := TransactionId.parse(g)) and t.query == query)
        if self.kind in TABLE_TARGETS:  # a transaction's manifest, until decided
            data = self._iceberg_data() if self.kind == "iceberg" else Path(self.path)
            return [] if data is None else sorted(
                p.name.removesuffix(".json") for p in (data / "_flinkish_staging").glob("*.json"))
        found = []
        for path in (self.path, self.late_path) if self.late else (self.path,):
            found += [info.base_name for info in _listing(path, "_flinkish_staging")]
        return sorted(found)

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
        """<transaction dir>/<file> of every staged Parquet file; a Delta table's data files
        that no version references."""
        if self.kind in TABLE_TARGETS:
            return self.unreferenced()
        found = [info.path.rsplit("/", 2)[-2:] for info in _listing(
            self.path, "_flinkish_staging", recursive=True) if info.path.endswith(".parquet")]
        return sorted(f"{txn}/{name}" for txn, name in found)

    def published(self, query: str) -> dict[int, int | None]:
        """epoch -> watermark as published beside the data."""
        return {epoch: r["watermark"] for epoch, r in self.epoch_records(query).items()}

    def unreferenced(self) -> list[str]:
        """A Delta or Iceberg table's data files that no version or snapshot references."""
        if self.kind == "iceberg":
            table, data = self._iceberg(), self._iceberg_data()
            if table is None or data is None:
                return []
            referenced = {p.rsplit("/", 1)[-1] for p in
                          table.inspect.files().column("file_path").to_pylist()}
            return sorted(p.name for p in data.glob("*.parquet") if p.name not in referenced)
        path = Path(self.path)
        if not (path / "_delta_log").is_dir():
            return sorted(p.name for p in path.glob("*.parquet"))
        adds = deltalake.DeltaTable(str(path)).get_add_actions(flatten=True)
        referenced = set(pa.table(adds).column("path").to_pylist())
        return sorted(p.name for p in path.glob("*.parquet") if p.name not in referenced)

    def versions(self, query: str) -> list[int]:
        """The epoch of each version of a Delta table that carries one of ``query``, oldest
        first (an epoch twice would be a duplicate commit); an Iceberg table's snapshots."""
        if self.kind == "iceberg":
            return [] if self._iceberg() is None else [
                r["epoch"] for r in IcebergTarget(self.catalog, self.table).epoch_records(query)
            ][::-1]
        if not (Path(self.path) / "_delta_log").is_dir():
            return []
        history = deltalake.DeltaTable(str(self.path)).history()
        records = [json.loads(h["userMetadata"])["flinkish"] for h in reversed(history)
                   if "userMetadata" in h]
        return [r["epoch"] for r in records if r["query"] == query]

    def epoch_records(self, query: str) -> dict[int, dict[str, Any]]:
        """epoch -> {watermark, rows, late_rows} as published beside the data."""
        if self.kind == "iceberg":
            records = ([] if self._iceberg() is None else
                       IcebergTarget(self.catalog, self.table).epoch_records(query))
            return {r["epoch"]: {k: r[k] for k in ("watermark", "rows", "late_rows")}
                    for r in records}
        if self.kind == "delta":
            if not (Path(self.path) / "_delta_log").is_dir():
                return {}
            history = deltalake.DeltaTable(str(self.path)).history()
            records = [json.loads(h["userMetadata"])["flinkish"] for h in history
                       if "userMetadata" in h]
            return {r["epoch"]: {k: r[k] for k in ("watermark", "rows", "late_rows")}
                    for r in records if r["query"] == query}
        if self.kind == "postgres":
            try:
                found = pg_rows(self.dsn, sql.SQL(
                    "SELECT epoch, watermark, rows, late_rows FROM {} WHERE query = %s"
                ).format(sql.Identifier(f"{self.table}_flinkish_epochs")), query)
            except psycopg.errors.UndefinedTable:
                return {}
            return {int(e): {"watermark": w, "rows": int(n), "late_rows": int(late)}
                    for e, w, n, late in found}
        records = {}
        fs, _ = parquet_location(self.path)
        for info in _listing(self.path, "_flinkish_epochs", query):
            if not info.path.endswith(".json"):
                continue
            with fs.open_input_stream(info.path) as stream:
                record = json.loads(stream.read())
            records[int(record["epoch"])] = {
                key: record[key] for key in ("watermark", "rows", "late_rows")}
        return records


def epoch_of(gid: str) -> int:
    txn = TransactionId.parse(gid.replace("~", ":"))
    assert txn is not None, gid
    return txn.epoch


# -- the cases -----------------------------------------------------------------------------

@dataclass
class Case:
    """One query of the matrix: crashed at ``point`` in the crash run; with ``second``, its
    restart is killed again at that point of its replay of the crashed batch, and a third
    run finishes it."""

    point: str
    target: TargetView
    work: Path
    topic: str
    second: str | None = None
    #: with rows in some epochs or write tasks only: a key of EMPTY_KEEP
    empty: str | None = None
    crash: dict[str, Any] = field(default_factory=dict)
    crash_error: str | None = None
    restart: dict[str, Any] | None = None  # the restart run's result (the third's: `final`)
    second_crash: dict[str, Any] = field(default_factory=dict)
    second_error: str | None = None
    final: dict[str, Any] | None = None
    after: dict[str, Any] = field(default_factory=dict)
    # the source's checkpointing.location and the sink's store (default: local, beside the
    # query's checkpoint), e.g. on S3
    source_state: str | None = None
    store: str | None = None

    @property
    def name(self) -> str:
        if self.empty is not None:
            return f"{self.point}-{self.target.kind}-{self.empty}"
        if self.second is None:
            return f"{self.point}-{self.target.kind}"
        return f"{self.point}-then-{self.second}-{self.target.kind}"

    @property
    def checkpoint(self) -> Path:
        return self.work / "checkpoint"

    def job(self, bootstrap: str) -> dict[str, Any]:
        job: dict[str, Any] = {
            "name": self.name, "bootstrap": bootstrap, "topic": self.topic,
            "checkpoint": str(self.checkpoint), "target": self.target.kind,
            "max_offsets": MAX_OFFSETS,
        }
        if self.target.kind == "postgres":
            job.update(dsn=self.target.dsn, table=self.target.table)
        elif self.target.kind == "iceberg":
            Path(self.target.path).mkdir(parents=True, exist_ok=True)
            job.update(table=self.target.table, sink_options=self.target.sink_options())
        else:
            job.update(path=str(self.target.path))
        if self.target.late:
            job["sink_options"] = self.target.sink_options()
        if self.target.kind == "parquet":  # compacting after batches 1 and 3
            job["sink_options"] = {**job.get("sink_options", {}), "parquet.compactEvery": "2"}
        if self.store:
            job["sink_options"] = {**job.get("sink_options", {}),
                                   "checkpointing.location": self.store}
        if self.source_state:
            job["source_state"] = self.source_state
        if self.empty is not None:
            job["keep"] = EMPTY_KEEP[self.empty][0]
        return job

    def record_after(self) -> None:
        """What the target and the sink's store hold once the case's last run ended."""
        query = self.crash["query"]
        self.after = {
            "rows": self.target.rows(),
            "side_rows": self.target.rows(side=True) if self.target.late else [],
            "lingering": self.target.lingering(query),
            "published": self.target.published(query),
            "epochs": self.target.epoch_records(query),
            "sink": sink_state(self.checkpoint, self.store),
        }
        if self.target.kind == "parquet":
            self.after["files"] = len(list(Path(self.target.path).glob("*.parquet")))
        if self.target.kind in TABLE_TARGETS:
            self.after.update(versions=self.target.versions(query),
                              unreferenced=self.target.unreferenced())


def sink_state(checkpoint: Path, store: str | None = None) -> dict[str, Any]:
    """The sink's checkpoint store (``store``, else the default beside ``checkpoint``) about
    the crash epoch, read without claiming it."""
    storage = CheckpointStorage.open(store or str(checkpoint / "flinkish"))
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


def marker_written(marker: Path) -> bool:
    """The failpoint's marker file exists and is written (not only created)."""
    try:
        return bool(marker.read_text().strip())
    except FileNotFoundError:
        return False


def record_crash(case: Case, marker: str = "failpoint") -> dict[str, Any]:
    """What a killed run left behind for ``case`` (``marker``: its failpoint's file)."""
    query = query_id(str(case.checkpoint))
    return {
        "failpoint": (case.work / marker).read_text().split()[0],
        "query": query,
        "spark_offsets": _batches(case.checkpoint / "offsets"),
        "spark_commits": _batches(case.checkpoint / "commits"),
        "sink": sink_state(case.checkpoint, case.store),
        "lingering": case.target.lingering(query),
        "staged_files": case.target.staged_files() if case.target.kind != "postgres" else [],
        "published": case.target.published(query),
        "rows": len(case.target.rows()),
    }


def crash_all(cases: list[Case], bootstrap: str, root: Path) -> float:
    """Run every case's query in one driver, each stopping at its own failpoint in batch
    CRASH_EPOCH; once all have stopped (or time is up), SIGKILL the driver's whole process
    tree. Returns the seconds it took."""
    jobs = []
    for case in cases:
        case.work.mkdir(parents=True)
        jobs.append({**case.job(bootstrap), "failpoint": {
            "point": case.point, "marker": str(case.work / "failpoint"),
            "from_epoch": CRASH_EPOCH}})
    jobs_file = root / "crash-jobs.json"
    jobs_file.write_text(json.dumps(jobs, indent=1))
    log = root / "crash.log"
    timeout = CRASH_TIMEOUT_PER_QUERY * len(jobs)
    started = time.monotonic()
    # Every task that reaches task_write blocks, holding its slot: room for all of them.
    # The sink gets 5 rows per Arrow batch, so task_write stops a task with rows still unread.
    proc = launch(["--jobs", str(jobs_file), "--master", f"local[{4 * len(cases)}]",
                   "--start-window", "2", "--timeout", str(timeout), *RETRY_TRANSIENT,
                   "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=5"], log)
    try:
        def all_stopped() -> bool:
            return all(marker_written(c.work / "failpoint") for c in cases)

        try:
            poll(all_stopped, timeout, "every query to reach its failpoint", proc, log)
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
                case.crash.update(record_crash(case))
            except Exception:
                case.crash_error = traceback.format_exc()
    return time.monotonic() - started


def restart_all(jobs: list[dict[str, Any]], stopping: list[Case], bootstrap: str, root: Path,
                log: Path) -> tuple[int | None, list[dict[str, Any]]]:
    """The restart run: ``jobs`` in one driver, each to its end, but the ``stopping`` cases
    (their jobs last) each stopped at its second failpoint, in its replay of batch
    CRASH_EPOCH. Once every query has reported (done, failed, or stopped there and left
    waiting), SIGKILL the driver's process tree. Returns the driver's exit code (None: killed)
    and the results it reported."""
    for case in stopping:
        jobs.append({**case.job(bootstrap), "failpoint": {
            "point": case.second, "marker": str(case.work / "failpoint2"),
            "from_epoch": CRASH_EPOCH}})
    jobs_file = root / "restart-jobs.json"
    jobs_file.write_text(json.dumps(jobs, indent=1))
    names = {job["name"] for job in jobs}
    timeout = RESTART_TIMEOUT_PER_QUERY * len(jobs)
    proc = launch(["--jobs", str(jobs_file), "--master", "local[4]", "--start-window", "2",
                   "--timeout", str(timeout), "--report-early", *RETRY_TRANSIENT], log)
    code = None
    try:
        def settled() -> bool:
            if proc.poll() is not None:
                return True
            return names <= {r["name"] for r in read_results(log)}

        try:
            poll(settled, timeout + 60, "the restarts to finish or stop", None, log)
        except HarnessError as exc:
            for case in stopping:
                if not marker_written(case.work / "failpoint2"):
                    case.second_error = str(exc)
        code = proc.poll()
    finally:
        kill_tree(proc.pid)
        proc.wait()
    results = read_results(log)
    by_name = {r["name"]: r for r in results}
    for case in stopping:
        if case.second_error is not None:
            continue
        outcome = by_name.get(case.name)
        if not (outcome and outcome.get("stopped_at") and marker_written(
                case.work / "failpoint2")):
            case.second_error = (
                f"the restart of {case.name} never reached {case.second} (exit {code}); its "
                f"result: {json.dumps(outcome)}\n{tail(log)}")
            continue
        try:
            case.second_crash.update(record_crash(case, "failpoint2"))
        except Exception:
            case.second_error = traceback.format_exc()
    return code, results


@dataclass
class CrashSuite:
    cases: dict[str, Case]
    produced: set[tuple[int, int]]
    restart_log: Path
    restart_code: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    late: set[tuple[int, int]] = field(default_factory=set)  # of the late-data topic

    def stopped_twice(self) -> list[Case]:
        """The cases a third run is to finish."""
        return [c for c in self.cases.values() if c.second is not None
                and c.crash_error is None and c.second_error is None]


@pytest.fixture(scope="module")
def suite(
    kafka_bootstrap: str, postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
) -> Iterator[CrashSuite]:
    topic = _input_topic(kafka_bootstrap, "crash")
    late_topic = _input_topic(kafka_bootstrap, "crash-late", LATE_OFFSETS)
    token = topic.rsplit("-", 1)[1]
    root = tmp_path_factory.mktemp("sink-crash")
    cases = {}
    for point, kind in CRASHES:
        work = root / f"{point}-{kind}"
        view = TargetView(kind, postgres_dsn, f"crash_{point}_{token}", work / "out")
        case = Case(point, view, work, topic)
        cases[case.name] = case
    for point in DELTA_POINTS:
        work = root / f"{point}-delta"
        case = Case(point, TargetView("delta", postgres_dsn, "", work / "out"), work, topic)
        cases[case.name] = case
    for point in ICEBERG_POINTS:
        work = root / f"{point}-iceberg"
        view = TargetView("iceberg", postgres_dsn, f"crash.{point}", work / "out")
        case = Case(point, view, work, topic)
        cases[case.name] = case
    for point, kind, empty in EMPTY_CRASHES:
        work = root / f"{point}-{kind}-{empty}"
        table = f"crash.empty_{point}" if kind == "iceberg" else f"empty_{point}_{token}"
        case = Case(point, TargetView(kind, postgres_dsn, table, work / "out"), work, topic,
                    empty=empty)
        cases[case.name] = case
    for first, second, kind in SECOND_CRASHES:
        work = root / f"{first}-then-{second}-{kind}"
        view = TargetView(kind, postgres_dsn, f"crash2_{first}_{second}_{token}",
                          work / "out", late=True)
        case = Case(first, view, work, late_topic, second)
        cases[case.name] = case
    result = CrashSuite(cases, {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)},
                        root / "restart.log",
                        late={(p, o) for p in range(PARTITIONS) for o in LATE_OFFSETS})
    result.seconds["crash"] = crash_all(list(cases.values()), kafka_bootstrap, root)

    # restart every case that crashed, all in one driver; beside them, a query named with
    # queryName (Spark hands the name to the sink's options)
    crashed = [c for c in cases.values() if c.crash_error is None]
    jobs = [c.job(kafka_bootstrap) for c in crashed if c.second is None]
    jobs.append({"name": "named-query", "bootstrap": kafka_bootstrap, "topic": topic,
                 "checkpoint": str(root / "named" / "checkpoint"), "target": "parquet",
                 "path": str(root / "named" / "out"), "query_name": f"named_{token}",
                 "max_offsets": MAX_OFFSETS})
    started = time.monotonic()
    code, results = restart_all(jobs, [c for c in crashed if c.second is not None],
                                kafka_bootstrap, root, result.restart_log)
    result.seconds["restart"] = time.monotonic() - started
    result.restart_code = code
    by_name = {r["name"]: r for r in results}
    result.extra["named"] = by_name.get("named-query")
    for case in crashed:
        if case.second is None:
            case.restart = by_name.get(case.name)
            case.record_after()
    print(f"\ncrash run {result.seconds['crash']:.0f} s, restart run "
          f"{result.seconds['restart']:.0f} s; queries started again after a Python worker "
          f"missed connecting back: {restarts(root / 'crash.log')} in the crash run, "
          f"{restarts(result.restart_log)} in the restart run", file=sys.stderr)
    yield result


CASES = [pytest.param(point, kind, id=f"{point}-{kind}") for point, kind in CRASHES]


def _check_crash_landed(case: Case) -> None:
    """The kill hit the point it was meant to, mid-stream (HarnessError otherwise)."""
    c = case.crash
    problems = _stopped_in_crash_epoch(case)
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


def _check_restarted(suite: CrashSuite, case: Case) -> None:
    """The restart run ran ``case`` to its end (AssertionError if its query failed,
    HarnessError if the run gave no result for it)."""
    if case.restart is None:
        raise HarnessError(f"no result for {case.name} from the restart run "
                           f"(exit {suite.restart_code}):\n{tail(suite.restart_log)}")
    assert case.restart["ok"], f"the restarted query failed:\n{case.restart['error']}"


def _stopped_in_crash_epoch(case: Case) -> list[str]:
    """How the first run's kill of ``case`` missed its failpoint in batch CRASH_EPOCH, its
    first batch uncommitted (nothing: it hit it); HarnessError if the crash run failed."""
    if case.crash_error is not None:
        raise HarnessError(f"crash run of {case.name} failed:\n{case.crash_error}")
    c = case.crash
    problems = []
    if c["failpoint"] != case.point:
        problems.append(f"failpoint file names {c['failpoint']}")
    if c["spark_commits"] != list(range(CRASH_EPOCH)) or CRASH_EPOCH not in c["spark_offsets"]:
        problems.append(f"Spark's logs: offsets {c['spark_offsets']}, commits "
                        f"{c['spark_commits']} (expected a crash in batch {CRASH_EPOCH})")
    return problems


def _check_table_crash_landed(case: Case) -> None:
    """The kill hit the point it was meant to in batch CRASH_EPOCH of a Delta or Iceberg
    case, before the epoch completed: its version (snapshot) exists at mid_commit, its
    decided transactions' manifests linger before that (HarnessError otherwise)."""
    c, point = case.crash, case.point
    sink = c["sink"]
    lingering = sorted(g for g in c["lingering"] if epoch_of(g) == CRASH_EPOCH)
    problems = _stopped_in_crash_epoch(case)
    if (sink["decided"] is None) != (point == "task_write"):
        problems.append(f"decision at the crash: {sink}")
    if point == "task_write" and not c["staged_files"]:
        problems.append("no write task had a data file open")
    if point == "after_decision" and lingering != sorted(
            g.replace(":", "~") for g in sink["decided"] or []):
        problems.append(f"expected the decided {sink['decided']} to linger: {lingering}")
    if point == "mid_commit" and lingering:
        problems.append(f"expected the epoch's version to hold them all: {lingering}")
    if (CRASH_EPOCH in c["published"]) != (point == "mid_commit"):
        problems.append(f"epochs in the table's history at the crash: {c['published']}")
    if sink["completed_record"]:
        problems.append(f"expected the crash epoch not completed: {sink}")
    if problems:
        raise HarnessError(f"{case.name}: the crash did not land as intended: "
                           + "; ".join(problems) + f"\n{json.dumps(c, indent=1, default=str)}")


@pytest.mark.parametrize("name", [f"{point}-delta" for point in DELTA_POINTS]
                         + [f"{point}-iceberg" for point in ICEBERG_POINTS])
def test_table_restart_after_crash_is_exactly_once_in_one_commit_per_epoch(
    suite: CrashSuite, name: str
) -> None:
    """A Delta or Iceberg case: every row once, each epoch in one table version (snapshot),
    no data file left that the table does not reference."""
    case = suite.cases[name]
    _check_table_crash_landed(case)
    _check_restarted(suite, case)
    _check_exactly_once(case, suite.produced, set())
    versions = case.after["versions"]
    assert versions == sorted(set(versions)), f"an epoch in two commits: {versions}"
    assert case.after["unreferenced"] == [], "data files left that the table does not reference"


def _check_empty_crash_landed(case: Case) -> None:
    """An empty-epoch case was killed at its point in batch CRASH_EPOCH, with the decision
    (none, or of the one write task with rows) and the published epochs that point has
    (HarnessError otherwise)."""
    c, point = case.crash, case.point
    sink = c["sink"]
    problems = _stopped_in_crash_epoch(case)
    tasks_with_rows = 0 if case.empty == "alternate" else 1
    if point == "before_decision":
        if sink["decided"] is not None:
            problems.append(f"a decision is recorded: {sink}")
    elif sink["decided"] is None or len(sink["decided"]) != tasks_with_rows:
        problems.append(f"expected a decision on {tasks_with_rows} pre-commit(s): {sink}")
    if sink["completed_record"] != (point == "after_checkpoint"):
        problems.append(f"checkpoint of the crash epoch: {sink}")
    published = ("before_checkpoint", "after_checkpoint") + (
        ("mid_commit",) if case.target.kind in TABLE_TARGETS else ())
    if (CRASH_EPOCH in c["published"]) != (point in published):
        problems.append(f"published epochs at the crash: {c['published']}")
    if problems:
        raise HarnessError(f"{case.name}: the crash did not land as intended: "
                           + "; ".join(problems) + f"\n{json.dumps(c, indent=1, default=str)}")


@pytest.mark.parametrize("name", [f"{point}-{kind}-{empty}"
                                  for point, kind, empty in EMPTY_CRASHES])
def test_restart_after_crash_on_or_after_an_empty_epoch_is_exactly_once(
    suite: CrashSuite, name: str
) -> None:
    """Killed on an epoch without rows, or right after one beside write tasks without rows:
    the restart keeps the recorded decision, every written row is there once, and every
    epoch is decided and completed, none left hanging."""
    case = suite.cases[name]
    _check_empty_crash_landed(case)
    _check_restarted(suite, case)
    recorded = case.crash["sink"]["decided"]
    if recorded is not None:
        assert case.after["sink"]["decided"] == recorded, "the epoch's decision changed"
    assert case.empty is not None
    kept = {(p, o) for p, o in suite.produced if EMPTY_KEEP[case.empty][1](p, o)}
    check_delivered_once(case.after, kept, set(), [case.crash["published"]])
    store = CheckpointStore.reader(CheckpointStorage.open(str(case.checkpoint / "flinkish")))
    undecided = [e for e in range(LAST_EPOCH + 1) if store.completed(e) is None]
    assert not undecided, f"epochs left without a completed checkpoint: {undecided}"
    if case.target.kind in TABLE_TARGETS:
        versions = case.after["versions"]
        assert versions == sorted(set(versions)), f"an epoch in two commits: {versions}"


def _gid(name: str) -> str:
    """A transaction id from a lingering name (Parquet's staging directories spell ':' '~')."""
    return name.replace("~", ":")


def _check_second_crash_landed(case: Case) -> None:
    """The restart was killed where it was meant to be: in its replay of batch CRASH_EPOCH,
    at ``case.second`` (HarnessError otherwise)."""
    if case.second_error is not None:
        raise HarnessError(f"restart run of {case.name} did not stop as intended:\n"
                           f"{case.second_error}")
    c = case.second_crash
    problems = []
    if c["failpoint"] != case.second:
        problems.append(f"failpoint file names {c['failpoint']}")
    if c["spark_commits"] != list(range(CRASH_EPOCH)) or CRASH_EPOCH not in c["spark_offsets"]:
        problems.append(f"Spark's logs: offsets {c['spark_offsets']}, commits "
                        f"{c['spark_commits']} (expected the replay of batch {CRASH_EPOCH})")
    sink = c["sink"]
    decided = sink["decided"] or []
    lingering = {_gid(g) for g in c["lingering"] if epoch_of(g) <= CRASH_EPOCH}
    if not decided:
        problems.append(f"no decision recorded: {sink}")
    if case.second in ("mid_commit", "before_checkpoint") and sink["completed_record"]:
        problems.append(f"expected no completed checkpoint: {sink}")
    if case.second == "checkpoint_write" and not (
            sink["completed_record"] and sink["pointer"] == 0):
        problems.append(f"expected the record of {CRASH_EPOCH} without the pointer: {sink}")
    if case.second == "mid_commit":
        if len(lingering & set(decided)) != len(decided) - 1:
            problems.append(f"expected all but one of {decided} to linger: {sorted(lingering)}")
        left = {_gid(g) for g in case.crash["lingering"]} - set(decided)
        if case.target.kind == "parquet":
            # staged files hold nothing up: the commit rolls them back after its decided ones
            if not left <= lingering:
                problems.append(f"expected the first run's undecided {sorted(left)} to linger")
        elif left & lingering:
            # prepared transactions hold locks: the restart's tasks resolved them first
            problems.append(f"expected the restart's tasks to have rolled back the first "
                            f"run's undecided {sorted(left & lingering)} before writing")
    elif lingering:
        problems.append(f"expected everything of the batch resolved, found {sorted(lingering)}")
    if (CRASH_EPOCH in c["published"]) != (case.second != "mid_commit"):
        problems.append(f"published epochs at the second crash: {c['published']}")
    if problems:
        raise HarnessError(f"{case.name}: the second crash did not land as intended: "
                           + "; ".join(problems) + f"\n{json.dumps(c, indent=1, default=str)}")


def _check_exactly_once(case: Case, produced: set[tuple[int, int]],
                        late: set[tuple[int, int]]) -> None:
    """After the case's last run: every row once (``late`` ones in the side output, the
    others in the main target), nothing of ours prepared or staged, every recorded decision
    kept, the crashed runs' undecided pre-commits never committed, the published watermark
    never changed nor went back."""
    # a recorded decision is final, whatever crashes; without one, what a crashed run
    # pre-committed must not be what the epoch commits
    decided = case.after["sink"]["decided"]
    assert decided, f"batch {CRASH_EPOCH} has no completed checkpoint after the last run"
    crashes = [case.crash] + ([case.second_crash] if case.second else [])
    for crash in crashes:
        if crash["sink"]["decided"] is not None:
            assert decided == crash["sink"]["decided"], "the epoch's decision changed"
        else:
            left = {_gid(g) for g in crash["lingering"]}
            assert not left & set(decided), "a crashed run's undecided pre-commits were committed"
    check_delivered_once(case.after, produced, late, [c["published"] for c in crashes])


def check_delivered_once(after: dict[str, Any], produced: set[tuple[int, int]],
                         late: set[tuple[int, int]], earlier: list[dict[int, int | None]],
                         last_epoch: int = LAST_EPOCH) -> None:
    """What a target holds after a query's last run (``after``, as ``Case.record_after``
    records it): every row once (``late`` ones in the side output), nothing of ours prepared
    or staged, every batch up to ``last_epoch`` (the last with records) published with its rows
    counted, no watermark published ``earlier`` (at a crash) changed, and the published
    watermark never went back."""
    for where, rows, expected in (("main target", after["rows"], produced - late),
                                  ("side output", after["side_rows"], late)):
        duplicates = sorted({r for r in rows if rows.count(r) > 1})
        assert not duplicates, (f"{where}: {len(rows) - len(set(rows))} duplicate rows, "
                                f"e.g. {duplicates[:8]}")
        assert set(rows) == expected, (
            f"{where}: missing {sorted(expected - set(rows))[:8]}, "
            f"unexpected {sorted(set(rows) - expected)[:8]}"
        )
    assert after["lingering"] == [], "left prepared / staged after the last run"
    # every batch published; past the last batch with records the source may plan one that
    # only carries the combined watermark on (no rows)
    published, epochs = after["published"], after["epochs"]
    assert sorted(published) == list(range(max(last_epoch + 1, len(published)))), (
        f"published epochs: {published}")
    assert not {e: r for e, r in epochs.items() if e > last_epoch and r["rows"]}, (
        f"rows published after batch {last_epoch}: {epochs}")
    for before in earlier:
        for epoch, watermark in before.items():
            assert published[epoch] == watermark, f"epoch {epoch} republished differently"
    marks = [published[e] for e in sorted(published) if published[e] is not None]
    assert marks and marks == sorted(marks), f"watermark went backwards: {published}"
    assert sum(r["rows"] for r in epochs.values()) == len(produced), (
        f"rows counted per epoch: {epochs}")
    assert sum(r["late_rows"] for r in epochs.values()) == len(late), (
        f"late rows counted per epoch: {epochs}")


@pytest.mark.parametrize(("point", "kind"), CASES)
def test_restart_after_crash_is_exactly_once(suite: CrashSuite, point: str, kind: str) -> None:
    case = suite.cases[f"{point}-{kind}"]
    _check_crash_landed(case)
    _check_restarted(suite, case)
    _check_exactly_once(case, suite.produced, set())
    if kind == "parquet":  # one file per task and batch, compacted into one after batch 3
        assert case.after["files"] <= 2, f"{case.after['files']} files after compaction"


def test_named_query_runs(suite: CrashSuite) -> None:
    named = suite.extra["named"]
    if named is None:
        raise HarnessError(f"no result for the named query:\n{tail(suite.restart_log)}")
    if not named["ok"] and "queryname" not in named["error"]:
        raise HarnessError(f"the named query failed otherwise:\n{named['error']}")
    assert named["ok"], named["error"]


SECOND = [pytest.param(first, second, kind, id=f"{first}-then-{second}-{kind}")
          for first, second, kind in SECOND_CRASHES]


@pytest.mark.parametrize(("first", "second", "kind"), SECOND)
def test_crash_during_recovery_with_late_rows_is_exactly_once(
    suite: CrashSuite, retried: RetrySuite, first: str, second: str, kind: str
) -> None:
    """Killed at ``first`` in batch 1, then again at ``second`` in the restart's replay of it,
    with late rows in that batch and after it going to the side output; a third run (the
    retry suite's driver) finishes."""
    case = suite.cases[f"{first}-then-{second}-{kind}"]
    _check_crash_landed(case)
    _check_second_crash_landed(case)
    if case.final is None:
        raise HarnessError(f"no result for {case.name} from the third run:\n{tail(retried.log)}")
    assert case.final["ok"], f"the third run of the query failed:\n{case.final['error']}"
    _check_exactly_once(case, suite.produced, suite.late)


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
    kafka_bootstrap: str, postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
    suite: CrashSuite,
) -> RetrySuite:
    """Both targets in one driver with task retries (local[2,2]). The first attempt of task 0
    of batch 1 fails once the sink's transaction of that attempt has rows: an identity UDF
    upstream of the sink raises (mode ``raise``: the sink's ``write`` sees the failure and can
    clean up) or SIGKILLs the sink's write process (mode ``kill``: nothing on the task side
    cleans up). The second attempt succeeds.

    The same driver is the third run of the crash suite's cases that were killed twice (a
    driver's start-up costs more than their few batches): they run to their end beside."""
    topic = _input_topic(kafka_bootstrap, "retry")
    token = topic.rsplit("-", 1)[1]
    root = tmp_path_factory.mktemp("sink-retry")
    retry = RetrySuite({}, {}, {}, {}, {(p, o) for p in range(PARTITIONS)
                                         for o in range(PER_PARTITION)}, root / "run.log")
    jobs = []
    for kind in TARGETS:
        for mode in FAILURE_MODES:
            name = f"{kind}-{mode}"
            view = TargetView(kind, postgres_dsn, f"retry_{mode}_{token}", root / name / "out")
            retry.views[name] = view
            retry.checkpoints[name] = root / name / "checkpoint"
            retry.evidence[name] = root / name / "evidence.json"
            job: dict[str, Any] = {
                "name": name, "bootstrap": kafka_bootstrap, "topic": topic, "target": kind,
                "checkpoint": str(retry.checkpoints[name]), "max_offsets": MAX_OFFSETS,
                "fail_first_attempt": f"{CRASH_EPOCH}:0" + (":kill" if mode == "kill" else ""),
                "evidence": str(retry.evidence[name]),
            }
            if kind == "postgres":
                job.update(dsn=postgres_dsn, table=view.table)
            else:
                job.update(path=str(view.path))
            jobs.append(job)
    third = suite.stopped_twice()
    jobs += [case.job(kafka_bootstrap) for case in third]
    (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
    # UDF batches of 10 rows (the sink's of 5): the sink has rows while the task still runs
    timeout = 300.0 + RESTART_TIMEOUT_PER_QUERY * len(third)  # 300 s for the retry queries
    started = time.monotonic()
    _, results = run_to_end(
        ["--jobs", str(root / "jobs.json"), "--master", "local[2,2]", "--batch-rows", "10",
         "--start-window", "2", "--timeout", str(timeout), *RETRY_TRANSIENT], retry.log,
        timeout + 120)
    retry.results = {r["name"]: r for r in results}
    for case in third:
        case.final = retry.results.get(case.name)
        case.record_after()
    print(f"\nretry (and third) run {time.monotonic() - started:.0f} s; queries started again "
          f"after a Python worker missed connecting back: {restarts(retry.log)}",
          file=sys.stderr)
    return retry


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
