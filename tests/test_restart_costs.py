"""What keeps a (re)started query's Python processes cheap: each one Spark starts on the way to
a restarted query's first commit pays its interpreter's start-up and imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def python_lines(code: str) -> list[str]:
    """What ``code`` prints, line by line, run by a fresh interpreter in the project's root."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT, timeout=120).stdout.split("\n")


def test_discovering_the_data_source_leaves_pyarrow_out() -> None:
    """Spark's discovery of installed data sources (at the first ``format("flinkish")``) and
    its ``create_data_source`` process import ``pyspark_flinkish`` and ask for the schema;
    pyarrow and numpy (~0.2 s) are for the processes that read or write rows."""
    code = ("import sys, pyspark_flinkish; "
            "pyspark_flinkish.DefaultSource({'subscribe': 't', 'kafka.bootstrap.servers': 'b:1',"
            " 'checkpointing.location': '/tmp/x'}).schema(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_the_sources_schema_reaches_spark_as_a_struct_type_matching_the_arrow_schema() -> None:
    """A ``StructType`` goes to the JVM as JSON; a DDL string would be parsed there by Spark's
    SQL parser, whose first parse in a JVM holds every (re)started driver's ``load()``. It is
    the schema ``read()``'s Arrow batches have, headers or not."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    from flinkish.data_source import FlinkishDataSource
    from flinkish_source.schema import arrow_schema, spark_schema

    options = {"subscribe": "t", "kafka.bootstrap.servers": "b:1",
               "checkpointing.location": "/tmp/x"}
    schema = FlinkishDataSource(options).schema()
    assert isinstance(schema, StructType)
    assert schema == spark_schema(False)
    for headers in (False, True):
        assert spark_schema(headers) == from_arrow_schema(arrow_schema(headers))


def test_the_launcher_puts_the_installed_packages_in_place_of_sparks_zips_and_jars() -> None:
    """The flinkish data source's processes import pyspark and py4j from the installed packages
    (compiled once), not from Spark's zips, and leave Spark's jars off their path."""
    import py4j
    import pyspark

    from flinkish.worker_launcher import worker_launcher

    spark_home = Path(pyspark.__file__).parent
    path = os.pathsep.join([
        str(spark_home / "python" / "lib" / "pyspark.zip"),
        str(spark_home / "python" / "lib" / "py4j-0.10.9.9-src.zip"),
        str(spark_home / "jars" / "spark-core_2.13-4.3.0.jar"),
        str(ROOT),
        "/opt/libs/other.jar",
    ])
    code = ("import os, pyspark, py4j; print(os.environ['PYTHONPATH']); "
            "print(os.path.realpath(pyspark.__file__)); print(os.path.realpath(py4j.__file__))")
    out = subprocess.run(
        [worker_launcher(sys.executable), "-c", code], capture_output=True, text=True,
        check=True, env={**os.environ, "PYTHONPATH": path},
    ).stdout.split("\n")
    links, *rest = out[0].split(os.pathsep)
    assert rest == [str(ROOT), "/opt/libs/other.jar"]
    assert sorted(os.listdir(links)) == ["py4j", "pyspark"]
    assert out[1:3] == [os.path.realpath(pyspark.__file__), os.path.realpath(py4j.__file__)]


def test_the_launcher_runs_the_task_workers_daemon_in_place_of_pysparks() -> None:
    """``-m pyspark.daemon`` (Spark's default daemon) becomes ``-m flinkish.worker_daemon``;
    any other module (a daemon the session configured, a worker started without one) is run as
    Spark asked."""
    from flinkish.worker_launcher import worker_launcher

    launcher = worker_launcher("echo")  # the "interpreter" prints the arguments it gets
    for args, runs in (
        (["-m", "pyspark.daemon", "pyspark.worker"], "-m flinkish.worker_daemon pyspark.worker"),
        (["-m", "my.daemon", "pyspark.worker"], "-m my.daemon pyspark.worker"),
        (["-m", "pyspark.sql.streaming.python_streaming_source_runner"],
         "-m pyspark.sql.streaming.python_streaming_source_runner"),
    ):
        out = subprocess.run([launcher, *args], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == runs
    assert worker_launcher(launcher) == launcher  # a launcher is not wrapped again


def test_the_task_workers_daemon_preloads_their_imports_and_its_forks_work() -> None:
    """What the daemon imports its forks inherit; a Python thread it started would not survive
    the fork (the reason PySpark's own daemon imports nothing of the task's). The native
    threads the imports start (OpenBLAS's pool, pyarrow's jemalloc background thread) are
    alive when it forks: a child must find the allocator and the pools usable (a lock held
    across the fork would hang it)."""
    code = ("import json, os, sys, threading, flinkish.worker_daemon as d\n"
            "print(d.preload(['-m', 'pyspark.sql.worker.plan_data_source_read']))\n"
            "print('pandas' in sys.modules)\n"
            "print(json.dumps(d.preload(['-m', 'pyspark.worker'])))\n"
            "print(threading.active_count())\n"
            "print('jemalloc_bg_thd' in {open(f'/proc/self/task/{t}/comm').read().strip()\n"
            "                            for t in os.listdir('/proc/self/task')}, flush=True)\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    import numpy, pandas, pyarrow as pa, pyarrow.compute as pc\n"
            "    total = pc.sum(pa.array(list(range(100_000)))).as_py()\n"
            "    square = int((numpy.ones((300, 300)) @ numpy.ones((300, 300)))[0, 0])\n"
            "    frame = pandas.DataFrame({'x': range(1000)}).x.sum()\n"
            "    print(total, square, frame, flush=True)\n"
            "    os._exit(0)\n"
            "print(os.waitpid(pid, 0)[1])")
    out = python_lines(code)
    assert out[:2] == ["[]", "False"]
    assert {"pandas", "pyarrow", "confluent_kafka", "flinkish_source.partition_reader",
            "flinkish_sink.stream_writer", "flinkish_sink.postgres_target"} <= set(
                json.loads(out[2]))
    assert out[3] == "1"
    # the background thread is there at the fork (else the fork checks nothing about it)
    assert out[4:7] == ["True", "4999950000 300 499500", "0"]


def test_the_task_workers_daemon_freezes_the_heap_its_forks_inherit() -> None:
    """PySpark's worker runs a full collection after every task: the preloaded modules' objects
    frozen, it skips them."""
    code = ("import gc, flinkish.worker_daemon as d; "
            "d.preload(['-m', 'pyspark.sql.worker.plan_data_source_read']); "
            "print(gc.get_freeze_count()); "
            "d.preload(['-m', 'pyspark.worker']); "
            "print(gc.get_freeze_count(), len(gc.get_objects()))")
    out = python_lines(code)
    assert out[0] == "0"
    frozen, tracked = map(int, out[1].split())
    assert frozen > 10_000 > tracked



def test_the_driver_answers_sparks_discovery_only_where_it_finds_what_spark_would(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """``register`` lists the installed data sources itself (no Python process of Spark's)
    only when Spark's look-up would run this interpreter in this environment and find
    ``pyspark_flinkish`` alone; another interpreter, or another ``pyspark_*`` module on the
    path or in the working directory, leaves the look-up to Spark."""
    from flinkish.discovery import only_flinkish_installed, runs_this_interpreter
    from flinkish.worker_launcher import worker_launcher

    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    monkeypatch.setenv("PATH", os.pathsep.join((venv_bin, os.environ.get("PATH", ""))))
    for python in (sys.executable, "python3", worker_launcher(sys.executable)):
        assert runs_this_interpreter(python), python
    base = os.path.realpath(sys.executable)  # the same file, without the virtualenv's packages
    assert os.path.dirname(base) == venv_bin or not runs_this_interpreter(base)
    assert not runs_this_interpreter(str(tmp_path / "no-such-python"))
    assert not runs_this_interpreter(worker_launcher(base))

    monkeypatch.chdir(tmp_path)
    assert only_flinkish_installed(sys.executable)
    assert not only_flinkish_installed(str(tmp_path / "no-such-python"))
    (tmp_path / "pyspark_other.py").write_text("")
    assert not only_flinkish_installed(sys.executable)  # in the working directory
    elsewhere = tmp_path / "lib"
    elsewhere.mkdir()
    (tmp_path / "pyspark_other.py").rename(elsewhere / "pyspark_other.py")
    assert only_flinkish_installed(sys.executable)
    monkeypatch.syspath_prepend(str(elsewhere))
    assert not only_flinkish_installed(sys.executable)  # on the path


def test_a_driver_side_calls_worker_freezes_what_each_call_leaves() -> None:
    """Spark calls the writer's creation and the commit once an epoch in a reused worker, and
    PySpark's worker collects after each: what a call imported is frozen after it, so the next
    collection walks only what the next call leaves; the tasks' daemon is left as it is."""
    code = ("import gc, json, flinkish.worker_daemon as d\n"
            "from pyspark import daemon\n"
            "def call(sock, authenticated):\n"
            "    import pyarrow, pyspark.sql.worker.python_streaming_sink_runner\n"
            "    garbage = [[]]; garbage[0].append(garbage)\n"
            "    return 0\n"
            "daemon.worker = call\n"
            "print(d.freeze_after_each_call(['-m', 'pyspark.worker']), daemon.worker is call)\n"
            "print(d.freeze_after_each_call(['-m', "
            "'pyspark.sql.worker.python_streaming_sink_runner']))\n"
            "before = len(gc.get_objects())\n"
            "print(daemon.worker(None, True), gc.get_freeze_count() > 10_000, before > 10_000)\n"
            "print(len(gc.get_objects()) < 100)\n")
    out = python_lines(code)
    assert out[:4] == ["False True", "True", "0 True True", "True"]


def test_a_driver_side_calls_worker_reclaims_a_dropped_cycle_at_its_next_full_collection() -> None:
    """What one call keeps and a later call drops in a reference cycle is frozen in between;
    the full collection every ``FULL_COLLECTION_EVERY`` calls reclaims it, so a long-running
    query's driver-side workers do not keep such objects for ever."""
    code = ("import gc, weakref, flinkish.worker_daemon as d\n"
            "from pyspark import daemon\n"
            "class Claim: pass\n"
            "kept = {}\n"
            "def call(sock, authenticated):\n"
            "    if 'claim' in kept:\n"
            "        kept.pop('claim')\n"
            "    else:\n"
            "        claim = Claim(); claim.me = claim; kept['claim'] = claim\n"
            "        kept['ref'] = weakref.ref(claim)\n"
            "    return 0\n"
            "daemon.worker = call\n"
            "d.FULL_COLLECTION_EVERY = 4\n"
            "d.freeze_after_each_call(['-m', 'pyspark.sql.worker.python_streaming_sink_runner'])\n"
            "alive = []\n"
            "for _ in range(4):\n"
            "    daemon.worker(None, True); alive.append(kept['ref']() is not None)\n"
            "print(alive)\n")
    assert python_lines(code)[0] == "[True, True, True, False]"


def test_a_driver_side_calls_worker_imports_its_calls_modules_before_its_first_call() -> None:
    """A fresh fork of a driver-side call's daemon imports what that call needs before Spark
    hands it the call (``register`` forks one ahead), once it has authenticated the JVM (Spark
    holds its worker lock until then): the writer's creation finds the sink's modules imported;
    a module that cannot be imported is left to the call."""
    code = ("import importlib, sys, flinkish.worker_daemon as d\n"
            "from pyspark import daemon\n"
            "module = 'pyspark.sql.worker.write_into_data_source'\n"
            "seen = []\n"
            "def call(sock, authenticated):\n"  # PySpark's: authenticate, import the module, serve
            "    before = 'flinkish_sink.stream_writer' in sys.modules\n"
            "    importlib.import_module(module)\n"
            "    seen.append((before, all(m in sys.modules for m in d.CALL_MODULES[module])))\n"
            "    return 0\n"
            "daemon.worker = call\n"
            "print('flinkish_sink.stream_writer' in sys.modules)\n"
            "d.freeze_after_each_call(['-m', module])\n"
            "daemon.worker(None, False); daemon.worker(None, True)\n"
            "print(seen, 'flinkish_sink.stream_writer' in d.CALL_MODULES[module])\n"
            "print(d.import_quietly(('json', 'no_such_module_here')))\n")
    assert python_lines(code)[:3] == [
        "False", "[(False, True), (True, True)] True", "['json']"]


def test_the_launcher_hands_the_source_runner_to_the_fork_client_when_a_server_is_named() -> None:
    """Only the streaming source's runner (the one process Spark starts without a daemon on a
    query's way to its first batch) goes to ``flinkish.fork_client``, and only when ``register``
    named a server in the worker environment."""
    from flinkish import fork_client
    from flinkish.fork_client import SOCKET_ENV
    from flinkish.worker_launcher import worker_launcher

    launcher = worker_launcher("echo")
    runner = ["-m", "pyspark.sql.streaming.python_streaming_source_runner"]
    for args, env, runs in (
        (runner, {SOCKET_ENV: "/s"}, ["-S", "-I", fork_client.__file__, "echo", *runner]),
        (runner, {}, runner),
        (["-m", "pyspark.sql.worker.plan_data_source_read"], {SOCKET_ENV: "/s"},
         ["-m", "pyspark.sql.worker.plan_data_source_read"]),
    ):
        base = {k: v for k, v in os.environ.items() if k != SOCKET_ENV}
        out = subprocess.run([launcher, *args], capture_output=True, text=True, check=True,
                             env={**base, **env})
        assert out.stdout.split() == runs


PROBE = """\
import os, sys
IMPORTED_IN = os.getpid()
if __name__ == "__main__":  # the pid of the process that imported it: the server's, if it did
    imported = sys.modules["probe"].IMPORTED_IN if "probe" in sys.modules else IMPORTED_IN
    print(imported, os.getpid(), os.getppid(), os.environ.get("PROBE"), sys.argv[1:],
          flush=True)
    line = sys.stdin.readline().strip()
    print("read", line, file=sys.stderr, flush=True)
    if line == "wait":
        import time
        time.sleep(120)
    sys.exit(3)
"""


class ForkServer:
    """``flinkish.fork_server`` serving the module ``probe`` from ``directory``, forked from a
    process standing for the daemon, which lives until its standard input closes."""

    def __init__(self, directory: Path) -> None:
        (directory / "probe.py").write_text(PROBE)
        self.directory, self.socket = directory, str(directory / "server.sock")
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import sys, flinkish.fork_server as f; "
             "print(f.fork(sys.argv[1], ('probe',)), flush=True); sys.stdin.read()",
             self.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=directory,
            env={**os.environ, "PYTHONPATH": str(directory), "PYTHONUNBUFFERED": "YES"})
        assert self.process.stdout is not None
        self.pid = int(self.process.stdout.readline())
        poll(lambda: os.path.exists(self.socket), "the server's socket")

    def client(self, stdin: str, python_path: str | None = None, socket: str | None = None
               ) -> subprocess.Popen[str]:
        from flinkish import fork_client

        env = {**os.environ, "PYTHONPATH": python_path or str(self.directory), "PROBE": "p",
               fork_client.SOCKET_ENV: socket or self.socket}
        client = subprocess.Popen(
            [sys.executable, "-S", "-I", fork_client.__file__, sys.executable, "-m", "probe"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=self.directory, env=env)
        assert client.stdin is not None
        client.stdin.write(stdin + "\n")
        client.stdin.flush()
        return client

    def forks(self) -> set[int]:
        from flinkish.demo.processes import tree

        return {pid for pid, (ppid, _, _, _) in tree(self.pid).items() if ppid == self.pid}

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie, or reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def poll(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_fork_of_the_server_runs_the_module_with_the_clients_streams_and_environment(
    tmp_path: Path
) -> None:
    """The module runs in a fork of the server that imported it (its import's pid is the
    server's), reads the client's stdin, writes to its stdout and stderr, sees its environment,
    and its exit status is the client's."""
    server = ForkServer(tmp_path)
    try:
        client = server.client("hello")
        out, err = client.communicate(timeout=60)
        imported_in, pid, ppid, probe, args = out.split(" ", 4)
        assert (int(imported_in), int(ppid), probe, args.strip()) == (
            server.pid, server.pid, "p", "[]")
        assert int(pid) != client.pid
        assert (err.strip(), client.returncode) == ("read hello", 3)
    finally:
        server.stop()


def test_the_client_runs_the_interpreter_itself_where_the_server_cannot_serve(
    tmp_path: Path
) -> None:
    """Another ``PYTHONPATH`` than the server's (its imports would not be the module's), or no
    server at the socket: the client becomes the interpreter Spark asked for, same result."""
    server = ForkServer(tmp_path)
    try:
        for python_path, socket in ((f"{tmp_path}{os.pathsep}{tmp_path}", None),
                                    (None, str(tmp_path / "none.sock"))):
            client = server.client("hello", python_path, socket)
            out, err = client.communicate(timeout=60)
            imported_in, pid, ppid, _, _ = out.split(" ", 4)
            assert int(imported_in) == int(pid) == client.pid
            assert (err.strip(), client.returncode) == ("read hello", 3)
    finally:
        server.stop()


def test_a_fork_ends_with_its_client_and_with_the_server(tmp_path: Path) -> None:
    """Spark stops the runner with SIGTERM to the process it started (the client): the fork
    goes with it. The server goes with the daemon that forked it, and its forks with it; a
    server of the next daemon takes the dead one's socket."""
    import signal

    server = ForkServer(tmp_path)
    try:
        client = server.client("wait")
        poll(lambda: len(server.forks()) == 1, "a fork")
        client.send_signal(signal.SIGTERM)
        assert client.wait(30) == -signal.SIGTERM
        poll(lambda: not server.forks(), "the fork gone with its client")
        client = server.client("wait")
        poll(lambda: len(server.forks()) == 1, "a fork")
        (fork,) = server.forks()
    finally:
        server.stop()
    poll(lambda: gone(fork) and gone(server.pid), "the server and its fork gone with the daemon")
    client.communicate(timeout=30)
    assert client.returncode == 1  # the server gone, its fork with it
    server = ForkServer(tmp_path)  # in place of the dead one, whose socket is left
    try:
        client = server.client("hello")
        assert client.communicate(timeout=60)[0].split()[2] == str(server.pid)
    finally:
        server.stop()


def test_the_fork_server_refuses_what_its_imports_would_not_run_as_the_interpreter_would(
    monkeypatch: Any
) -> None:
    """A fork runs with the server's interpreter, path, working directory and imports: a request
    that differs in any of them, or asks for another module, is refused."""
    from flinkish.fork_server import parse_request, refusal

    monkeypatch.delenv("SPARK_TESTING", raising=False)
    served = ("m.served",)
    env = {"PYTHONPATH": "/p", "X": "a=b"}

    def request(python: str = sys.executable, cwd: str = os.getcwd(),
                args: tuple[str, ...] = ("-m", "m.served"), **changed: str) -> Any:
        fields = [python, cwd, str(len(args)), *args,
                  *(f"{k}={v}" for k, v in {**env, **changed}.items())]
        return parse_request("\0".join(fields).encode())

    assert request() == (sys.executable, os.getcwd(), ["-m", "m.served"], env)
    assert refusal(request(), sys.executable, "/p", served) is None
    for refused in (request(python="/other/python"), request(cwd="/"),
                    request(args=("-m", "m.other")), request(args=("-m", "m.served", "x")),
                    request(args=("-c", "m.served")), request(PYTHONPATH="/q"),
                    request(SPARK_TESTING="1")):
        assert refusal(refused, sys.executable, "/p", served) is not None
