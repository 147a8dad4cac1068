"""Check, once per session, that the Python Spark starts for its workers can run flinkish's
read and write tasks.

A script run with a virtualenv's interpreter (the virtualenv not activated) starts workers with
``python3`` from the PATH, which has no flinkish: every query then fails at ``.load()`` with
``PYTHON_DATA_SOURCE_ERROR … ModuleNotFoundError: No module named 'flinkish'``, which names
neither the interpreter nor the fix. Run from inside a checkout, that ``python3`` does import
flinkish (from the working directory) but not pyarrow or confluent-kafka, and the query fails
later, in a read task. ``register`` asks the workers themselves to import what those tasks
import, with a one-row task (an RDD task on a classic session, a UDF on Spark Connect), and
fails at once naming the module, the interpreter and the fix.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
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


def worker_probe(modules: tuple[str, ...]) -> Callable[[], tuple[str, str | None]]:
    """A function that imports ``modules`` where it runs and returns that interpreter and the
    first failure (``None`` if all import). Built here, not defined at module level, so that
    cloudpickle ships it by value: a worker without flinkish could not unpickle a function of
    a flinkish module."""

    def probe() -> tuple[str, str | None]:
        import importlib
        import sys as worker_sys

        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # any failure to import is the answer, reported as is
                return worker_sys.executable, f"{module}: {type(exc).__name__}: {exc}"
        return worker_sys.executable, None

    return probe


def check_worker_python(spark: Any) -> None:
    """Raise :class:`WorkerEnvironmentError` when Spark's Python workers cannot import what
    flinkish's read and write tasks import (:data:`TASK_MODULES`); a no-op after the first
    success on ``spark``."""
    if spark in _checked:
        return
    from pyspark.sql import functions as F

    from flinkish.connect import is_connect

    probe = worker_probe(TASK_MODULES)
    if is_connect(spark):
        udf = F.udf(probe, "struct<python: string, error: string>")
        try:
            python, error = spark.range(1).select(udf().alias("p")).collect()[0].p
        except Exception as exc:  # the UDF runner itself needs pyspark's dependencies
            python, error = "the server's PYSPARK_PYTHON", str(exc).splitlines()[0]
    else:
        # an RDD task: its worker needs nothing but the standard library (a UDF needs pyarrow)
        python, error = spark.sparkContext.parallelize([0], 1).map(lambda _: probe()).first()
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
