"""A throw-away PostgreSQL server that our own code starts and stops (tests, demo), without
Docker: ``initdb`` of a temporary cluster on a free loopback port. As root (CI), every server
command runs as the ``postgres`` user through ``runuser``: PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import psycopg

from flinkish.demo.ports import free_port

DSN_ENV = "FLINKISH_POSTGRES_DSN"
"""Set to a libpq DSN to make :func:`postgres_for_tests` use that server instead."""

BIN_ENV = "FLINKISH_PG_BIN"
"""Set to the directory that holds ``initdb`` and ``pg_ctl`` to pick a specific build."""

_POLL_SECONDS = 0.01
_START_ATTEMPTS = 3  # a free port can be taken between probing it and the server binding it


class PostgresNotFoundError(RuntimeError):
    """No PostgreSQL server binaries were found."""


def find_pg_bin() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: ``$FLINKISH_PG_BIN`` if set, else PATH,
    else the newest ``/usr/lib/postgresql/*/bin`` (Debian puts them there, off PATH)."""
    override = os.environ.get(BIN_ENV)
    if override:
        candidates = [Path(override)]
    else:
        on_path = shutil.which("initdb")
        candidates = [Path(on_path).parent] if on_path else []
        candidates += sorted((Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")),
                             key=lambda p: [int(n) for n in p.parts[-2].split(".") if n.isdigit()],
                             reverse=True)
    for directory in candidates:
        if all(os.access(directory / tool, os.X_OK) for tool in ("initdb", "pg_ctl")):
            return directory
    where = (f"{BIN_ENV}={override} holds no initdb/pg_ctl" if override
             else "PostgreSQL server binaries (initdb, pg_ctl) are not on PATH nor in "
             "/usr/lib/postgresql/*/bin")
    raise PostgresNotFoundError(
        f"{where}. Install them with `apt-get install postgresql`, set {BIN_ENV} to the "
        f"directory that holds them, or set {DSN_ENV} to use a running server.")


class EmbeddedPostgres:
    """A temporary PostgreSQL cluster on ``127.0.0.1``, trust auth, superuser ``postgres``,
    ``fsync=off`` (the data is thrown away), two-phase commit on unless a test turns it off."""

    def __init__(self, *, max_prepared_transactions: int = 64,
                 startup_timeout: float = 30.0) -> None:
        self.max_prepared_transactions = max_prepared_transactions
        self.startup_timeout = startup_timeout
        self._port: int | None = None
        self._finalizer: weakref.finalize | None = None
        self._server: tuple[Path, list[str], Path] | None = None  # bin dir, run-as, base

    @property
    def dsn(self) -> str:
        """libpq connection string of the running server."""
        if self._port is None:
            raise RuntimeError("EmbeddedPostgres is not running: call start() first")
        return _dsn(self._port)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> EmbeddedPostgres:
        """initdb a fresh cluster and start it; returns once it accepts connections."""
        if self._finalizer is not None and self._finalizer.alive:
            raise RuntimeError("EmbeddedPostgres is already running")
        bin_dir = find_pg_bin()
        run_as = _run_as_prefix()
        base = Path(tempfile.mkdtemp(prefix="flinkish-pg-"))
        # also at interpreter exit: an interrupted test run leaves no server behind
        self._finalizer = weakref.finalize(self, _shutdown, bin_dir, run_as, base)
        try:
            if run_as:
                _hand_to_postgres_user(base)
            _run([*run_as, str(bin_dir / "initdb"), "-D", str(base / "data"), "-U", "postgres",
                  "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync",
                  "--no-instructions"], cwd=base, what="initdb")
            for attempt in range(_START_ATTEMPTS):
                port = free_port()
                if self._start_server(bin_dir, run_as, base, port, attempt):
                    self._port = port
                    self._server = (bin_dir, run_as, base)
                    return self
            logs = sorted(base.glob("postgres-*.log"))
            tail = logs[-1].read_text(errors="replace")[-2000:] if logs else "(no log)"
            raise RuntimeError(f"PostgreSQL did not start: {tail}")
        except BaseException:
            self.stop()
            raise

    def _start_server(self, bin_dir: Path, run_as: list[str], base: Path, port: int,
                      attempt: int) -> bool:
        """Start on ``port``; False if the port was taken meanwhile (the caller retries)."""
        log = base / f"postgres-{attempt}.log"
        # No Unix socket: the default directory may not exist or be writable here.
        options = (f"-p {port} -c listen_addresses=127.0.0.1 -c fsync=off "
                   f"-c max_prepared_transactions={self.max_prepared_transactions} "
                   "-c unix_socket_directories=")
        _run([*run_as, str(bin_dir / "pg_ctl"), "start", "-D", str(base / "data"), "-l", str(log),
              "-W", "-o", options], cwd=base, what="pg_ctl start")
        deadline = time.monotonic() + self.startup_timeout
        while True:
            pidfile = _pidfile(base)  # line 8: starting, ready or stopping (PostgreSQL >= 10)
            if len(pidfile) > 7 and pidfile[7].strip() == "ready":
                with psycopg.connect(_dsn(port),
                                     connect_timeout=max(1, int(deadline - time.monotonic()))):
                    return True
            text = log.read_text(errors="replace") if log.exists() else ""
            if "FATAL" in text or "PANIC" in text:
                if "could not create any TCP/IP sockets" in text:
                    return False
                raise RuntimeError(f"PostgreSQL failed to start:\n{text[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"PostgreSQL not ready after {self.startup_timeout:.0f}s:\n{text[-2000:]}")
            time.sleep(_POLL_SECONDS)

    @contextlib.contextmanager
    def away(self) -> Iterator[None]:
        """The server down for the block (a fast shutdown: every session is cut, as in a
        restart or a failover), then started again on its port with its data: what was
        committed and prepared is still there."""
        if self._server is None or self._port is None:
            raise RuntimeError("EmbeddedPostgres is not running: call start() first")
        bin_dir, run_as, base = self._server
        _run(_stop_command(bin_dir, run_as, base), cwd=base, what="pg_ctl stop")
        try:
            yield
        finally:
            log = len(list(base.glob("postgres-*.log")))  # a log of its own: the stop's FATALs
            if not self._start_server(bin_dir, run_as, base, self._port, log):
                raise RuntimeError(f"PostgreSQL could not listen on port {self._port} again")

    def stop(self) -> None:
        """Stop the server (fast shutdown, then kill) and delete its directory. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()
        self._port = None
        self._server = None


def _run_as_prefix() -> list[str]:
    """``runuser -u postgres --`` when we are root (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "running as root, and PostgreSQL refuses to run as root, but there is no `postgres` "
            "user to run it as (`apt-get install postgresql` creates one)") from None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise RuntimeError("running as root needs `runuser` (util-linux) to start PostgreSQL")
    return [runuser, "-u", "postgres", "--"]


def _hand_to_postgres_user(base: Path) -> None:
    """Give ``base`` to the postgres user, after checking that user can reach it at all."""
    for parent in base.parents:
        if not parent.stat().st_mode & 0o001:
            raise RuntimeError(
                f"the postgres user cannot traverse {parent} (mode "
                f"{oct(parent.stat().st_mode & 0o777)}), so it cannot use {base}; point TMPDIR "
                "at a directory under world-traversable parents, e.g. /tmp")
    entry = pwd.getpwnam("postgres")
    os.chown(base, entry.pw_uid, entry.pw_gid)


def _run(cmd: list[str], *, cwd: Path, what: str) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}")


def _dsn(port: int) -> str:
    return f"host=127.0.0.1 port={port} user=postgres dbname=postgres"


def _pidfile(base: Path) -> list[str]:
    """postmaster.pid's lines (none while there is no server): the pid first."""
    try:
        return (base / "data" / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return []


def _stop_command(bin_dir: Path, run_as: list[str], base: Path) -> list[str]:
    """``pg_ctl stop -m fast``: every session cut, as in a restart or a failover."""
    return [*run_as, str(bin_dir / "pg_ctl"), "stop", "-D", str(base / "data"), "-m", "fast",
            "-w", "-t", "20"]


def _shutdown(bin_dir: Path, run_as: list[str], base: Path) -> None:
    """pg_ctl stop -m fast; SIGKILL the postmaster if that fails; remove the directory."""
    try:
        pidfile = _pidfile(base)
        if pidfile and pidfile[0].isdigit():
            stopped = subprocess.run(_stop_command(bin_dir, run_as, base), cwd=base,
                                     capture_output=True, check=False)
            if stopped.returncode != 0:
                _kill(int(pidfile[0]))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _kill(pid: int) -> None:
    # The postmaster is not our child (pg_ctl detached it), so poll for it to go away; its
    # backends exit by themselves once they notice the postmaster is gone.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(_POLL_SECONDS)


@contextlib.contextmanager
def postgres_for_tests(*, max_prepared_transactions: int = 64) -> Iterator[str]:
    """Yield a DSN: ``$FLINKISH_POSTGRES_DSN`` if set (an external server, left running),
    else that of an :class:`EmbeddedPostgres` started here and stopped on exit."""
    external = os.environ.get(DSN_ENV)
    if external:
        yield external
        return
    with EmbeddedPostgres(max_prepared_transactions=max_prepared_transactions) as server:
        yield server.dsn
