"""PySpark's Python worker daemon with what flinkish's read and write tasks import loaded before
it forks its workers: ``flinkish.worker_launcher`` runs it in place of ``pyspark.daemon`` for
the flinkish data source's processes (a session may also set
``spark.python.daemon.module=flinkish.worker_daemon``, as the demo's does).

Why: every worker the daemon forks imports pyarrow, pandas (pyarrow imports it at its first
array built from Python values), confluent_kafka and the source's and sink's modules at its
first task, ~0.7 s of CPU each; a (re)started query's first batch forks two workers per task
(one reads, one writes) at once, on the way to its first commit. Imported once in the daemon,
the forks start with them.

Forking after these imports is safe: they start no Python thread, and the native threads two of
them start at import have fork handlers of their own. NumPy's OpenBLAS starts its thread pool
at import and stops it before each fork (the child starts its own at first use); pyarrow's
bundled jemalloc starts a background thread (``jemalloc_bg_thd``) that stays in the daemon, and
jemalloc takes its locks around the fork, so the child, which runs without that thread, finds
its allocator consistent. psycopg and its libpq start nothing before a connection, which only
tasks open. Arrow's own thread pools start at first use and are re-created in a
forked child; librdkafka threads belong to a client, which only tasks create.

Only the daemon of the task workers (``pyspark.worker``) preloads; the daemons of a data
source's driver-side processes (their ``pyspark.sql.worker`` module is the first argument)
start as PySpark's do. A module that fails to import is left to the worker, which reports it
with the task. Everything else is PySpark's ``daemon.manager()`` as it is: the environment
Spark starts the daemon with, its signals, the forking and the reuse of workers.

The preloaded heap is then frozen (``gc.freeze``, as Python's documentation advises before a
fork without exec): PySpark's worker runs a full ``gc.collect()`` after every task, which would
otherwise walk the ~80,000 objects of these modules each time (tens of milliseconds a task, on
every task of a query, and a write to each object's page that un-shares it from the daemon).
They are modules' objects, alive as long as the process anyway.

The daemons of the driver-side calls preload nothing, but their workers pay the same collection:
Spark calls the writer's creation (``write_into_data_source``) and the commit
(``python_streaming_sink_runner``) once an epoch each, in a reused worker, and after each call
PySpark's worker walks everything that worker imported (pyspark, pyarrow, flinkish, the
target's client library): ~80 ms and ~60 ms of CPU an epoch (py-spy, a 16-epoch Parquet query),
the largest per-epoch cost of a flinkish sink. So such a worker collects once after each call
and freezes what survives (:func:`freeze_after_each_call`): PySpark's collection then walks only
what the next call leaves. What is frozen is what was reachable after a call: imported modules,
the processes' caches (the sink's checkpoint store claims); such an object that a later call
drops is still freed by its reference count; one in a reference cycle (an earlier run's
claim, when the query restarts in the same driver) waits for the full collection every
:data:`FULL_COLLECTION_EVERY` calls, which bounds what a long-running query can hold.
"""

from __future__ import annotations

import gc
import importlib
import socket
import sys

from pyspark import daemon

#: Besides the worker check's :data:`~flinkish.worker_python.TASK_MODULES`: PySpark's worker
#: itself, pandas, which pyarrow imports in the task at its first array from Python values, and
#: the PostgreSQL target (psycopg, an optional dependency: ~0.08 s of CPU in every worker whose
#: first PostgreSQL write task would otherwise import it; the other targets' modules import
#: nothing costly).
PRELOADED = ("pyspark.worker", "pandas", "pyarrow.compute", "flinkish_sink.postgres_target")


def preload(argv: list[str]) -> list[str]:
    """Import :data:`PRELOADED` when ``argv`` starts the task workers' daemon, and freeze the
    heap the forks inherit; the modules imported."""
    if len(argv) > 1 and argv[1] != "pyspark.worker":
        return []
    from flinkish.worker_python import TASK_MODULES

    loaded = []
    for name in (*PRELOADED, *TASK_MODULES):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the task's own import reports it
            continue
        loaded.append(name)
    # the import's garbage collected first: what is frozen is never collected
    gc.collect()
    gc.freeze()
    return loaded


#: How many calls a driver-side worker makes between collections over its whole heap.
FULL_COLLECTION_EVERY = 256


def freeze_after_each_call(argv: list[str]) -> bool:
    """In a daemon of a driver-side call (``argv[1]`` a ``pyspark.sql.worker`` module), have
    each forked worker collect and freeze its heap after each call (see the module docstring);
    whether it does."""
    if len(argv) < 2 or argv[1] == "pyspark.worker":
        return False
    call = daemon.worker  # PySpark's daemon looks it up at each call
    calls = 0

    def worker(sock: socket.socket, authenticated: bool) -> int:
        nonlocal calls
        code = call(sock, authenticated)
        calls += 1
        if calls % FULL_COLLECTION_EVERY == 0:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        return code

    daemon.worker = worker
    return True


if __name__ == "__main__":
    preload(sys.argv)
    freeze_after_each_call(sys.argv)
    daemon.manager()
