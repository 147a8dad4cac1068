"""``flinkish.register`` fails at once, naming the module, the interpreter and the fix, when
Spark's Python workers cannot import what flinkish's tasks need (a script run with a
virtualenv's interpreter while the workers start another one, with or without flinkish on its
path); with the fix, a plain script registers, runs a query to its end and exits cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from integration.kafka_helpers import produce

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]

DRIVER = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    import flinkish

    spark = (SparkSession.builder.master("local[1]").appName("worker-python")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        flinkish.register(spark)
    except flinkish.WorkerEnvironmentError as exc:
        print("REFUSED:", exc)
        sys.exit(3)
    finally:
        spark.stop()
    print("REGISTERED")
""")


def test_register_names_the_worker_interpreter_that_cannot_import_flinkish(
    tmp_path: Path
) -> None:
    bare = getattr(sys, "_base_executable", "") or "python3"  # the virtualenv's base: no flinkish
    if subprocess.run([bare, "-c", "import flinkish"], cwd=tmp_path,
                      env={"PATH": os.environ["PATH"]}, capture_output=True).returncode == 0:
        pytest.skip(f"{bare} can import flinkish: no interpreter without it to test with")
    if subprocess.run([bare, "-c", "import pyarrow"], capture_output=True).returncode == 0:
        pytest.skip(f"{bare} has pyarrow: no half-working interpreter to test with")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PYSPARK_PYTHON"] = bare
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 3, (result.stdout, result.stderr[-3000:])
    message = result.stdout
    assert "flinkish: ModuleNotFoundError: No module named 'flinkish'" in message
    assert f"they run {os.path.realpath(bare)}" in message or f"they run {bare}" in message
    assert f"PYSPARK_PYTHON={sys.executable}" in message

    # run from inside the checkout, the same interpreter imports flinkish from the working
    # directory, but a read task would fail on pyarrow: register says so, not the read task
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 3, (result.stdout, result.stderr[-3000:])
    assert "pyarrow: ModuleNotFoundError: No module named 'pyarrow'" in result.stdout
    assert "PYSPARK_PYTHON" in result.stdout
    # (with workers that have everything it registers: every other integration test does)


ENDING = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    import flinkish

    bootstrap, topic, group, work = sys.argv[1:5]
    spark = (SparkSession.builder.master("local[2]").appName("ends-without-stop")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    flinkish.register(spark)
    query = (spark.readStream.format("flinkish").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "100").option("kafka.group.id", group)
             .option("checkpointing.location", work + "/state").load()
             .writeStream.format("noop").option("checkpointLocation", work + "/ck")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    print("ENDED", query.lastProgress["batchId"])
""")


def test_a_plain_script_that_exits_after_its_query_ends_leaves_the_group_at_the_end(
    tmp_path: Path, kafka_bootstrap: str, topic: Any
) -> None:
    """A user's script as the error above tells them to run it: a plain SparkSession (its
    workers import pyspark from Spark's pyspark.zip, which the check's probe must stamp), no
    ``spark.stop()``. Spark delivers a query's last progress to the listener ``register``
    added on its own thread, possibly after ``awaitTermination`` returned: the driver's exit
    lets it arrive, so the group holds the query's end and the JVM logs no listener error.
    Spark's log stays at its default level (WARN), as in the README: ``register`` puts flinkish
    in Spark's discovered data sources, so nothing replaces a registered data source, a
    warning Spark would log at ``register`` and at every query's start."""
    from confluent_kafka import Consumer, TopicPartition

    name = topic(3)
    produce(kafka_bootstrap, name, [(p, b"k", b"{}", 1_700_000_000_000 + i)
                                    for i in range(100) for p in range(3)])
    script = tmp_path / "ends.py"
    script.write_text(ENDING)
    group = f"ends-{name}"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_DRIVER_PYTHON"}  # the demo's
    env["PYSPARK_PYTHON"] = sys.executable
    result = subprocess.run([sys.executable, str(script), kafka_bootstrap, name, group,
                             str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ENDED" in result.stdout
    assert "threw an exception" not in result.stderr, result.stderr[-3000:]
    assert "DataSourceManager" not in result.stderr, result.stderr[-3000:]
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(name, p) for p in range(3)], timeout=30)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == {0: 100, 1: 100, 2: 100}
