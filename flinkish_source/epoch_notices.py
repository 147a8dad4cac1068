"""Notices of completed epochs, from the query's listener to its driver-side readers on the same
machine, through Unix sockets in a directory only the user can enter (``notice_dir``).

Spark asks a reader to plan from epoch N's end only at the next trigger (never, for a query
stopped in between), so a reader that commits to a consumer group learns of N here. A notice
carries only offsets, and counts only for an end offset the reader planned itself; one that
finds no reader is dropped (docs/semantics.md, "Consumer-group offsets").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: How long a notice may take to reach one reader (a local socket: milliseconds, unless the
#: reader's process is stopped or swapped out).
SEND_TIMEOUT_S = 2.0
#: The largest notice a reader reads (an end offset of some thousands of partitions).
MAX_NOTICE_BYTES = 16 << 20


def notice_dir() -> Path | None:
    """The directory of the readers' sockets: created for this user only, and refused (None,
    with a warning) if someone else owns it or can enter it."""
    path = Path(tempfile.gettempdir()) / f"flinkish-epochs-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        _warn_once(f"cannot use {path} for completed-epoch notices: {exc}")
        return None
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or info.st_mode & 0o077):
        _warn_once(f"not using {path} for completed-epoch notices: it must be a directory "
                   "that only this user owns and can enter (mode 700)")
        return None
    return path


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """The listener looks for the directory at every progress report: say what is wrong once
    (each reader commits at planning meanwhile)."""
    if message not in _warned:
        _warned.add(message)
        logger.warning("%s; consumer groups get each epoch when Spark plans from it", message)


def canonical(offset: Any) -> str:
    """One spelling of an end offset, whichever JSON round trips it went through."""
    return json.dumps(offset, sort_keys=True, separators=(",", ":"))


def send(ends: Iterable[Any]) -> int:
    """Tell every listening reader of this machine that Spark committed the epochs ending at
    ``ends``; how many were told (sockets of readers that are gone are removed)."""
    directory = notice_dir()
    ends = list(ends)
    if directory is None or not ends:
        return 0
    payload = "".join(canonical(end) + "\n" for end in ends).encode()
    return sum(_deliver(path, payload) for path in directory.glob("*.sock"))


def _deliver(path: Path, payload: bytes) -> bool:
    """Send ``payload`` to the reader at ``path``; a socket whose reader is gone is removed."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(SEND_TIMEOUT_S)
        try:
            sock.connect(str(path))
            sock.sendall(payload)
            return True
        except (ConnectionRefusedError, FileNotFoundError):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # its reader's process has ended
        except OSError as exc:
            logger.warning("could not tell the reader at %s of a completed epoch: %s",
                           path, exc)
    return False


class NoticeListener:
    """A reader's socket: a daemon thread that calls ``on_notice`` with each end offset it is
    told about (as parsed JSON). Closed with the reader, or gone with its process."""

    def __init__(self, on_notice: Callable[[Any], None]) -> None:
        self._on_notice = on_notice
        self._closed = False
        directory = notice_dir()
        self.path: Path | None = None
        self._sock: socket.socket | None = None
        if directory is None:
            return
        for other in directory.glob("*.sock"):  # those of ended readers, without a listener
            _deliver(other, b"")
        path = directory / f"{secrets.token_hex(8)}.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            sock.listen(8)
        except OSError as exc:
            sock.close()
            logger.warning("cannot listen for completed-epoch notices at %s: %s", path, exc)
            return
        self.path, self._sock = path, sock
        threading.Thread(target=self._serve, name="flinkish-epoch-notices",
                         daemon=True).start()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(SEND_TIMEOUT_S)
                try:
                    data = self._read(conn)
                except OSError as exc:
                    logger.warning("a completed-epoch notice broke off: %s", exc)
                    continue
            for line in data.splitlines():
                try:
                    end = json.loads(line)
                except ValueError:
                    logger.warning("ignoring a completed-epoch notice that is not JSON")
                    continue
                try:
                    self._on_notice(end)
                except Exception:  # monitoring only: never end the thread
                    logger.exception("a completed-epoch notice failed")

    @staticmethod
    def _read(conn: socket.socket) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_NOTICE_BYTES:
            chunk = conn.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._closed = True
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.path = None
