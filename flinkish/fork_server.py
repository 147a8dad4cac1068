"""A fork server for the Python process Spark starts without a daemon on a (re)started query's
way to its first batch: the streaming source's runner (``PythonStreamingSourceRunner`` starts
``python -m pyspark.sql.streaming.python_streaming_source_runner`` itself, so no worker started
ahead can serve it). Its start is an interpreter importing PySpark, pyarrow and the source's
modules, ~0.6 s of CPU; a fork of a process that has imported them already takes milliseconds
(docs/guides/recover-after-crash.md).

With a local master ``register`` names the server's socket in the data source's worker
environment (:func:`fork_server_socket`). The daemon Spark starts for the data source's creation
(``flinkish.worker_daemon``, the first of the data source's processes, which ``register`` starts
ahead) forks the server before it serves (:func:`fork`): the server shares the daemon's
interpreter, ``PYTHONPATH``, working directory and PySpark import, which are the runner's, and
imports the rest of the runner's modules. ``flinkish.worker_launcher`` hands the runner's start
to ``flinkish.fork_client``, which passes its standard streams, arguments and environment to the
server; the server forks a child that takes them over and runs the module as ``python -m``
would. Anything that differs from the server's own (another interpreter, path or directory,
another module) is refused, and the client runs the interpreter as Spark asked: a restart never
depends on the server.

Lifetimes: the server dies with the daemon, and its children with the server
(``PR_SET_PDEATHSIG``); a child is killed when its client's connection closes (Spark stops the
runner by SIGTERM to the process it started: the client). The socket is in a directory only
this user can enter, and the server serves only its own user (``SO_PEERCRED``). It forks from
its one thread: the imports start no Python thread (the native ones they start are fork-safe,
see ``flinkish.worker_daemon``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import os
import runpy
import selectors
import signal
import socket
import stat
import struct
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from flinkish.fork_client import ACCEPTED, REFUSED, SERVED_MODULES, SOCKET_ENV
from flinkish.worker_launcher import FLINKISH_DAEMON, PYSPARK_DAEMON

#: The modules the server runs, with what it imports for them before it serves.
SERVED = {module: (module, "flinkish.data_source", "flinkish_source.stream_reader")
          for module in SERVED_MODULES}

#: The environment variables PySpark reads when the served modules are imported (Spark 4.3's
#: ``pyspark.serializers``, ``pyspark.worker_util``): a request must have the server's values.
IMPORT_TIME_ENV = ("PYSPARK_ENABLE_NAMEDTUPLE_PATCH", "SPARK_TESTING")

#: The largest request (an environment of ~1 MiB) the server reads.
MAX_REQUEST = 1 << 20
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
#: The server's process name (``/proc/<pid>/comm``).
NAME = b"flinkish-forks"


# -- the driver's side --------------------------------------------------------------------------

#: The daemon that forks the server: the data source's creation's, the first ``register``
#: starts (``flinkish.warm_start.DRIVER_MODULES``).
HOST_MODULE = "pyspark.sql.worker.create_data_source"


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


def remove_dead_drivers_sockets(directory: Path) -> None:
    """Remove the sockets of drivers no longer running (a server killed outright leaves its
    socket behind)."""
    for entry in directory.glob("*.sock"):
        try:
            os.kill(int(entry.stem), 0)
        except ProcessLookupError:
            entry.unlink(missing_ok=True)
        except (ValueError, PermissionError):
            continue


def fork_server_socket(spark: Any, source: Any, launcher: str) -> str | None:
    """Name the driver's fork server's socket in the worker environment of the data source
    ``source`` run by ``launcher`` (``flinkish.worker_launcher``'s), which makes its daemons run
    ``flinkish.worker_daemon``; the socket's path, or None where there is no server (the source
    run by another interpreter command, another daemon module set by the session, no private
    socket directory)."""
    function = source.dataSourceCls()
    daemon = spark.sparkContext._jsc.sc().conf().get("spark.python.daemon.module", PYSPARK_DAEMON)
    if function.pythonExec() != launcher or daemon not in (PYSPARK_DAEMON, FLINKISH_DAEMON):
        return None
    directory = socket_directory()
    if directory is None:
        return None
    remove_dead_drivers_sockets(directory)
    path = str(directory / f"{os.getpid()}.sock")
    env = function.envVars()
    if env.get(SOCKET_ENV) != path:
        env.put(SOCKET_ENV, path)
    return path


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


def run_child(server: int, module: str, args: list[str], env: dict[str, str], fds: list[int],
              inherited: list[int]) -> None:
    """In the fork: take over the client's standard streams and environment, run ``module`` as
    ``python -m`` does, and exit with its status."""
    code = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != server:  # the server died before the call
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
    """The server's loop: one thread, a selector over the listening socket, the SIGCHLD wake-up
    and each client's connection."""

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
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, "reap")
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
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
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            run_child(server, args[1], args, env, fds, inherited)
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


def listening(path: str) -> socket.socket | None:
    """A socket listening at ``path``; None when another server listens there already."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:  # a dead server's: this one takes its place
            os.unlink(path)
            listener.bind(path)
        else:
            listener.close()
            return None
        finally:
            probe.close()
    os.chmod(path, 0o600)
    listener.listen(16)  # requests wait in the backlog while the imports run
    return listener


def serve(path: str, served: tuple[str, ...]) -> None:
    """Listen at ``path``, import what ``served`` needs, then serve until killed."""
    listener = listening(path)
    if listener is None:
        return
    try:
        from flinkish.worker_daemon import import_quietly

        import_quietly(tuple(name for module in served for name in SERVED.get(module, (module,))))
        gc.collect()
        gc.freeze()
        Server(listener, served).serve()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def fork(path: str, served: tuple[str, ...] = tuple(SERVED)) -> int:
    """Fork the server from this process, before it starts any thread: the child's pid. The
    server dies with this process, never writes to its standard output (a daemon's, which
    Spark reads its port from) nor reads its standard input."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it died before the call
            os._exit(0)
        libc.prctl(PR_SET_NAME, NAME, 0, 0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        serve(path, served)
    except BaseException:  # noqa: BLE001 - the daemon goes on without a server
        traceback.print_exc()
    finally:
        os._exit(0)
