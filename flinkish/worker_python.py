"""Check, once per session, that the Python Spark starts for its workers can run flinkish's
read and write tasks.

Without it a worker interpreter without flinkish (a virtualenv's script run unactivated starts
workers with ``python3`` from the PATH) fails every query at ``.load()`` with a
``ModuleNotFoundError`` that names neither the interpreter nor the fix, or later, in a read
task. The check is a Spark job of its own, paid by every starting driver: with a local master
a success is remembered under what decides the answer (:func:`_remembered_key`) while the files
the imports found are unchanged. A failure is never remembered, and a cluster's (or Spark
Connect's) executors are always asked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flinkish_core.errors import WorkerEnvironmentError

_checked: weakref.WeakSet[Any] = weakref.WeakSet()

#: What a worker imports to run a read or write task, in the order a failure is reported:
#: flinkish itself, the libraries every task needs, then the source's and the sink's modules.
TASK_MODULES = (
    "flinkish",
    "pyarrow",
    "confluent_kafka",
    "flinkish.data_source",
    "flinkish_source.partition_reader",
    "flinkish_sink.stream_writer",
)


#: A file the imports found: (path, st_mtime_ns, st_size).
FileStamp = tuple[str, int, int]


def worker_probe(
    modules: tuple[str, ...]
) -> Callable[[], tuple[str, str | None, list[FileStamp]]]:
    """A function that imports ``modules`` where it runs and returns that interpreter, the
    first failure (None if all import) and the files the imports came from. A closure, so that
    cloudpickle ships it by value to a worker that may lack flinkish."""

    def probe() -> tuple[str, str | None, list[FileStamp]]:
        import importlib
        import os as worker_os
        import sys as worker_sys

        found = []
        for module in (*modules, "pyspark"):
            try:
                path = importlib.import_module(module).__file__
            except Exception as exc:  # any failure to import is the answer, reported as is
                return worker_sys.executable, f"{module}: {type(exc).__name__}: {exc}", []
            # a module imported from an archive (Spark puts pyspark.zip on its workers' path)
            # has its path inside it: the archive is the file that changes
            while path:
                try:
                    stat = worker_os.stat(path)
                except (NotADirectoryError, FileNotFoundError):
                    parent = worker_os.path.dirname(path)
                    path = parent if parent != path else None
                    continue
                found.append((path, stat.st_mtime_ns, stat.st_size))
                break
        return worker_sys.executable, None, found

    return probe


def _remembered_key(spark: Any) -> str | None:
    """What decides a local master's workers' answer (None for any other master): their
    interpreter, ``PYTHONPATH`` (this process's and ``spark.executorEnv``'s), working directory."""
    sc = spark.sparkContext
    if not sc.master.startswith("local"):
        return None
    python = shutil.which(sc.pythonExec)
    if python is None:
        return None
    # the path found and the file it leads to: a virtualenv's interpreter is a link to its base
    # interpreter, which has the same file but not the virtualenv's packages
    python = os.path.abspath(python)
    binary = os.path.realpath(python)
    stat = os.stat(binary)
    key = [python, binary, stat.st_mtime_ns, stat.st_size, os.environ.get("PYTHONPATH", ""),
           sc.environment.get("PYTHONPATH", ""), os.getcwd(), sc.version]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]


def _remembered(key: str) -> Path:
    return Path(tempfile.gettempdir()) / f"flinkish-worker-check-{key}.json"


def _known_good(key: str | None) -> bool:
    """A success remembered under ``key`` whose files are all there, with the same stamps."""
    if key is None:
        return False
    try:
        files = json.loads(_remembered(key).read_text())
        stamps = [os.stat(str(path)) for path, _, _ in files]
    except (OSError, ValueError):
        return False
    return bool(files) and all((s.st_mtime_ns, s.st_size) == (int(m), int(n))
                               for s, (_, m, n) in zip(stamps, files, strict=True))


def _remember(key: str, files: list[FileStamp]) -> None:
    path = _remembered(key)
    staged = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        staged.write_text(json.dumps(files))
        staged.replace(path)
    except OSError:  # only a shortcut for the next driver: without it, it asks the workers
        staged.unlink(missing_ok=True)


def check_worker_python(spark: Any) -> None:
    """Raise :class:`WorkerEnvironmentError` when Spark's Python workers cannot import
    :data:`TASK_MODULES`; once per session, without a job where an earlier success holds."""
    if spark in _checked:
        return
    from pyspark.sql import functions as F

    from flinkish.connect import is_connect

    probe = worker_probe(TASK_MODULES)
    key = None
    if is_connect(spark):
        udf = F.udf(lambda: probe()[:2], "struct<python: string, error: string>")
        try:
            python, error = spark.range(1).select(udf().alias("p")).collect()[0].p
        except Exception as exc:  # the UDF runner itself needs pyspark's dependencies
            python, error = "the server's PYSPARK_PYTHON", str(exc).splitlines()[0]
    else:
        key = _remembered_key(spark)
        if _known_good(key):
            _checked.add(spark)
            return
        # an RDD task: its worker needs nothing but the standard library (a UDF needs pyarrow)
        python, error, files = spark.sparkContext.parallelize([0], 1).map(
            lambda _: probe()).first()
        if error is None and key is not None:
            _remember(key, files)
    if error is not None:
        raise WorkerEnvironmentError(
            f"Spark's Python workers cannot import what flinkish's read and write tasks need "
            f"({error}): they run {python}. Spark starts them with spark.pyspark.python or "
            f"the PYSPARK_PYTHON environment variable, else python3 from the PATH; this driver "
            f"runs {sys.executable}. Install flinkish with its dependencies into {python}, or set "
            f"PYSPARK_PYTHON={sys.executable} (on a Spark Connect or cluster deployment: on "
            "the server and the executors) before the SparkSession starts."
        )
    _checked.add(spark)
