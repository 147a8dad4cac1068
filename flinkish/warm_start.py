"""Start the Python daemons of the data source's driver-side calls while the driver is busy
elsewhere, so a (re)started query finds them running instead of starting each in turn on the
way to its first commit (docs/guides/recover-after-crash.md).

``SparkEnv`` keys its worker factories on the interpreter, the module and the worker's
environment, and hands a released worker to the first call with the same key: so the
environment here must be the one Spark's runners give (Spark 4.3). Where it cannot be known,
nothing is started; a key that no longer matches only leaves an idle daemon behind.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_DAEMON = "pyspark.daemon"
SPARK_ENV, BLOCK_MANAGER = "org.apache.spark.SparkEnv", "org.apache.spark.storage.BlockManager"

#: Per Spark application: the thread starting the workers and the modules it started.
_runs: dict[str, tuple[threading.Thread, list[str]]] = {}
_lock = threading.Lock()

#: The modules of the data source's driver-side calls, in the order a first batch calls them.
DRIVER_MODULES = (
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.python_streaming_sink_runner",
)


def planner_environment(spark: Any, runner: dict[str, str]) -> dict[str, str]:
    """What ``PythonPlannerRunner.runInPython`` (Spark 4.3) adds to ``runner``'s entries in a
    worker's environment."""
    sql_conf = spark._jsparkSession.sessionState().conf()
    env = dict(runner)
    memory = sql_conf.pythonPlannerExecMemory()
    if memory.isDefined():
        env["PYSPARK_PLANNER_MEMORY_MB"] = str(memory.get())
    if sql_conf.pythonWorkerLoggingEnabled():
        env["PYSPARK_SPARK_SESSION_UUID"] = str(spark._jsparkSession.sessionUUID())
    return env


def task_environment(spark: Any, runner: dict[str, str]) -> dict[str, str] | None:
    """What ``BasePythonRunner.compute`` (Spark 4.3) adds to ``runner``'s entries in the data
    source's read and write tasks' workers; None when it cannot be known from here (the tasks'
    executor memory for Python set, Python UDF pipelining on)."""
    conf = spark.sparkContext._jsc.sc().conf()
    if conf.contains("spark.executor.pyspark.memory") or conf.getBoolean(
            "spark.python.udf.pipelined.enabled", False):
        return None
    env = dict(runner)
    if not conf.contains("spark.executorEnv.OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = str(conf.getInt("spark.task.cpus", 1))
    env["PYTHON_UDF_BATCH_SIZE"] = str(
        spark.conf.get("spark.sql.execution.python.udf.maxRecordsPerBatch", "100"))
    return env


def runner_environment(spark: Any) -> dict[str, str] | None:
    """What the planner's and the tasks' runners both add to the data source's shared map in a
    worker's environment; None when it cannot be known from here."""
    sql_conf = spark._jsparkSession.sessionState().conf()
    conf = spark.sparkContext._jsc.sc().conf()
    if sql_conf.pythonUDFWorkerFaulthandlerEnabled():
        return None
    env = {"SPARK_LOCAL_DIRS": block_manager_dirs(spark)}
    if conf.getBoolean("spark.python.worker.reuse", True):
        env["SPARK_REUSE_WORKER"] = "1"
    for flag, key in ((sql_conf.pysparkHideTraceback(), "SPARK_HIDE_TRACEBACK"),
                      (sql_conf.pysparkSimplifiedTraceback(), "SPARK_SIMPLIFIED_TRACEBACK"),
                      (sql_conf.pysparkTracebackWithLocals(), "SPARK_TRACEBACK_WITH_LOCALS"),
                      (sql_conf.pythonUDFDaemonKillWorkerOnFlushFailure(),
                       "PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE")):
        if flag:
            env[key] = "1"
    env["SPARK_AUTH_SOCKET_TIMEOUT"] = str(
        conf.getTimeAsSeconds("spark.python.authenticate.socketTimeout", "15s"))
    env["SPARK_BUFFER_SIZE"] = str(conf.getInt("spark.buffer.size", 65536))
    dump_interval = sql_conf.pythonUDFWorkerTracebackDumpIntervalSeconds()
    if dump_interval > 0:
        env["PYTHON_TRACEBACK_DUMP_INTERVAL_SECONDS"] = str(dump_interval)
    env["SPARK_JOB_ARTIFACT_UUID"] = "default"
    env["SPARK_PYTHON_RUNTIME"] = "PYTHON_WORKER"
    return env


def block_manager_dirs(spark: Any) -> str:
    """The driver's block manager directories, as the runners put them into ``SPARK_LOCAL_DIRS``."""
    spark_env = spark.sparkContext._jsc.sc().env()
    block_manager = call(spark, spark_env, SPARK_ENV, "blockManager", BLOCK_MANAGER)
    disk = call(spark, block_manager, BLOCK_MANAGER, "diskBlockManager",
                "org.apache.spark.storage.DiskBlockManager")
    dirs = call(spark, disk, "org.apache.spark.storage.DiskBlockManager", "localDirs",
                "[Ljava.io.File;")
    return ",".join(str(d.getPath()) for d in dirs)


#: Per py4j gateway: the method handles :func:`call` looked up, by (class, method, signature).
_handles: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], Any]] = (
    weakref.WeakKeyDictionary())


