"""A fork server for the Python process Spark starts without a daemon on a (re)started query's
way to its first batch: the streaming source's runner (``PythonStreamingSourceRunner`` starts
``python -m pyspark.sql.streaming.python_streaming_source_runner`` itself, so no worker started
ahead can serve it). Its start is an interpreter importing PySpark, pyarrow and the source's
modules, ~0.6 s of CPU; a fork of a process that has imported them already takes milliseconds
(docs/guides/recover-after-crash.md).

``register`` starts one server per driver with a local master (:func:`start_fork_server`), with
the interpreter, ``PYTHONPATH`` and working directory Spark gives the runner, and puts its
socket into the data source's worker environment; ``flinkish.worker_launcher`` then hands the
runner's start to ``flinkish.fork_client``, which passes its standard streams, arguments and
environment to the server. The server forks a child that takes them over and runs the module as
``python -m`` would. Anything that differs from what the server was started with (another
interpreter, path or directory, another module) is refused, and the client runs the interpreter
as Spark asked: a restart never depends on the server.

Lifetimes: the server exits when the driver does (its standard input is a pipe from the driver)
and kills its children then; a child dies with the server (``PR_SET_PDEATHSIG``) and is killed
when its client's connection closes (Spark stops the runner by SIGTERM to the process it
started: the client). The socket is in a directory only this user can enter, and the server
serves only its own user (``SO_PEERCRED``). It forks from its one thread: the imports start no
Python thread (the native ones they start are fork-safe, see ``flinkish.worker_daemon``).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import runpy
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

from flinkish.fork_client import ACCEPTED, REFUSED, SOCKET_ENV

#: The modules the server runs, with what it imports for them before it serves.
SERVED = {
    "pyspark.sql.streaming.python_streaming_source_runner": (
        "pyspark.sql.streaming.python_streaming_source_runner", "flinkish.data_source",
        "flinkish_source.stream_reader"),
}

#: The environment variables PySpark reads when the served modules are imported (Spark 4.3's
#: ``pyspark.serializers``, ``pyspark.worker_util``): a request must have the server's values.
IMPORT_TIME_ENV = ("PYSPARK_ENABLE_NAMEDTUPLE_PATCH", "SPARK_TESTING")

#: The largest request (an environment of ~1 MiB) the server reads.
MAX_REQUEST = 1 << 20
PR_SET_PDEATHSIG = 1


# -- the driver's side --------------------------------------------------------------------------

#: The driver's server, started once per driver process.
_server: subprocess.Popen[bytes] | None = None
_server_lock = threading.Lock()


def socket_directory() -> Path | None:
    """This user's directory of servers' sockets (mode 0700); None when it cannot be made so."""
    path = Path(tempfile.gettempdir()) / f"flinkish-forks-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or stat.S_IMODE(info.st_mode) & 0o077):
        return None
    return path


def worker_python_path(spark: Any, source_env: Any) -> str:
    """The ``PYTHONPATH`` Spark gives the data source's processes (``PythonWorkerFactory``,
    Spark 4.3: Spark's own Python path, the data source's and the JVM's environment's)."""
    jvm = spark._jvm
    paths = (jvm.org.apache.spark.api.python.PythonUtils.sparkPythonPath(),
             source_env.get("PYTHONPATH"), jvm.java.lang.System.getenv("PYTHONPATH"))
    return os.pathsep.join(p for p in paths if p)


def start_fork_server(spark: Any, source: Any, launcher: str) -> str | None:
    """Start the driver's fork server (once) for the data source ``source`` run by
    ``launcher`` (``flinkish.worker_launcher``'s), and name its socket in the data source's
    worker environment; the socket's path, or None where none is started (the source run by
    another interpreter command, no private socket directory)."""
    global _server
    function = source.dataSourceCls()
    if function.pythonExec() != launcher:
        return None
    directory = socket_directory()
    if directory is None:
        return None
    path = str(directory / f"{os.getpid()}.sock")
    env = function.envVars()
    with _server_lock:
        if _server is None or _server.poll() is not None:
            server_env = {**os.environ, "PYTHONPATH": worker_python_path(spark, env),
                          "PYTHONUNBUFFERED": "YES"}
            _server = subprocess.Popen(
                [launcher, "-m", __name__, path], stdin=subprocess.PIPE,
                env=server_env, close_fds=True)
    if env.get(SOCKET_ENV) != path:
        env.put(SOCKET_ENV, path)
    return path


def server_pid() -> int | None:
    """The pid of the driver's fork server, while it runs."""
    return _server.pid if _server is not None and _server.poll() is None else None


# -- the server ---------------------------------------------------------------------------------

def parse_request(payload: bytes) -> tuple[str, str, list[str], dict[str, str]]:
    """(interpreter, working directory, arguments, environment) of a request."""
    fields = [os.fsdecode(f) for f in payload.split(b"\0")]
    python, cwd, count = fields[0], fields[1], int(fields[2])
    args, entries = fields[3:3 + count], fields[3 + count:]
    env = dict(entry.split("=", 1) for entry in entries if "=" in entry)
    return python, cwd, args, env


