"""The interpreter command Spark starts the flinkish data source's Python processes with, on a
local master: a small shell script in the temporary directory that runs the session's own
interpreter after two changes, so a (re)started query's processes start faster: the installed
pyspark and py4j in the place of Spark's zips (imported from a zip, pyspark is compiled in every
process) and no jars on ``PYTHONPATH``, and ``flinkish.worker_daemon`` in place of PySpark's
daemon unless the session configured its own; and the streaming source's runner, which Spark
starts without a daemon, is asked of the driver's ``flinkish.fork_server`` through
``flinkish.fork_client`` when ``register`` started one (docs/guides/recover-after-crash.md).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import tempfile
from pathlib import Path

from flinkish import fork_client
from flinkish.fork_client import SERVED_MODULES, SOCKET_ENV

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
case $2 in
  {served})
    if [ "$1" = -m ] && [ -n "${socket_env}" ]; then
      exec {python} -S -I {client} {python} "$@"
    fi ;;
esac
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
    """The launcher script for the interpreter command ``python`` (named by its text's digest);
    ``python`` itself when it is one already or the temporary directory is ``noexec``."""
    if Path(python).name.startswith(LAUNCHER_PREFIX):
        return python
    text = _SCRIPT.format(python=shlex.quote(python), links=shlex.quote(str(package_links())),
                          pyspark_daemon=PYSPARK_DAEMON, flinkish_daemon=FLINKISH_DAEMON,
                          served=" | ".join(SERVED_MODULES), socket_env=SOCKET_ENV,
                          client=shlex.quote(fork_client.__file__ or ""))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"{LAUNCHER_PREFIX}{digest}"
    if not path.exists():
        staged = path.with_name(f"{path.name}.{os.getpid()}")
        staged.write_text(text)
        staged.chmod(0o755)
        staged.replace(path)
    return str(path) if os.access(path, os.X_OK) else python
