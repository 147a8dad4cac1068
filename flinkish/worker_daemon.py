"""PySpark's Python worker daemon with what flinkish's read and write tasks import loaded and
frozen before it forks its workers (``flinkish.worker_launcher`` runs it in place of
``pyspark.daemon`` for the data source's processes); a driver-side call's worker imports what
its first call needs once it has authenticated the JVM, before it is asked
(:data:`CALL_MODULES`), and freezes what each call leaves. PySpark's full collection after each
task or call then skips those objects (docs/guides/recover-after-crash.md, with why forking
after these imports is safe). The data source's creation's daemon forks the driver's
``flinkish.fork_server`` first, when ``register`` named its socket.
"""

from __future__ import annotations

import gc
import importlib
import os
import socket
import sys
from types import ModuleType

from pyspark import daemon

from flinkish.fork_client import SOCKET_ENV
from flinkish.fork_server import HOST_MODULE, fork

#: Besides :data:`~flinkish.worker_python.TASK_MODULES`: pandas, which pyarrow imports at its
#: first array from Python values, and psycopg (optional), the only costly target import.
PRELOADED = ("pyspark.worker", "pandas", "pyarrow.compute", "flinkish_sink.postgres_target")


def preload(argv: list[str]) -> list[str]:
    """Import :data:`PRELOADED` when ``argv`` starts the task workers' daemon, and freeze the
    heap the forks inherit; the modules imported."""
    if len(argv) > 1 and argv[1] != "pyspark.worker":
        return []
    from flinkish.worker_python import TASK_MODULES

    loaded = import_quietly((*PRELOADED, *TASK_MODULES))
    # the import's garbage collected first: what is frozen is never collected
    gc.collect()
    gc.freeze()
    return loaded


#: What the worker of each driver-side call imports at its first call: the call's module, the
#: data source's class (which the call unpickles) and the reader's or the writer's modules.
CALL_MODULES = {
    module: (module, "flinkish.data_source", *call_modules)
    for module, call_modules in (
        ("pyspark.sql.worker.create_data_source", ()),
        ("pyspark.sql.worker.plan_data_source_read", ("flinkish_source.stream_reader",)),
        ("pyspark.sql.worker.write_into_data_source", ("flinkish_sink.stream_writer",)),
        ("pyspark.sql.worker.python_streaming_sink_runner", ("flinkish_sink.stream_writer",)),
    )
}


def import_quietly(names: tuple[str, ...]) -> list[str]:
    """Import ``names``, leaving a module that fails to the code that needs it (which reports the
    error where it belongs); the modules imported."""
    loaded = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the task's or the call's own import reports it
            continue
        loaded.append(name)
    return loaded


def import_with(module: str, names: tuple[str, ...]) -> None:
    """Have ``names`` imported right after PySpark's worker imports its call's ``module``, which
    it does once it has authenticated the JVM: until then Spark holds its worker lock (the one
    every Python worker of the driver is created under), so imports before would hold up the
    query's own calls."""
    if not names:
        return
    import_module = importlib.import_module

    def then_names(name: str, package: str | None = None) -> ModuleType:
        imported = import_module(name, package)
        if name == module:
            importlib.import_module = import_module
            import_quietly(names)
        return imported

    importlib.import_module = then_names


#: How many calls a driver-side worker makes between collections over its whole heap.
FULL_COLLECTION_EVERY = 256


def freeze_after_each_call(argv: list[str]) -> bool:
    """In a driver-side call's daemon (``argv[1]`` a ``pyspark.sql.worker`` module), have each
    forked worker collect and freeze its heap after each call; whether it does. An unfrozen
    full collection every :data:`FULL_COLLECTION_EVERY` calls frees cycles dropped since."""
    if len(argv) < 2 or argv[1] == "pyspark.worker":
        return False
    call = daemon.worker  # PySpark's daemon looks it up at each call
    calls = 0

    def worker(sock: socket.socket, authenticated: bool) -> int:
        nonlocal calls
        if calls == 0:  # a fresh fork: what its first call imports, before it is asked
            import_with(argv[1], CALL_MODULES.get(argv[1], ()))
        code = call(sock, authenticated)
        calls += 1
        if calls % FULL_COLLECTION_EVERY == 0:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        return code

    daemon.worker = worker
    return True


def fork_server(argv: list[str]) -> int | None:
    """In the data source's creation's daemon, when ``register`` named a fork server's socket,
    fork the server (``flinkish.fork_server``) before the daemon serves: its pid."""
    path = os.environ.get(SOCKET_ENV)
    if not path or len(argv) < 2 or argv[1] != HOST_MODULE:
        return None
    return fork(path)


if __name__ == "__main__":
    preload(sys.argv)
    fork_server(sys.argv)
    freeze_after_each_call(sys.argv)
    daemon.manager()