def refusal(request: tuple[str, str, list[str], dict[str, str]], python: str,
            python_path: str, served: tuple[str, ...]) -> str | None:
    """Why a server of ``served`` modules run by the interpreter ``python`` with
    ``python_path`` cannot run ``request`` as the interpreter would; None when it can."""
    asked, cwd, args, env = request
    if asked != python:
        return f"another interpreter ({asked})"
    if len(args) != 2 or args[0] != "-m" or args[1] not in served:
        return f"arguments {args} are not a served module's"
    if env.get("PYTHONPATH", "") != python_path:
        return "another PYTHONPATH"
    for name in IMPORT_TIME_ENV:
        if env.get(name) != os.environ.get(name):
            return f"another {name}"
    if cwd != os.getcwd():
        return "another working directory"
    return None


def receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """A request's payload and the file descriptors sent with it."""
    fds: list[int] = []
    data = b""
    size = struct.calcsize("3i")
    while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
        chunk, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(size))
        for level, kind, fd_data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(struct.unpack(f"{len(fd_data) // 4}i",
                                         fd_data[:len(fd_data) // 4 * 4]))
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            break
    length = struct.unpack("!I", data[:4])[0] if len(data) >= 4 else -1
    if len(data) != 4 + length:
        for fd in fds:
            os.close(fd)
        raise ValueError("an incomplete request")
    return data[4:], fds


def run_child(module: str, args: list[str], env: dict[str, str], fds: list[int],
              inherited: list[int]) -> None:
    """In the fork: take over the client's standard streams and environment, run ``module`` as
    ``python -m`` does, and exit with its status."""
    code = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == 1:  # the server died before the call
            os._exit(1)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [module, *args[2:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, then the exit
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class Server:
    """The server's loop: one thread, a selector over the listening socket, the driver's pipe,
    the SIGCHLD wake-up and each client's connection."""

    def __init__(self, listener: socket.socket, served: tuple[str, ...]) -> None:
        self.listener, self.python, self.served = listener, sys.executable, served
        self.python_path = os.environ.get("PYTHONPATH", "")
        #: pid -> its client's connection, None once that has closed
        self.children: dict[int, socket.socket | None] = {}
        self.selector = selectors.DefaultSelector()
        self.wakeup_read, wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_read, False)
        os.set_blocking(wakeup_write, False)
        signal.set_wakeup_fd(wakeup_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.wakeup_write = wakeup_write

    def serve(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "driver")
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, "reap")
        while True:
            for key, _ in self.selector.select():
                if key.data == "driver":
                    if not os.read(sys.stdin.fileno(), 4096):
                        return
                elif key.data == "accept":
                    self.accept()
                elif key.data == "reap":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wakeup_read, 4096)
                    self.reap()
                else:  # a client's connection closed (or sent more): its child goes
                    self.drop(key.data)

    def accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:
            conn.settimeout(5)
            _, uid, _ = struct.unpack("3i", conn.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid != os.getuid():
                raise ValueError(f"a client of uid {uid}")
            payload, fds = receive(conn)
        except (OSError, ValueError, struct.error):
            conn.close()
            return
        try:
            request = parse_request(payload)
            reason = (refusal(request, self.python, self.python_path, self.served)
                      if len(fds) == 3 else "no standard streams")
        except (ValueError, IndexError):
            reason = "a malformed request"
        if reason is not None:
            with contextlib.suppress(OSError):
                conn.sendall(REFUSED)
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        _, _, args, env = request
        try:
            conn.sendall(ACCEPTED)
        except OSError:
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        inherited = [self.listener.fileno(), self.wakeup_read, self.wakeup_write,
                     self.selector.fileno(), conn.fileno(),
                     *(c.fileno() for c in self.children.values() if c is not None)]
        pid = os.fork()
        if pid == 0:
            run_child(args[1], args, env, fds, inherited)
        for fd in fds:
            os.close(fd)
        conn.setblocking(True)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def drop(self, pid: int) -> None:
        """Kill the child ``pid``, whose client is gone."""
        conn = self.children.get(pid)
        if conn is not None:
            self.selector.unregister(conn)
            conn.close()
            self.children[pid] = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid not in self.children:
                continue
            conn = self.children.pop(pid)
            if conn is None:
                continue
            self.selector.unregister(conn)
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                conn.sendall(struct.pack("!i", code))
            conn.close()

    def close(self) -> None:
        for pid in list(self.children):
            self.drop(pid)
        self.listener.close()


def main(argv: list[str]) -> None:
    """``python -m flinkish.fork_server SOCKET [MODULE ...]``: bind, import, serve the modules
    (:data:`SERVED`'s when none is named) until the driver's pipe closes."""
    path, *modules = argv
    served = tuple(modules) or tuple(SERVED)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(16)  # requests wait in the backlog while the imports run
    try:
        from flinkish.worker_daemon import import_quietly

        import_quietly(tuple(name for module in served for name in SERVED.get(module, (module,))))
        gc.collect()
        gc.freeze()
        server = Server(listener, served)
        try:
            server.serve()
        finally:
            server.close()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


if __name__ == "__main__":
    main(sys.argv[1:])
