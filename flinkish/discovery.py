"""Spark's discovery of the installed Python data sources, done by ``flinkish.register``.

Spark's own look-up runs a Python process (~1.5 s on the way to every restarted driver's first
query) whose answer depends only on that interpreter's ``sys.path``: when that is the driver's
own and ``pyspark_flinkish`` is all it would find, the driver answers in milliseconds. Either
way flinkish's entry is ``register``'s, so nothing registers it a second time (which Spark warns
about at every query's start). docs/guides/recover-after-crash.md has the details.
"""

from __future__ import annotations

import os
import pkgutil
import shutil
import sys
from collections.abc import Callable
from typing import Any

from flinkish.worker_launcher import worker_launcher

DATA_SOURCE_MANAGER = "org.apache.spark.sql.execution.datasources.DataSourceManager"
PYTHON_UTILS = "org.apache.spark.api.python.PythonUtils"
PYTHON_DATA_SOURCE = ("org.apache.spark.sql.execution.datasources.v2.python."
                      "UserDefinedPythonDataSource")
#: The prefix of the modules Spark's look-up imports (``lookup_data_sources``).
MODULE_PREFIX = "pyspark_"
FLINKISH_MODULE = "pyspark_flinkish"


def scala_object(spark: Any, name: str) -> Any:
    """The Scala object (a class's companion) ``name``."""
    return spark._jvm.java.lang.Class.forName(f"{name}$").getField("MODULE$").get(None)


def discover(spark: Any, name: str, entry: Callable[[], Any]) -> None:
    """Give Spark the installed Python data sources with ``entry()`` (a
    ``UserDefinedPythonDataSource``) as the data source ``name``; nothing once Spark has an
    answer of its own, or when its look-up fails (Spark's own then fails too, and logs why)."""
    builders = scala_object(spark, DATA_SOURCE_MANAGER)
    if not builders.dataSourceBuilders().isEmpty():
        return
    jvm = spark._jvm
    sources = jvm.java.util.HashMap()
    python_utils = scala_object(spark, PYTHON_UTILS)
    if only_flinkish_installed(str(python_utils.defaultPythonExec())):
        sources.put(name, entry())
    else:
        try:
            found = scala_object(spark, PYTHON_DATA_SOURCE).lookupAllDataSourcesInPython()
        except Exception:  # noqa: BLE001 - Spark's own look-up then fails as it would, and says why
            return
        for found_name, pickled in zip(found.names(), found.dataSources(), strict=True):
            key = str(found_name).lower()
            sources.put(key, entry() if key == name else getattr(jvm, PYTHON_DATA_SOURCE)(
                python_utils.createPythonFunction(pickled)))
    getattr(builders, "dataSourceBuilders_$eq")(
        jvm.scala.Some(python_utils.toScalaMap(sources)))


def only_flinkish_installed(python: str) -> bool:
    """Whether Spark's look-up, run by ``python``, finds ``pyspark_flinkish`` alone: ``python`` is
    this interpreter, and this ``sys.path`` and working directory hold no other ``pyspark_*``."""
    if not runs_this_interpreter(python):
        return False
    found = {module.name for module in pkgutil.iter_modules([*sys.path, os.getcwd()])
             if module.name.startswith(MODULE_PREFIX)}
    return found == {FLINKISH_MODULE}


def runs_this_interpreter(python: str) -> bool:
    """Whether the command ``python`` runs this interpreter in this environment: the same file
    in the same directory (a virtualenv's is a link to its base's), or the launcher for it."""
    found = shutil.which(python)
    if found is None:
        return False
    found = os.path.abspath(found)
    if found == worker_launcher(sys.executable):
        return True
    here = os.path.abspath(sys.executable)
    try:
        return (os.path.dirname(found) == os.path.dirname(here)
                and os.path.samefile(found, here))
    except OSError:
        return False
