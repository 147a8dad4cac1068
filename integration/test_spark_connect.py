"""Every public flinkish API on a Spark Connect session: ``register``, ``with_watermark``, the
sink (PostgreSQL, Parquet and Kafka), ``ValveForEachBatch``, queries started together, a stop and
restart. The server and its clients are processes of their own
(``integration/connect_session.py`` says why).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from flinkish.demo.embedded_kafka import create_topic
from flinkish.session import RUNNER_ENV_KEYS
from integration.connect_session import Child, run_client
from integration.kafka_committed import settled_values
from integration.kafka_helpers import wait_for
from integration.test_kafka_features import GroupReader
from integration.test_sink_crash import BASE_TS, PARTITIONS, PER_PARTITION, TargetView, _input_topic
from integration.test_window_crash import table_windows

pytestmark = pytest.mark.integration

WINDOW_MS = 10_000
MAX_OFFSETS = 100  # records per batch over all partitions: four data batches
OUT_PARTITIONS = 2  # of the Kafka target's output topic


def _job(root: Path, name: str, kind: str, target: str, topic: str, bootstrap: str, dsn: str,
         **extra: Any) -> tuple[dict[str, Any], TargetView]:
    view = TargetView(target, dsn, f"connect_{root.name}_{name}".replace("-", "_"),
                      root / name / "out")
    job = {"name": name, "kind": kind, "target": target, "topic": topic,
           "bootstrap": bootstrap, "checkpoint": str(root / name / "checkpoint"),
           "max_offsets": MAX_OFFSETS, **extra}
    if kind == "valve":
        job["path"] = str(root / name / "epochs.jsonl")
    elif target == "postgres":
        job.update(dsn=dsn, table=view.table)
    elif target == "kafka":
        out = f"connect-out-{root.name}-{name}"
        create_topic(bootstrap, out, OUT_PARTITIONS)
        job["sink_options"] = {"topic": out, "kafka.bootstrap.servers": bootstrap}
    else:
        job["path"] = str(view.path)
    return job, view


def _expected_windows() -> Counter[tuple[int, int]]:
    """(window start ms, partition) -> records of ``_input_topic``'s input."""
    return Counter((ts - ts % WINDOW_MS, p) for p in range(PARTITIONS)
                   for ts in (BASE_TS + i * 1_000 + p for i in range(PER_PARTITION)))


def _windows(view: TargetView) -> list[tuple[int, int, int]]:
    """(window start ms, partition, count) of every window row in the target."""
    if view.kind == "postgres":
        return sorted((s, p, c) for s, _, p, c in table_windows(view))
    table = ds.dataset(str(view.path), format="parquet").to_table(
        columns=["window_start", "partition", "count"])
    starts = table.column("window_start").cast(pa.timestamp("ms")).cast(pa.int64()).to_pylist()
    return sorted(zip(starts, table.column("partition").to_pylist(),
                      table.column("count").to_pylist(), strict=True))


def _expected_rows() -> list[tuple[int, int]]:
    return sorted((p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION))


def test_every_api_on_connect_with_queries_started_together(
    connect_server: tuple[Child, int], kafka_bootstrap: str, postgres_dsn: str, tmp_path: Path
) -> None:
    """``register`` seeds the session's map through its warm-up query (the keys are there
    before any user query, and six queries started at once only overwrite them); windowed
    counts on ``with_watermark`` into both file and table targets, the records into those and
    exactly once into a Kafka topic, and ``ValveForEachBatch`` are each exactly right."""
    topic = _input_topic(kafka_bootstrap, "connect")
    specs = [("windowed-pg", "windowed", "postgres"), ("windowed-pq", "windowed", "parquet"),
             ("records-pg", "records", "postgres"), ("records-pq", "records", "parquet"),
             ("records-kafka", "records", "kafka"), ("valve", "valve", "parquet")]
    made = [_job(tmp_path, name, kind, target, topic, kafka_bootstrap, postgres_dsn)
            for name, kind, target in specs]
    hello, keys, _ = run_client(connect_server, tmp_path, [job for job, _ in made])
    assert hello["connect"]
    assert set(RUNNER_ENV_KEYS) <= set(keys)
    views = {job["name"]: view for job, view in made}
    expected = _expected_windows()
    for name in ("windowed-pg", "windowed-pq"):
        got = _windows(views[name])
        assert Counter({(w, p): c for w, p, c in got}) == expected, name
        assert len(got) == len(expected), f"{name}: a window was written twice"
    for name in ("records-pg", "records-pq"):
        assert sorted(views[name].rows()) == _expected_rows(), name
    # the Kafka target: each record once in the output topic's committed view, no transaction
    # left open
    out = next(job for job, _ in made if job["name"] == "records-kafka")["sink_options"]["topic"]
    written = settled_values(kafka_bootstrap, out, OUT_PARTITIONS)
    assert sorted(written) == sorted(f"v{p}-{i}".encode() for p in range(PARTITIONS)
                                     for i in range(PER_PARTITION))
    epochs = [json.loads(line) for line in
              Path(made[-1][0]["path"]).read_text().splitlines()]
    assert len({e["epoch"] for e in epochs}) == len(epochs), "an epoch was delivered twice"
    assert sorted(tuple(r) for e in epochs for r in e["records"]) == _expected_rows()
    assert sum(e["rows"] for e in epochs) == PARTITIONS * PER_PARTITION
    assert epochs[-1]["watermark"] is not None  # the valve's combined watermark came through


def test_stop_and_restart_on_connect_is_exactly_once(
    connect_server: tuple[Child, int], kafka_bootstrap: str, postgres_dsn: str, tmp_path: Path
) -> None:
    """Each query is stopped once its batch 1 committed, started again from its checkpoint
    and run to the end: every record and every window exactly once. The windows are
    ``flinkish.windows``' (its default operator, its state restored by the restart).

    A third commits to a consumer group and triggers hourly: Spark does not call its reader
    again after batch 0 before it is stopped, so the group holds batch 0's end only through
    the listener ``register`` added, which runs in the Connect server; after the restart's
    ``availableNow`` run the group holds its last epoch's end."""
    topic = _input_topic(kafka_bootstrap, "connect-restart")
    made = [_job(tmp_path, "records-pg", "records", "postgres", topic, kafka_bootstrap,
                 postgres_dsn, stop_after=1),
            _job(tmp_path, "windowed-pq", "windowed", "parquet", topic, kafka_bootstrap,
                 postgres_dsn, stop_after=1, windows="flinkish"),
            _job(tmp_path, "grouped-pq", "records", "parquet", topic, kafka_bootstrap,
                 postgres_dsn, stop_after=0, interval="1 hour", group=f"watch-{topic}")]
    _, _, results = run_client(connect_server, tmp_path, [job for job, _ in made])
    # stopped before the end, so the restart had batches left to run
    assert all(1 <= r["stopped_after"] < PARTITIONS * PER_PARTITION // MAX_OFFSETS
               for r in results[:2]), results
    assert sorted(made[0][1].rows()) == _expected_rows()
    got = _windows(made[1][1])
    assert Counter({(w, p): c for w, p, c in got}) == _expected_windows()
    assert len(got) == len(_expected_windows()), "a window was written twice"
    assert results[2]["stopped_after"] == 0 and results[2]["group_before_stop"], results[2]
    assert sorted(made[2][1].rows()) == _expected_rows()
    group = GroupReader(kafka_bootstrap, f"watch-{topic}", topic, PARTITIONS)
    everything = {(topic, p): PER_PARTITION for p in range(PARTITIONS)}
    wait_for(lambda: group.committed() == everything, 60, "the group at the input's end")
