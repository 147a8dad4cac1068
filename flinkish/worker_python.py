"""Check, once per session, that the Python Spark starts for its workers can import flinkish.

A script run with a virtualenv's interpreter (the virtualenv not activated) starts workers with
``python3`` from the PATH, which has no flinkish: every query then fails at ``.load()`` with
``PYTHON_DATA_SOURCE_ERROR … ModuleNotFoundError: No module named 'flinkish'``, which names
neither the interpreter nor the fix. ``register`` asks the workers themselves, with a one-row
task (an RDD task on a classic session, a UDF on Spark Connect), and fails at once with both.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from flinkish_core.errors import WorkerEnvironmentError

_checked: weakref.WeakSet[Any] = weakref.WeakSet()


def check_worker_python(spark: Any) -> None:
    """Raise :class:`WorkerEnvironmentError` when Spark's Python workers cannot import
    flinkish; a no-op after the first success on ``spark``."""
    if spark in _checked:
        return
    from pyspark.sql import functions as F

    from flinkish.connect import is_connect

    def probe() -> tuple[str, str | None]:
        # defined here so that cloudpickle ships it by value: a worker without flinkish could
        # not unpickle a function of a flinkish module
        import sys as worker_sys

        try:
            import flinkish  # noqa: F401
        except Exception as exc:  # any failure to import is the answer, reported as is
            return worker_sys.executable, f"{type(exc).__name__}: {exc}"
        return worker_sys.executable, None

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
            f"Spark's Python workers cannot import flinkish ({error}): they run "
            f"{python}. Spark starts them with spark.pyspark.python or the PYSPARK_PYTHON "
            f"environment variable, else python3 from the PATH; this driver runs "
            f"{sys.executable}. Install flinkish into {python}, or set "
            f"PYSPARK_PYTHON={sys.executable} (on a Spark Connect or cluster deployment: on "
            "the server and the executors) before the SparkSession starts."
        )
    _checked.add(spark)
