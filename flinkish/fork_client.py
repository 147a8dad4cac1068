"""The stand-in ``flinkish.worker_launcher`` runs for a Python process Spark starts without a
daemon (the streaming source's runner): it asks the driver's ``flinkish.fork_server`` for a
fork of its already-imported interpreter, hands it this process's standard streams, arguments,
environment and working directory, and lives as long as the fork, whose exit status it takes.
Whatever goes wrong before the server accepts, it runs the interpreter as Spark asked.

Run as a script by ``python -S -I`` (no site, no environment: it starts in ~15 ms), so it
imports only the standard library and nothing of flinkish's: the protocol's constants are
repeated in ``flinkish.fork_server``, whose tests hold the two together.
"""

import os
import socket
import struct
import sys

#: The server's answers: accepted (a fork runs the request) or refused (run it here).
ACCEPTED, REFUSED = b"A", b"R"
#: How long the server may take to answer a request (it binds its socket before its imports,
#: so a request can wait for the end of them).
ANSWER_TIMEOUT_S = 10.0
#: The modules the server runs (``flinkish.worker_launcher`` hands only those to the client).
SERVED_MODULES = ("pyspark.sql.streaming.python_streaming_source_runner",)
#: The environment variable naming the server's socket.
SOCKET_ENV = "FLINKISH_FORK_SERVER"


def request(args: list[str]) -> bytes:
    """The request: this interpreter, the working directory, the arguments and the
    environment, NUL-separated (none of them can hold a NUL), after its length."""
    fields = [sys.executable, os.getcwd(), str(len(args)), *args,
              *(f"{k}={v}" for k, v in os.environ.items())]
    payload = b"\0".join(os.fsencode(f) for f in fields)
    return struct.pack("!I", len(payload)) + payload


def served(path: str, args: list[str]) -> socket.socket | None:
    """The connection to the server once it has accepted the request; None when it refused,
    is not there or is not this user's."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(ANSWER_TIMEOUT_S)
        sock.connect(path)
        _, uid, _ = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():
            raise OSError(f"{path} is served by uid {uid}")
        message = request(args)
        sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  struct.pack("3i", 0, 1, 2))])
        if sock.recv(1) != ACCEPTED:
            raise OSError("refused")
    except OSError:
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def exit_status(sock: socket.socket) -> int:
    """The fork's exit status (128 + the signal that ended it), once it has ended."""
    status = b""
    while len(status) < 4:
        chunk = sock.recv(4 - len(status))
        if not chunk:  # the server is gone: the fork with it
            return 1
        status += chunk
    code: int = struct.unpack("!i", status)[0]
    return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    python, *args = argv
    path = os.environ.get(SOCKET_ENV, "")
    sock = served(path, args) if path else None
    if sock is None:
        os.execvp(python, [python, *args])
    # Spark stops the process by SIGTERM: this one ends, the server sees its connection close
    # and kills the fork
    return exit_status(sock)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
