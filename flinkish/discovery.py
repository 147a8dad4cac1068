"""Spark's discovery of the installed Python data sources, done by ``flinkish.register``: in the
driver's own process when its answer is Spark's, with flinkish's entry the one ``register``
wants, so that nothing registers flinkish a second time.

Why: at the first look-up of a Python data source in a JVM (``format("flinkish")``, or
``register``'s), Spark lists the installed ``pyspark_*`` modules in a Python process of its
own (``DataSourceManager.initialStaticDataSourceBuilders``: the look-up runner's
``pyspark.sql.worker.lookup_data_sources`` through a worker daemon, plus a ``python3 -c``
asking each found source's interpreter for its version). That process imports PySpark from
Spark's ``pyspark.zip`` (compiled there on every start) and the modules it finds: ~1.5 s on the
way to every (re)started driver's first query, before anything of flinkish runs. Its answer is
a function of that interpreter's ``sys.path``. When the interpreter is the driver's own (the
same file in the same environment, directly or through ``flinkish.worker_launcher``), the
driver's ``sys.path`` and working directory hold every directory the look-up searches, and the
driver has flinkish imported already: when ``pyspark_flinkish`` is all it finds there, the
answer is flinkish alone, known in milliseconds. Otherwise (other ``pyspark_*`` modules, another
interpreter) ``register`` runs Spark's own look-up, as the first look-up would have.

Either way ``register`` gives Spark the answer where Spark keeps it for the JVM
(``DataSourceManager.dataSourceBuilders``, which every session's manager reads at its first
look-up), flinkish's entry the one ``register`` builds (with a local master through
``flinkish.worker_launcher``). Registering it afterwards instead would replace a statically
registered data source, which Spark warns about at that call and again whenever a session is
cloned (every streaming query's start) — a warning for nothing the user did wrong.

Once Spark has discovered the sources itself (a Python data source looked up before
``register``), its answer stands: flinkish's entry is then Spark's, whose processes start
without the launcher.
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
    """Whether Spark's look-up, run by the interpreter command ``python``, finds
    ``pyspark_flinkish`` alone, as far as this process can tell: ``python`` is this
    interpreter, and the directories the look-up searches (this ``sys.path`` and the working
    directory, ahead of them for a process Spark starts) hold no other ``pyspark_*`` module."""
    if not runs_this_interpreter(python):
        return False
    found = {module.name for module in pkgutil.iter_modules([*sys.path, os.getcwd()])
             if module.name.startswith(MODULE_PREFIX)}
    return found == {FLINKISH_MODULE}


def runs_this_interpreter(python: str) -> bool:
    """Whether the command ``python`` (a path or a name on the PATH) runs this interpreter in
    this environment: the same file in the same directory (a virtualenv's interpreter is a link
    to its base interpreter, which has the same file but not the virtualenv's packages), or
    ``flinkish.worker_launcher``'s script for it (which changes only where pyspark comes
    from)."""
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
