"""Prepare a SparkSession for flinkish queries: ``format("flinkish")`` registered, and Spark's
shared Python environment of the data source seeded, so that queries starting at the same
moment cannot corrupt it (docs/guides/several-queries.md). On a Spark Connect session
``flinkish.connect`` does both on the server.
"""

from __future__ import annotations

from typing import Any

from flinkish.connect import is_connect, register_connect
from flinkish.data_source import FlinkishDataSource
from flinkish.discovery import PYTHON_DATA_SOURCE, discover
from flinkish.epoch_listener import listen
from flinkish.fork_server import fork_server_socket
from flinkish.warm_start import warm_start
from flinkish.worker_launcher import worker_launcher
from flinkish.worker_python import check_worker_python
from flinkish_core.locations import MASTER_ENV

#: The keys ``PythonStreamingSourceRunner.init`` (Spark 4.x) puts into the shared map.
RUNNER_ENV_KEYS = ("SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE",
                   "SPARK_PYTHON_RUNTIME")


def register(spark: Any) -> None:
    """Make ``format("flinkish")`` usable on ``spark`` and safe for many concurrent queries.

    Call it once per driver before starting flinkish queries (idempotent). Spark's discovery
    of the installed ``pyspark_flinkish`` registers the format by itself, but only this call
    checks that Spark's Python workers can import flinkish, seeds the shared environment that
    queries starting together would corrupt, tells the source the Spark master (a local
    ``checkpointing.location`` on a cluster then fails at query start), adds the listener that
    commits each completed epoch to the query's consumer group, and starts the data source's
    Python processes ahead, faster, so a (re)started query finds them running (with a local
    master, the source's runner is forked from a server: ``flinkish.fork_server``). It works on
    a Spark Connect session too.

    Args:
        spark: the driver's ``SparkSession``, classic or Spark Connect.

    Raises:
        WorkerEnvironmentError: Spark's Python workers cannot import flinkish (the message
            names the interpreter they run and how to install flinkish there).
    """
    check_worker_python(spark)
    if is_connect(spark):
        register_connect(spark)
        return
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    sc = spark.sparkContext
    launcher = worker_launcher(sc.pythonExec) if sc.master.startswith("local") else None
    register_data_source(spark, manager, launcher)
    seed_runner_environment(spark)
    source = manager.lookupDataSource(FlinkishDataSource.name())
    if launcher is not None:
        fork_server_socket(spark, source, launcher)
    warm_start(spark, source)
    listen(spark)


def register_data_source(spark: Any, manager: Any, python: str | None) -> None:
    """Make ``format("flinkish")`` resolve to the source ``register`` builds, run by the
    interpreter command ``python`` (None: the session's): among the installed data sources
    (``flinkish.discovery``), or registered when Spark's discovery has no flinkish."""
    name = FlinkishDataSource.name()

    def entry() -> Any:
        return flinkish_source(spark, python)

    discover(spark, name, entry)
    if not manager.dataSourceExists(name):  # Spark's discovery found no flinkish, or failed
        spark._jsparkSession.dataSource().registerPython(name, entry())


def flinkish_source(spark: Any, python: str | None) -> Any:
    """flinkish's ``UserDefinedPythonDataSource`` as ``spark.dataSource.register`` builds it, run
    by the interpreter command ``python`` (None: the session's)."""
    from pyspark.core.rdd import _prepare_for_python_RDD

    sc = spark.sparkContext
    command, broadcasts, env, includes = _prepare_for_python_RDD(sc, FlinkishDataSource)
    jvm = spark._jvm
    function = jvm.SimplePythonFunction(bytearray(command), env, includes,
                                        python or sc.pythonExec, sc.pythonVer, broadcasts,
                                        sc._javaAccumulator)
    return getattr(jvm, PYTHON_DATA_SOURCE)(function)


def seed_runner_environment(spark: Any) -> dict[str, str]:
    """Put the streaming source runner's keys into the data source's shared environment map
    before any flinkish query starts, so the runners only overwrite them; the keys it added
    (none on Spark Connect, where ``register``'s warm-up query seeds the map)."""
    if is_connect(spark):
        register_connect(spark)
        return {}
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    env = manager.lookupDataSource(FlinkishDataSource.name()).dataSourceCls().envVars()
    conf = spark.sparkContext._jsc.sc().conf()
    # the runner overwrites these values with its own before it starts a worker: only the keys
    # matter
    local_dirs = spark._jvm.org.apache.spark.util.Utils.getConfiguredLocalDirs(conf)
    values = {"SPARK_LOCAL_DIRS": ",".join(local_dirs),
              "SPARK_AUTH_SOCKET_TIMEOUT": str(
                  conf.getTimeAsSeconds("spark.python.authenticate.socketTimeout", "15s")),
              "SPARK_BUFFER_SIZE": str(conf.getInt("spark.buffer.size", 65536)),
              "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER"}
    added = {key: value for key, value in values.items() if not env.containsKey(key)}
    for key, value in added.items():
        env.put(key, value)
    # not a runner key: the source's Python processes read it when they check their options;
    # put only while it is absent or different (a running query's tasks may serialise the map)
    master = spark.sparkContext.master
    if env.get(MASTER_ENV) != master:
        if not env.containsKey(MASTER_ENV):
            added[MASTER_ENV] = master
        env.put(MASTER_ENV, master)
    return added
