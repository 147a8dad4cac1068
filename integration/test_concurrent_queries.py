"""Many flinkish queries started at the same moment in one driver.

Spark shares one environment map between every query of a Python data source and its
streaming source runner inserts keys into it from each query's thread; two first inserts at
once corrupt the map for the driver's lifetime (``Task not serializable: Illegal size 5 of
collection, expected 7``, see ``flinkish.session``). ``flinkish.register`` seeds the keys so
the runners only overwrite them. Each run is a fresh driver process: the map lives in the
JVM, so only a new one starts from Spark's pristine state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flinkish.session import RUNNER_ENV_KEYS
from integration.test_sink_crash import PARTITIONS, PER_PARTITION, TargetView, _input_topic
from integration.test_sink_crash import run_to_end as run_driver

pytestmark = pytest.mark.integration

QUERIES = 8


def _env(log: Path) -> dict[str, Any]:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith('{"env_keys_before"'):
            return json.loads(line)
    raise AssertionError(f"the driver printed no environment report:\n{log.read_text()[-3000:]}")


def _jobs(root: Path, bootstrap: str, topic: str, dsn: str, count: int) -> list[TargetView]:
    views = []
    jobs = []
    for i in range(count):
        kind = "postgres" if i % 2 == 0 else "parquet"
        work = root / f"q{i}"
        view = TargetView(kind, dsn, f"together_{root.name}_{i}".replace("-", "_"), work / "out")
        job: dict[str, Any] = {"name": f"q{i}", "bootstrap": bootstrap, "topic": topic,
                               "checkpoint": str(work / "checkpoint"), "target": kind,
                               "max_offsets": 200}
        job.update({"dsn": dsn, "table": view.table} if kind == "postgres"
                   else {"path": str(view.path)})
        jobs.append(job)
        views.append(view)
    (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
    return views


def test_spark_inserts_runner_keys_into_the_shared_map_without_register(
    kafka_bootstrap: str, postgres_dsn: str, tmp_path: Path  # noqa: F811
) -> None:
    """The hazard itself: left to automatic discovery, the first query's source runner adds
    keys to the map all queries share (if Spark ever copies it instead, this fails and the
    seeding in ``flinkish.register`` can go)."""
    topic = _input_topic(kafka_bootstrap, "env")
    _jobs(tmp_path, kafka_bootstrap, topic, postgres_dsn, 1)
    code, results = run_driver(
        ["--jobs", str(tmp_path / "jobs.json"), "--no-register", "--timeout", "240"],
        tmp_path / "driver.log", 360)
    assert code == 0 and all(r["ok"] for r in results), results
    env = _env(tmp_path / "driver.log")
    assert env["env_keys_before"] == ["PYTHONPATH"]
    assert set(RUNNER_ENV_KEYS) <= set(env["env_keys_after"])


def test_queries_started_together_are_each_exactly_once(
    kafka_bootstrap: str, postgres_dsn: str, tmp_path: Path  # noqa: F811
) -> None:
    """One driver is enough: whether the runners inserted a key is not left to the race,
    the environment map's keys are compared before and after."""
    topic = _input_topic(kafka_bootstrap, "together")
    views = _jobs(tmp_path, kafka_bootstrap, topic, postgres_dsn, QUERIES)
    code, results = run_driver(
        # Spark gives a new Python worker a fixed 10 s to connect back; 8 queries starting at
        # once on 2 cores can overrun it, a failure of its own that only a restart from the
        # checkpoint answers: any other failure (the corrupted map among them) still fails
        ["--jobs", str(tmp_path / "jobs.json"), "--together", "--master", "local[2]",
         "--retry-transient", "3",
         "--timeout", "400"],
        tmp_path / "driver.log", 520)
    failed = [r for r in results if not r["ok"]]
    assert code == 0 and len(results) == QUERIES and not failed, "\n\n".join(
        f"{r['name']}: {r['error'][-2500:]}" for r in failed) or results
    env = _env(tmp_path / "driver.log")
    assert set(RUNNER_ENV_KEYS) <= set(env["env_keys_before"])
    assert env["env_keys_after"] == env["env_keys_before"]  # the runners only overwrote
    expected = sorted((p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION))
    for view in views:
        assert sorted(view.rows()) == expected, view.table
