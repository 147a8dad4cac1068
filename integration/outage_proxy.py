"""A TCP proxy on loopback that can make the server behind it go away for a while.

The S3 test server (moto) keeps its objects in memory, so stopping it would lose them; a
proxy in front of it stands for the store instead. :meth:`OutageProxy.away` kills the proxy's
process, so its port refuses new connections and the open ones are cut, as when a store
restarts or fails over, and starts it again on the same port afterwards.

The proxy runs in a process of its own (``python -m integration.outage_proxy PORT
HOST:PORT``): a client in the test's process may hold the GIL while it waits for an answer
(delta-rs does), which would starve a proxy thread beside it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

from flinkish.demo.ports import free_port
from flinkish.demo.processes import kill_tree


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _connect_pair(client: socket.socket, upstream: tuple[str, int]) -> None:
    try:
        server = socket.create_connection(upstream)
    except OSError:
        client.close()
        return
    for source, sink in ((client, server), (server, client)):
        threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def serve(port: int, upstream: tuple[str, int]) -> None:
    """Forward ``127.0.0.1:port`` to ``upstream`` until killed."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    while True:
        client, _ = listener.accept()
        _connect_pair(client, upstream)


class OutageProxy:
    """A proxy process forwarding a free loopback port to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int], timeout: float = 30.0) -> None:
        self._upstream = upstream
        self._timeout = timeout
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self) -> None:
        host, port = self._upstream
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "integration.outage_proxy", str(self.port), f"{host}:{port}"],
            start_new_session=True,
        )
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the proxy on port {self.port} did not start") from None
                time.sleep(0.05)

    def _kill(self) -> None:
        if self._proc is not None:
            kill_tree(self._proc.pid)
            self._proc.wait(timeout=10)
            self._proc = None

    @contextlib.contextmanager
    def away(self) -> Iterator[None]:
        """The server unreachable through the proxy for the block (see the module
        docstring)."""
        self._kill()
        try:
            yield
        finally:
            self._start()

    def close(self) -> None:
        self._kill()

    def __enter__(self) -> OutageProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    target_host, target_port = sys.argv[2].rsplit(":", 1)
    serve(int(sys.argv[1]), (target_host, int(target_port)))