def call(spark: Any, target: Any, owner: str, method: str, returns: str,
         *args: tuple[str, Any]) -> Any:
    """``target.method(*args)`` in the JVM, each argument a (class name, value) pair, through a
    method handle: py4j's reflection fails on ``SparkEnv`` and ``BlockManager`` in a
    pip-installed PySpark (a signature names ``com.google.protobuf`` classes it does not ship).
    Each handle is looked up once per JVM (every py4j call is a round trip)."""
    jvm, gateway = spark._jvm, spark.sparkContext._gateway
    signature = (owner, method, returns, *(name for name, _ in args))
    handles = _handles.setdefault(gateway, {})
    handle = handles.get(signature)
    if handle is None:
        def java_class(name: str) -> Any:
            if name == "boolean":
                return jvm.java.lang.Boolean.TYPE
            return jvm.java.lang.Void.TYPE if name == "void" else jvm.java.lang.Class.forName(name)

        types = gateway.new_array(jvm.java.lang.Class, len(args))
        for i, (name, _) in enumerate(args):
            types[i] = java_class(name)
        handle = jvm.java.lang.invoke.MethodHandles.publicLookup().findVirtual(
            java_class(owner), method, jvm.java.lang.invoke.MethodType.methodType(
                java_class(returns), types))
        handles[signature] = handle
    values = gateway.new_array(jvm.java.lang.Object, len(args) + 1)
    values[0] = target
    for i, (_, value) in enumerate(args):
        values[i + 1] = value
    return handle.invokeWithArguments(values)


def plans(spark: Any, source: Any) -> list[tuple[str, str, Any]]:
    """(worker module, daemon module, environment) of each daemon to start ahead, in order:
    :data:`DRIVER_MODULES` and, with a local master, the tasks' last: it holds Spark's one
    start lock the longest, and before the commit's the first batch would wait for both. Each
    environment is a Scala map: the data source's shared map copied in the JVM with the
    runner's entries added (one py4j call, where reading it into Python takes several an
    entry)."""
    conf = spark.sparkContext._jsc.sc().conf()
    if not conf.getBoolean("spark.python.use.daemon", True):
        return []
    runner = runner_environment(spark)
    if runner is None:
        return []
    source_env = source.dataSourceCls().envVars()
    jvm = spark._jvm
    python_utils = jvm.org.apache.spark.api.python.PythonUtils

    def scala_env(entries: dict[str, str]) -> Any:
        env = jvm.java.util.HashMap(source_env)
        env.putAll(entries)  # py4j hands the dict over as a java.util.Map
        return python_utils.toScalaMap(env)

    planner = scala_env(planner_environment(spark, runner))
    found = [(module, DEFAULT_DAEMON, planner) for module in DRIVER_MODULES]
    master = spark.sparkContext.master
    tasks = task_environment(spark, runner)
    if tasks is not None and (master == "local" or master.startswith("local[")):
        found.append((conf.get("spark.python.worker.module", "pyspark.worker"),
                      conf.get("spark.python.daemon.module", DEFAULT_DAEMON), scala_env(tasks)))
    return found


#: How long the background thread leaves Spark's worker lock free between two daemons: a call
#: of the query's own (``load()``'s creation of the data source) waiting for the lock gets it
#: then, instead of after every daemon (Java's monitors are not fair: the thread that releases
#: one takes it again first, unless the waiting thread has run in between).
PAUSE_BETWEEN_DAEMONS_S = 0.05


def warm_start(spark: Any, source: Any) -> None:
    """Start a worker of each of :func:`plans` for the registered data source ``source`` (a
    ``UserDefinedPythonDataSource``) in a background thread, once per Spark application."""
    application = str(spark.sparkContext.applicationId)
    with _lock:
        if application in _runs:
            return
        python = source.dataSourceCls().pythonExec()
        keys = [(("java.lang.String", python), ("java.lang.String", module),
                 ("java.lang.String", daemon), ("scala.collection.immutable.Map", env))
                for module, daemon, env in plans(spark, source)]
        started: list[str] = []

        def start() -> None:
            spark_env = spark.sparkContext._jsc.sc().env()
            for i, key in enumerate(keys):
                if i:
                    time.sleep(PAUSE_BETWEEN_DAEMONS_S)
                try:
                    worker = call(spark, spark_env, SPARK_ENV, "createPythonWorker",
                                  "scala.Tuple2", *key, ("boolean", True))._1()
                    call(spark, spark_env, SPARK_ENV, "releasePythonWorker", "void", *key,
                         ("org.apache.spark.api.python.PythonWorker", worker))
                except Exception as exc:  # noqa: BLE001 - the call starts its own worker then
                    log.debug("could not start a worker of %s ahead: %s", key[1][1], exc)
                    return
                started.append(key[1][1])

        thread = threading.Thread(target=start, name="flinkish-warm-start", daemon=True)
        _runs[application] = (thread, started)
    thread.start()


def started(spark: Any, timeout: float) -> tuple[str, ...]:
    """The modules :func:`warm_start` started for ``spark``'s application, once it is done
    (waiting up to ``timeout`` seconds)."""
    with _lock:
        thread, modules = _runs[str(spark.sparkContext.applicationId)]
    thread.join(timeout)
    return tuple(modules)
