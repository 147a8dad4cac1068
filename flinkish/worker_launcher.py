"""The interpreter command Spark starts the flinkish data source's Python processes with, on a
local master: a small shell script in the temporary directory that runs the session's own
interpreter after two changes, so a (re)started query's processes start faster.

Why: Spark starts a Python data source's processes (the source's creation and planning, the
writer's creation, the commit, the streaming source's runner, the read and write tasks) with
the data source's interpreter, ``pythonExec``, and a ``PYTHONPATH`` that starts with Spark's
own entries (``PythonUtils.sparkPythonPath``).

- Those entries are ``pyspark.zip``, py4j's source zip and, with a pip-installed PySpark, its
  ``spark-core`` jar: a zip of ~6,000 entries and no Python module, whose index every Python
  process reads at its first import, and every worker again when PySpark adds the job's files
  to its path. pyspark imported from the zip is compiled on every start (~0.25 s of CPU a
  process). The script puts a directory in the zips' place whose ``pyspark`` and ``py4j`` are
  links to the driver's installed packages (the very packages the zips were built from: a
  pip-installed PySpark's ``SPARK_HOME`` is its package directory), and leaves the jars out.
- Spark's task workers come from PySpark's daemon (``-m pyspark.daemon``), which forks each
  worker before it imports anything of the task: every read and write task's first run imports
  pyarrow, pandas, confluent_kafka and flinkish's modules again, ~0.7 s of CPU each, and a
  restarted query's first batch forks two workers per task at once. The script runs
  ``flinkish.worker_daemon`` in its place, which imports them once before it forks. A session
  configured with a daemon of its own (``spark.python.daemon.module``) keeps it.

Only the flinkish data source's processes get the script (``flinkish.register`` registers the
source with it); the session's other Python processes (UDFs, ``mapInPandas``) start as Spark
starts them. With any other master the executors' machines have no such script, and the
source keeps the session's interpreter.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import tempfile
from pathlib import Path

#: PySpark's daemon module (Spark's default ``spark.python.daemon.module``) and its replacement.
PYSPARK_DAEMON, FLINKISH_DAEMON = "pyspark.daemon", "flinkish.worker_daemon"

LAUNCHER_PREFIX = "flinkish-python-"

_SCRIPT = """\
#!/bin/sh
# flinkish's launcher of Spark's Python processes for {python}; see flinkish.worker_launcher.
set -f
IFS=:
path=
linked=
for entry in $PYTHONPATH; do
  case $entry in
    */pyspark/python/lib/pyspark.zip | */pyspark/python/lib/py4j-*-src.zip)
      [ -n "$linked" ] && continue
      linked=1
      entry={links} ;;
    */pyspark/jars/*.jar) continue ;;
  esac
  path=${{path:+$path:}}$entry
done
unset IFS
PYTHONPATH=$path
export PYTHONPATH
if [ "$1" = -m ] && [ "$2" = {pyspark_daemon} ]; then
  shift 2
  set -- -m {flinkish_daemon} "$@"
fi
exec {python} "$@"
"""


def package_links() -> Path:
    """A directory whose ``pyspark`` and ``py4j`` are links to this interpreter's packages."""
    import py4j
    import pyspark

    packages = {name: str(Path(module.__file__ or "").resolve().parent)
                for name, module in (("pyspark", pyspark), ("py4j", py4j))}
    digest = hashlib.sha256(repr(sorted(packages.items())).encode()).hexdigest()[:12]
    links = Path(tempfile.gettempdir()) / f"flinkish-packages-{digest}"
    if not links.is_dir():
        staged = links.with_name(f"{links.name}.{os.getpid()}")
        staged.mkdir(exist_ok=True)
        for name, target in packages.items():
            if not (staged / name).is_symlink():
                (staged / name).symlink_to(target, target_is_directory=True)
        try:
            staged.rename(links)
        except OSError:  # another process got there first: its links are the same
            if not links.is_dir():
                raise
            shutil.rmtree(staged, ignore_errors=True)
    return links


def worker_launcher(python: str) -> str:
    """The launcher script for the interpreter command ``python`` (written once; its name is
    the digest of its text); ``python`` itself when it is one already (the demo session's
    workers use a launcher as their interpreter) or when the temporary directory does not
    let a script run (mounted ``noexec``)."""
    if Path(python).name.startswith(LAUNCHER_PREFIX):
        return python
    text = _SCRIPT.format(python=shlex.quote(python), links=shlex.quote(str(package_links())),
                          pyspark_daemon=PYSPARK_DAEMON, flinkish_daemon=FLINKISH_DAEMON)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"{LAUNCHER_PREFIX}{digest}"
    if not path.exists():
        staged = path.with_name(f"{path.name}.{os.getpid()}")
        staged.write_text(text)
        staged.chmod(0o755)
        staged.replace(path)
    return str(path) if os.access(path, os.X_OK) else python
