"""A quiet local SparkSession whose Python workers can import flinkish (demo, tests, bench)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


WORKER_CONNECT_TIMEOUT = "Python worker failed to connect back"


def worker_start_timed_out(failure: BaseException | None) -> bool:
    """Whether a query failed only because a new Python worker did not connect back within the
    fixed 10 s Spark allows (``PythonWorkerFactory``): too short when many start at once on 2
    busy cores. Restarting such a query from its checkpoint is safe; any other failure is not
    this."""
    return failure is not None and WORKER_CONNECT_TIMEOUT in str(failure)


def worker_python() -> str:
    """An interpreter for Spark's Python workers: this one, through
    ``flinkish.worker_launcher`` (the installed pyspark rather than Spark's ``pyspark.zip``,
    Spark's jars off the path). The demo's workers need it from their first process on: Spark
    gives a new worker a fixed 10 s to connect back (``PythonWorkerFactory``), which many
    queries starting at once on 2 cores overrun."""
    from flinkish.worker_launcher import worker_launcher

    return worker_launcher(sys.executable)


def local_session(app: str = "flinkish", cores: str = "2", master: str | None = None,
                  **conf: str) -> Any:
    """A ``local[cores]`` session (or on ``master``, e.g. ``local-cluster[2,1,1024]``: separate
    executor processes, which get the same worker interpreter and project path) with small
    shuffles and no console progress bars."""
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    # Spark starts the Python processes of a data source it discovers by itself (the installed
    # pyspark_flinkish module) with PYSPARK_DRIVER_PYTHON (PythonUtils.defaultPythonExec) and
    # pyspark.zip on their path: each query's source runner would pay the zip import too.
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", worker_python())
    root = str(Path(__file__).resolve().parents[2])  # the project root, not flinkish/
    path = os.environ.get("PYTHONPATH", "")
    if root not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, path) if p)
    log4j = Path(tempfile.gettempdir()) / "flinkish-log4j2.properties"
    log4j.write_text(_LOG4J)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master or f"local[{cores}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.daemon.module", "flinkish.worker_daemon")
        # a Python process must connect to the JVM's authenticated sockets (collect(), a
        # worker's) within this; the default 15 s is missed when several queries start at once
        # on 2 busy cores
        .config("spark.python.authenticate.socketTimeout", "120s")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j}")
        .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j}")
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
