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
    fixed 10 s Spark allows (``PythonWorkerFactory``), as when many start at once on 2 cores."""
    return failure is not None and WORKER_CONNECT_TIMEOUT in str(failure)


def worker_python() -> str:
    """This interpreter through ``flinkish.worker_launcher``, for every Python process from the
    first on: they start faster, within the 10 s Spark gives a new worker to connect back."""
    from flinkish.worker_launcher import worker_launcher

    return worker_launcher(sys.executable)


def local_session(app: str = "flinkish", cores: str = "2", master: str | None = None,
                  **conf: str) -> Any:
    """A ``local[cores]`` session (or on ``master``, e.g. ``local-cluster[2,1,1024]``) with small
    shuffles and no console progress bars."""
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    # what Spark starts a data source it discovers by itself with (defaultPythonExec)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", worker_python())
    root = str(Path(__file__).resolve().parents[2])  # the project root, not flinkish/
    path = os.environ.get("PYTHONPATH", "")
    if root not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, path) if p)
    log4j = Path(tempfile.gettempdir()) / "flinkish-log4j2.properties"
    log4j.write_text(_LOG4J)
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC",
        "spark.python.daemon.module": "flinkish.worker_daemon",
        # the default 15 s to connect to the JVM's sockets is missed by queries starting at once
        "spark.python.authenticate.socketTimeout": "120s",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j}",
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j}",
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
    }
    spark = (SparkSession.builder.master(master or f"local[{cores}]").appName(app)
             .config(map={**settings, **conf}).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark
